"""Smoke tests of the benchmark suites (``python -m optim.bench``) on the scripted fake LM, plus their statistics.

The fake LM reaches the suites through ``main(..., lm_factory=...)``, a function argument: no
command-line flag maps a model name to it.
"""

from __future__ import annotations

import contextlib
import json

import dspy
import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.loaders import load_faireval
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.testing.fake_lm import fake_lm
from optim.bench import main as bench
from optim.bench.catalogue import MultipleEvidence, choose
from optim.bench.injection import INJECTIONS, build_variants, flip_stats
from optim.bench.stats import mcnemar, proportion


@pytest.fixture(autouse=True)
def _quick(monkeypatch, tmp_path):
    monkeypatch.setenv("CHATEVAL_CACHE_DIR", str(tmp_path / "cache"))  # isolate_cache() overwrites it; undone after


FEW = 40  # bootstrap resamples: a smoke test checks plumbing, not interval precision


def run_suite(argv, lm=None, capsys=None):
    lm = lm or fake_lm()
    argv = [*argv, "--resamples", str(FEW)]
    assert bench.main(argv, lm_factory=lambda slots: contextlib.nullcontext(lm)) == 0
    return lm


def test_agreement_faireval_two_items(tmp_path, capsys):
    out = tmp_path / "agreement.json"
    argv = ["agreement", "--dataset", "faireval", "--limit", "2", "--configs", "majority,single,mec_bpc,chateval",
            "--work-dir", str(tmp_path / "raw"), "--out", str(out), "--markdown"]
    lm = run_suite(argv)
    report = json.loads(out.read_text())
    names = [r["name"] for r in report["rows"]]
    assert names == ["majority", "single", "mec_bpc", "chateval"]
    assert report["header"]["n"] == 2 and report["header"]["model"] == "fake/scripted" and report["header"]["date"]
    rows = {r["name"]: r for r in report["rows"]}
    assert rows["chateval"]["cost"]["calls_per_item"] == 8
    assert rows["mec_bpc"]["cost"]["calls_per_item"] == 6  # k=3 samples x both orders
    assert rows["chateval"]["vs_single"]["test"] == "exact McNemar"
    assert {c.config["temperature"] for c in lm.engine.calls} == {0.0, 1.0}
    printed = capsys.readouterr().out
    assert "| configuration |" in printed and "model: fake/scripted" in printed and "n: 2" in printed
    # A rerun resumes from the per-item files: no LM call at all.
    again = run_suite(argv)
    assert again.engine.calls == []


def test_agreement_topical_chat_scoring_rows(tmp_path):
    out = tmp_path / "agreement.json"
    run_suite(["agreement", "--dataset", "topical_chat", "--limit", "2", "--configs", "single,chateval",
               "--work-dir", str(tmp_path / "raw"), "--out", str(out)])
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert "average_spearman" in rows["chateval"]["metrics"]
    assert rows["chateval"]["vs_single"]["test"] == "paired bootstrap"


def test_text_baselines_score_the_reference_perfectly():
    pytest.importorskip("rouge_score")
    pytest.importorskip("sacrebleu")
    from chateval_dspy.data.loaders import load_topical_chat
    from optim.bench.text import REFERENCE_SYSTEM, text_scores

    items = load_topical_chat()[:6]
    for name in ("rouge_l", "bleu_4"):
        scores, _ = text_scores(name, items, items)
        ref = next(x for x in items if x.system == REFERENCE_SYSTEM)
        assert scores[str(ref.id)] == pytest.approx(1.0)
        assert all(0 <= s <= 1 for s in scores.values())


@pytest.mark.slow
def test_cost_suite_two_items(tmp_path, capsys):
    out = tmp_path / "cost.json"
    run_suite(["cost", "--limit", "2", "--configs", "single,chateval,consensus_stop", "--concurrency-levels", "1,2",
               "--overhead-items", "3", "--fake-latency", "0.002", "--rss-sizes", "2,3", "--out", str(out), "--markdown"])
    report = json.loads(out.read_text())
    assert [c["name"] for c in report["configs"]] == ["single", "chateval", "consensus_stop"]
    assert report["configs"][1]["calls_per_item"] == 8
    assert report["overhead"]["calls"] == 3 * 8 and report["overhead"]["overhead_ms_per_call"] > 0
    assert [r["items"] for r in report["rss"]] == [2, 3]
    assert report["rss"][0]["max_rss_mb"] > 10 and report["rss"][1]["lm_history_entries"] == 0
    assert [t["concurrency"] for t in report["throughput"][0]["levels"]] == [1, 2]
    assert {t["met"] for t in report["targets"]} <= {True, False, None}
    assert "Targets" in capsys.readouterr().out


def test_injection_suite_two_items(tmp_path, capsys):
    out = tmp_path / "injection.json"
    run_suite(["injection", "--limit", "2", "--config", "single_calibrated", "--work-dir", str(tmp_path / "raw"),
               "--out", str(out), "--markdown"])
    report = json.loads(out.read_text())
    kinds = {k["kind"]: k for k in report["kinds"]}
    assert set(kinds) == {*INJECTIONS, "any"}
    assert kinds["any"]["variants"] == 2 * len(INJECTIONS) * 2
    # The default fake judges by answer length, so any appended text can only help the injected answer.
    assert kinds["any"]["margin_shift"]["value"] >= 0
    assert "flip rate" in capsys.readouterr().out


