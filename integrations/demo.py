"""`asymagent demo`: an agent does a multi-step tool task on its own, in mode asym and in mode full, side by side.

The default run (integrations/demo_free.py): one free-running episode of an evals environment
per mode, the model's own tool calls executed against the environment and their outputs fed
back, until it calls final_answer (every turn is one call the model picks, held to the tools'
schemas; beside the environment's tools it has a calculator, `calculate(expression)`, that the
loop answers); the environment's oracle only grades the end. Per step it prints the
action, the full history's tokens against what the verifier read, and the latency; then the two
episodes side by side, the totals, both final answers and whether each is right, and asym's
speed over full's. `--pair qwen2.5-coder` runs the reference pair (`make demo` sets it up) on
the episode it was picked for (PAIR_EPISODE); where this machine lacks the memory for the pair
(asymagent/modeling/pair_memory.py) it says so and runs the embedded default, whose 135M
verifier does not finish such a task on its own.

`--teacher-forced` (`make demo-small`) is the embedded default's demo: an evals environment
(default: `records`, 13 tool calls, context growing past 5k tokens with ~480-token tool outputs)
driven step by step through `Engine.chat` in the chosen mode. Tool steps are decoded under the
schema constraint (the environment's oracle says whether the step acts, like an agent policy
would). A 135M model does not drive 13 steps right on its own, so the run is teacher-forced:
every step the model's own action is decoded and scored against the oracle's, then the oracle's
action is executed and appended (the demo says so). The history therefore is the same for every
mode, and `--compare full` replays exactly those steps in mode `full` (verifier alone on the
full context), interleaved step by step so both modes see the same machine load: speedup and
agreement come from the same prompts. Shows a live table while running, then the per-step table
and run totals.
"""

from __future__ import annotations

import argparse
import json
import time

NOTE = ("Teacher-forced run: at every step the model's own action is decoded (tool steps under "
        "the schema constraint) and scored against the environment's oracle; the oracle's action "
        "is then executed, so the 135M model cannot derail the episode and every mode sees the "
        "same history.")


# The episode the reference pair runs by default: (suite, seed), a dev seed. 2026-12-07
# (docs/log.md "The demo's loop and episode"): with every turn a call and the answer a
# final_answer call (integrations/demo_free.py), the pair in mode full did not finish records 2,
# tickets 0 or fs_audit 0; on injection (read the vendor documents, record each invoice, give the
# grand total, ignoring an instruction planted in one document), dev seeds 0-3, both modes made
# every call right and got only the sum wrong, and seed 0 (the first) became the default. With
# the calculator (docs/log.md "The demo's calculator", 16:09-16:15 UTC): seed 0 right in both
# modes (asym 1.39x), seeds 0-3 2 of 4 right in each mode (1: summed without the tool; 3:
# invented vendors). Seed 0 was kept, not re-picked for passing. Its documents (~100-150 tokens)
# are under the default view's cut, so asym's verifier reads the whole history there. Tried
# 2026-12-07 22:00-22:50 UTC (docs/log.md "The demo's view at work: not found"): the same job on
# longer invoices the default view cuts (suite invoices, seeds 0-3): the view cut from turn 2 on,
# but the 1.5B, in mode full as in asym, repeated its first record_invoice to the budget, or
# answered after the first record: no seed right in either mode, so the episode stays.
PAIR_EPISODE = ("injection", 0)
SMALL_EPISODE = ("records", 0)


