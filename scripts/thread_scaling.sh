#!/usr/bin/env bash
# Thread scaling of the fused kernel on one machine: runs the release bench example for
# 1, 2, 4, … up to all cores on prefill shapes (B = 1, H = 8, n = 2048 and 4096, d = 128; and
# H = 32, n = 4096, d = 128, causal) with `--peak`, and a decode shape, three rounds, and prints
# one JSON line per run (the round in "round"). `pct_peak` (the call's GFLOP/s over an FMA burst
# on all the pool's threads just before it) separates the kernel's scaling from the clock a
# CPU runs at with one core or all of them busy. With a decode_bench binary it then also prints the
# decode bandwidth lines at 1 thread and at all cores, over --gib 4 of caches so that a large
# server's L3 does not serve them.
# usage: scripts/thread_scaling.sh [path/to/bench [path/to/decode_bench]]
#        (defaults: target/release/examples/bench, no decode_bench)
set -euo pipefail
bench=${1:-target/release/examples/bench}
decode=${2:-}
cores=$(nproc)
threads=1
list=()
while [ "$threads" -le "$cores" ]; do list+=("$threads"); threads=$((threads * 2)); done
[ "${list[-1]}" -eq "$cores" ] || list+=("$cores")
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $cores cores"
tag() { sed "s/}\$/,\"round\":$1}/"; }
for round in 1 2 3; do
  for t in "${list[@]}"; do
    "$bench" --b 1 --h 8 --nq 2048 --d 128 --threads "$t" --reps 3 --peak | tag "$round"
    "$bench" --b 1 --h 8 --nq 4096 --d 128 --threads "$t" --reps 3 --peak | tag "$round"
    "$bench" --b 1 --h 32 --nq 4096 --d 128 --causal --threads "$t" --reps 3 --peak | tag "$round"
    "$bench" --b 1 --h 32 --hkv 8 --nq 1 --nkv 32768 --d 128 --threads "$t" --reps 10 | tag "$round"
  done
done
if [ -n "$decode" ]; then
  for t in 1 "$cores"; do
    "$decode" --threads "$t" --rounds 3 --gib 4 --n-kv 16384 --types f32,f16,i8
  done
fi
