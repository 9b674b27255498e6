"""The `asymagent` console script: demo, bench, eval, serve, train-drafter (docs/architecture.md §4).

Each verb lives in its own module exposing `add_arguments(parser)` and `main(args) -> int`;
this file only wires them, importing a verb's module when that verb runs.
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
    return int(module.main(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