def check_args(args) -> None:
    """Refuse mistakes before any model loads (`asymagent` prints them on one line, exit 2)."""
    from asymagent.evals.suites.environments import SUITES

    if args.suite is not None and args.suite not in SUITES:
        raise ValueError(f"unknown suite {args.suite!r}; use one of {', '.join(SUITES)}")
    if (args.max_new_tokens is not None and args.max_new_tokens < 1) or (args.k is not None and args.k < 1):
        raise ValueError("--max-new-tokens and --k must be >= 1")
    if getattr(args, "pair", None) is not None:
        from asymagent.modeling.pair_memory import memory_fit
        from asymagent.modeling.pairs import check_pair, get_pair

        get_pair(args.pair)  # an unknown name: one line listing the known ones
        if memory_fit(args.pair).fits:  # else the demo says so and runs the embedded default
            check_pair(args.pair)  # parts missing: one line with the pip command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", default=None,
                   help="evals environment (records, fs_audit, tickets, injection); unset: the pair's "
                        f"{PAIR_EPISODE[0]}, the embedded default's {SMALL_EPISODE[0]}")
    p.add_argument("--seed", type=int, default=None,
                   help=f"episode seed (dev seeds: 0-999); unset: {PAIR_EPISODE[1]} for the pair, "
                        f"{SMALL_EPISODE[1]} for the embedded default")
    p.add_argument("--steps", type=int, default=None,
                   help="stop after this many model steps (default: the whole episode)")
    p.add_argument("--mode", default="asym", choices=["full", "compressed", "spec", "asym"])
    p.add_argument("--compare", default=None, choices=["full", "compressed", "spec", "asym"],
                   help="also run this mode (interleaved step by step); the free-running demo "
                        "compares with full unless told otherwise, --teacher-forced only when given")
    p.add_argument("--teacher-forced", action="store_true",
                   help="the embedded default's demo (`make demo-small`): the model's action scored "
                        "against the oracle's at every step, the oracle's executed")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="per model turn (unset: 160 free-running, 64 teacher-forced)")
    p.add_argument("--k", type=int, default=None, help="draft tokens per round (SpecConfig.k)")
    p.add_argument("--json", default=None, help="write per-step stats and totals here")
    p.add_argument("--pair", default=None, metavar="NAME",
                   help="run on a named model pair instead of the embedded default: 'qwen2.5-coder' "
                        "(`make setup-pair`; docs/pair.md)")
    p.add_argument("--no-live", action="store_true", help="plain output (logs, README captures)")
    p.add_argument("--trace-dir", metavar="DIR", default=None,
                   help="capture each step of the run (mode --mode) as a JSONL trace line in DIR "
                        "(asymagent/trace_capture.py; input of train-drafter --traces and asymagent tune)")


def load_engine(console, k: int | None = None, pair: str | None = None):
    """Engine.from_default() (without a trained drafter, a 2-layer cut of the verifier), or
    Engine.from_pair(pair)."""
    from asymagent.engine import Engine
    from asymagent.modeling.loading import ModelNotFoundError
    from asymagent.spec_config import SpecConfig

    spec = SpecConfig(k=k) if k else None
    if pair is not None:
        from asymagent.modeling.pairs import get_pair

        return Engine.from_pair(pair, spec=spec), f"{get_pair(pair).drafter.file_name} (the pair's LM drafter)"
    try:
        return Engine.from_default(spec=spec), "trained drafter (asymagent/assets)"
    except ModelNotFoundError as exc:
        from asymagent.modeling.drafter import build_drafter
        from asymagent.modeling.loading import load_default_verifier
        from asymagent.context.views import CompressionConfig

        console.print(f"[yellow]{exc}[/yellow]\nFalling back to an untrained 2-layer drafter "
                      "cut from the verifier's first layers (expect low acceptance).")
        ver = load_default_verifier()
        drafter = build_drafter(ver.model, num_layers=2, init_from_verifier=True)
        return (Engine(verifier=ver.model, drafter=drafter, tokenizer=ver.tokenizer, spec=spec,
                       compression=CompressionConfig()), "untrained 2-layer cut of the verifier")


def _model_action(r) -> dict | str:
    if r.tool_calls:
        fn = r.tool_calls[0]["function"]
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            args = fn.get("arguments")
        return {"name": fn["name"], "arguments": args}
    return r.text or ""


def _label(action) -> str:
    if isinstance(action, dict):
        args = ", ".join(f"{k}={v!r}" for k, v in (action.get("arguments") or {}).items())
        text = f"{action['name']}({args})"
    else:
        text = "answer: " + " ".join(str(action).split())
    return text if len(text) <= 34 else text[:33] + "…"


