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

MLflow is imported when a judge is first built, never when this module is imported.
"""

from __future__ import annotations

import contextlib
import typing
from collections.abc import Mapping
from functools import cache

from chateval_dspy.errors import DataError
from chateval_dspy.run.records import digest
from chateval_dspy.run.tracing import Tracer, dumps, preference_name, scrub, secret_values

MAX_RATIONALE_CHARS = 8000
SOURCES = ("inputs", "outputs", "expectations")
EXPECTED_RESPONSE = "expected_response"
ABSTAINED_CODE = "CHATEVAL_ABSTAINED"
SCORER_TRACE_ID = "mlflow.assessment.scorerTraceId"  # mlflow.tracing.constant.AssessmentMetadataKey.SCORER_TRACE_ID
SOURCE_RUN = "mlflow.sourceRun"  # mlflow.tracing.constant.TraceMetadataKey.SOURCE_RUN
PREFERRED = "preferred"  # <name>/preferred/<response or tie>: one boolean per possible preference
AGREEMENT = "agreement"  # <name>/agreement: the panel's preference equals the row's expected one
# Where a row's expectations state the expected preference: the names people's labels take (deploy.feedback). Not
# the scorer's own name: MLflow's result table would show that expectation in the feedback's own column.
EXPECTED_KEYS = ("label", "preference")


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
        from chateval_dspy.deploy.judge import Verdict
        from chateval_dspy.lm.adapter import JudgeAdapter
        from chateval_dspy.run.evaluate import judge_item

        # What Judge.__call__ does, keeping the record: a Verdict drops the transcripts a trace is made of.
        judge = self.judge
        example = item_from_record(item, judge.task, source=source, row=row)
        with _untraced() if quiet else contextlib.nullcontext(), dspy.context(lm=judge.lm, adapter=JudgeAdapter()):
            record = judge_item(judge.program, example, judge.config)
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


def _scorer_tracing() -> bool:
    import os

    return os.environ.get("MLFLOW_GENAI_EVAL_ENABLE_SCORER_TRACING", "").strip().lower() in ("true", "1")


def _untraced():
    import mlflow

    return mlflow.tracing.context(enabled=False)


# ---- rows to items, verdicts to feedback (plain data, no MLflow) -----------------------------------------------

def _lookup(row: dict, path: str):
    source, _, key = path.partition(".")
    if source not in SOURCES:
        raise DataError(f"fields: {path!r} must start with one of {', '.join(SOURCES)}")
    value = row.get(source)
    if key:
        if not isinstance(value, Mapping) or key not in value:
            raise DataError(f"fields: the row has no {path!r}")
        value = value[key]
    return value


def item_for(task, inputs=None, outputs=None, expectations=None, *, fields: Mapping[str, str] | None = None,
             item_id: str | None = None) -> dict:
    """The item a row of ``mlflow.genai.evaluate`` describes (see the module docstring for where each field
    comes from). Missing fields are left out: validating the item names them.

    Example:
        >>> from chateval_dspy.program.task import as_task
        >>> item_for(as_task("pairwise"), {"question": "2+2?"}, "4", {"expected_response": "5"})
        {'question': '2+2?', 'answer_1': '4', 'answer_2': '5', 'id': '...'}
        >>> item_for(as_task("pairwise"), {"question": "q"}, {"answer_1": "a"}, {"ref": "b"},
        ...          fields={"answer_2": "expectations.ref"}, item_id="row-1")["answer_2"]
        'b'
    """
    row = {"inputs": inputs, "outputs": outputs, "expectations": expectations}
    names = task.input_names
    item: dict = {}
    for ours, path in (fields or {}).items():
        if ours not in names and ours != "id":
            raise DataError(f"fields: {ours!r} is not an input of task {task.name!r} ({', '.join(names)})")
        item[ours] = _lookup(row, path)
    missing = [n for n in task.judged if n not in item]

    def take(source) -> None:
        if isinstance(source, Mapping):
            for name in names:
                if name not in item and name in source:
                    item[name] = source[name]
                    if name in missing:
                        missing.remove(name)

    take(inputs)
    if isinstance(inputs, Mapping) and "id" in inputs and "id" not in item:
        item["id"] = inputs["id"]
    take(outputs)
    if outputs is not None and not isinstance(outputs, Mapping) and missing:
        item[missing.pop(0)] = outputs if isinstance(outputs, str) else dumps(outputs)
    take(expectations)
    if isinstance(expectations, Mapping) and EXPECTED_RESPONSE in expectations and missing:
        item[missing.pop(0)] = expectations[EXPECTED_RESPONSE]
    if "id" not in item:
        item["id"] = item_id or digest({k: item[k] for k in names if k in item})
    item["id"] = str(item["id"])
    return item


def panel_rationale(verdict, task, names: Mapping[str, str] | None = None) -> str:
    """The panel's rationale: its verdict, then (pairwise) each answer order with what each referee voted, its
    scores and its evidence; (pointwise) each referee's evidence.

    Example:
        >>> from types import SimpleNamespace
        >>> from chateval_dspy.program.task import as_task
        >>> v = SimpleNamespace(winner="1", scores={"answer_1": 8.0, "answer_2": 3.5}, consistent=True,
        ...                     abstained=None, rationales={"critic": ["Answer 1 is right.", "Answer 2 is right."]},
        ...                     referees={"critic": [{"score_1": 8, "score_2": 3}, {"score_1": 7, "score_2": 4}]})
        >>> print(panel_rationale(v, as_task("pairwise"), {"critic": "Critic"}))
        Panel: prefers answer_1 (answer_1 8, answer_2 3.5); both answer orders agree.
        Order 1 (answers as given):
        - Critic prefers answer_1 (answer_1 8, answer_2 3): Answer 1 is right.
        Order 2 (answers swapped, answer_2 shown first; votes and scores name the answers as given):
        - Critic prefers answer_1 (answer_1 7, answer_2 4): Answer 2 is right.
    """
    names = names or {}
    lines = [_panel_head(verdict, task)]
    if task.format == "pairwise":
        lines += _order_lines(verdict, task, names)
    else:
        for slug, texts in (verdict.rationales or {}).items():
            lines += [f"{names.get(slug, slug)}: {text}" for text in texts]
    text = "\n".join(lines)
    return text if len(text) <= MAX_RATIONALE_CHARS else text[:MAX_RATIONALE_CHARS] + " [...]"


def _panel_head(verdict, task) -> str:
    pairwise = task.format == "pairwise"
    scores = ", ".join(f"{k} {_num(v)}" for k, v in (verdict.scores or {}).items())
    if verdict.abstained and (verdict.winner is None if pairwise else not verdict.scores):
        return f"Panel: no verdict ({verdict.abstained})."
    if not pairwise:
        return f"Panel: {scores}."
    agree = {True: "; both answer orders agree", False: "; the two answer orders disagree"}.get(verdict.consistent, "")
    return f"Panel: {_said(verdict.winner, task)}{f' ({scores})' if scores else ''}{agree}."


def _said(winner: str | None, task) -> str:
    if winner is None:
        return "gave no verdict"
    return "calls a tie" if winner == "tie" else f"prefers {preference_name(winner, task)}"


def _order_lines(verdict, task, names: Mapping[str, str]) -> list[str]:
    """Each answer order's heading, then each referee's vote, scores and evidence in that order.

    Votes and scores are the records' (order 2's mapped back to the answers as given), so they read like the panel's;
    a referee's own words name positions as it read them, which the heading of the swapped order says.
    """
    rationales, referees = verdict.rationales or {}, getattr(verdict, "referees", None) or {}
    slugs = list(dict.fromkeys([*rationales, *referees]))
    orders = max((len(v) for v in (*rationales.values(), *referees.values())), default=0)
    second = task.responses[1]
    lines = []
    for o in range(orders):
        lines.append("Order 1 (answers as given):" if o == 0 else
                     f"Order 2 (answers swapped, {second} shown first; votes and scores name the answers as given):")
        for slug in slugs:
            texts, verdicts = rationales.get(slug) or [], referees.get(slug) or []
            said = _referee_said(verdicts[o] if o < len(verdicts) else None, task)
            text = f": {texts[o]}" if o < len(texts) else ""
            lines.append(f"- {names.get(slug, slug)} {said}{text}")
    return lines


def _referee_said(verdict: dict | None, task) -> str:
    """A referee's verdict in words: its vote and its scores per response (``prefers answer_1 (answer_1 8, ...)``)."""
    from chateval_dspy.program.aggregate import vote

    if not isinstance(verdict, Mapping):
        return "gave no verdict"
    try:
        said = _said(vote(dict(verdict), task), task)
    except (KeyError, TypeError, ValueError):  # a verdict without the scores its vote is made of
        said = "voted"
    scores = []
    for c in task.criteria:
        got = [(r, verdict.get(f"{c.name}_{n}")) for n, r in enumerate(task.responses, start=1)]
        if all(v is not None for _, v in got):
            pairs = ", ".join(f"{r} {_num(v)}" for r, v in got)
            scores.append(pairs if len(task.criteria) == 1 else f"{c.name}: {pairs}")
    return f"{said} ({'; '.join(scores)})" if scores else said


