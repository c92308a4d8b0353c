"""Every debate a trace: the span tree built from a judged item's record, the default rule,
secrets scrubbed, and traces on the default local MLflow store from a batch, ``chateval score`` and ``serve``.

The tracking-server and ``mlflow.genai.evaluate`` checks are in ``test_mlflow_genai.py``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import dspy
import pytest
from stored_traces import span_tree

from chateval_dspy import scrub
from chateval_dspy.config import DebateConfig
from chateval_dspy.data.loaders import load_dataset
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.roles import resolve_roles
from chateval_dspy.run import tracing
from chateval_dspy.run.evaluate import evaluate, result_record
from chateval_dspy.run.tracing import emitter
from chateval_dspy.testing.fake_lm import default_responder, fake_lm

PLANTED = "sk-planted-TRACE-0123456789"


def judged(config: DebateConfig, n: int = 1, responder=default_responder):
    """``(records, items)`` for the first ``n`` items of the config's built-in dataset, judged by the fake LM."""
    items, _ = load_dataset("faireval" if config.format == "pairwise" else "topical_chat")
    items = items[:n]
    program = build_evaluator(config)
    with dspy.context(lm=fake_lm(responder), adapter=DebateAdapter()):
        return [result_record(program, x, config) for x in items], items


def tree_of(config: DebateConfig, responder=default_responder):
    (record,), (item,) = judged(config, responder=responder)
    roles = resolve_roles(config.roles, config.task_spec)
    return tracing.debate_tree(record, item, config=config, roles=roles, ended_ns=10**18), record, item


def shape(node) -> list:
    return [node["name"], [shape(c) for c in node["children"]]] if node["children"] else node["name"]


def within(child, parent) -> bool:
    return parent["start_ns"] <= child["start_ns"] <= child["end_ns"] <= parent["end_ns"]


# ---- the tree, as data ---------------------------------------------------------------------------------------

def test_a_pairwise_debate_is_orders_by_rounds_by_referee_turns():
    cfg = DebateConfig(roles=("critic", "scientist"), turns=2)
    tree, record, item = tree_of(cfg)
    turns = ["critic", "scientist"]
    # The root is named by task and item: MLflow's trace list shows it as the trace's name.
    assert shape(tree) == [f"chateval faireval · {item.id}", [["order 1", [["round 1", turns], ["round 2", turns]]],
                                                               ["order 2 (answers swapped)",
                                                                [["round 1", turns], ["round 2", turns]]]]]
    order1, order2 = tree["children"]
    # What each referee saw: its persona and, one by one, everything said before its turn.
    first, second = order1["children"][0]["children"]
    assert "critic" in first["inputs"]["persona"].lower() and first["inputs"]["discussion"].startswith("(nobody")
    assert record["transcripts"][0][0]["text"] in second["inputs"]["discussion"]
    # What it said, word for word, and (in the last round) its verdict as given in that answer order.
    assert first["outputs"]["text"] == record["transcripts"][0][0]["text"] and first["outputs"]["kind"] == "argument"
    verdict = order2["children"][1]["children"][0]["outputs"]["verdict"]
    mapped_back = record["referees"]["critic"][1]
    assert (verdict["score_1"], verdict["score_2"]) == (mapped_back["score_2"], mapped_back["score_1"])
    # The judged texts per order, the second one swapped; the panel's verdict on the root.
    assert order1["inputs"]["answer_1"] == item.answer_1 and order2["inputs"]["answer_1"] == item.answer_2
    assert tree["outputs"]["winner"] == record["prediction"] and tree["outputs"]["consistent"] == record["consistent"]
    # The verdict leads the root's outputs (MLflow previews a trace's response as their start), named as people read it.
    assert list(tree["outputs"])[:2] == ["verdict", "winner"]
    assert tree["outputs"]["verdict"] == {"1": "answer_1", "2": "answer_2", "tie": "tie"}[record["prediction"]]
    assert tree["attributes"][tracing.ROOT_ATTRIBUTE] == str(item.id)
    assert tree["attributes"]["mlflow.chat.tokenUsage"]["input_tokens"] == record["prompt_tokens"] > 0
    assert tree["attributes"]["chateval.calls"] == 8 and tree["attributes"]["chateval.timing"] == "measured"
    # Each turn's span is its own measured time and tokens (they add up to the item's); times nest. The two
    # orders run at once, so their spans may overlap; each still lies within the item's.
    turns_ = [t for order in tree["children"] for rnd in order["children"] for t in rnd["children"]]
    said = [u for transcript in record["transcripts"] for u in transcript]
    assert [t["end_ns"] - t["start_ns"] for t in turns_] == [int(u["seconds"] * 1e9) for u in said]
    assert sum(t["attributes"]["mlflow.chat.tokenUsage"]["input_tokens"] for t in turns_) == record["prompt_tokens"]
    assert all(t["attributes"]["chateval.timing"] == "measured" for t in turns_)
    for order in tree["children"]:
        assert within(order, tree)
        for rnd in order["children"]:
            assert within(rnd, order) and all(within(t, rnd) for t in rnd["children"])


