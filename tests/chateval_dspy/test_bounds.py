"""Time bounds of LM calls and abstentions in the run summary.

The timing tests print what they measured and assert a generous bound: the point is "ends near its
deadline, never a hang", not the exact second.
"""

from __future__ import annotations

import re
import threading
import time

import dspy
import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.lm.call_limits import DEFAULT_RETRIES, CallBounds
from chateval_dspy.lm.engine import bounds_of, with_bounds
from chateval_dspy.lm.resolve import resolve_lm
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.task import builtin_task
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.result import RunResult
from chateval_dspy.run.table import summary_table
from chateval_dspy.testing.fake_lm import default_responder, fake_lm
from chateval_dspy.testing.fake_server import FakeOpenAIServer

ITEM = {"question": "Which is better?", "answer_1": "first answer", "answer_2": "second answer"}
ONE_CALL = DebateConfig(roles=("critic",), turns=1, calibrate=False)
TWO_CALLS = DebateConfig(roles=("critic",), turns=1)  # both answer orders
# Scheduling noise on 2 shared cores, added to every stated bound before asserting it.
SLACK_S = 5.0


def judge(lm, cfg=ONE_CALL, **item):
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        start = time.perf_counter()
        pred = build_evaluator(cfg)(**(item or ITEM))
        return pred, time.perf_counter() - start


# --- item 4: the bounds and their defaults -------------------------------------------------------------------


def test_default_bounds_follow_the_stated_formula():
    """Call deadline 2*timeout + 10 s, item deadline 4*call deadline, each settable."""
    assert CallBounds.derive(120) == CallBounds(timeout=120, retries=2, call_deadline=250, item_deadline=1000)
    assert CallBounds.derive(5) == CallBounds(timeout=5, retries=2, call_deadline=20, item_deadline=80)
    assert CallBounds.derive(5, call_deadline=12).item_deadline == 48
    assert CallBounds.derive(5, retries=0, call_deadline=7, item_deadline=9) == CallBounds(5, 0, 7, 9)
    assert LMSpec(timeout=5).bounds() == CallBounds.derive(5)
    assert LMSpec(timeout=5, retries=1, call_deadline=8, item_deadline=30).bounds() == CallBounds(5, 1, 8, 30)
    for bad in ({"retries": -1}, {"call_deadline": 0}, {"item_deadline": float("inf")}, {"retries": True}):
        with pytest.raises(ConfigError):
            LMSpec(timeout=5, **bad)


def test_exactly_one_layer_retries_a_failing_endpoint():
    """DSPy's num_retries (3) on top of the openai client's max_retries (3) made 16
    attempts per call; now the engine alone retries, ``1 + retries`` attempts."""
    server = FakeOpenAIServer(faults=[500] * 50)
    with server as url, resolve_lm(url, timeout=5) as lm:
        assert lm.num_retries == 0 and lm.engine.client.max_retries == 0
        pred, seconds = judge(lm)
    server_requests = len(server.requests)
    print(f"\n{server_requests} attempts in {seconds:.2f} s")
    assert server_requests == 1 + DEFAULT_RETRIES == 3
    assert pred.abstentions == {"order1:critic@1": "lm_error:LMServerError"}


def test_a_litellm_model_string_retries_in_one_layer_and_carries_its_bounds():
    """For a model string one layer retries (its engines make one attempt each); that
    layer is the debate's wait for the call, not DSPy's loop (``num_retries`` 0), which slept out any Retry-After
    unseen. The retries and deadlines ride on the LM for the debate to enforce."""
    with resolve_lm("openai/gpt-4o-mini", timeout=7, retries=1, item_deadline=100) as lm:
        assert lm.num_retries == 0 and lm.kwargs["timeout"] == 7
        assert bounds_of(lm) == CallBounds(timeout=7, retries=1, call_deadline=24, item_deadline=100)
        assert bounds_of(lm.copy(temperature=0.5)) == bounds_of(lm)  # optimizers copy LMs


# --- item 4: a permanently hanging endpoint ------------------------------------------------------------------


