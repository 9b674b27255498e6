"""The `asymagent` console script: demo, bench, eval, serve, train-drafter, tune (docs/architecture.md §4).

Each verb lives in its own module exposing `add_arguments(parser)` and `main(args) -> int`,
and optionally `check_args(args)`, which refuses a mistake (unknown suite, bad config key,
missing model path) with a ValueError/OSError before any model loads; this file turns that
into one line on stderr and exit status 2, as argparse does for its own errors.
"""

from __future__ import annotations

import argparse
import importlib
import sys

VERBS = {
    "demo": ("asymagent.integrations.demo", "Run a long-horizon agent task on the embedded default."),
    "bench": ("asymagent.evals.bench", "Side-by-side benchmark of all modes and HF peers (JSON)."),
    "eval": ("asymagent.evals.cli", "Run a long-horizon agent eval suite (JSON + report)."),
    "serve": ("asymagent.integrations.openai_server", "OpenAI-compatible HTTP server."),
    "train-drafter": ("asymagent.training.distill", "Distil a drafter from a verifier."),
    "tune": ("asymagent.evals.tune", "Pick SpecConfig/CompressionConfig by measurement on your traces."),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asymagent", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    sub.required = True
    for verb, (module, help_text) in VERBS.items():
        p = sub.add_parser(verb, help=help_text, description=help_text)
        p.set_defaults(verb_module=module)
        mod = importlib.import_module(module)
        mod.add_arguments(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    module = importlib.import_module(args.verb_module)
    check = getattr(module, "check_args", None)
    if check is not None:
        try:
            check(args)
        except (ValueError, OSError) as exc:  # ModelNotFoundError is an OSError
            message = " ".join(str(exc).split())  # one line, whatever the exception held
            parser.exit(2, f"asymagent {args.verb}: error: {message}\n")
    return int(module.main(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
