"""The review queue as a reviewer works through it: what MLflow holds, read for the review page, and answers written
back the way MLflow's own Review page writes them (the reviewer's side: docs/review.md, "The review page").

Items come in the order they were queued, most uncertain first within a ``chateval review`` call: MLflow gives all
items of one call one creation time, so each trace carries its place in the call's ranking as the tag ``RANK_TAG``.
An answer is one ``HUMAN`` Feedback per question whose source id is the reviewer's name; a new answer deletes the
reviewer's earlier ones on the item, so that labels read what the reviewer says now.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from itertools import islice

from chateval_dspy.deploy.mlflow.trace_labels import trace_inputs
from chateval_dspy.errors import ChatEvalError, ConfigError, DataError
from chateval_dspy.program.task import TaskSpec, as_task, load_task
from optim.review import sources
from optim.review.questions import Question, question_of, questions

SHOW_PANEL_TAG = "chateval.review.show_panel.{queue_id}"  # an experiment tag: this queue shows the panel's verdict
RANK_TAG = "chateval.review.rank.{queue_id}"  # a trace tag: its place in the ranking of the call that queued it
CANT_JUDGE = "can't judge"  # the answer a reviewer gives when the item cannot be judged
CANT_JUDGE_CODE = "CANT_JUDGE"  # the error code of its Feedback
MAX_ITEMS = 10_000


@dataclass(frozen=True)
class Answer:
    """One reviewer's answer to one question: the value (or ``CANT_JUDGE``), their comment, when (ms)."""

    value: object
    comment: str = ""
    time_ms: int = 0


def _human_feedback(a) -> bool:
    source = getattr(a, "source", None)
    return type(a).__name__ == "Feedback" and source is not None and "HUMAN" in str(source.source_type).upper()


def reviews(trace) -> dict[str, dict[str, Answer]]:
    """``{question: {reviewer: Answer}}`` from a trace's human Feedback, each reviewer's latest (``CANT_JUDGE``
    included, unlike the labels reader ``trace_labels.human_answers``, which takes only values)."""
    latest: dict[str, dict[str, Answer]] = {}
    for a in trace.info.assessments or []:
        if not _human_feedback(a) or getattr(a, "valid", True) is False:
            continue
        value = getattr(a, "value", None)
        if value is None:
            if getattr(getattr(a, "error", None), "error_code", None) != CANT_JUDGE_CODE:
                continue
            value = CANT_JUDGE
        answer = Answer(value, getattr(a, "rationale", None) or "", a.create_time_ms or 0)
        by = latest.setdefault(a.name, {})
        who = a.source.source_id or "anonymous"
        if who not in by or answer.time_ms >= by[who].time_ms:
            by[who] = answer
    return latest


def values_of(found: dict[str, dict[str, Answer]]) -> dict[str, dict[str, object]]:
    return {name: {who: a.value for who, a in by.items()} for name, by in found.items()}


def has_answered(answers: dict[str, dict], reviewer: str, asked: list[Question]) -> bool:
    """Whether ``answers`` (``{question: {reviewer: value}}``) hold ``reviewer``'s answer to every question."""
    return all(reviewer in answers.get(q.name, {}) for q in asked)


@dataclass
class ReviewItem:
    """One queued item: its trace, the fields to show (judged texts apart), the panel's verdict and the answers."""

    trace_id: str
    item_id: str
    inputs: dict[str, str]  # the item's other input fields, in the task's order
    judged: dict[str, str]  # the judged texts, by field name, in the task's order
    panel: dict  # the panel's verdict as a results record holds it (prediction, scores, consistent)
    answers: dict[str, dict[str, object]] = field(default_factory=dict)  # {question: {reviewer: value}}
    comments: dict[str, str] = field(default_factory=dict)  # {reviewer: their comment on the item}


