"""Position calibration as a pair of inverse functions around the debate.

The calibrated verdict is ``combine(run(x), unswap(run(swap(x))))``: one prompt,
no reversed copy, and the swap is undone on the verdicts rather than in the text.
"""

from __future__ import annotations

_FLIP = {"1": "2", "2": "1", "tie": "tie", None: None}


def swap(inputs: dict) -> dict:
    """The same pairwise item with the answers in the other order.

    Example:
        >>> swap({"question": "q", "answer_1": "a", "answer_2": "b"})["answer_1"]
        'b'
    """
    out = dict(inputs)
    out["answer_1"], out["answer_2"] = inputs["answer_2"], inputs["answer_1"]
    return out


def unswap_scores(verdict: dict | None) -> dict | None:
    """Scores given in the swapped order, mapped back to the original answers."""
    if verdict is None:
        return None
    out = dict(verdict)
    out["score_1"], out["score_2"] = verdict["score_2"], verdict["score_1"]
    if "preference" in verdict:
        out["preference"] = _FLIP[verdict["preference"]]
    if "expected" in verdict:
        out["expected"] = {{"score_1": "score_2", "score_2": "score_1"}[k]: v for k, v in verdict["expected"].items()}
    return out


def unswap_preference(pref: str | None) -> str | None:
    """A preference given in the swapped order, mapped back (``"1"`` <-> ``"2"``)."""
    return _FLIP[pref]


def consistent(first: str | None, second_unswapped: str | None) -> bool | None:
    """Whether both orders reached the same verdict; None when either abstained."""
    if first is None or second_unswapped is None:
        return None
    return first == second_unswapped
