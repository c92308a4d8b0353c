"""evaluate(): one JSON line per item, truncation, concurrency, and a broken item that does not end the batch."""

from __future__ import annotations

import json
import logging
import math

import dspy
import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import FatalLMError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.task import builtin_task
from chateval_dspy.run.evaluate import TRUNCATION_MARK, evaluate, prepare, result_record, truncate
from chateval_dspy.run.result import RunResult
from chateval_dspy.testing.fake_lm import default_responder, fake_lm

DOCUMENTED = {"id", "human", "prediction", "referees", "transcripts", "consistent", "calls", "prompt_tokens",
              "completion_tokens", "seconds", "truncated"}
CFG = DebateConfig(roles=("critic",), turns=1)  # 2 calls per item: quick


FEW = 200  # bootstrap resamples: enough for the figures these tests check


def item(i, label="1", **texts):
    fields = {"question": f"question {i}", "answer_1": "a" * (10 + 7 * i), "answer_2": "b" * (40 - 3 * i)}
    fields.update(texts)
    return dspy.Example(id=f"item-{i}", label=label, **fields).with_inputs(*builtin_task("pairwise").input_names)


ITEMS = [item(i, label=["1", "2", "tie"][i % 3]) for i in range(6)]


def read_lines(path):
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def run_eval(items, cfg=CFG, lm=None, program=None, **kwargs):
    lm = lm or fake_lm()
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        return evaluate(program or build_evaluator(cfg), items, cfg, **kwargs), lm


# --- truncation ------------------------------------------------------------------------------------------------


def test_truncate_rule():
    assert truncate("abcdef", 3) == ("abc" + TRUNCATION_MARK.format(n=3), 3)
    assert truncate("abcdef", 3)[0] == "abc [... truncated 3 characters]"
    assert truncate("abc", 3) == ("abc", 0)
    assert truncate("", 5) == ("", 0)
    text, cut = truncate("x" * 1000, 200)
    assert cut == 800 and text.startswith("x" * 200) and text[200:] == " [... truncated 800 characters]"


def test_prepare_truncates_each_field_and_warns(caplog):
    cfg = DebateConfig(max_text_chars=200)
    with caplog.at_level(logging.WARNING, logger="chateval_dspy.run.evaluate"):
        inputs, cut = prepare(item(1, answer_2="y" * 450), cfg)
    assert cut == {"answer_2": 250}
    assert inputs["answer_2"].endswith("[... truncated 250 characters]") and inputs["answer_1"] == "a" * 17
    assert "item-1" in caplog.text and "answer_2" in caplog.text and "truncated by 250" in caplog.text


# --- the results file ------------------------------------------------------------------------------------------


def test_one_valid_json_line_per_item_with_the_documented_fields(tmp_path):
    out = tmp_path / "results.jsonl"
    result, lm = run_eval(ITEMS, out=out)
    records = read_lines(out)
    assert len(records) == len(ITEMS) == result.n
    assert [r["id"] for r in records] == [x.id for x in ITEMS]  # concurrency 1 keeps the order
    for record, source in zip(records, ITEMS, strict=True):
        assert DOCUMENTED <= set(record)
        assert record["human"] == source.label
        assert record["prediction"] in ("1", "2", "tie")
        assert record["correct"] == (record["prediction"] == source.label)
        assert record["calls"] == CFG.calls_per_item() == 2
        assert set(record["referees"]) == {"critic"} and len(record["referees"]["critic"]) == 2
        assert len(record["transcripts"]) == 2 and record["transcripts"][0][0]["speaker"] == "critic"
        assert record["consistent"] is True  # the default fake judges by content
        assert record["prompt_tokens"] > 0 and record["completion_tokens"] > 0
        assert record["seconds"] >= 0 and record["truncated"] == {}
        assert record["abstained"] is None and record["format"] == "pairwise"
    assert len(lm.engine.calls) == 2 * len(ITEMS) == result.calls
    assert result.prompt_tokens == sum(r["prompt_tokens"] for r in records)
    assert result.human == [x.label for x in ITEMS]
    assert result.predicted == [r["prediction"] for r in records]


