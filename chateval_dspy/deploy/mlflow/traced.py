"""A loaded ``Judge`` whose every judged item also becomes an MLflow trace (``chateval score --trace``, ``chateval
serve --trace``, ``mlflow_judge(..., trace=True)``). MLflow is imported when an item is traced, never on import."""

from __future__ import annotations

import contextlib
import time

from chateval_dspy.run.tracing import Tracer


class TracedJudge:
    """A loaded ``Judge`` whose every item also becomes a trace of ``tracer``; everything else (``evaluate_batch``
    too, untraced) is the judge's own."""

    def __init__(self, judge, tracer: Tracer):
        self.judge, self.tracer = judge, tracer

    def __getattr__(self, name):
        return getattr(self.judge, name)

    def judge_traced(self, item: dict, *, row: int | None = None, source: str = "item", parent=None,
                     quiet: bool = False):
        """``(verdict, trace id)`` for one item (the trace id is None when tracing failed, which is logged).

        ``parent``: a live span to nest the debate under. ``quiet``: no other spans while the panel judges
        (``mlflow.genai.evaluate``'s autologging would add a call-level copy of the debate to the trace).
        """
        judge = self.judge
        example = judge.example(item, row=row, source=source)
        with untraced() if quiet else contextlib.nullcontext():
            record = judge.record(example)  # kept: a Verdict drops the transcripts a trace is made of
        trace_id = self.tracer(record, {k: example[k] for k in judge.task.input_names}, ended_ns=time.time_ns(),
                               parent=parent)
        return judge.verdict(record), trace_id

    def __call__(self, item: dict, *, row: int | None = None, source: str = "item"):
        return self.judge_traced(item, row=row, source=source)[0]

    def close(self) -> None:
        self.tracer.flush()
        self.judge.close()

    def __enter__(self) -> TracedJudge:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def untraced():
    """A context in which MLflow's own tracing is paused for this thread (its autologging adds no spans)."""
    import mlflow

    return mlflow.tracing.context(enabled=False)