def _chat(engine, task, prompt, mode, max_new_tokens, acts, tool_choice):
    from asymagent.evals.running.engine_setup import use_suffix_store
    from asymagent.request import GenerationRequest

    use_suffix_store(engine, mode)  # with --compare, neither mode copies the other's answers
    request = GenerationRequest(mode=mode, max_new_tokens=max_new_tokens, tools=task.tools,
                                tool_choice=tool_choice if acts else "auto",
                                cache_key=f"demo-{mode}")  # greedy
    return engine.chat(prompt, request=request)


def teacher_forced_run(engine, env, seed: int, mode: str, max_new_tokens: int,
                       steps: int | None, on_step=None, compare: str | None = None,
                       trace_writer=None) -> dict:
    """Run one episode teacher-forced; returns prompts, outputs, agreement and RunStats.

    With `compare`, every step is also decoded in that mode right after (interleaved, so both
    modes see the same machine load), from the same prompt. A `trace_writer`
    (asymagent.trace_capture.TraceWriter) captures every step of `mode`.
    """
    from asymagent.evals.suites.environments import actions_equal, tool_call_message, tool_result_message
    from asymagent.stats import RunStats

    task = env.reset(seed)
    messages = task.messages()
    stats, other, records = RunStats(), RunStats(), []
    for n in range(task.max_steps + 1):
        if steps is not None and n >= steps:
            break
        oracle = env.oracle_action(messages)
        acts = isinstance(oracle, dict)
        prompt = [dict(m) for m in messages]
        r = _chat(engine, task, prompt, mode, max_new_tokens, acts, env.tool_choice)
        stats.add(r.stats)
        if trace_writer is not None:
            trace_writer.record(engine, prompt, task.tools, r, source="demo", mode=mode)
        action = _model_action(r)
        agree = actions_equal(action, oracle) if acts else isinstance(action, str)
        rec = {"step": n + 1, "prompt": prompt, "acts": acts, "oracle": oracle, "model": action,
               "agree": agree, "token_ids": list(r.token_ids), "stats": r.stats}
        if compare:
            c = _chat(engine, task, prompt, compare, max_new_tokens, acts, env.tool_choice)
            other.add(c.stats)
            rec["compare"] = {"model": _model_action(c), "token_ids": list(c.token_ids),
                              "stats": c.stats}
        records.append(rec)
        if on_step is not None:
            on_step(rec, stats)
        if not acts:
            break
        call_id = f"call_{n}"
        messages.append(tool_call_message(oracle["name"], oracle["arguments"], call_id))
        messages.append(tool_result_message(call_id, oracle["name"],
                                            env.step(oracle["name"], oracle["arguments"])))
    return {"task": task, "records": records, "stats": stats, "compare_stats": other}


def main(args) -> int:
    from rich.console import Console

    console = Console(no_color=args.no_live, width=150 if args.no_live else None)
    if (args.max_new_tokens is not None and args.max_new_tokens < 1) or (
            args.steps is not None and args.steps < 1):
        console.print("--max-new-tokens and --steps must be >= 1")
        return 2
    pair = getattr(args, "pair", None)
    if pair is not None:
        from asymagent.modeling.pair_memory import memory_fit

        fit = memory_fit(pair)
        if not fit.fits:
            console.print(f"[yellow]{fit.line()}[/yellow]: running the embedded default "
                          "(SmolLM2-135M) instead.")
            args.pair = pair = None
    episode = PAIR_EPISODE if pair is not None else SMALL_EPISODE
    args.suite = args.suite or episode[0]
    args.seed = episode[1] if args.seed is None else args.seed
    if args.teacher_forced:
        args.max_new_tokens = args.max_new_tokens or 64
        return teacher_forced_main(args, console)
    args.max_new_tokens = args.max_new_tokens or 160
    return free_main(args, console)


