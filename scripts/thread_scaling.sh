#!/usr/bin/env bash
# Thread scaling of the fused kernel on one machine: runs the release bench example for
# 1, 2, 4, … up to all cores on a prefill and a decode shape and prints one JSON line per run.
# usage: scripts/thread_scaling.sh [path/to/bench]   (default: target/release/examples/bench)
set -euo pipefail
bench=${1:-target/release/examples/bench}
cores=$(nproc)
threads=1
list=()
while [ "$threads" -le "$cores" ]; do list+=("$threads"); threads=$((threads * 2)); done
[ "${list[-1]}" -eq "$cores" ] || list+=("$cores")
echo "# $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $cores cores"
for t in "${list[@]}"; do
  "$bench" --b 1 --h 32 --nq 4096 --d 128 --threads "$t" --reps 3
  "$bench" --b 1 --h 32 --nq 4096 --d 128 --causal --threads "$t" --reps 3
  "$bench" --b 1 --h 32 --hkv 8 --nq 1 --nkv 32768 --d 128 --threads "$t" --reps 10
done
