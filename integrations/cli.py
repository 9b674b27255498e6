"""The `asymagent` console script: demo, bench, eval, serve, train-drafter, tune, pair (docs/architecture.md §4).

Each verb lives in its own module exposing `add_arguments(parser)` and `main(args) -> int`,
and optionally `check_args(args)`, which refuses a mistake (unknown suite, bad config key,
missing model path, an unavailable device) with a ValueError/OSError before any model loads;
the checks every verb shares (output paths, integrations/cli_checks.py) run next. This file
turns a refusal into one line on stderr and exit status 2, as argparse does for its own errors,
and anything a verb raises later into `asymagent VERB: error: ...` with exit status 1 (`--debug`
prints the traceback too; Ctrl-C exits 130). Every verb takes `--log-level` and `--debug`;
weight-loading progress bars show only on a terminal. It imports a verb's module when that verb
runs: `main` builds the options of the verb it is given only (the other verbs' modules, e.g.
serve's server stack, are not imported: ~2 s of every start on the 2-core machine; issue 53). Every `--help` shows each option's default; `asymagent --version`; `python -m asymagent`
runs the same command.

The engine's CPU thread policy (asymagent/modeling/cpu_threads.py) starts here: `main` sets the
OpenMP wait policy (OMP_WAIT_POLICY=PASSIVE unless the user set one) before anything imports
torch, and every verb takes `--threads N` (unset: the CPUs this process may use, from its
affinity and cgroup quota, not the machine's count), applied before the verb runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

from asymagent.integrations.cli_checks import LOG_LEVELS, check_common, setup_output

VERBS = {
    "demo": ("asymagent.integrations.demo", "Run a long-horizon agent task (with --pair: the reference pair, asym beside full)."),
    "bench": ("asymagent.evals.bench.bench", "Side-by-side benchmark of all modes and HF peers (JSON)."),
    "eval": ("asymagent.evals.running.cli", "Run a long-horizon agent eval suite (JSON + report)."),
    "serve": ("asymagent.integrations.serve", "OpenAI-compatible HTTP server."),
    "train-drafter": ("asymagent.training.distill", "Distil a drafter from a verifier."),
    "tune": ("asymagent.evals.tuning.tune", "Pick SpecConfig/CompressionConfig by measurement on your traces."),
    "pair": ("asymagent.integrations.pair", "Check, assemble and convert a named model pair (docs/pair.md)."),
}


def shows_default(action: argparse.Action) -> bool:
    """Options whose help should state a default: not unset (None), not an off-by-default flag
    (False), not --help/--version."""
    return bool(action.option_strings) and not (
        action.default is None or action.default is False or action.default == argparse.SUPPRESS)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """argparse's ArgumentDefaultsHelpFormatter without the noise: an option's help ends with
    "(default: X)" when `shows_default` and its help does not state the default already."""

    def _get_help_string(self, action):
        text = action.help or ""
        if not shows_default(action) or "%(default)" in text or "(default" in text:
            return text
        return f"{text} (default: %(default)s)"


class VerbParser(argparse.ArgumentParser):
    """A verb's parser: an option added without help still gets a help line (its default),
    since argparse prints nothing, not even the default, for an option without help text."""

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        if shows_default(action) and not action.help:
            action.help = "default: %(default)s"
        return action


def version_string() -> str:
    from asymagent import __version__
    from asymagent.modeling.cpu_dtype import describe, runtime_info

    return f"asymagent {__version__} {describe(runtime_info())}"


def build_parser(only: str | None = None) -> tuple[argparse.ArgumentParser, dict]:
    """The parser and {verb: its sub-parser} (sub-parsers report check_args errors). `only`: a
    verb whose options alone are built (its module alone imported); the other verbs are listed
    with their help line but parse no options (None: every verb's, as `asymagent --help` needs
    none of them)."""
    parser = argparse.ArgumentParser(prog="asymagent", description=__doc__.splitlines()[0],
                                     formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--version", action="version", version=version_string())
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=VerbParser)
    sub.required = True
    verbs = {}
    for verb, (module, help_text) in VERBS.items():
        p = sub.add_parser(verb, help=help_text, description=help_text,
                           formatter_class=DefaultsHelpFormatter)
        p.set_defaults(verb_module=module)
        if only is not None and verb != only:
            continue
        mod = importlib.import_module(module)
        mod.add_arguments(p)
        p.add_argument("--log-level", default=None, choices=LOG_LEVELS,
                       help="Python logging level (unset: info for serve, warning otherwise)")
        p.add_argument("--debug", action="store_true",
                       help="print the full traceback of an error, not only its one line")
        add_threads(p)
        verbs[verb] = p
    return parser, verbs


def add_threads(p: argparse.ArgumentParser) -> None:
    """`--threads` for a verb that has none of its own (serve and eval's frontier declare theirs)."""
    try:
        p.add_argument("--threads", type=int, default=None,
                       help="torch CPU threads (unset: the CPUs this process may use: its "
                            "affinity and cgroup quota, not the machine's count)")
    except argparse.ArgumentError:  # the verb declares --threads itself
        pass


def use_thread_policy(args) -> None:
    """`--threads` (or the available CPUs) as torch's thread count; ValueError below 1."""
    from asymagent.modeling.cpu_threads import apply_threads

    threads = getattr(args, "threads", None)
    if threads is not None and threads < 1:
        raise ValueError(f"--threads must be >= 1, got {threads}")
    apply_threads(threads)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "torch" not in sys.modules:  # libgomp reads its wait policy when torch is first imported
        from asymagent.modeling.cpu_threads import use_omp_policy

        use_omp_policy()
    # the verb is the first argument (the top-level parser has no options but --help/--version)
    parser, _ = build_parser(argv[0] if argv and argv[0] in VERBS else None)
    args = parser.parse_args(argv)
    if args.log_level is None:
        args.log_level = "info" if args.verb == "serve" else "warning"
    setup_output(args.log_level)
    module = importlib.import_module(args.verb_module)
    check = getattr(module, "check_args", None)
    try:
        if check is not None:
            check(args)
        check_common(args)
        use_thread_policy(args)
    except (ValueError, OSError) as exc:  # ModelNotFoundError is an OSError
        if args.debug:
            traceback.print_exc()
        parser.exit(2, f"asymagent {args.verb}: error: {one_line(exc)}\n")
    try:
        return int(module.main(args) or 0)
    except KeyboardInterrupt:
        parser.exit(130, f"asymagent {args.verb}: interrupted\n")
    except Exception as exc:  # the top-level handler: one line, the traceback only on --debug
        if args.debug:
            traceback.print_exc()
        hint = "" if args.debug else " (--debug prints the traceback)"
        parser.exit(1, f"asymagent {args.verb}: error: {type(exc).__name__}: "
                       f"{one_line(exc)}{hint}\n")


def one_line(exc: BaseException) -> str:
    """The exception's message on one line, whatever it held."""
    return " ".join(str(exc).split()) or type(exc).__name__


if __name__ == "__main__":
    raise SystemExit(main())
