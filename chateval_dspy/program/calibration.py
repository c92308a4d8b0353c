"""Position calibration as a pair of inverse functions around the debate.

The calibrated verdict is ``combine(run(x), unswap(run(swap(x))))``: one prompt,
no reversed copy, and the swap is undone on the verdicts rather than in the text.
"""

from __future__ import annotations

from chateval_dspy.program.task import TaskSpec, as_task

_FLIP = {"1": "2", "2": "1", "tie": "tie", None: None}


def swap(inputs: dict, task: TaskSpec | str = "pairwise") -> dict:
    """The same pairwise item with the task's two responses in the other order.

    Example:
        >>> swap({"question": "q", "answer_1": "a", "answer_2": "b"})["answer_1"]
        'b'
    """
    first, second = as_task(task).responses
    out = dict(inputs)
    out[first], out[second] = inputs[second], inputs[first]
    return out


def unswap_scores(verdict: dict | None, task: TaskSpec | str = "pairwise") -> dict | None:
    """Scores given in the swapped order, mapped back to the original responses (every criterion's
    ``_1``/``_2`` fields, a stated preference, and the weighted ``expected`` scores).

    Example:
        >>> unswap_scores({"preference": "1", "score_1": 8, "score_2": 3})
        {'preference': '2', 'score_1': 3, 'score_2': 8}
    """
    if verdict is None:
        return None
    flip = {f"{c.name}_{n}": f"{c.name}_{3 - n}" for c in as_task(task).criteria for n in (1, 2)}
    out = dict(verdict)
    for name, other in flip.items():
        if other in verdict:
            out[name] = verdict[other]
    if "preference" in verdict:
        out["preference"] = _FLIP[verdict["preference"]]
    if "expected" in verdict:
        out["expected"] = {flip.get(k, k): v for k, v in verdict["expected"].items()}
    return out


def unswap_preference(pref: str | None) -> str | None:
    """A preference given in the swapped order, mapped back (``"1"`` <-> ``"2"``)."""
    return _FLIP[pref]


def consistent(first: str | None, second_unswapped: str | None) -> bool | None:
    """Whether both orders reached the same verdict; None when either abstained."""
    if first is None or second_unswapped is None:
        return None
    return first == second_unswapped