@dataclass
class Desk:
    """A queue opened for review: ``items`` in queue order (see the module docstring)."""

    queue_id: str
    name: str
    experiment_id: str
    users: list[str]
    questions: list[Question]
    show_panel: bool
    task: TaskSpec | None  # as given (--task); None: each trace's own
    trace_ids: list[str] = field(default_factory=list)
    guide: TaskSpec | None = None  # the task whose criteria the page's guidelines state (--task, else the first trace's)
    guidelines: str = ""  # the queue owner's guidelines and examples (Markdown, --guidelines)
    ranks: dict[str, int] = field(default_factory=dict)  # {trace id: place in its call's ranking}, read once per trace

    def reload(self) -> None:
        """The queue's reviewers and items as MLflow holds them now (reviewers can be added while it is served)."""
        from mlflow.genai import review_queues

        found = review_queues.get_review_queue(self.queue_id)
        self.users = list(found.users)
        items = queue_items(self.queue_id)
        if any(i.item_id not in self.ranks for i in items):  # new items: read their ranks (one search)
            tag = RANK_TAG.format(queue_id=self.queue_id)
            found = {t.info.trace_id: (t.info.tags or {}).get(tag) or "" for t in sources.search(self.experiment_id, spans=False)}
            for i in items:  # an item queued without a rank goes after the ranked ones of its call
                rank = found.get(i.item_id, "")
                self.ranks.setdefault(i.item_id, int(rank) if rank.isdigit() else MAX_ITEMS)
        self.trace_ids = [i.item_id for i in sorted(items, key=lambda i: (
            i.creation_time_ms or 0, self.ranks[i.item_id], i.item_id))]

    def overview(self) -> dict[str, tuple[str, dict[str, dict[str, Answer]]]]:
        """``{trace id: (item id, {question: {reviewer: Answer}})}`` of every queued item, in queue order (one
        search, no spans)."""
        queued = set(self.trace_ids)
        found = {t.info.trace_id: (sources.item_id_of(t) or t.info.trace_id, reviews(t))
                 for t in sources.search(self.experiment_id, spans=False) if t.info.trace_id in queued}
        return {t: found[t] for t in self.trace_ids if t in found}

    def answers(self) -> dict[str, dict[str, dict[str, object]]]:
        """``{trace id: {question: {reviewer: value}}}`` of every queued item (``CANT_JUDGE`` included)."""
        return {t: values_of(found) for t, (_, found) in self.overview().items()}

    def item(self, trace_id: str) -> ReviewItem:
        """The queued item of ``trace_id``, read from its trace."""
        import mlflow

        if trace_id not in self.trace_ids:
            raise ConfigError(f"trace {trace_id} is not in review queue '{self.name}'")
        trace = mlflow.get_trace(trace_id)
        if trace is None:
            raise DataError(f"trace {trace_id} of review queue '{self.name}' is gone from the tracking store")
        task = self.task or task_of(trace)
        fields = trace_inputs(trace)
        judged_names = task.responses if task.format == "pairwise" else task.judged
        judged = {n: str(fields[n]) for n in judged_names if n in fields}
        inputs = {n: str(v) for n, v in fields.items() if n not in judged and n != "id" and v not in (None, "")}
        order = {n: i for i, n in enumerate(task.input_names)}
        inputs = dict(sorted(inputs.items(), key=lambda kv: order.get(kv[0], len(order))))
        found = reviews(trace)
        comments = {who: a.comment for by in found.values() for who, a in by.items() if a.comment}
        return ReviewItem(trace_id, sources.item_id_of(trace) or trace_id, inputs, judged,
                          sources.record_from_trace(trace, task) or {}, values_of(found), comments)


def task_of(trace) -> TaskSpec:
    """The task a trace was judged on: its ``chateval.task`` tag when that names a built-in task, else its format's."""
    name = (trace.info.tags or {}).get("chateval.task")
    if name:
        try:
            return load_task(name)
        except ChatEvalError:
            pass  # a custom task's name: its file is not known here (pass --task)
    record = sources.record_from_trace(trace) or {}
    return as_task(record.get("format") or "pairwise")


def paged(list_page, *args, **kwargs):
    """Every entry of an MLflow listing, page after page."""
    token = None
    while True:
        page = list_page(*args, page_token=token, **kwargs)
        yield from page
        token = getattr(page, "token", None)
        if not token:
            return


def queue_items(queue_id: str, status: str | None = None) -> list:
    """The queue's items (``status``: only those in it), at most ``MAX_ITEMS``."""
    from mlflow.genai import review_queues

    return list(islice(paged(review_queues.list_review_queue_items, queue_id, status=status, max_results=1000),
                       MAX_ITEMS))


def find_queue(name: str, experiment_id: str):
    from mlflow.genai import review_queues

    return next((q for q in paged(review_queues.list_review_queues, experiment_id=experiment_id)
                 if q.name == name.strip()), None)


def find_experiment(name: str):
    """The MLflow experiment named ``name``, or whose id it is; None when there is none."""
    import mlflow

    return mlflow.get_experiment_by_name(name) or (mlflow.get_experiment(name) if name.isdigit() else None)