def test_a_call_to_a_hanging_endpoint_ends_at_its_call_deadline():
    """A server that accepts the connection and never answers held one call for
    34.9 minutes; now the call ends by its deadline as the abstention ``lm_error:deadline``."""
    bounds = CallBounds.derive(1.0, call_deadline=3.0, item_deadline=60.0)
    server = FakeOpenAIServer(hang=True)
    with server as url, resolve_lm(url, timeout=1.0, call_deadline=3.0, item_deadline=60.0) as lm:
        assert bounds_of(lm) == bounds
        pred, seconds = judge(lm)
        attempts = len(server.requests)
    print(f"\none call against a hanging server: {seconds:.2f} s, {attempts} attempt(s) (call deadline 3 s)")
    assert pred.abstentions == {"order1:critic@1": "lm_error:deadline"}
    assert pred.abstained == "lm_error:deadline" and pred.preference is None
    assert 1 <= attempts <= 1 + bounds.retries
    assert seconds < bounds.call_deadline + SLACK_S


def test_an_item_against_a_hanging_endpoint_ends_at_its_item_deadline():
    """Once an item's time is spent, its remaining turns abstain without calling the LM,
    so an 8-call item ends by the item deadline rather than after 8 call deadlines."""
    cfg = DebateConfig(roles=("critic", "scientist"), turns=2)  # 8 calls, one after another
    server = FakeOpenAIServer(hang=True)
    # The breaker is set past this item's attempts: what is checked here is the item deadline, not the run's stop.
    with server as url, resolve_lm(url, timeout=1.0, call_deadline=2.0, item_deadline=4.0, breaker=100) as lm:
        pred, seconds = judge(lm, cfg)
        attempts = len(server.requests)
    print(f"\nan 8-call item against a hanging server: {seconds:.2f} s, {attempts} attempt(s), "
          f"{pred.calls} call(s) made (item deadline 4 s)")
    assert seconds < 4.0 + SLACK_S
    assert set(pred.abstentions.values()) == {"lm_error:deadline"} and len(pred.abstentions) == 8
    assert pred.calls < cfg.calls_per_item()  # the turns after the deadline never reached the LM
    assert attempts <= pred.calls * (1 + DEFAULT_RETRIES)


def test_a_model_string_lm_against_a_hanging_endpoint_is_cut_by_the_debate():
    """DSPy's own engine (the route a LiteLLM model string takes) cannot be interrupted
    from outside, so the debate stops waiting for it at the call deadline."""
    bounds = CallBounds.derive(1.0, retries=2, call_deadline=2.5)
    server = FakeOpenAIServer(hang=True)
    with server as url:
        lm = with_bounds(dspy.LM("openai/fake-served", api_base=url, api_key="x", cache=False, timeout=bounds.timeout,
                                 num_retries=bounds.retries), bounds)
        pred, seconds = judge(lm)
    print(f"\na DSPy-engine call against a hanging server: {seconds:.2f} s (call deadline 2.5 s)")
    assert pred.abstentions == {"order1:critic@1": "lm_error:deadline"}
    assert seconds < bounds.call_deadline + SLACK_S


def test_an_lm_that_never_returns_is_cut_at_the_deadline():
    """Whatever the LM (here one blocked for good), a call ends by its deadline."""
    release = threading.Event()

    def stuck(call):
        release.wait(60)
        return default_responder(call)

    lm = with_bounds(fake_lm(stuck), CallBounds.derive(30, call_deadline=1.0, item_deadline=60))
    try:
        pred, seconds = judge(lm, TWO_CALLS)
    finally:
        release.set()
    print(f"\ntwo calls to an LM that never returns: {seconds:.2f} s (call deadline 1 s each)")
    assert pred.abstentions == {"order1:critic@1": "lm_error:deadline", "order2:critic@1": "lm_error:deadline"}
    assert seconds < 2 * 1.0 + SLACK_S


def test_an_lm_without_bounds_is_called_as_before():
    """The deadlines belong to the LM; a hand-built LM without any is not cut."""
    lm = fake_lm(lambda call: (time.sleep(0.2), default_responder(call))[1])
    pred, _ = judge(lm)
    assert bounds_of(lm) is None and pred.abstentions == {} and pred.preference is not None


