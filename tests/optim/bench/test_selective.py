"""Selective verdicts: a threshold with Trust or Escalate's guarantee, and item difficulty in the
simulated referees that makes a panel's confidence carry information."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from chateval_dspy.testing.fake_lm import Call
from chateval_dspy.testing.sim_lm import SimKnobs, SimReferees, label_table, synthetic_items
from optim.bench.main import main as bench_main
from optim.tuning.selective import ABSTAINED, choose_cascade_thresholds, choose_threshold, route, select


def binomial_cdf(k: int, n: int, alpha: float) -> float:
    """P(Binomial(n, alpha) <= k), by hand."""
    return sum(math.comb(n, j) * alpha ** j * (1 - alpha) ** (n - j) for j in range(k + 1))


# 50 labelled items: (confidence, how many, how many of them disagree with people)
GROUPS = [(0.99, 20, 0), (0.9, 10, 1), (0.8, 5, 2), (0.7, 15, 0)]


def labelled(groups=GROUPS) -> tuple[list[float], list[bool]]:
    conf, agreed = [], []
    for c, n, wrong in groups:
        conf += [c] * n
        agreed += [False] * wrong + [True] * (n - wrong)
    return conf, agreed


def test_the_threshold_matches_a_hand_computation_of_the_exact_binomial_test():
    # level 0.85: H0 "disagreement > 0.15"; p = P(Binomial(n, 0.15) <= k) at each threshold, from the top down.
    assert binomial_cdf(0, 20, 0.15) == pytest.approx(0.03876, abs=1e-5)  # >= 0.99: n=20, k=0 -> passes
    assert binomial_cdf(1, 30, 0.15) == pytest.approx(0.04803, abs=1e-5)  # >= 0.9:  n=30, k=1 -> passes
    assert binomial_cdf(3, 35, 0.15) == pytest.approx(0.20882, abs=1e-5)  # >= 0.8:  n=35, k=3 -> fails: stop
    assert binomial_cdf(3, 50, 0.15) == pytest.approx(0.04605, abs=1e-5)  # >= 0.7 would pass, but is never reached
    s = choose_threshold(*labelled(), level=0.85, risk=0.1, min_items=1)
    assert s.threshold == 0.9
    assert (s.coverage.value, s.coverage.n) == (0.6, 50)
    ci = stats.binomtest(30, 50).proportion_ci(confidence_level=0.95, method="exact")
    assert (s.coverage.low, s.coverage.high) == pytest.approx((ci.low, ci.high))
    assert s.agreement.value == pytest.approx(29 / 30) and s.best_level is None
    assert "at least 85.0%" in s.describe() and ">= 0.9 " in s.describe()


def test_by_default_thresholds_with_fewer_than_30_items_above_are_not_tested():
    # 0.99 holds 20 items: skipped; 0.9 (n=30, k=1) passes, 0.8 fails: the same threshold, found from 0.9 down.
    assert choose_threshold(*labelled(), level=0.85, risk=0.1).threshold == 0.9
    # At risk 0.04 the test at 0.9 fails (p = 0.048); with the top included, 0.99 (p = 0.039) would have passed.
    assert choose_threshold(*labelled(), level=0.85, risk=0.04).threshold is None
    assert choose_threshold(*labelled(), level=0.85, risk=0.04, min_items=1).threshold == 0.99


def test_an_unreachable_level_is_reported_with_the_best_reachable_one_not_silently_lowered():
    conf, agreed = labelled()
    s = choose_threshold(conf, agreed, level=0.95, risk=0.1)
    assert s.threshold is None and not s.reached and s.coverage.value == 0.0
    assert s.best_level is not None and s.best_level < 0.95
    assert choose_threshold(conf, agreed, level=s.best_level, risk=0.1).reached
    assert not choose_threshold(conf, agreed, level=round(s.best_level + 0.001, 3), risk=0.1).reached
    line = s.describe()
    assert "cannot be guaranteed" in line and f"{s.best_level:.1%}" in line and ABSTAINED in line
    assert select(conf, s) == [False] * len(conf)


def test_five_perfect_verdicts_cannot_guarantee_85_percent():
    # Even with no disagreement, P(Binomial(5, 0.15) <= 0) = 0.85^5 = 0.444 > 0.1; 0.630^5 = 0.0992 is the best.
    s = choose_threshold([0.9] * 5, [True] * 5, level=0.85, risk=0.1, min_items=1)
    assert s.threshold is None and s.best_level == 0.63
    assert choose_threshold([0.9] * 5, [True] * 5, level=0.85, risk=0.1).best_level is None  # under 30 items
    assert "no level can be guaranteed" in choose_threshold([0.9] * 5, [True] * 5, level=0.85, risk=0.1).describe()


def test_select_gives_verdicts_at_or_above_the_threshold_and_abstains_on_the_rest():
    s = choose_threshold(*labelled(), level=0.85, risk=0.1)
    assert select([0.99, 0.9, 0.89, 0.1, None, math.nan], s) == [True, True, False, False, False, False]


@pytest.mark.parametrize("conf,agreed,kw,message", [
    ([0.5, math.nan], [True, True], {}, r"confidence\[1\] is nan"),
    ([0.5], [True, False], {}, "one of each per item"),
    ([0.5], ["yes"], {}, r"agreed\[0\] is 'yes'"),
    ([0.5], [True], {"level": 1.0}, "level must lie strictly between 0 and 1"),
    ([0.5], [True], {"risk": 0.0}, "risk must lie strictly between 0 and 1"),
])
def test_bad_calibration_data_gets_a_clear_error(conf, agreed, kw, message):
    with pytest.raises(ValueError, match=message):
        choose_threshold(conf, agreed, **{"level": 0.85, "risk": 0.1, **kw})


def test_a_cascade_splits_the_risk_and_calibrates_each_stage_on_the_items_that_reach_it():
    cheap = ([0.9] * 40 + [0.6] * 40, [True] * 40 + [False] * 40)
    panel = ([0.6] * 40 + [0.95] * 40, [False] * 40 + [True] * 40)  # sure and right exactly where the cheap one fails
    c = choose_cascade_thresholds([cheap, panel], level=0.85, risk=0.2)
    assert [s.risk for s in c.stages] == [0.1, 0.1]
    assert [s.threshold for s in c.stages] == [0.9, 0.95]
    assert [s.n_calibration for s in c.stages] == [80, 40]  # the panel saw only what the cheap stage declined
    assert (c.coverage.value, c.agreement.value) == (1.0, 1.0)
    assert route([[0.9, 0.6, 0.6], [0.1, 0.95, 0.5]], c) == [0, 1, None]


# ---- item difficulty in the simulated referees

def verdicts(knobs: SimKnobs, n: int, seed: int = 7) -> tuple[list[str], list[float], list[bool]]:
    """The preference each of ``n`` items gets from one referee, the items' difficulty and whether it was right."""
    items = synthetic_items(n, seed=seed)
    referees = SimReferees(knobs, label_table(items))
    prefs, difficulty, right = [], [], []
    for x in items:
        call = Call("", "", ["evidence", "preference", "score_1", "score_2"],
                    {"question": x.question, "answer_1": x.answer_1, "answer_2": x.answer_2, "persona": "p"})
        prefs.append(referees(call)["preference"])
        difficulty.append(referees.difficulty(x.question, x.answer_1, x.answer_2))
        right.append(prefs[-1] == x.label)
    return prefs, difficulty, right


