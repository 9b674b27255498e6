"""`asymagent tune TRACES`: pick SpecConfig/CompressionConfig by measurement on your own traces.

    asymagent tune runs/traffic --json runs/tune.json --write-config runs/spec.json \
        [--min-fidelity 0.9] [--max-minutes 30] [--grid "k=2,4;head_tokens=64,128"]

1. Steps: the held-out slice of the traces (asymagent/traces.py `split_heldout`, the slice
   `train-drafter --traces` never trains on; `--slice all` takes every step), in conversation
   order so consecutive steps extend the same prompt as they did in serving.
2. Points: the shipped default (asym, SpecConfig(), CompressionConfig()) and one point per knob
   value changed alone from it (a one-at-a-time grid: K fixed or adaptive, draft source,
   acceptance rule, beta, strict_prefix, escalation threshold, tool-output head/tail budget);
   `--grid` replaces the knob values, `--max-points` bounds how many are measured.
3. Measurement: points run in groups of `--group` together with mode `full`, interleaved like the
   bench (step-major, order rotated each repeat, `--repeats`), each point on its own cache session
   and store of earlier responses. Speed-up vs full = median over repeats of full's total wall
   time over the point's, with the bench's 95% bootstrap interval over steps x repeats; fidelity
   = share of steps whose token ids equal full's; `trace_match` = share of steps equal to what
   the trace recorded (asymagent/evals/traces.py `score_output`).
4. Budget: before each group the time it will take is estimated from the calls so far; a group
   that would pass `--max-minutes` is not started and one that passes it is abandoned, so every
   reported point is measured in full and the rest are listed as not measured.
5. Choice: the fastest measured point with fidelity >= `--min-fidelity`; the frontier (points no
   other point beats on both speed-up and fidelity) as a markdown table and a PNG next to the
   JSON (evals/tuning/tune_report.py); `--write-config` writes the chosen point as a config file
   (asymagent/config_file.py) that serve --config, Engine.from_default(config=) and
   ChatAsymSpec.from_default(config=) load.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from dataclasses import dataclass, field

COMPRESSION_KNOBS = ("head_tokens", "tail_tokens", "query_keep_tokens", "id_keep_tokens", "compression")
KEEP_KNOBS = ("query_keep_tokens", "id_keep_tokens")  # the default view's keep budgets (docs/context.md)
# (knob, values): each value changed alone from the default; the first knobs matter most
DEFAULT_GRID = (
    ("head_tokens", [128, 32]),  # tool-output budget; tail_tokens follows at half unless given
    ("compression", ["none"]),  # the verifier reads the full view (asym without compression)
    ("id_keep_tokens", [0]),  # the view without identifier keep (query keep only)
    ("acceptance", ["cda"]),
    ("strict_prefix", [16]),  # with cda: greedy for the first 16 tokens of each response
    ("k", [4, 2]),  # fixed K (adaptive_k off)
    ("suffix", [False]),  # prompt lookup instead of suffix matching
    ("lookup_ngram", [0]),  # the drafter model only
    ("beta", [1.0, 0.5]),  # the drafter's delta (off by default)
    ("copy_weight", [0.0, 12.0]),  # the copy delta (6 by default)
    ("escalate_jsd", [0.3]),
)


@dataclass
class Point:
    """One setting: SpecConfig overrides and a CompressionConfig, mode asym (or the reference full)."""

    name: str
    mode: str = "asym"
    spec: dict = field(default_factory=dict)
    compression: dict | None = None  # CompressionConfig as a dict; None = the shipped default

    def spec_config(self):
        from asymagent.spec_config import SpecConfig

        return SpecConfig(**self.spec)

    def compression_config(self):
        from asymagent.context.compressors import CompressionConfig

        return CompressionConfig() if self.compression is None else CompressionConfig.model_validate(self.compression)


def point_for(knob: str, value) -> Point:
    """The default point with one knob changed (compression knobs build a CompressionConfig)."""
    from asymagent.context.compressors import CompressionConfig, ToolOutputCompressor

    name = f"{knob}={value}"
    if knob == "compression":
        if value != "none":
            raise ValueError(f"compression={value!r}: only 'none' (tool-output budgets: head_tokens/tail_tokens, "
                             f"query_keep_tokens, id_keep_tokens)")
        return Point(name, compression=CompressionConfig.none().model_dump(mode="json"))
    # the default view's tool_output compressor with one budget changed (its other options, e.g.
    # the keep budgets, stay the default's)
    shipped = next((c for c in CompressionConfig().compressors if isinstance(c, ToolOutputCompressor)),
                   ToolOutputCompressor())
    if knob in ("head_tokens", "tail_tokens"):
        head = int(value) if knob == "head_tokens" else shipped.head_tokens
        tail = int(value) if knob == "tail_tokens" else max(0, head // 2)
        name = f"tool_output={head}/{tail}"
        comp = CompressionConfig(compressors=[shipped.model_copy(update={"head_tokens": head, "tail_tokens": tail})])
        return Point(name, compression=comp.model_dump(mode="json"))
    if knob in KEEP_KNOBS:
        comp = CompressionConfig(compressors=[shipped.model_copy(update={knob: int(value)})])
        return Point(name, compression=comp.model_dump(mode="json"))
    from asymagent.spec_config import SpecConfig

    if knob not in ("k", "strict_prefix") and getattr(SpecConfig(), knob) == value:
        return Point(name)  # the default's own value: the default point (dropped as a duplicate)
    spec = {knob: value}
    if knob == "k":
        spec["adaptive_k"] = False
    elif knob == "strict_prefix":
        spec["acceptance"] = "cda"
        name = f"acceptance=cda,strict_prefix={value}"
    point = Point(name, spec=spec)
    point.spec_config()  # validates now
    return point


def parse_grid(text: str) -> list:
    """'k=2,4;head_tokens=64,128' -> [("k", [2, 4]), ("head_tokens", [64, 128])] (JSON values)."""
    from asymagent.spec_config import SpecConfig

    names = {f.name for f in dataclasses.fields(SpecConfig)} | set(COMPRESSION_KNOBS)
    grid = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        knob, eq, values = part.partition("=")
        knob = knob.strip()
        if not eq or knob not in names or not values.strip():
            raise ValueError(f"--grid: bad part {part!r}; use knob=v1,v2 with SpecConfig fields or "
                             f"{', '.join(COMPRESSION_KNOBS)}")
        grid.append((knob, [_value(v.strip()) for v in values.split(",") if v.strip()]))
    return grid


def _value(text: str):
    from asymagent.evals.running.runner import PY_LITERALS

    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return PY_LITERALS.get(text, text)


def grid_points(grid, max_points: int) -> list:
    """[default, one point per knob value] (duplicates of the default dropped), at most max_points."""
    from asymagent.context.compressors import CompressionConfig

    shipped = CompressionConfig().model_dump(mode="json")
    points = [Point("default")]
    seen = {json.dumps([{}, None])}
    for knob, values in grid:
        for value in values:
            p = point_for(knob, value)
            if p.compression == shipped:
                p.compression = None
            key = json.dumps([p.spec, p.compression], sort_keys=True)
            if key not in seen:
                seen.add(key)
                points.append(p)
    return points[:max_points]


def tune_steps(traces: str, slice_: str, holdout: float, max_steps: int | None) -> list:
    """The steps measured: the held-out slice (or all), grouped by conversation, shortest first."""
    from asymagent.traces import conversation_key, load_traces, split_heldout

    examples = load_traces(traces)
    if slice_ == "heldout":
        examples = split_heldout(examples, holdout)[1]
        if not examples:
            raise ValueError(f"{traces}: the held-out slice is empty (one conversation?); use --slice all")
    order = {k: i for i, k in enumerate(dict.fromkeys(conversation_key(ex) for ex in examples))}
    examples = sorted(examples, key=lambda ex: (order[conversation_key(ex)], len(ex.messages)))
    return examples[:max_steps] if max_steps else examples


def measure_group(engine, steps: list, points: list, repeats: int, max_new_tokens: int, *,
                  bar=None, deadline: float = float("inf")) -> dict | None:
    """{name: {"times": [repeat][step] s, "ids": [step] token ids, "stats": [StepStats], "match": [bool]}}
    for `points` (the first is the reference, mode full), interleaved; None when `deadline` passed."""
    from asymagent.evals.running.engine_setup import use_suffix_store
    from asymagent.evals.running.runner import spec_overrides
    from asymagent.evals.suites.traces import score_output

    out = {p.name: {"times": [[0.0] * len(steps) for _ in range(repeats)], "ids": [], "stats": [],
                    "match": []} for p in points}
    saved_compression, saved_store = engine.compression, engine.suffix_store
    try:
        for r in range(repeats):
            order = points[r % len(points):] + points[: r % len(points)]  # rotate who goes first
            keys = {p.name: f"tune-{p.name}-{r}" for p in points}
            for i, ex in enumerate(steps):
                choice = "required" if ex.is_tool_step and ex.tools else "auto"
                for p in order:
                    if time.monotonic() > deadline:
                        return None
                    use_suffix_store(engine, keys[p.name])
                    engine.compression = p.compression_config()
                    with spec_overrides(engine, p.spec):
                        t0 = time.perf_counter()
                        res = engine.chat(ex.messages, tools=ex.tools, mode=p.mode, max_new_tokens=max_new_tokens,
                                          temperature=0.0, tool_choice=choice, cache_key=keys[p.name])
                        out[p.name]["times"][r][i] = time.perf_counter() - t0
                    if r == 0:
                        out[p.name]["ids"].append(list(res.token_ids))
                        out[p.name]["stats"].append(res.stats)
                        out[p.name]["match"].append(score_output(ex, res.tool_calls, res.text))
                    if bar is not None:
                        bar.update(1)
            for key in keys.values():
                engine.caches.drop(key)
    finally:
        engine.compression, engine.suffix_store = saved_compression, saved_store
    return out


def summarize(point: Point, got: dict, ref: dict, n: int) -> dict:
    """One measured point: speed-up vs the group's full (median, ci95), fidelity, trace match, stats."""
    from asymagent.evals.bench.bench import bootstrap_ratio
    from asymagent.stats import RunStats

    run = RunStats()
    for s in got["stats"]:
        run.add(s)
    totals = run.totals()
    wall = statistics.median(sum(t) for t in got["times"])
    full = statistics.median(sum(t) for t in ref["times"])
    return {"name": point.name, "mode": point.mode, "spec": point.spec, "compression": point.compression,
            "measured": True, "steps": n, "wall_s": wall, "full_wall_s": full,
            "speedup_vs_full": full / wall if wall > 0 else None,
            "speedup_vs_full_ci95": bootstrap_ratio(ref["times"], got["times"], n),
            "fidelity_vs_full": sum(a == b for a, b in zip(got["ids"], ref["ids"])) / n,
            "trace_match": sum(got["match"]) / n,
            "acceptance_rate": totals["acceptance_rate"], "mean_accepted_len": totals["mean_accepted_len"],
            "mean_compression_ratio": totals["mean_compression_ratio"], "new_tokens": totals["new_tokens"],
            "escalations": totals["escalations"]}


