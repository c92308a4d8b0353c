"""Run a program over items, stream one JSON line per item, and report agreement and cost.

The Python API behind ``chateval evaluate`` (the CLI adds the progress bar and the table).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path

import dspy
from dspy.utils.callback import BaseCallback

from chateval_dspy.concurrency import bounded_unordered, run_gated
from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import ChatEvalError
from chateval_dspy.program.confidence import NEEDS_PERSON, Calibration, calibrated, line_confidence, lowest
from chateval_dspy.run.identity import context_identity
from chateval_dspy.run.identity import run_key as derive_run_key
from chateval_dspy.run.records import ResultsStream, check_result
from chateval_dspy.run.result import RunResult
from chateval_dspy.run.usage import ModelMeter, item_cost, item_tokens, usage_by_model

log = logging.getLogger(__name__)
TRUNCATION_MARK = " [... truncated {n} characters]"


def truncate(text: str, limit: int) -> tuple[str, int]:
    """Keep the first ``limit`` characters and say how many were cut.

    A judged text keeps its head (where answers state their point) and a visible marker, so no prompt overflows
    the model's context silently.

    Example:
        >>> truncate("abcdef", 3)
        ('abc [... truncated 3 characters]', 3)
    """
    if len(text) <= limit:
        return text, 0
    cut = len(text) - limit
    return text[:limit] + TRUNCATION_MARK.format(n=cut), cut


def prepare(item: dspy.Example, config: DebateConfig) -> tuple[dict, dict[str, int]]:
    """The item's inputs, with over-long texts truncated (and a warning naming item and field)."""
    inputs, cut = {}, {}
    for name in config.task_spec.input_names:
        inputs[name], n = truncate(item[name], config.max_text_chars)
        if n:
            cut[name] = n
            log.warning("item %s: field '%s' truncated by %d characters to %d (max_text_chars)",
                        item.id, name, n, config.max_text_chars)
    return inputs, cut


def empty_fields(item: dspy.Example, config: DebateConfig) -> list[str]:
    """The judged responses of ``item`` that are empty or only whitespace, each with a warning.

    They are judged as they are (a model that said nothing should lose), and the results line lists them.
    """
    empty = [name for name in config.task_spec.judged if not str(item.get(name) or "").strip()]
    for name in empty:
        log.warning("item %s: judged field '%s' is empty; judging it as it is (an empty response should lose)",
                    item.id, name)
    return empty


def result_record(program: dspy.Module, item: dspy.Example, config: DebateConfig) -> dict:
    """One item's result record (what a line of the results file holds; its fields: docs/tasks.md, docs/cost.md).

    ``empty``, ``group_id``, ``system_id`` and ``failed_calls`` are there only when they apply, so every other line is
    what it always was; ``cost_usd`` is None when any model used is unpriced; confidence: ``selective_fields``.
    """
    task = config.task_spec
    inputs, cut = prepare(item, config)
    empty = empty_fields(item, config)
    meter, failures = ModelMeter(), FailedCalls()
    start = time.perf_counter()
    callbacks = [*(dspy.settings.get("callbacks") or []), meter, failures]
    with dspy.track_usage() as usage, dspy.context(callbacks=callbacks):
        try:
            pred = program(**inputs)
            error = None
        except ChatEvalError:
            raise
        except Exception as exc:  # one broken item must not end a batch; it is recorded with its reason
            log.error("item %s failed: %s\n%s", item.id, exc, traceback.format_exc())
            pred, error = None, f"error:{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    record = {"id": item.id, "format": config.format}
    pairwise = task.format == "pairwise"
    record["human"] = item.get("label") if pairwise else item.get("human")
    for key in ("group_id", "system_id"):  # set only by --group-by/--system: other lines stay what they were
        if item.get(key) is not None:
            record[key] = item.get(key)
    if pred is None:
        record.update(prediction=None, abstained=error, calls=None)
    else:
        record.update(
            # pointwise: {criterion: score or label}, None when every referee abstained
            prediction=pred.preference if pairwise else None if pred.abstained else {a: pred[a] for a in task.output_fields},
            **({**{name: pred[name] for name in task.output_fields}, "order_preferences": pred.order_preferences}
               if pairwise else {}),
            consistent=pred.consistent, abstained=pred.abstained, abstentions=pred.abstentions,
            referees=pred.referees, transcripts=pred.transcripts, calls=pred.calls,
        )
    record.update(selective_fields(record, task, getattr(program, "calibration", None)))
    if pairwise and record["human"] is not None and record["abstained"] != NEEDS_PERSON:
        record["correct"] = record["prediction"] == record["human"]
    models, cached_calls, failed_calls = call_counts(usage, meter, failures.by_model(), record["calls"])
    record.update(item_tokens(models)._asdict(), cached_calls=cached_calls,
                  **({"failed_calls": failed_calls} if failed_calls else {}), seconds=round(seconds, 3),
                  truncated=cut, cost_usd=item_cost(models), usage_by_model=models)
    if empty:  # only then, so that every other line is what it always was
        record["empty"] = empty
    return record


