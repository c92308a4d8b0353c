"""The review queue as a reviewer works through it: what MLflow holds, read for the review page, and answers written
back the way MLflow's own Review page writes them.

- The queue (``mlflow.genai.review_queues``): its assigned reviewers and its items (traces), in the order they were
  queued (``chateval review`` queues the most uncertain first).
- Its questions: the queue's label schemas (``mlflow.genai.label_schemas``), read as ``questions.Question``, so the
  page asks exactly what MLflow's Review page asks.
- Each item: the judged item's fields as the debate's trace recorded them (its request), which of them are the
  judged texts (by the task: ``--task``, else the trace's ``chateval.task`` tag, else its format's built-in task),
  the panel's verdict (read back from the trace, shown only once the reviewer has answered) and people's answers.
- An answer: one MLflow Feedback per question, named after the question, with a ``HUMAN`` source whose id is the
  reviewer's own name. When every assigned reviewer has answered an item, its queue status becomes ``complete``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from chateval_dspy.deploy.trace_labels import human_answers, trace_inputs
from chateval_dspy.errors import ChatEvalError, ConfigError, DataError
from chateval_dspy.program.task import TaskSpec, as_task, load_task
from optim.review import sources
from optim.review.questions import Question

SHOW_PANEL_TAG = "chateval.review.show_panel.{queue_id}"  # an experiment tag: this queue shows the panel's verdict
MAX_ITEMS = 10_000


@dataclass
class ReviewItem:
    """One queued item: its trace, the fields to show (judged texts apart), the panel's verdict and the answers."""

    trace_id: str
    item_id: str
    inputs: dict[str, str]  # the item's other input fields, in the task's order
    judged: dict[str, str]  # the judged texts, by field name, in the task's order
    panel: dict  # the panel's verdict as a results record holds it (prediction, scores, consistent)
    answers: dict[str, dict[str, object]] = field(default_factory=dict)  # {question: {reviewer: value}}

    def answered_by(self, reviewer: str, questions: list[Question]) -> bool:
        return all(reviewer in self.answers.get(q.name, {}) for q in questions)


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

    def reload(self) -> None:
        """The queue's reviewers and items as MLflow holds them now (reviewers can be added while it is served)."""
        from mlflow.genai import review_queues

        found = review_queues.get_review_queue(self.queue_id)
        self.users = list(found.users)
        items = queue_items(self.queue_id)
        self.trace_ids = [i.item_id for i in sorted(items, key=lambda i: i.creation_time_ms or 0)]

    def answers(self) -> dict[str, dict[str, dict[str, object]]]:
        """``{trace id: {question: {reviewer: value}}}`` of every queued item (one search, no spans)."""
        queued = set(self.trace_ids)
        return {t.info.trace_id: human_answers(t) for t in sources.search(self.experiment_id, spans=False)
                if t.info.trace_id in queued}

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
        return ReviewItem(trace_id, sources.item_id_of(trace) or trace_id, inputs, judged,
                          sources.record_from_trace(trace, task) or {}, human_answers(trace))


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


def question_of(schema) -> Question:
    """A label schema read as the question it asks (categorical or numeric; other inputs are not answerable here)."""
    given = schema.input
    options = getattr(given, "options", None)
    if options and not getattr(given, "multi_select", False):
        return Question(schema.name, schema.instruction or "", options=tuple(str(o) for o in options))
    if type(given).__name__ == "InputNumeric":
        return Question(schema.name, schema.instruction or "", low=given.min_value, high=given.max_value)
    raise ConfigError(f"label schema '{schema.name}' asks for {type(given).__name__}; the review page answers "
                      "categorical and numeric questions (the ones chateval review makes)")


def queue_items(queue_id: str, status: str | None = None) -> list:
    """The queue's items (``status``: only those in it), every page, at most ``MAX_ITEMS``."""
    from mlflow.genai import review_queues

    items, token = [], None
    while True:
        page = review_queues.list_review_queue_items(queue_id, status=status, max_results=1000, page_token=token)
        items.extend(page)
        token = getattr(page, "token", None)
        if not token or len(items) >= MAX_ITEMS:
            return items


def find_queue(name: str, experiment_id: str):
    from mlflow.genai import review_queues

    token = None
    while True:
        page = review_queues.list_review_queues(experiment_id=experiment_id, page_token=token)
        found = next((q for q in page if q.name == name.strip()), None)
        token = getattr(page, "token", None)
        if found is not None or not token:
            return found


def open_desk(queue: str, *, experiment: str, task=None) -> Desk:
    """The named queue of ``experiment`` (name or id), opened for review; MLflow must already point at the store."""
    import mlflow
    from mlflow.genai import label_schemas

    found_experiment = mlflow.get_experiment_by_name(experiment) or \
        (mlflow.get_experiment(experiment) if experiment.isdigit() else None)
    if found_experiment is None:
        raise ConfigError(f"no MLflow experiment {experiment!r} in {mlflow.get_tracking_uri()}")
    experiment_id = found_experiment.experiment_id
    found = find_queue(queue, experiment_id)
    if found is None:
        raise ConfigError(f"no review queue '{queue}' in experiment {experiment!r}: make it with chateval review "
                          f"<results> --queue {queue} --reviewer NAME")
    asked = [question_of(label_schemas.get_label_schema(schema_id=s))
             for s in found.schema_ids]
    tags = found_experiment.tags or {}
    show = tags.get(SHOW_PANEL_TAG.format(queue_id=found.queue_id)) == "true"
    desk = Desk(found.queue_id, found.name, experiment_id, list(found.users), asked, show,
                load_task(task) if task else None)
    desk.reload()
    desk.questions = _in_task_order(desk)
    return desk


def _in_task_order(desk: Desk) -> list[Question]:
    """The questions in the order of the task's criteria (MLflow keeps a queue's schemas in no stated order)."""
    import mlflow

    task = desk.task or (task_of(mlflow.get_trace(desk.trace_ids[0])) if desk.trace_ids else None)
    order = {c.name: i for i, c in enumerate(task.criteria)} if task is not None else {}
    return sorted(desk.questions, key=lambda q: (order.get(q.name, len(order)), q.name))


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
        raise DataError(f"'{question.name}': answer a number from {question.low:g} to {question.high:g}") from None
    if not question.low <= value <= question.high:
        raise DataError(f"'{question.name}': answer a number from {question.low:g} to {question.high:g}")
    return int(value) if value.is_integer() else value


def record_answer(desk: Desk, trace_id: str, reviewer: str, values: dict[str, object]) -> None:
    """Each question's answer as a HUMAN Feedback under ``reviewer``; the item complete once all reviewers answered."""
    import mlflow
    from mlflow.entities import AssessmentSource, AssessmentSourceType
    from mlflow.genai import review_queues

    for question in desk.questions:
        mlflow.log_feedback(trace_id=trace_id, name=question.name, value=values[question.name],
                            source=AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id=reviewer))
    answers = human_answers(mlflow.get_trace(trace_id))
    done = all(all(u in answers.get(q.name, {}) for q in desk.questions) for u in desk.users)
    if done:
        review_queues.set_review_queue_item_status(desk.queue_id, item_id=trace_id, status="complete",
                                                   completed_by=reviewer)
