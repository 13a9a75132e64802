#!/usr/bin/env python3
"""Times sdpa's CPU peers on one attention shape; prints one JSON line per kernel.

    peer_time.py --b 1 --h 8 --nq 2048 --nkv 2048 --d 64 [--hkv 8] [--causal] [--threads 1] [--reps 5]
                 [--dtype f32|bf16]

Kernels (--kernels, comma-separated, default all that apply):
  torch_flash  torch.nn.functional.scaled_dot_product_attention, FLASH_ATTENTION backend (CPU)
  torch_math   the same call on the MATH backend (materializes the scores)
  ort_mha      ONNX Runtime's com.microsoft MultiHeadAttention, CPU provider; needs H_kv = H
  ov_sdpa      OpenVINO: a model holding one opset ScaledDotProductAttention op, compiled for
               "CPU" with f32 inference precision (optional: skipped if openvino is missing)
  ggml_fa      ggml's ggml_flash_attn_ext (llama.cpp's CPU flash attention) with f32 K/V
               (optional: skipped if the ggml package of ggml-python is missing)
Install the optional ones with `scripts/peers_setup.sh --extra`.
--dtype bf16 runs PyTorch on bf16 Q, K, V (its CPU flash kernel then computes in bf16 with f32
accumulation) and OpenVINO with INFERENCE_PRECISION_HINT=bf16 (its default on CPUs with bf16
support), to compare with sdpa's `bench --q bf16 --kv bf16 --bf16-products`; ORT and ggml get
no row. max_abs_diff is then against torch_math on the same bf16 inputs.

The JSON lines follow docs/bench-schema.md, like `cargo run --release --example bench`:
{"kernel", "s" (median seconds of --reps timed calls after 0.2 s of warm-up calls), "gflops"
(4·b·h·nq·nkv·d / s / 1e9: the full, unmasked work even when causal), "b", "h", "hkv", "nq",
"nkv", "d", "causal", "threads"}, plus "max_abs_diff" against torch_math's output where that ran
(a check that the peers compute the same thing), "kv_dtype" and "note" for the optional peers,
or "error" instead of the timing.

Causal means PyTorch's is_causal (top-left diagonal), ORT's unidirectional and OpenVINO's causal
attribute (all top-left), and a 0/-inf mask for ggml; all agree with sdpa's bottom-right
alignment only when nq == nkv, so a causal run with nq != nkv is refused.
Inputs: standard normal float32, fixed seed; torch and OpenVINO get [b, h, s, d], ORT
[b, s, h·d], ggml the token-major [b, s, h, d] of llama.cpp's KV cache.

What keeps the comparison fair:
  * OpenVINO: INFERENCE_PRECISION_HINT=f32 (on CPUs with bf16 or AMX, OpenVINO would otherwise
    compute in bf16), PERFORMANCE_HINT=LATENCY (one stream), INFERENCE_NUM_THREADS=--threads,
    inputs bound once as shared-memory tensors, so a timed call is InferRequest.infer() only.
    The op has no grouped-query form: with hkv < h, K and V are repeated to h heads before
    timing (not timed; the line's "note" says so). The CPU plugin decomposes this op into a
    fused MatMul/Softmax/MatMul subgraph; its KV-cache attention path for LLMs is a different
    kernel, not timed here.
  * ggml: built for this CPU (-march=native, OpenMP) by peers_setup.sh; one FLASH_ATTN_EXT node
    with precision F32, scale 1/sqrt(d), GQA by broadcast (no repeat), a graph plan made once with
    --threads threads, so a timed call is ggml_graph_compute() only. For nq below its Q tile,
    ggml rounds Q to f16 and accumulates in f16 (errors around 1e-3, visible in max_abs_diff).
"""

import argparse
import json
import os
import statistics
import sys
import time

