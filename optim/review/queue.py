"""The most uncertain judged items into an MLflow review queue (``chateval review``; which items: docs/review.md).

``build_queue`` ranks a results file's items (or an experiment's traced debates) by ``uncertainty.U``, makes the
task's questions as label schemas in the traces' experiment, creates the named queue (or finds it) with its
reviewers, and attaches the chosen items' traces. Each answer is a Feedback on the trace, named as
``optim.tuning.labels`` reads it, so ``chateval compile --labels mlflow:<experiment>`` learns from it.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from chateval_dspy.errors import ChatEvalError, ConfigError
from chateval_dspy.program.task import TaskSpec, as_task, load_task
from optim.review import sources
from optim.review.desk import RANK_TAG, SHOW_PANEL_TAG, find_experiment, find_queue, paged, queue_items
from optim.review.questions import Question, questions
from optim.review.sizes import DEFAULT_TOP, MAX_REVIEWERS
from optim.review.uncertainty import Uncertainty, rank

PREFIX = "mlflow:"


@dataclass
class Ranked:
    """One ranked item: its uncertainty and its trace (None: the item was never traced)."""

    uncertainty: Uncertainty
    trace_id: str | None
    status: str = "not chosen"  # added, queued (before), answered, in another queue, no trace, not chosen


@dataclass
class QueueResult:
    """What ``build_queue`` did: the queue, where to open it, and what happened to each ranked item."""

    source: str
    experiment_id: str | None
    queue_id: str | None
    queue: str
    url: str | None
    ranked: list[Ranked] = field(default_factory=list)
    questions: list[str] = field(default_factory=list)
    created_questions: list[str] = field(default_factory=list)
    reviewers: list[str] = field(default_factory=list)
    origins: dict[str, int] = field(default_factory=dict)  # mlflow: sources: debates ranked, by ``origin``

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.ranked)

    @property
    def added(self) -> list[str]:
        """Trace ids attached by this call."""
        return [r.trace_id for r in self.ranked if r.status == "added"]


def resolve_task(task, records: list[dict]) -> TaskSpec:
    """The task spec given (name, file or spec), else the records' format's built-in task."""
    if task:
        return load_task(task)
    formats = {r.get("format") or "pairwise" for r in records}
    if len(formats) > 1:
        raise ConfigError(f"the items are of several formats ({sorted(formats)}); review one task at a time")
    return as_task(formats.pop() if formats else "pairwise")


def queue_url(uri: str, experiment_id: str, queue_id: str) -> str:
    """The queue in the MLflow UI (its Review page, the queue selected); a local store is served by ``mlflow ui``.

    Example:
        >>> queue_url("http://127.0.0.1:5000/", "3", "rq-1")
        'http://127.0.0.1:5000/#/experiments/3/review-queue?selectedQueueId=rq-1'
    """
    base = uri.rstrip("/") if uri.startswith(("http://", "https://")) else "http://127.0.0.1:5000"
    return f"{base}/#/experiments/{experiment_id}/review-queue?selectedQueueId={queue_id}"


def origin(trace) -> str:
    """Where a traced debate came from: a chateval run (evaluate, score or serve with --trace) judging a dataset's
    item, or the MLflow judge scoring a row of ``mlflow.genai.evaluate`` (tagged ``chateval.scorer``).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> origin(NS(info=NS(tags={"chateval.scorer": "chateval"}))), origin(NS(info=NS(tags={})))
        ('MLflow judge', 'chateval run')
    """
    return "MLflow judge" if (trace.info.tags or {}).get("chateval.scorer") else "chateval run"


def _schemas(experiment_id: str, wanted: list[Question]) -> tuple[list[str], list[str]]:
    """The label schema ids of ``wanted`` in the experiment, created where missing; (ids, names created)."""
    from mlflow.genai import label_schemas

    existing = {s.name: s for s in paged(label_schemas.list_label_schemas, experiment_id, max_results=100)}
    ids, created = [], []
    for q in wanted:
        schema = existing.get(q.name)
        if schema is None:
            schema = label_schemas.create_label_schema(q.name, type="feedback", input=q.mlflow_input(),
                                                       instruction=q.instruction, enable_comment=True,
                                                       experiment_id=experiment_id)
            created.append(q.name)
        elif not q.matches(schema):
            raise ConfigError(f"experiment {experiment_id}: its label schema '{q.name}' asks for other answers than "
                              "this task's; review in another experiment or delete that schema")
        ids.append(schema.schema_id)
    return ids, created


def _queue(experiment_id: str, name: str, reviewers: list[str], schema_ids: list[str]):
    """The named custom queue, created, or found and given any new reviewers."""
    from mlflow.genai import review_queues

    found = find_queue(name, experiment_id)
    if found is None:
        return review_queues.create_review_queue(name, queue_type="custom", users=reviewers, schema_ids=schema_ids,
                                                 experiment_id=experiment_id)
    if found.queue_type != "custom":
        raise ConfigError(f"review queue '{name}' in experiment {experiment_id} is a reviewer's own queue; "
                          "choose another --queue name")
    missing = [s for s in schema_ids if s not in found.schema_ids]
    users = list(dict.fromkeys([*found.users, *(r.strip().lower() for r in reviewers)]))
    if len(users) > MAX_REVIEWERS:
        raise ConfigError(f"review queue '{name}' would have {len(users)} reviewers; MLflow allows {MAX_REVIEWERS}")
    if missing or users != list(found.users):
        try:
            found = review_queues.update_review_queue(found.queue_id, users=users,
                                                      schema_ids=[*found.schema_ids, *missing] if missing else None)
        except Exception as exc:  # MLflow freezes a queue's questions once it holds items
            raise ConfigError(f"review queue '{name}' in experiment {experiment_id} asks other questions and holds "
                              f"items ({str(exc)[:200]}); choose another --queue name") from exc
    return found


def _queued(queue_id: str, status: str | None = None) -> set[str]:
    return {i.item_id for i in queue_items(queue_id, status)}


def _candidates(source: str, task, experiment: str | None):
    """(ranked items with their trace ids, the task, the experiment id or None, all its traces, the ranked debates
    counted by where they came from (``origin``; empty for a results file))."""
    import mlflow

    from optim.tracking import runs as tracking
    from optim.tuning.labels import parse_source

    traced_source = source.startswith(PREFIX)
    name, filter_string = parse_source(source) if traced_source else (experiment or tracking.EXPERIMENT, None)
    found = find_experiment(name)
    if not traced_source:
        records, spec = _results(source, task)
        every = sources.search(found.experiment_id, spans=False) if found is not None else []
        traces = sources.match(records, every)
        return ([(u, traces.get(str(r["id"]))) for r, u in rank(records, spec)], spec,
                getattr(found, "experiment_id", None), every, {})
    if found is None:
        raise ConfigError(f"{source}: no MLflow experiment named {name!r} in {mlflow.get_tracking_uri()}")
    every = sources.search(found.experiment_id, spans=False)
    traced = sources.search(found.experiment_id, filter_string)
    given = resolve_task(task, []) if task else None  # order 2's verdicts are mapped back on its criteria
    records = sources.debates(traced, given)
    if not records:
        raise ConfigError(f"{source}: no traced chateval debate in experiment {name!r}; judge items with "
                          "`chateval evaluate ... --trace` (or `chateval score ... --trace`) first")
    spec = given or resolve_task(None, records)
    by_id = {t.info.trace_id: t for t in traced}
    origins = dict(Counter(origin(by_id[r["trace_id"]]) for r in records))
    return [(u, r["trace_id"]) for r, u in rank(records, spec)], spec, found.experiment_id, every, origins


def _results(source: str, task) -> tuple[list[dict], TaskSpec]:
    """A results file's judged records, each in the shape of an evaluate line, and their task."""
    records = sources.read_results(source)
    spec = resolve_task(task, records)
    return [sources.normalized(r, spec) for r in records], spec


