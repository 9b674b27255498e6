"""The report of `asymagent tune`: the speed-fidelity frontier as a markdown table and a PNG (every point measured)."""

from __future__ import annotations

from pathlib import Path


def tune_markdown(doc: dict, png_name: str | None = None) -> str:
    """Markdown: settings, one row per measured point (frontier and chosen marked), what was not measured."""
    rows = sorted(doc["points"], key=lambda r: -r["speedup_vs_full"])
    front = set(doc["frontier"])
    lines = [f"# asymagent tune: {doc['traces']}", "",
             f"{doc['steps']} steps ({doc['slice']} slice), {doc['repeats']} repeats, max {doc['max_new_tokens']} new "
             f"tokens, fidelity floor {doc['min_fidelity']}; verifier {doc.get('verifier')}, drafter {doc.get('drafter')}; "
             f"{doc['wall_minutes']:.1f} min.", "",
             "| point | speed-up vs full | 95% CI | fidelity vs full | trace match | acceptance | tokens/forward "
             "| compression | frontier | chosen |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lo, hi = r["speedup_vs_full_ci95"]
        lines.append(f"| `{r['name']}` | {r['speedup_vs_full']:.2f}x | {lo:.2f}-{hi:.2f} | {r['fidelity_vs_full']:.2f} "
                     f"| {r['trace_match']:.2f} | {_f(r['acceptance_rate'])} | {_f(r['mean_accepted_len'])} "
                     f"| {_f(r['mean_compression_ratio'])} | {'yes' if r['name'] in front else ''} "
                     f"| {'**chosen**' if r['name'] == doc['chosen'] else ''} |")
    lines.append("")
    if doc["not_measured"]:
        lines.append(f"Not measured (time budget): {', '.join(f'`{n}`' for n in doc['not_measured'])}.")
    else:
        lines.append("Every point of the grid was measured.")
    if doc["chosen"] is None:
        lines.append(f"No measured point reached fidelity {doc['min_fidelity']}; no config written.")
    elif doc.get("config"):
        lines.append(f"Chosen: `{doc['chosen']}`, written to `{doc['config']}`.")
    if png_name:
        lines += ["", f"![frontier]({png_name})"]
    return "\n".join(lines) + "\n"


def _f(x) -> str:
    return "-" if x is None else f"{x:.2f}"


def tune_plot(doc: dict, path: str | Path) -> Path:
    """Speed-up vs full (x) against fidelity vs full (y): every measured point, the frontier, the floor."""
    from asymagent.evals.bench.report import _plt, _save

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    rows = doc["points"]
    front = sorted((r for r in rows if r["name"] in doc["frontier"]), key=lambda r: r["speedup_vs_full"])
    for r in rows:
        lo, hi = r["speedup_vs_full_ci95"]
        x = r["speedup_vs_full"]
        ax.errorbar([x], [r["fidelity_vs_full"]], xerr=[[x - lo], [hi - x]], fmt="o", ms=5, color="tab:blue",
                    alpha=0.7, capsize=2)
        ax.annotate(r["name"], (x, r["fidelity_vs_full"]), fontsize=7, xytext=(4, 3), textcoords="offset points")
    if front:
        ax.plot([r["speedup_vs_full"] for r in front], [r["fidelity_vs_full"] for r in front], "-", color="tab:orange",
                label="frontier (measured points only)")
    chosen = next((r for r in rows if r["name"] == doc["chosen"]), None)
    if chosen:
        ax.plot([chosen["speedup_vs_full"]], [chosen["fidelity_vs_full"]], "*", ms=16, color="tab:red", label="chosen")
    ax.axhline(doc["min_fidelity"], ls="--", color="gray", lw=1, label=f"floor {doc['min_fidelity']}")
    ax.axvline(1.0, ls=":", color="gray", lw=1)
    ax.set_xlabel("speed-up vs full (median over repeats; bars: 95% CI)")
    ax.set_ylabel("fidelity vs full (share of steps identical)")
    ax.set_title(f"tune: {doc['steps']} steps of {Path(str(doc['traces'])).name}")
    ax.legend(fontsize=8, loc="lower left")
    return _save(fig, Path(path), plt)


def write_report(doc: dict, json_path: str | Path) -> Path:
    """JSON_PATH with .md and .png: the table and the plot; returns the markdown path."""
    base = Path(json_path)
    png = tune_plot(doc, base.with_suffix(".png")) if doc["points"] else None
    md = base.with_suffix(".md")
    md.write_text(tune_markdown(doc, png.name if png else None))
    return md
