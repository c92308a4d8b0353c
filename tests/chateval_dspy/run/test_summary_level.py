"""Summary-level figures: each states the documents it rests on, and the vectorised bootstrap is the
resampling it replaced (scipy's, per resample), not an approximation of it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from chateval_dspy.program.task import TaskSpec
from chateval_dspy.run import metrics
from chateval_dspy.run.metrics import Estimate, bootstrap, defined_mean, group_correlations, mean_bootstraps
from chateval_dspy.run.table import coverage_notes, summary_table
from optim.tracking.runs import metric_values

TWO = TaskSpec.from_dict({
    "name": "se", "format": "pointwise", "inputs": [{"name": "summary", "judged": True}],
    "criteria": [{"name": "coherence", "description": "organised?", "scale": "1-5"},
                 {"name": "fluency", "description": "well formed?", "scale": "1-5"}]})


def close(a: Estimate, b: Estimate) -> bool:
    pairs = ((a.value, b.value), (a.low, b.low), (a.high, b.high))
    return a.n == b.n and all((math.isnan(x) and math.isnan(y)) or abs(x - y) < 1e-12 for x, y in pairs)


# ---- the bootstrap -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_the_vectorised_bootstrap_is_scipys_resampling_of_the_per_group_figures(seed):
    rng = np.random.default_rng(seed)
    values = rng.uniform(-1, 1, 37)
    old = bootstrap(defined_mean, list(values), seed=seed, n_resamples=500)  # what a summary figure called before
    new = mean_bootstraps({"x": values}, seed=seed, n_resamples=500)["x"]
    assert close(old, new), (old, new)


def test_the_vectorised_average_over_criteria_is_the_old_joint_resampling():
    rng = np.random.default_rng(3)
    columns = rng.uniform(-1, 1, (3, 25))
    columns[0, [2, 5, 9]] = np.nan  # a criterion undefined in some documents
    columns[2, 4] = np.nan

    def average(*cols):
        return defined_mean([defined_mean(c) for c in cols])

    old = bootstrap(average, *map(list, columns), seed=0, n_resamples=400)
    new = mean_bootstraps({"avg": columns}, seed=0, n_resamples=400)["avg"]
    assert close(old, new), (old, new)


def test_figures_over_too_few_groups_have_no_interval():
    out = mean_bootstraps({"two": [0.1, 0.5], "none": np.empty(0), "three": [0.1, 0.2, 0.3]}, n_resamples=50)
    assert out["two"].value == pytest.approx(0.3) and math.isnan(out["two"].low) and out["two"].n == 2
    assert math.isnan(out["none"].value) and out["none"].n == 0
    assert not math.isnan(out["three"].low)


def test_the_blocks_of_resamples_do_not_change_the_draws(monkeypatch):
    values = np.random.default_rng(5).uniform(-1, 1, 40)
    whole = mean_bootstraps({"x": values}, n_resamples=300)["x"]
    monkeypatch.setattr(metrics, "STEP_ELEMENTS", 40 * 7)  # blocks of 7 resamples, the last one short
    assert mean_bootstraps({"x": values}, n_resamples=300)["x"] == whole


# ---- the per-group correlations ------------------------------------------------------------------------------------


def scipy_per_group(h, p, codes, n_groups, fn) -> list[float]:
    out = []
    for g in range(n_groups):
        rows = [i for i in range(len(h)) if codes[i] == g and not math.isnan(h[i])]
        x, y = np.array([h[i] for i in rows]), np.array([p[i] for i in rows])
        constant = len(x) < 2 or np.all(x == x[0]) or np.all(y == y[0])
        out.append(math.nan if constant else float(fn(x, y).statistic))
    return out


@pytest.mark.parametrize("stat,fn", [("spearman", stats.spearmanr), ("kendall", stats.kendalltau)])
def test_per_group_correlations_are_scipys(stat, fn, monkeypatch):
    rng = np.random.default_rng(11)
    sizes = [1, 2, 3, 3, 5, 8, 8, 12, 30, 4]  # one item, ties, a constant group (below), a large one
    codes = np.repeat(np.arange(len(sizes)), sizes)
    rng.shuffle(codes)  # groups interleaved, as rows of a file are
    h = rng.integers(1, 4, len(codes)).astype(float)
    p = rng.integers(1, 6, len(codes)).astype(float)
    h[codes == 9] = 2.0  # constant human scores: undefined
    h[rng.random(len(codes)) < 0.1] = np.nan  # labels missing here and there
    monkeypatch.setattr(metrics, "MAX_PAIRED_GROUP", 10)  # the 12- and 30-item groups take scipy's path
    got = group_correlations(h, p, codes, len(sizes), stat)
    expected = scipy_per_group(h, p, codes, len(sizes), fn)
    assert np.allclose(got, expected, rtol=0, atol=1e-12, equal_nan=True), (got, expected)
    assert math.isnan(got[0]) and math.isnan(got[9])


# ---- the denominator of each figure ------------------------------------------------------------------------------


def four_documents():
    """Four documents of four summaries; in doc3 every coherence score is 3 (no correlation there)."""
    human, predicted, groups = [], [], []
    for d in range(4):
        for s in range(4):
            human.append({"coherence": 3 if d == 3 else 1 + (s * (d + 1)) % 5, "fluency": 1 + (s + d) % 5})
            predicted.append({"coherence": 1 + s, "fluency": 5 - s})
            groups.append(f"doc{d}")
    return human, predicted, groups


def test_each_summary_figure_says_how_many_documents_it_rests_on():
    human, predicted, groups = four_documents()
    report = metrics.pointwise_report(human, predicted, task=TWO, groups=groups, n_resamples=100)
    assert report["n_groups"] == 4
    assert report["coherence_spearman_summary"].n == 3 and report["fluency_spearman_summary"].n == 4
    assert report["average_spearman_summary"].n == 4  # doc3 still has fluency
    notes = "\n".join(coverage_notes(report))
    assert "coherence_spearman_summary within each of 3 of 4 documents" in notes
    assert "fluency_kendall_summary within each of 4 of 4 documents" in notes
    assert "within each of 4 documents" not in notes  # no longer claims all of them
    logged = metric_values(report)
    assert logged["coherence_spearman_summary_n"] == 3.0 and logged["fluency_spearman_summary_n"] == 4.0
    assert logged["n_groups"] == 4.0
    table = summary_table(report, {}, {"model": "fake"})
    assert "coherence_spearman_summary within each of 3 of 4 documents" in table


def test_where_every_document_counts_the_note_says_so_once():
    human, predicted, groups = four_documents()
    for h in human:
        h["coherence"] = h["fluency"]
    report = metrics.pointwise_report(human, predicted, task=TWO, groups=groups, n_resamples=100)
    assert "summary-level (_summary): correlation within each of 4 documents, averaged over those where defined" \
        in coverage_notes(report)