KERNELS = ("torch_flash", "torch_math", "ort_mha", "ov_sdpa", "ggml_fa")
OPTIONAL = {"ov_sdpa": "openvino", "ggml_fa": "ggml"}  # kernel -> the module it needs


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("b", "h", "nq", "nkv", "d"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--hkv", type=int, default=0, help="key/value heads (default: --h)")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--kernels", default=",".join(KERNELS))
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                   help="bf16: PyTorch on bf16 tensors, OpenVINO with a bf16 inference"
                        " precision; ORT and ggml are skipped")
    a = p.parse_args()
    unknown = set(a.kernels.split(",")) - set(KERNELS)
    if unknown:
        p.error(f"unknown kernels {sorted(unknown)}; known: {', '.join(KERNELS)}")
    a.hkv = a.hkv or a.h
    if a.h % a.hkv:
        p.error("--h must be a multiple of --hkv")
    if a.causal and a.nq != a.nkv:
        p.error("causal peers are top-left aligned: only nq == nkv compares with sdpa")
    return a


# Seconds of untimed calls before the timed ones, as in sdpa's bench example (its WARM_UP_S):
# a core that was idle before the run starts slowly, and one warm-up call of a short shape does
# not get past that.
WARM_UP_S = 0.2


def median_seconds(call, reps):
    """Median wall time of `reps` calls of `call`, after WARM_UP_S of untimed calls (at least one)."""
    start = time.perf_counter()
    call()
    while time.perf_counter() - start < WARM_UP_S:
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
    if a.dtype == "bf16":
        q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
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
                out = call().float().numpy()
            record(kernel, seconds, out=out)
        except Exception as e:  # a backend that refuses the shape is a result, not a crash
            record(kernel, error=f"{type(e).__name__}: {e}")

    if a.dtype == "bf16":  # no bf16 form timed for these two
        wanted = [x for x in wanted if x not in ("ort_mha", "ggml_fa")]
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

    for kernel, setup in (("ov_sdpa", ov_sdpa), ("ggml_fa", ggml_fa)):
        if kernel not in wanted:
            continue
        if not importable(OPTIONAL[kernel]):
            print(f"peer_time: {kernel} skipped: Python module {OPTIONAL[kernel]!r} is not installed"
                  " (scripts/peers_setup.sh --extra installs it)", file=sys.stderr)
            continue
        try:
            call, read_out, note, keep_alive = setup(a, q_np, k_np, v_np)
            seconds = median_seconds(call, a.reps)
            call()
            record(kernel, seconds, out=read_out())
            results[-1]["kv_dtype"] = a.dtype
            if note:
                results[-1]["note"] = note
            del keep_alive
        except Exception as e:
            record(kernel, error=f"{type(e).__name__}: {e}")

    math_out = outputs.get("torch_math")
    for row in results:
        out = outputs.get(row["kernel"])
        if math_out is not None and out is not None:
            row["max_abs_diff"] = float(np.max(np.abs(out - math_out)))
        row.update(
            {"b": a.b, "h": a.h, "hkv": a.hkv, "nq": a.nq, "nkv": a.nkv, "d": a.d,
             "causal": a.causal, "threads": a.threads}
        )
        if a.dtype != "f32":
            row["dtype"] = a.dtype
        print(json.dumps(row))
    sys.stdout.flush()


