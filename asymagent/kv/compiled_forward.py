"""Compiled static-shape forwards for the CPU decode path: torch.compile of `StaticKV.step`.

Eager decoding of a small model is bound by per-token overhead, not by reading its weights
(issue 30: the embedded verifier takes ~53 ms per token where its bfloat16 weights take ~14 ms to
read): 30 layers of small eager ops, cache bookkeeping and Python. A StaticKV
(asymagent/kv/static_cache.py) already gives every forward of T tokens the same shapes whatever
the cached length, so one compiled program per (T, head, capacity, model) serves every decode step
(T = 1) and every verify step (T = K+1) of a request, and of every later request of that size.

- `compiled_step(kv, input_ids, head)` runs `kv.step` through `torch.compile` (inductor, static
  shapes). Dynamo's guards are the cache of compiled shapes: the first forward of a new shape
  compiles (the warm-up, seconds to a minute on 2 cores; inductor's on-disk cache makes a later
  process pay less), later ones replay; `WARMUP` records each shape's first-call seconds.
- Fallback: if torch.compile is unavailable (no C++ compiler, an unsupported platform) or a
  compilation fails, a warning says why once and every later forward runs `kv.step` eagerly
  (the same values up to float reduction order).
- Prefill chunks longer than `StaticKVOptions.max_graph_tokens` stay eager (one shape each would
  compile for nothing: they are matmul-bound already).
- Frozen weights (`FREEZING`, inductor's `freezing`): the model's parameters are constants of the
  compiled program, so inductor lays the linear weights out for oneDNN once (as
  asymagent/modeling/packed_linear.py does for the eager path) and folds what depends on them
  alone. Measured (embedded verifier, bf16, 2 threads, quiet Intel AMX machine,
  `python -m asymagent.evals.probes.compiled_decode`): a one-token forward at 1000 cached tokens
  36.5 ms without, 28.7-29.3 ms with (the same StaticKV eager: 46 ms; the engine's default eager
  path, packed linears + LeanForward: 31 ms); at 4000, 38.4 ms against the default's 42. The
  price: a weight changed in place after the first forward of a shape is not seen by that shape's
  program (`ASYMAGENT_COMPILE_FREEZING=0` turns freezing off), and a laid-out copy of the
  weights in memory.
- The CPU row floors (`attention_floor`, `grouped_rows_exact`, asymagent/kv/attention.py) are
  constants to dynamo (`torch.compiler.assume_constant_result`): without that it traced through
  their `functools.cache` and ran the probe's attention calls inside every compiled forward
  (55-60 ms instead of 36.6 for one token, same measurement).

Compiled bf16 rounds differently from eager bf16 (fused kernels: logits differ by up to
0.4-0.7, and an argmax can change). A row's bits in a compiled K+1 verify need not equal its bits
in a compiled one-token forward (another program; the probe found them equal with frozen weights,
1 vs 3 tokens at 1000 and 4000 cached, and different without), so under `compile=True` mode spec
is not guaranteed bit-identical to mode full; with the warm-up (~30 s a shape on this machine)
that is why compilation stays opt-in (docs/engine.md).
"""

from __future__ import annotations

import os
import time
import warnings

import torch

RECOMPILE_LIMIT = 64  # shapes per compiled function before dynamo gives up (default 8)
# the weights as constants of the compiled program (see the module doc); 0/false/off: not
FREEZING = os.environ.get("ASYMAGENT_COMPILE_FREEZING", "1").strip().lower() not in ("0", "false", "off", "no")
WARMUP: dict = {}  # (T, head, capacity, dtype) -> seconds the first forward of that shape took
_state = {"fn": None, "failed": None}


def _step(kv, input_ids: torch.Tensor, head: bool) -> torch.Tensor:
    return kv.step(input_ids, head)


def compile_failed() -> str | None:
    """Why compilation was given up in this process (None while it works or was never tried)."""
    return _state["failed"]


def _compiled():
    if _state["fn"] is None:
        import torch._dynamo
        import torch._inductor.config  # noqa: F401 - compiled_step patches its `freezing`

        cfg = torch._dynamo.config
        for name in ("recompile_limit", "cache_size_limit"):
            if hasattr(cfg, name):
                setattr(cfg, name, max(getattr(cfg, name), RECOMPILE_LIMIT))
        _state["fn"] = torch.compile(_step, dynamic=False)
    return _state["fn"]


def compiled_step(kv, input_ids: torch.Tensor, head: bool) -> torch.Tensor:
    """`kv.step(input_ids, head)` compiled (see the module docstring), eager as the fallback."""
    if _state["failed"] is None:
        key = (int(input_ids.shape[1]), bool(head), kv.capacity, str(kv.dtype))
        first = key not in WARMUP
        t0 = time.perf_counter()
        length = int(kv.length)  # a failed compile may have run part of the forward
        try:
            # inductor reads `freezing` when it compiles (a new shape); as torch.compile's
            # options={"freezing": ...} it was not applied (measured: the same 36.5 ms)
            fn = _compiled()
            with torch._inductor.config.patch(freezing=FREEZING):
                out = fn(kv, input_ids, head)
        except Exception as exc:  # noqa: BLE001 - any compiler failure means: run eagerly
            _state["failed"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            warnings.warn(f"torch.compile of the decode forward failed; decoding eagerly "
                          f"({_state['failed']})")
            kv.length.fill_(length)
        else:
            if first:
                WARMUP[key] = time.perf_counter() - t0
            return out
    return kv.step(input_ids, head)
