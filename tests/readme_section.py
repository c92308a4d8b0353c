"""The README's "Many machines" section, one subsection at a time: each is run as written by its own test
(``tests/test_postgres_store.py``, ``test_spark_model.py``, ``test_resumable_scoring.py``,
``test_gateway.py``), with the real servers it names started on loopback, so ``test_readme.py``
(whose sandbox fakes every model) leaves this section to them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SECTION = "## Many machines"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)


def section_span(text: str) -> tuple[int, int]:
    """Character offsets of the "Many machines" section: from its heading to the next ``## `` heading."""
    start = text.index(f"\n{SECTION}\n") + 1
    nxt = text.find("\n## ", start + len(SECTION))
    return start, (nxt + 1 if nxt >= 0 else len(text))


def subsection_blocks(heading: str) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block under ``### <heading>`` in the section, in order."""
    text = README.read_text(encoding="utf-8")
    start, end = section_span(text)
    section = text[start:end]
    at = section.index(f"\n### {heading}\n")
    nxt = section.find("\n### ", at + 5)
    body = section[at: nxt if nxt >= 0 else len(section)]
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(body)]