def test_concurrent_turns_share_their_round_and_a_summary_is_a_turn():
    cfg = DebateConfig(roles=("critic", "scientist"), turns=2, strategy="simultaneous_talk_with_summarizer")
    tree, record, _ = tree_of(cfg)
    round1 = tree["children"][0]["children"][0]
    assert [t["name"] for t in round1["children"]] == ["critic", "scientist", "summarizer"]
    critic, scientist, summary = round1["children"]
    assert summary["start_ns"] >= max(critic["end_ns"], scientist["end_ns"])
    # The summarizer read this round's turns; round 2's referees read only the summary.
    assert critic["outputs"]["text"] in summary["inputs"]["discussion"]
    round2_turn = tree["children"][0]["children"][1]["children"][0]
    assert round2_turn["inputs"]["discussion"].startswith("[Summary, round 1]")


def test_a_pointwise_debate_has_one_order_and_scores_per_criterion():
    cfg = DebateConfig(format="pointwise", roles=("critic",), turns=1)
    tree, record, item = tree_of(cfg)
    assert shape(tree) == [f"chateval topical_chat · {item.id}", [["order 1", [["round 1", ["critic"]]]]]]
    assert list(tree["outputs"])[0] == "scores"  # the verdict first, as the trace's response preview shows it
    assert tree["outputs"]["scores"] == record["prediction"] and set(record["prediction"]) == {
        "naturalness", "coherence", "engagingness", "groundedness"}
    assert tree["children"][0]["inputs"]["response"] == item.response
    turn = tree["children"][0]["children"][0]["children"][0]
    assert turn["outputs"]["verdict"] == record["referees"]["critic"][0]


def test_an_abstaining_referee_is_an_error_span_with_its_reason():
    def garbage_for_the_critic(call):
        return "not json" if "critic" in call.inputs.get("persona", "").lower() and call.kind != "argument" \
            else default_responder(call)

    cfg = DebateConfig(roles=("critic", "scientist"), turns=1, parse_retries=0)
    tree, record, _ = tree_of(cfg, garbage_for_the_critic)
    critic = tree["children"][0]["children"][0]["children"][0]
    assert critic["error"] == critic["outputs"]["abstained"] == "parse_failure"
    assert record["abstentions"]["order1:critic@1"] == "parse_failure"
    assert tree["error"] is None  # the scientist still decided the item