def importable(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


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


def ov_sdpa(a, q, k, v):
    """OpenVINO's ScaledDotProductAttention op alone in a model, compiled for the CPU plugin.

    Returns (call, read_out, note, keep_alive): call() runs one inference on the bound inputs,
    read_out() copies the output [b, h, nq, d], keep_alive holds the arrays the tensors share."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    group = a.h // a.hkv
    note = None
    if group > 1:  # the op checks that K/V have H heads: repeat them here, untimed
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        note = f"K/V repeated {group}x to h heads before timing (the op has no GQA)"
    arrays = {"q": q, "k": np.ascontiguousarray(k), "v": np.ascontiguousarray(v)}
    params = [ops.parameter(list(x.shape), ov.Type.f32, name=name) for name, x in arrays.items()]
    node = ops.scaled_dot_product_attention(*params, causal=a.causal)
    model = ov.Model([node], params, "sdpa_peer")
    config = {
        "INFERENCE_NUM_THREADS": str(a.threads),
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_PRECISION_HINT": a.dtype,
    }
    compiled = ov.Core().compile_model(model, "CPU", config)
    request = compiled.create_infer_request()
    for name, x in arrays.items():
        request.set_tensor(name, ov.Tensor(x, shared_memory=True))
    read_out = lambda: np.array(request.get_output_tensor(0).data, dtype=np.float32)
    return request.infer, read_out, note, arrays


def ggml_fa(a, q, k, v):
    """One ggml_flash_attn_ext node as llama.cpp builds it, on a token-major f32 KV cache.

    Same return value as ov_sdpa."""
    import ctypes

    import numpy as np
    import ggml

    if hasattr(ggml, "ggml_cpu_init"):
        ggml.ggml_cpu_init()
    token_major = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3))  # [b,h,s,d] -> [b,s,h,d]
    q_t, k_t, v_t = token_major(q), token_major(k), token_major(v)
    # ggml sizes run innermost first; older ggml wants the mask's rows padded (to 64 at most).
    mask_rows = -(-a.nq // 64) * 64
    data_bytes = sum(x.nbytes for x in (q_t, k_t, v_t)) * 2 + 2 * mask_rows * a.nkv
    mem = data_bytes + 16 * ggml.ggml_tensor_overhead() + ggml.ggml_graph_overhead() + (1 << 20)
    params = ggml.ggml_init_params(mem_size=mem, mem_buffer=None, no_alloc=False)
    ctx = ggml.ggml_init(params)
    if not ctx:
        raise RuntimeError("ggml_init failed")

    def tensor(x, kind):
        t = ggml.ggml_new_tensor_4d(ctx, kind, *reversed(x.shape))
        assert ggml.ggml_nbytes(t) == x.nbytes
        ctypes.memmove(ggml.ggml_get_data(t), x.ctypes.data, x.nbytes)
        return t

    f32 = ggml.GGML_TYPE_F32
    # Views [d, s, h, b] of the [d, h, s, b] buffers: the layout llama.cpp hands the op.
    qv, kv, vv = (ggml.ggml_permute(ctx, tensor(x, f32), 0, 2, 1, 3) for x in (q_t, k_t, v_t))
    mask = None
    if a.causal:  # llama.cpp's KQ mask: f16, 0 where visible, -inf where hidden
        keep = np.arange(a.nkv)[None, :] <= np.arange(mask_rows)[:, None]
        mask = tensor(np.where(keep, 0.0, -np.inf).astype(np.float16)[None, None], ggml.GGML_TYPE_F16)
    out = ggml.ggml_flash_attn_ext(ctx, qv, kv, vv, mask, 1.0 / a.d ** 0.5, 0.0, 0.0)
    ggml.ggml_flash_attn_ext_set_prec(out, ggml.GGML_PREC_F32)
    graph = ggml.ggml_new_graph(ctx)
    ggml.ggml_build_forward_expand(graph, out)
    plan = ggml.ggml_graph_plan(graph, a.threads, None)
    work = None
    if plan.work_size:
        work = (ctypes.c_uint8 * plan.work_size)()
        plan.work_data = ctypes.cast(work, ctypes.POINTER(ctypes.c_uint8))
    plan_ref = ctypes.byref(plan)

    def call():
        status = ggml.ggml_graph_compute(graph, plan_ref)
        if status != 0:
            raise RuntimeError(f"ggml_graph_compute returned {status}")

    def read_out():  # the op writes [b, nq, h, d]
        n = a.b * a.nq * a.h * a.d
        flat = np.ctypeslib.as_array((ctypes.c_float * n).from_address(ggml.ggml_get_data(out)))
        return flat.reshape(a.b, a.nq, a.h, a.d).transpose(0, 2, 1, 3).copy()

    class Context:  # frees ggml's memory when the caller drops it
        def __init__(self):
            self.arrays = (q_t, k_t, v_t, work)

        def __del__(self):
            ggml.ggml_free(ctx)

    note = "f32 K/V; for small nq ggml rounds Q to f16 and accumulates in f16" if a.nq < 64 else None
    return call, read_out, note, Context()


if __name__ == "__main__":
    main()
