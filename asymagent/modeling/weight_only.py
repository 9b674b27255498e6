"""Weight-only int8 / int4 linear layers for the CPU (`--dtype int8w`, `--dtype int4w`): the tile kernel, or torch's ops.

Why: decoding one token of a 1.5B verifier reads every decoder weight once; in bf16 that is
~3 GB a token, and on a CPU the decode is bandwidth-bound, so the weight format sets the speed.
Weight-only quantisation keeps the activations in the model's float dtype (bf16 where the CPU has
a bf16 unit, float32 elsewhere) and stores the decoder layers' linear weights in fewer bits:

- "int8w": int8 per output channel, symmetric (w ~ q * s, q in [-127, 127]);
- "int4w": int4 per group of INT4_GROUP inputs, asymmetric (w ~ lo + q * s, q in [0, 15]).
  INT4_GROUP = 32 is Q4_K's sub-block: the pair's bf16 weights are dequantised Q4_K blocks (a
  scale and a min per 32 weights on a 16-level grid), so min/max quantisation per 32 inputs gives
  most of them back exactly, and a GGUF's own grid is read where it holds (gguf_blocks.py).

Two kernels (`lowbit_kernel`; $ASYMAGENT_LOWBIT_KERNEL=tiles|torch forces one):
- "tiles" (kernels/cpu_lowbit.py, built at first use), where it builds and the CPU has a path for
  the activations' dtype (AMX or AVX512-BF16 for bf16, AVX2 for float32): each 16-channel x
  32-input tile of the weight is read once and used for every row of the call, so a K+1-row verify
  costs about what a one-row decode does (issue 55; docs/cpu.md, "The tile kernel"). Layers whose
  inputs are not a multiple of 32 keep torch's op.
- "torch": `torch._weight_int8pack_mm(x, q [N, K] int8, s [N])` and
  `aten._weight_int4pack_mm_for_cpu(x, packed, group, sz [K / group, N, 2])` (packed once by
  `aten._convert_weight_to_int4pack_for_cpu`; it computes (q - 8) * s + z): one row costs a
  fraction of bf16's, but 16 rows cost several one-row calls, so speculation loses in these kinds.
torchao is not used: its 0.18 `Int8WeightOnlyConfig` dequantises the whole weight on every call
(28 ms for an [8960, 1536] layer, against 0.35 ms for the op) and its int4 CPU packing format is
gone (docs/cpu.md). A torch without the ops gives a clear error (`op_missing`).

Which rows take the low-bit kernel: forwards of at most `max_rows` (32) rows on the CPU without
autograd: decode (one row), the K+1-row verify, drafter steps. Longer forwards (prefill chunks)
keep `F.linear` on the float weight the module keeps: measured here, the int kernels take 5-10x
bf16's AMX time at 128-512 rows (docs/cpu.md). So the layer keeps its float `weight` Parameter
(state_dict, tying and `.to` untouched) and adds the low-bit copy beside it: memory grows by the
low-bit bytes (int8w +50%, int4w ~+31% of the decoder linears' bf16 bytes); what a decode step
reads shrinks to them. Greedy tokens stay mode-independent: full's one-row decode and a K+1-row
verify run the same low-bit kernel, and every prefill runs the same F.linear in every mode.

Batch invariance: a row must get the same bits alone as among up to 32 rows (full decodes one
row, spec verifies K+1). `row_floor(kind, dtype, shape)` probes it once per (kind, dtype, shape,
threads) like `packed_linear.linear_floor` (asymagent/modeling/row_floor.py): the smallest of
FLOOR_CANDIDATES for which rows padded to it agree; forwards of fewer rows are padded. On this
AMX machine every kernel needs no padding (floor 1) in bf16 and float32; the tile kernel holds it
by construction on every path (rows never mix), and the probe checks it all the same. If no candidate holds,
`quantize_weights` refuses with a clear error rather than run a kernel that would make spec differ
from full.

`quantize_weights(model, kind)` swaps the decoder layers' `nn.Linear` modules (q, k, v, o, gate,
up, down) for `WeightOnlyLinear` in place, and the output head too, in int8 for both kinds (the
head decides the argmax, and the 1.5B's file keeps it in Q6_K; its bf16 read was ~24 ms of a
~120 ms int4w token, int8 ~16 ms). Embeddings and norms stay as they are (a tied head keeps its
float `weight`, so the embedding still reads it).
`pack_linears` leaves these layers alone (it packs plain `nn.Linear` only) and the lean forward
(asymagent/kv/lean_forward.py) runs them through its unfused loop, attached only when its logits
still equal transformers' bit for bit.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from asymagent.kernels import cpu_lowbit
from asymagent.modeling.gguf_blocks import ABOVE_4_BITS, Q4K_GROUP, GgufBlocks, Q4KGrid
from asymagent.modeling.packed_linear import unpack_linears
from asymagent.modeling.probe_cache import cached_probe
from asymagent.modeling.row_floor import floors_off, linear_rows_floor, pad_rows

_log = logging.getLogger(__name__)

KINDS = ("int8w", "int4w")
INT4_GROUP = 32  # inputs per int4 scale/zero: Q4_K's sub-block (module doc)
INT4_GROUPS = (32, 64, 128, 256)  # what the CPU int4 kernel takes; a smaller K takes the largest dividing it
MAX_ROWS = 32  # forwards of up to this many rows take the low-bit kernel (as PackedLinear's)
FLOOR_CANDIDATES = (1, 2, 4)  # row floors the probe tries, smallest first
LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
HEAD = "lm_head"  # the output head: int8 in both kinds (module doc)
LOWBIT_KERNELS = ("tiles", "torch")  # the low-bit kernels (module doc); ASYMAGENT_LOWBIT_KERNEL forces one


class WeightOnlyUnavailable(RuntimeError):
    """This torch or CPU cannot run the asked weight-only kind (the op is missing, fails, or gives
    a row other bits alone than among other rows)."""


@functools.cache
def op_missing(kind: str) -> str | None:
    """None if this torch has `kind`'s CPU op and it runs on a tiny case, else why not (once). torch's
    op, not the tile kernel: it serves the layers the tiles do not (inputs not a multiple of 32, a
    CPU without a path) and is the kernel everywhere the tile kernel does not build."""
    if kind not in KINDS:
        raise ValueError(f"unknown weight-only kind {kind!r}; use one of {', '.join(KINDS)}")
    try:
        w = torch.randn(32, 64)  # [N, K]
        layer = LowBitWeight.make(kind, w, torch.float32, "torch")
        layer.matmul(torch.randn(2, 64))
    except (AttributeError, RuntimeError, NotImplementedError) as exc:  # op absent or failing
        return f"{type(exc).__name__}: {exc}"
    return None


def int4_group(n_in: int) -> int:
    """The int4 group size for a layer of `n_in` inputs: INT4_GROUP when it divides n_in, else the
    largest of INT4_GROUPS that does (tiny test models), else an error."""
    if n_in % INT4_GROUP == 0:
        return INT4_GROUP
    for g in sorted(INT4_GROUPS, reverse=True):
        if n_in % g == 0:
            return g
    raise WeightOnlyUnavailable(f"int4w needs a layer's inputs divisible by {min(INT4_GROUPS)}, got {n_in}")


def lowbit_kernel(dtype: torch.dtype, asked: str | None = None) -> tuple:
    """(kernel, why) the low-bit layers run for activations of `dtype`: "tiles" (kernels/cpu_lowbit.py:
    1..32 rows at one read of the weight, int4 and int8) where it built and this CPU has a path for
    `dtype`, else "torch" (`_weight_int4pack_mm_for_cpu`, `_weight_int8pack_mm`). `asked` (or
    $ASYMAGENT_LOWBIT_KERNEL) forces one; "tiles" forced where it cannot run is an error."""
    asked = asked or os.environ.get("ASYMAGENT_LOWBIT_KERNEL") or None
    if asked not in (None, *LOWBIT_KERNELS):
        raise ValueError(f"unknown low-bit kernel {asked!r}; use one of {', '.join(LOWBIT_KERNELS)}")
    if asked == "torch":
        return "torch", "asked for"
    why = cpu_lowbit.available()
    path = cpu_lowbit.path_for(dtype) if why is None else None
    if why is None and path is None:
        why = f"no path of the tile kernel takes {dtype} activations on this CPU ({cpu_lowbit.cpu_paths()})"
    if why is not None:
        if asked == "tiles":
            raise WeightOnlyUnavailable(f"the low-bit tile kernel cannot run here: {why}")
        return "torch", why
    return "tiles", f"path {path}: one weight pass for 1..32 rows"


@dataclass
class LowBitWeight:
    """One layer's low-bit weight: `kind`, the kernel's tensors, and the activation dtype they take."""

    kind: str
    qweight: torch.Tensor  # int8w: [N, K] int8; int4w: the packed [N, K / 2] uint8
    qparams: torch.Tensor  # int8w: scales [N]; int4w: scales and zeros [K / group, N, 2]
    group: int  # int4w's group size (0 for int8w)
    dtype: torch.dtype  # activations (and qparams) dtype
    kernel: str = "torch"  # "tiles" (kernels/cpu_lowbit.py: qweight its records; int8 qparams its float32
    # scales padded, int4 none) or "torch"
    path: str | None = None  # the tile kernel's path (amx, avx512bf16, avx2)
    n_out: int = 0  # output channels (the tile kernel's records are padded to 64)

    @classmethod
    def make(cls, kind: str, weight: torch.Tensor, dtype: torch.dtype, kernel: str | None = None) -> "LowBitWeight":
        """Quantise a float weight [N, K] for activations of `dtype` (the weight's values in float32);
        `kernel`: the kernel (`lowbit_kernel`: None picks)."""
        w = weight.detach().to(torch.float32)  # [N, K]
        n_out, n_in = w.shape
        if kind == "int8w":
            scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-12)  # [N]
            q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)  # [N, K]
            if n_in % cpu_lowbit.GROUP == 0 and lowbit_kernel(dtype, kernel)[0] == "tiles":
                tiles, scales = cpu_lowbit.pack_int8(q, scale)  # [N/64, K/32, 4, 512] uint8, [N/64 * 64]
                return cls(kind, tiles, scales, 0, dtype, "tiles", cpu_lowbit.path_for(dtype), n_out)
            return cls(kind, q, scale.to(dtype), 0, dtype)
        group = int4_group(n_in)
        wg = w.view(n_out, n_in // group, group)  # [N, G, g]
        lo, hi = wg.amin(dim=-1), wg.amax(dim=-1)  # [N, G]
        scale = ((hi - lo) / 15.0).clamp(min=1e-12)  # [N, G]
        q = torch.round((wg - lo[..., None]) / scale[..., None]).clamp(0, 15)  # [N, G, g]
        return cls.from_grid(Q4KGrid(q.to(torch.int32).view(n_out, n_in), scale, lo), dtype, group, kernel)

    @classmethod
    def from_grid(cls, grid: Q4KGrid, dtype: torch.dtype, group: int = Q4K_GROUP,
                  kernel: str | None = None) -> "LowBitWeight":
        """int4w from a grid w = scale * q + lo per `group` inputs: a GGUF's Q4_K blocks as the file
        holds them (gguf_blocks.py), or `make`'s min/max rounding of a float weight; through the
        tile kernel where `lowbit_kernel` picks it, else torch's op."""
        if group == cpu_lowbit.GROUP and lowbit_kernel(dtype, kernel)[0] == "tiles":
            path = cpu_lowbit.path_for(dtype)
            tiles = cpu_lowbit.pack_int4(grid.q, grid.scale, grid.lo, path)  # [N/64, K/32, 4, 320 | 384] uint8
            return cls("int4w", tiles, torch.empty(0, dtype=dtype), group, dtype, "tiles", path, grid.q.shape[0])
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(grid.q, 1)  # [N, K / 2] uint8
        # the kernel computes (q - 8) * s + z: z = lo + 8 s gives lo + q s
        sz = torch.stack([grid.scale, grid.lo + 8.0 * grid.scale], dim=-1)  # [N, G, 2]
        return cls("int4w", packed, sz.transpose(0, 1).contiguous().to(dtype), group, dtype)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] (self.dtype) -> [M, N] through the low-bit kernel."""
        if self.kernel == "tiles" and self.kind == "int8w":
            return cpu_lowbit.int8_linear(x, self.qweight, self.qparams, self.n_out, self.path)
        if self.kernel == "tiles":
            return cpu_lowbit.int4_linear(x, self.qweight, self.n_out, self.path)
        if self.kind == "int8w":
            return torch._weight_int8pack_mm(x, self.qweight, self.qparams)
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.qweight, self.group, self.qparams)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.qparams))


def row_floor(kind: str, dtype: torch.dtype, shape: tuple, threads: int | None = None,
              kernel: str = "torch") -> int | None:
    """Input rows a few-row forward of a `kind` layer of `shape` [out, in] needs so that each row
    gets the bits it gets among up to 32 rows (module doc), or None if no candidate floor holds.
    `ASYMAGENT_ROW_FLOORS=0`: 1 (no padding, no probe)."""
    if floors_off():
        return 1
    return _row_floor(kind, dtype, tuple(shape), torch.get_num_threads() if threads is None else threads, kernel)


@functools.cache
def _row_floor(kind: str, dtype: torch.dtype, shape: tuple, threads: int, kernel: str = "torch") -> int | None:
    """Probed once per machine, torch and key (asymagent/modeling/probe_cache.py keeps the answer;
    0 there: no candidate holds)."""
    name = f"weight_only_floor:{kind}" + ("" if kernel == "torch" else f":{kernel}")
    floor = cached_probe(name, (dtype, shape, threads), lambda: _probe_row_floor(kind, dtype, shape, kernel) or 0)
    return floor or None


def _probe_row_floor(kind: str, dtype: torch.dtype, shape: tuple, kernel: str = "torch") -> int | None:
    g = torch.Generator().manual_seed(0)
    n_out, n_in = shape
    layer = LowBitWeight.make(kind, torch.randn(n_out, n_in, generator=g) / n_in ** 0.5, dtype, kernel)
    inputs = [torch.randn(32, n_in, generator=g).to(dtype) for _ in range(2)]  # [32, in]
    return linear_rows_floor(FLOOR_CANDIDATES, inputs, layer.matmul)


class WeightOnlyLinear(torch.nn.Linear):
    """nn.Linear whose CPU forwards of <= `max_rows` rows run a low-bit copy of its weight.

    Made by `quantize_weights` (class swap in place), never constructed directly."""

    lowbit: LowBitWeight
    floor: int
    max_rows: int

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        q = self.lowbit
        rows = input.numel() // input.shape[-1] if input.shape[-1] else 0
        if (input.dtype != q.dtype or input.device.type != "cpu" or not 0 < rows <= self.max_rows
                or (torch.is_grad_enabled() and input.requires_grad)):
            return F.linear(input, self.weight, self.bias)
        flat = pad_rows(input.reshape(rows, input.shape[-1]), self.floor, 0)  # [max(rows, floor), in]
        out = q.matmul(flat)[:rows]  # [rows, out]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*input.shape[:-1], out.shape[-1])


@dataclass
class WeightOnlyReport:
    """What `quantize_weights` did: layers swapped, low-bit bytes, row floors, seconds taken."""

    kind: str
    layers: int = 0
    lowbit_bytes: int = 0
    float_bytes: int = 0  # the float weights of those layers (kept for prefill)
    floors: dict = field(default_factory=dict)  # "NxK" -> row floor
    seconds: float = 0.0
    # where each layer's low-bit values came from: "min/max" (rounded from the float weight),
    # "Q4_K" (the GGUF's own grid), "int8: Q6_K" ... (kept above 4 bits by the file): counts
    sources: dict = field(default_factory=dict)
    kernel: str = ""  # the kernel its low-bit layers run ("tiles" or "torch"), and why
    kernel_why: str = ""


def _targets(model: torch.nn.Module) -> list:
    """(qualified name, nn.Linear) of every decoder-layer projection of `model`, then its output
    head (HEAD) when that is a bias-free linear."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no model.layers to quantise")
    found = [(f"{i}.{name}", child) for i, layer in enumerate(layers) for name, child in layer.named_modules()
             if name.rsplit(".", 1)[-1] in LINEAR_NAMES and type(child) in (torch.nn.Linear, WeightOnlyLinear)]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) in (torch.nn.Linear, WeightOnlyLinear) and head.bias is None:
        found.append((HEAD, head))
    return found


