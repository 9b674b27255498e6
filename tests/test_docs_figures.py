"""Figures the docs quote from docs/results/*.json equal the JSON they name.

A table row of README.md or docs/*.md whose last cell names its sources as
`FILE.json#/json/pointer` (RFC 6901: `~1` is a `/` inside a key) quotes, in the cell before it,
one number per source in the same order; each must equal the JSON value rounded to the
decimals the page shows. So a rerun that changes the JSON, or an edit of the page, cannot
leave a stale figure behind.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
SOURCE = re.compile(r"`([\w.-]+\.json)#(/[^`]*)`")
NUMBER = re.compile(r"(?<![\d.])[-+]?\d+(?:\.\d+)?")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def sourced_rows() -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(page:line, value cell, [(json file, pointer)]) for every table row that names JSON sources."""
    rows = []
    for page in pages():
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if not line.startswith("|"):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            sources = SOURCE.findall(cells[-1]) if len(cells) >= 2 else []
            if sources:
                rows.append((f"{page.relative_to(ROOT)}:{n}", cells[-2], sources))
    return rows


def resolve(document, pointer: str):
    """The value at an RFC 6901 JSON pointer."""
    value = document
    for part in pointer.lstrip("/").split("/"):
        key = part.replace("~1", "/").replace("~0", "~")
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


def test_quoted_figures_equal_their_json():
    rows = sourced_rows()
    assert rows, "no table row names a docs/results JSON source"
    wrong = []
    for where, cell, sources in rows:
        numbers = NUMBER.findall(cell)
        assert len(numbers) == len(sources), f"{where}: {len(numbers)} numbers for {len(sources)} sources"
        for text, (name, pointer) in zip(numbers, sources):
            value = resolve(json.loads((RESULTS / name).read_text()), pointer)
            decimals = len(text.split(".")[1]) if "." in text else 0
            if round(float(value), decimals) != float(text):
                wrong.append(f"{where}: {text} but {name}#{pointer} = {value}")
    assert not wrong, "\n".join(wrong)


def test_pointers_and_numbers_are_read_as_the_pages_write_them():
    document = {"modes": {"asym/x": {"speedup": 2.7157}}}
    assert round(resolve(document, "/modes/asym~1x/speedup"), 2) == 2.72
    assert NUMBER.findall("2.72x [2.06-3.45]") == ["2.72", "2.06", "3.45"]