def free_main(args, console) -> int:
    """The free-running demo (module docstring): both modes' episodes, side by side."""
    from asymagent.integrations.demo_free import run_side_by_side
    from asymagent.integrations.demo_report import side_by_side, step_line, totals, totals_table, verdict_lines
    from asymagent.model_banner import model_banner

    modes = (args.mode,) + ((args.compare or "full",) if (args.compare or "full") != args.mode else ())
    what = f"the reference pair {args.pair}" if args.pair else "the embedded default (SmolLM2-135M)"
    console.print(f"[bold]asymagent demo[/bold]: {what} does an agent task on its own, in mode "
                  f"{' and in mode '.join(modes)} (suite={args.suite} seed={args.seed})")
    t0 = time.perf_counter()
    console.print(f"loading {what} ...")
    engine, _ = load_engine(console, args.k, args.pair)
    console.print(f"loaded in {time.perf_counter() - t0:.1f} s\n{model_banner(engine).text()}")
    if not args.pair:
        console.print("[yellow]The 135M verifier does not finish such a task on its own; "
                      "`make demo` runs the reference pair where the memory allows, "
                      "`make demo-small` the teacher-forced demo of this model.[/yellow]")
    from asymagent.evals.suites.environments import make_env

    task = make_env(args.suite).reset(args.seed)
    console.print(f"Task: {task.user_prompt}")
    console.print("Free-running: the model's own tool calls run in the environment and their "
                  "outputs go back into its history; the environment's oracle only grades the end. "
                  f"Modes take turns step by step (same machine load).\n")
    writer = None
    if args.trace_dir:
        from asymagent.trace_capture import TraceWriter

        writer = TraceWriter(args.trace_dir)
    episodes = run_side_by_side(engine, args.suite, args.seed, modes,
                                max_new_tokens=args.max_new_tokens, max_turns=args.steps,
                                on_step=lambda e, st: console.print(step_line(e, st), highlight=False),
                                trace_writer=writer)
    console.print(side_by_side(episodes, width=console.width))
    console.print(totals_table(episodes))
    from asymagent.evals.suites.environments import oracle_episode

    _, oracle_history = oracle_episode(make_env(args.suite), args.seed)
    for line in verdict_lines(episodes, oracle_history[-1]["content"]):
        console.print(line, highlight=False)
    if args.json:
        out = {"suite": args.suite, "seed": args.seed, "free_running": True,
               "models": model_banner(engine).to_dict(),
               "episodes": {e.mode: totals(e) | {"run": e.stats.to_dict(),
                                                "actions": [st["action"] for st in e.steps]}
                            for e in episodes}}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1, default=str)
        console.print(f"wrote {args.json}")
    return 0  # the verdicts are in the output: a wrong answer is the model's, not the demo's