def test_measured_turn_times_and_tokens_are_used_when_the_transcript_has_them():
    record = {"id": "m", "format": "pairwise", "prediction": "1", "consistent": None, "seconds": 3.0, "calls": 2,
              "prompt_tokens": 30, "completion_tokens": 6, "referees": {"critic": [{"score_1": 9, "score_2": 2}]},
              "transcripts": [[
                  {"round": 1, "speaker": "critic", "name": "Critic", "text": "a", "kind": "argument",
                   "started": 100.0, "seconds": 1.5, "prompt_tokens": 10, "completion_tokens": 2},
                  {"round": 2, "speaker": "critic", "name": "Critic", "text": "b", "kind": "verdict",
                   "started": 101.5, "seconds": 1.25, "prompt_tokens": 20, "completion_tokens": 4}]]}
    tree = tracing.debate_tree(record, ended_ns=103 * 10**9)
    argue = tree["children"][0]["children"][0]["children"][0]
    assert (argue["start_ns"], argue["end_ns"]) == (100 * 10**9, 101_500_000_000)
    assert argue["attributes"]["chateval.timing"] == "measured"
    assert argue["attributes"]["mlflow.chat.tokenUsage"] == {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12}
    assert tree["start_ns"] == 100 * 10**9


def test_long_texts_are_cut_in_a_trace_but_say_so():
    record, = judged(DebateConfig(roles=("critic",), turns=1))[0]
    record["transcripts"][0][0]["text"] = "x" * (tracing.MAX_TRACE_TEXT + 5)
    tree = tracing.debate_tree(record)
    text = tree["children"][0]["children"][0]["children"][0]["outputs"]["text"]
    assert text.endswith("[... 5 more characters in the results file]")


# ---- the rule and the secrets --------------------------------------------------------------------------------

def test_the_default_rule_counts_rows_cheaply(tmp_path):
    small, big = tmp_path / "small.jsonl", tmp_path / "big.jsonl"
    small.write_text("{}\n\n" * tracing.DEFAULT_MAX_ITEMS)
    big.write_text("{}\n" * (tracing.DEFAULT_MAX_ITEMS + 1))
    assert tracing.at_most_lines(small, tracing.DEFAULT_MAX_ITEMS) and not tracing.at_most_lines(big, tracing.DEFAULT_MAX_ITEMS)
    assert tracing.tracing_default(None, mlflow_target=True, items=tracing.DEFAULT_MAX_ITEMS)
    assert not tracing.tracing_default(None, mlflow_target=True, items=None)  # a server: off unless asked
    assert not tracing.tracing_default(False, mlflow_target=True, items=1)


def test_secrets_come_from_the_environment_the_key_file_and_registered_tokens(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-from-env-0001")
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file-0002\n")
    monkeypatch.setenv("CHATEVAL_API_KEY_FILE", str(key_file))
    scrub.register_secret("bearer-registered-0003")
    scrub.register_secret("short")  # too short to be a credential: texts keep such words
    text = "a tok-from-env-0001 b sk-from-file-0002 c bearer-registered-0003 short"
    try:
        found = scrub.secret_values()
        scrubbed = scrub.scrub({"t": [text]})
    finally:
        scrub.forget_secret("bearer-registered-0003")
    assert "bearer-registered-0003" not in scrub.secret_values()
    assert {"tok-from-env-0001", "sk-from-file-0002", "bearer-registered-0003"} <= set(found)
    assert "short" not in found
    assert scrubbed == {"t": ["a [REDACTED] b [REDACTED] c [REDACTED] short"]}


def test_tracking_refuses_the_same_secrets_that_traces_scrub(tmp_path, monkeypatch):
    from chateval_dspy.errors import SecretError
    from optim.tracking.runs import assert_no_secrets

    key_file = tmp_path / "key"
    key_file.write_text("sk-only-in-a-file-0004")
    monkeypatch.setenv("CHATEVAL_API_KEY_FILE", str(key_file))
    with pytest.raises(SecretError):
        assert_no_secrets("params: sk-only-in-a-file-0004", "params")


# ---- in MLflow: the default local store ----------------------------------------------------------------------

@pytest.fixture
def local_store(tmp_path, monkeypatch, mlflow_db):
    """The default local store (``sqlite:///mlruns/mlflow.db`` under the working directory), from the template."""
    import mlflow

    from optim.tracking import runs as tracking

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "mlruns").mkdir()
    shutil.copy(mlflow_db, tmp_path / "mlruns" / "mlflow.db")
    previous = mlflow.get_tracking_uri()
    experiment_id = tracking.start_tracing()
    yield experiment_id
    mlflow.flush_trace_async_logging()
    mlflow.set_tracking_uri(previous)


