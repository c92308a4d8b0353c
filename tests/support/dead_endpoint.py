"""A dead endpoint at the default settings (timeout 120 s, call deadline 250 s, breaker 4): how long a run takes to
stop, and how. ``python -m dead_endpoint OUT`` writes the figures to OUT as JSON; ``early_runs`` starts it as the
test run begins, since it is four minutes of real timeouts."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path


def run(out: Path) -> None:
    from chateval_dspy.lm.offline import ensure_offline

    ensure_offline()
    from chateval_dspy.config import DebateConfig
    from chateval_dspy.data.spec import DataSpec
    from chateval_dspy.lm.spec import LMSpec
    from chateval_dspy.run import records
    from chateval_dspy.run.evaluate_dataset import evaluate_dataset
    from chateval_dspy.testing.fake_server import FakeOpenAIServer

    results, error = out.with_suffix(".jsonl"), None
    with FakeOpenAIServer(hang=True) as url:
        spec = LMSpec(model=url, cache=False)
        start = time.perf_counter()
        try:
            evaluate_dataset(DataSpec("faireval", limit=3), DebateConfig(), spec, out=results)
        except Exception as e:  # noqa: BLE001 - the test says which error it expects
            error = f"{type(e).__name__}: {e}"
        seconds = time.perf_counter() - start
    figures = {"seconds": seconds, "error": error, "kept": len(records.read_records(results)),
               "bounds": dataclasses.asdict(spec.bounds()), "breaker": spec.breaker,
               "default_bounds": dataclasses.asdict(LMSpec().bounds()), "default_breaker": LMSpec().breaker}
    part = out.with_suffix(".part")
    part.write_text(json.dumps(figures), encoding="utf-8")
    part.replace(out)


if __name__ == "__main__":
    run(Path(sys.argv[1]))