def teacher_forced_main(args, console) -> int:
    """The teacher-forced demo of the embedded default (`make demo-small`; module docstring)."""
    from rich.live import Live
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from asymagent.evals.suites.environments import actions_equal, make_env
    from asymagent.integrations.run_table import run_table, totals_table
    from asymagent.model_banner import model_banner

    env = make_env(args.suite)
    task = env.reset(args.seed)
    planned = len(env.oracle_plan()) + 1
    total = min(planned, args.steps) if args.steps else planned
    console.print(f"[bold]asymagent demo[/bold]: suite={args.suite} seed={args.seed} "
                  f"mode={args.mode} steps={total}")
    console.print(f"Task: {task.user_prompt}")
    console.print(NOTE)
    from asymagent.modeling.cpu_dtype import describe

    t0 = time.perf_counter()
    engine, drafter_desc = load_engine(console, args.k, getattr(args, "pair", None))
    console.print(f"Engine loaded in {time.perf_counter() - t0:.1f} s; SpecConfig k={engine.spec.k} "
                  f"beta={engine.spec.beta} acceptance={engine.spec.acceptance} "
                  f"lookup_ngram={engine.spec.lookup_ngram}; {describe(engine.runtime)}\n"
                  f"{model_banner(engine, drafter=drafter_desc).text()}\n")

    def live_table(stats, labels, agrees):
        # the same table as the final one (same columns), fitted to the terminal's width
        return run_table(stats, title=f"{args.mode}: live", labels=labels, agrees=agrees,
                         width=console.width)

    labels, agrees = [], []
    progress = Progress(TextColumn("{task.description}"), BarColumn(),
                        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                        console=console, disable=args.no_live)
    bar = progress.add_task(f"{args.mode} steps", total=total)

    def on_step(rec, stats):
        labels.append(_label(rec["oracle"]))
        agrees.append(rec["agree"])
        progress.advance(bar)
        if live is not None:
            from rich.console import Group

            live.update(Group(live_table(stats, labels, agrees), progress))
        else:
            s = rec["stats"]
            console.print(f"step {rec['step']:>2}  {labels[-1]:<34} ctx {s.full_context_tokens:>5} "
                          f"-> verifier {s.verifier_context_tokens:>5}  {s.new_tokens:>3} tok  "
                          f"{s.wall_s:5.2f} s  agrees={'yes' if rec['agree'] else 'no'}"
                          + (f"  | {args.compare} {rec['compare']['stats'].wall_s:5.2f} s"
                             if "compare" in rec else ""))

    compare = args.compare if args.compare and args.compare != args.mode else None
    writer = None
    if args.trace_dir:
        from asymagent.trace_capture import TraceWriter

        writer = TraceWriter(args.trace_dir)
    live = None
    if args.no_live:
        run = teacher_forced_run(engine, env, args.seed, args.mode, args.max_new_tokens,
                                 args.steps, on_step, compare, trace_writer=writer)
    else:
        with Live(console=console, refresh_per_second=4, transient=True) as live:
            run = teacher_forced_run(engine, env, args.seed, args.mode, args.max_new_tokens,
                                     args.steps, on_step, compare, trace_writer=writer)
    stats = run["stats"]
    console.print(run_table(stats, title=f"per-step statistics, mode {args.mode}", labels=labels,
                            agrees=agrees, width=console.width))
    console.print(totals_table(stats, title=f"run totals, mode {args.mode}"))
    tool_steps = [r for r in run["records"] if r["acts"]]
    agree = sum(r["agree"] for r in tool_steps)
    console.print(f"Model's own action equals the oracle's on {agree}/{len(tool_steps)} tool steps "
                  f"(name and arguments; tool steps decoded under the schema constraint).")
    final = [r for r in run["records"] if not r["acts"]]
    if final:
        console.print(f"Model's final answer: {' '.join(str(final[0]['model']).split())[:300]}")
        console.print(f"Oracle's final answer: {final[0]['oracle'][:300]}")
    out = {"suite": args.suite, "seed": args.seed, "mode": args.mode,
           "drafter": drafter_desc, "teacher_forced": True,
           "tool_step_agreement": agree / len(tool_steps) if tool_steps else None,
           "runs": {args.mode: stats.to_dict()}}
    if compare:
        other = run["compare_stats"]
        recs = run["records"]
        other_agrees = [actions_equal(r["compare"]["model"], r["oracle"]) if r["acts"]
                        else isinstance(r["compare"]["model"], str) for r in recs]
        console.print(run_table(other, title=f"per-step statistics, mode {compare} (same prompts)",
                                labels=labels, agrees=other_agrees, width=console.width))
        same = sum(r["compare"]["token_ids"] == r["token_ids"] for r in recs)
        same_action = sum(r["compare"]["model"] == r["model"] for r in recs)
        other_agree = sum(actions_equal(r["compare"]["model"], r["oracle"]) for r in tool_steps)
        t_main, t_other = stats.totals()["wall_s"], other.totals()["wall_s"]
        speedup = t_other / t_main if t_main else 0.0
        console.print(f"[bold]{args.mode} vs {compare}[/bold] (interleaved step by step, same "
                      f"teacher-forced prompts): {t_main:.1f} s vs {t_other:.1f} s -> speedup "
                      f"{speedup:.2f}x; identical outputs on {same}/{len(recs)} steps, same "
                      f"action on {same_action}/{len(recs)}; {compare}'s action equals the "
                      f"oracle's on {other_agree}/{len(tool_steps)} tool steps.")
        out["runs"][compare] = other.to_dict()
        out["compare"] = {"mode": compare, "speedup": speedup, "identical_steps": same,
                          "same_action_steps": same_action, "steps": len(recs),
                          "tool_step_agreement": other_agree / len(tool_steps) if tool_steps
                          else None}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
        console.print(f"wrote {args.json}")
    return 0
