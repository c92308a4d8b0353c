"""Position calibration as inverse functions: swap the answers, unswap the verdicts."""

from __future__ import annotations

import pytest

from chateval_dspy.program.calibration import consistent, swap, unswap_preference, unswap_scores


def test_swap_exchanges_answers_and_keeps_the_rest():
    item = {"question": "q", "answer_1": "a", "answer_2": "b", "extra": 1}
    swapped = swap(item)
    assert swapped == {"question": "q", "answer_1": "b", "answer_2": "a", "extra": 1}
    assert item["answer_1"] == "a"  # the input is not mutated
    assert swap(swapped) == item


def test_unswap_scores_maps_back_to_original_answers():
    verdict = {"score_1": 9, "score_2": 2}
    assert unswap_scores(verdict) == {"score_1": 2, "score_2": 9}
    assert verdict == {"score_1": 9, "score_2": 2}
    assert unswap_scores(unswap_scores(verdict)) == verdict
    assert unswap_scores(None) is None


@pytest.mark.parametrize(("pref", "back"), [("1", "2"), ("2", "1"), ("tie", "tie"), (None, None)])
def test_unswap_preference(pref, back):
    assert unswap_preference(pref) == back


@pytest.mark.parametrize(("first", "second", "expected"), [
    ("1", "1", True), ("tie", "tie", True), ("1", "2", False), ("2", "tie", False),
    (None, "1", None), ("1", None, None),
])
def test_consistent(first, second, expected):
    assert consistent(first, second) is expected
