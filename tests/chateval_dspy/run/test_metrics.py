"""Agreement metrics against hand-computed values on tiny cases."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from chateval_dspy.run.metrics import (
    Estimate,
    accuracy,
    bootstrap,
    cohen_kappa,
    kappa,
    kendall,
    pairwise_report,
    pointwise_report,
    spearman,
)

HUMAN = ["1", "1", "2", "tie", "1", "2"]
PRED = ["1", "2", "2", "tie", None, "2"]  # one abstention


FEW = 300  # resamples: CIs stay meaningful, the suite stays fast


def kappa_by_hand(human, predicted):
    """Cohen's kappa from the confusion matrix: (p_o - p_e) / (1 - p_e); an abstention is its own class."""
    predicted = ["abstain" if p is None else p for p in predicted]
    classes = sorted(set(human) | set(predicted))
    n = len(human)
    pairs = list(zip(human, predicted, strict=True))
    confusion = {(a, b): pairs.count((a, b)) for a in classes for b in classes}
    p_o = sum(confusion[(c, c)] for c in classes) / n
    rows = {a: sum(confusion[(a, b)] for b in classes) for a in classes}
    cols = {b: sum(confusion[(a, b)] for a in classes) for b in classes}
    p_e = sum(rows[c] * cols[c] for c in classes) / n**2
    return (p_o - p_e) / (1 - p_e)


def test_accuracy_by_hand():
    assert accuracy(HUMAN, PRED) == pytest.approx(4 / 6)
    assert accuracy(["1", "2"], ["1", "2"]) == 1.0
    assert accuracy(["tie"], [None]) == 0.0  # an abstention is never right, not even against a human "tie"


def test_kappa_by_hand():
    # p_o = 4/6; human marginals 1:3 2:2 tie:1; predicted 1:1 2:3 tie:1 abstain:1; p_e = (3+6+1)/36
    assert kappa_by_hand(HUMAN, PRED) == pytest.approx(7 / 13)
    assert kappa(HUMAN, PRED) == pytest.approx(7 / 13)


@pytest.mark.parametrize("predicted", [
    ["2", "1", "2", "tie", "1", "1"],
    ["tie", "tie", "tie", "1", "2", "2"],
    ["1", "1", "2", "tie", "1", "2"],
    [None, "1", None, "2", "tie", "1"],
])
def test_kappa_matches_the_confusion_matrix_formula(predicted):
    assert kappa(HUMAN, predicted) == pytest.approx(kappa_by_hand(HUMAN, predicted))


def test_cohen_kappa_is_sklearns_on_every_case_it_defines():
    """The counted kappa equals ``sklearn.metrics.cohen_kappa_score`` on random draws of labels (few items, missing
    classes, labels outside the list), NaN where sklearn's is NaN; where sklearn refuses (no pair within the
    labels) it is NaN, which the bootstrap leaves out."""
    import warnings

    import numpy as np
    from sklearn.metrics import cohen_kappa_score

    rng, classes = np.random.default_rng(7), ["1", "2", "tie", "abstain"]
    for draw in range(600):
        n, labels = int(rng.integers(1, 12)), classes if draw % 3 else classes[:2]
        human = list(rng.choice(classes[:rng.integers(1, 4)], n))
        predicted = list(rng.choice(classes[:rng.integers(1, 5)], n))
        ours = cohen_kappa(human, predicted, labels)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                theirs = cohen_kappa_score(human, predicted, labels=labels)
            except ValueError:
                theirs = math.nan
        assert (math.isnan(ours) and math.isnan(theirs)) or ours == pytest.approx(theirs, abs=1e-12), (human, predicted)


def test_abstention_counts_as_disagreement():
    right = ["1", "2", "2", "tie", "1", "2"]
    abstained = ["1", "2", "2", "tie", None, "2"]
    assert accuracy(HUMAN, abstained) < accuracy(HUMAN, right)
    assert kappa(HUMAN, abstained) < kappa(HUMAN, right)
    report = pairwise_report(HUMAN, abstained, n_resamples=FEW)
    assert report["n"] == 6 and report["n_abstained"] == 1
    assert report["accuracy"].value == pytest.approx(4 / 6)  # the abstained item stays in the denominator


def test_spearman_and_kendall_by_hand():
    human, predicted = [1, 2, 3, 4], [1, 3, 2, 4]
    # rank differences d = 0, -1, 1, 0: rho = 1 - 6 * sum(d^2) / (n (n^2 - 1)) = 1 - 12 / 60
    assert spearman(human, predicted) == pytest.approx(0.8)
    # 6 pairs, one discordant (2<->3): tau = (5 - 1) / 6
    assert kendall(human, predicted) == pytest.approx(2 / 3)
    assert spearman(human, human[::-1]) == pytest.approx(-1.0)
    assert kendall(human, human[::-1]) == pytest.approx(-1.0)


def test_constant_predictions_have_no_correlation():
    assert math.isnan(spearman([1, 2, 3], [2, 2, 2]))
    assert math.isnan(kendall([1, 2, 3], [2, 2, 2]))
    assert math.isnan(spearman([3, 3, 3], [1, 2, 3]))
    assert math.isnan(spearman([1], [1]))


def test_ci_contains_the_point_estimate():
    human = ["1", "2", "tie", "1", "2"] * 4
    predicted = ["1", "2", "1", "1", "1"] * 4
    for est in (bootstrap(accuracy, human, predicted, n_resamples=FEW),
                bootstrap(kappa, human, predicted, n_resamples=FEW)):
        assert est.n == 20
        assert est.low <= est.value <= est.high
        assert est.low < est.high
    assert bootstrap(accuracy, human, predicted, n_resamples=FEW).value == pytest.approx(0.6)


