#!/usr/bin/env python3
"""Times sdpa's CPU peers on one attention shape; prints one JSON line per kernel.

    peer_time.py --b 1 --h 8 --nq 2048 --nkv 2048 --d 64 [--hkv 8] [--causal] [--threads 1] [--reps 5]

Kernels (--kernels, comma-separated, default all that apply):
  torch_flash  torch.nn.functional.scaled_dot_product_attention, FLASH_ATTENTION backend (CPU)
  torch_math   the same call on the MATH backend (materializes the scores)
  ort_mha      ONNX Runtime's com.microsoft MultiHeadAttention, CPU provider; needs H_kv = H

The JSON lines follow ../shared/README.md, like `cargo run --release --example bench`:
{"kernel", "s" (median seconds of --reps timed calls after one warm-up call), "gflops"
(4·b·h·nq·nkv·d / s / 1e9: the full, unmasked work even when causal), "b", "h", "hkv", "nq",
"nkv", "d", "causal", "threads"}, plus "max_abs_diff" against torch_math's output where that ran
(a check that the peers compute the same thing), or "error" instead of the timing.

Causal means PyTorch's is_causal (top-left diagonal) and ORT's unidirectional; both agree with
sdpa's bottom-right alignment only when nq == nkv, so a causal run with nq != nkv is refused.
Inputs: standard normal float32, fixed seed; torch gets [b, h, s, d], ORT [b, s, h·d].
"""

import argparse
import json
import os
import statistics
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("b", "h", "nq", "nkv", "d"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--hkv", type=int, default=0, help="key/value heads (default: --h)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--kernels", default="torch_flash,torch_math,ort_mha")
    a = p.parse_args()
    a.hkv = a.hkv or a.h
    if a.h % a.hkv:
        p.error("--h must be a multiple of --hkv")
    if a.causal and a.nq != a.nkv:
        p.error("causal peers are top-left aligned: only nq == nkv compares with sdpa")
    return a


def median_seconds(call, reps):
    """Median wall time of `reps` calls of `call`, after one untimed warm-up call."""
    call()
    times = []
    for _ in range(max(reps, 1)):
        t0 = time.perf_counter_ns()
        call()
        times.append((time.perf_counter_ns() - t0) * 1e-9)
    return statistics.median(times)


def main():
    a = parse()
    # Every library's thread pool reads these when it starts: set them before the imports.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(a.threads)
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    rng = np.random.default_rng(20240531)
    q_np = rng.standard_normal((a.b, a.h, a.nq, a.d), dtype=np.float32)
    k_np = rng.standard_normal((a.b, a.hkv, a.nkv, a.d), dtype=np.float32)
    v_np = rng.standard_normal((a.b, a.hkv, a.nkv, a.d), dtype=np.float32)
    q, k, v = (torch.from_numpy(x) for x in (q_np, k_np, v_np))
    flops = 4 * a.b * a.h * a.nq * a.nkv * a.d
    wanted = a.kernels.split(",")
    results = []
    outputs = {}

    def record(kernel, seconds=None, error=None, out=None):
        row = {"kernel": kernel}
        if error is None:
            row.update({"s": seconds, "gflops": round(flops / seconds / 1e9, 3)})
        else:
            row["error"] = error[:300]
        if out is not None:
            outputs[kernel] = out
        results.append(row)

    backends = [("torch_math", SDPBackend.MATH), ("torch_flash", SDPBackend.FLASH_ATTENTION)]
    for kernel, backend in backends:
        if kernel not in wanted:
            continue
        try:
            with torch.inference_mode(), sdpa_kernel(backend):

                def call():
                    return F.scaled_dot_product_attention(
                        q, k, v, is_causal=a.causal, enable_gqa=a.hkv != a.h
                    )

                seconds = median_seconds(call, a.reps)
                out = call().numpy()
            record(kernel, seconds, out=out)
        except Exception as e:  # a backend that refuses the shape is a result, not a crash
            record(kernel, error=f"{type(e).__name__}: {e}")

    if "ort_mha" in wanted:
        if a.hkv != a.h:
            pass  # MultiHeadAttention has no grouped-query form: no row
        else:
            try:
                session, feeds = ort_mha(a, q_np, k_np, v_np)
                seconds = median_seconds(lambda: session.run(None, feeds), a.reps)
                out = session.run(None, feeds)[0]
                out = out.reshape(a.b, a.nq, a.h, a.d).transpose(0, 2, 1, 3)
                record("ort_mha", seconds, out=out)
            except Exception as e:
                record("ort_mha", error=f"{type(e).__name__}: {e}")

    math_out = outputs.get("torch_math")
    for row in results:
        out = outputs.get(row["kernel"])
        if math_out is not None and out is not None:
            row["max_abs_diff"] = float(np.max(np.abs(out - math_out)))
        row.update(
            {"b": a.b, "h": a.h, "hkv": a.hkv, "nq": a.nq, "nkv": a.nkv, "d": a.d,
             "causal": a.causal, "threads": a.threads}
        )
        print(json.dumps(row))
    sys.stdout.flush()


def ort_mha(a, q, k, v):
    """An ONNX Runtime session holding one MultiHeadAttention node, and its feeds."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    hidden = a.h * a.d

    def packed(x):  # [b, h, s, d] -> [b, s, h·d]
        return np.ascontiguousarray(x.transpose(0, 2, 1, 3)).reshape(a.b, -1, hidden)

    def io(name, seq):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, [a.b, seq, hidden])

    node = helper.make_node(
        "MultiHeadAttention",
        ["query", "key", "value"],
        ["output"],
        domain="com.microsoft",
        num_heads=a.h,
        unidirectional=int(a.causal),
    )
    graph = helper.make_graph(
        [node], "attention",
        [io("query", a.nq), io("key", a.nkv), io("value", a.nkv)],
        [io("output", a.nq)],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    onnx.checker.check_model(model)
    options = ort.SessionOptions()
    options.intra_op_num_threads = a.threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )
    feeds = {"query": packed(q), "key": packed(k), "value": packed(v)}
    return session, feeds


if __name__ == "__main__":
    main()
