"""What the data tests share: the JSON-lines file writer and a one-criterion Likert task."""

from __future__ import annotations

import json
from pathlib import Path

LIKERT = {
    "name": "likert", "format": "pointwise", "inputs": [{"name": "answer", "judged": True}],
    "criteria": [{"name": "quality", "description": "is it good?", "scale": "1-5"}],
}


def write_jsonl(path: Path, rows) -> Path:
    """Write ``rows`` to ``path``, one JSON object a line (UTF-8); returns ``path``."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path