def open_desk(queue: str, *, experiment: str, task=None, guidelines: str = "") -> Desk:
    """The named queue of ``experiment`` (name or id), opened for review; MLflow must already point at the store.
    ``guidelines``: the queue owner's guidelines and examples (Markdown), shown on every item."""
    import mlflow
    from mlflow.genai import label_schemas

    found_experiment = find_experiment(experiment)
    if found_experiment is None:
        raise ConfigError(f"no MLflow experiment {experiment!r} in {mlflow.get_tracking_uri()}")
    experiment_id = found_experiment.experiment_id
    found = find_queue(queue, experiment_id)
    if found is None:
        raise ConfigError(f"no review queue '{queue}' in experiment {experiment!r}: make it with chateval review "
                          f"<results> --queue {queue} --reviewer NAME")
    asked = [question_of(label_schemas.get_label_schema(schema_id=s)) for s in found.schema_ids]
    tags = found_experiment.tags or {}
    show = tags.get(SHOW_PANEL_TAG.format(queue_id=found.queue_id)) == "true"
    desk = Desk(found.queue_id, found.name, experiment_id, list(found.users), asked, show,
                load_task(task) if task else None, guidelines=guidelines)
    desk.reload()
    desk.guide = desk.task or (task_of(mlflow.get_trace(desk.trace_ids[0])) if desk.trace_ids else None)
    desk.questions = in_task_words(desk.questions, desk.guide)
    return desk


def in_task_words(asked: list[Question], task: TaskSpec | None) -> list[Question]:
    """The questions in the order of the task's criteria (MLflow keeps a queue's schemas in no stated order), each
    in the task's current words where the task asks the same question (a queue keeps the words it was made with).

    Example:
        >>> old = Question("preference", "as the trace's inputs show them", options=("1", "2", "tie"))
        >>> in_task_words([old], as_task("pairwise"))[0].instruction  # doctest: +ELLIPSIS
        "Which answer is better overall: 1, 2, or tie. 1 is answer_1 (Assistant 1's answer), 2 is ..."
    """
    if task is None:
        return sorted(asked, key=lambda q: q.name)
    order = {c.name: i for i, c in enumerate(task.criteria)}
    try:
        now = {q.name: q for q in questions(task)}
    except ConfigError:  # a criterion the page cannot ask: keep the queue's words
        now = {}
    same = [now[q.name] if q.name in now and replace(now[q.name], instruction=q.instruction) == q else q
            for q in asked]
    return sorted(same, key=lambda q: (order.get(q.name, len(order)), q.name))


def check_answer(question: Question, raw: str | None):
    """A form's answer to ``question`` as the Feedback value (a label, or a number on the scale), else DataError.

    Example:
        >>> check_answer(Question("preference", "", options=("1", "2", "tie")), "tie")
        'tie'
        >>> check_answer(Question("relevance", "", low=1, high=5), "4")
        4
    """
    text = (raw or "").strip()
    if question.options:
        if text not in question.options:
            raise DataError(f"'{question.name}': answer one of {', '.join(question.options)}")
        return text
    try:
        value = float(text)
    except ValueError:
        value = math.nan  # out of every range: refused below
    if not question.low <= value <= question.high:
        raise DataError(f"'{question.name}': answer a number from {question.low:g} to {question.high:g}")
    return int(value) if value.is_integer() else value


def record_answer(desk: Desk, trace_id: str, reviewer: str, values: dict[str, object] | None,
                  comment: str = "") -> None:
    """Each question's answer as a HUMAN Feedback under ``reviewer`` (``values`` None: "can't judge"), with the
    comment as its rationale, replacing the reviewer's earlier answers; the item complete once all answered."""
    import mlflow
    from mlflow.entities import AssessmentError, AssessmentSource, AssessmentSourceType
    from mlflow.genai import review_queues

    _delete_answers(desk, trace_id, reviewer)
    source = AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id=reviewer)
    cant = AssessmentError(error_code=CANT_JUDGE_CODE, error_message="the reviewer could not judge this item")
    for question in desk.questions:
        said = {"error": cant} if values is None else {"value": values[question.name]}
        mlflow.log_feedback(trace_id=trace_id, name=question.name, source=source, rationale=comment or None, **said)
    answers = values_of(reviews(mlflow.get_trace(trace_id)))
    if all(has_answered(answers, u, desk.questions) for u in desk.users):
        review_queues.set_review_queue_item_status(desk.queue_id, item_id=trace_id, status="complete",
                                                   completed_by=reviewer)


def withdraw_answer(desk: Desk, trace_id: str, reviewer: str) -> int:
    """Delete ``reviewer``'s answers to the queue's questions on the item (the item pending again); how many."""
    from mlflow.genai import review_queues

    gone = _delete_answers(desk, trace_id, reviewer)
    if gone:
        review_queues.set_review_queue_item_status(desk.queue_id, item_id=trace_id, status="pending")
    return gone


def _delete_answers(desk: Desk, trace_id: str, reviewer: str) -> int:
    """Delete every HUMAN Feedback of ``reviewer`` on the queue's questions of the item; how many were deleted."""
    import mlflow

    names = {q.name for q in desk.questions}
    mine = [a for a in mlflow.get_trace(trace_id).info.assessments or []
            if _human_feedback(a) and a.name in names and a.source.source_id == reviewer]
    for a in mine:
        mlflow.delete_assessment(trace_id=trace_id, assessment_id=a.assessment_id)
    return len(mine)