def rank_source(source: str, task=None) -> tuple[list[Ranked], TaskSpec]:
    """A results file's items ranked, most uncertain first, without MLflow (``chateval review --no-mlflow``)."""
    records, spec = _results(source, task)
    return [Ranked(u, None) for _, u in rank(records, spec)], spec


def _checked(queue: str, reviewers, top: int | None, budget: int | None) -> tuple[int, list[str]]:
    """(the queue's size rule, the reviewers' names), refused with the reason when they cannot make a queue."""
    from optim.tracking import runs as tracking

    if top is not None and budget is not None:
        raise ConfigError("give either top or budget, not both")
    size = top if top is not None else budget if budget is not None else DEFAULT_TOP
    if size < 1:
        raise ConfigError(f"{'budget' if budget is not None else 'top'} must be positive, got {size}")
    reviewers = list(dict.fromkeys(r.strip() for r in reviewers if r and r.strip()))
    if len(reviewers) > MAX_REVIEWERS:
        raise ConfigError(f"{len(reviewers)} reviewers given; an MLflow review queue takes at most {MAX_REVIEWERS}")
    if not queue or not queue.strip():
        raise ConfigError("name the review queue (--queue NAME)")
    for text, what in ((queue, "the queue name"), *((r, "a reviewer name") for r in reviewers)):
        tracking.assert_no_secrets(text, what)
    return size, reviewers


def _choose(result: QueueResult, *, queued_traces: set[str], queued: set[str], answered: set[str],
            elsewhere: set[str], size: int, budget: int | None) -> None:
    """Each ranked item's status: top takes the ``size`` most uncertain traced items, whatever became of them;
    budget adds new items until the queue holds ``size``."""
    room = size if budget is None else max(0, size - len(queued_traces))
    taken = added = 0
    for r in result.ranked:
        if r.trace_id is None or (budget is None and taken >= room):
            continue
        item = r.uncertainty.item_id
        if r.trace_id in queued_traces or item in queued:
            r.status = "queued"
        elif item in answered:
            r.status = "answered"
        elif item in elsewhere:
            r.status = "in another queue"
        elif added < room:
            r.status, added = "added", added + 1
        else:
            continue
        taken += 1


