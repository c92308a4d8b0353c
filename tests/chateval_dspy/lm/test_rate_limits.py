"""A rate limit is not the item's fault. It used to turn
every item into a permanent abstention with exit status 0, and a rerun after the gateway recovered made no call
("resumed: 3"). Now the run waits within a stated bound (each Retry-After honoured up to a cap, all of them together
at most ``rate_limit_wait`` seconds), then stops like the breaker does, with an error saying rate limited, by which
endpoint and for how long; a rate-limited item is never recorded, so the rerun judges it. The same holds through a
LiteLLM model string, whose reason is the rate limit, not "no answer".

The bound is kept small here with ``rate_limit_wait`` (a parameter), and the gateway's Retry-After with the fake
server's ``retry_after``: nothing patches the clock.
"""

from __future__ import annotations

import time

import dspy
import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.lm.breaker import Breaker, RateLimited, breaker_of
from chateval_dspy.lm.call_limits import RATE_LIMIT_PAUSE_CAP_S
from chateval_dspy.lm.engine import bounds_of
from chateval_dspy.lm.resolve import LITELLM_ROUTE, resolve_lm
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.run import records
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.evaluate_dataset import evaluate_dataset
from chateval_dspy.testing.fake_server import FakeOpenAIServer

CFG = DebateConfig(roles=("critic",), turns=1)  # 2 calls an item
WAIT_S = 1.5  # the run's rate-limit bound in these tests (the default is 300 s)
SLACK_S = 5.0  # scheduling noise on shared cores
STOPPED = r"is rate limiting \(HTTP 429\): only 429s for [\d.]+ s.*stopping the run.*rate-limited items were not recorded"


def _items(n: int) -> list[dspy.Example]:
    return [dspy.Example(id=str(i), question=f"q{i}", answer_1="a" * (10 + i), answer_2="b" * 20, label="1")
            .with_inputs("question", "answer_1", "answer_2") for i in range(n)]


def test_a_gateway_that_always_answers_429_stops_the_run_unrecorded_and_the_rerun_judges_every_item(tmp_path):
    out, data = tmp_path / "r.jsonl", DataSpec("faireval", limit=3)
    server = FakeOpenAIServer(rate_limited=True, retry_after=0.2)
    with server as url:
        spec = LMSpec(model=url, timeout=2, rate_limit_wait=WAIT_S, cache=False)
        start = time.perf_counter()
        with pytest.raises(RateLimited, match=STOPPED) as stopped:
            evaluate_dataset(data, CFG, spec, out=out)
        seconds = time.perf_counter() - start
        asked = len(server.requests)
        print(f"\ngateway answering 429 (Retry-After 0.2 s), bound {WAIT_S} s: stopped after {seconds:.1f} s, "
              f"{asked} requests\n  {stopped.value}")
        assert url in str(stopped.value) and "rate_limit_wait" in str(stopped.value)
        # Waited out the bound, less the last Retry-After (no wait begins that would end past it), and no longer.
        assert WAIT_S - 0.2 <= seconds < WAIT_S + SLACK_S + 10
        assert records.read_records(out) == []  # no item recorded: no abstention to resume

        server.rate_limited = False  # the limit resets: the same command judges every item
        run = evaluate_dataset(data, CFG, spec, out=out)
    assert run.result.resumed == 0 and run.result.n == 3 and run.result.abstentions == {}
    assert all(p is not None for p in run.result.predicted)


def test_a_retry_after_longer_than_the_bound_stops_the_run_at_once(tmp_path):
    """``Retry-After: 86400`` cannot be waited out within the bound: the run stops at once, saying so."""
    with FakeOpenAIServer(rate_limited=True, retry_after=86400) as url:
        spec = LMSpec(model=url, timeout=2, rate_limit_wait=WAIT_S, cache=False)
        with spec.judging() as lm:
            start = time.perf_counter()
            with pytest.raises(RateLimited, match=r"asks to wait 86400 s \(Retry-After\)"):
                evaluate(build_evaluator(CFG), _items(3), CFG, out=tmp_path / "r.jsonl")
            assert time.perf_counter() - start < SLACK_S and lm.engine.breaker.error() is not None
    assert records.read_records(tmp_path / "r.jsonl") == []


def test_a_passing_rate_limit_is_waited_out_without_spending_retries_or_abstaining():
    """Four 429s (more than the 2 retries) with a short Retry-After: every item is judged, none abstains."""
    with FakeOpenAIServer(faults=[429] * 4, retry_after=0.1) as url:
        with resolve_lm(url, retries=2, timeout=2, rate_limit_wait=WAIT_S) as lm, \
                dspy.context(lm=lm, adapter=DebateAdapter()):
            run = evaluate(build_evaluator(CFG), _items(2), CFG)
    assert run.n == 2 and run.abstentions == {} and all(p is not None for p in run.predicted)