def test_a_zero_difficulty_spread_leaves_every_verdict_as_before():
    # Pinned from the simulator before difficulty existed (same seed, items and persona).
    before = "1211211212121211221222211111222111221221"
    assert "".join(verdicts(SimKnobs(seed=3, position_bias=0.1), 40)[0]) == before
    assert "".join(verdicts(SimKnobs(seed=3, position_bias=0.1, difficulty_spread=0.0), 40)[0]) == before
    assert "".join(verdicts(SimKnobs(seed=3, position_bias=0.1, difficulty_spread=1.0), 40)[0]) != before


def within(k: int, n: int, p: float) -> bool:
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.99, method="exact")
    return ci.low <= p <= ci.high


def test_difficulty_pulls_a_referee_towards_a_coin_on_hard_items():
    _, d, right = verdicts(SimKnobs(default_accuracy=0.9, difficulty_spread=1.0), 2000)
    hard = [r for r, x in zip(right, d) if x > 0.8]
    easy = [r for r, x in zip(right, d) if x < 0.2]
    # p_item = 0.5 + 0.4 * (1 - d): mean 0.54 over d in [0.8, 1], 0.86 over [0, 0.2], 0.7 over all.
    assert within(sum(hard), len(hard), 0.54) and within(sum(easy), len(easy), 0.86)
    assert within(sum(right), 2000, 0.7) and not within(sum(right), 2000, 0.9)


def test_difficulty_belongs_to_the_item_and_keeps_common_random_numbers():
    referees = SimReferees(SimKnobs(difficulty_spread=0.5), {})
    d = referees.difficulty("q", "a", "b")
    assert d == referees.difficulty("q", "b", "a") and 0.0 <= d < 0.5
    _, _, weaker = verdicts(SimKnobs(default_accuracy=0.6, difficulty_spread=1.0), 400)
    _, _, stronger = verdicts(SimKnobs(default_accuracy=0.8, difficulty_spread=1.0), 400)
    assert all(s for w, s in zip(weaker, stronger) if w)  # raising p turns wrong verdicts right, never the reverse
    assert sum(stronger) > sum(weaker)


def test_the_benchmark_runs_both_rows(capsys):
    assert bench_main(["selective", "--draws", "3", "--calibration", "200", "--fresh", "50"]) == 0
    out = capsys.readouterr().out
    assert "exchangeable" in out and "control" in out and "target:" in out
