"""The probes' shared harness: the argument parser, timing, and the JSON a probe writes.

A probe here is only its measurement. Its `main(argv=None)` builds the parser with
`parser(__doc__, "name")` (the docstring's first line as the description, `--json PATH`), measures,
and returns `finish(doc, args.json)`, which writes the figures (nothing without a path) and
returns the exit status. `command(name, argv)` is the command line a JSON records; `timed(fn)`
and `median_ms_of(seconds)` are the timing every A/B repeats. `load_tokenizer(source)` and
`compression_config(name)` read the `--tokenizer` and view options of the tokenizer-only tools
(view_walk here, evals/agentdojo's ground_truth and replay).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

PREFIX = "python -m asymagent.evals.probes."


def parser(doc: str | None, name: str | None = None, *, json_help: str = "write the figures here as JSON",
           json_required: bool = False, with_json: bool = True,
           repeats: int | None = None) -> argparse.ArgumentParser:
    """A probe's parser: `python -m asymagent.evals.probes.NAME`, its docstring's first line,
    `--json PATH` (unless `with_json=False`: a probe whose `add_arguments` declares its own) and,
    given a default, `--repeats N` (interleaved A/B pairs)."""
    p = argparse.ArgumentParser(prog=PREFIX + name if name else None,
                                description=doc.strip().splitlines()[0] if doc else None)
    if with_json:
        p.add_argument("--json", metavar="PATH", required=json_required, help=json_help)
    if repeats is not None:
        p.add_argument("--repeats", type=int, default=repeats, help="interleaved A/B pairs")
    return p


def run_verb(doc: str | None, name: str, add_arguments: Callable, main: Callable, argv: list | None = None) -> int:
    """`main(args)` of a probe shaped like a CLI verb (`add_arguments(p)` declares every option)."""
    p = parser(doc, name, with_json=False)
    add_arguments(p)
    return main(p.parse_args(argv))


def command(name: str, argv: list | None) -> str:
    """The command line that ran the probe (argv, or the process's arguments when argv is None)."""
    given = sys.argv[1:] if argv is None else list(argv)
    return " ".join([PREFIX + name, *given])


def write(doc: Any, path: str | Path | None, indent: int | None = 2) -> None:
    """`doc` as JSON at PATH (nothing without a path)."""
    if path:
        Path(path).write_text(json.dumps(doc, indent=indent) + "\n")


def finish(doc: Any, path: str | Path | None, *, indent: int | None = 2, show: bool = False,
           status: int = 0) -> int:
    """The end of a probe's `main`: print the figures when `show`, write them to PATH, return `status`."""
    if show:
        print(json.dumps(doc, indent=2))
    write(doc, path, indent)
    return status


def timed(fn: Callable, *args, **kwargs) -> tuple[Any, float]:
    """(fn(*args, **kwargs), the seconds it took on the wall clock)."""
    t0 = time.perf_counter()
    value = fn(*args, **kwargs)
    return value, time.perf_counter() - t0


def median_ms_of(seconds: Iterable[float]) -> float:
    """The median of wall-clock seconds, in milliseconds."""
    return 1e3 * statistics.median(seconds)


def load_tokenizer(source: str):
    """A tokenizer from a folder, a .gguf file or a cached HF id (never a download)."""
    from transformers import AutoTokenizer

    path = Path(source).expanduser()
    if path.suffix == ".gguf":
        return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return AutoTokenizer.from_pretrained(str(path) if path.exists() else source, local_files_only=True)


def compression_config(name: str | None):
    """A CompressionConfig from a preset name, "default" (or None), or a YAML/JSON file."""
    from asymagent.context.compressors import PRESETS, CompressionConfig

    if name is None or name == "default":
        return CompressionConfig.default()
    return CompressionConfig.preset(name) if name in PRESETS else CompressionConfig.from_file(name)
