"""This machine's limits next to the bench's speeds: peak matmul throughput and memory bandwidth.

- `matmul_tflops(dtype)`: one large square matmul (N = `MATMUL_N`, 2048) in `dtype`, best of a few
  runs: 2 N^3 / seconds. On a CPU with AMX, bfloat16 runs on the matrix units; float32 on AVX512.
- `copy_gbps()`: one large tensor copy (`COPY_MIB`, 256 MiB), best of a few runs: bytes read plus
  bytes written / seconds. Decoding one token reads every weight once, so
  `weights_bytes / bandwidth` is the floor of a decode step (`decode_bound_ms`).
Both use torch's current thread count (the engine's). On a shared machine they are what this
process got at the moment of measuring, like every other figure of the same run.
The block also says what the engine picked on this machine and why: `cpu` (the CPU family, its
dtype and kernels: asymagent/modeling/cpu_family.py) and `thread_policy` (the thread count and
where it came from, the CPUs this process may use, the OpenMP wait policy:
asymagent/modeling/cpu_threads.py).
"""

from __future__ import annotations

import time

import torch

MATMUL_N = 2048  # the square matmul's size (2 N^3 FLOPs)
COPY_MIB = 256  # the copied tensor's size


def median_ms(fn, n: int) -> float:
    """The median wall time of `n` calls of `fn`, in ms (the probes' side-by-side timings)."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2] * 1e3


def _best(fn, runs: int) -> float:
    fn()  # warm-up (allocation, oneDNN kernel selection)
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_tflops(dtype: torch.dtype = torch.bfloat16, n: int | None = None, runs: int = 3) -> float:
    n = n or MATMUL_N
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    secs = _best(lambda: torch.mm(a, b), runs)
    return 2 * n ** 3 / secs / 1e12


def copy_gbps(mib: int | None = None, runs: int = 3) -> float:
    mib = mib or COPY_MIB
    src = torch.ones(mib * (1 << 20) // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    secs = _best(lambda: dst.copy_(src), runs)
    return 2 * src.numel() * 4 / secs / 1e9


def weights_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights one decode step reads: every parameter and buffer once (a tied
    head counts once), int8 packed weights of dynamically quantised linears included."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    for mod in model.modules():  # torch.ao dynamic quantised Linear keeps packed int8 weights
        packed = getattr(mod, "_packed_params", None)
        if packed is not None and hasattr(mod, "weight") and callable(mod.weight):
            w = mod.weight()
            total += w.numel() * w.element_size()
    return total


def machine_limits(model: torch.nn.Module | None = None, threads: int | None = None) -> dict:
    """{"matmul_tflops_bf16", "matmul_tflops_fp32", "copy_gbps", "threads", "cpu",
    "thread_policy", ["weights_bytes", "decode_bound_ms"]}: the bench JSON's "machine" block
    (`threads`: the --threads the user gave, None if unset)."""
    from asymagent.modeling.cpu_family import cpu_choice
    from asymagent.modeling.cpu_threads import thread_info

    out = {"matmul_tflops_bf16": matmul_tflops(torch.bfloat16),
           "matmul_tflops_fp32": matmul_tflops(torch.float32),
           "copy_gbps": copy_gbps(), "threads": torch.get_num_threads(),
           "cpu": cpu_choice(), "thread_policy": thread_info(threads)}
    if model is not None:
        out["weights_bytes"] = weights_bytes(model)
        out["decode_bound_ms"] = out["weights_bytes"] / (out["copy_gbps"] * 1e9) * 1e3
    return out
