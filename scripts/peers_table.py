#!/usr/bin/env python3
"""Collects the JSON lines of scripts/peers.sh and prints them as a Markdown table.

    ... | peers_table.py --tag R     pass JSON lines through, adding "round": R (others dropped)
    peers_table.py --table < results.jsonl

The table has one row per (shape, threads): GFLOP/s of sdpa and of each peer, from the median
over all of a kernel's runs of that shape of each run's median time, and sdpa / best peer (the
fastest peer that ran). GFLOP/s = 4·B·H·n_q·n_kv·d / s / 1e9, the full unmasked work even when
causal (docs/bench-schema.md), so a kernel that skips masked blocks shows a higher rate.
Columns of the optional peers (OpenVINO, ggml) appear only when the results hold a line of them.
"""

import argparse
import json
import statistics
import sys

PEERS = [
    ("torch_flash", "torch flash"),
    ("torch_math", "torch math"),
    ("ort_mha", "ORT MHA"),
    ("ov_sdpa", "OpenVINO SDPA"),
    ("ggml_fa", "ggml FA"),
]
OPTIONAL = {"ov_sdpa", "ggml_fa"}
SHAPE_KEYS = ("b", "h", "hkv", "nq", "nkv", "d", "causal", "threads")


def tag(round_):
    for line in sys.stdin:
        line = line.strip()
        try:
            row = json.loads(line)
        except ValueError:
            if line:
                print(f"peers_table: not a JSON line, dropped: {line}", file=sys.stderr)
            continue
        row["round"] = round_
        print(json.dumps(row))
        shown = f"{row['gflops']:.1f} GFLOP/s" if "gflops" in row else f"error {row.get('error')}"
        print(f"  {row['kernel']:<12} {shown}", file=sys.stderr)


def shape_label(key):
    b, h, hkv, nq, nkv, d, causal, _ = key
    mask = " causal" if causal else ""
    if nq == nkv:
        text = f"n={nq} d={d}{mask}"
    else:
        text = f"decode n_q={nq} n_kv={nkv} d={d}{mask}"
    if b != 1 or h != 8 or hkv != h:
        text += f" (B={b} H={h} H_kv={hkv})"
    return text


def table():
    runs = {}  # (shape..., threads) -> kernel -> [seconds] or error text
    order = []
    for line in sys.stdin:
        if not line.strip():
            continue
        row = json.loads(line)
        key = tuple(row[k] for k in SHAPE_KEYS)
        if key not in runs:
            runs[key] = {}
            order.append(key)
        kernels = runs[key]
        if "s" in row:
            times = kernels.setdefault(row["kernel"], [])
            if isinstance(times, list):
                times.append(row["s"])
        else:
            kernels.setdefault(row["kernel"], "error: " + row.get("error", "?"))

    def gflops(key, kernel):
        entry = runs[key].get(kernel)
        if not isinstance(entry, list) or not entry:
            return None
        b, h, _, nq, nkv, d, _, _ = key
        return 4 * b * h * nq * nkv * d / statistics.median(entry) / 1e9

    seen = {kernel for kernels in runs.values() for kernel in kernels}
    peers = [(k, name) for k, name in PEERS if k not in OPTIONAL or k in seen]
    heads = ["shape", "threads", "sdpa"] + [name for _, name in peers] + ["sdpa / best peer"]
    print("| " + " | ".join(heads) + " |")
    print("|" + "---|" * 2 + "---:|" * (len(heads) - 2))
    errors = []
    order.sort(key=lambda k: (k[3] != k[4], k[4], k[5], k[6], k[7]))  # prefill first, by n
    for key in order:
        cells = [shape_label(key), str(key[-1])]
        ours = gflops(key, "sdpa")
        cells.append("–" if ours is None else f"{ours:.1f}")
        best = None
        for kernel, _ in peers:
            rate = gflops(key, kernel)
            entry = runs[key].get(kernel)
            if isinstance(entry, str):
                cells.append("error")
                errors.append(f"{shape_label(key)}, {key[-1]} threads, {kernel}: {entry}")
            else:
                cells.append("–" if rate is None else f"{rate:.1f}")
            if rate is not None and (best is None or rate > best):
                best = rate
        cells.append("–" if ours is None or best is None else f"{ours / best:.2f}")
        print("| " + " | ".join(cells) + " |")
    print()
    print("GFLOP/s = 4·B·H·n_q·n_kv·d / median seconds / 1e9 (full unmasked work, also when causal);"
          " B=1, H=8 unless noted; decode rows: H=32, H_kv=8 (ORT MHA has no grouped-query form).")
    def run_counts(ours):  # the numbers of runs behind sdpa's (ours) or the peers' figures
        return "/".join(str(n) for n in sorted({
            len(entry) for kernels in runs.values() for kernel, entry in kernels.items()
            if (kernel == "sdpa") == ours and isinstance(entry, list)}))

    if run_counts(True) and run_counts(False):
        print(f"Each figure: the median over runs of one shape (sdpa {run_counts(True)} runs, each"
              f" peer {run_counts(False)}), alternated as scripts/peers.sh describes.")
    for e in errors:
        print(f"- {e}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tag", type=int, help="pass JSON lines through, adding this round number")
    p.add_argument("--table", action="store_true", help="print the Markdown table")
    a = p.parse_args()
    if a.table:
        table()
    elif a.tag is not None:
        tag(a.tag)
    else:
        p.error("give --tag R or --table")


if __name__ == "__main__":
    main()
