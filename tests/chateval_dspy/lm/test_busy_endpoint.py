"""The embedded default gave up on a busy machine. A timeout from a live server is not a dead
endpoint: the breaker counts it only when the endpoint also fails its liveness check (``/health``, else
``/v1/models``), and the engine's bounds follow the endpoint's measured speed (``lm.call_limits.Pace``), so a slow
run finishes, slower. A dead endpoint (``/health`` failing, a refused port) still stops the run.

The busy machine is a throttled fake server: ``/health`` and ``/v1/models`` answer at once, every chat completion
takes ``SLOW_S``, longer than the stated ``timeout``. Before this change each of its attempts counted as a failure
and the run stopped with "failed 4 attempts in a row (timed out)".
"""

from __future__ import annotations

import socket

import dspy
import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.errors import FatalLMError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.lm.breaker import Breaker
from chateval_dspy.lm.call_limits import MAX_SLOWDOWN, CallBounds, Pace
from chateval_dspy.lm.engine import RestartingEngine, endpoint_alive
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.run import records
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.evaluate_dataset import evaluate_dataset
from chateval_dspy.testing.fake_server import FakeOpenAIServer

CFG = DebateConfig(roles=("critic",), turns=1)  # 2 calls an item (both answer orders at once)
TIMEOUT_S, SLOW_S = 0.4, 0.7  # every chat completion takes longer than the stated timeout
STOPPED = r"failed \d+ attempts in a row \(timed out\): stopping the run"


def _items(n: int) -> list[dspy.Example]:
    return [dspy.Example(id=str(i), question=f"q{i}", answer_1="a" * (10 + i), answer_2="b" * 20, label="1")
            .with_inputs("question", "answer_1", "answer_2") for i in range(n)]


def test_a_slow_but_live_endpoint_finishes_the_run_with_verdicts(tmp_path):
    """Slower than the timeout but alive: the run finishes, every item judged (no abstention), its bounds stretched."""
    server = FakeOpenAIServer(delay=SLOW_S)
    with server as url:
        spec = LMSpec(model=url, timeout=TIMEOUT_S, breaker=2, cache=False)
        with spec.judging() as lm:
            run = evaluate(build_evaluator(CFG), _items(3), CFG, out=tmp_path / "r.jsonl")
            breaker, bounds = lm.engine.breaker, lm.engine.bounds
    print(f"\nslow live endpoint ({SLOW_S} s a call, timeout {TIMEOUT_S} s): {run.n} items, abstentions "
          f"{dict(run.abstentions)}, {breaker.slow} live timeout(s) not counted, attempt bound now {bounds.timeout:.1f} s")
    assert run.n == 3 and run.abstentions == {} and all(p is not None for p in run.predicted)
    assert breaker.error() is None and breaker.slow >= 1  # it did time out, and that did not count
    assert bounds.timeout > SLOW_S  # the pace followed the measured speed
    assert len(records.read_records(tmp_path / "r.jsonl")) == 3


def test_the_embedded_engine_on_a_busy_machine_finishes(tmp_path):
    """The embedded model's engine (a ``RestartingEngine`` over the in-process server; here the throttled fake stands
    in for the starved llama.cpp server): a slow server is neither counted as dead nor restarted."""
    restarts = []
    with FakeOpenAIServer(delay=SLOW_S) as url:
        engine = RestartingEngine(url, "fake-served", restart=lambda: restarts.append(1) or url, timeout=TIMEOUT_S,
                                  breaker=2)
        lm = dspy.LM("openai-compatible/fake-served", engine=engine, cache=False, num_retries=0)
        with dspy.context(lm=lm, adapter=DebateAdapter()):
            run = evaluate(build_evaluator(CFG), _items(2), CFG)
    assert run.n == 2 and run.abstentions == {} and restarts == [] and engine.breaker.error() is None


def test_a_slow_endpoint_whose_health_fails_still_stops_the_run(tmp_path):
    """Timeouts from an endpoint whose ``/health`` answers 503 count as before: the run stops, naming the endpoint."""
    with FakeOpenAIServer(delay=SLOW_S, health=503) as url:
        spec = LMSpec(model=url, timeout=TIMEOUT_S, breaker=2, cache=False)
        with pytest.raises(FatalLMError, match=STOPPED) as stopped:
            evaluate_dataset(DataSpec("faireval", limit=3), CFG, spec, out=tmp_path / "r.jsonl")
    assert url in str(stopped.value) and records.read_records(tmp_path / "r.jsonl") == []


def test_a_hanging_endpoint_stops_the_run_as_before(tmp_path):
    """The wedged fake (chat never answered, ``/health`` 503, ``/v1/models`` still listed) is dead, as before."""
    with FakeOpenAIServer(hang=True) as url:
        spec = LMSpec(model=url, timeout=TIMEOUT_S, breaker=2, cache=False)
        with pytest.raises(FatalLMError, match=STOPPED):
            evaluate_dataset(DataSpec("faireval", limit=2), CFG, spec, out=tmp_path / "r.jsonl")


