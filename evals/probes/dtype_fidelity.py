"""bf16 / int8 against float32 on the suites: do the embedded default's answers change?

    python -m asymagent.evals.probes.dtype_fidelity [--dtypes float32,bfloat16,int8]
        [--suites records,fs_audit,tickets,injection] [--seeds 0,1] [--max-steps 8]
        [--modes full] [--json PATH]
    # the same in parallel, one process per dtype, then compared:
    python -m asymagent.evals.probes.dtype_fidelity --dtypes bfloat16 --raw bf16.json  (etc.)
    python -m asymagent.evals.probes.dtype_fidelity --combine fp32.json bf16.json int8.json --json out.json

Teacher-forced (evals/running/runner.py): every dtype's engine (the embedded verifier + shipped
drafter, loaded in that dtype) scores the same oracle histories. Per (dtype, mode): step accuracy,
and fidelity to float32 = the fraction of steps whose output (the parsed tool call, or the
answer text) equals float32's output at the same step and mode (float32 is the reference).
The engines run one after the other in one process; the
wall-clock totals are reported but are not a speed measurement (see the bench for that).
"""

from __future__ import annotations

import json
import time

from asymagent.evals.probes.harness import finish, parser, write


def run_outputs(dtypes: list, suites: list, seeds: list, modes: list, max_steps: int,
                max_new_tokens: int, progress: bool = True) -> dict:
    """{"outputs": {dtype: {mode: [[suite, seed, step, output, correct]]}}, "walls": {dtype: s}}."""
    from asymagent.evals.running.engine_setup import build_engine
    from asymagent.evals.running.runner import teacher_forced

    outputs: dict = {}  # dtype -> mode -> [(suite, seed, step, output, correct)]
    walls: dict = {}
    for dtype in dtypes:
        engine = build_engine("default", dtype=dtype, allow_fallback=False).engine
        t0 = time.perf_counter()
        outputs[dtype] = {m: [] for m in modes}
        for suite in suites:
            res = teacher_forced(engine, suite, seeds, modes, max_new_tokens=max_new_tokens,
                                 max_steps=max_steps, progress=progress)
            for m in modes:
                outputs[dtype][m] += [(suite, s.seed, s.step, s.output, s.correct)
                                      for s in res[m].steps]
        walls[dtype] = time.perf_counter() - t0
        del engine
    return {"outputs": outputs, "walls": walls}


def compare(raw: dict, dtypes: list, modes: list) -> dict:
    """The fidelity table from `run_outputs`' documents (merged): float32 is the reference."""
    outputs, walls = raw["outputs"], raw["walls"]
    if "float32" not in outputs:
        raise ValueError("float32's outputs are the reference; run it too")
    table = {}
    ref = outputs["float32"]
    for dtype in dtypes:
        for m in modes:
            rows, base = outputs[dtype][m], ref[m]
            same = [list(a[:3]) == list(b[:3]) and a[3] == b[3] for a, b in zip(rows, base)]
            table[f"{dtype}/{m}"] = {
                "dtype": dtype, "mode": m, "steps": len(rows),
                "step_accuracy": sum(r[4] for r in rows) / len(rows) if rows else None,
                "fidelity_vs_float32": sum(same) / len(same) if same else None,
                "differing_steps": [list(a[:3]) for a, s in zip(rows, same) if not s],
                "wall_s_total": walls[dtype],
            }
    return table


def main(argv=None) -> int:
    p = parser(__doc__, "dtype_fidelity")
    p.add_argument("--dtypes", default="float32,bfloat16,int8")
    p.add_argument("--suites", default="records,fs_audit,tickets,injection")
    p.add_argument("--seeds", default="0,1", help="dev seeds")
    p.add_argument("--modes", default="full")
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--raw", metavar="PATH", help="write the raw outputs here (to --combine later)")
    p.add_argument("--combine", metavar="RAW", nargs="+",
                   help="no run: merge raw files of separate runs (one per dtype, in parallel) "
                        "and compare them")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    settings = {"suites": split(args.suites), "seeds": [int(s) for s in split(args.seeds)],
                "max_steps": args.max_steps, "max_new_tokens": args.max_new_tokens}
    if args.combine:
        raw = {"outputs": {}, "walls": {}}
        for path in args.combine:
            with open(path) as f:
                part = json.load(f)
            raw["outputs"].update(part["outputs"])
            raw["walls"].update(part["walls"])
            settings = part.get("settings", settings)
    else:
        raw = run_outputs(split(args.dtypes), settings["suites"], settings["seeds"], split(args.modes),
                          args.max_steps, args.max_new_tokens, progress=not args.quiet)
        raw["settings"] = settings
        write(raw, args.raw)
    dtypes = ["float32"] + [d for d in raw["outputs"] if d != "float32"]
    if "float32" not in raw["outputs"]:
        return 0  # a partial run (see --combine)
    doc = {**settings, "results": compare(raw, dtypes, split(args.modes))}
    for key, row in doc["results"].items():
        print(f"{key:24s} steps {row['steps']:3d}  step_accuracy {row['step_accuracy']:.3f}  "
              f"fidelity_vs_float32 {row['fidelity_vs_float32']:.3f}  wall {row['wall_s_total']:.0f} s")
    return finish(doc, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
