"""One-weight-pass int4 linear for the CPU (kernels/cpu_lowbit.cpp): 1..32 rows at one read of the 4-bit weight.

Why (issue 55): speculation on a CPU gains because a K+1-row verify reads the weights once, as a
one-row decode does. torch's `_weight_int4pack_mm_for_cpu` re-dequantises per row block (16 rows
cost several one-row calls) and Inductor's int4 template re-lays the weight out for AMX on every
call (docs/cpu.md, "Per-row cost"). This kernel dequantises each tile of the weight (16 output
channels x 32 inputs, one Q4_K sub-block) once, into bf16 in registers or L1, and feeds it to every
row of the call:

- path "amx" (bf16 activations, Intel AMX): the tile goes to an AMX B tile, the rows (<= 16 per A
  tile, two A tiles for 17..32 rows) are multiplied by `tdpbf16ps` into float32 C tiles;
- path "avx512bf16" (bf16 activations, AVX512-BF16 without AMX, e.g. AMD Zen 4): the same tile,
  `vdpbf16ps` per row with the row's input pair broadcast;
- path "avx2" (float32 activations, CPUs without a bf16 unit): the tile dequantised to float32,
  FMAs per row, a channel's two lanes added once at the end.

A row's arithmetic never depends on the other rows of the call (rows never mix; the input loop
order is fixed; the row count only sets how many rows a tile holds), so a row gets the same bits
alone as among any rows: greedy spec == full holds by construction (tests check it on every path
this CPU has).

Weights: w = lo + q * scale per 32 inputs, q in 0..15 (a GGUF's Q4_K grid, or a min/max rounding),
scale and lo stored in bf16 for bf16 activations (as torch's int4 op takes them), in float32 for
float32 activations (a GGUF's Q4_K scales have up to 17 significant bits: exact in float32).
`pack_int4` lays them out as records uint8 [N/64, K/32, 4, R] (four channel blocks' tiles of one
group side by side): 256 bytes of nibbles a tile (AMX's VNNI order: row r holds input pair
(2r, 2r+1) of each of the 16 channels; cpu_lowbit.cpp says how they are packed), then the tile's
16 scales and 16 lows (R = 320 in bf16, 384 in float32). So a bf16 tile reads 256 + 64 bytes:
5 bits a weight, as torch's int4 op with bf16 scales and zeros. int8 (`pack_int8`): records
[N/64, K/32, 4, 512] of int8 values, float32 per-channel scales beside.

Built at first use with `torch.utils.cpp_extension.load` (g++ and ninja: a fresh machine has the
first, the project depends on the second) into $ASYMAGENT_CACHE_DIR/kernels (or
~/.cache/asymagent/kernels), keyed by the source's hash and torch's version: ~20 s once, then a
load. `available()` says None or why not (no compiler, a build error, a CPU with none of the
paths): callers keep torch's op then. ISA caps set for the CPU-kind emulation (docs/cpu.md:
ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2 or AVX512_CORE_BF16) cap the paths too.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
from pathlib import Path

import torch

BLOCK = 16  # output channels per tile
GROUP = 32  # inputs per tile: one scale and one low per channel
SUPER = 4  # blocks whose records for one group lie together (one stream for a thread's four blocks)
RECORD = BLOCK * GROUP // 2 + 2 * BLOCK * 2  # 320 bytes: the tile's nibbles, then its bf16 scales and lows
PATHS = ("amx", "avx512bf16", "avx2")  # fastest first
_PATH_ID = {"amx": 0, "avx512bf16": 1, "avx2": 2}
_SOURCE = Path(__file__).with_name("cpu_lowbit.cpp")


def _cpu_flags() -> set:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_paths(flags: set | None = None, env: dict | None = None) -> list:
    """The kernel's paths this CPU runs, fastest first, under the ISA caps in `env` (os.environ)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return []
    flags = _cpu_flags() if flags is None else flags
    env = os.environ if env is None else env
    aten_cap = env.get("ATEN_CPU_CAPABILITY", "").lower()
    onednn_cap = env.get("ONEDNN_MAX_CPU_ISA", "").upper()
    avx512_ok = aten_cap not in ("avx2", "default") and onednn_cap not in ("AVX2", "AVX", "SSE41")
    amx_ok = avx512_ok and (onednn_cap == "" or "AMX" in onednn_cap or onednn_cap == "ALL")
    paths = []
    if amx_ok and {"amx_tile", "amx_bf16", "avx512_bf16", "avx512bw", "avx512vl"} <= flags:
        paths.append("amx")
    if avx512_ok and {"avx512_bf16", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        paths.append("avx512bf16")
    if aten_cap != "default" and {"avx2", "fma", "f16c"} <= flags:
        paths.append("avx2")
    return paths


def _build_dir() -> Path:
    root = os.environ.get("ASYMAGENT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "asymagent")
    digest = hashlib.sha256(_SOURCE.read_bytes()).hexdigest()[:12]
    path = Path(root) / "kernels" / f"cpu_lowbit-{digest}-torch{torch.__version__.replace('+', '_')}"
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.cache
def _module():
    """The built extension (once per process); raises what the build raised."""
    from torch.utils.cpp_extension import load

    return load(name="asymagent_cpu_lowbit", sources=[str(_SOURCE)], build_directory=str(_build_dir()),
                extra_cflags=["-O3", "-std=c++17", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)


@functools.cache
def _why_not() -> str | None:
    if not cpu_paths():
        return f"no path for this CPU ({platform.machine()}; needs AVX2+FMA, AVX512-BF16 or AMX)"
    try:
        _module()
    except Exception as exc:  # noqa: BLE001 - a missing compiler or ninja, a build error: reported, torch's op kept
        return f"the kernel did not build ({type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300]})"
    return None


def available() -> str | None:
    """None when the kernel built and this CPU has a path for it, else why not (once per process)."""
    return _why_not()


def path_for(dtype: torch.dtype, paths: list | None = None) -> str | None:
    """The fastest path for activations of `dtype` on this CPU, or None."""
    paths = cpu_paths() if paths is None else paths
    want = ("amx", "avx512bf16") if dtype == torch.bfloat16 else ("avx2",) if dtype == torch.float32 else ()
    found = [p for p in paths if p in want]
    if "amx" in found and not _module().amx_ok():
        found.remove("amx")
    return found[0] if found else None


def amx_leaves_tiles_as_found() -> bool:
    """The extension's self-check: an int4 and an int8 call through the AMX path load another
    user's tile configuration back (llama.cpp configures once per thread), or release the tiles."""
    return bool(_module().amx_leaves_tiles_as_found())


def pack_int4(q: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor, path: str = "amx") -> torch.Tensor:
    """q [N, K] in 0..15, scale and lo [N, K/32] -> the kernel's records uint8 [ceil(N/64), K/32, 4, R]
    for `path` (module doc): R = 320 with bf16 scales and lows (amx, avx512bf16), 384 with float32
    ones (avx2: float32 activations keep a GGUF grid exact). Channels past N are zero weights,
    their outputs cut by `int4_linear`."""
    n, k = q.shape
    if k % GROUP:
        raise ValueError(f"int4 tiles need K % {GROUP} == 0, got K = {k}")
    if tuple(scale.shape) != (n, k // GROUP) or tuple(lo.shape) != (n, k // GROUP):
        raise ValueError(f"scale and lo must be [{n}, {k // GROUP}], got {tuple(scale.shape)}, {tuple(lo.shape)}")
    pad = -n % (BLOCK * SUPER)
    q, scale, lo = (torch.cat([t, t.new_zeros(pad, t.shape[1])]) for t in (q, scale, lo))
    nb, g = (n + pad) // BLOCK, k // GROUP
    v = q.to(torch.int64).view(nb, BLOCK, g, GROUP // 2, 2)  # [b, channel, group, pair r, parity]
    rows = v.permute(0, 2, 3, 1, 4).reshape(nb, g, GROUP // 2, 2 * BLOCK)  # [b, g, r, value p = 2 channel + parity]
    # quarter z holds rows 4z..4z+3 as 32 words; word i, nibble j: row 4z + j, value i (cpu_lowbit.cpp)
    nib = rows.view(nb, g, 4, 4, 2 * BLOCK).permute(0, 1, 2, 4, 3)  # [b, g, z, i, j]
    words = (nib << torch.arange(0, 16, 4, dtype=torch.int64)).sum(dim=-1)  # [b, g, 4, 32] in 0..65535
    words = torch.where(words >= 2 ** 15, words - 2 ** 16, words).to(torch.int16)  # as int16's bits
    nibbles = words.contiguous().view(torch.uint8).view(nb, g, 4 * 64)  # [b, g, 256]
    params = torch.cat([scale.view(nb, BLOCK, g).transpose(1, 2), lo.view(nb, BLOCK, g).transpose(1, 2)], dim=-1)
    params_dtype = torch.float32 if path == "avx2" else torch.bfloat16
    params = params.to(params_dtype).contiguous().view(torch.uint8)  # [b, g, 64 or 128]
    records = torch.cat([nibbles, params], dim=-1)  # [b, g, 320 or 384]
    return records.view(nb // SUPER, SUPER, g, records.shape[-1]).transpose(1, 2).contiguous()  # [b / 4, g, 4, R]


def int4_linear(x: torch.Tensor, tiles: torch.Tensor, n_out: int, path: str) -> torch.Tensor:
    """x [M, K] (bf16 for amx/avx512bf16, float32 for avx2) -> [M, n_out] in x's dtype."""
    y = _module().int4_linear(x.contiguous(), tiles, _PATH_ID[path])  # [M, ceil(n_out / 64) * 64]
    return y if y.shape[1] == n_out else y[:, :n_out].contiguous()


def pack_int8(q: torch.Tensor, scale: torch.Tensor) -> tuple:
    """q [N, K] int8, scale [N] -> (records uint8 [ceil(N/64), K/32, 4, 512], scales float32 [ceil(N/64) * 64])."""
    n, k = q.shape
    if k % GROUP:
        raise ValueError(f"int8 tiles need K % {GROUP} == 0, got K = {k}")
    if tuple(scale.shape) != (n,):
        raise ValueError(f"scale must be [{n}], got {tuple(scale.shape)}")
    pad = -n % (BLOCK * SUPER)
    q = torch.cat([q.to(torch.int8), q.new_zeros(pad, k, dtype=torch.int8)])
    nb, g = (n + pad) // BLOCK, k // GROUP
    rows = q.view(nb, BLOCK, g, GROUP // 2, 2).permute(0, 2, 3, 1, 4)  # [b, g, r, channel, parity]
    records = rows.reshape(nb, g, BLOCK * GROUP).view(torch.uint8)  # [b, g, 512]
    records = records.view(nb // SUPER, SUPER, g, BLOCK * GROUP).transpose(1, 2).contiguous()  # [b/4, g, 4, 512]
    return records, torch.cat([scale.to(torch.float32), scale.new_zeros(pad, dtype=torch.float32)]).contiguous()


def int8_linear(x: torch.Tensor, tiles: torch.Tensor, scale: torch.Tensor, n_out: int, path: str) -> torch.Tensor:
    """x [M, K] (bf16 for amx/avx512bf16, float32 for avx2) -> [M, n_out]: x @ (q * scale)^T."""
    y = _module().int8_linear(x.contiguous(), tiles, scale, _PATH_ID[path])  # [M, ceil(n_out / 64) * 64]
    return y if y.shape[1] == n_out else y[:, :n_out].contiguous()


def int4_linear_reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """The kernel's function in plain torch: the weight dequantised in float32 from scale and lo as
    the records keep them (bf16 for bf16 x, float32 for float32 x), products summed in float32, the
    result in x's dtype."""
    n, k = q.shape
    kept = torch.bfloat16 if x.dtype == torch.bfloat16 else torch.float32
    s = scale.to(kept).to(torch.float32).repeat_interleave(GROUP, dim=1)  # [N, K]
    l = lo.to(kept).to(torch.float32).repeat_interleave(GROUP, dim=1)  # [N, K]
    w = torch.addcmul(l, q.to(torch.float32), s)  # [N, K] float32
    return (x.to(torch.float32) @ w.T).to(x.dtype)  # [M, N]
