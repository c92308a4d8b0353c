"""A loaded evaluator as an MLflow GenAI judge: ``mlflow_judge(judge)`` goes into ``mlflow.genai.evaluate``
(docs/production.md).

Its Feedback (``assessments``): pairwise, ``<name>`` is the preference (``answer_1``, ``answer_2`` or ``tie``, as the
task names its responses), with ``per_criterion=True`` also ``<name>/<criterion>`` (each response's score), one
boolean ``<name>/preferred/<response or tie>`` per possible preference (MLflow averages no category), and, when the
row's ``expectations`` state a preference (``label`` or ``preference``), ``<name>/agreement``; pointwise,
``<name>/<criterion>`` (``<name>`` for one criterion; ``per_criterion=False``: one mapping of every criterion). Each
carries the panel's rationale and, as metadata, the referees' verdicts, consistency and usage; an item with no
verdict gives the error ``CHATEVAL_ABSTAINED``.

The item (``genai_rows``): the task's inputs from the row's ``inputs``, then ``outputs`` (a dict, or a text: the
first judged response still missing), then ``expectations`` (``expected_response``: the next one), unless ``fields=``
maps them. With ``trace=True`` each debate is a trace of its own in the experiment (``genai.evaluate`` deletes its
run's other traces), linked by ``mlflow.assessment.scorerTraceId``; MLflow's own tracing pauses while the panel
debates, unless ``trace=False`` and ``MLFLOW_GENAI_EVAL_ENABLE_SCORER_TRACING=true``. MLflow is imported when a
judge is first built, never when this module is imported.
"""

from __future__ import annotations

from collections.abc import Mapping


def mlflow_judge(judge, *, name: str = "chateval", trace: bool = False, fields: Mapping[str, str] | None = None,
                 per_criterion: bool | None = None, description: str | None = None):
    """A loaded evaluator as an MLflow GenAI judge, for ``mlflow.genai.evaluate(data=..., scorers=[...])``.

    ``judge`` (``chateval_dspy.load``) stays open as long as the scorer is used; ``fields`` maps our input fields to
    ``inputs.<key>``, ``outputs``, ``outputs.<key>`` or ``expectations.<key>``; ``description`` defaults to the panel
    in words. The scorer has no timeout of MLflow's own (``timeout=0``): the LM's item deadline bounds each item.
    """
    from chateval_dspy.deploy.mlflow.scorer import ChatEvalJudge

    return ChatEvalJudge.of(judge, name=name, trace=trace, fields=fields, per_criterion=per_criterion,
                            description=description)
