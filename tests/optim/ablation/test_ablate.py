"""``chateval ablate``: which referee earns its cost. On the scripted fake LM, a referee scripted
to be always wrong shows its removal raising agreement, with the exact McNemar p-value; reruns judge nothing new;
MLflow gets one parent run and a child per variant; the CLI prints the table and writes the plot. The embedded
model runs the command on two items."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys

import dspy
import pytest
from ablation_panel import BAD, DATA, GOOD, PANEL, PARTLY, panel_script

import chateval_dspy.lm.resolve
from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.testing.fake_lm import ScriptedEngine
from optim.ablation.paired import mcnemar_exact
from optim.ablation.run import ablate, variants
from optim.tracking.runs import TrackingSpec


def test_variants_are_full_each_left_out_and_each_alone():
    names = [(v.slug, v.roles) for v in variants(("a", "b", "c"))]
    assert names == [("full", ("a", "b", "c")), ("without-a", ("b", "c")), ("without-b", ("a", "c")),
                     ("without-c", ("a", "b")), ("alone-a", ("a",)), ("alone-b", ("b",)), ("alone-c", ("c",))]
    two = variants(("a", "b"))  # leaving one of two out keeps the other alone: judged once, named both ways
    assert [(v.slug, v.left_out, v.alone) for v in two] == [("full", None, None), ("without-a", "a", "b"),
                                                           ("without-b", "b", "a")]


def test_a_panel_of_one_is_refused_before_any_model_starts(scripted, tmp_path):
    with pytest.raises(ConfigError, match="at least 2 referees, got 1 \\(critic\\)"):
        ablate(DATA, DebateConfig(roles=("critic",)), LMSpec("embedded"), out=tmp_path / "a")
    assert scripted.calls == []


def test_exact_mcnemar_matches_the_binomial_by_hand():
    # 2 items only the row gets right, 1 only the reference: p = 2 * P(X <= 1), X ~ Bin(3, 1/2) = 2 * 4/8 = 1.0
    ref = {"a": True, "b": False, "c": False, "d": True, "e": False}
    row = {"a": False, "b": True, "c": True, "d": True, "e": False}
    assert mcnemar_exact(ref, row) == {"test": "exact McNemar", "n": 5, "reference_only": 1, "row_only": 2, "p": 1.0}
    # 5 discordant items, all the row's: p = 2 * (1/2)^5
    assert mcnemar_exact({i: False for i in "abcde"}, {i: True for i in "abcde"})["p"] == pytest.approx(2 / 2 ** 5)


@pytest.mark.slow  # over a few seconds
def test_leaving_out_the_always_wrong_referee_raises_agreement_with_the_paired_test(scripted, tmp_path):
    done = ablate(DATA, PANEL, LMSpec("embedded"), out=tmp_path / "a")
    assert [r.variant.slug for r in done.rows] == ["full", f"without-{GOOD}", f"without-{PARTLY}", f"without-{BAD}",
                                                  f"alone-{GOOD}", f"alone-{PARTLY}", f"alone-{BAD}"]
    assert done.metric == "accuracy" and done.test == "exact McNemar"
    full, without_bad = done.full, done.row(f"without-{BAD}")
    assert full.agreement.value == pytest.approx(0.4) and full.agreement.n == 10
    assert without_bad.agreement.value == 1.0 > full.agreement.value
    vs = without_bad.vs_full
    # The 6 items the full panel gets wrong, the panel without the bad referee gets right, and none the other way:
    # the exact McNemar p is 2 * (1/2)^6 = 1/32, by hand.
    assert (vs["n"], vs["reference_only"], vs["row_only"]) == (10, 0, 6)
    assert vs["p"] == pytest.approx(1 / 32)
    assert vs["delta"].value == pytest.approx(0.6)
    # The always-right referee is the one the panel cannot lose; the always-wrong one judges nothing right alone.
    assert done.row(f"without-{GOOD}").agreement.value == 0.0
    assert done.row(f"without-{GOOD}").vs_full["reference_only"] == 4
    assert done.row(f"alone-{GOOD}").agreement.value == 1.0 and done.row(f"alone-{BAD}").agreement.value == 0.0
    # Cost per item: one verdict per referee (one turn, one order), tokens counted, the fake model unpriced.
    assert [r.result.cost()["calls_per_item"] for r in done.rows] == [3, 2, 2, 2, 1, 1, 1]
    assert done.full.tokens_per_item() > done.row(f"without-{BAD}").tokens_per_item() > 0
    assert done.full.cost()["cost_usd_per_item"] == "unpriced"
    summary = json.loads((tmp_path / "a" / "ablation.json").read_text())
    assert summary["rows"][3]["vs_full"]["p"] == pytest.approx(1 / 32)
    assert summary["rows"][3]["cost"]["cost_usd_per_item"] == "unpriced"


@pytest.mark.slow
def test_a_rerun_judges_nothing_new_and_an_interrupted_variant_finishes_its_rest(scripted, tmp_path):
    first = ablate(DATA, PANEL, LMSpec("embedded"), out=tmp_path / "a")
    calls = len(scripted.calls)
    assert calls == 10 * (3 + 3 * 2 + 3 * 1)
    again = ablate(DATA, PANEL, LMSpec("embedded"), out=tmp_path / "a")
    assert len(scripted.calls) == calls  # every variant's file was complete
    assert [r.result.resumed for r in again.rows] == [10] * 7
    assert [r.agreement.value for r in again.rows] == [r.agreement.value for r in first.rows]
    # A kill left 3 items of one variant: the rerun judges its other 7 items, nothing of the rest.
    path = tmp_path / "a" / f"without-{BAD}.jsonl"
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:3]))
    resumed = ablate(DATA, PANEL, LMSpec("embedded"), out=tmp_path / "a")
    assert len(scripted.calls) == calls + 7 * 2
    assert resumed.row(f"without-{BAD}").result.resumed == 3
    assert resumed.row(f"without-{BAD}").vs_full["p"] == pytest.approx(1 / 32)
    # A variant's file written under another panel config is refused before any model starts.
    with pytest.raises(ConfigError, match="holds results of another run"):
        ablate(DATA, PANEL.replace(turns=2), LMSpec("embedded"), out=tmp_path / "a")
    assert len(scripted.calls) == calls + 7 * 2


@pytest.mark.slow
def test_mlflow_gets_one_parent_run_and_a_child_per_variant(scripted, tmp_path, monkeypatch,
                                                           mlflow_db):
    import shutil

    import mlflow

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-planted-ablation-key-0123456789")
    (tmp_path / "mlruns").mkdir()
    shutil.copy(mlflow_db, tmp_path / "mlruns" / "mlflow.db")
    done = ablate(DATA, PANEL, LMSpec("embedded"), out=tmp_path / "a", tracking=TrackingSpec())
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    client = mlflow.MlflowClient()
    runs = client.search_runs([mlflow.get_experiment_by_name("chateval-dspy").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert [p.info.run_id for p in parents] == [done.mlflow_run_id]
    parent = parents[0]
    assert parent.data.tags["command"] == "ablate" and parent.data.params["config.roles"] == ",".join(PANEL.roles)
    assert parent.data.params["model"] == "fake/scripted" and parent.data.params["ablation.variants"] == "7"
    assert parent.data.metrics[f"without-{BAD}.p"] == pytest.approx(1 / 32)
    assert parent.data.tags["cost_usd"] == "unpriced"
    children = {r.data.tags["chateval.variant"]: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert sorted(children) == sorted(r.variant.slug for r in done.rows)
    bad = children[f"without-{BAD}"]
    assert bad.data.params["config.roles"] == f"{GOOD},{PARTLY}" and bad.data.params["left_out"] == BAD
    assert bad.data.metrics["agreement"] == 1.0 and bad.data.metrics["vs_full.p"] == pytest.approx(1 / 32)
    assert bad.data.metrics["vs_full.delta"] == pytest.approx(0.6) and "vs_full.delta_ci_low" in bad.data.metrics
    assert bad.data.metrics["calls_per_item"] == 2.0 and bad.data.metrics["tokens_per_item"] > 0
    assert "vs_full.p" not in children["full"].data.metrics
    assert [a.path for a in client.list_artifacts(bad.info.run_id, "results")] == [f"results/without-{BAD}.jsonl"]
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "ablation")} == {"ablation/ablation.json",
                                                                                       "ablation/ablation.png"}
    everything = json.dumps([[r.data.params, r.data.tags] for r in runs])
    assert "sk-planted" not in everything


@pytest.mark.slow  # over a few seconds
def test_the_cli_prints_the_table_and_writes_the_plot(scripted, tmp_path, capsys):
    from optim.cli.main import main

    code = main(["ablate", "--dataset", "faireval", "--split", "test", "--limit", "10", "--role", GOOD, "--role",
                 PARTLY, "--role", BAD, "--turns", "1", "--no-calibrate", "--out", str(tmp_path / "a"),
                 "--no-progress", "--no-mlflow", "--resamples", "200"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "model=fake/scripted" in out and "data=faireval" in out and "split=test (seed 0)" in out and "items=10" in out
    rows = [line.strip() for line in out.splitlines()]
    lines = {" ".join(line.split()[:2]): line for line in rows
             if line.startswith(("full panel", "without", f"{GOOD} alone", f"{PARTLY} alone", f"{BAD} alone"))}
    assert len(lines) == 7, out
    assert "accuracy [95% CI]" in out and "McNemar p" in out and "USD/item" in out
    bad = lines[f"without {BAD}"]
    assert "1.000 [1.000, 1.000]" in bad and "+0.600 [" in bad and " 0.031 " in bad and " 0/6 " in bad
    assert bad.rstrip().endswith("unpriced")
    assert f"plot: {tmp_path / 'a' / 'ablation.png'}" in out
    assert (tmp_path / "a" / "ablation.png").read_bytes()[:4] == b"\x89PNG"
    assert "without scientist: general_public, critic" in err  # the progress names each variant's panel
    code = main(["ablate", "--dataset", "faireval", "--role", "critic", "--out", str(tmp_path / "b"), "--no-mlflow"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("chateval: error: an ablation needs a panel of at least 2 referees")
    assert len(err.strip().splitlines()) == 1


def test_a_scored_task_gets_a_paired_bootstrap(monkeypatch, tmp_path):
    """Topical-Chat (scores, not preferences): the difference in mean Spearman against the full panel has a CI and
    no McNemar test."""
    from chateval_dspy.testing.fake_lm import fake_lm

    @contextlib.contextmanager
    def resolve(spec="embedded", **kwargs):
        yield fake_lm()

    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
    panel = DebateConfig(format="pointwise", roles=("critic", "scientist"), turns=1)
    done = ablate(DataSpec("topical_chat", limit=6, resamples=200), panel, LMSpec("embedded"), out=tmp_path / "a")
    assert done.metric == "average_spearman" and done.test == "paired bootstrap"
    vs = done.row("without-critic").vs_full
    assert vs["test"] == "paired bootstrap" and vs["p"] is None and vs["n"] == 6
    assert "Δ vs full [95% CI]" in done.table() and "McNemar" not in done.table()


@pytest.mark.slow
@pytest.mark.embedded
def test_embedded_model_runs_ablate_from_the_cli(tmp_path):
    env = dict(os.environ, CHATEVAL_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "optim.cli", "ablate", "--dataset", "faireval", "--limit", "2",
                           "--roles", "2", "--turns", "1", "--no-calibrate", "--out", str(tmp_path / "a"),
                           "--no-progress", "--no-mlflow"], capture_output=True, text=True, env=env, timeout=900,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "embedded/gemma-3-270m-q4_k_m" in proc.stdout and "McNemar p" in proc.stdout
    summary = json.loads((tmp_path / "a" / "ablation.json").read_text())
    assert [r["slug"] for r in summary["rows"]] == ["full", "without-general_public", "without-critic"]
    for row in summary["rows"]:
        records = [json.loads(line) for line in open(row["results"])]
        assert len(records) == 2 and all(r["prediction"] in ("1", "2", "tie") for r in records), records
        assert row["cost"]["tokens_per_item"] > 0 and row["cost"]["cost_usd_per_item"] == "unpriced"
    assert (tmp_path / "a" / "ablation.png").exists()


@pytest.mark.slow
def test_with_the_lm_cache_on_no_variant_is_billed_less_for_prompts_another_variant_made(monkeypatch, tmp_path):
    """The first referee opens every panel it sits on with the same prompt: under one shared cache only the first
    variant would pay for it. Each variant has a cache of its own, which still replays that variant's calls."""
    engine = ScriptedEngine(panel_script(DATA, PANEL))

    @contextlib.contextmanager
    def resolve(spec="embedded", **kwargs):
        yield dspy.LM("fake/scripted", engine=engine, cache=True, num_retries=0)

    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
    lm = LMSpec("embedded", cache=True, cache_dir=str(tmp_path / "cache"))
    done = ablate(DATA, PANEL, lm, out=tmp_path / "a")
    assert len(engine.calls) == 10 * (3 + 3 * 2 + 3 * 1)  # no variant was answered from another's calls
    assert all(r.cost()["cached_calls_per_item"] == 0 for r in done.rows)
    assert done.row(f"alone-{GOOD}").tokens_per_item() == pytest.approx(done.full.tokens_per_item() / 3, rel=0.2)
    # A variant cut short replays its own calls from its cache: nothing reaches the LM again.
    path = tmp_path / "a" / f"alone-{GOOD}.jsonl"
    path.write_text(path.read_text().splitlines(keepends=True)[0])
    again = ablate(DATA, PANEL, lm, out=tmp_path / "a")
    assert len(engine.calls) == 120
    assert again.row(f"alone-{GOOD}").cost()["cached_calls_per_item"] == pytest.approx(9 / 10)
    assert "answered from the LM cache" in again.table()
