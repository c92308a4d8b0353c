"""A loaded evaluator as an MLflow GenAI judge: ``mlflow_judge(judge)`` goes into ``mlflow.genai.evaluate``.

``mlflow_judge(chateval_dspy.load(path))`` is an ``mlflow.genai.judges.base.Judge`` (so a ``Scorer``). For each
row of ``mlflow.genai.evaluate(data=..., scorers=[...])`` it assembles the item from the row, lets the panel
debate it and returns ``Feedback``:

- **pairwise**: one Feedback per item whose value is the panel's preference, named as the task names the
  responses: ``"answer_1"``, ``"answer_2"`` (the built-in task; a custom task's ``responses``) or ``"tie"``; with
  ``per_criterion=True`` also one per criterion (``<name>/<criterion>``) whose value maps each response to its
  panel score (``{"answer_1": 7.5, "answer_2": 4.0}``). MLflow averages no category into a run's metrics, so
  each item also gets one boolean per possible preference (``<name>/preferred/answer_1``, ``.../answer_2``,
  ``.../tie``): the run's metrics ``<name>/preferred/<response or tie>/mean`` are the shares of items where the
  panel preferred each. A row whose ``expectations`` state the expected preference (``label`` or ``preference``:
  ``1``, ``2``, ``tie``, ``a``/``b`` or a response's name) also gets
  ``<name>/agreement`` (true when the panel agreed), averaged into ``<name>/agreement/mean``.
- **pointwise**: one Feedback per criterion (``<name>/<criterion>``; just ``<name>`` for a one-criterion task)
  whose value is the panel's score on the criterion's scale (a mean rating such as ``2.5`` on 1-3, or a label);
  ``per_criterion=False`` gives one Feedback whose value maps each criterion to its score.

Each Feedback's ``rationale`` is the panel's: its verdict, then per answer order (as given; swapped) each referee's
vote, scores and evidence (pointwise: each referee's evidence). Its ``metadata`` holds the referees' verdicts
(``chateval.referees``, JSON), position consistency (``chateval.consistent``), the scores, calls, tokens and
seconds, and with ``trace=True`` the id of the debate's own trace (``mlflow.assessment.scorerTraceId``, so the
MLflow UI links the feedback to the debate). An item on which every referee abstained gives a Feedback with an
error (``CHATEVAL_ABSTAINED``) and the reason.

Where the item comes from: the row's ``inputs`` (fields named as the task's inputs), then ``outputs`` (a dict of
such fields, or a text: the first judged response still missing), then ``expectations`` (such fields, and
``expected_response`` for the next judged response still missing). For the built-in pairwise task a row
``{"inputs": {"question": q}, "outputs": answer, "expectations": {"expected_response": reference}}`` thus
compares the app's answer (``answer_1``) with the reference (``answer_2``), as ``as_metric`` does. ``fields=``
maps any input explicitly (``{"answer_2": "expectations.reference"}``).

With ``trace=True`` each debate is one trace of its own (``chateval_dspy.run.tracing``: orders, rounds, referee
turns), tagged ``chateval.item_id`` (the evaluated row's trace id) and ``chateval.scorer``. It belongs to the
experiment, not to the evaluation run: ``genai.evaluate`` deletes every trace of its run that is not an evaluated
row's. While the panel debates, MLflow's own tracing is paused for that thread (``genai.evaluate`` autologs DSPy,
which would add a call-level copy of every debate that it then deletes), unless ``trace=False`` and you asked
MLflow to trace scorers (``MLFLOW_GENAI_EVAL_ENABLE_SCORER_TRACING=true``): then that call-level detail is what
its scorer traces show.

MLflow is imported when a judge is first built, never when this module is imported. The parts: ``genai_rows`` (a
row as an item), ``assessments`` (a verdict as Feedback parts), ``mlflow_scorer`` (the MLflow class), ``traced``
(a judge whose items are traced).
"""

from __future__ import annotations

from collections.abc import Mapping


def mlflow_judge(judge, *, name: str = "chateval", trace: bool = False, fields: Mapping[str, str] | None = None,
                 per_criterion: bool | None = None, description: str | None = None):
    """A loaded evaluator as an MLflow GenAI judge, for ``mlflow.genai.evaluate(data=..., scorers=[...])``.

    Args:
        judge: A loaded ``Judge`` (``chateval_dspy.load(path, lm=LMSpec(...))``); it stays open as long as the scorer
            is used.
        name: The Feedback name (per-criterion feedbacks are ``<name>/<criterion>``).
        trace: Also log each item's debate as its own MLflow trace (``chateval_dspy.run.tracing``) and link every
            Feedback to it (``mlflow.assessment.scorerTraceId``).
        fields: Our input field -> ``inputs.<key>``, ``outputs``, ``outputs.<key>`` or ``expectations.<key>``.
        per_criterion: Pairwise: add one Feedback per criterion (default no). Pointwise: one per criterion
            (default) or one whose value maps every criterion to its score.
        description: The scorer's description (default: the panel in words).

    The scorer has no timeout of MLflow's own (``timeout=0``): each item is bounded by the LM's item deadline.

    Example:
        >>> with chateval_dspy.load("programs/faireval-bootstrap") as judge:  # doctest: +SKIP
        ...     result = mlflow.genai.evaluate(data=rows, scorers=[chateval_dspy.mlflow_judge(judge)])
    """
    from chateval_dspy.deploy.mlflow.scorer import ChatEvalJudge

    return ChatEvalJudge.of(judge, name=name, trace=trace, fields=fields, per_criterion=per_criterion,
                            description=description)
