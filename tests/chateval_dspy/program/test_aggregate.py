"""Pure reductions from referees' verdicts to the panel's verdict."""

from __future__ import annotations

import pytest

from chateval_dspy.program.aggregate import majority, mean_scores, mode_scores, pairwise_verdict, pointwise_verdict, preference


@pytest.mark.parametrize(("s1", "s2", "expected"), [(7, 3, "1"), (3, 7, "2"), (5, 5, "tie"), (7, 7.0, "tie"),
                                                    (5.5, 5.4999, "1")])
def test_preference(s1, s2, expected):
    assert preference(s1, s2) == expected


@pytest.mark.parametrize(("votes", "expected"), [
    (["1"], "1"),
    (["1", "1", "2"], "1"),
    (["1", "2"], "tie"),                 # an even split between the leaders is a tie
    (["1", "2", "tie"], "tie"),          # three-way split
    (["1", "1", "2", "2", "tie"], "tie"),
    (["2", "2", "1", "tie"], "2"),
    (["tie", "tie", "1"], "tie"),
    ([None, "2"], "2"),                  # abstentions do not vote
    ([None, None, "1", "2"], "tie"),
    ([None, None, "1"], "1"),
    ([None], None),                      # nobody voted
    ([None, None], None),
    ([], None),
])
def test_majority(votes, expected):
    assert majority(votes) == expected


def test_majority_accepts_a_generator():
    assert majority(v for v in ["2", None, "2", "1"]) == "2"


def test_mean_scores_skips_abstentions():
    assert mean_scores([{"score_1": 8, "score_2": 4}, None, {"score_1": 6, "score_2": 6}]) == {"score_1": 7.0,
                                                                                              "score_2": 5.0}
    assert mean_scores([None, None]) is None
    assert mean_scores([]) is None
    three = [{"a": 1, "b": 0}, {"a": 2, "b": 1}, {"a": 2, "b": 1}]
    assert mean_scores(three) == pytest.approx({"a": 5 / 3, "b": 2 / 3})


def test_mode_scores_most_common_then_mean_of_ties():
    verdicts = [{"a": 3, "b": 1}, {"a": 3, "b": 2}, {"a": 1, "b": 3}, None]
    assert mode_scores(verdicts) == {"a": 3, "b": 2.0}  # b: 1, 2, 3 equally common -> their mean
    assert mode_scores([{"a": 1}, {"a": 2}]) == {"a": 1.5}
    assert mode_scores([None]) is None


def test_pairwise_verdict_mean_with_equal_means_is_a_tie():
    verdicts = [{"score_1": 9, "score_2": 5}, {"score_1": 5, "score_2": 9}]
    assert pairwise_verdict(verdicts, "mean") == ("tie", {"score_1": 7.0, "score_2": 7.0})


def test_pairwise_verdict_mean_versus_majority():
    verdicts = [{"score_1": 10, "score_2": 1}, {"score_1": 5, "score_2": 6}, {"score_1": 5, "score_2": 6}]
    pref_mean, means = pairwise_verdict(verdicts, "mean")
    pref_vote, means_vote = pairwise_verdict(verdicts, "majority")
    assert (pref_mean, pref_vote) == ("1", "2")
    assert means == means_vote == pytest.approx({"score_1": 20 / 3, "score_2": 13 / 3})


def test_pairwise_verdict_majority_split_and_abstention():
    verdicts = [{"score_1": 8, "score_2": 2}, {"score_1": 2, "score_2": 8}, None]
    assert pairwise_verdict(verdicts, "majority")[0] == "tie"
    assert pairwise_verdict([{"score_1": 4, "score_2": 4}, None], "majority")[0] == "tie"  # a tied referee votes tie


@pytest.mark.parametrize("how", ["mean", "majority"])
def test_pairwise_verdict_all_abstain(how):
    assert pairwise_verdict([None, None], how) == (None, None)


def test_pointwise_verdict_mean_vs_mode():
    verdicts = [{"naturalness": 3, "coherence": 1}, {"naturalness": 1, "coherence": 1},
                {"naturalness": 3, "coherence": 2}]
    assert pointwise_verdict(verdicts, "mean") == pytest.approx({"naturalness": 7 / 3, "coherence": 4 / 3})
    assert pointwise_verdict(verdicts, "majority") == {"naturalness": 3, "coherence": 1}
    assert pointwise_verdict([None], "mean") is None and pointwise_verdict([None], "majority") is None