def _fill(result: QueueResult, asked: list[Question], every: list, *, reviewers: list[str], size: int,
          budget: int | None, show_panel: bool | None):
    """The questions and the queue made or found in MLflow, and the chosen items added; returns the queue."""
    import mlflow
    from mlflow.genai import review_queues

    from chateval_dspy.deploy.mlflow.trace_labels import human_answers

    names = {q.name for q in asked}
    item_of = {t.info.trace_id: sources.item_id_of(t) for t in every}
    # A person already answered one of the questions on the item (the answers labels are read from).
    answered = {item_of[t.info.trace_id] for t in every if set(human_answers(t)) & names}
    schema_ids, result.created_questions = _schemas(result.experiment_id, asked)
    found = _queue(result.experiment_id, result.queue, reviewers, schema_ids)
    queued_traces = _queued(found.queue_id)
    # Items still pending in the experiment's other queues: an item waits for one review at a time.
    elsewhere = {item_of.get(t, t) for other in paged(review_queues.list_review_queues, experiment_id=result.experiment_id)
                 if other.queue_id != found.queue_id for t in _queued(other.queue_id, status="pending")}
    _choose(result, queued_traces=queued_traces, queued={item_of.get(t, t) for t in queued_traces},
            answered=answered, elsewhere=elsewhere, size=size, budget=budget)
    if result.added:
        client, tag = mlflow.MlflowClient(), RANK_TAG.format(queue_id=found.queue_id)
        for n, trace_id in enumerate(result.added):  # one call's items share a creation time: the page reads these
            client.set_trace_tag(trace_id, tag, str(n))
        review_queues.add_items_to_review_queue(found.queue_id, item_ids=result.added)
    if show_panel is not None:
        mlflow.MlflowClient().set_experiment_tag(result.experiment_id, SHOW_PANEL_TAG.format(queue_id=found.queue_id),
                                                 "true" if show_panel else "false")
    return found


@contextlib.contextmanager
def _one_line(said: Callable[[str], str]) -> Iterator[None]:
    """MLflow's own errors (an unreachable server, a store it cannot open, a rejected name) as one ConfigError line,
    ``said(error type and text)``; the project's own errors pass as they are."""
    try:
        yield
    except ChatEvalError:
        raise
    except Exception as exc:
        raise ConfigError(said(f"{type(exc).__name__}: {str(exc)[:300]}")) from exc


def build_queue(source: str, *, queue: str, task=None, top: int | None = None, budget: int | None = None,
                reviewers: list[str] | tuple[str, ...] = (), experiment: str | None = None,
                tracking_uri: str | None = None, show_panel: bool | None = None) -> QueueResult:
    """Rank the judged items of ``source`` and put the most uncertain into the MLflow review queue ``queue``.

    Args:
        source: A results JSONL (of ``chateval evaluate``/``score``) or ``mlflow:<experiment>[?filter=...]``.
        queue: The queue's name (created in the traces' experiment if it does not exist).
        task: The task (name, file or ``TaskSpec``); default the items' format's built-in task.
        top: Take the ``top`` most uncertain items that have a trace (default ``DEFAULT_TOP``).
        budget: Instead of ``top``: keep the queue at ``budget`` items in all, adding the most uncertain new ones.
        reviewers: Users assigned to the queue (added to an existing queue's reviewers).
        experiment: Where a results file's traces are (default ``optim.tracking.runs.EXPERIMENT``).
        tracking_uri: The MLflow tracking store (default: as ``optim.tracking.runs`` resolves it).
        show_panel: Whether the review page shows the panel's verdict before a reviewer answers (None: as the
            queue says already; a new queue is blind).
    """
    import mlflow

    from optim.tracking import runs as tracking

    size, reviewers = _checked(queue, reviewers, top, budget)
    uri = tracking.tracking_uri(tracking_uri)
    mlflow.set_tracking_uri(uri)
    with _one_line(lambda why: f"{source}: cannot read its traces from MLflow at {uri} ({why})"):
        items, spec, experiment_id, every, origins = _candidates(source, task, experiment)
    ranked = [Ranked(u, trace_id, "not chosen" if trace_id else "no trace") for u, trace_id in items]
    result = QueueResult(source, experiment_id, None, queue.strip(), None, ranked, origins=origins)
    if not any(r.trace_id for r in ranked):
        where = f"experiment {experiment or tracking.EXPERIMENT!r} of {uri}"
        raise ConfigError(f"none of the {len(ranked)} items of {source} has a trace in {where}: judge them with "
                          "--trace (`chateval evaluate ... --trace --overwrite`, or a new --out: a resumed run traces "
                          "only the items it judges), or point --experiment/--tracking-uri at where they went")
    asked = questions(spec)
    for question in asked:
        tracking.assert_no_secrets(question.instruction, f"the question '{question.name}'")
    with _one_line(lambda why: f"review queue '{queue}' in experiment {experiment_id} of {uri}: {why}"):
        found = _fill(result, asked, every, reviewers=reviewers, size=size, budget=budget, show_panel=show_panel)
    result.queue_id, result.questions, result.reviewers = found.queue_id, [q.name for q in asked], list(found.users)
    result.url = queue_url(uri, experiment_id, found.queue_id)
    return result