# --- item 5: abstentions in the summary ----------------------------------------------------------------------


def _fault_mix(call):
    """Per item: the critic's verdict fails at the server for 'down' items and never parses for 'garbled' ones."""
    question = call.inputs.get("question", "")
    critic = "critic" in call.inputs.get("persona", "").lower()
    if call.kind == "verdict" and critic and "down" in question:
        raise dspy.lm15.ServerError("boom", status=500)
    if call.kind == "verdict" and critic and "garbled" in question:
        return "no json here"
    return default_responder(call)


def _items(*questions):
    return [dspy.Example(id=f"i{n}", question=q, answer_1="a" * (10 + n), answer_2="b" * 30, label="2")
            .with_inputs(*builtin_task("pairwise").input_names) for n, q in enumerate(questions)]


def test_referee_abstentions_are_counted_by_cause_beside_whole_items(tmp_path):
    """A fault-mix run had 6 referee abstentions in its results file and the summary said
    'abstained: 0'. The summary now counts referee turns by cause beside whole items, and shows both."""
    cfg = DebateConfig(roles=("general_public", "critic"), turns=1)  # 2 referees x 2 orders
    items = _items("down 1", "garbled 2", "fine 3", "down 4")
    with dspy.context(lm=fake_lm(_fault_mix), adapter=DebateAdapter()):
        result = evaluate(build_evaluator(cfg), items, cfg, out=tmp_path / "r.jsonl")
    assert result.abstentions == {}  # the other referee decided every item
    assert result.abstention_counts() == {"items": {},
                                          "referee_turns": {"lm_error:LMServerError": 4, "parse_failure": 2}}
    cost = result.cost()
    assert cost["abstained_items"] == 0 and cost["abstained_referee_turns"] == 6
    text = summary_table(result.metrics(n_resamples=200), cost, {"model": "fake"}, abstentions=result.abstention_counts())
    print("\n" + text)
    assert "abstained items: 0" in text and "abstained referee turns: 6" in text
    assert re.search(r"lm_error:LMServerError\s+0\s+4", text) and re.search(r"parse_failure\s+0\s+2", text)
    assert re.search(r"total\s+0\s+6", text)
    # A resumed run reads the same counts back from the results file.
    with dspy.context(lm=fake_lm(_fault_mix), adapter=DebateAdapter()):
        resumed = evaluate(build_evaluator(cfg), items, cfg, out=tmp_path / "r.jsonl")
    assert resumed.resumed == 4 and resumed.abstention_counts() == result.abstention_counts()


def test_item_and_referee_abstentions_both_reach_the_metrics_for_mlflow():
    """The counts by cause as flat numeric metrics with names MLflow accepts everywhere."""
    result = RunResult(ONE_CALL)
    base = {"human": "1", "prediction": None, "calls": 2, "prompt_tokens": 0, "completion_tokens": 0, "seconds": 1.0}
    result.add({**base, "abstained": "lm_error:deadline",
                "abstentions": {"order1:critic@1": "lm_error:deadline", "order2:critic@1": "lm_error:deadline"}})
    result.add({**base, "abstained": "error:RuntimeError: kaboom"})  # a broken item has no referee record
    result.add({**base, "prediction": "1", "abstained": None, "abstentions": {"order1:critic@1": "parse_failure"}})
    found = result.abstention_metrics()
    assert found == {"abstained_items": 2.0, "abstained_referee_turns": 3.0,
                     "abstained_items/lm_error.deadline": 1.0, "abstained_items/error.RuntimeError": 1.0,
                     "abstained_referee_turns/lm_error.deadline": 2.0, "abstained_referee_turns/parse_failure": 1.0}
    assert all(re.fullmatch(r"[/\w.\- ]+", name) for name in found)  # MLflow's rule on every platform
    cost = result.cost()
    assert (cost["abstained_items"], cost["abstained_referee_turns"]) == (2, 3)
    text = summary_table({}, cost, {"model": "fake"}, abstentions=result.abstention_counts())
    assert re.search(r"lm_error:deadline\s+1\s+2", text) and re.search(r"error:RuntimeError\s+1\s+0", text)
