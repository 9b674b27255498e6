"""Per-row cost of one low-bit linear at the pair's 1.5B layer shapes: is 1..32 rows one weight pass?

    flock /tmp/asym-cpu.lock python -m asymagent.evals.probes.lowbit_rows --rounds 2 \\
        --json docs/results/lowbit_rows.json

Speculation on a CPU gains only if a K+1-row verify costs about one row. For each layer shape of
the Qwen2.5-Coder 1.5B ([out, in]: q/o 1536x1536, k/v 256x1536, gate/up 8960x1536, down
1536x8960) and 1, 2, 4, 8, 16, 32 input rows (bf16 activations), the median ms of one call of:

- "bf16": `F.linear` on the bf16 weight (oneDNN; AMX where present); with `--dtype float32` (what
  an AVX2-only CPU runs) every kind takes float32 activations and "bf16" is float32's `F.linear`;
- "int4w": `aten._weight_int4pack_mm_for_cpu` (`--dtype int4w` with ASYMAGENT_LOWBIT_KERNEL=torch,
  weight_only.py; groups of 32);
- "int8w": `torch._weight_int8pack_mm` (`--dtype int8w` and int4w's Q6_K layers with
  ASYMAGENT_LOWBIT_KERNEL=torch);
- "int4w_tiles" / "int8w_tiles": kernels/cpu_lowbit.py, the tile kernel `--dtype int4w|int8w` run
  where it builds (one read of the weight for 1..32 rows; its AMX, AVX512-BF16 or AVX2 path);
- "int4w_inductor" / "int8w_inductor": the same ops under `torch.compile` with freezing and
  `max_autotune` on the CPP GEMM backend (Inductor's CPU GEMM templates: `CppWoqInt4GemmTemplate`
  with its AMX / AVX-512 micro-kernels for int4, `CppGemmTemplate` with the int8 weight prepacked
  for int8), one compile per (shape, rows), compile seconds recorded;
- "torchao_int8" / "torchao_int8_compiled": torchao's `Int8WeightOnlyConfig` on an `nn.Linear`, eager and
  compiled the same way; "torchao_int4": `Int4WeightOnlyConfig(group_size=32)` (where it quantises
  on the CPU at all; the error otherwise). Skipped with a note when torchao is not installed;
- "int4_tiled": pure torch, the int4 grid packed two per byte; per tile of `--tile` output
  channels the weights dequantised once to bf16, then one bf16 matmul for all rows.

Interleaved: per round, per shape and row count, every kind once (`--repeats` calls, median),
A B A B; the figure is the median of the rounds' medians (`min_ms`: the fastest call, what a
shared machine's noise leaves least touched). Per kind and shape also: whether a row's
output bits are the same whatever rows share its call (rows 0..M-1 of an M-row call, M in the
row counts, against the same rows of a 32-row call; rows 0, 5 and 31 alone), the ratio
16 rows / 1 row, and whether it beats bf16 at 1 and 16 rows. `decoder_ms` sums one forward's
decoder linears of the 1.5B (28 layers: 2 q/o, 2 k/v, 2 gate/up, 1 down each) per kind and rows.
"""

from __future__ import annotations

import os
import statistics
import time

from asymagent.evals.probes.harness import command, finish, parser

SHAPES = {"q_o": (1536, 1536), "k_v": (256, 1536), "gate_up": (8960, 1536), "down": (1536, 8960)}
PER_LAYER = {"q_o": 2, "k_v": 2, "gate_up": 2, "down": 1}  # linears of each shape per decoder layer
LAYERS = 28  # decoder layers of the 1.5B
ALL_KINDS = ("bf16", "int4w", "int8w", "int4w_tiles", "int8w_tiles", "int4w_inductor", "int8w_inductor", "int4w_inductor_pad16",
             "int8w_inductor_pad16", "torchao_int8",
             "torchao_int8_compiled", "torchao_int4", "int4_tiled")


def _inductor_config() -> None:
    """Inductor's CPU GEMM templates for the weight-only ops: frozen weights, max_autotune, CPP."""
    import torch._dynamo.config as dc
    import torch._inductor.config as ic

    ic.freezing = True
    ic.max_autotune = True
    ic.max_autotune_gemm_backends = "CPP,ATEN"
    dc.cache_size_limit = 64  # one graph per row count