def stored_traces(experiment_id: str, **filters):
    import mlflow

    mlflow.flush_trace_async_logging()
    return mlflow.search_traces(locations=[experiment_id], return_type="list", **filters)


def test_a_batch_traces_each_item_once_and_links_them_to_its_run(local_store, tmp_path, monkeypatch):
    import mlflow

    from optim.tracking import runs as tracking

    monkeypatch.setenv("OPENAI_API_KEY", PLANTED)
    cfg = DebateConfig(roles=("critic", "scientist"), turns=2)
    items, _ = load_dataset("faireval")
    items = [items[0].copy(question=items[0].question + f" (my key is {PLANTED})"), *items[1:3]]
    tracer = tracing.Tracer(lambda fmt: cfg, items=items, tags={"chateval.command": "evaluate"},
                            experiment_id=local_store)
    seen = []
    with dspy.context(lm=fake_lm(), adapter=DebateAdapter()):
        result = evaluate(build_evaluator(cfg), items, cfg, out=tmp_path / "r.jsonl", on_item=tracer.on_item(seen.append))
    assert result.n == len(seen) == len(tracer.trace_ids) == 3 and tracer.failures == 0
    with tracking.run("evaluate", params={"config": cfg.to_dict()}) as active:
        pass
    tracer.link_to_run(active.info.run_id)
    traces = stored_traces(local_store, run_id=active.info.run_id)
    assert sorted(t.info.tags["chateval.item_id"] for t in traces) == sorted(str(x.id) for x in items)
    turns = ["critic", "scientist"]
    order = [["round 1", turns], ["round 2", turns]]
    for t in traces:
        name = f"chateval faireval · {t.info.tags['chateval.item_id']}"
        assert span_tree(t) == [[name, [["order 1", order], ["order 2 (answers swapped)", order]]]]
        assert t.info.tags["mlflow.traceName"] == name  # the name MLflow's trace list shows
        # The response preview starts with the verdict.
        assert t.data.response.startswith('{"verdict": ') and json.loads(t.data.response)["verdict"] in (
            "answer_1", "answer_2", "tie")
        assert t.info.tags["chateval.command"] == "evaluate" and t.info.tags["chateval.run_key"]
        assert t.info.token_usage["input_tokens"] > 0  # from the root's mlflow.chat.tokenUsage
    # The key planted in an item's text was scrubbed from its trace; nothing the store holds carries it.
    question = next(t for t in traces if t.info.tags["chateval.item_id"] == str(items[0].id)).data.spans[0].inputs
    assert "[REDACTED]" in question["question"]
    mlflow.flush_trace_async_logging()
    stored = [f for f in (tmp_path / "mlruns").rglob("*") if f.is_file()]
    assert stored and [f for f in stored if PLANTED.encode() in f.read_bytes()] == []


