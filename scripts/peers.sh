#!/usr/bin/env bash
# Times sdpa against its CPU peers (PyTorch SDPA flash and math backends, ONNX Runtime's
# MultiHeadAttention, and where installed OpenVINO's ScaledDotProductAttention and ggml's flash
# attention) on one grid of shapes, on this machine, and prints a Markdown table.
#
#   scripts/peers.sh                  full grid (about 10-20 minutes on 2 cores; run it on a quiet machine)
#   scripts/peers.sh --quick          smoke run: small grid, few repetitions (about a minute after setup)
#   scripts/peers.sh --setup          only create or check the Python environment, then exit
#   scripts/peers.sh --extra [...]    also install the optional peers, OpenVINO and ggml (a few minutes)
#   scripts/peers.sh --rounds N [...] N alternated rounds per shape (default 1; see Drift below)
#
# Everything it needs is in this repository: scripts/peers_setup.sh makes the Python environment,
# scripts/peer_time.py times the peers, scripts/peers_table.py makes the table. Environment:
# SDPA_PEERS_VENV (default ~/.cache/sdpa-peers) is the virtual environment that holds torch,
# onnxruntime, onnx and numpy (and, after --extra, openvino and ggml); it is created on first use
# (about 3 GB from PyPI, a few minutes) and reused while it imports. Optional peers that are not
# installed are skipped with a message. SDPA_PEERS_OUT (default target/peers) receives
# results.jsonl (every JSON line, schema in docs/bench-schema.md, plus "round", and
# "max_abs_diff" of each peer against torch math) and table.md.
#
# Grid (full): B=1, H=8, n_q = n_kv in {512, 2048, 4096}, d in {64, 128}, causal and not,
# threads 1 and 2; short prompts: B=4, H=32, n_q = n_kv in {128, 256}, d in {64, 128}, causal and
# not; decode: n_q = 1, H = 32, H_kv = 8, d = 128, n_kv in {4096, 16384}, not causal
# (with one query row, bottom-right causal hides nothing; PyTorch's is_causal is top-left and
# would hide all but key 0, so no causal decode row is timed).
#
# Drift: per shape and thread count the runs go sdpa, then N times (peers, sdpa), with
# --rounds N (default 1: sdpa, peers, sdpa). Each kernel's figure is the median of its runs'
# medians (sdpa: N + 1 runs tagged round 0 .. N; each peer: N runs tagged 1 .. N), so a drift
# of the machine's speed over the seconds of one shape cancels, and with N ≥ 3 one slow run of
# a shared VM no longer decides a ratio. GFLOP/s = 4·B·H·n_q·n_kv·d / s, the full unmasked
# work even when causal (docs/bench-schema.md).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
venv=${SDPA_PEERS_VENV:-$HOME/.cache/sdpa-peers}
out_dir=${SDPA_PEERS_OUT:-$root/target/peers}
mode=full
rounds=1
setup_args=()
while [ $# -gt 0 ]; do
  arg=$1
  shift
  case $arg in
    --rounds)
      rounds=${1:-}
      shift || true
      if ! [[ $rounds =~ ^[1-9][0-9]*$ ]]; then
        echo "peers.sh: --rounds needs a whole number ≥ 1 (got '$rounds')" >&2
        exit 2
      fi
      ;;
    --quick) mode=quick ;;
    --setup) mode=setup ;;
    --extra) setup_args+=(--extra) ;;
    # The help is the comment block at the top of this file, whatever its length.
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "peers.sh: unknown argument $arg (try --help)" >&2; exit 2 ;;
  esac
done

# --- 1. The Python environment with the peers. -------------------------------------------
SDPA_PEERS_VENV=$venv bash "$here/peers_setup.sh" "${setup_args[@]}"
py=$venv/bin/python
[ "$mode" = setup ] && exit 0

# --- 2. sdpa's bench example. ------------------------------------------------------------
(cd "$root" && cargo build --quiet --release --example bench)
bench=${CARGO_TARGET_DIR:-$root/target}/release/examples/bench

# --- 3. The grid. ------------------------------------------------------------------------
# A shape is "b h hkv nq nkv d causal".
shapes=()
if [ "$mode" = quick ]; then
  ns=(512); ds=(64 128); threads=(1 2); decode=(4096)
else
  ns=(512 2048 4096); ds=(64 128); threads=(1 2); decode=(4096 16384)
fi
for n in "${ns[@]}"; do
  for d in "${ds[@]}"; do
    for c in 0 1; do shapes+=("1 8 8 $n $n $d $c"); done
  done
done
for nkv in "${decode[@]}"; do shapes+=("1 32 8 1 $nkv 128 0"); done
# Short prompts, many heads (B = 4, H = 32), where per-call overheads weigh most.
if [ "$mode" != quick ]; then
  for n in 128 256; do
    for d in "${ds[@]}"; do
      for c in 0 1; do shapes+=("4 32 32 $n $n $d $c"); done
    done
  done
fi

# Timed calls per run (after 0.2 s of warm-up calls): more for cheap shapes, to steady their medians.
reps_for() { # nq nkv
  if [ "$mode" = quick ]; then echo 3
  elif [ "$1" -eq 1 ] || [ $(($1 * $2)) -le $((512 * 512)) ]; then echo 20
  elif [ $(($1 * $2)) -le $((2048 * 2048)) ]; then echo 7
  else echo 5
  fi
}

mkdir -p "$out_dir"
results=$out_dir/results.jsonl
: >"$results"
started=$SECONDS
for shape in "${shapes[@]}"; do
  read -r b h hkv nq nkv d c <<<"$shape"
  reps=$(reps_for "$nq" "$nkv")
  args=(--b "$b" --h "$h" --hkv "$hkv" --nq "$nq" --nkv "$nkv" --d "$d" --reps "$reps")
  [ "$c" = 1 ] && args+=(--causal)
  for t in "${threads[@]}"; do
    echo "peers: [$((SECONDS - started)) s] b=$b h=$h hkv=$hkv nq=$nq nkv=$nkv d=$d causal=$c threads=$t reps=$reps" >&2
    # Every library gets the same thread count (torch and ORT also read these at start).
    export OMP_NUM_THREADS=$t MKL_NUM_THREADS=$t
    "$bench" "${args[@]}" --threads "$t" | "$py" "$here/peers_table.py" --tag 0 >>"$results"
    for ((r = 1; r <= rounds; r++)); do
      "$py" "$here/peer_time.py" "${args[@]}" --threads "$t" | "$py" "$here/peers_table.py" --tag "$r" >>"$results"
      "$bench" "${args[@]}" --threads "$t" | "$py" "$here/peers_table.py" --tag "$r" >>"$results"
    done
  done
done
echo "peers: grid done in $((SECONDS - started)) s" >&2

# --- 4. The table. -----------------------------------------------------------------------
"$py" "$here/peers_table.py" --table <"$results" | tee "$out_dir/table.md"
echo "peers: JSON lines in $results, table in $out_dir/table.md" >&2