class _OpModule:
    """A module around one low-bit op with its weights as buffers (what freezing folds in)."""

    @staticmethod
    def make(lowbit):
        import torch

        class Op(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.register_buffer("q", lowbit.qweight)
                self.register_buffer("p", lowbit.qparams)

            def forward(self, x):  # [M, K] -> [M, N]
                return lowbit.__class__(lowbit.kind, self.q, self.p, lowbit.group, lowbit.dtype).matmul(x)

        return Op().eval()


class TiledInt4:
    """Pure-torch int4: two 4-bit q per byte [N, K / 2], scale and lo per 32 inputs; per tile of
    output channels dequantised once to bf16, then one bf16 matmul for every row."""

    def __init__(self, weight, tile: int):
        import torch

        w = weight.float()  # [N, K]
        n, k = w.shape
        wg = w.view(n, k // 32, 32)  # [N, G, 32]
        lo, hi = wg.amin(-1), wg.amax(-1)  # [N, G]
        scale = ((hi - lo) / 15).clamp(min=1e-12)
        q = torch.round((wg - lo[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8).view(n, k)
        self.packed = (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()  # [N, K / 2]
        self.scale = scale.to(torch.bfloat16)[..., None]  # [N, G, 1]
        self.lo = lo.to(torch.bfloat16)[..., None]  # [N, G, 1]
        self.tile, self.n, self.k = tile, n, k

    def __call__(self, x):  # [M, K] bf16 -> [M, N]
        import torch

        parts = []
        for a in range(0, self.n, self.tile):
            b = min(a + self.tile, self.n)
            p = self.packed[a:b]  # [T, K / 2]
            q = torch.stack((p & 15, p >> 4), dim=-1).view(b - a, self.k // 32, 32)  # [T, G, 32]
            wt = torch.addcmul(self.lo[a:b], q.to(x.dtype), self.scale[a:b]).view(b - a, self.k)  # [T, K]
            parts.append(x @ wt.t())  # [M, T]
        return torch.cat(parts, dim=1)  # [M, N]


def _torchao(kind: str, weight):
    """A torchao-quantised bf16 nn.Linear (eager), or raise with torchao's own error."""
    import torch
    from torchao.quantization import Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_

    lin = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
    lin.weight.data.copy_(weight)
    config = Int8WeightOnlyConfig() if kind.startswith("torchao_int8") else Int4WeightOnlyConfig(group_size=32)
    quantize_(lin, config)
    return lin.eval()


def _callables(weight, kinds: list, tile: int) -> tuple[dict, dict]:
    """{kind: fn(x [M, K]) -> [M, N]} for one bf16 weight [N, K], and {kind: why not} for the
    kinds that could not be made here."""
    import torch
    import torch.nn.functional as F

    from asymagent.modeling.compiled_int8 import CompiledInt8
    from asymagent.modeling.weight_only import LowBitWeight

    fns, skipped = {}, {}
    dtype = weight.dtype
    low = {k: LowBitWeight.make(k, weight, dtype, "torch") for k in ("int4w", "int8w")}
    for kind in kinds:
        try:
            if kind == "bf16":
                fns[kind] = lambda x: F.linear(x, weight)
            elif kind in low:
                fns[kind] = low[kind].matmul
            elif kind in ("int4w_tiles", "int8w_tiles"):
                tiled = LowBitWeight.make(kind.removesuffix("_tiles"), weight, dtype, "tiles")
                fns[kind] = tiled.matmul
            elif kind == "int8w_inductor_pad16":
                fns[kind] = CompiledInt8(low["int8w"].qweight, low["int8w"].qparams, dtype).matmul
            elif "_inductor" in kind:
                base, _, pad = kind.partition("_inductor")
                compiled = torch.compile(_OpModule.make(low[base]), dynamic=False)
                fns[kind] = compiled if not pad else _chunked(compiled, int(pad.removeprefix("_pad")))
            elif kind == "int4_tiled":
                fns[kind] = TiledInt4(weight, tile)
            elif kind.startswith("torchao"):
                lin = _torchao(kind, weight)
                fns[kind] = torch.compile(lin, dynamic=False) if kind.endswith("_compiled") else lin
                if kind == "torchao_int4":
                    fns[kind](torch.randn(1, weight.shape[1], dtype=weight.dtype))
        except Exception as exc:  # noqa: BLE001 - the probe records why a kind is absent
            skipped[kind] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
    return fns, skipped


def _chunked(fn, rows: int):
    """fn on x [M, K] in `rows`-row calls (one compiled shape), x's rows repeated up to a multiple
    of `rows`, the first M kept (as compiled_int8.CompiledInt8.matmul)."""
    import torch

    from asymagent.modeling.row_floor import pad_rows

    def call(x):
        padded = pad_rows(x, -(-x.shape[0] // rows) * rows, 0)
        return torch.cat([fn(part) for part in padded.split(rows)])[:x.shape[0]]

    return call


def _row_bits_same(fn, x32) -> bool:
    """Rows of an M-row call equal the same rows of a 32-row call (M in the probed row counts),
    and rows 0, 5, 31 alone equal theirs (x32 [32, K])."""
    import torch

    ref = fn(x32)  # [32, N]
    for m in (1, 2, 4, 8, 16):
        if not torch.equal(fn(x32[:m]), ref[:m]):
            return False
    return all(torch.equal(fn(x32[i:i + 1])[0], ref[i]) for i in (0, 5, 31))


def _call_ms(fn, x, repeats: int) -> list:
    """ms of `repeats` back-to-back calls."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(x)
        times.append(1e3 * (time.perf_counter() - t0))
    return times


def measure(kinds: list, rows: tuple, rounds: int, repeats: int, tile: int, shapes: dict,
            dtype=None) -> dict:
    """The per-shape figures (module doc); `dtype`: the activations' (default bf16)."""
    import torch

    dtype = dtype or torch.bfloat16
    g = torch.Generator().manual_seed(0)
    per_shape = {}
    for name, (n_out, n_in) in shapes.items():
        w = (torch.randn(n_out, n_in, generator=g) / n_in ** 0.5).to(dtype)  # [N, K]
        x32 = torch.randn(32, n_in, generator=g).to(dtype)  # [32, K]
        fns, skipped = _callables(w, kinds, tile)
        compile_s = {}
        with torch.inference_mode():
            for kind, fn in fns.items():  # warm-up: every row count once (the compiles)
                t0 = time.perf_counter()
                for m in rows:
                    fn(x32[:m])
                compile_s[kind] = time.perf_counter() - t0
            same = {kind: _row_bits_same(fn, x32) for kind, fn in fns.items()}
            ms = {kind: {m: [] for m in rows} for kind in fns}  # per round: the calls' median
            fastest = {kind: {m: [] for m in rows} for kind in fns}  # per round: the fastest call
            for _ in range(rounds):
                for m in rows:
                    for kind, fn in fns.items():
                        calls = _call_ms(fn, x32[:m], repeats)
                        ms[kind][m].append(statistics.median(calls))
                        fastest[kind][m].append(min(calls))
        med = {kind: {str(m): statistics.median(v) for m, v in by.items()} for kind, by in ms.items()}
        per_shape[name] = {"shape": [n_out, n_in], "ms": med, "round_ms": {k: {str(m): v for m, v in by.items()}
                                                                            for k, by in ms.items()},
                           "min_ms": {k: {str(m): min(v) for m, v in by.items()} for k, by in fastest.items()},
                           "row_bits_same_in_any_company": same, "warmup_s": compile_s, "skipped": skipped,
                           "ratio_16_to_1": {k: med[k]["16"] / med[k]["1"] for k in med if "16" in med[k]},
                           "beats_bf16_at_1_and_16": {k: med[k]["1"] < med["bf16"]["1"] and med[k]["16"] < med["bf16"]["16"]
                                                      for k in med if "bf16" in med and "16" in med[k]}}
        print(name, {k: {m: round(v, 3) for m, v in by.items()} for k, by in med.items()}, same, skipped, flush=True)
    return per_shape


def decoder_ms(per_shape: dict) -> dict:
    """ms of one forward's decoder linears of the 1.5B per kind and row count (module doc)."""
    kinds = set.intersection(*(set(s["ms"]) for s in per_shape.values()))
    out = {}
    for kind in sorted(kinds):
        rows = per_shape[next(iter(per_shape))]["ms"][kind]
        out[kind] = {m: LAYERS * sum(PER_LAYER[n] * s["ms"][kind][m] for n, s in per_shape.items()) for m in rows}
    return out


def main(argv=None) -> int:
    import torch

    from asymagent.modeling.cpu_dtype import runtime_info  # noqa: F401 - the package imports as the engine does

    p = parser(__doc__, "lowbit_rows")
    p.add_argument("--kinds", default=",".join(ALL_KINDS), help="comma list of " + ", ".join(ALL_KINDS))
    p.add_argument("--rows", default="1,2,4,8,16,32")
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma list of " + ", ".join(SHAPES))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7, help="calls per (kind, rows) per round; median")
    p.add_argument("--tile", type=int, default=1024, help="output channels per int4_tiled tile")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="activations and bf16's weight")
    args = p.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    rows = tuple(int(r) for r in args.rows.split(",") if r)
    if any(k.endswith(("_inductor", "_compiled")) for k in kinds):
        _inductor_config()
    load_before = os.getloadavg()
    per_shape = measure(kinds, rows, args.rounds, args.repeats, args.tile,
                        {n: SHAPES[n] for n in args.shapes.split(",") if n}, getattr(torch, args.dtype))
    doc = {"command": command("lowbit_rows", argv), "torch": torch.__version__,
           "machine": {"cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
                       "cpus": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg(),
                       "isa_caps": {k: os.environ.get(k) for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}},
           "settings": {"rows": list(rows), "rounds": args.rounds, "repeats": args.repeats, "tile": args.tile,
                        "dtype": args.dtype},
           "shapes": per_shape}
    if len(per_shape) == len(SHAPES):
        doc["decoder_ms"] = decoder_ms(per_shape)
    try:
        import torchao

        doc["torchao"] = torchao.__version__
    except ImportError:
        doc["torchao"] = None
    return finish(doc, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