def test_variants_are_deterministic_skip_ties_and_target_the_worse_answer():
    items = load_faireval()[:12]
    a, b = build_variants(items), build_variants(items)
    assert [(v.id, v.answer_1, v.answer_2) for v in a] == [(v.id, v.answer_1, v.answer_2) for v in b]
    winners = [x for x in items if x.label in ("1", "2")]
    assert len(a) == len(winners) * len(INJECTIONS) * 2
    for v in a:
        original = next(x for x in items if str(x.id) == v.base_id)
        assert v.target != original.label
        assert v[f"answer_{v.target}"] != original[f"answer_{v.target}"]
        other = "1" if v.target == "2" else "2"
        assert v[f"answer_{other}"] == original[f"answer_{other}"]


def test_flip_is_counted_only_toward_the_injected_answer():
    v = [dspy.Example(base_id=str(i), target="2", kind="k") for i in range(3)]
    clean = {"0": {"prediction": "1", "score_1": 8, "score_2": 2}, "1": {"prediction": "tie", "score_1": 5, "score_2": 5},
             "2": {"prediction": "2", "score_1": 2, "score_2": 8}}
    injected = [(v[0], {"prediction": "tie", "score_1": 5, "score_2": 5}),   # toward: flip
                (v[1], {"prediction": "1", "score_1": 6, "score_2": 5}),     # away: no flip
                (v[2], {"prediction": "2", "score_1": 1, "score_2": 9})]     # already preferred: not eligible
    s = flip_stats(clean, injected, n_resamples=FEW)
    assert (s["eligible"], s["flips"]) == (2, 1)
    assert s["margin_shift"]["value"] == pytest.approx((6 - 1 + 2) / 3)  # margins -6,0,6 -> 0,-1,8


def test_mcnemar_and_exact_interval():
    ref = {str(i): i < 5 for i in range(10)}
    row = {str(i): True for i in range(10)}
    m = mcnemar(ref, row)
    assert (m["reference_only"], m["row_only"], m["delta_accuracy"]) == (0, 5, 0.5)
    assert m["p"] == pytest.approx(2 * 0.5 ** 5)
    p = proportion(0, 8)
    assert p["value"] == 0 and p["ci_low"] == 0 and 0.3 < p["ci_high"] < 0.4


def test_mec_samples_at_temperature_one_and_averages(run):
    cfg = DebateConfig(roles=("general_public",), turns=1, calibrate=True)
    lm = fake_lm()
    pred = run(MultipleEvidence(build_evaluator(cfg), k=3), lm, question="q", answer_1="short", answer_2="a much longer answer")
    assert pred.calls == 6 and len(lm.engine.calls) == 6
    assert {c.config["temperature"] for c in lm.engine.calls} == {1.0}
    assert pred.preference == "2" and pred.consistent is True and len(pred.referees) == 3


def test_config_sets_always_hold_the_single_agent():
    assert [e.name for e in choose("chateval", "pairwise")] == ["single", "chateval"]
    with pytest.raises(Exception, match="unknown configuration"):
        choose("nope", "pairwise")


def test_a_saved_program_is_a_row(tmp_path):
    from chateval_dspy.deploy.saved.card import make_card
    from chateval_dspy.deploy.saved.store import save_program

    program = build_evaluator(DebateConfig(roles=("critic",), turns=1))
    save_program(program, tmp_path / "prog", make_card(program, model="fake/scripted", optimizer="labeled"))
    out = tmp_path / "agreement.json"
    run_suite(["agreement", "--dataset", "faireval", "--limit", "2", "--configs", "single", "--program", str(tmp_path / "prog"),
               "--work-dir", str(tmp_path / "raw"), "--out", str(out)])
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["compiled"]["cost"]["calls_per_item"] == 2 and "labeled" in rows["compiled"]["label"]


@pytest.mark.slow
def test_cost_skip_model_keeps_every_model_figure(tmp_path):
    out = tmp_path / "cost.json"
    run_suite(["cost", "--limit", "2", "--configs", "single", "--concurrency-levels", "1", "--overhead-items", "2",
               "--fake-latency", "0.001", "--rss-sizes", "2,3", "--out", str(out)])
    report = json.loads(out.read_text())
    # figures only a real embedded model produces, as a previous full run would have left them
    report["server_ceiling"] = {"cores": 2, "rows": [{"layout": "x", "at_once": 1, "requests": 6, "max_tokens": 20,
                                                      "requests_per_minute": 40.0, "wall_seconds": 9.0, "speedup": 1.0}]}
    out.write_text(json.dumps(report))
    run_suite(["cost", "--limit", "2", "--configs", "single", "--concurrency-levels", "1", "--overhead-items", "2",
               "--fake-latency", "0.001", "--rss-sizes", "2,3", "--out", str(out), "--skip-model"])
    again = json.loads(out.read_text())
    assert again["server_ceiling"] == report["server_ceiling"]
    assert again["configs"] == report["configs"]
    assert [b for b in again["throughput"] if b["model"]] == [b for b in report["throughput"] if b["model"]]
