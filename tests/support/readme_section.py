"""One section of a documentation page, by its heading. The "Many machines" page (``docs/many-machines.md``) is run
one section at a time, each by its own test (``tests/optim/search/test_postgres_store.py``, ``test_spark_model.py``,
``test_resumable_scoring.py``, ``test_gateway.py``), with the real servers it names started on loopback, so
``test_readme.py`` (whose sandbox fakes every model) leaves that page to them; ``test_cascade_build.py`` runs the
cascades section of ``docs/selective.md`` on its own."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from repo_paths import ROOT

DOCS = ROOT / "docs"
MANY_MACHINES = DOCS / "many-machines.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
HEADING = re.compile(r"^(#{1,6}) (.+)$", re.M)


def headings(text: str) -> list[tuple[int, int, str]]:
    """``(offset, level, title)`` of every Markdown heading outside fenced blocks (a ``#`` comment in a bash block is
    not a heading)."""
    fenced = [m.span() for m in FENCE.finditer(text)]
    return [(m.start(), len(m.group(1)), m.group(2).strip()) for m in HEADING.finditer(text)
            if not any(a <= m.start() < b for a, b in fenced)]


def section_span(text: str, heading: str) -> tuple[int, int]:
    """Character offsets of the section titled ``heading``: from its heading line to the next heading of the same or
    a higher level (or the end of the text)."""
    found = headings(text)
    at = [i for i, (_, _, title) in enumerate(found) if title == heading]
    if len(at) != 1:
        raise LookupError(f"{len(at)} headings titled {heading!r} (need exactly one)")
    start, level, _ = found[at[0]]
    end = next((offset for offset, lvl, _ in found[at[0] + 1:] if lvl <= level), len(text))
    return start, end


def subsection_blocks(page: Path, heading: str) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block in ``page``'s section titled ``heading``, in order."""
    text = page.read_text(encoding="utf-8")
    start, end = section_span(text, heading)
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(text[start:end])]


def blocks(text: str) -> list[tuple[str, str, int]]:
    """``(language, code, line)`` of every fenced block."""
    return [(m.group(1), m.group(2), text[: m.start()].count("\n") + 1) for m in FENCE.finditer(text)]


def commands(code: str) -> list[str]:
    """Shell command lines: continuations joined, comments and blank lines dropped."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        background = bool(words) and words[-1] == "&"
        if background:
            words.pop()
        if words:
            out.append(shlex.join(words) + (" &" if background else ""))
    return out