def frontier(rows: list) -> list:
    """Names of the measured points no other point beats on speed-up and fidelity both."""
    out = []
    for a in rows:
        beaten = any(b is not a and b["speedup_vs_full"] >= a["speedup_vs_full"]
                     and b["fidelity_vs_full"] >= a["fidelity_vs_full"]
                     and (b["speedup_vs_full"], b["fidelity_vs_full"]) != (a["speedup_vs_full"], a["fidelity_vs_full"])
                     for b in rows)
        if not beaten:
            out.append(a["name"])
    return out


def choose(rows: list, floor: float) -> dict | None:
    """The fastest measured asym point with fidelity >= floor (None if none)."""
    ok = [r for r in rows if r["mode"] == "asym" and r["fidelity_vs_full"] >= floor]
    return max(ok, key=lambda r: r["speedup_vs_full"]) if ok else None


def run_tune(engine, steps: list, points: list, *, repeats: int = 2, group: int = 3,
             max_new_tokens: int = 64, max_minutes: float | None = None, progress: bool = True) -> dict:
    """Measure `points` on `steps` in groups with mode full; the tune JSON's measured part."""
    from tqdm.auto import tqdm

    start = time.monotonic()
    deadline = start + max_minutes * 60 if max_minutes else float("inf")
    full = Point("full", mode="full")
    groups = [points[i: i + group] for i in range(0, len(points), group)]
    calls = sum((len(g) + 1) * repeats * len(steps) for g in groups)
    bar = tqdm(total=calls, desc="tune", unit="call", disable=not progress)
    rows, skipped, per_call = [], [], None
    for g in groups:
        need = (len(g) + 1) * repeats * len(steps)
        if per_call is not None and time.monotonic() + per_call * need > deadline:
            skipped += [p.name for p in g]
            bar.total -= need
            continue
        t0, before = time.monotonic(), bar.n
        got = measure_group(engine, steps, [full] + g, repeats, max_new_tokens, bar=bar, deadline=deadline)
        if got is None:  # the budget ran out inside the group: its points are not reported
            skipped += [p.name for p in g]
            bar.total -= need - (bar.n - before)
            continue
        per_call = (time.monotonic() - t0) / need
        rows += [summarize(p, got[p.name], got["full"], len(steps)) for p in g]
        bar.set_postfix(measured=len(rows))
    bar.close()
    return {"points": rows, "not_measured": skipped, "wall_minutes": (time.monotonic() - start) / 60}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("traces", help="trace JSONL file or capture directory (asymagent/traces.py format)")
    p.add_argument("--json", metavar="PATH", required=True, help="results JSON; PATH.md and PATH.png next to it")
    p.add_argument("--write-config", metavar="FILE", default=None,
                   help="write the chosen point as a config file (JSON, or YAML by suffix)")
    p.add_argument("--min-fidelity", type=float, default=0.9, help="fidelity floor of the chosen point")
    p.add_argument("--max-minutes", type=float, default=None, help="time budget (groups that do not fit are skipped)")
    p.add_argument("--grid", default=None, help="knob values, e.g. 'k=2,4;acceptance=cda;head_tokens=64,128' "
                                                "(each changed alone from the default)")
    p.add_argument("--max-points", type=int, default=16, help="points measured at most (the default included)")
    p.add_argument("--slice", choices=("heldout", "all"), default="heldout",
                   help="heldout: the slice train-drafter --traces keeps out of training (default)")
    p.add_argument("--holdout", type=float, default=0.2, help="held-out share (as train-drafter --traces-holdout)")
    p.add_argument("--max-steps", type=int, default=None, help="measure at most this many steps")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--group", type=int, default=3, help="points measured together with one run of mode full")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--verifier", default="default", help="'default', a model source, or pair:NAME")
    p.add_argument("--pair", dest="verifier", type=lambda name: "pair:" + name, metavar="NAME",
                   help="a named verifier + drafter pair (as --verifier pair:NAME): 'qwen2.5-coder' "
                        "(`make setup-pair`; docs/pair.md)")
    p.add_argument("--drafter", default=None, help="drafter .safetensors (default: the shipped one)")
    p.add_argument("--quiet", action="store_true")