def _num(v):
    return f"{v:g}" if isinstance(v, float) else str(v)


def as_preference(value, task) -> str:
    """An expected preference as ``"1"``, ``"2"`` or ``"tie"``, from any spelling a label file takes (``1``,
    ``"2"``, ``"tie"``, ``a``/``b``, a response's field name such as ``answer_1``).

    Example:
        >>> from chateval_dspy.program.task import as_task
        >>> as_preference("answer_2", as_task("pairwise")), as_preference(1, as_task("pairwise"))
        ('2', '1')
    """
    from chateval_dspy.data.loaders import LABELS

    aliases = {**LABELS, task.responses[0].lower(): "1", task.responses[1].lower(): "2"}
    label = None if isinstance(value, bool) or not isinstance(value, (str, int)) else aliases.get(str(value).strip().lower())
    if label is None:
        raise DataError(f"expectations: an expected preference must be {task.responses[0]}, {task.responses[1]} or tie "
                        f"(or 1, 2, a, b), got {value!r}")
    return label


def expected_preference(expectations, task) -> str | None:
    """The preference a row's ``expectations`` state under the first of ``EXPECTED_KEYS`` it has (``"1"``, ``"2"``,
    ``"tie"``), or None when it states none.

    Example:
        >>> from chateval_dspy.program.task import as_task
        >>> expected_preference({"expected_response": "Paris.", "label": "answer_2"}, as_task("pairwise"))
        '2'
    """
    if not isinstance(expectations, Mapping):
        return None
    for key in EXPECTED_KEYS:
        if expectations.get(key) is not None:
            return as_preference(expectations[key], task)
    return None


