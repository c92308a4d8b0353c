"""A loaded ``Judge`` whose every judged item also becomes an MLflow trace (``chateval score --trace``, ``chateval
serve --trace``, ``mlflow_judge(..., trace=True)``). MLflow is imported when an item is traced, never on import."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from chateval_dspy.run.tracing import Tracer


class TracedJudge:
    """A loaded ``Judge`` whose every item also becomes an MLflow trace; everything else is the judge's own.

    ``chateval score --trace`` and ``chateval serve --trace`` wrap their judge in one; ``mlflow_judge(...,
    trace=True)`` uses ``judge_traced`` to link each feedback to its debate. (``evaluate_batch`` is the
    judge's own and is not traced.)

    Args:
        judge: A loaded ``Judge`` (``chateval_dspy.load``).
        tracer: The tracer (default: one for this judge's panel, personas and model, tagged with ``tags``).
        tags: Tags of every trace, for the default tracer.
    """

    def __init__(self, judge, tracer: Tracer | None = None, *, tags: Mapping[str, str] | None = None):
        self.judge = judge
        self.tracer = tracer or Tracer(judge.config, roles=getattr(judge.program, "roles", None),
                                       model=getattr(judge.lm, "model", None), tags=tags)

    def __getattr__(self, name):
        return getattr(self.judge, name)

    def judge_traced(self, item: dict, *, row: int | None = None, source: str = "item", parent=None,
                     quiet: bool = False):
        """``(verdict, trace id)`` for one item (the trace id is None when tracing failed, which is logged).

        ``parent``: a live span to nest the debate under (then the trace is that span's). ``quiet``: no other
        spans while the panel judges (MLflow's autologging, which ``mlflow.genai.evaluate`` switches on, would
        add a second, call-level copy of the debate to the trace).
        """
        import time

        import dspy

        from chateval_dspy.data.loaders import item_from_record
        from chateval_dspy.deploy.saved.judge import Verdict
        from chateval_dspy.lm.adapter import DebateAdapter
        from chateval_dspy.run.evaluate import result_record

        # What Judge.__call__ does, keeping the record: a Verdict drops the transcripts a trace is made of.
        judge = self.judge
        example = item_from_record(item, judge.task, source=source, row=row)
        with untraced() if quiet else contextlib.nullcontext(), dspy.context(lm=judge.lm, adapter=DebateAdapter()):
            record = result_record(judge.program, example, judge.config)
        ended = time.time_ns()
        trace_id = self.tracer(record, {k: example[k] for k in judge.task.input_names}, ended_ns=ended, parent=parent)
        return Verdict.from_record(record, judge.task), trace_id

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
