"""Figures the docs quote from docs/results/*.json equal the JSON they name.

A table row of README.md or docs/*.md whose last cell names its sources as
`FILE.json#/json/pointer` (RFC 6901: `~1` is a `/` inside a key) quotes, in the cell before it,
one number per source in the same order; each must equal the JSON value rounded to the
decimals the page shows. So a rerun that changes the JSON, or an edit of the page, cannot
leave a stale figure behind.

docs/results/ holds only what the reference pages (README.md and docs/*.md but the log) cite, and
every file they cite is there. docs/log.md keeps its entries word for word: a JSON it names that
no reference page cites any more was removed from docs/results/ and its figures are checked
against the copy git keeps (the version before the commit that removed it).

And what keeps the pages reference pages: docs/results.md the current figures on <= 250 lines,
no dated run in results.md or context.md, the log newest first, docs/architecture.md listing
exactly the probes there are, each probe's parser from evals/probes/harness.py.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
SOURCE = re.compile(r"`([\w.-]+\.json)#(/[^`]*)`")
NUMBER = re.compile(r"(?<![\d.])[-+]?\d+(?:\.\d+)?")
# a path into docs/results/ as the pages write it (`docs/results/x.json`, `results/x.png`)
CITED_PATH = re.compile(r"(?<![\w-])results/([\w.@+-]+\.(?:json|png))")
LOG = ROOT / "docs" / "log.md"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def reference_pages() -> list[Path]:
    """The pages that say what is now: every page but the dated log."""
    return [page for page in pages() if page != LOG]


def citations(text: str) -> set[str]:
    """The docs/results/ files a page's text cites: paths into the folder and table sources."""
    return set(CITED_PATH.findall(text)) | {name for name, _ in SOURCE.findall(text)}


@functools.cache
def removed_copy(name: str) -> str | None:
    """The text git keeps of docs/results/NAME, removed from the tree (None if git has none)."""
    path = f"docs/results/{name}"

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    last = (git("rev-list", "-1", "HEAD", "--", path) or "").strip()
    if not last:
        return None
    # the last commit that touched it has it (its removal is not committed yet), or removed it
    # (then its parent has it)
    return git("show", f"{last}:{path}") or git("show", f"{last}^:{path}")


def git_history_at_hand() -> bool:
    return (ROOT / ".git").exists() and removed_copy("bench_before_direct.json") is not None


def load_source(name: str):
    if (RESULTS / name).exists():
        return json.loads((RESULTS / name).read_text())
    text = removed_copy(name)
    assert text is not None, f"{name}: neither in docs/results/ nor in git history"
    return json.loads(text)


def sourced_rows(page_list: list[Path] | None = None) -> list[tuple[str, str, list[tuple[str, str]]]]:
    """(page:line, value cell, [(json file, pointer)]) for every table row that names JSON sources."""
    rows = []
    for page in page_list if page_list is not None else pages():
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


def wrong_figures(rows) -> list[str]:
    """Each quoted number that is not its source's value at the decimals the page shows."""
    wrong = []
    for where, cell, sources in rows:
        numbers = NUMBER.findall(cell)
        assert len(numbers) == len(sources), f"{where}: {len(numbers)} numbers for {len(sources)} sources"
        for text, (name, pointer) in zip(numbers, sources):
            value = resolve(load_source(name), pointer)
            decimals = len(text.split(".")[1]) if "." in text else 0
            if round(float(value), decimals) != float(text):
                wrong.append(f"{where}: {text} but {name}#{pointer} = {value}")
    return wrong


def test_quoted_figures_equal_their_json():
    rows = sourced_rows(reference_pages())
    assert rows, "no table row names a docs/results JSON source"
    assert not wrong_figures(rows), "\n".join(wrong_figures(rows))


def test_log_figures_equal_their_json_present_or_in_git():
    rows = sourced_rows([LOG])
    assert rows, "the log names no JSON source"
    if not git_history_at_hand():
        pytest.skip("no git history here: the log's removed JSON cannot be read")
    wrong = wrong_figures(rows)
    assert not wrong, "\n".join(wrong)


def test_every_results_file_is_cited_by_a_reference_page():
    text = "\n".join(page.read_text() for page in reference_pages())
    uncited = [p.name for p in sorted(RESULTS.iterdir())
               if not re.search(r"(?<![\w.-])" + re.escape(p.name) + r"(?![\w-])", text)]
    assert not uncited, f"docs/results/ files no reference page cites (the log's live in git): {uncited}"


def test_every_citation_exists():
    missing = [f"{page.relative_to(ROOT)}: {name}" for page in reference_pages()
               for name in sorted(citations(page.read_text())) if not (RESULTS / name).exists()]
    assert not missing, "cited but not in docs/results/:\n" + "\n".join(missing)
    if not git_history_at_hand():
        pytest.skip("no git history here: the log's removed files cannot be looked up")
    gone = [name for name in sorted(citations(LOG.read_text()))
            if not (RESULTS / name).exists() and removed_copy(name) is None]
    assert not gone, f"docs/log.md cites files in neither docs/results/ nor git history: {gone}"


def test_pointers_and_numbers_are_read_as_the_pages_write_them():
    document = {"modes": {"asym/x": {"speedup": 2.7157}}}
    assert round(resolve(document, "/modes/asym~1x/speedup"), 2) == 2.72
    assert NUMBER.findall("2.72x [2.06-3.45]") == ["2.72", "2.06", "3.45"]


# The reference pages stay short and say what is; the lab bench stays cleared (issue 46).
PROBES = ROOT / "evals" / "probes"
TIME_OF_DAY = re.compile(r"\b\d\d:\d\d\b")
DATE = re.compile(r"\b(20\d\d-\d\d-\d\d)\b")


def headings(page: Path) -> list[str]:
    """The page's Markdown headings (outside code fences)."""
    found, fence = [], False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#+ ", line):
            found.append(line)
    return found


def test_results_page_is_the_current_figures_on_one_short_page():
    page = ROOT / "docs" / "results.md"
    assert len(page.read_text().splitlines()) <= 250
    for name in ("results.md", "context.md"):
        dated = [h for h in headings(ROOT / "docs" / name) if TIME_OF_DAY.search(h)]
        assert not dated, f"docs/{name}: dated runs belong in docs/log.md: {dated}"


def test_log_entries_are_newest_first():
    dates = [DATE.search(h).group(1) for h in headings(LOG) if h.startswith("## ") and DATE.search(h)]
    entries = [h for h in headings(LOG) if h.startswith("## ")]
    assert len(dates) == len(entries), "every log entry's heading carries its date"
    assert dates == sorted(dates, reverse=True)


def test_architecture_lists_exactly_the_probes_there_are():
    text = (ROOT / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"`evals/probes/(\w+)\.py`", text))
    present = {p.stem for p in PROBES.glob("*.py") if p.stem != "__init__"}
    assert listed == present, f"listed, not there: {listed - present}; there, not listed: {present - listed}"


def test_probes_take_their_arguments_and_json_from_the_harness():
    """Each probe is only its measurement: the parser comes from evals/probes/harness.py."""
    own = [p.name for p in PROBES.glob("*.py") if p.name != "harness.py" and "ArgumentParser(" in p.read_text()]
    assert not own, f"probes building their own parser: {own}"