def test_liveness_is_health_else_the_model_list_and_never_a_refused_port():
    with FakeOpenAIServer() as url:
        assert endpoint_alive(url)
    with FakeOpenAIServer(health=404) as url:  # no /health (a plain OpenAI-compatible server): its model list
        assert endpoint_alive(url)
    with FakeOpenAIServer(health=503) as url, FakeOpenAIServer(hang=True) as wedged:
        assert not endpoint_alive(url) and not endpoint_alive(wedged)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
        assert not endpoint_alive(refused, timeout=1)
    with FakeOpenAIServer(redirect="http://127.0.0.1:9") as url:  # a redirect is no answer
        assert not endpoint_alive(url)


def test_the_breaker_counts_a_timeout_only_when_the_liveness_check_fails():
    state, slowed = {"alive": True}, []
    breaker = Breaker("http://x/v1", threshold=2, alive=lambda: state["alive"], on_slow=lambda: slowed.append(1))
    for _ in range(5):
        assert breaker.failed("timed out") is None
    assert breaker.failures == 0 and breaker.slow == 5 and len(slowed) == 5
    assert breaker.failed("no connection") is None and breaker.failures == 1  # a refused port is no slowness
    breaker.succeeded()
    state["alive"] = False
    breaker._probe = None  # the cached answer is for PROBE_TTL_S; a test need not wait it out
    assert breaker.failed("timed out") is None and breaker.failed("timed out") is not None
    assert "(timed out)" in str(breaker.error())
    assert Breaker("http://y/v1", threshold=1).failed("timed out") is not None  # no check (a model string): counts


def test_the_pace_stretches_the_stated_bounds_to_the_measured_speed_within_its_ceiling():
    stated = CallBounds.derive(10)
    pace = Pace(stated)
    pace.answered(seconds=0.5, tokens_used=500, tokens_asked=800)  # fast: 3 x 0.8 s < 10 s, the stated floor holds
    assert pace.bounds() == stated
    pace.answered(seconds=20.0, tokens_used=500, tokens_asked=800)  # 16x slower: 3 x 32 s an attempt at once
    assert pace.bounds().timeout == pytest.approx(96.0) and pace.bounds().call_deadline == pytest.approx(
        stated.call_deadline * 9.6)
    pace.answered(seconds=0.5, tokens_used=500, tokens_asked=800)  # faster again: it comes down gradually
    assert stated.timeout < pace.bounds().timeout < 96.0
    for _ in range(20):
        pace.timed_out()
    assert pace.bounds().timeout == stated.timeout * MAX_SLOWDOWN  # never unbounded


def test_a_warm_up_starts_the_pace_from_the_machines_speed_now():
    """The embedded engine times one short request before the run (``warm_up``): on a slow machine its bounds start
    stretched, so the first real calls do not time out; a warm-up that times out stretches them too."""
    with FakeOpenAIServer(delay=0.3) as url:
        engine = RestartingEngine(url, "fake-served", restart=lambda: url, timeout=TIMEOUT_S)
        engine.warm_up(tokens_asked=2048)
        assert engine.bounds.timeout > TIMEOUT_S and engine.breaker.failures == 0
    with FakeOpenAIServer(delay=SLOW_S) as url:
        engine = RestartingEngine(url, "fake-served", restart=lambda: url, timeout=TIMEOUT_S)
        engine.warm_up(tokens_asked=2048)
        assert engine.bounds.timeout == 2 * TIMEOUT_S


def test_the_start_up_benchmark_renders_both_quick_starts_and_ends_its_load(tmp_path):
    """The quick start idle and under load, side by side (benchmarks/startup.md); its busy processes end with it.
    Measured runs are read back from the raw file, so this renders without starting the model."""
    import json
    import os

    from optim.bench.startup import cpu_load, quick_start, quick_start_markdown

    with cpu_load(2) as pids:
        assert len(pids) == 2 and all(os.path.exists(f"/proc/{pid}") for pid in pids)
    assert not any(os.path.exists(f"/proc/{pid}") for pid in pids)  # ended and reaped
    raw = tmp_path / "quick.jsonl"
    rows = [{"machine": m, "limit": 2, "load_processes": 8, "load_average_before": la, "seconds": s, "exit": 0,
             "items": 2, "judged": 2, "abstained": 0, "per_item": s / 2, "finished": True, "error": None}
            for m, la, s in (("idle", 0.5, 60.0), ("loaded", 8.2, 300.0))]
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    quick = quick_start(2, 8, 10.0, raw)  # both runs are in the raw file: nothing is measured again
    text = quick_start_markdown(quick)
    assert "| as it is (no added load) | 0.5 | 60.0 | 30.0 | 0 | 2 of 2 | 0 | True |" in text
    assert "loaded (8 busy processes on" in text and "| 300.0 | 150.0 |" in text
