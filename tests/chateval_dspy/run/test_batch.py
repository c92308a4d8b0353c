"""Batch mode: debates through a Batch API in waves, on the fake batch server (``testing.fake_batches``).

A wave holds every call the pending debates can make; a run takes as many waves as its longest chain of dependent
calls. The verdicts are a live run's; nothing is submitted twice, also across a kill; expired batches and failed
requests go out again; the folder mode round-trips vLLM's run-batch files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from batch_runs import batch_spec, by_length, live_verdicts
from repo_paths import TEST_DATA
from said import said

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.critical_path import critical_path
from chateval_dspy.run.evaluate_dataset import evaluate_dataset
from chateval_dspy.testing.fake_batches import FakeBatches
from chateval_dspy.testing.fake_server import FakeOpenAIServer

DATA = DataSpec("faireval", limit=6)
RECORDED = TEST_DATA / "vllm_run_batch_output.jsonl"




@pytest.fixture(scope="module")
def live(tmp_path_factory):
    return live_verdicts(tmp_path_factory.mktemp("live") / "live.jsonl", DATA)


def test_a_batch_run_gives_the_live_verdicts_in_as_many_waves_as_the_critical_path(tmp_path, live):
    fake = FakeBatches(delay=0.05)
    seen = []
    with FakeOpenAIServer(responder=by_length, batches=fake) as url:
        run = evaluate_dataset(DATA, DebateConfig(), batch_spec(url), out=tmp_path / "b.jsonl", on_wave=seen.append)
    assert said(tmp_path / "b.jsonl") == live
    chain = critical_path(DebateConfig())["chain"]
    assert run.batch["waves"] == run.batch["expected_waves"] == chain == len(fake.created) == 4
    # Every request went out once, one batch per wave, each wave all 6 items' ready calls (2 answer orders each).
    assert run.batch["submitted"] == sum(fake.submitted.values()) == len(fake.submitted) == 6 * 8
    assert [len(fake.requests_in(b)) for b in fake.created] == [12] * 4
    assert run.batch["batch_ids"] == fake.created
    assert {p["wave"] for p in seen} == {1, 2, 3, 4} and all(p["expected"] == 4 for p in seen)
    assert any(b["status"] == "in_progress" for p in seen for b in p["batches"])  # the delay was seen
    assert run.result.calls == 48 and run.model == "batch/openai-compatible/fake-served"


@pytest.mark.parametrize("strategy", ["one_by_one", "simultaneous_talk", "simultaneous_talk_with_summarizer"])
def test_waves_equal_each_strategys_critical_path(tmp_path, strategy):
    cfg = DebateConfig(strategy=strategy, roles=("general_public", "critic", "scientist"), turns=2)
    fake = FakeBatches()
    with FakeOpenAIServer(responder=by_length, batches=fake) as url:
        run = evaluate_dataset(DataSpec("faireval", limit=3), cfg, batch_spec(url), out=tmp_path / "b.jsonl")
    path = critical_path(cfg)
    assert run.batch["waves"] == path["chain"] == len(fake.created), (strategy, path)
    assert sum(fake.submitted.values()) == len(fake.submitted) == 3 * path["calls"]


def test_identical_calls_are_submitted_once(tmp_path):
    rows = [{"id": str(i), "question": "Same?", "answer_1": "yes", "answer_2": "no", "label": "1"} for i in range(4)]
    src = tmp_path / "same.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fake = FakeBatches()
    with FakeOpenAIServer(responder=by_length, batches=fake) as url:
        run = evaluate_dataset(DataSpec(str(src), format="pairwise"), DebateConfig(), batch_spec(url),
                               out=tmp_path / "b.jsonl")
    assert run.result.n == 4
    assert sum(fake.submitted.values()) == 8  # the 4 items ask the same 8 questions: each went out once


def test_an_expired_batch_resubmits_only_its_unanswered_requests(tmp_path, live):
    fake = FakeBatches(expire=1, expire_keep=0.5)
    with FakeOpenAIServer(responder=by_length, batches=fake) as url:
        run = evaluate_dataset(DATA, DebateConfig(), batch_spec(url), out=tmp_path / "b.jsonl")
    assert said(tmp_path / "b.jsonl") == live
    assert len(fake.submitted) == 48
    again = [cid for cid, n in fake.submitted.items() if n > 1]
    assert len(again) == 6 and all(fake.submitted[c] == 2 for c in again)  # half of wave 1's 12, once more
    assert run.batch["waves"] == 5  # the expired requests' chain took one wave more


def test_failed_requests_are_retried_then_abstain_like_live_calls(tmp_path, live):
    # A 500 is transient: the request goes out in the next wave and the verdicts are unchanged.
    fake = FakeBatches(fail=lambda cid, body: 500, fail_times=1)
    with FakeOpenAIServer(responder=by_length, batches=fake) as url:
        evaluate_dataset(DATA, DebateConfig(), batch_spec(url), out=tmp_path / "retried.jsonl")
    assert said(tmp_path / "retried.jsonl") == live
    assert set(fake.submitted.values()) == {2}
    # A 400 is not: the referee abstains with the live call's cause, and the run goes on.
    fake = FakeBatches(fail=lambda cid, body: 400, fail_times=100)
    with FakeOpenAIServer(responder=by_length, batches=fake) as url:
        run = evaluate_dataset(DataSpec("faireval", limit=2), DebateConfig(), batch_spec(url),
                               out=tmp_path / "refused.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "refused.jsonl").read_text().splitlines()]
    assert run.result.n == 2 and all(r["abstained"] for r in lines)
    assert all("InvalidRequest" in json.dumps(r["abstentions"]) for r in lines), lines[0]["abstentions"]
    assert set(fake.submitted.values()) == {1}


def test_a_failed_batch_goes_out_again(tmp_path, live):
    fake = FakeBatches(fail_batches=1)
    with FakeOpenAIServer(responder=by_length, batches=fake) as url:
        run = evaluate_dataset(DATA, DebateConfig(), batch_spec(url), out=tmp_path / "b.jsonl")
    assert said(tmp_path / "b.jsonl") == live and run.batch["waves"] == 5


def test_a_rerun_answers_from_the_journal_without_submitting(tmp_path, live):
    fake = FakeBatches()
    with FakeOpenAIServer(responder=by_length, batches=fake) as url:
        evaluate_dataset(DATA, DebateConfig(), batch_spec(url), out=tmp_path / "b.jsonl")
        # The results file lost, the journal kept: every call is answered from the journal, none submitted.
        (tmp_path / "b.jsonl").unlink()
        again = evaluate_dataset(DATA, DebateConfig(), batch_spec(url), out=tmp_path / "b.jsonl")
    assert again.batch["submitted"] == 0 and again.batch["waves"] == 0
    assert said(tmp_path / "b.jsonl") == live and sum(fake.submitted.values()) == 48


# ---------------------------------------------------------------- kill and rerun (the fake counts submissions)


def _cli(args, env):
    return subprocess.Popen([sys.executable, "-m", "optim.cli.main", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=env["HOME"])


def _events(journal: Path, kind: str) -> int:
    path = journal / "journal.jsonl"
    return path.read_text().count(f'"event": "{kind}"') if path.exists() else 0


@pytest.mark.slow
@pytest.mark.parametrize("where", ["during a wave", "during a submission"])
def test_sigkill_then_rerun_submits_nothing_twice(tmp_path, live, where):
    # "during a wave": killed while wave 2's batch runs; "during a submission": killed after wave 2 was journaled
    # as about to go out and while the server creates it (found again by its label, not submitted twice).
    fake = FakeBatches(delay=1.0) if where == "during a wave" else FakeBatches(create_delay=1.5)
    env = dict(os.environ, HOME=str(tmp_path), CHATEVAL_CACHE_DIR=str(tmp_path / "cache"))
    out = tmp_path / "b.jsonl"
    journal = tmp_path / "b.jsonl.batches"
    with FakeOpenAIServer(responder=by_length, batches=fake) as url:
        args = ["evaluate", "--dataset", "faireval", "--limit", "6", "--model", url, "--batch", "--batch-poll", "0.05",
                "--out", str(out), "--no-progress", "--no-mlflow"]
        proc = _cli(args, env)
        deadline = time.time() + 120
        while time.time() < deadline and _events(journal, "intent") < 2 and proc.poll() is None:
            time.sleep(0.02)
        time.sleep(0.3)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert _events(journal, "intent") == 2 and (not out.exists() or out.read_text() == "")
        # Killed with wave 2 submitted and running, or before its submission was known to have reached the server.
        assert _events(journal, "submitted") == (2 if where == "during a wave" else 1)
        rerun = _cli(args, env)
        _, err = rerun.communicate(timeout=300)
        assert rerun.returncode == 0, err
    assert said(out) == live
    assert len(fake.submitted) == 48 and set(fake.submitted.values()) == {1}, fake.submitted.most_common(3)
    assert len(fake.created) == 4


@pytest.mark.slow  # over a few seconds
def test_batch_mode_refuses_what_it_cannot_do_before_submitting(tmp_path):
    with pytest.raises(ConfigError, match="embedded model has no batch API"):
        LMSpec(model="embedded", batch=True)
    with pytest.raises(ConfigError, match="no batch API for 'gemini/gemini-2.0-flash'"):
        LMSpec(model="gemini/gemini-2.0-flash", batch=True)
    with pytest.raises(ConfigError, match="no batch price"):
        LMSpec(model="openai/my-finetune-x", batch=True)
    with pytest.raises(ConfigError, match="mixed panel"):
        LMSpec(model="openai/gpt-4o-mini", batch=True, referee_models={"critic": "openai/gpt-4o"})
    assert LMSpec(model="openai/my-finetune-x", batch=True, price_per_mtok="1,2").batch_route().price.per_mtok == (1, 2)
    env = dict(os.environ, HOME=str(tmp_path))
    for args in (["evaluate", "--dataset", "faireval", "--limit", "1", "--batch", "--no-mlflow"],
                 ["serve", str(tmp_path), "--batch"]):
        proc = _cli(args, env)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode != 0 and ("no batch API" in err or "serve answers each request live" in err), err
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").rglob("*.batches"))


# ---------------------------------------------------------------- folder mode (vllm run-batch files)


def test_folder_mode_round_trips_vllm_run_batch_files(tmp_path, live):
    from chateval_dspy.testing.fake_vllm import FakeRunBatch

    folder = tmp_path / "waves"
    spec = LMSpec(model="openai/meta-llama/Llama-3.1-8B-Instruct", served_model="meta-llama/Llama-3.1-8B-Instruct",
                  cache=False, batch_dir=str(folder), batch_poll=0.02)
    with FakeRunBatch(folder, FakeOpenAIServer(responder=by_length)) as engine:
        run = evaluate_dataset(DATA, DebateConfig(), spec, out=tmp_path / "b.jsonl")
    assert said(tmp_path / "b.jsonl") == live and len(engine.waves) == 4
    # The stand-in writes the recorded file's layout: the same keys, at every level that names them.
    recorded, written = (json.loads(p.read_text().splitlines()[0]) for p in (RECORDED, sorted(folder.glob("*.output.jsonl"))[0]))
    assert written.keys() == recorded.keys() and written["response"].keys() == recorded["response"].keys()
    assert set(recorded["response"]["body"]) <= set(written["response"]["body"])
    inputs = sorted(folder.glob("*.input.jsonl"))
    assert len(inputs) == run.batch["waves"] == 4
    first = json.loads(inputs[0].read_text().splitlines()[0])
    assert first["method"] == "POST" and first["url"] == "/v1/chat/completions"
    assert first["body"]["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert run.result.cost()["cost_usd_total"] is None or run.batch["usd"] is None  # a private engine: unpriced


# ---------------------------------------------------------------- Anthropic, score and ablate


def test_anthropic_message_batches_give_the_live_verdicts_at_batch_prices(tmp_path, monkeypatch, live):
    from chateval_dspy.testing.fake_anthropic import FakeAnthropicServer

    server = FakeAnthropicServer(by_length)
    with server as base:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", base)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-a-key")
        run = evaluate_dataset(DATA, DebateConfig(), LMSpec(model="anthropic/claude-haiku-4-5", cache=False, batch=True,
                                                             batch_poll=0.02), out=tmp_path / "b.jsonl")
    assert said(tmp_path / "b.jsonl") == live
    assert run.batch["provider"] == "anthropic" and run.batch["waves"] == 4 and len(server.batch_ids) == 4
    assert sum(server.submitted.values()) == len(server.submitted) == 48
    cost = run.result.cost()
    assert cost["cost_usd_total"] == pytest.approx(run.batch["usd"]) and cost["cost_usd_total"] > 0
    text = (tmp_path / "b.jsonl").read_text() + "".join(p.read_text() for p in (tmp_path / "b.jsonl.batches").iterdir())
    assert "sk-ant-test-not-a-key" not in text


def test_score_and_ablate_run_in_batch_mode(tmp_path):
    from chateval_dspy.deploy.saved.card import make_card
    from chateval_dspy.deploy.saved.judge import load
    from chateval_dspy.deploy.saved.store import save_program
    from chateval_dspy.deploy.scale.score_file import score_file
    from chateval_dspy.program.chateval import build_evaluator
    from optim.ablation.run import ablate

    cfg = DebateConfig(roles=("critic", "scientist"), turns=1)
    program = build_evaluator(cfg)
    save_program(program, tmp_path / "judge", make_card(program, model="openai-compatible/fake-served"))
    rows = [{"id": f"r{i}", "question": f"q{i}?", "answer_1": "a" * i, "answer_2": "b" * (9 - i)} for i in range(5)]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    fake = FakeBatches()
    with FakeOpenAIServer(responder=by_length, batches=fake) as url:
        with load(tmp_path / "judge", lm=LMSpec(model=url, cache=False, batch=True, batch_poll=0.02),
                  journal=tmp_path / "out.jsonl.batches") as judge:
            report = score_file(judge, tmp_path / "in.jsonl", tmp_path / "out.jsonl", waves=True)
        assert report.scored == 5 and len(fake.created) == critical_path(cfg)["chain"] == 2
        done = ablate(DataSpec("faireval", limit=2), cfg, batch_spec(url), out=tmp_path / "ablation")
    assert [r.result.n for r in done.rows] == [2] * len(done.rows)
    assert (tmp_path / "ablation" / "batches" / "journal.jsonl").exists()
    assert set(fake.submitted.values()) == {1}


@pytest.mark.slow
def test_the_batch_suite_prices_live_and_batched_rows_and_counts_waves(tmp_path, capsys):
    """``python -m optim.bench batch`` on two items: live and batched rows, waves per strategy, a stop and a rerun."""
    from optim.bench.main import main

    out = tmp_path / "batch.json"
    assert main(["batch", "--limit", "2", "--strategy-limit", "1", "--demos", "1", "--models", "openai/gpt-4o-mini",
                 "--out", str(out), "--markdown"]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    rows = {(r["config"], r["mode"]): r for r in report["rows"]}
    assert set(rows) == {(c, m) for c in ("panel", "compiled") for m in ("live", "batch")}
    live, batched = rows[("panel", "live")], rows[("panel", "batch")]
    # gpt-4o-mini's batch rates are half its list rates, and FairEval's zero-shot calls are never cached.
    assert batched["usd_per_1000"]["value"] == pytest.approx(live["usd_per_1000"]["value"] / 2, rel=1e-6)
    assert batched["waves"] == batched["expected_waves"] == 4 and batched["requests"] == batched["calls_needed"] == 16
    assert [s["waves"] for s in report["strategies"]] == [s["critical_path"] for s in report["strategies"]] == [6, 2, 3]
    assert report["stop"]["submitted_in_all"] == report["stop"]["calls_needed"] == 16
    assert report["stop"]["submitted_before_stop"] == 8  # waves 1 and 2 of two items: 2 orders x 2 calls each
    assert "batched USD/1,000 verdicts <= 0.25x live at list price" in capsys.readouterr().out


def test_answers_enter_the_lm_cache_so_a_new_file_pays_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CHATEVAL_CACHE_DIR", str(tmp_path / "cache"))
    fake = FakeBatches()
    with FakeOpenAIServer(responder=by_length, batches=fake) as url:
        spec = LMSpec(model=url, batch=True, batch_poll=0.02)  # DSPy's cache on
        evaluate_dataset(DATA, DebateConfig(), spec, out=tmp_path / "first.jsonl")
        again = evaluate_dataset(DATA, DebateConfig(), spec, out=tmp_path / "second.jsonl")  # no journal of its own
    assert sum(fake.submitted.values()) == 48 and again.batch["submitted"] == 0
    assert again.result.cached_calls == 48 and said(tmp_path / "first.jsonl") == said(tmp_path / "second.jsonl")


@pytest.mark.slow
def test_the_cli_batches_evaluate_and_score_and_tags_the_mlflow_run(tmp_path, monkeypatch, capsys):
    import mlflow

    from chateval_dspy.deploy.saved.card import make_card
    from chateval_dspy.deploy.saved.store import save_program
    from chateval_dspy.program.chateval import build_evaluator
    from optim.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CHATEVAL_CACHE_DIR", str(tmp_path / "cache"))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    fake = FakeBatches()
    with FakeOpenAIServer(responder=by_length, batches=fake) as url:
        assert main(["evaluate", "--dataset", "faireval", "--limit", "3", "--model", url, "--batch", "--batch-poll",
                     "0.02", "--out", "r.jsonl", "--no-cache", "--tracking-uri", uri]) == 0
        printed = capsys.readouterr()
        program = build_evaluator(DebateConfig(roles=("critic",), turns=1))
        save_program(program, tmp_path / "judge", make_card(program, model="openai-compatible/fake-served"))
        (tmp_path / "in.jsonl").write_text(json.dumps({"id": "a", "question": "q", "answer_1": "x", "answer_2": "yy"})
                                           + "\n")
        assert main(["score", str(tmp_path / "judge"), "--model", url, "--in", "in.jsonl", "--out", "s.jsonl",
                     "--batch", "--batch-poll", "0.02", "--no-progress"]) == 0
    assert "4 wave(s) expected" in printed.err and "wave 4/4" in printed.err and "cost so far" in printed.err
    run_id = next(line.split()[-1] for line in printed.out.splitlines() if line.startswith("mlflow run:"))
    mlflow.set_tracking_uri(uri)
    tags = mlflow.get_run(run_id).data.tags
    assert tags["chateval.batch.ids"].split(",") == fake.created[:4] and tags["chateval.batch.waves"] == "4 (expected 4)"
    assert json.loads((tmp_path / "s.jsonl").read_text())["id"] == "a" and len(fake.created) == 4 + 1
    assert (tmp_path / "s.jsonl.batches" / "journal.jsonl").exists()
