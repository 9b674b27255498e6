"""Checks every `asymagent` verb shares before any work: output paths, the log level, progress bars.

A verb's own `check_args` refuses what only it knows (a suite name, a model path); these run for
every verb on the flags they share, so a run never ends in a traceback about where to write:
- an output file (`--json`, `--jsonl`, `--write-config`) may not be a directory; a missing
  parent folder is **created** up front (as `mkdir -p`), one that is a file or not writable is
  refused;
- an output folder (`--report`, `--trace-dir`) may not be an existing file, and the folder it
  would be created in must be writable.
Each refusal is a ValueError that integrations/cli.py prints on one line (exit status 2).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

OUTPUT_FILES = {"json": "--json", "jsonl": "--jsonl", "write_config": "--write-config"}
OUTPUT_DIRS = {"report": "--report", "trace_dir": "--trace-dir"}
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # trace: uvicorn's


def _existing_ancestor(path: Path) -> Path:
    for parent in [path, *path.parents]:
        if parent.exists():
            return parent
    return Path(".")


def check_output_file(flag: str, value: str) -> None:
    """`value` can be written as a file: not a directory, its folder there (created) and writable."""
    path = Path(value).expanduser()
    if path.is_dir():
        raise ValueError(f"{flag} {value}: is a directory; give a file path")
    folder = path.parent if str(path.parent) else Path(".")
    base = _existing_ancestor(folder)
    if not base.is_dir():
        raise ValueError(f"{flag} {value}: {base} is a file, not a folder")
    if not os.access(base, os.W_OK):
        raise ValueError(f"{flag} {value}: the folder {base} is not writable")
    folder.mkdir(parents=True, exist_ok=True)


def check_output_dir(flag: str, value: str) -> None:
    """`value` can be (or become) a folder: not an existing file, created in a writable folder."""
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag} {value}: exists and is not a directory ({flag} names a folder)")
    base = _existing_ancestor(path)
    if not base.is_dir():
        raise ValueError(f"{flag} {value}: {base} is a file, not a folder")
    if not os.access(base, os.W_OK):
        raise ValueError(f"{flag} {value}: the folder {base} is not writable")


def check_common(args) -> None:
    """The shared checks on whichever of the shared flags this verb has."""
    for attr, flag in OUTPUT_FILES.items():
        value = getattr(args, attr, None)
        if isinstance(value, str):
            check_output_file(flag, value)
    for attr, flag in OUTPUT_DIRS.items():
        value = getattr(args, attr, None)
        if isinstance(value, str):
            check_output_dir(flag, value)


def setup_output(log_level: str, stream=None) -> None:
    """Python logging at `log_level` (uvicorn's "trace" is debug here); weight-loading and
    download progress bars only when `stream` (stderr) is a terminal."""
    stream = sys.stderr if stream is None else stream
    level = logging.DEBUG if log_level == "trace" else getattr(logging, log_level.upper())
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)
    if not stream.isatty():
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # read when huggingface_hub is imported
        if "transformers" in sys.modules:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        if "huggingface_hub" in sys.modules:
            from huggingface_hub.utils import disable_progress_bars

            disable_progress_bars()
