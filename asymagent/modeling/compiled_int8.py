"""int8 weight-only matmuls through Inductor's CPU GEMM template: 1..16 rows at one pass over the weight.

Why (issue 55): torch's eager `_weight_int8pack_mm` (and `_weight_int4pack_mm_for_cpu`) re-read or
re-dequantise the weights per block of a few rows, so a 16-row verify costs several one-row
decodes, where speculation needs K+1 rows at about one row's cost. Inductor (torch.compile,
`max_autotune` with the CPP GEMM backend, the weights frozen as constants) lowers
`_weight_int8pack_mm` to its `CppGemmTemplate`: the int8 weight prepacked into blocks at compile
time, converted to bf16 inside the micro-kernel, and multiplied in AMX tiles where the CPU has
them (AVX-512 otherwise). Measured on the Intel AMX machine (docs/cpu.md, "Per-row cost"), its
16-row call reads the weight once.

`CompiledInt8(qweight [N, K] int8, scale [N], dtype)` compiles one kernel for exactly CHUNK rows
(one shape: one compile, and one code path for every row). `matmul(x [M, K])` gives the kernel
x's rows repeated up to a multiple of CHUNK (as `row_floor.pad_rows` pads to a floor) in CHUNK-row
calls and keeps the first M: every row goes through the same CHUNK-row kernel whatever rows share
its forward, so its bits are its own in any company (weight_only.py's contract; the probe there
checks it per layer shape), and a 1-row decode costs what a 16-row verify costs: one weight pass.

Each layer is its own compile (its weight is a frozen constant, and Inductor's FX graph cache is
off for it: OPTIONS): seconds a layer on 2 cores, ~20 s for the first of a shape (the generated
C++ is cached by its source). The compile
options are patched in around that first call only: nothing global changes. Calls must come as the
compile saw them (inference mode, CHUNK rows of `dtype`): a call that misses dynamo's guards
recompiles without the patch and is refused (no CPP choice without freezing).
`compiled_int8_missing()` says why this torch / CPU cannot (no C++ compiler, no CPP template).
"""

from __future__ import annotations

import functools
import itertools
import types

import torch

CHUNK = 16  # rows of the one compiled kernel shape
_TAGS = itertools.count(1)  # one code object name per compiled layer
# fx_graph_cache off: its key takes a frozen weight by shape and dtype only, and a hit reuses the
# weight the template prepacked at the first compile: a second layer of the same shape then
# multiplies by the first one's weights (seen on torch 2.13; tests/test_compiled_int8.py pins it)
OPTIONS = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP", "fx_graph_cache": False}


class _Int8Mm(torch.nn.Module):
    """`_weight_int8pack_mm` with its int8 weight and scales as buffers (what freezing folds in)."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor):
        super().__init__()
        self.register_buffer("qweight", qweight)  # [N, K] int8
        self.register_buffer("scale", scale)  # [N]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [CHUNK, K] -> [CHUNK, N]
        return torch._weight_int8pack_mm(x, self.qweight, self.scale)


def _own_forward(module: _Int8Mm, tag: int):
    """`module.forward` bound through its own code object: torch.compile caches compiled frames per
    code object and checks an entry's guards one by one, so hundreds of layers sharing
    _Int8Mm.forward would pass dynamo's cache limit (and walk every layer's guards per call)."""
    code = _Int8Mm.forward.__code__.replace(co_name=f"int8_forward_{tag}")
    return types.MethodType(types.FunctionType(code, _Int8Mm.forward.__globals__, code.co_name), module)


class CompiledInt8:
    """One layer's int8 weight behind a CHUNK-row Inductor kernel (module doc)."""

    def __init__(self, qweight: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        module = _Int8Mm(qweight, scale.to(dtype)).eval()
        self.n_in, self.dtype = qweight.shape[1], dtype
        self.module = module
        self.fn = torch.compile(_own_forward(module, next(_TAGS)), dynamic=False, fullgraph=True)
        # compile now, not in the first decode, with the options patched in for this compile only
        # (`torch.compile(options=...)` does not reach freezing, without which the template is refused)
        with torch._inductor.config.patch(OPTIONS), torch.inference_mode():
            self.fn(torch.zeros(CHUNK, self.n_in, dtype=dtype))

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] -> [M, N]: CHUNK-row calls over x's rows repeated to a multiple of CHUNK."""
        rows = x.shape[0]
        if rows < CHUNK:
            return self.fn(_repeat_rows(x, CHUNK))[:rows]  # a new tensor, as the compile saw
        # whole CHUNKs as new tensors, not views: a view of a longer tensor was seen to miss the
        # compiled frame's guards and recompile to the eager op (other bits, several passes)
        padded = _repeat_rows(x, -(-rows // CHUNK) * CHUNK)  # [ceil(M / CHUNK) * CHUNK, K]
        return torch.cat([self.fn(part.clone()) for part in padded.split(CHUNK)])[:rows]


def _repeat_rows(x: torch.Tensor, rows: int) -> torch.Tensor:
    """x [M, K] with its rows repeated cyclically up to `rows` (row_floor.pad_rows' rule)."""
    from asymagent.modeling.row_floor import pad_rows

    return pad_rows(x, rows, 0)


@functools.cache
def compiled_int8_missing() -> str | None:
    """None if Inductor compiles and runs the int8 template here (a tiny layer, once), else why not."""
    try:
        g = torch.Generator().manual_seed(0)
        q = torch.randint(-127, 128, (32, 64), generator=g, dtype=torch.int8)  # [N, K]
        scale = torch.rand(32, generator=g) / 64
        layer = CompiledInt8(q, scale, torch.bfloat16)
        x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
        with torch.inference_mode():
            got = layer.matmul(x)
        want = (x.float() @ q.float().T) * scale
        if not torch.allclose(got.float(), want, rtol=0.05, atol=0.05):
            return "the compiled kernel's output is not x @ (q * scale)"
    except Exception as exc:  # noqa: BLE001 - any compile failure (no compiler, no template) is a reason
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
    return None
