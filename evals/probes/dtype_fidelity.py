"""bf16 / int8 against float32 on the suites: do the embedded default's answers change?

    python -m asymagent.evals.probes.dtype_fidelity [--dtypes float32,bfloat16,int8]
        [--suites records,fs_audit,tickets,injection] [--seeds 0,1] [--max-steps 8]
        [--modes full] [--json PATH]

Teacher-forced (evals/running/runner.py): every dtype's engine (the embedded verifier + shipped
drafter, loaded in that dtype) scores the same oracle histories. Per (dtype, mode): step accuracy,
and fidelity to float32 = the fraction of steps whose output (the parsed tool call, or the
answer text) equals float32's output at the same step and mode. float32 must be first in
--dtypes (it is the reference). The engines run one after the other in one process; the
wall-clock totals are reported but are not a speed measurement (see the bench for that).
"""

from __future__ import annotations

import argparse
import json
import time


def measure(dtypes: list, suites: list, seeds: list, modes: list, max_steps: int,
            max_new_tokens: int, progress: bool = True) -> dict:
    from asymagent.evals.running.engine_setup import build_engine
    from asymagent.evals.running.runner import teacher_forced

    if dtypes[0] != "float32":
        raise ValueError("--dtypes must start with float32 (the reference)")
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
    table = {}
    ref = outputs["float32"]
    for dtype in dtypes:
        for m in modes:
            rows, base = outputs[dtype][m], ref[m]
            same = [a[:3] == b[:3] and a[3] == b[3] for a, b in zip(rows, base)]
            table[f"{dtype}/{m}"] = {
                "dtype": dtype, "mode": m, "steps": len(rows),
                "step_accuracy": sum(r[4] for r in rows) / len(rows) if rows else None,
                "fidelity_vs_float32": sum(same) / len(same) if same else None,
                "differing_steps": [list(a[:3]) for a, s in zip(rows, same) if not s],
                "wall_s_total": walls[dtype],
            }
    return {"suites": suites, "seeds": seeds, "max_steps": max_steps,
            "max_new_tokens": max_new_tokens, "results": table}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="float32,bfloat16,int8")
    p.add_argument("--suites", default="records,fs_audit,tickets,injection")
    p.add_argument("--seeds", default="0,1", help="dev seeds")
    p.add_argument("--modes", default="full")
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    split = lambda s: [x for x in s.split(",") if x]  # noqa: E731
    doc = measure(split(args.dtypes), split(args.suites), [int(s) for s in split(args.seeds)],
                  split(args.modes), args.max_steps, args.max_new_tokens, progress=not args.quiet)
    for key, row in doc["results"].items():
        print(f"{key:24s} steps {row['steps']:3d}  step_accuracy {row['step_accuracy']:.3f}  "
              f"fidelity_vs_float32 {row['fidelity_vs_float32']:.3f}  wall {row['wall_s_total']:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
