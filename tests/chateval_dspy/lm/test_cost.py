"""Cost in US dollars: results lines, summaries, MLflow, bench tables and cards carry it.

A LiteLLM model string (``openai/gpt-4o-mini``) reaches the scripted OpenAI-compatible server through
``OPENAI_BASE_URL``, so the priced model's calls are real HTTP calls with usage the server reports. The
expected dollars are computed here from LiteLLM's cost map file itself, not through ``lm.pricing``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
from pathlib import Path

import dspy
import pytest
from repo_paths import ROOT

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.deploy.saved.store import CARD_FILE, CARD_MD, load_program
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.pricing import price_for
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.run.evaluate_dataset import evaluate_dataset
from chateval_dspy.run.table import summary_table
from chateval_dspy.testing.fake_lm import ScriptedEngine
from chateval_dspy.testing.fake_server import FakeOpenAIServer

PANEL = DebateConfig(roles=("critic",), turns=1)


def cost_map_usd(model: str, prompt: int, completion: int) -> float:
    """Dollars for ``prompt`` and ``completion`` tokens at the prices in the cost map LiteLLM ships."""
    folder = Path(importlib.util.find_spec("litellm").submodule_search_locations[0])
    entry = json.loads((folder / "model_prices_and_context_window_backup.json").read_text())[model]
    return prompt * entry["input_cost_per_token"] + completion * entry["output_cost_per_token"]


@pytest.fixture
def priced(monkeypatch):
    """The fake server under a priced model name, reached as the LiteLLM model string ``openai/gpt-4o-mini``
    (``server.url`` is its base URL, for reaching the same server as a private endpoint)."""
    server = FakeOpenAIServer(model="gpt-4o-mini")
    with server as url:
        server.url = url
        monkeypatch.setenv("OPENAI_BASE_URL", url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
        yield server


def lines(path) -> list[dict]:
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


@pytest.mark.slow
def test_a_priced_model_costs_its_tokens_times_the_cost_map(priced, tmp_path):
    run = evaluate_dataset(DataSpec("faireval", limit=3), PANEL, LMSpec("openai/gpt-4o-mini", cache=False),
                           out=tmp_path / "r.jsonl")
    assert len(priced.requests) == 3 * 2  # every call reached the fake server
    total = 0.0
    for line in lines(run.out):
        assert line["prompt_tokens"] > 0 and line["completion_tokens"] > 0
        expected = cost_map_usd("gpt-4o-mini", line["prompt_tokens"], line["completion_tokens"])
        assert line["cost_usd"] == pytest.approx(expected, rel=1e-9)
        assert line["usage_by_model"]["openai/gpt-4o-mini"]["cost_usd"] == pytest.approx(expected, rel=1e-9)
        total += expected
    cost = run.result.cost()
    assert cost["cost_usd_total"] == pytest.approx(total, rel=1e-9)
    assert cost["cost_usd_per_item"] == pytest.approx(total / 3, rel=1e-9)
    assert run.result.model_usage()["openai/gpt-4o-mini"]["cost_usd"] == pytest.approx(total, rel=1e-9)
    printed = summary_table(run.result.metrics(), cost, run.header(), models=run.result.model_usage())
    assert re.search(rf"cost_usd_total\s+\${total:.6f}", printed), printed
    # calls, cached calls, prompt tokens, cached prompt and cache write tokens (none here), completion tokens, ...
    assert re.search(r"openai/gpt-4o-mini\s+6\s+0\s+\d+\s+0\s+0\s+\d+\s+[\d.]+\s+\$0\.\d{6}", printed), printed


def test_unpriced_models_say_unpriced_never_zero(tmp_path):
    # A private endpoint is unpriced even when its served id is a name the cost map prices.
    assert price_for("openai-compatible/gpt-4o-mini") is None and price_for("embedded/gemma-3-270m-q4_k_m") is None
    with FakeOpenAIServer(model="gpt-4o-mini") as url:
        run = evaluate_dataset(DataSpec("faireval", limit=2), PANEL, LMSpec(url, cache=False), out=tmp_path / "r.jsonl")
    assert [line["cost_usd"] for line in lines(run.out)] == [None, None]
    assert run.result.cost()["cost_usd_total"] == "unpriced" and run.result.cost()["cost_usd_per_item"] == "unpriced"
    printed = summary_table(run.result.metrics(), run.result.cost(), run.header(), models=run.result.model_usage())
    assert re.search(r"cost_usd_per_item\s+unpriced", printed) and re.search(r"cost_usd_total\s+unpriced", printed)
    assert "$0.000000" not in printed


def test_a_stated_price_prices_a_private_endpoint(tmp_path, capsys):
    from optim.cli.main import main

    with FakeOpenAIServer() as url:
        code = main(["evaluate", "--dataset", "faireval", "--limit", "2", "--role", "critic", "--turns", "1",
                     "--model", url, "--price-per-mtok", "1.5,6", "--out", str(tmp_path / "r.jsonl"),
                     "--no-progress", "--no-cache", "--no-mlflow"])
    printed = capsys.readouterr().out
    assert code == 0
    for line in lines(tmp_path / "r.jsonl"):
        assert line["cost_usd"] == pytest.approx((line["prompt_tokens"] * 1.5 + line["completion_tokens"] * 6) / 1e6)
    assert re.search(r"cost_usd_per_item\s+\$0\.\d{6}", printed), printed
    with pytest.raises(ConfigError, match="--price-per-mtok takes two prices"):
        LMSpec(url, price_per_mtok="1.5")


def test_mlflow_logs_dollars_as_metrics_and_unpriced_as_a_tag(priced, tmp_path, monkeypatch,
                                                                       mlflow_db):
    import shutil

    import mlflow

    from optim.tracking.evaluation import log_evaluation

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "mlruns").mkdir()
    shutil.copy(mlflow_db, tmp_path / "mlruns" / "mlflow.db")
    paid = evaluate_dataset(DataSpec("faireval", limit=2), PANEL, LMSpec("openai/gpt-4o-mini", cache=False))
    free = evaluate_dataset(DataSpec("faireval", limit=2), PANEL, LMSpec(priced.url, cache=False))
    ids = {name: log_evaluation(done, done.result.metrics()) for name, done in (("paid", paid), ("free", free))}
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    runs = {name: mlflow.MlflowClient().get_run(run_id) for name, run_id in ids.items()}
    assert runs["paid"].data.metrics["cost_usd_total"] == pytest.approx(paid.result.cost()["cost_usd_total"])
    assert runs["paid"].data.metrics["cost_usd_per_item"] == pytest.approx(paid.result.cost()["cost_usd_per_item"])
    assert runs["paid"].data.metrics["model/openai/gpt-4o-mini/cost_usd_per_item"] == \
        pytest.approx(paid.result.cost()["cost_usd_per_item"])
    assert "cost_usd" not in runs["paid"].data.tags
    assert runs["free"].data.tags["cost_usd"] == "unpriced"
    assert not [k for k in runs["free"].data.metrics if "cost_usd" in k]  # never a 0 standing in for unpriced


@pytest.mark.slow
def test_card_cost_block_carries_dollars_and_stays_strict(priced, tmp_path):
    from optim.tuning.compile import OptimizerSettings, compile_and_save

    done = compile_and_save(DataSpec("faireval", limit=5), PANEL, LMSpec("openai/gpt-4o-mini", cache=False),
                            optimizer="labeled", out=tmp_path / "p", settings=OptimizerSettings(max_demos=1))
    cost = json.loads((tmp_path / "p" / CARD_FILE).read_text())["cost"]
    used = cost["by_model"]["openai/gpt-4o-mini"]
    assert cost["cost_usd_total"] == pytest.approx(cost_map_usd("gpt-4o-mini", used["prompt_tokens"],
                                                                used["completion_tokens"]), rel=1e-9)
    assert cost["cost_usd_per_item"] == pytest.approx(cost["cost_usd_total"] / cost["items"])
    assert done.model == "openai/gpt-4o-mini"
    assert re.search(r"cost_usd_per_item \$0\.\d{6}", (tmp_path / "p" / CARD_MD).read_text())
    load_program(tmp_path / "p")  # the strict loader accepts the cost block it wrote
    card = json.loads((tmp_path / "p" / CARD_FILE).read_text())
    for bad, message in (({"cost_usd_total": "free"}, "cost.cost_usd_total' must be a number"),
                         ({"calls_per_item": "unpriced"}, "cost.calls_per_item' must be a number"),
                         ({"by_model": {"http://10.0.0.1/v1": {}}}, "must be a model name"),
                         ({"by_model": {"openai/gpt-4o": {"cost_usd": {"x": 1}}}}, "must be a number")):
        (tmp_path / "p" / CARD_FILE).write_text(json.dumps({**card, "cost": {**card["cost"], **bad}}))
        with pytest.raises(ConfigError, match=re.escape(message)):
            load_program(tmp_path / "p")


@pytest.mark.slow
def test_an_unpriced_card_says_unpriced(tmp_path):
    from optim.tuning.compile import OptimizerSettings, compile_and_save

    with FakeOpenAIServer() as url:
        compile_and_save(DataSpec("faireval", limit=5), PANEL, LMSpec(url, cache=False), optimizer="labeled",
                         out=tmp_path / "p", settings=OptimizerSettings(max_demos=1))
    card = json.loads((tmp_path / "p" / CARD_FILE).read_text())
    assert card["cost"]["cost_usd_per_item"] == "unpriced"
    assert card["cost"]["by_model"]["openai-compatible/fake-served"]["cost_usd"] == "unpriced"
    assert "cost_usd_per_item unpriced" in (tmp_path / "p" / CARD_MD).read_text()
    load_program(tmp_path / "p")


def test_bench_tables_show_dollars_where_they_show_tokens(tmp_path):
    from optim.bench import main as bench
    from optim.bench.tables import render_file

    def suite(lm, out):
        argv = ["agreement", "--dataset", "faireval", "--limit", "2", "--configs", "majority,single",
                "--work-dir", str(tmp_path / out), "--out", str(tmp_path / f"{out}.json")]
        assert bench.main(argv, lm_factory=lambda slots: contextlib.nullcontext(lm)) == 0
        report = json.loads((tmp_path / f"{out}.json").read_text())
        return report, render_file(tmp_path / f"{out}.json")

    priced_lm = dspy.LM("openai/gpt-4o-mini", engine=ScriptedEngine(), cache=False, num_retries=0)
    report, table = suite(priced_lm, "priced")
    single = next(r for r in report["rows"] if r["name"] == "single")["cost"]
    expected = cost_map_usd("gpt-4o-mini", single["prompt_tokens_per_item"] * 2, single["completion_tokens_per_item"] * 2)
    assert single["cost_usd_per_item"] == pytest.approx(expected / 2, rel=1e-9)
    header = next(line for line in table.splitlines() if line.startswith("| configuration"))
    assert header.split(" | ")[-1] == "USD/item |"
    assert re.search(rf"\| single agent \(1 role, 1 turn\) \|.*\| \${expected / 2:.6f} \|$", table, re.M), table
    _, table = suite(dspy.LM("embedded/gemma-3-270m-q4_k_m", engine=ScriptedEngine(), cache=False, num_retries=0),
                     "embedded")
    assert re.search(r"\| single agent \(1 role, 1 turn\) \|.*\| unpriced \|$", table, re.M), table
    # Figures measured before dollars were recorded: the embedded model's rows say unpriced.
    assert "| unpriced |" in render_file(ROOT / "benchmarks" / "cost.json")
