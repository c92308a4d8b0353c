"""Running a program over items: the batch runner (``evaluate``), its resumable results files and
run identity (``records``), agreement metrics with CIs, and the printed summary table."""

from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.result import RunResult

__all__ = ["RunResult", "evaluate"]