@torch.inference_mode()
def quantize_weights(model: torch.nn.Module, kind: str, max_rows: int = MAX_ROWS,
                     store: dict | None = None, gguf: str | None = None,
                     kernel: str | None = None) -> WeightOnlyReport:
    """Give `model`'s decoder-layer projections a `kind` low-bit copy of their weight, in place
    (module doc); marks the model `asymagent_quantized = kind`. Raises WeightOnlyUnavailable when
    this torch lacks the op or a layer's rows would not score alike alone and among others.
    `store`: {(layer name, kind, gguf): (low-bit copy, source)} kept across calls, so a probe switching kinds
    on one model (`dequantize_weights` between) quantises each layer once.
    `gguf`: the GGUF file the model was loaded from; int4w then takes its Q4_K layers' own grid and
    gives int8 to the layers the file keeps above 4 bits (asymagent/modeling/gguf_blocks.py).
    `kernel`: the low-bit kernel, "tiles" or "torch" (`lowbit_kernel`; None: the tile kernel where it runs)."""
    why = op_missing(kind)
    if why is not None:
        raise WeightOnlyUnavailable(f"--dtype {kind} needs torch's CPU weight-only op, which is "
                                    f"missing or fails in torch {torch.__version__} ({why})")
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype not in (torch.bfloat16, torch.float32):
        raise ValueError(f"--dtype {kind} runs bf16 or float32 models on the CPU, got "
                         f"{param.dtype} on {param.device}")
    report = WeightOnlyReport(kind)
    report.kernel, report.kernel_why = lowbit_kernel(param.dtype, kernel)
    _log.info("--dtype %s: low-bit layers through %s (%s)", kind, report.kernel, report.kernel_why)
    capability = torch.backends.cpu.get_cpu_capability()
    if not capability.startswith("AVX512") and report.kernel != "tiles":
        _log.warning("--dtype %s on a %s CPU: torch's low-bit kernels without AVX-512 were measured "
                     "slower than the float weights they replace (docs/cpu.md, AVX2 kernels)", kind, capability)
    start = time.perf_counter()
    unpack_linears(model)  # an engine's packed copies (re-made by the next pack_linears)
    store = {} if store is None else store
    gguf = gguf if kind == "int4w" else None  # only int4w reads the file's blocks
    blocks = functools.cache(lambda: GgufBlocks(gguf) if gguf is not None else None)  # parsed once, if needed
    for name, module in _targets(model):
        w = module.weight
        key = (name, kind, gguf, report.kernel)
        if key not in store or store[key][0].dtype != w.dtype:
            store[key] = _lowbit_of(kind, name, w, blocks, report.kernel)
        lowbit, source = store[key]
        report.sources[source] = report.sources.get(source, 0) + 1
        shape = tuple(w.shape)
        floor = row_floor(lowbit.kind, w.dtype, shape, kernel=lowbit.kernel)
        if floor is None:
            raise WeightOnlyUnavailable(
                f"--dtype {kind}: on this CPU the {lowbit.kind} kernel gives a row of a {shape[0]}x{shape[1]} "
                f"layer other bits alone than among other rows (even padded to "
                f"{FLOOR_CANDIDATES[-1]} rows), so spec could differ from full; use bfloat16/float32")
        module.__class__ = WeightOnlyLinear
        module.lowbit = lowbit
        module.floor, module.max_rows = floor, max_rows
        report.layers += 1
        report.lowbit_bytes += module.lowbit.nbytes()
        report.float_bytes += w.numel() * w.element_size()
        report.floors[f"{shape[0]}x{shape[1]}"] = floor
    report.seconds = time.perf_counter() - start
    model.asymagent_quantized = kind
    return report