def test_a_tracing_fault_is_logged_and_the_batch_goes_on(local_store, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("tracking store unreachable")

    monkeypatch.setattr(emitter, "emit", broken)
    cfg = DebateConfig(roles=("critic",), turns=1)
    items, _ = load_dataset("faireval")
    tracer = tracing.Tracer(cfg, items=items[:2])
    with dspy.context(lm=fake_lm(), adapter=DebateAdapter()):
        result = evaluate(build_evaluator(cfg), items[:2], cfg, on_item=tracer.on_item())
    assert result.n == 2 and tracer.failures == 2 and tracer.trace_ids == []
    assert "could not trace item" in caplog.text and "tracking store unreachable" in caplog.text


@pytest.fixture
def saved_pairwise(tmp_path):
    from chateval_dspy.deploy.saved.card import make_card
    from chateval_dspy.deploy.saved.store import save_program

    program = build_evaluator(DebateConfig(roles=("critic", "scientist"), turns=1))
    return save_program(program, tmp_path / "prog", make_card(program, model="openai-compatible/fake-served"))


@pytest.mark.slow
def test_chateval_score_traces_by_default_when_mlflow_is_the_target(local_store, saved_pairwise, tmp_path, monkeypatch,
                                                                     capsys):
    from chateval_dspy.testing.fake_server import FakeOpenAIServer
    from optim.cli.main import main

    rows = tmp_path / "items.jsonl"
    rows.write_text("".join(json.dumps({"id": f"r{i}", "question": f"q{i}?", "answer_1": "yes", "answer_2": "no, " * i})
                            + "\n" for i in range(3)) + '{"id": "bad"}\n')
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}")
    with FakeOpenAIServer() as url:
        assert main(["score", str(saved_pairwise), "--model", url, "--in", str(rows), "--out", "v.jsonl",
                     "--no-progress"]) == 0
        assert "mlflow traces: 3" in capsys.readouterr().err
        traces = stored_traces(local_store)
        assert sorted(t.info.tags["chateval.item_id"] for t in traces) == ["r0", "r1", "r2"]  # the bad row: none
        assert {t.info.tags["chateval.command"] for t in traces} == {"score"}
        assert {t.info.tags["chateval.model"] for t in traces} == {"openai-compatible/fake-served"}
        # --no-trace wins over the rule.
        assert main(["score", str(saved_pairwise), "--model", url, "--in", str(rows), "--out", "v2.jsonl",
                     "--no-progress", "--no-trace"]) == 0
    assert len(stored_traces(local_store)) == 3 and "mlflow traces" not in capsys.readouterr().err


def test_serve_traces_each_request_item_only_when_asked(local_store, saved_pairwise, tmp_path):
    from fastapi.testclient import TestClient

    from chateval_dspy.deploy.saved.judge import load
    from chateval_dspy.deploy.serving.http import create_app
    from chateval_dspy.testing.fake_server import FakeOpenAIServer
    from optim.cli.score import traced

    item = {"question": "2+2?", "answer_1": "4", "answer_2": "five"}
    with FakeOpenAIServer() as url, load(saved_pairwise, lm=LMSpec(model=url)) as judge:
        off = argparse.Namespace(trace=None, tracking_uri=str(tmp_path / "unused"))
        assert traced(judge, off, items=None, command="serve") is judge  # a server: off by default
        on = argparse.Namespace(trace=True, tracking_uri=None)
        evaluator = traced(judge, on, items=None, command="serve")
        with TestClient(create_app(evaluator)) as client:
            assert client.get("/health").json()["format"] == "pairwise"
            verdicts = client.post("/evaluate", json=[{**item, "id": "a"}, {**item, "id": "b"}]).json()
        assert [v["id"] for v in verdicts] == ["a", "b"] and all(v["winner"] in ("1", "2", "tie") for v in verdicts)
        evaluator.tracer.flush()
    traces = stored_traces(local_store)
    assert sorted(t.info.tags["chateval.item_id"] for t in traces) == ["a", "b"]
    assert all(t.info.tags["chateval.command"] == "serve" for t in traces)
    assert Path(tmp_path / "unused").exists() is False


def test_a_debate_judged_inside_a_callers_span_joins_its_trace(local_store):
    import mlflow

    cfg = DebateConfig(roles=("critic",), turns=1)
    tracer = tracing.Tracer(cfg, tags={"chateval.command": "my-app"})
    with mlflow.start_span("my app") as span:
        (record,), (item,) = judged(cfg)
        assert tracer(record, item, parent=span) == span.trace_id
    (trace,) = stored_traces(local_store)
    order = [["round 1", ["critic"]]]
    debate = [f"chateval faireval · {item.id}", [["order 1", order], ["order 2 (answers swapped)", order]]]
    assert span_tree(trace) == [["my app", [debate]]]
    assert tracing.debate_span(trace).name == debate[0]  # found by its attribute, under the caller's span
    assert trace.info.tags["chateval.command"] == "my-app" and trace.info.tags["chateval.item_id"] == str(item.id)
