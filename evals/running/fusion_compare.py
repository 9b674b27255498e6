"""Recovered share of a new verifier view against the old one, from two `eval fusion` runs.

    python -m asymagent.evals.running.fusion_compare runs/fu_old.json runs/fu_new.json \
        --json docs/results/context_fusion.json

Both runs teacher-force along mode full's greedy output, so their positions pair one to one
(same suite, seed, step and index). Per suite and overall, with the first variant of each run:
share_old = 1 - sum KL(v_f||fused, old view) / sum KL(v_f||v_c, old view) (what fusion gives back
on the old view) and share_new = 1 - sum KL(v_f||fused, new view) / sum KL(v_f||v_c, old view)
(what the new view plus fusion gives back of the gap the old view left), top-1 agreement with v_f,
and a 95% bootstrap interval of the shares over conversations (suite, seed). `--new-variant N`
compares the new run's N-th variant instead of its first (e.g. another copy-delta rule).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time


def pair_positions(old: list, new: list) -> list:
    """[(old, new)] position dicts of the conversations steps both runs measured, in order."""
    def steps(positions):
        out: dict = {}
        for p in positions:
            out.setdefault((p["suite"], p["seed"], p["step"]), []).append(p)
        return out

    a, b = steps(old), steps(new)
    pairs = []
    for key in a:
        if key in b and len(a[key]) == len(b[key]):
            pairs += list(zip(a[key], b[key]))
    return pairs


def figures(pairs: list, variant: int = 0) -> dict:
    """Shares and KLs of `pairs`; the new run's fused rows are its `variant`-th variant's."""
    n = len(pairs)
    kl_c_old = sum(o["kl_c"] for o, _ in pairs)
    kl_f_old = sum(o["kl_f"][0] for o, _ in pairs)
    kl_c_new = sum(w["kl_c"] for _, w in pairs)
    kl_f_new = sum(w["kl_f"][variant] for _, w in pairs)
    return {
        "positions": n,
        "kl_c_old": kl_c_old / n if n else None, "kl_fused_old": kl_f_old / n if n else None,
        "kl_c_new": kl_c_new / n if n else None, "kl_fused_new": kl_f_new / n if n else None,
        "share_old_default": 1 - kl_f_old / kl_c_old if kl_c_old else None,
        "share_new_default": 1 - kl_f_new / kl_c_old if kl_c_old else None,
        "top1_c_old": sum(o["top1_c"] for o, _ in pairs) / n if n else None,
        "top1_fused_new": sum(w["top1_f"][variant] for _, w in pairs) / n if n else None,
        "conversations": len({(o["suite"], o["seed"]) for o, _ in pairs}),
    }


def bootstrap(pairs: list, key: str, resamples: int = 1000, seed: int = 0, variant: int = 0) -> list | None:
    """95% percentile interval of figures()[key] over conversations resampled with replacement."""
    convs: dict = {}
    for o, w in pairs:
        convs.setdefault((o["suite"], o["seed"]), []).append((o, w))
    groups = list(convs.values())
    if len(groups) < 2:
        return None
    rng = random.Random(seed)
    vals = []
    for _ in range(resamples):
        draw = [p for _ in groups for p in groups[rng.randrange(len(groups))]]
        v = figures(draw, variant)[key]
        if v is not None:
            vals.append(v)
    if not vals:
        return None
    vals.sort()
    return [round(vals[int(0.025 * (len(vals) - 1))], 4), round(vals[int(0.975 * (len(vals) - 1))], 4)]


def compare(old_doc: dict, new_doc: dict, variant: int = 0) -> dict:
    pairs = pair_positions(old_doc["positions"], new_doc["positions"])
    suites = list(dict.fromkeys(o["suite"] for o, _ in pairs))
    out = {"suites": {}, "overall": {}}
    for s in suites:
        sp = [(o, w) for o, w in pairs if o["suite"] == s]
        out["suites"][s] = {**figures(sp, variant), "share_new_ci": bootstrap(sp, "share_new_default", variant=variant)}
    out["overall"] = {**figures(pairs, variant), "share_old_ci": bootstrap(pairs, "share_old_default"),
                      "share_new_ci": bootstrap(pairs, "share_new_default", variant=variant)}
    trained = [(o, w) for o, w in pairs if not o["suite"].startswith("domain:")]
    if len(trained) != len(pairs):  # the four suites alone (the figure), the unseen domain apart
        out["suites_only"] = {**figures(trained, variant),
                              "share_new_ci": bootstrap(trained, "share_new_default", variant=variant)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m asymagent.evals.running.fusion_compare",
                                description=__doc__.splitlines()[0])
    p.add_argument("old", help="eval fusion JSON on the old view")
    p.add_argument("new", help="eval fusion JSON on the new view")
    p.add_argument("--new-variant", type=int, default=0, metavar="N",
                   help="which variant of the new run to compare (its N-th, from 0)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    old, new = (json.load(open(f)) for f in (args.old, args.new))
    res = {"command": " ".join(["python -m asymagent.evals.running.fusion_compare"] + (argv or sys.argv[1:])),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "sources": [old.get("settings", {}).get("command"), new.get("settings", {}).get("command")],
           "variant": [old.get("settings", {}).get("variants", [None])[0],
                       (new.get("settings", {}).get("variants") or [None] * (args.new_variant + 1))[args.new_variant]],
           "note": "share = 1 - KL(v_f||fused) / KL(v_f||v_c of the OLD view), same positions (teacher-forced "
                   "along full's greedy output); intervals: 95% bootstrap over conversations",
           **compare(old, new, args.new_variant)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    rows = [("overall", res["overall"])] + ([("4 suites", res["suites_only"])] if "suites_only" in res else []) \
        + list(res["suites"].items())
    print("| suite | positions | KL old c | KL old fused | KL new c | KL new fused | share old | share new [95%] |")
    print("|---|---|---|---|---|---|---|---|")
    for name, d in rows:
        ci = d.get("share_new_ci")
        print(f"| {name} | {d['positions']} | {d['kl_c_old']:.3f} | {d['kl_fused_old']:.3f} | {d['kl_c_new']:.3f} | "
              f"{d['kl_fused_new']:.3f} | {d['share_old_default']:.2f} | {d['share_new_default']:.2f}"
              + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else "") + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
