"""Reports: markdown tables and matplotlib PNGs for eval and bench JSON, and docs/results.md.

    python -m asymagent.evals.bench.report --bench runs/bench.json --eval runs/eval_records.json \
        --out docs/results.md        # PNGs go to docs/results/; the notes block is kept

Eval plots: cumulative latency over scored steps per mode, acceptance by draft position, step
accuracy vs compression ratio. Bench plots: cumulative latency over the workload's steps per
mode and peer, and acceptance by position.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def slug(suite: str) -> str:
    """A file-name-safe name for a suite (a traces path becomes its stem)."""
    name = Path(suite).stem if suite.endswith(".jsonl") else suite
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


def _fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def eval_markdown(result: dict, fig_prefix: str = "") -> str:
    modes = result["modes"]
    full_flops = (modes.get("full") or {}).get("verifier_flops") or 0
    injection = any("attack_success_rate" in d for d in modes.values())
    free = any(d.get("task_success") is not None for d in modes.values())  # free-running episodes
    trace_ids = result.get("trace_ids")  # evals on user traces: ids, no seeds
    where = (f"{len(trace_ids)} trace steps" if trace_ids is not None
             else f"{result['split']} seeds {result['seeds']}")
    lines = [f"### Eval `{result['suite']}` ({where})", "",
             f"verifier: {result['verifier']}  ", f"drafter: {result['drafter']}", ""]
    head = ["mode"] + (["task success"] if free else []) + [
        "step acc", "fidelity vs full", "teacher-forced s", "s/step",
        "ver. prefill tok", "FLOPs vs full", "accept", "tok/fwd", "compression"]
    if injection:
        head.append("attack success")
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, d in modes.items():
        row = [f"`{label}`"] + ([_fmt(d["task_success"])] if free else []) + [
               _fmt(d["step_accuracy"]), _fmt(d["fidelity_vs_full"]),
               _fmt(d["wall_s"]), _fmt(d["wall_s"] / d["steps"] if d["steps"] else None),
               str(d["verifier_prefill_tokens"]),
               _fmt(d["verifier_flops"] / full_flops if full_flops else None),
               _fmt(d["acceptance_rate"]) if d.get("drafted") else "-",
               _fmt(d["mean_accepted_len"]) if d.get("drafted") else "-",
               _fmt(d["mean_compression_ratio"])]
        if injection:
            row.append(_fmt(d.get("attack_success_rate")))
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if trace_ids is not None:  # which trace steps each mode got right, by the traces' own ids
        lines += ["| trace id | " + " | ".join(f"`{m}`" for m in modes) + " |",
                  "|" + "---|" * (len(modes) + 1)]
        for i, trace_id in enumerate(trace_ids):
            lines.append(f"| {trace_id} | " + " | ".join(
                "yes" if d["per_step_correct"][i] else "no" for d in modes.values()) + " |")
        lines.append("")
    for name in ("cumulative_latency", "acceptance_by_position", "accuracy_vs_compression"):
        lines.append(f"![{name}]({fig_prefix}{slug(result['suite'])}_{name}.png)")
    return "\n".join(lines) + "\n"


def eval_plots(result: dict, out_dir: str | Path) -> list:
    plt = _plt()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    suite, modes, paths = slug(result["suite"]), result["modes"], []

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, d in modes.items():
        ax.plot(range(1, len(d["cumulative_latency_s"]) + 1), d["cumulative_latency_s"], label=label)
    ax.set(xlabel="teacher-forced step", ylabel="cumulative latency (s)", title=f"{suite}: latency")
    ax.legend()
    paths.append(_save(fig, out_dir / f"{suite}_cumulative_latency.png", plt))

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, d in modes.items():
        if d["acceptance_by_position"]:
            ax.plot(range(1, len(d["acceptance_by_position"]) + 1), d["acceptance_by_position"], "o-", label=label)
    ax.set(xlabel="draft position", ylabel="acceptance", ylim=(0, 1.05), title=f"{suite}: acceptance by position")
    if ax.lines:
        ax.legend()
    paths.append(_save(fig, out_dir / f"{suite}_acceptance_by_position.png", plt))

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, d in modes.items():  # per-step accuracy binned by the step's compression ratio
        xs, ys = d.get("per_step_compression_ratio") or [], d.get("per_step_correct") or []
        bins: dict = {}
        for x, y in zip(xs, ys):
            bins.setdefault(min(int(x * 5), 4), []).append(float(y))  # 5 bins of width 0.2
        if bins:
            keys = sorted(bins)
            ax.plot([(k + 0.5) / 5 for k in keys], [sum(bins[k]) / len(bins[k]) for k in keys], "o-",
                    label=f"{label} (mean {_fmt(d['step_accuracy'])})")
    ax.set(xlabel="verifier tokens / full tokens (step, binned by 0.2)", ylabel="step accuracy",
           xlim=(0, 1.05), ylim=(-0.05, 1.05), title=f"{suite}: step accuracy vs compression")
    ax.legend()
    paths.append(_save(fig, out_dir / f"{suite}_accuracy_vs_compression.png", plt))
    return paths


def bench_markdown(result: dict, fig_prefix: str = "") -> str:
    w = result["workload"]
    lines = [f"### Bench `{w['name']}`: {w['steps']} teacher-forced steps, prompts "
             f"{min(w['prompt_tokens'])}-{max(w['prompt_tokens'])} tokens, median of {result['settings']['repeats']}",
             "", f"verifier: {result['verifier']}  ", f"drafter: {result['drafter']}", "",
             "| mode | wall s (min-max) | speedup vs full [95% CI] | s/step | output tok | verifier prefill tok "
             "| FLOPs vs full | fidelity vs full | acceptance | tok/verifier fwd | draft source (steps) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m, d in result["modes"].items():
        spread, ci = d.get("wall_s_spread"), d.get("speedup_vs_full_ci95")
        wall = f"{d['wall_s']:.2f}" + (f" ({spread['min']:.1f}-{spread['max']:.1f})" if spread else "")
        speed = f"{d['speedup_vs_full']:.2f}x" + (f" [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else "")
        sources = ", ".join(f"{k} {v}" for k, v in sorted((d.get("draft_source") or {}).items())) or "-"
        lines.append(
            f"| `{m}` | {wall} | {speed} | {d['wall_s'] / len(d['per_step_s']):.2f} "
            f"| {d['output_tokens']} | {d['verifier_prefill_tokens']} | {d['flops_vs_full']:.2f} "
            f"| {d['fidelity_vs_full']:.2f} | {_fmt(d.get('acceptance_rate'))} | {_fmt(d.get('mean_accepted_len'))} "
            f"| {sources} |")
    for pair, d in result.get("pairs", {}).items():
        lines.append(f"\n`{pair}`: {d['speedup']:.2f}x (95% CI {d['ci95'][0]:.2f}-{d['ci95'][1]:.2f})")
    lines += ["", f"![bench latency]({fig_prefix}bench_cumulative_latency.png)",
              f"![bench acceptance]({fig_prefix}bench_acceptance_by_position.png)"]
    return "\n".join(lines) + "\n"


def bench_plots(result: dict, out_dir: str | Path) -> list:
    plt = _plt()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    for m, d in result["modes"].items():
        cum, t = [], 0.0
        for x in d["per_step_s"]:
            t += x
            cum.append(t)
        ax.plot(range(1, len(cum) + 1), cum, label=m, linestyle="--" if m.startswith("hf_") else "-")
    ax.set(xlabel="step", ylabel="cumulative latency (s)", title="bench: cumulative latency (median)")
    ax.legend(fontsize=8)
    paths = [_save(fig, out_dir / "bench_cumulative_latency.png", plt)]
    fig, ax = plt.subplots(figsize=(6, 4))
    for m, d in result["modes"].items():
        acc = d.get("acceptance_by_position") or []
        if acc:
            ax.plot(range(1, len(acc) + 1), acc, "o-", label=m)
    ax.set(xlabel="draft position", ylabel="acceptance", ylim=(0, 1.05), title="bench: acceptance by position")
    if ax.lines:
        ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir / "bench_acceptance_by_position.png", plt))
    return paths


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_eval_report(result: dict, out_dir: str | Path) -> Path:
    """report.md + PNGs in out_dir; returns the markdown path."""
    out_dir = Path(out_dir)
    eval_plots(result, out_dir)
    md = out_dir / "report.md"
    md.write_text(f"# asymagent eval report\n\n{eval_markdown(result)}")
    return md


NOTES_START, NOTES_END = "<!-- notes:start -->", "<!-- notes:end -->"


def kept_notes(path: Path) -> str:
    """The hand-written block between the notes markers of an existing results file ('' if none)."""
    if not path.is_file():
        return ""
    text = path.read_text()
    i, j = text.find(NOTES_START), text.find(NOTES_END)
    return text[i + len(NOTES_START):j].strip() if 0 <= i < j else ""


def write_results(bench: dict | None, evals: list, out: str | Path, notes: str = "") -> Path:
    """docs/results.md: bench table + eval tables, PNGs in a folder named after the markdown file.

    The hand-written analysis lives between the notes markers and survives regeneration
    (`notes` replaces it when given)."""
    out = Path(out)
    fig_dir = out.with_suffix("")
    notes = notes or kept_notes(out)
    parts = ["# Results", "", "Regenerate with `make results` (see docs/evals.md). Tables and plots come "
             "from the JSON of that run; only the notes block is written by hand.", "",
             NOTES_START, notes, NOTES_END, ""]
    if bench is not None:
        bench_plots(bench, fig_dir)
        parts += ["## Side-by-side bench", "", bench_markdown(bench, f"{fig_dir.name}/")]
    for ev in evals:
        eval_plots(ev, fig_dir)
        parts += [f"## Eval: {ev['suite']}", "", eval_markdown(ev, f"{fig_dir.name}/")]
    out.write_text("\n".join(parts))
    return out


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(description="Render docs/results.md from bench/eval JSON files.")
    p.add_argument("--bench", help="bench JSON")
    p.add_argument("--eval", action="append", default=[], help="eval JSON (repeatable)")
    p.add_argument("--notes", help="markdown file to use as the notes block (default: keep the existing one)")
    p.add_argument("--out", default="docs/results.md")
    a = p.parse_args(argv)
    bench = json.loads(Path(a.bench).read_text()) if a.bench else None
    evals = [json.loads(Path(x).read_text()) for x in a.eval]
    notes = Path(a.notes).read_text() if a.notes else ""
    print(write_results(bench, evals, a.out, notes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
