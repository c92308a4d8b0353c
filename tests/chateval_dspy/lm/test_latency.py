"""Latency per verdict: both answer orders at once, the critical path, and the serve bench."""

from __future__ import annotations

import time

import dspy
import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import FatalLMError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.lm.call_limits import CallBounds
from chateval_dspy.lm.engine import with_bounds
from chateval_dspy.program.chateval import ChatEval
from chateval_dspy.program.critical_path import critical_path
from chateval_dspy.testing.fake_lm import default_responder, fake_lm

ITEMS = [
    {"question": "Which is right?", "answer_1": "short", "answer_2": "a considerably longer answer"},
    {"question": "Pick one.", "answer_1": "an answer of some length, first", "answer_2": "brief"},
]
TIMING = ("started", "seconds", "prompt_tokens", "completion_tokens")


def _judged(program, lm, item) -> dict:
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        pred = program(**item)
    out = dict(pred)
    out["transcripts"] = [[{k: v for k, v in u.items() if k not in TIMING} for u in t] for t in pred.transcripts]
    return out


@pytest.mark.parametrize("strategy", ["one_by_one", "simultaneous_talk_with_summarizer"])
def test_orders_in_parallel_give_exactly_the_sequential_verdict(strategy):
    cfg = DebateConfig(roles=("critic", "scientist"), turns=2, strategy=strategy)
    for item in ITEMS:
        together = _judged(ChatEval(cfg), fake_lm(), item)
        apart = _judged(ChatEval(cfg, parallel_orders=False), fake_lm(), item)
        assert together == apart
        assert together["calls"] == cfg.calls_per_item() and len(together["transcripts"]) == 2


def test_the_trace_lists_each_orders_calls_in_sequence():
    """An optimizer reads the trace by predictor in call order: the threads must not reorder it."""
    cfg = DebateConfig(roles=("critic", "scientist"), turns=2)

    def traced(program):
        with dspy.context(lm=fake_lm(), adapter=DebateAdapter(), trace=[]):
            program(**ITEMS[0])
            names = {id(p): n for n, p in program.named_predictors()}
            return [(names[id(p)], inputs["answer_1"]) for p, inputs, _ in dspy.settings.trace]

    together, apart = traced(ChatEval(cfg)), traced(ChatEval(cfg, parallel_orders=False))
    assert together == apart and len(together) == 8
    assert [a for _, a in together] == [ITEMS[0]["answer_1"]] * 4 + [ITEMS[0]["answer_2"]] * 4


def test_bootstrapped_demos_are_those_of_the_sequential_run():
    from optim.tuning.compile import OptimizerSettings, compile_evaluator
    from optim.tuning.objectives import agreement

    train = [dspy.Example(id=str(i), label="2", **item).with_inputs("question", "answer_1", "answer_2")
             for i, item in enumerate(ITEMS * 2)]
    cfg = DebateConfig(roles=("critic", "scientist"), turns=2)
    demos = []
    for parallel in (True, False):
        with dspy.context(lm=fake_lm(), adapter=DebateAdapter()):
            compiled = compile_evaluator(ChatEval(cfg, parallel_orders=parallel), optimizer="bootstrap",
                                         trainset=train, valset=None, metric=agreement,
                                         settings=OptimizerSettings(max_demos=2))
        demos.append({n: [d.toDict() for d in p.demos] for n, p in compiled.named_predictors()})
    assert demos[0] == demos[1]
    assert all(demos[0].values()), "every predictor, argue included, got demos from the threads' trace"


def test_an_lm_error_in_either_order_reaches_the_caller():
    def refuses_swapped(call):
        if call.inputs.get("answer_1") == ITEMS[0]["answer_2"]:
            raise dspy.lm15.AuthError("bad key", status=401)
        return default_responder(call)

    with pytest.raises(FatalLMError, match="refused"):
        _judged(ChatEval(DebateConfig(roles=("critic",), turns=1)), fake_lm(refuses_swapped), ITEMS[0])