def feedback_metadata(verdict, task, *, model: str | None = None, trace_id: str | None = None) -> dict[str, str]:
    """What every Feedback of one verdict carries as metadata (text values, as MLflow keeps them)."""
    metadata = {"chateval.referees": dumps(verdict.referees), "chateval.scores": dumps(verdict.scores),
                "chateval.calls": str(verdict.calls), "chateval.prompt_tokens": str(verdict.prompt_tokens),
                "chateval.completion_tokens": str(verdict.completion_tokens), "chateval.seconds": str(verdict.seconds),
                "chateval.task": task.name}
    if verdict.consistent is not None:
        metadata["chateval.consistent"] = str(verdict.consistent).lower()
    if getattr(verdict, "criteria", None) is not None:
        metadata["chateval.criteria"] = dumps(verdict.criteria)
    if verdict.abstained:
        metadata["chateval.abstained"] = str(verdict.abstained)
    if model:
        metadata["chateval.model"] = model
    if trace_id:
        metadata[SCORER_TRACE_ID] = metadata["chateval.trace_id"] = trace_id
    return metadata


def _part(name: str, value, rationale: str, metadata: dict, error: str | None = None) -> dict:
    return {"name": name, "value": value, "rationale": rationale, "metadata": dict(metadata), "error": error}


