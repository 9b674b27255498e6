"""docs/architecture.md's module tables match the source tree: every module has a row, every row names a file.

The tables ("The core, one line per module" and "kernels/, integrations/, evals/") name files
as full paths (`evals/bench/bench.py`), as paths inside the core (`decoding/round.py` for
`asymagent/decoding/round.py`), as paths inside the row's folder (`integrations/server/app.py`,
`server/context.py`), or by bare name after a path of the same folder in the same row
(`integrations/serve.py`, `serve_setup.py`), with `*` globs (`suite_*.py`).
Sources are listed from the file system, nothing is imported.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("asymagent", "kernels", "integrations", "evals")


def table_rows() -> list[list[str]]:
    """The `.py` names in backticks of each table row of §2 (Layout and floors), in row order."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## §2"):text.index("## §3")]
    rows = []
    for line in section.splitlines():
        if line.startswith("|"):
            names = re.findall(r"`([^`\s]+\.py)`", line)
            if names:
                rows.append(names)
    return rows


def row_paths(names: list[str]) -> list[str]:
    """A row's names as repository paths (globs kept), bare names joined to the row's last folder."""
    paths, folder = [], None
    for name in names:
        if "/" in name:
            first = name.split("/")[0]
            if first in FOLDERS:
                path = name
            elif folder and first in folder.split("/"):  # `server/x.py` after `integrations/server/a.py`
                parts = folder.split("/")
                path = "/".join(parts[:parts.index(first)] + [name])
            else:  # a core sub-package: `decoding/round.py`
                path = f"asymagent/{name}"
            folder = path.rsplit("/", 1)[0]
        else:
            path = f"{folder or 'asymagent'}/{name}"
        paths.append(path)
    return paths


def source_files() -> set[str]:
    """Every .py file of the four folders, as a repository path (package `__init__.py` left out)."""
    files = set()
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if "__pycache__" in rel or (path.name == "__init__.py" and rel != "asymagent/__init__.py"):
                continue
            files.add(rel)
    return files


def test_every_module_has_a_row_in_the_architecture_tables():
    documented = [p for row in table_rows() for p in row_paths(row)]
    missing = sorted(f for f in source_files() if not any(fnmatch.fnmatch(f, p) for p in documented))
    assert not missing, f"modules without a row in docs/architecture.md §2: {missing}"


def test_every_row_names_an_existing_module():
    files = source_files()
    documented = [p for row in table_rows() for p in row_paths(row)]
    assert len(documented) > 50  # the tables were found and read
    stale = sorted(p for p in documented if not any(fnmatch.fnmatch(f, p) for f in files))
    assert not stale, f"rows of docs/architecture.md §2 naming no file: {stale}"