def _lowbit_of(kind: str, name: str, w: torch.Tensor, blocks, kernel: str | None = None) -> tuple:
    """(low-bit copy, where it came from) of one layer: int8 for the head; else the GGUF's Q4_K
    grid where it holds, int8 where the file keeps the layer above 4 bits, else rounded from the
    float weight (min/max). `blocks()`: the GgufBlocks of the source file, or None."""
    if name == HEAD:
        return LowBitWeight.make("int8w", w, w.dtype, kernel), "int8: head"
    found = blocks().find(w) if blocks() is not None else None
    if found is not None and found.grid is not None:
        return LowBitWeight.from_grid(found.grid, w.dtype, kernel=kernel), "Q4_K"
    if found is not None and found.type_name in ABOVE_4_BITS:
        return LowBitWeight.make("int8w", w, w.dtype, kernel), f"int8: {found.type_name}"
    return LowBitWeight.make(kind, w, w.dtype, kernel), "min/max"


def dequantize_weights(model: torch.nn.Module) -> int:
    """Every WeightOnlyLinear of `model` back to a plain nn.Linear over its kept float weight (the
    low-bit copy dropped); returns how many."""
    count = 0
    for module in model.modules():
        if type(module) is WeightOnlyLinear:
            module.__class__ = torch.nn.Linear
            for attr in ("lowbit", "floor", "max_rows"):
                module.__dict__.pop(attr, None)
            count += 1
    if count and getattr(model, "asymagent_quantized", None) in KINDS:
        model.asymagent_quantized = None
    return count


def lowbit_count(model: torch.nn.Module) -> int:
    """How many of `model`'s linear layers are WeightOnlyLinear now."""
    return sum(type(m) is WeightOnlyLinear for m in model.modules())
