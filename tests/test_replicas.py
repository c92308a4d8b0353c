"""Several servers of one model as one engine: the layout per core count, and how requests are spread."""

from __future__ import annotations

import json
import threading
import time

import dspy
import pytest
from dspy import lm15

from chateval_dspy.adapter import JudgeAdapter
from chateval_dspy.config import DebateConfig
from chateval_dspy.data import load_dataset, select
from chateval_dspy.engine import ReplicaEngine
from chateval_dspy.evaluate import evaluate
from chateval_dspy.fake_lm import ScriptedEngine
from chateval_dspy.lm import embedded_layout
from chateval_dspy.program import build_evaluator


@pytest.mark.parametrize(("slots", "threads", "cores", "layout"), [
    (1, None, 2, [(1, 2)]),               # one request at a time: one server with every core
    (2, None, 2, [(1, 1), (1, 1)]),       # two at once on two cores: a single-threaded server each
    (4, None, 2, [(2, 1), (2, 1)]),       # more requests than cores: slots shared out
    (3, None, 2, [(2, 1), (2, 1)]),
    (4, None, 16, [(1, 4)] * 4),
    (3, None, 16, [(1, 5)] * 3),
    (2, 1, 2, [(1, 1), (1, 1)]),
    (1, 1, 2, [(1, 1)]),                  # --threads 1 leaves the other core alone
    (4, 2, 2, [(4, 2)]),                  # fixed threads that fill the machine: one server
    (0, None, 2, [(1, 2)]),
    (2, None, 1, [(2, 1)]),
])
def test_layout(slots, threads, cores, layout):
    assert embedded_layout(slots, threads, cores) == layout
    assert sum(s for s, _ in layout) >= max(1, slots)


def _request(text: str) -> lm15.Request:
    return lm15.Request(model="m", messages=(lm15.Message.user(text),))


class _Recording(ScriptedEngine):
    def __init__(self, name: str, log: list, latency: float = 0.0, fail: bool = False):
        super().__init__(lambda call: {"evidence": name}, latency=latency)
        self.name, self.log, self.fail = name, log, fail
        self.supported_params = frozenset({"response_format", "temperature"}) if name == "b" else self.supported_params

    def complete(self, request):
        self.log.append((self.name, request.messages[-1].text))
        if self.fail:
            raise lm15.ServerError("down")
        return super().complete(request)


def test_requests_in_flight_go_to_different_replicas():
    log: list = []
    engine = ReplicaEngine([_Recording("a", log, latency=0.2), _Recording("b", log, latency=0.2)])
    threads = [threading.Thread(target=engine.complete, args=(_request(f"item {i}"),)) for i in range(2)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(name for name, _ in log) == ["a", "b"]
    assert time.perf_counter() - start < 0.35  # side by side, not in turn
    assert engine._busy == [0, 0]


def test_an_idle_replica_that_saw_the_same_item_is_preferred():
    log: list = []
    engine = ReplicaEngine([_Recording("a", log), _Recording("b", log)])
    engine.complete(_request("item X: first call"))   # both idle: a
    engine._last[1] = hash("item Y: ..."[:256])
    engine.complete(_request("item Y: ..."))           # b saw item Y last
    engine.complete(_request("item X: first call"))    # back to a
    assert [name for name, _ in log] == ["a", "b", "a"]


def test_a_failing_replica_raises_and_is_released():
    log: list = []
    engine = ReplicaEngine([_Recording("a", log, fail=True)])
    with pytest.raises(lm15.ServerError):
        engine.complete(_request("x"))
    assert engine._busy == [0]


def test_capabilities_are_what_every_replica_supports():
    engine = ReplicaEngine([_Recording("a", []), _Recording("b", [])])
    assert engine.supported_params == {"response_format", "temperature"}
    assert engine.supports_response_schema
    with pytest.raises(ValueError):
        ReplicaEngine([])


def test_a_debate_over_replicas_gives_the_same_results_as_over_one_engine(tmp_path):
    items = select(load_dataset("faireval")[0], "test", limit=4)
    cfg = DebateConfig(format="pairwise")

    def run(engine):
        lm = dspy.LM("fake/replicas", engine=engine, cache=False, temperature=0.0, max_tokens=256, num_retries=0)
        out = tmp_path / f"{id(engine)}.jsonl"
        with dspy.context(lm=lm, adapter=JudgeAdapter()):
            evaluate(build_evaluator(cfg), items, cfg, out=out, concurrency=2)
        records = [json.loads(line) for line in out.read_text().splitlines()]
        return sorted((r["id"], r["prediction"], r["calls"]) for r in records)

    single = run(ScriptedEngine())
    spread = ReplicaEngine([ScriptedEngine(latency=0.02), ScriptedEngine(latency=0.02)])  # calls overlap
    assert run(spread) == single
    assert all(e.calls for e in spread.replicas)  # both servers did work
