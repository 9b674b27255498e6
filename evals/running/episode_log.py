"""Episode log: finished episodes streamed to a JSONL file as they end, and read back to resume.

    {"asymagent_episode_log": 1, "key": {...}}      first line: what the run is (suite, modes,
                                                      settings, engine recipe)
    {"seed": 3, "wall_s": ..., "modes": {...}}      one line per finished episode (evals/running/episodes.py)

Lines are appended and flushed by the process that collects results (the driver, never a Ray
worker), so a run that dies loses at most the episodes in flight. `resume=True` keeps the lines
already there (a torn last line is cut off) and refuses a file written for another key, so
episodes of different settings are never merged. Without `resume`, an existing non-empty file is
an error rather than silently overwritten hours of work.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MAGIC = "asymagent_episode_log"


class EpisodeLog:
    """Append-only log of episode records for one run `key` (a JSON-able dict)."""

    def __init__(self, path: str | os.PathLike, key: dict, *, resume: bool = False) -> None:
        self.path = Path(path)
        self.key = json.loads(json.dumps(key, default=str))  # as it reads back from the file
        self.done: dict = {}  # seed -> record already in the file
        exists = self.path.exists() and self.path.stat().st_size > 0
        if exists and not resume:
            raise FileExistsError(f"{self.path} already holds episodes; pass --resume to continue that run "
                                  "or remove the file")
        if exists:
            self._load()
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._write_lines([{MAGIC: 1, "key": self.key}], mode="w")

    def _load(self) -> None:
        text = self.path.read_text(encoding="utf-8")
        lines = text.split("\n")
        complete, torn = (lines[:-1], lines[-1]) if not text.endswith("\n") else (lines[:-1], "")
        try:
            header = json.loads(complete[0]) if complete else {}
        except json.JSONDecodeError:
            header = {}
        if header.get(MAGIC) != 1:
            raise ValueError(f"{self.path} is not an asymagent episode log (first line lacks {MAGIC!r})")
        if header["key"] != self.key:
            diff = sorted(k for k in set(header["key"]) | set(self.key)
                          if header["key"].get(k) != self.key.get(k))
            raise ValueError(f"{self.path} was written by a run with other settings (differs in {diff}); "
                             "use another --jsonl path or the same settings")
        for n, line in enumerate(complete[1:], start=2):
            if line.strip():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{self.path}:{n}: not JSON ({exc})") from exc
                self.done[rec["seed"]] = rec
        if torn:  # a line cut by a crash mid-write: drop it, that episode runs again
            with open(self.path, "r+", encoding="utf-8") as f:
                f.truncate(len(text.encode("utf-8")) - len(torn.encode("utf-8")))

    def _write_lines(self, rows: list, mode: str = "a") -> None:
        with open(self.path, mode, encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def append(self, record: dict) -> None:
        """Write one finished episode (durably) and remember it."""
        self._write_lines([record])
        self.done[record["seed"]] = record