def selective_fields(record: dict, task, calibration: Calibration | None) -> dict:
    """A results line's confidence fields, and what changes when its verdict is withheld.

    ``raw_confidence`` is ``line_confidence`` of the line; ``confidence`` is it through the program's
    ``calibration`` (``confidence_calibrated`` true), or the raw figure again (false). A verdict whose confidence
    (pointwise: its least confident criterion's, so a verdict is given whole or not at all) is below the threshold
    becomes ``withheld``, with ``prediction`` None and ``abstained`` ``needs_person`` (docs/selective.md).

    Example:
        >>> from chateval_dspy.program.confidence import ConfidenceMap
        >>> line = {"prediction": "1", "consistent": False, "abstained": None,
        ...         "referees": {"a": [{"score_1": 6, "score_2": 5}, {"score_1": 5, "score_2": 6}]}}
        >>> cal = Calibration(ConfidenceMap(raw=(0.0, 1.0), calibrated=(0.1, 0.9)), threshold=0.8, level=0.8, risk=0.1)
        >>> got = selective_fields(line, "pairwise", cal)
        >>> round(got["raw_confidence"], 3), round(got["confidence"], 3), got["withheld"], got["abstained"]
        (0.222, 0.278, '1', 'needs_person')
    """
    raw = line_confidence(record, task)
    confidence = calibrated(raw, calibration)
    out = {"raw_confidence": raw, "confidence": confidence, "confidence_calibrated": calibration is not None}
    if raw is not None and calibration is not None and not calibration.gives(lowest(confidence)):
        out.update(prediction=None, withheld=record["prediction"], abstained=NEEDS_PERSON)
    return out


class FailedCalls(BaseCallback):
    """Counts, per model, the LM calls of one item that raised or never ended (abandoned at a deadline).

    Example:
        >>> from chateval_dspy.testing.fake_lm import fake_lm
        >>> failures, lm = FailedCalls(), fake_lm(lambda call: 1 / 0)
        >>> with dspy.context(callbacks=[failures]):
        ...     try:
        ...         lm("hello")
        ...     except Exception:  # DSPy wraps it in its own
        ...         pass
        >>> failures.by_model()
        {'fake/scripted': 1}
    """

    def __init__(self):
        self._open: dict[str, str] = {}
        self._failed: dict[str, int] = {}
        self._lock = threading.Lock()

    def on_lm_start(self, call_id, instance, inputs) -> None:
        with self._lock:
            self._open[call_id] = str(getattr(instance, "model", "?"))

    def on_lm_end(self, call_id, outputs, exception=None) -> None:
        with self._lock:
            model = self._open.pop(call_id, None)
            if model is not None and exception is not None:
                self._failed[model] = self._failed.get(model, 0) + 1

    def by_model(self) -> dict[str, int]:
        """Failed calls per model so far; a call still open once its item is judged was given up on."""
        with self._lock:
            return dict(Counter(self._failed) + Counter(self._open.values()))


