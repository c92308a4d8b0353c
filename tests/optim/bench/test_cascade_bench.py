"""The cascade benchmarks: the simulation (``python -m optim.bench cascade``) and the billing-fake
table (``python -m optim.bench cascade-billing``) run at a small size, and their figures are consistent with one
another: shares in [0, 1] that sum, per-stage counts that add up, and cost ratios that follow from the printed counts.
"""

from __future__ import annotations

import argparse
import json
import math
import re

import numpy as np
import pytest

from optim.bench import cascade as sim
from optim.bench import cascade_billing as billing
from optim.bench.selective import D_GRID


def sim_args(**over) -> argparse.Namespace:
    values = {"draws": 20, "calibration": 300, "fresh": 300, "level": None, "risk": 0.1, "cheap_accuracies": "0.9",
              "panel_cost": 4.0, "evidence": "votes", "hard": 1.0, "easy": 0.4, "seed": 0, "out": None}
    return argparse.Namespace(**{**values, **over})


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """The simulation's rows (JSON) and its printed text."""
    import contextlib
    import io

    out = tmp_path_factory.mktemp("cascade") / "rows.json"
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        assert sim.run_cascade(sim_args(out=str(out))) == 0
    return json.loads(out.read_text(encoding="utf-8")), text.getvalue()


def test_the_exact_population_is_a_distribution_and_the_panel_rate_is_its_own():
    cheap, panel = sim.stages(0.8)
    pop = sim.Population(cheap, panel, 1.0)
    assert pop.prob.sum() == pytest.approx(1.0)
    d = (np.arange(D_GRID) + 0.5) / D_GRID
    alone = panel.outcome_rates(d).mean(axis=1)[panel.score(panel.outcomes) > 0].sum()
    assert pop.alone()[1] == pytest.approx(alone)


def test_token_evidence_exact_rates_match_drawn_items():
    """The token population's integral over ``d`` is what drawing items gives, thresholds and maps fixed."""
    from chateval_dspy.program.confidence import ConfidenceMap

    pair = sim.stages(0.8, "tokens")
    pop = sim.population(pair, 1.0)
    maps = [ConfidenceMap(raw=(0.5, 0.9, 1.0), calibrated=(0.4, 0.7, 0.95), method="isotonic", n=10)] * 2
    thresholds = [0.8, 0.6]
    exact = pop.rates(maps, thresholds, 4.0)
    rng = np.random.default_rng(1)
    d = rng.random(200_000)
    (c1, a1), (c2, a2) = pair[0].draw(rng, d), pair[1].draw(rng, d)
    conf = (sim.mapped(maps[0], c1), sim.mapped(maps[1], c2))
    drawn = sim.rates(sim.leaves(conf, thresholds), (a1, a2), np.ones(d.size), 4.0)
    for key in ("stage1", "stage2", "person", "agreement"):
        assert exact[key] == pytest.approx(drawn[key], abs=0.005), key
    assert pop.alone()[1] == pytest.approx(float(a2.mean()), abs=0.005)


def test_a_score_cutoff_is_where_the_mapped_confidence_reaches_the_threshold():
    from chateval_dspy.program.confidence import ConfidenceMap

    cmap = ConfidenceMap(raw=(0.6, 0.8), calibrated=(0.5, 0.9), method="isotonic", n=10)
    c = sim.score_cutoff(cmap, 0.7)  # halfway: raw 0.7
    assert c == pytest.approx(np.log(0.7 / 0.3))
    assert sim.mapped(cmap, sim.confidence(np.array([c - 1e-6, c + 1e-6]))).tolist() == pytest.approx([0.7, 0.7])
    assert sim.score_cutoff(cmap, 0.95) == np.inf and sim.score_cutoff(cmap, None) == np.inf
    assert sim.score_cutoff(cmap, 0.5) == 0.0  # every item clears it


def test_an_item_leaves_at_its_first_stage_that_keeps_it():
    conf = (np.array([0.9, 0.5, 0.5, 0.9]), np.array([0.9, 0.9, 0.1, 0.1]))
    assert sim.leaves(conf, [0.8, 0.8]).tolist() == [0, 1, -1, 0]
    assert sim.leaves(conf, [None, 0.8]).tolist() == [1, 1, -1, -1]


def test_simulated_rows_are_consistent(simulated):
    rows, _ = simulated
    assert [r["row"] for r in rows] == ["exchangeable", "control"]
    for r in rows:
        shares = r["shares"]
        assert all(0.0 <= shares[k] <= 1.0 for k in shares)
        assert shares["stage1"] + shares["stage2"] + shares["person"] == pytest.approx(1.0)
        assert shares["coverage"] == pytest.approx(shares["stage1"] + shares["stage2"])
        assert r["units_per_item"] == pytest.approx(1 + r["panel_cost"] * (1 - shares["stage1"]))
        assert r["cost_ratio"] == pytest.approx(r["units_per_item"] / shares["coverage"] / r["panel_cost"])
        assert 0.0 <= r["coverage"]["p2_5"] <= r["coverage"]["value"] <= r["coverage"]["p97_5"] <= 1.0
        assert r["held"]["ci_low"] <= r["held"]["value"] <= r["held"]["ci_high"] and r["held"]["n"] == r["draws"]
        # The level asked for is the panel's agreement on every item, rounded down.
        assert r["level"] <= r["panel_alone"]["agreement"] < r["level"] + 0.001


