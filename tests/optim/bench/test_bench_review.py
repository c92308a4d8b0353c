"""The review suite (``python -m optim.bench review``) on the planted fake LM: the flag finds the planted errors,
and labels in queue order teach the panel more than as many random ones."""

from __future__ import annotations

import contextlib
import json

import pytest

from chateval_dspy.data.loaders import load_faireval
from chateval_dspy.testing.fake_lm import fake_lm
from optim.bench import main as bench
from optim.bench.review import HARD, flag_precision, planted_responder


@pytest.fixture(autouse=True)
def _quick(monkeypatch, tmp_path):
    monkeypatch.setenv("CHATEVAL_CACHE_DIR", str(tmp_path / "cache"))


FEW = 40  # bootstrap resamples: a smoke test checks behaviour, not interval precision


def review(tmp_path, lm, *extra):
    out = tmp_path / "review-planted.json"
    argv = ["review", "--roles", "1", "--counts", "2,4", "--seeds", "3", "--tie-draws", "2", "--curve-test-limit", "16",
            "--work-dir", str(tmp_path / "raw"), "--out", str(out), "--markdown", "--resamples", str(FEW), *extra]
    assert bench.main(argv, lm_factory=lambda slots: contextlib.nullcontext(lm)) == 0
    return json.loads(out.read_text())


def test_planted_errors_are_flagged_and_queue_labels_teach_more(tmp_path, capsys):
    items = load_faireval()
    lm = fake_lm(planted_responder(items))
    report = review(tmp_path, lm)
    flags, labels = report["flags"], report["labels"]
    assert report["header"]["n"] == flags["n"] == 64  # the whole train split (pool) and test split
    # Planted: wrong exactly on hard-category items that people did not call a tie, which are the inconsistent ones.
    by_id = {str(x.id): x for x in items}
    for q in flags["queue"]:
        x = by_id[str(q["id"])]
        assert q["wrong"] == (x.category in HARD and x.label != "tie")
    for row in flags["rows"]:
        assert row["top"]["value"] > row["rest"]["value"]
    # The 33 flagged items tie; 27 of them are wrong (the other 6 are human ties, which the pooled tie gets right).
    assert flags["rows"][0]["top_tie_averaged"] == pytest.approx(27 / 33) and flags["auc"]["value"] > 0.9
    # Labels: queue order starts with inconsistent (hard) items, whose demos fix their category on the test slice.
    base = labels["base"]["accuracy"]["value"]
    queue = {p["m"]: p["accuracy"]["value"] for p in labels["orders"]["queue"]}
    rand = {p["m"]: p["accuracy"]["value"] for p in labels["random"]}
    ties = {p["m"]: p["accuracy"]["value"] for p in labels["ties"]}  # queue order, ties broken at random
    assert ties[2] > base and ties[4] >= ties[2] and queue[4] >= base and set(rand) == {2, 4}
    assert {p["draws"] for p in labels["random"]} == {3}
    for order in ("queue", "ties_0", "ties_1"):  # the flagged items come first whichever way ties are broken
        assert all(by_id[i].category in HARD for i in labels["orders"][order][1]["labels"])
    assert labels["orders"]["ties_0"][1]["labels"] != labels["orders"]["queue"][1]["labels"]
    assert {p["draws"] for p in labels["ties"]} == {2}
    printed = capsys.readouterr().out
    assert "wrong in top k" in printed and "queue order" in printed and "model: fake/scripted" in printed
    assert (tmp_path / "review-flags-planted.png").exists() and (tmp_path / "review-labels-planted.png").exists()
    # A rerun resumes every file (the uncompiled panel's and each label set's): no LM call at all.
    again = fake_lm(planted_responder(items))
    assert review(tmp_path, again)["labels"] == labels
    assert again.engine.calls == []


def test_flag_precision_counts_ties_at_the_cut():
    records = [{"id": str(i), "format": "pairwise", "human": "1", "prediction": p, "consistent": c}
               for i, (p, c) in enumerate([("2", False), ("1", False), ("1", True), ("1", True), ("2", True)])]
    f = flag_precision(records, fractions=(0.2, 0.4), n_resamples=FEW)
    # U: the two inconsistent items first (0.25 each, tied), then three at 0.
    top1, top2 = f["rows"]
    assert (top1["k"], top1["top"]["value"], top1["tied_at_cut"], top1["tied_in_top"]) == (1, 1.0, 2, 1)
    assert top1["top_tie_averaged"] == 0.5  # one of the two tied items is wrong
    assert (top2["top"]["value"], top2["rest"]["value"]) == (0.5, pytest.approx(1 / 3))
    assert f["wrong"]["value"] == 0.4 and f["auc"]["value"] == pytest.approx(3.5 / 6)
