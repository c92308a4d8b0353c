"""What a results file says, item by item, without the measurements: the same debates give the same lines.

Import it into a test module: ``from said import said``.
"""

from __future__ import annotations

import json
from pathlib import Path

# What was judged and said; times and tokens are measurements (the item's and each turn's) and differ.
KEEP = ("id", "prediction", "score_1", "score_2", "referees", "transcripts", "consistent", "abstained", "calls")


def said(path: Path) -> list[str]:
    """Each results line's verdicts and debate (``KEEP``), turn measurements dropped, as sorted JSON texts."""
    from chateval_dspy.program.debate import MEASURED

    records = [{k: r.get(k) for k in KEEP} for r in map(json.loads, Path(path).read_text().splitlines())]
    for r in records:
        r["transcripts"] = [[{k: v for k, v in u.items() if k not in MEASURED} for u in t]
                            for t in r["transcripts"] or []]
    return sorted(json.dumps(r, sort_keys=True) for r in records)