def feedback_parts(verdict, task, *, name: str = "chateval", per_criterion: bool | None = None,
                   names: Mapping[str, str] | None = None, model: str | None = None,
                   trace_id: str | None = None, expected: str | None = None) -> list[dict]:
    """What each Feedback of one verdict holds: ``{name, value, rationale, metadata, error}`` (metadata as text).

    ``expected``: the row's expected preference (``"1"``, ``"2"`` or ``"tie"``; pairwise), for ``<name>/agreement``.

    Example:
        >>> from types import SimpleNamespace
        >>> from chateval_dspy.program.task import as_task
        >>> v = SimpleNamespace(winner="2", scores={"answer_1": 3.0, "answer_2": 8.0}, consistent=False,
        ...     abstained=None, rationales={}, referees={"critic": [{"score_1": 3, "score_2": 8}]}, calls=4,
        ...     prompt_tokens=100, completion_tokens=10, seconds=0.2,
        ...     criteria={"score": {"answer_1": 3.0, "answer_2": 8.0}})
        >>> [(p["name"], p["value"]) for p in feedback_parts(v, as_task("pairwise"), expected="1")]
        [('chateval', 'answer_2'), ('chateval/preferred/answer_1', False), ('chateval/preferred/answer_2', True),
         ('chateval/preferred/tie', False), ('chateval/agreement', False)]
        >>> [p["name"] for p in feedback_parts(v, as_task("pairwise"), per_criterion=True)][:2]
        ['chateval', 'chateval/score']
    """
    pairwise = task.format == "pairwise"
    per_criterion = (not pairwise) if per_criterion is None else per_criterion
    rationale = panel_rationale(verdict, task, names)
    metadata = feedback_metadata(verdict, task, model=model, trace_id=trace_id)
    missing = f"no verdict: {verdict.abstained or 'every referee abstained'}"

    def part(part_name, value):
        return _part(part_name, value, rationale, metadata, missing if value is None else None)

    if not pairwise:
        if per_criterion and len(task.criteria) > 1:
            return [part(f"{name}/{c.name}", (verdict.scores or {}).get(c.name)) for c in task.criteria]
        if per_criterion:
            return [part(name, (verdict.scores or {}).get(task.criteria[0].name))]
        return [part(name, dict(verdict.scores) if verdict.scores else None)]
    parts = [part(name, preference_name(verdict.winner, task))]
    if per_criterion:
        parts += [part(f"{name}/{c.name}", (verdict.criteria or {}).get(c.name)) for c in task.criteria]
    return parts + preference_parts(verdict, task, name=name, expected=expected, metadata=metadata)


def preference_parts(verdict, task, *, name: str, expected: str | None = None, metadata: dict | None = None) -> list[dict]:
    """The yes/no Feedbacks that ``mlflow.genai.evaluate`` averages into a pairwise run's metrics.

    A preference (``answer_2``, ``tie``) is a category, which MLflow leaves out of its aggregate metrics (it averages
    numbers, booleans and yes/no only, and hands custom aggregations those numbers alone). So each possible
    preference gets a boolean ``<name>/preferred/<response or tie>``, whose mean is the share of items where the
    panel preferred it (``<name>/preferred/answer_1/mean``; an abstention is false in all three, so the shares and
    the abstentions add up to one); with an ``expected`` preference, ``<name>/agreement`` says whether the panel
    agreed (an abstention disagrees, as in the accuracy of ``chateval evaluate``).
    """
    metadata = metadata or {}
    said = preference_name(verdict.winner, task)
    because = f"The panel {_said(verdict.winner, task)}" + (f" ({verdict.abstained})." if said is None else ".")
    parts = [_part(f"{name}/{PREFERRED}/{option}", said == option, because, metadata)
             for option in (*task.responses, "tie")]
    if expected is not None:
        parts.append(_part(f"{name}/{AGREEMENT}", verdict.winner == expected,
                           f"{because[:-1]}; expected: {preference_name(expected, task)}.", metadata))
    return parts


def instructions_of(judge) -> str:
    """What the panel judges, in words (the MLflow judge's ``instructions``).

    Example:
        >>> from types import SimpleNamespace
        >>> from chateval_dspy.config import DebateConfig
        >>> print(instructions_of(SimpleNamespace(config=DebateConfig(roles=("critic",), turns=1))))
        ChatEval panel on task 'faireval' (pairwise): referees critic debate for 1 round(s) (one_by_one) in both
        answer orders; verdicts aggregated by mean. Criteria: score (1-10): overall score of Assistant 1 or 2's
        answer. Inputs: question, answer_1, answer_2.
    """
    cfg = judge.config
    task = cfg.task_spec
    def described(c) -> str:  # a pairwise description is a template per response
        return c.description.replace("{n}", "1 or 2").replace("{response}", "each response")

    criteria = "; ".join(f"{c.name} ({c.scale}): {described(c)}" for c in task.criteria)
    orders = " in both answer orders" if cfg.orders == 2 else ""
    return (f"ChatEval panel on task {task.name!r} ({task.format}): referees {', '.join(cfg.roles)} debate for "
            f"{cfg.turns} round(s) ({cfg.strategy}){orders}; verdicts aggregated by {cfg.aggregate}. "
            f"Criteria: {criteria}. Inputs: {', '.join(task.input_names)}.")