def test_a_model_string_lm_stops_with_the_rate_limit_as_its_reason(tmp_path):
    """Through a LiteLLM model string (each 429 reaches the debate's wait, which asks again): the 429s are waited out
    within the same bound, then the run stops saying rate limited, not "no answer"; nothing is recorded."""
    with FakeOpenAIServer(rate_limited=True, retry_after=0.1) as url, \
            resolve_lm("openai/fake-served", timeout=2, rate_limit_wait=WAIT_S) as lm:
        lm.kwargs.update(api_base=url, api_key="x")
        lm.cache = False
        start = time.perf_counter()
        with dspy.context(lm=lm, adapter=DebateAdapter()), pytest.raises(RateLimited, match=STOPPED) as stopped:
            evaluate(build_evaluator(CFG), _items(2), CFG, out=tmp_path / "r.jsonl")
        seconds = time.perf_counter() - start
    print(f"\nmodel string against a 429 gateway: stopped after {seconds:.1f} s\n  {stopped.value}")
    assert "no answer" not in str(stopped.value) and "openai/fake-served" in str(stopped.value)
    assert seconds < WAIT_S + SLACK_S
    assert records.read_records(tmp_path / "r.jsonl") == []


@pytest.mark.parametrize("retry_after", [30, 86400])
@pytest.mark.parametrize("route", ["lm15", pytest.param("litellm", marks=pytest.mark.slow)])  # importing LiteLLM: ~10 s
def test_a_model_string_lm_asked_to_wait_past_the_bound_stops_at_once_saying_so(tmp_path, retry_after, route):
    """DSPy's retry loop slept out the Retry-After unseen, and the silence opened the breaker as "no answer".
    The model-string LM makes one attempt a call, so its 429 reaches the breaker: the run stops as the direct path's.
    Both of DSPy's routes: its own client, and LiteLLM's (``litellm.RateLimitError``, which ``resolve_lm`` takes for
    models that cache at marked breakpoints)."""
    with FakeOpenAIServer(rate_limited=True, retry_after=retry_after) as url, \
            resolve_lm("openai/fake-served", timeout=2, rate_limit_wait=WAIT_S) as built:
        lm = built.copy(**LITELLM_ROUTE) if route == "litellm" else built  # as resolve_lm builds anthropic/...
        if route == "litellm":
            import litellm.main  # noqa: F401 - before the clock: its import takes seconds of its own
        assert breaker_of(lm) is breaker_of(built) and bounds_of(lm) == bounds_of(built)
        lm.kwargs.update(api_base=url, api_key="x")
        lm.cache = False
        start = time.perf_counter()
        with dspy.context(lm=lm, adapter=DebateAdapter()), pytest.raises(RateLimited, match=STOPPED) as stopped:
            evaluate(build_evaluator(CFG), _items(2), CFG, out=tmp_path / "r.jsonl")
        seconds = time.perf_counter() - start
    assert f"asks to wait {retry_after} s (Retry-After)" in str(stopped.value) and "no answer" not in str(stopped.value)
    assert seconds < SLACK_S  # not waited: the wait asked is longer than the run's bound
    assert records.read_records(tmp_path / "r.jsonl") == []


@pytest.mark.parametrize("retries", [0, 2])
def test_a_model_string_lm_retries_a_transient_failure_within_its_retries(retries):
    """Its retries moved out of DSPy's loop: a 503 is tried again up to ``retries`` times, and abstains without."""
    server = FakeOpenAIServer(faults=[503, 503])
    with server as url, resolve_lm("openai/fake-served", timeout=2, retries=retries, rate_limit_wait=WAIT_S) as lm:
        lm.kwargs.update(api_base=url, api_key="x")
        lm.cache = False
        assert lm.num_retries == 0  # one layer retries: the debate's wait for the call
        with dspy.context(lm=lm, adapter=DebateAdapter()):
            run = evaluate(build_evaluator(CFG), _items(1), CFG)
    lm_errors = {k: v for k, v in run.abstentions.items() if k.startswith("lm_error")}
    print(f"\n503 twice, retries={retries}: {len(server.requests)} requests, abstentions {dict(run.abstentions)}")
    assert (lm_errors == {}) is (retries > 0) and run.n == 1


def test_the_breakers_wait_honours_retry_after_up_to_its_cap_and_the_bound():
    breaker = Breaker("http://x/v1", rate_limit_wait=1000)
    assert breaker.rate_limited(0.5) == 0.5 and breaker.rate_limited(5.0, asked=5.0) == 5.0
    assert breaker.rate_limited(600.0, asked=600.0) == RATE_LIMIT_PAUSE_CAP_S  # waited in steps, asking again
    assert breaker.limiting
    breaker.succeeded()  # an answer ends the streak
    assert not breaker.limiting
    with pytest.raises(ConfigError, match="rate_limit_wait"):
        LMSpec(rate_limit_wait=0)
