"""PackedLinear: bf16 linear layers whose few-row forwards read a oneDNN-prepacked weight (CPU).

Why (issue 30, measured on a 2-core AMX machine): decoding one token of the embedded verifier runs
211 linear layers on 1-16 rows; `F.linear` on a bf16 weight re-lays the weight out for oneDNN's
kernel on every call and reads it at ~10-14 GB/s, while the same kernel on a weight laid out
once (`torch.ops.mkldnn._reorder_linear_weight`) reads it at the machine's copy bandwidth
(~27 GB/s): 57-63 us instead of 89-112 us for a [1536, 576] layer at 1-16 rows. Its outputs are
bit-identical to `F.linear`'s for those rows (checked on every layer at pack time, below), so
greedy tokens do not change. At 64+ rows (prefill chunks) F.linear is as fast or faster and the
two may differ by an ulp, so those forwards keep F.linear. Whether a row scores the same alone as
inside a batch of rows is the CPU kernel's property: on AMX it does for 1..40 rows; on an AMD EPYC
with AVX512-BF16 and no AMX, one row over 1536 inputs gets other bits than the same row among 2+
rows (F.linear and the packed kernel alike). So a forward of fewer rows than this CPU's linear
row floor for its shape (asymagent/modeling/row_floor.py: 1 on AMX, 2 there) runs with its rows
repeated up to it (`packed_rows_forward`), and a position scores alike in a decode and a verify.

- `PackedLinear` is `nn.Linear` with that forward: rows <= `max_rows` (32: decode, the K+1 verify
  with jump-forward tokens before it,
  drafter steps) through the packed kernel, more rows, autograd, other devices or dtypes through
  `F.linear`. The original `weight` Parameter stays where it was (state_dict, tied embeddings and
  the drafter's shared head are untouched); the packed copy sits beside it and is re-made when the
  weight changes in place (its version counter moves) or is moved.
- `pack_linears(model)` turns a bf16 CPU model's `nn.Linear` modules into PackedLinear IN PLACE
  (the object's class changes, so every holder of the module, e.g. a drafter sharing the
  verifier's `lm_head`, gets the packed forward too), after checking on each layer that the
  packed kernel's rows equal F.linear's bit for bit; a layer that does not is left as it was.
  Cost: a second copy of every packed weight (the embedded verifier: ~270 MB more, the tied
  embedding/head included). `unpack_linears(model)` undoes it.
- A torch without the op, or a kernel that fails: one warning, plain F.linear from then on.
  `ASYMAGENT_PACKED_LINEAR=0` turns packing off.
- `linear_of(weight, bias)`: a (packed) nn.Linear over a bare weight tensor, e.g. the drafter's
  reduced-vocabulary head (asymagent/decoding/model_drafter.py's DraftHead).
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from asymagent.modeling.check_record import recorded_check
from asymagent.modeling.probe_cache import cached_probe
from asymagent.modeling.row_floor import floors_off, linear_rows_floor, pad_rows

MAX_PACKED_ROWS = 32  # forwards of up to this many rows use the packed weight (forced tokens + K+1)
CHECK_ROWS = (1, 3, 16, 32)  # row counts compared bit for bit with F.linear at pack time
_DISABLED = {"why": None}  # set once when the kernel fails at run time


def _key(weight: torch.Tensor) -> tuple:
    """What the packed copy was made from: storage, in-place version counter, dtype, device."""
    try:
        version = torch.Tensor._version.__get__(weight)  # moves on every in-place write
    except RuntimeError:  # an inference tensor (made under inference_mode) has no counter
        version = -1
    return (weight.data_ptr(), version, weight.dtype, weight.device)


def enabled() -> bool:
    """False when ASYMAGENT_PACKED_LINEAR=0 or the kernel failed earlier in this process."""
    if os.environ.get("ASYMAGENT_PACKED_LINEAR", "").strip().lower() in ("0", "false", "off", "no"):
        return False
    return _DISABLED["why"] is None and kernel_available() is None


@functools.cache
def kernel_available() -> str | None:
    """None if this torch has oneDNN's packed bf16 linear and it runs, else why not (once)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return "torch is built without oneDNN (mkldnn)"
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            return "oneDNN reports no bf16 support on this CPU"
        w = torch.randn(8, 16, dtype=torch.bfloat16)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 1)
        torch.ops.mkldnn._linear_pointwise(torch.randn(2, 16, dtype=torch.bfloat16), packed, None,
                                           "none", [], "")
    except Exception as exc:  # noqa: BLE001 - a missing op (AttributeError/RuntimeError) or a failing one
        return f"{type(exc).__name__}: {exc}"
    return None