def value_type(task, per_criterion: bool | None = None):
    """The Python type of the main Feedback's value.

    Example:
        >>> from chateval_dspy.program.task import as_task
        >>> value_type(as_task("pairwise"))
        typing.Literal['answer_1', 'answer_2', 'tie']
    """
    pairwise = task.format == "pairwise"
    if pairwise:
        return typing.Literal[(*task.responses, "tie")]
    per_criterion = True if per_criterion is None else per_criterion
    if not per_criterion:
        return dict
    scale = task.criteria[0].scale
    return typing.Literal[scale.labels] if scale.labels else float


# ---- the MLflow class, built on first use -------------------------------------------------------------------

@cache
def judge_class():
    """The MLflow judge class (a subclass of ``mlflow.genai.judges.base.Judge``), built at first use."""
    from mlflow.genai.judges.base import Judge as MlflowJudge
    from mlflow.genai.judges.base import JudgeField
    from pydantic import PrivateAttr

    class ChatEvalJudge(MlflowJudge):
        """A ChatEval panel as an MLflow GenAI judge (build it with ``chateval_dspy.mlflow_judge``)."""

        _judge = PrivateAttr(default=None)
        _traced = PrivateAttr(default=None)
        _fields = PrivateAttr(default=None)
        _per_criterion = PrivateAttr(default=None)

        @property
        def chateval(self):
            """The loaded ``Judge`` behind this scorer."""
            return self._judge

        @property
        def instructions(self) -> str:
            return instructions_of(self._judge)

        @property
        def feedback_value_type(self):
            return value_type(self._judge.task, self._per_criterion)

        def get_input_fields(self) -> list:
            task = self._judge.task
            return [JudgeField(name=i.name, description=i.description or i.name, value_type=str) for i in task.inputs]

        def __call__(self, *, inputs=None, outputs=None, expectations=None, trace=None):
            task = self._judge.task
            row_id = trace.info.trace_id if trace is not None else None
            item = item_for(task, inputs, outputs, expectations, fields=self._fields, item_id=row_id)
            # Read before the debate: a row whose expectation is unreadable costs no LM call.
            expected = expected_preference(expectations, task) if task.format == "pairwise" else None
            verdict, trace_id = _debate(self, item)
            return _feedbacks(self, verdict, trace_id=trace_id, expected=expected)

        def align(self, traces, optimizer=None):
            """A new judge tuned to the human feedback on ``traces`` (see ``align``); this one is left unchanged."""
            return align(self, traces, optimizer)

        def retuned(self, program, labels: dict):
            """This scorer's settings over ``program`` (a tuned copy of its panel); the card's ``labels`` say what
            it learned from."""
            judge = self._judge.with_program(program, {**self._judge.card, "labels": labels})
            return mlflow_judge(judge, name=self.name, trace=self._traced is not None, fields=self._fields,
                                per_criterion=self._per_criterion)

    return ChatEvalJudge


def _debate(scorer, item: dict):
    """``(verdict, trace id)`` of one row's item (the trace id is None unless the scorer traces its debates)."""
    judge, task = scorer.chateval, scorer.chateval.task
    try:
        if scorer._traced is not None:
            return scorer._traced.judge_traced(item, source="mlflow.genai.evaluate row", quiet=True)
        # MLflow autologs DSPy during genai.evaluate: a call-level trace of every debate that it deletes again at the
        # end (unless it traces scorers, when that detail is what the user asked for).
        with contextlib.nullcontext() if _scorer_tracing() else _untraced():
            return judge(item, source="mlflow.genai.evaluate row"), None
    except DataError as exc:
        raise DataError(f"{exc}. Name the task's inputs ({', '.join(task.input_names)}) in the row's inputs, "
                        "outputs or expectations, or map them: mlflow_judge(judge, fields={...})") from exc