def test_predictions_follow_the_judge(tmp_path):
    """The default fake scores by length: the longer answer wins (a check that results are not made up)."""
    out = tmp_path / "r.jsonl"
    run_eval(ITEMS, out=out)
    for record, source in zip(read_lines(out), ITEMS, strict=True):
        s1, s2 = (min(10, 1 + len(source[k]) // 10) for k in ("answer_1", "answer_2"))
        assert record["prediction"] == ("1" if s1 > s2 else "2" if s2 > s1 else "tie")
        assert (record["score_1"], record["score_2"]) == (s1, s2)


def test_results_are_appended(tmp_path):
    out = tmp_path / "r.jsonl"
    run_eval(ITEMS[:2], out=out, run_key="one-run")  # an explicit key: the caller says both calls are one run
    run_eval(ITEMS[2:3], out=out, run_key="one-run")
    assert [r["id"] for r in read_lines(out)] == ["item-0", "item-1", "item-2"]
    assert {r["run_key"] for r in read_lines(out)} == {"one-run"}


def test_truncation_is_recorded_and_warned(tmp_path, caplog):
    cfg = CFG.replace(max_text_chars=200)
    long = item(9, answer_1="z" * 500)
    out = tmp_path / "r.jsonl"
    with caplog.at_level(logging.WARNING, logger="chateval_dspy.run.evaluate"):
        _, lm = run_eval([long, ITEMS[0]], cfg, out=out)
    first, second = read_lines(out)
    assert first["truncated"] == {"answer_1": 300} and second["truncated"] == {}
    assert "item-9" in caplog.text and "answer_1" in caplog.text
    shown = {c.inputs["answer_1"] for c in lm.engine.calls} | {c.inputs["answer_2"] for c in lm.engine.calls}
    assert "z" * 200 + " [... truncated 300 characters]" in shown  # the LM saw the cut text, marker included
    assert "z" * 500 not in shown


def test_concurrency_gives_the_same_results(tmp_path):
    items = [item(i, label="2") for i in range(9)]
    serial, _ = run_eval(items, out=tmp_path / "serial.jsonl")
    parallel, lm = run_eval(items, out=tmp_path / "parallel.jsonl", concurrency=3,
                            lm=fake_lm(default_responder, latency=0.005))
    a, b = read_lines(tmp_path / "serial.jsonl"), read_lines(tmp_path / "parallel.jsonl")
    assert len(b) == 9 and len({r["id"] for r in b}) == 9
    assert {r["id"]: r["prediction"] for r in a} == {r["id"]: r["prediction"] for r in b}
    assert {r["id"]: r["referees"] for r in a} == {r["id"]: r["referees"] for r in b}
    assert serial.calls == parallel.calls == len(lm.engine.calls) == 18
    assert sorted(serial.predicted) == sorted(parallel.predicted)


def test_on_item_sees_every_record(tmp_path):
    seen = []
    run_eval(ITEMS[:3], on_item=seen.append)
    assert [r["id"] for r in seen] == ["item-0", "item-1", "item-2"]


# --- failures inside a batch -------------------------------------------------------------------------------------


class Exploding(dspy.Module):
    """A program that raises an unexpected error on one item."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, **inputs):
        if inputs["question"] == "explode":
            raise RuntimeError("kaboom")
        return self.inner(**inputs)


def test_an_unexpected_exception_is_recorded_and_the_batch_continues(tmp_path, caplog):
    items = [ITEMS[0], item(7, question="explode"), ITEMS[1]]
    out = tmp_path / "r.jsonl"
    with caplog.at_level(logging.ERROR, logger="chateval_dspy.run.evaluate"):
        result, _ = run_eval(items, program=Exploding(build_evaluator(CFG)), out=out)
    records = read_lines(out)
    assert [r["id"] for r in records] == ["item-0", "item-7", "item-1"]
    broken = records[1]
    assert broken["abstained"].startswith("error:")
    assert broken["abstained"] == "error:RuntimeError: kaboom"
    assert broken["prediction"] is None and broken["calls"] is None and broken["correct"] is False
    assert records[0]["prediction"] is not None and records[2]["prediction"] is not None
    assert result.n == 3 and result.abstentions == {"error:RuntimeError": 1}
    assert result.predicted[1] is None  # counted as a disagreement in the metrics
    assert "item-7 failed" in caplog.text


def test_concurrent_batch_survives_a_broken_item(tmp_path):
    items = [item(i) for i in range(5)] + [item(8, question="explode")]
    out = tmp_path / "r.jsonl"
    result, _ = run_eval(items, program=Exploding(build_evaluator(CFG)), out=out, concurrency=3)
    assert result.n == 6 and sorted(r["id"] for r in read_lines(out)) == sorted(x.id for x in items)


def test_lm_abstentions_are_counted_by_cause(tmp_path):
    def responder(call):
        if "explode" in call.inputs.get("question", ""):
            raise dspy.lm15.ServerError("down")
        return default_responder(call)

    result, _ = run_eval([ITEMS[0], item(3, question="explode me")], lm=fake_lm(responder))
    assert result.abstentions == {"lm_error:LMServerError": 1}
    assert result.cost()["abstained_items"] == 1


def test_a_refused_lm_stops_the_batch(tmp_path):
    def responder(call):
        raise dspy.lm15.AuthError("bad key", status=401)

    out = tmp_path / "r.jsonl"
    with pytest.raises(FatalLMError):
        run_eval(ITEMS, lm=fake_lm(responder), out=out)
    assert out.read_text() == ""  # nothing half-written


# --- metrics and cost of a run ---------------------------------------------------------------------------------


def test_run_metrics_and_cost():
    result, _ = run_eval(ITEMS)
    report = result.metrics(n_resamples=FEW)
    assert report["n"] == 6
    expected = sum(p == h for p, h in zip(result.predicted, result.human, strict=True)) / 6
    assert report["accuracy"].value == pytest.approx(expected)
    cost = result.cost()
    assert cost["items"] == 6 and cost["calls_per_item"] == 2.0
    assert cost["position_consistency"] == 1.0 and cost["abstained_items"] == 0
    assert cost["prompt_tokens_per_item"] > 0 and cost["wall_seconds"] > 0


def test_items_without_labels_have_no_metrics():
    unlabeled = [item(i, label=None) for i in range(2)]
    result, _ = run_eval(unlabeled)
    assert result.n == 2 and result.metrics(n_resamples=FEW) == {} and result.human == []
    assert math.isnan(RunResult(CFG).cost()["position_consistency"])


def test_scoring_records(tmp_path):
    cfg = DebateConfig(format="pointwise", roles=("critic",), turns=1)
    human = {"naturalness": 2.0, "coherence": 2.0, "engagingness": 3.0, "groundedness": 1.0}
    examples = [dspy.Example(id=f"s{i}", dialogue_history=f"A: hi {i}", fact="cats purr", response=r,
                             human=human).with_inputs(*builtin_task("pointwise").input_names)
                for i, r in enumerate(["cats purr loudly", "dogs bark", "cats purr too"])]
    out = tmp_path / "s.jsonl"
    result, _ = run_eval(examples, cfg, out=out)
    records = read_lines(out)
    assert [r["prediction"]["groundedness"] for r in records] == [1, 0, 1]
    assert all(r["human"] == human and r["consistent"] is None and "correct" not in r for r in records)
    report = result.metrics(n_resamples=FEW)
    assert report["n"] == 3 and report["n_abstained"] == 0


def test_judge_item_reraises_chateval_errors():
    def responder(call):
        raise dspy.lm15.AuthError("no")

    with dspy.context(lm=fake_lm(responder), adapter=DebateAdapter()), pytest.raises(FatalLMError):
        result_record(build_evaluator(CFG), ITEMS[0], CFG)
