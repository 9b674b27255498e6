"""What a reduced view's lost steps are made of: the value full wrote was removed from the view, or it was visible and the verifier chose otherwise.

    python -m asymagent.evals.probes.gap_sources --frontier runs/t_records.json[,runs/t_tickets.json,...] \
        [--policy asym] [--json PATH]

Reads frontier runs (evals/running/frontier.py, with policies `full` and `--policy`, records kept),
rebuilds each step's two views with the policy's CompressionConfig and, at every step whose
output differs from full's, takes the *word* full wrote where the outputs part (the run of
letters, digits and `_-./@:` around the first differing character: an id, a path, a tool name, a
number; a path by its last part) and asks where it stands:

- `removed`: in the full view, not in the policy's view: the verifier could not copy it (what a
  keep or recall policy can give back);
- `visible`: in both views: the verifier saw it and decided otherwise (a decision at a near tie;
  no view short of the full one is known to fix those);
- `unseen`: in neither view (a value the model composes, e.g. a count or a date it computes);
- `short`: under 3 characters (a page number, a digit): too common to say where it comes from.

A policy whose lost steps are mostly `visible` is at the limit of what keeping text can buy.
"""

from __future__ import annotations

import json
import re

from asymagent.evals.probes.harness import command, finish, parser

_WORD_CHAR = re.compile(r"[A-Za-z0-9_\-./@:]")


def parted_word(full_text: str, other_text: str) -> str:
    """The word of `full_text` around the first character where it and `other_text` differ."""
    i = next((k for k, (a, b) in enumerate(zip(full_text, other_text)) if a != b),
             min(len(full_text), len(other_text)))
    lo = i
    while lo > 0 and _WORD_CHAR.match(full_text[lo - 1]):
        lo -= 1
    hi = i
    while hi < len(full_text) and _WORD_CHAR.match(full_text[hi]):
        hi += 1
    return full_text[lo:hi].strip("-./@:_")


def classify(word: str, full_view: str, reduced_view: str) -> str:
    """removed | visible | unseen | short (module docstring). A path is judged by its last part
    (the name a listing shows; the model joins it to a directory it was given)."""
    word = word.rsplit("/", 1)[-1]
    if len(word) < 3:
        return "short"
    if word in reduced_view:
        return "visible"
    return "removed" if word in full_view else "unseen"


def probe(runs: list, policy: str) -> dict:
    from asymagent.context.compressors import CompressionConfig
    from asymagent.context.views import ContextViews
    from asymagent.engine import Engine
    from asymagent.evals.running.frontier import conversations

    engine = Engine.from_default()
    decode = engine.tokenizer.decode
    per_workload: dict = {}
    rows = []
    for run in runs:
        settings = run["settings"]
        comp = CompressionConfig.from_any(settings["policies"][policy]["compression"])
        by: dict = {}
        for r in run["records"]:
            by.setdefault((r["workload"], r["seed"], r["step"]), {})[r["policy"]] = r
        for workload in dict.fromkeys(r["workload"] for r in run["records"]):
            convs = conversations(workload, settings["split"], settings["episodes"], settings["max_steps"],
                                  settings["bench_steps"], settings.get("exposed_only", False))
            for conv in convs:
                views = ContextViews(engine.tokenizer, comp, engine.chat_format)
                for n, step in enumerate(conv.steps):
                    pair = views.build(step.history, step.tools)  # every step: append-stable views
                    got = by.get((workload, conv.seed, n), {})
                    if policy not in got or "full" not in got:
                        continue
                    full, other = got["full"], got[policy]
                    counts = per_workload.setdefault(workload, {"steps": 0, "differ": 0, "removed": 0,
                                                                "visible": 0, "unseen": 0, "short": 0})
                    counts["steps"] += 1
                    if full["token_ids"] == other["token_ids"]:
                        continue
                    counts["differ"] += 1
                    word = parted_word(decode(full["token_ids"]), decode(other["token_ids"]))
                    kind = classify(word, decode(pair.full_ids), decode(views.compressed_ids()))
                    counts[kind] += 1
                    rows.append({"workload": workload, "seed": conv.seed, "step": n, "word": word,
                                 "kind": kind, "full_right": full["correct"], "right": other["correct"]})
    total = {k: sum(c[k] for c in per_workload.values())
             for k in ("steps", "differ", "removed", "visible", "unseen", "short")}
    return {"policy": policy, "workloads": per_workload, "total": total, "steps": rows}


def main(argv=None) -> int:
    p = parser(__doc__, "gap_sources")
    p.add_argument("--frontier", required=True, help="frontier JSON files (records kept), comma-separated")
    p.add_argument("--policy", default="asym")
    args = p.parse_args(argv)
    runs = [json.load(open(path)) for path in args.frontier.split(",") if path.strip()]
    result = probe(runs, args.policy)
    result["command"] = command("gap_sources", argv)
    for w, c in list(result["workloads"].items()) + [("total", result["total"])]:
        print(f"{w:16s} steps {c['steps']:3d}  differ {c['differ']:3d}: removed {c['removed']:3d}  "
              f"visible {c['visible']:3d}  unseen {c['unseen']:3d}  short {c['short']:3d}")
    return finish(result, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