def disable(exc: BaseException) -> None:
    if _DISABLED["why"] is None:
        _DISABLED["why"] = f"{type(exc).__name__}: {exc}"
        warnings.warn(f"packed bf16 linear failed ({_DISABLED['why']}); using F.linear from now on",
                      RuntimeWarning, stacklevel=3)


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] bf16 weight -> oneDNN's blocked layout (an opaque mkldnn tensor, same bytes)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


def packed_forward(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] through a `pack_weight` copy -> [..., out] (bf16, CPU)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def _shape(packed: torch.Tensor, n_in: int) -> tuple:
    """[out, in] of a `pack_weight` copy (oneDNN's opaque tensor keeps the logical sizes)."""
    return (int(packed.shape[0]), n_in)


def packed_rows_forward(x: torch.Tensor, packed: torch.Tensor,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """`packed_forward` with fewer rows than this CPU's linear row floor (asymagent/modeling/row_floor.py)
    repeated up to it: a row then gets the bits it gets inside a multi-row (verify) forward."""
    return padded_forward(x, packed, bias, linear_floor(x.dtype, _shape(packed, x.shape[-1])))


def padded_forward(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None,
                   floor: int) -> torch.Tensor:
    """`packed_forward` of x [..., in] with fewer than `floor` rows repeated up to it (the extra
    rows' outputs dropped) -> [..., out]: `packed_rows_forward` with the floor looked up once by
    the caller (`packed_floor`; the lean forward's direct road, once per forward)."""
    rows = x.numel() // x.shape[-1]
    if rows >= floor:
        return packed_forward(x, packed, bias)
    flat = pad_rows(x.reshape(rows, x.shape[-1]), floor, 0)  # [floor, in]
    out = packed_forward(flat, packed, bias)[:rows]  # [rows, out]
    return out.reshape(*x.shape[:-1], out.shape[-1])


def packed_floor(packed: torch.Tensor, n_in: int, dtype: torch.dtype) -> int:
    """The row floor `packed_rows_forward` pads x [..., n_in] through `packed` to (this CPU's
    linear row floor for its shape): for `padded_forward`."""
    return linear_floor(dtype, _shape(packed, n_in))


LINEAR_CANDIDATES = (1, 2, 4)  # row floors the probe tries, smallest first


def linear_floor(dtype: torch.dtype, shape: tuple, threads: int | None = None,
                 packed: bool | None = None) -> int:
    """Input rows a few-row forward of a linear layer of `shape` [out, in] needs on the CPU so that
    each row gets the bits it gets in any few-row forward (asymagent/modeling/row_floor.py): the
    smallest of LINEAR_CANDIDATES for which rows padded to it agree, probed once per (dtype,
    shape, threads) on random weights of that shape through the kernel that runs them (packed in
    bf16, else F.linear). Per shape, because the kernels' row classes are: on an AMD EPYC without
    AMX a layer over 1536 inputs needs 2 rows, one over 576 inputs none (and 2 rows there cost
    3x one row for the 1536-input layer). `shape`: a tuple of ints (it keys the probe's cache; on
    the hot path, once per few-row forward). `packed`: the kernel probed, the packed one (None: it
    when bf16 and packing is on) or F.linear (False: `FloorLinear`'s). `ASYMAGENT_ROW_FLOORS=0`: 1
    (no padding)."""
    if floors_off():
        return 1
    if packed is None:
        packed = dtype == torch.bfloat16 and enabled()
    return _linear_floor(dtype, shape, torch.get_num_threads() if threads is None else threads, packed)


@functools.cache
def _linear_floor(dtype: torch.dtype, shape: tuple, threads: int, packed: bool) -> int:
    """Probed once per machine, torch and key (asymagent/modeling/probe_cache.py keeps the answer)."""
    return cached_probe("linear_floor", (dtype, tuple(shape), threads, packed),
                        lambda: _probe_linear_floor(dtype, shape, packed))


def _probe_linear_floor(dtype: torch.dtype, shape: tuple, packed: bool) -> int:
    g = torch.Generator().manual_seed(0)
    n_out, n_in = shape
    weight = (torch.randn(n_out, n_in, generator=g) / n_in ** 0.5).to(dtype)  # [out, in]
    inputs = [torch.randn(32, n_in, generator=g).to(dtype) for _ in range(3)]  # [32, in]
    kernel = pack_weight(weight) if packed else weight

    def linear(x: torch.Tensor) -> torch.Tensor:  # [rows, in] -> [rows, out]
        return packed_forward(x, kernel) if packed else F.linear(x, kernel)

    floor = linear_rows_floor(LINEAR_CANDIDATES, inputs, linear)
    return LINEAR_CANDIDATES[-1] if floor is None else floor


class PackedLinear(torch.nn.Linear):
    """nn.Linear whose CPU bf16 forwards of <= `max_rows` rows read a prepacked weight.

    Made by `pack_linears` (class swap in place), never constructed directly."""

    packed_weight: torch.Tensor | None
    packed_key: tuple | None
    max_rows: int

    def current_packed(self) -> torch.Tensor | None:
        """The packed copy of the current weight (re-made when the weight was replaced or changed
        in place since it was packed)."""
        w = self.weight
        key = _key(w)
        if self.packed_key != key:
            self.packed_weight, self.packed_key = pack_weight(w), key
        return self.packed_weight

    def __getstate__(self) -> dict:
        """Copies and pickles leave the packed copy out (an opaque oneDNN tensor cannot be
        copied or saved); it is re-made on the copy's first packed forward."""
        state = dict(self.__dict__)
        state["packed_weight"], state["packed_key"] = None, None
        return state

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        w = self.weight
        if (input.dtype == torch.bfloat16 and w.dtype == torch.bfloat16 and input.device.type == "cpu"
                and w.device.type == "cpu" and 0 < input.numel() <= self.max_rows * input.shape[-1]
                and _DISABLED["why"] is None
                and not (torch.is_grad_enabled() and (input.requires_grad or w.requires_grad))):
            try:
                return packed_rows_forward(input, self.current_packed(), self.bias)
            except Exception as exc:  # noqa: BLE001 - fall back for good, once
                disable(exc)
        return F.linear(input, w, self.bias)


class FloorLinear(torch.nn.Linear):
    """nn.Linear whose CPU bf16/fp16 forwards of <= `max_rows` rows run F.linear with their rows
    repeated up to F.linear's row floor for this shape (`linear_floor(..., packed=False)`).

    For a layer `pack_linears` leaves unpacked (the packed kernel's bits differ from F.linear's):
    F.linear itself can give one row other bits than the same row among 2+ rows. Measured on the
    Intel AMX machine: over 8,960 inputs (the Qwen2.5-Coder 1.5B's down_proj) one row alone differs
    from 2..32 rows, at 1 and 2 threads; padded to 2 rows every row count agrees. Without the floor
    a one-token decode (mode full) and a K+1 verify (spec) scored a position with other bits there.
    Made by `pack_linears` (class swap in place), never constructed directly."""

    max_rows: int

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        w = self.weight
        rows = input.numel() // max(input.shape[-1], 1)
        if (input.dtype in (torch.bfloat16, torch.float16) and input.device.type == "cpu"
                and 0 < rows <= self.max_rows
                and not (torch.is_grad_enabled() and (input.requires_grad or w.requires_grad))):
            floor = linear_floor(input.dtype, (self.out_features, self.in_features), packed=False)
            if rows < floor:
                flat = pad_rows(input.reshape(rows, input.shape[-1]), floor, 0)  # [floor, in]
                out = F.linear(flat, w, self.bias)[:rows]  # [rows, out]
                return out.reshape(*input.shape[:-1], out.shape[-1])
        return F.linear(input, w, self.bias)


@dataclass
class PackReport:
    """What `pack_linears` did: layer counts and the bytes of the packed copies."""

    packed: int = 0
    extra_bytes: int = 0
    not_identical: list = field(default_factory=list)  # module names left unpacked
    skipped_why: str | None = None  # the whole model left alone (kernel missing, not bf16 CPU)


def _identical(module: torch.nn.Linear, packed: torch.Tensor, seed: int) -> bool:
    """The packed kernel's rows equal F.linear's bit for bit on random inputs of CHECK_ROWS rows."""
    g = torch.Generator().manual_seed(seed)
    n_in = module.in_features
    for rows in CHECK_ROWS:
        x = torch.randn(rows, n_in, generator=g).to(torch.bfloat16)  # [rows, in]
        if not torch.equal(packed_forward(x, packed, module.bias),
                           F.linear(x, module.weight, module.bias)):
            return False
    return True


@torch.inference_mode()
def pack_linears(model: torch.nn.Module, max_rows: int = MAX_PACKED_ROWS,
                 check: bool = True) -> PackReport:
    """Make `model`'s bf16 CPU `nn.Linear` layers PackedLinear in place (see the module doc).

    `check`: compare each layer's packed rows with F.linear's first and leave a layer that
    differs unpacked (its name lands in `not_identical`). A shared module is packed once. The
    check's answer for a model loaded from files is recorded (asymagent/modeling/check_record.py:
    keyed on the weights, machine, threads and code); where the record answers, the layers are
    not packed now but on their first packed forward (`current_packed`), so the copies the lean
    forward replaces by its fused ones (q, k, v, gate, up) are never made."""
    report = PackReport()
    if not enabled():
        report.skipped_why = _DISABLED["why"] or kernel_available() or "ASYMAGENT_PACKED_LINEAR=0"
        return report
    seen: set = set()
    todo = []  # (name, module, check seed) of the bf16 CPU nn.Linear layers to pack
    for name, module in model.named_modules():
        if id(module) in seen or type(module) not in (torch.nn.Linear, PackedLinear, FloorLinear):
            continue
        seen.add(id(module))
        w = module.weight
        if w.dtype != torch.bfloat16 or w.device.type != "cpu":
            continue
        if type(module) in (PackedLinear, FloorLinear):
            module.max_rows = max_rows
            continue
        todo.append((name, module, len(seen)))
    packed: dict = {}  # name -> packed copy made by the check (absent: made on first use)
    if check and todo:
        names = [name for name, _, _ in todo]

        def run_check() -> list:
            differ = []
            for name, module, seed in todo:
                packed[name] = pack_weight(module.weight)
                if not _identical(module, packed[name], seed=seed):
                    differ.append(name)
                    del packed[name]  # left unpacked: its copy is not kept
            return differ

        not_identical = set(recorded_check(
            "pack_identical", model, run_check,
            lambda v: isinstance(v, list) and set(v) <= set(names), CHECK_ROWS))
    else:
        not_identical = set()
        packed = {name: pack_weight(module.weight) for name, module, _ in todo}
    for name, module, _ in todo:
        w = module.weight
        if name in not_identical:
            report.not_identical.append(name)
            module.__class__ = FloorLinear  # F.linear, its rows padded to F.linear's floor
            module.max_rows = max_rows
            continue
        module.__class__ = PackedLinear
        module.packed_weight = packed.get(name)
        module.packed_key = _key(w) if name in packed else None
        module.max_rows = max_rows
        report.packed += 1
        report.extra_bytes += w.numel() * w.element_size()
    if report.not_identical:
        warnings.warn(f"{len(report.not_identical)} bf16 linear layer(s) differ from F.linear "
                      f"through the packed kernel; left unpacked (F.linear, rows padded to its "
                      f"floor): {report.not_identical[:3]}",
                      RuntimeWarning, stacklevel=2)
    return report


def linear_of(weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.nn.Linear:
    """An nn.Linear over `weight` [out, in] (and `bias` [out]) without copying them, packed as
    `pack_linears` would (e.g. the drafter's reduced draft-vocabulary head)."""
    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    lin.weight = torch.nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        lin.bias = torch.nn.Parameter(bias, requires_grad=False)
    pack_linears(lin)
    return lin


def unpack_linears(model: torch.nn.Module) -> int:
    """Turn every PackedLinear (and FloorLinear) of `model` back into a plain nn.Linear (drops the
    packed copies); returns how many."""
    count = 0
    for module in model.modules():
        if type(module) in (PackedLinear, FloorLinear):
            module.__class__ = torch.nn.Linear
            for attr in ("packed_weight", "packed_key", "max_rows"):
                module.__dict__.pop(attr, None)
            count += 1
    return count


def packed_count(model: torch.nn.Module) -> int:
    """How many of `model`'s linear layers are PackedLinear now."""
    return sum(type(m) is PackedLinear for m in model.modules())
