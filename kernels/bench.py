"""Benchmark of the fused gate: Triton kernel vs eager torch reference vs torch.compile.

`python -m asymagent.kernels.bench` (CUDA): V in {49152, 151936, 262144}, K in {2, 4, 8},
B in {1, 16, 64}; reports each variant's median time, the kernel's speed-up over eager and its
achieved GB/s against the memory-bandwidth bound, where the bound is the time to read the three
logit tensors once at the device's measured copy bandwidth (override with --peak-gbps);
`--splits`/`--block-v` force the split-V launch, `--variants kernel_s1` adds it without a split.
Without CUDA it says so and exits 0; `--cpu` instead times the eager reference against its
torch.compile'd form on CPU (the engine's per-round case: B=1, fp32, V=49152), interleaved;
`--compile-only` compiles the kernel for a CUDA arch without a GPU (Triton ships ptxas) and
reports registers, spills and exp instructions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from asymagent.kernels.gate_reference import fused_gate_reference

GPU_VOCABS = (49152, 151936, 262144)
GPU_KS = (2, 4, 8)
GPU_BATCHES = (1, 16, 64)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _compiled_reference():
    """torch.compile of the reference, one graph per case: without a higher recompile limit
    dynamo would silently run eager after 8 shapes and the table would lie."""
    import torch._dynamo

    torch._dynamo.config.recompile_limit = 256
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    return torch.compile(fused_gate_reference, dynamic=False)


def make_inputs(batch: int, k: int, vocab: int, dtype: torch.dtype, device: str, seed: int = 0):
    """Random but correlated logits [B, K+1, V] for the three views and drafts [B, K]."""
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (batch, k + 1, vocab)
    common = torch.randn(shape, generator=g, device=device) * 3
    ver = (common + torch.randn(shape, generator=g, device=device)).to(dtype)
    aug = (common + torch.randn(shape, generator=g, device=device)).to(dtype)
    base = (common + torch.randn(shape, generator=g, device=device)).to(dtype)
    drafts = aug[:, :k].float().argmax(-1)  # [B, K]
    return ver, aug, base, drafts


def _cpu_time(fn, repeats: int) -> tuple[list[float], list[float]]:
    """(wall seconds, this process's CPU seconds) of each call: on a shared machine the wall
    clock includes waiting for a core, the CPU clock only the work itself."""
    wall, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def bench_cpu(args) -> list[dict]:
    """Eager reference vs torch.compile on CPU, rounds interleaved so load drifts hit both."""
    from tqdm import tqdm

    rows = []
    compiled = _compiled_reference()
    cases = [(k, rule) for k in args.ks for rule in args.rules]
    for k, rule in tqdm(cases, desc="cpu gate", file=sys.stderr):
        ver, aug, base, drafts = make_inputs(1, k, args.cpu_vocab, torch.float32, "cpu")
        temp = 1.0 if rule == "exact" else 0.0
        kwargs = dict(beta=1.0, gamma=0.5, acceptance=rule, temperature=temp)

        def eager():
            return fused_gate_reference(ver, aug, base, drafts, **kwargs)

        def comp():
            return compiled(ver, aug, base, drafts, **kwargs)

        t0 = time.perf_counter()
        comp()  # first call compiles (or recompiles for a new K / rule)
        compile_s = time.perf_counter() - t0
        eager()
        comp()
        times = {"eager": ([], []), "compiled": ([], [])}
        for _ in range(args.repeats):  # interleave: the machine is shared, load drifts
            for name, fn in (("eager", eager), ("compiled", comp)):
                wall, cpu = _cpu_time(fn, 5)
                times[name][0].extend(wall)
                times[name][1].extend(cpu)
        med = {f"{name}_{clock}_ms": 1e3 * statistics.median(values[j])
               for name, values in times.items() for j, clock in enumerate(("wall", "cpu"))}
        rows.append(dict(device="cpu", vocab=args.cpu_vocab, k=k, batch=1, rule=rule, **med,
                         compile_s=compile_s))
    return rows


def _copy_bandwidth_gbps() -> float:
    """Measured device-to-device copy bandwidth (read + write bytes per second), GB/s."""
    import triton.testing

    src = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src))
    return 2 * src.numel() / (ms * 1e-3) / 1e9


def graphed(fn, device: str):
    """`fn` (device work only) recorded as a CUDA graph: a function that replays it. On CPU: fn.

    What the engine's captured rounds pay for the gate: the launches without Python's dispatch."""
    if device != "cuda":
        return fn
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # warm-up: compiles the kernels outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _time_ms(fn, device: str) -> float:
    """Median ms of `fn`: triton's do_bench on CUDA, wall-clock medians elsewhere (smoke runs)."""
    import triton.testing

    if device == "cuda":
        return triton.testing.do_bench(fn, return_mode="median")
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def bench_gpu(args, device: str = "cuda") -> list[dict]:
    """Kernel vs eager vs torch.compile on CUDA over the issue's grid (`--variants` picks).

    `kernel` is the split-V launch `fused_gate` makes (`--splits`/`--block-v` force its plan),
    `kernel_s1` the same kernels with one slice per row (no split: the split's own effect).
    `device="cpu"` only runs this code under the interpreter (a test), timing nothing real."""
    import importlib

    import triton.testing
    from tqdm import tqdm

    gate = importlib.import_module("asymagent.kernels.fused_gate")
    peak = args.peak_gbps or _copy_bandwidth_gbps()
    dtype = DTYPES[args.dtype]
    compiled = _compiled_reference() if "compiled" in args.variants else None
    rule = args.rules[0]
    rows = []
    cases = [(v, k, b) for v in args.vocabs for k in args.ks for b in args.batches]
    for vocab, k, batch in tqdm(cases, desc="gpu gate", file=sys.stderr):
        ver, aug, base, drafts = make_inputs(batch, k, vocab, dtype, device)
        if args.views == 1:  # one drafter view (spec, or asym with beta 0): no JSD pass
            base = None
        kwargs = dict(beta=1.0, gamma=0.5, acceptance=rule,
                      temperature=1.0 if rule == "exact" else 0.0)
        launch = dict(splits=args.splits, block_v=args.block_v)
        variants = {
            "kernel": lambda: gate.fused_gate_triton(ver, aug, base, drafts, **kwargs, **launch),
            "kernel_s1": lambda: gate.fused_gate_triton(ver, aug, base, drafts, **kwargs,
                                                        block_v=args.block_v, splits=1),
            "eager": lambda: fused_gate_reference(ver, aug, base, drafts, **kwargs),
            "compiled": lambda: compiled(ver, aug, base, drafts, **kwargs),
        }
        if "graph" in args.variants:  # the dispatched gate replayed from a CUDA graph
            variants["graph"] = graphed(
                lambda: gate.fused_gate_triton(ver, aug, base, drafts, **kwargs, **launch), device)
        for name, fused in (("graph_passes", False), ("graph_fused", True)):
            if name in args.variants:  # the same, forced to the separate passes / one launch
                variants[name] = graphed(
                    lambda fused=fused: gate.fused_gate_triton(ver, aug, base, drafts, **kwargs,
                                                               **launch, fused=fused), device)
        variants = {name: variants[name] for name in args.variants}
        for fn in variants.values():
            fn()  # compile / autotune outside the timed region
        times = {name: _time_ms(fn, device) for name, fn in variants.items()}  # ms
        # the logit tensors read once: v, a, b (one view: v and a)
        read_bytes = (3 if base is not None else 2) * ver.numel() * ver.element_size()
        bound_ms = read_bytes / (peak * 1e9) * 1e3
        block_v, _ = gate.launch_config(vocab, device, args.block_v)
        n_split, _ = gate.split_plan(batch * (k + 1), vocab, block_v, ver.device, args.splits)
        name = torch.cuda.get_device_name() if device == "cuda" else device
        row = dict(device=name, vocab=vocab, k=k, batch=batch, rule=rule,
                   dtype=args.dtype, block_v=block_v, splits=n_split,
                   views=args.views, one_launch=gate.one_launch(batch, vocab, base is None, rule))
        row.update({f"{name}_ms": ms for name, ms in times.items()})
        if "graph" in times:
            row["graph_x_of_bound"] = times["graph"] / bound_ms
        if "kernel" in times:
            if "eager" in times:
                row["speedup_vs_eager"] = times["eager"] / times["kernel"]
            row.update(kernel_gbps=read_bytes / (times["kernel"] * 1e-3) / 1e9, peak_gbps=peak,
                       bound_ms=bound_ms, x_of_bound=times["kernel"] / bound_ms)
        rows.append(row)
    return rows


ARG_TYPES = {  # the kernels' runtime arguments by name (logit pointers get --dtype)
    "part_ptr": "*fp32", "ipart_ptr": "*i32", "d_ptr": "*i64", "u_ptr": "*fp32", "e_ptr": "*fp32",
    "jsd_ptr": "*fp32", "n_ptr": "*i64", "next_ptr": "*i64", "count_ptr": "*i32", "K": "i32", "V": "i32",
    "CHUNK": "i32", "S": "i32", "stride_b": "i64", "stride_r": "i64", "g_stride_b": "i64",
    "g_stride_r": "i64", "beta": "fp32", "beta_bonus": "fp32", "log_gamma": "fp32",
    "temperature": "fp32", "jsd_min": "fp32",
}
# which kernels a call runs: (rule, one view?) -> kernel names (fused_gate.fused_gate_triton)
COMPILE_CASES = [
    ("cda", False, ("gate_stats", "gate_jsd", "gate_finish")),
    ("greedy", False, ("gate_stats", "gate_jsd", "gate_finish")),
    ("exact", False, ("gate_stats", "gate_jsd", "gate_race", "gate_finish")),
    ("exact", True, ("gate_stats", "gate_race", "gate_finish")),  # mode spec, sampled
    ("cda", False, ("gate_fused",)),  # one launch at B <= FUSED_MAX_BATCH (cda / greedy)
    ("greedy", True, ("gate_fused",)),
]


def compile_report(args) -> list[dict]:
    """Compile the gate's kernels for a CUDA arch without a GPU; registers, spills, exp count."""
    import importlib
    import pathlib
    import subprocess
    import tempfile

    import triton
    from triton.backends.compiler import GPUTarget

    gate = importlib.import_module("asymagent.kernels.fused_gate")
    kern = gate.gate_kernels()
    logit = {"bf16": "*bf16", "fp16": "*fp16", "fp32": "*fp32"}[args.dtype]
    vocab = max(args.vocabs)
    block_v, num_warps = gate.launch_config(vocab, "cuda")
    block_s = triton.next_power_of_2(-(-vocab // block_v))  # the most slices a row can get
    cuobjdump = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/cuobjdump"
    rows = []
    # two views also compile with the divergence gate (GATE: jsd_min > 0), which adds state;
    # gated calls never take the one launch (fused_gate.one_launch: it would spill there)
    cases = [(r, one, tuple(n for n in names if not (gated and n == "gate_fused")), gated)
             for r, one, names in COMPILE_CASES for gated in ((False,) if one else (False, True))]
    for rule_name, one_view, names, gated in cases:
        rule = {"cda": gate.RULE_CDA, "greedy": gate.RULE_GREEDY, "exact": gate.RULE_SAMPLE}[rule_name]
        for name in names:
            fn = getattr(kern, name)
            values = {"RULE": rule, "ONE_VIEW": one_view, "GATE": gated, "BLOCK_V": block_v,
                      "BLOCK_S": block_s}
            constexprs = {p.name: values[p.name] for p in fn.params if p.is_constexpr}
            signature = {p.name: "constexpr" if p.is_constexpr else
                         (logit if p.name in ("v_ptr", "a_ptr", "b_ptr", "g_ptr") else ARG_TYPES[p.name])
                         for p in fn.params}
            warps = 1 if name == "gate_finish" else num_warps
            src = triton.compiler.ASTSource(fn=fn, signature=signature, constexprs=constexprs)
            compiled = triton.compile(src, target=GPUTarget("cuda", args.arch, 32),
                                      options={"num_warps": warps, "enable_fp_fusion": False})
            with tempfile.NamedTemporaryFile(suffix=".cubin") as fh:
                fh.write(compiled.asm["cubin"])
                fh.flush()
                usage = subprocess.run([str(cuobjdump), "-res-usage", fh.name], capture_output=True,
                                       text=True, check=True).stdout
                sass = subprocess.run([str(cuobjdump), "-sass", fh.name], capture_output=True,
                                      text=True, check=True).stdout
            fields = dict(item.split(":") for line in usage.splitlines() if "REG:" in line
                          for item in line.split() if ":" in item)
            rows.append(dict(arch=f"sm_{args.arch}", rule=rule_name, views=1 if one_view else 2,
                             gate=gated, kernel=name, dtype=args.dtype,
                             block_v=block_v if name != "gate_finish" else None,
                             num_warps=warps, registers=int(fields["REG"]),
                             local_bytes=int(fields["LOCAL"]), spill_stores=sass.count("STL"),
                             exp_instructions=sass.count("MUFU.EX2")))
    return rows


def print_table(rows: list[dict]) -> None:
    """A rich table of the rows (every key a column)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="fused gate")
    for key in rows[0]:
        table.add_column(key)
    for row in rows:
        table.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()))
    Console().print(table)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compile-only", action="store_true",
                   help="compile the kernel for --arch without a GPU; print registers / spills")
    p.add_argument("--arch", type=int, default=90, help="CUDA arch for --compile-only (90 = H100)")
    p.add_argument("--cpu", action="store_true",
                   help="time the eager reference vs torch.compile on CPU (no CUDA needed)")
    p.add_argument("--cpu-vocab", type=int, default=49152, help="V for --cpu (SmolLM2: 49152)")
    p.add_argument("--vocabs", type=int, nargs="+", default=list(GPU_VOCABS))
    p.add_argument("--ks", type=int, nargs="+", default=list(GPU_KS))
    p.add_argument("--batches", type=int, nargs="+", default=list(GPU_BATCHES))
    p.add_argument("--rules", nargs="+", default=["cda"], choices=["cda", "greedy", "exact"])
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--variants", nargs="+", default=["kernel", "eager", "compiled"],
                   choices=["kernel", "kernel_s1", "eager", "compiled", "graph", "graph_passes",
                            "graph_fused"],
                   help="what to time (GPU); graph = the dispatched gate replayed from a CUDA "
                        "graph, graph_passes / graph_fused = forced to the separate passes / "
                        "the one launch")
    p.add_argument("--views", type=int, default=2, choices=[1, 2],
                   help="drafter views: 2 (asym with a base pass) or 1 (no base_logits)")
    p.add_argument("--splits", type=int, default=None,
                   help="force the slices per row (default: fused_gate.split_plan's choice)")
    p.add_argument("--block-v", type=int, default=None,
                   help="force BLOCK_V, a power of two (default: fused_gate.launch_config's)")
    p.add_argument("--repeats", type=int, default=20, help="interleaved rounds of 5 calls (CPU)")
    p.add_argument("--peak-gbps", type=float, default=None,
                   help="memory bandwidth for the bound (default: measured copy bandwidth)")
    p.add_argument("--json", default=None, help="write the rows to this JSON file")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.compile_only:
        rows = compile_report(args)
    elif args.cpu:
        rows = bench_cpu(args)
    elif not torch.cuda.is_available():
        print("the fused gate benchmark needs a CUDA GPU (none found); "
              "use --cpu to time the torch reference against torch.compile on CPU")
        return 0
    else:
        rows = bench_gpu(args)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