def test_the_guarantee_holds_where_promised_and_the_control_shows_where_it_fails(simulated):
    rows, _ = simulated
    exchangeable, control = rows
    assert exchangeable["held"]["value"] >= 1 - exchangeable["risk"]
    assert control["held"]["value"] < exchangeable["held"]["value"]
    assert exchangeable["agreement"]["value"] >= exchangeable["level"]


def test_the_printed_cost_ratio_follows_from_the_printed_counts(simulated):
    rows, text = simulated
    printed = [line for line in text.splitlines() if line.startswith(("exchangeable", "control"))]
    assert len(printed) == len(rows)
    for line, r in zip(printed, rows):
        stage1, stage2, person = (float(x) for x in re.search(r"(\d\.\d+)/(\d\.\d+)/(\d\.\d+)", line).groups())
        units_item, units_verdict, ratio = (float(x) for x in re.search(r"(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)x$",
                                                                        line).groups())
        assert stage1 + stage2 + person == pytest.approx(1.0, abs=0.002)
        assert units_item == pytest.approx(1 + r["panel_cost"] * (1 - stage1), abs=0.01)
        assert ratio == pytest.approx(units_item / (stage1 + stage2) / r["panel_cost"], abs=0.01)
        assert units_verdict == pytest.approx(ratio * r["panel_cost"], abs=0.01)


def test_bad_arguments_are_refused(capsys):
    assert sim.run_cascade(sim_args(draws=0)) == 2
    assert sim.run_cascade(sim_args(cheap_accuracies="0.4")) == 2
    assert sim.run_cascade(sim_args(evidence="logits")) == 2
    assert "strictly between 0.5 and 1" in capsys.readouterr().out


def billing_args(tmp_path, **over) -> argparse.Namespace:
    values = {"models": ["openai/gpt-4o-mini"], "limit": 8, "seed": 0, "level": 0.8, "risk": 0.1,
              "fixed_threshold": 0.75, "embedded_limit": 0, "threads": None, "work_dir": str(tmp_path / "work"),
              "out": str(tmp_path / "billing.json")}
    return argparse.Namespace(**{**values, **over})


@pytest.mark.slow
def test_the_billing_table_counts_add_up(tmp_path, capsys):
    """FairEval through the real LM path to the OpenAI-rule fake: each stage's counts, calls and dollars add up."""
    assert billing.run_cascade_billing(billing_args(tmp_path)) == 0
    report = json.loads((tmp_path / "billing.json").read_text(encoding="utf-8"))
    model = report["models"][0]
    n = model["items"]["check"]
    assert model["items"]["calibration"] + n == 8
    assert all(s["threshold"] is None for s in model["chosen"]["selection"])  # 4 items: the exact test cannot pass
    for key in ("chosen", "illustrative"):
        single, panel = model[key]["stages"]
        assert single["reached"] == n and single["alone_calls"] == 2 * n and panel["alone_calls"] == 8 * n
        assert panel["reached"] == n - single["left"] and panel["calls"] == 8 * panel["reached"]
        given = single["left"] + panel["left"]
        assert model[key]["coverage"]["n"] == n and model[key]["coverage"]["value"] == pytest.approx(given / n)
        cascade = model[key]["per_1000"]["cascade"]
        if given:
            assert cascade["value"] == pytest.approx(1000 * (single["usd"] + panel["usd"]) / given)
        assert model[key]["per_1000"]["last_stage"]["value"] == pytest.approx(1000 * panel["alone_usd"] / n)
    assert model["illustrative"]["coverage"]["value"] == 1.0  # the panel keeps every verdict at threshold 0
    text = capsys.readouterr().out
    assert "ILLUSTRATIVE" in text and "not reached" in text and not math.isnan(model["wall_seconds"])


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:this evaluator was compiled for:UserWarning")  # saved for gpt-4o-mini, on purpose
def test_the_embedded_model_runs_the_saved_cascade_and_every_verdict_parses(tmp_path):
    """The saved cascade through ``load()`` on the embedded model (Gemma 270M): one item, parsed."""
    assert billing.run_cascade_billing(billing_args(tmp_path, limit=4, embedded_limit=1)) == 0
    embedded = json.loads((tmp_path / "billing.json").read_text(encoding="utf-8"))["embedded"]
    assert embedded["items"] == 1 and embedded["parsed"] == 1
    row = embedded["rows"][0]
    assert row["stages_run"][0] == "single" and row["calls"] >= 2