def test_the_item_deadline_covers_both_orders():
    lm = with_bounds(fake_lm(latency=0.3), CallBounds(timeout=5, retries=0, call_deadline=5, item_deadline=0.5))
    start = time.perf_counter()
    pred = _judged(ChatEval(DebateConfig(roles=("critic", "scientist"), turns=2)), lm, ITEMS[0])
    took = time.perf_counter() - start
    # Each order's chain is 4 x 0.3 s; the item's 0.5 s cut both, in their own threads.
    late = {k.split(":")[0] for k, v in pred["abstentions"].items() if v == "lm_error:deadline"}
    assert late == {"order1", "order2"}
    assert took < 1.0


# ---- the critical path, against the clock


def test_critical_path_counts_calls_as_the_config_does():
    for cfg in (DebateConfig(), DebateConfig(strategy="simultaneous_talk_with_summarizer", turns=3),
                DebateConfig(format="pointwise", roles=("critic",)), DebateConfig(calibrate=False, consensus_stop=True)):
        path = critical_path(cfg)
        assert path["calls"] == cfg.calls_per_item()
        assert path["chain"] == path["per_order"]["chain"] <= path["per_order"]["calls"]
        assert critical_path(cfg, parallel_orders=False)["chain"] == path["chain"] * cfg.orders
    assert critical_path(DebateConfig(consensus_stop=True))["upper_bound"] is True
    assert critical_path(DebateConfig(format="pointwise"))["parallel_orders"] is False


LATENCY = 0.1


@pytest.mark.parametrize("cfg,parallel", [
    (DebateConfig(roles=("critic", "scientist"), turns=2), True),  # chain 4 (would be 8 in sequence)
    (DebateConfig(roles=("critic", "scientist"), turns=2), False),  # chain 8
    (DebateConfig(roles=("critic", "scientist", "general_public"), strategy="simultaneous_talk"), True),  # chain 2
    (DebateConfig(roles=("critic", "scientist"), strategy="simultaneous_talk_with_summarizer", turns=3), True),  # 5
])
def test_an_items_wall_time_is_its_critical_path_times_the_call_latency(cfg, parallel):
    program, lm = ChatEval(cfg, parallel_orders=parallel), fake_lm(latency=LATENCY)
    _judged(program, fake_lm(), ITEMS[0])  # templates rendered once, as in a warm process
    start = time.perf_counter()
    pred = _judged(program, lm, ITEMS[0])
    took = time.perf_counter() - start
    path = critical_path(cfg, parallel_orders=parallel)
    assert pred["calls"] == path["calls"] == len(lm.engine.calls)
    floor = path["chain"] * LATENCY
    # Tight enough that a one_by_one panel whose orders ran in sequence (chain 8) fails the chain-4 bound.
    assert 0.9 * floor <= took <= 1.4 * floor + 0.15, (took, floor)


# ---- the serve bench


def test_the_latency_suite_serves_real_requests_and_reports_the_floor(tmp_path, capsys):
    import json

    from optim.bench.main import main

    out = tmp_path / "latency.json"
    code = main(["latency", "--requests", "4", "--rate", "20", "--arrivals", "fixed", "--fake-latency", "0.02",
                 "--out", str(out), "--markdown"])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["header"]["suite"] == "latency" and report["header"]["model"] == "fake LM, 20 ms per call"
    rows = {(r["name"], r["parallel_orders"]): r for r in report["rows"]}
    assert set(rows) == {("panel", True), ("panel", False), ("single", True), ("single", False)}
    for r in rows.values():
        assert r["ok"] == r["sent"] == 4 and r["p50"]["n"] == 4
        assert r["calls_seen"] == [r["critical_path"]["calls"]]
        assert r["p50"]["value"] >= 0.9 * r["floor_seconds"]
    assert rows[("panel", True)]["critical_path"]["chain"] == 4 and rows[("panel", False)]["floor_seconds"] == 0.16
    printed = capsys.readouterr().out
    assert "| panel | parallel | 8 | 4 | 0.08 |" in printed and "fake LM, 20 ms per call" in printed
    assert main(["latency", "--panels", "jury", "--out", str(out)]) == 2