def call_counts(usage, meter: ModelMeter, failed: dict[str, int], calls: int | None) -> tuple[dict, int, int]:
    """An item's ``usage_by_model``, its cached calls and its failed calls, of its ``calls`` in all.

    DSPy records usage only for calls that reached the LM and answered. Of the others, those that raised (or were
    given up on) failed; only the rest were answered from DSPy's cache. A model's ``failed_calls`` is there only
    when some failed (and so is the record's), so that every other line is what it always was.
    """
    models = usage_by_model(usage.get_total_tokens(), usage.usage_data, meter)
    for model, n in failed.items():
        if model in models:
            figures = models[model]
            figures["cached_calls"] = max(0, figures["cached_calls"] - n)
            figures["failed_calls"] = n
    lm_calls = sum(len(entries) for entries in usage.usage_data.values())
    n_failed = sum(failed.values())
    return models, max(0, (calls or 0) - lm_calls - n_failed), n_failed


def evaluate(program: dspy.Module, items: Iterable[dspy.Example], config: DebateConfig, *, out: str | Path | None = None,
             concurrency: int = 1, on_item: Callable[[dict], None] | None = None, run_key: str | None = None,
             waves: bool = False) -> RunResult:
    """Judge ``items`` with ``program`` under the LM of the current DSPy context.

    Args:
        out: A JSONL file; one complete line per item is appended as soon as it is judged. If it already
            holds records of the same run (same ``run_key``), those items are not judged again: their
            records count in the result and the run goes on with the rest (resume after a crash or kill).
            One run writes it at a time (``locks.exclusive``); a symbolic link is refused.
        concurrency: Items judged at once (bounded; results may finish out of order).
        on_item: Called with each record (the CLI advances its progress bar here). If it has a ``resumed`` method
            (a ``Tracer``'s has), that is called first with the records resumed from ``out``.
        run_key: What identifies the run; stored in each record and checked on resume, so a file written by
            another run is refused (``ConfigError``). None: ``identity.run_key`` of the config, the LMs in the DSPy
            context, the items, the program's state and calibration; then lines of other items in ``out`` are
            dropped (``ResultsStream``). Only needed with ``out``; lines of items not in ``items`` never count.
        waves: Batch mode: the ``concurrency`` items judged at once make their calls in waves, each wave every
            call that can be made (``concurrency.run_gated``; the LM must be a batching one, ``lm.batch``).
    """
    ids = None
    if out is not None:
        items = list(items)  # hashed for the key and read for their ids, then judged: an iterator is read only once
        if run_key is None:
            calibration = getattr(program, "calibration", None)
            run_key = derive_run_key(config, context_identity(), items, program.dump_state(),
                                     calibration.to_dict() if calibration is not None else None)
            ids = [x.id for x in items]  # the key holds these items: a line of another item is no part of the run
    result = RunResult(config)
    with ResultsStream(out, run_key, ids=ids, check=check_result) as stream:
        # Only this call's items count: a caller may judge a run in parts (a search, its dev split in chunks).
        wanted = {str(x.id) for x in items} if out is not None else set()
        resumed = [r for r in stream.records if str(r["id"]) in wanted]
        for record in resumed:
            result.add(record)
        result.resumed = len(resumed)
        if resumed and callable(getattr(on_item, "resumed", None)):
            on_item.resumed(resumed)
        done = set(stream.done)  # finished before this run; grows no further while the items are drawn
        _judge_rest(program, (x for x in items if str(x.id) not in done), config, stream, result, on_item,
                    concurrency, waves)
    return result


def _judge_rest(program, todo, config, stream: ResultsStream, result: RunResult, on_item, concurrency: int,
                waves: bool) -> None:
    start = time.perf_counter()
    # DSPy keeps every call in lm.history; a long batch must not grow with it (results stream to disk instead).
    with dspy.context(disable_history=True):
        try:
            runner = run_gated if waves else bounded_unordered
            for _, record in runner(lambda x: result_record(program, x, config), todo, max(1, concurrency)):
                record = stream.append(record)  # one whole line, flushed and fsynced, before it counts
                result.add(record)
                if on_item:
                    on_item(record)
        finally:
            result.wall_seconds = time.perf_counter() - start