def test_ci_is_nan_below_three_items():
    est = bootstrap(accuracy, ["1", "2"], ["1", "1"], n_resamples=FEW)
    assert est.value == 0.5 and est.n == 2
    assert math.isnan(est.low) and math.isnan(est.high)
    assert str(est) == "0.500 [no CI: n=2]"  # says why there is no interval
    empty = bootstrap(accuracy, [], [], n_resamples=FEW)
    assert math.isnan(empty.value) and str(empty) == "n/a"


def test_ci_is_deterministic_per_seed():
    human, predicted = ["1", "2", "tie", "1", "2"] * 3, ["1", "1", "tie", "2", "2"] * 3
    same = {"seed": 3, "n_resamples": FEW}
    assert bootstrap(accuracy, human, predicted, **same) == bootstrap(accuracy, human, predicted, **same)


def test_kappa_ci_defined_when_point_estimate_is_defined_on_few_items():
    est = bootstrap(kappa, ["1", "2", "1", "tie"], ["1", "2", "2", "tie"], n_resamples=FEW)
    assert est.value == pytest.approx(kappa_by_hand(["1", "2", "1", "tie"], ["1", "2", "2", "tie"]))
    assert not math.isnan(est.low) and not math.isnan(est.high)


def test_estimate_formatting():
    assert str(Estimate(0.5, 0.25, 0.75, 10)) == "0.500 [0.250, 0.750]"
    assert str(Estimate(math.nan, math.nan, math.nan, 0)) == "n/a"
    assert Estimate.from_dict(Estimate(0.5, 0.25, 0.75, 10).to_dict()) == Estimate(0.5, 0.25, 0.75, 10)


def test_majority_class_baseline():
    human = ["1"] * 5 + ["2"] * 3 + ["tie"] * 2
    predicted = ["2"] * 10
    report = pairwise_report(human, predicted, n_resamples=FEW)
    assert report["majority_class"] == "1"
    assert report["majority_accuracy"].value == pytest.approx(0.5)
    assert report["majority_kappa"].value == pytest.approx(0.0)  # a constant guess agrees only by chance
    assert report["accuracy"].value == pytest.approx(0.3)
    assert report["kappa"].value == pytest.approx(kappa_by_hand(human, predicted))


def test_faireval_majority_baseline_is_51_25_percent():
    human = ["1"] * 41 + ["2"] * 25 + ["tie"] * 14
    report = pairwise_report(human, human, n_resamples=FEW)
    assert report["majority_class"] == "1" and report["majority_accuracy"].value == pytest.approx(0.5125)
    assert report["accuracy"].value == 1.0 and report["kappa"].value == pytest.approx(1.0)
    assert Counter(human)["1"] / len(human) == 0.5125


ASPECTS = ("naturalness", "coherence", "engagingness", "groundedness")


def _scores(n, g):
    return {"naturalness": n, "coherence": n, "engagingness": 4 - n, "groundedness": g}


def test_pointwise_report_per_aspect_and_average():
    human = [_scores(1, 0), _scores(2, 1), _scores(3, 0), _scores(2.5, 1), _scores(1.5, 0)]
    predicted = [_scores(1, 0), _scores(3, 1), _scores(2, 0), None, _scores(1.5, 1)]
    report = pointwise_report(human, predicted, n_resamples=FEW)
    assert report["n"] == 4 and report["n_abstained"] == 1
    h = [1, 2, 3, 1.5]  # naturalness of the items with a verdict
    p = [1, 3, 2, 1.5]
    assert report["naturalness_spearman"].value == pytest.approx(spearman(h, p))
    assert report["naturalness_spearman"].value == pytest.approx(0.8)  # ranks as in the hand example
    assert report["engagingness_spearman"].value == pytest.approx(0.8)
    expected_avg = sum(report[f"{a}_spearman"].value for a in ASPECTS) / 4
    assert report["average_spearman"].value == pytest.approx(expected_avg)
    assert report["average_kendall"].value == pytest.approx(sum(report[f"{a}_kendall"].value for a in ASPECTS) / 4)


def test_pointwise_report_average_is_over_the_defined_aspects():
    human = [_scores(1, 0), _scores(2, 1), _scores(3, 0)]
    predicted = [_scores(1, 1), _scores(2, 1), _scores(3, 1)]  # groundedness constant
    report = pointwise_report(human, predicted, n_resamples=FEW)
    assert math.isnan(report["groundedness_spearman"].value)
    assert str(report["groundedness_spearman"]) == "n/a"
    assert report["naturalness_spearman"].value == pytest.approx(1.0)
    # one undefined aspect no longer blanks the headline: the mean of the other three, and it says how many
    defined = [report[f"{a}_spearman"].value for a in ASPECTS if a != "groundedness"]
    assert report["average_spearman"].value == pytest.approx(sum(defined) / 3)
    assert report["average_spearman_criteria"] == 3


def test_pointwise_report_all_abstained():
    report = pointwise_report([_scores(1, 0)] * 3, [None] * 3, n_resamples=FEW)
    assert report["n"] == 0 and report["n_abstained"] == 3
    assert math.isnan(report["average_kendall"].value)


def test_fewer_resamples_keep_the_figure_and_change_only_the_interval():
    rough = bootstrap(accuracy, HUMAN, PRED, n_resamples=50)
    fine = bootstrap(accuracy, HUMAN, PRED, n_resamples=FEW)
    assert rough.value == fine.value and (rough.low, rough.high) != (fine.low, fine.high)
