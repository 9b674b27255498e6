"""The AgentDojo run's report: markdown tables (pooled and per suite) and a utility-vs-speed plot per mode."""

from __future__ import annotations

from pathlib import Path


def _p(d: dict | None) -> str:
    if not d or not d.get("n"):
        return "-"
    ci = d.get("ci") or [0, 0]
    return f"{d['rate']:.2f} ({d['k']}/{d['n']}; {ci[0]:.2f}-{ci[1]:.2f})"


def _f(x, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def table(modes: dict, title: str) -> str:
    """One markdown table: a row per mode."""
    attacks = sorted({a for d in modes.values() for a in d["attacks"]})
    head = ["mode", "utility (no attack)"] + [f"{a}: utility / targeted ASR" for a in attacks] + [
        "step fidelity", "token fidelity", "speed vs full", "s / step", "acceptance", "accepted len",
        "verifier share", "outcomes"]
    lines = [f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, d in modes.items():
        fid = d.get("fidelity") or {}
        steps = d["free_steps"]
        outcomes = ", ".join(f"{k} {v}" for k, v in d["outcomes"].items() if v)
        row = [label, _p(d["utility"])]
        row += [f"{_p(d['attacks'][a]['utility_under_attack'])} / {_p(d['attacks'][a]['targeted_asr'])}"
                if a in d["attacks"] else "-" for a in attacks]
        row += [_p(fid.get("step_fidelity")), _p(fid.get("token_fidelity")),
                _f(fid.get("speed_vs_full"), "{:.2f}x"), _f(steps["mean_call_s"]), _f(steps["acceptance_rate"]),
                _f(steps["mean_accepted_len"]), _f(steps["verifier_share"]), outcomes]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def task_table(result: dict) -> str:
    """One row per episode: each mode's utility, attack success (attacked episodes) and outcome."""
    labels = list(result["modes"])
    lines = ["**per episode** (utility / attacked / outcome)", "", "| episode | " + " | ".join(labels) + " |",
             "|" + "---|" * (len(labels) + 1)]

    def cell(v: dict) -> str:
        u = "-" if v["utility"] is None else ("U" if v["utility"] else "u")
        a = "" if v["security"] is None else (" A" if v["security"] else " a")
        return f"{u}{a} {v['outcome']}"

    for key, modes in result["per_task"].items():
        lines.append(f"| {key} | " + " | ".join(cell(modes[label]) if label in modes else "-" for label in labels)
                     + " |")
    lines.append("\nU/u: user task done / not; A/a: attacker's goal reached / not.")
    return "\n".join(lines)


def markdown(result: dict) -> str:
    parts = [f"AgentDojo {result['agentdojo']} ({result['settings']['benchmark_version']}), "
             f"{len(result['episodes'])} episodes; verifier {result['verifier']}, drafter {result['drafter']}",
             table(result["modes"], "all suites")]
    if len(result["suites"]) > 1:
        parts += [table(modes, suite) for suite, modes in result["suites"].items()]
    return "\n\n".join(parts + [task_table(result)])


def plot(result: dict, path) -> None:
    """Utility (no attack) against speed vs full along full's trajectory, one point per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.4))
    for label, d in result["modes"].items():
        util = d["utility"]
        if util["rate"] is None:
            continue
        speed = 1.0 if label == "full" else (d.get("fidelity") or {}).get("speed_vs_full")
        if speed is None:
            continue
        lo, hi = util["ci"]
        ax.errorbar(speed, util["rate"], yerr=[[util["rate"] - lo], [hi - util["rate"]]], fmt="o", capsize=3,
                    label=f"{label} ({util['k']}/{util['n']})")
    ax.set_xlabel("speed vs full (same steps of full's trajectory)")
    ax.set_ylabel("AgentDojo utility, no attack (95% Wilson)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("AgentDojo: utility vs speed per mode")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(result: dict, folder) -> str:
    """report.md + utility_speed.png in `folder`; returns the report's path."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    plot(result, out / "utility_speed.png")
    (out / "report.md").write_text(markdown(result) + "\n\n![utility vs speed](utility_speed.png)\n")
    return str(out / "report.md")