def _feedbacks(scorer, verdict, *, trace_id: str | None, expected: str | None) -> list:
    """The MLflow ``Feedback`` objects of one verdict (``feedback_parts``), scrubbed of secrets."""
    from mlflow.entities import AssessmentError, AssessmentSource, AssessmentSourceType, Feedback

    judge = scorer.chateval
    names = {r.slug: r.name for r in getattr(judge.program, "roles", [])}
    source = AssessmentSource(source_type=AssessmentSourceType.LLM_JUDGE,
                              source_id=f"chateval:{getattr(judge.lm, 'model', '?')}")
    secrets = secret_values()
    out = []
    for p in feedback_parts(verdict, judge.task, name=scorer.name, per_criterion=scorer._per_criterion, names=names,
                            model=getattr(judge.lm, "model", None), trace_id=trace_id, expected=expected):
        p = scrub(p, secrets)
        error = AssessmentError(error_code=ABSTAINED_CODE, error_message=p["error"]) if p["error"] else None
        out.append(Feedback(name=p["name"], value=p["value"], rationale=p["rationale"], source=source,
                            metadata=p["metadata"], error=error))
    return out


def align(scorer, traces, optimizer=None):
    """``ChatEvalJudge.align``: the scorer's panel tuned to the human feedback people gave on ``traces``.

    The labels are read by ``chateval_dspy.deploy.feedback``'s rule (each reviewer's latest answer; majority or
    mean; even splits counted and left out). With no ``optimizer``, every referee's judge predictor gets up to
    ``DEFAULT_DEMOS`` labelled items as demonstrations (the ``labeled`` optimizer of ``chateval compile``: no LM
    call). Any other ``optimizer`` is an MLflow ``AlignmentOptimizer`` (``optimizer.align(scorer, traces)``), such
    as ``optim.align.CompileAligner("bootstrap")``, which runs one of ``chateval compile``'s DSPy optimizers over
    every referee's prompts. The aligned judge runs on the same LM; its card's ``labels`` lists the traces.
    """
    from chateval_dspy.deploy.feedback import labels_from_traces
    from chateval_dspy.errors import ConfigError
    from chateval_dspy.program.demos import DEFAULT_DEMOS, with_label_demos

    traces = list(traces)
    if optimizer is not None:
        return optimizer.align(scorer, traces)
    got = labels_from_traces(traces, scorer.chateval.task)
    if not got.items:
        raise ConfigError(f"align: none of the {len(traces)} traces carries usable human feedback (name it "
                          f"'label' or 'preference' for a pairwise task, else a criterion's name; "
                          f"{got.disagreements} even splits)")
    program = with_label_demos(scorer.chateval.program, list(got.items.values()), k=DEFAULT_DEMOS)
    return scorer.retuned(program, got.card())


def mlflow_judge(judge, *, name: str = "chateval", trace: bool = False, fields: Mapping[str, str] | None = None,
                 per_criterion: bool | None = None, description: str | None = None):
    """A loaded evaluator as an MLflow GenAI judge, for ``mlflow.genai.evaluate(data=..., scorers=[...])``.

    Args:
        judge: A loaded ``Judge`` (``chateval_dspy.load(path, model=...)``); it stays open as long as the scorer
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
    cls = judge_class()
    scorer = cls(name=name, description=description or instructions_of(judge), timeout=0)
    scorer._judge = judge
    scorer._fields = dict(fields) if fields else None
    scorer._per_criterion = per_criterion
    if trace:
        # A trace made during genai.evaluate belongs to its run, and MLflow deletes every trace of the run that
        # is not an evaluated row's (unless it traces scorers itself): a debate trace is the experiment's instead.
        tracer = Tracer(judge.config, roles=getattr(judge.program, "roles", None), model=getattr(judge.lm, "model", None),
                        tags={"chateval.command": "mlflow.genai.evaluate", "chateval.scorer": name},
                        metadata={SOURCE_RUN: ""})
        scorer._traced = TracedJudge(judge, tracer)
    return scorer


def __getattr__(name: str):
    # ``from chateval_dspy.deploy.mlflow_judge import ChatEvalJudge`` builds the class (and imports MLflow) then.
    if name == "ChatEvalJudge":
        return judge_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