def check_args(args) -> None:
    """Refuse mistakes before any model loads (`asymagent` prints them on one line, exit 2)."""
    from asymagent.modeling.loading import check_drafter_source
    from asymagent.modeling.pairs import check_model_source
    from asymagent.traces import load_traces

    if not 0.0 <= args.min_fidelity <= 1.0:
        raise ValueError(f"--min-fidelity must be in [0, 1], got {args.min_fidelity}")
    for flag, value in (("--max-points", args.max_points), ("--repeats", args.repeats), ("--group", args.group),
                        ("--max-new-tokens", args.max_new_tokens), ("--max-steps", args.max_steps or 1)):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.max_minutes is not None and not args.max_minutes > 0:
        raise ValueError(f"--max-minutes must be > 0, got {args.max_minutes}")
    grid_points(parse_grid(args.grid) if args.grid else DEFAULT_GRID, args.max_points)
    load_traces(args.traces)
    tune_steps(args.traces, args.slice, args.holdout, args.max_steps)
    check_model_source(args.verifier)
    if args.drafter:
        check_drafter_source(args.drafter)


def main(args) -> int:
    from pathlib import Path

    from asymagent.config_file import write_config
    from asymagent.evals.running.engine_setup import build_engine
    from asymagent.evals.tuning.tune_report import write_report

    steps = tune_steps(args.traces, args.slice, args.holdout, args.max_steps)
    points = grid_points(parse_grid(args.grid) if args.grid else DEFAULT_GRID, args.max_points)
    setup = build_engine(args.verifier, args.drafter, max_sessions=args.group + 3)
    result = run_tune(setup.engine, steps, points, repeats=args.repeats, group=args.group,
                      max_new_tokens=args.max_new_tokens, max_minutes=args.max_minutes, progress=not args.quiet)
    rows = result["points"]
    chosen = choose(rows, args.min_fidelity)
    default = next((r for r in rows if r["name"] == "default"), None)
    doc = {"traces": args.traces, "slice": args.slice, "steps": len(steps), "min_fidelity": args.min_fidelity,
           "max_minutes": args.max_minutes, "repeats": args.repeats, "max_new_tokens": args.max_new_tokens,
           **setup.describe(), **result, "frontier": frontier(rows),
           "chosen": chosen["name"] if chosen else None, "default": default, "config": None}
    if chosen and args.write_config:
        point = next(p for p in points if p.name == chosen["name"])
        write_config(args.write_config, point.spec_config(), point.compression_config(), tuned={
            "traces": args.traces, "slice": args.slice, "steps": len(steps), "point": chosen["name"],
            "speedup_vs_full": chosen["speedup_vs_full"], "fidelity_vs_full": chosen["fidelity_vs_full"],
            "min_fidelity": args.min_fidelity, "verifier": setup.verifier, "drafter": setup.drafter})
        doc["config"] = args.write_config
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(doc, indent=2))
    md = write_report(doc, args.json)
    if not args.quiet:
        print(md.read_text())
    if chosen is None:
        print(f"asymagent tune: no measured point reached fidelity {args.min_fidelity}; no config written")
        return 1
    return 0
