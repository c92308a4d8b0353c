"""MLflow tracking of evaluate and compile (issue #3), and no secret in anything a run writes."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest

from chateval_dspy.testing.fake_lm import ScriptedEngine

PLANTED = "sk-planted-SECRET-0123456789"


class KeyHoldingEngine(ScriptedEngine):
    """A fake engine that, like a real client, holds the API key: if anything pickled the LM, the key would leak."""

    def __init__(self):
        super().__init__()
        self.api_key = os.environ["OPENAI_API_KEY"]


@pytest.fixture
def tracked_cli(tmp_path, monkeypatch):
    import dspy

    import chateval_dspy.lm.resolve as lm_module

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", PLANTED)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    @contextlib.contextmanager
    def fake_resolve(*args, **kwargs):
        yield dspy.LM("fake/keyholder", engine=KeyHoldingEngine(), cache=False, num_retries=0)

    monkeypatch.setattr(lm_module, "resolve_lm", fake_resolve)
    from optim.cli.main import main

    return main


def _files_under(*roots: Path):
    for root in roots:
        for f in root.rglob("*"):
            if f.is_file():
                yield f


def test_evaluate_and_compile_land_in_mlflow_without_secrets(tracked_cli, tmp_path, capsys):
    import mlflow

    assert tracked_cli(["evaluate", "--dataset", "faireval", "--limit", "3", "--turns", "1", "--no-progress",
                        "--out", "r.jsonl"]) == 0
    assert tracked_cli(["compile", "--dataset", "faireval", "--limit", "4", "--turns", "1", "--optimizer", "labeled",
                        "--out", "programs/toy", "--no-progress"]) == 0
    assert (tmp_path / "mlruns" / "mlflow.db").exists()
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["chateval-dspy"], output_format="list")
    by_name = {r.info.run_name: r for r in runs}
    ev, comp = by_name["evaluate"], by_name["compile"]
    assert ev.data.params["config.strategy"] == "one_by_one" and ev.data.params["model"] == "fake/keyholder"
    assert len(ev.data.params["dataset_hash"]) == 16
    assert {"accuracy", "accuracy_ci_low", "accuracy_ci_high", "kappa", "calls_per_item"} <= set(ev.data.metrics)
    assert comp.data.params["optimizer"] == "labeled"
    assert {"test_before.accuracy", "test_after.accuracy", "test_after.accuracy_ci_high"} <= set(comp.data.metrics)
    client = mlflow.MlflowClient()
    arts = {a.path for a in client.list_artifacts(comp.info.run_id, "evaluator")}
    assert {"evaluator/card.json", "evaluator/program.json"} <= arts
    card = json.loads((tmp_path / "programs" / "toy" / "card.json").read_text())
    assert card["optimizer"] == "labeled" and "before" in card["test_metrics"] and "after" in card["test_metrics"]
    assert card["test_metrics"]["after"]["accuracy"]["ci_low"] <= card["test_metrics"]["after"]["accuracy"]["value"]
    # The planted key is nowhere: not in params, artifacts, the pickled MLflow model, programs or results.
    leaks = [f for f in _files_under(tmp_path) if PLANTED.encode() in f.read_bytes()]
    assert leaks == []
    assert "mlflow run:" in capsys.readouterr().out


def test_assert_no_secrets_refuses_a_text_holding_a_key(monkeypatch):
    from optim.tracking import assert_no_secrets

    monkeypatch.setenv("MY_SERVICE_TOKEN", PLANTED)
    assert_no_secrets("nothing to hide", "x")
    with pytest.raises(RuntimeError, match="credential"):
        assert_no_secrets(f"header {PLANTED}", "x")
