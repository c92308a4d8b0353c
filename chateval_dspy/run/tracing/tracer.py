"""``Tracer``: a batch's judged items traced one by one (``emitter.trace_record``), never raising into the batch.

A tracing fault is logged and counted. MLflow writes traces from a background queue: ``Tracer.flush`` waits for it
(about a second even when it is empty, since the queue polls once a second), and ``Tracer.link_to_run`` flushes,
then lists the traces under a run. A rerun traces the items a killed run wrote but did not trace (``catch_up``).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from chateval_dspy.run.tracing.emitter import trace_record

log = logging.getLogger(__name__)

# Traces created between two drains of MLflow's export queue (it drops traces when 1,000 tasks wait).
FLUSH_EVERY = 200
_RUN_KEY = re.compile(r"[\w.-]{1,100}")  # a run key as a trace filter may quote it


class Tracer:
    """Traces judged items one by one, as a batch's ``on_item`` callback or around a judge; never raises.

    Args:
        config: The panel's ``DebateConfig``, or a function of the record's format that returns it (as
            ``evaluate_dataset`` takes it); None: the format's built-in task.
        items: The items judged (``dspy.Example`` or dicts with ``id``), so each trace shows the texts the
            panel read; records carry no inputs of their own.
        experiment_id: Where the traces go (default: MLflow's active experiment).

    Example:
        >>> tracer = Tracer(items=[{"id": "q1", "question": "2+2?"}])
        >>> on_item = tracer.on_item(lambda record: None)   # evaluate(..., on_item=on_item)
        >>> tracer.trace_ids, tracer.failures
        ([], 0)
    """

    def __init__(self, config=None, *, roles=None, items: Iterable | None = None, model: str | None = None,
                 tags: Mapping[str, str] | None = None, metadata: Mapping[str, str] | None = None,
                 experiment_id: str | None = None, flush_every: int = FLUSH_EVERY):
        self._config, self._roles = config, roles
        self._inputs = {}
        for x in items or []:
            try:
                self._inputs[str(x["id"])] = x
            except (KeyError, TypeError):
                continue
        self.model, self.tags, self.metadata = model, dict(tags or {}), dict(metadata or {})
        self.experiment_id, self.flush_every = experiment_id, flush_every
        self.trace_ids: list[str] = []
        self.failures = 0
        self.seconds = 0.0  # spent making spans in the callers' threads (MLflow exports them in its own)
        self._lock = threading.Lock()
        self._since_flush = 0
        self._resolved: dict[str, tuple] = {}

    def _panel(self, fmt: str | None):
        """``(config, roles)`` for a record's format, resolved once per format."""
        key = fmt or ""
        if key not in self._resolved:
            config = self._config(fmt) if callable(self._config) else self._config
            roles = self._roles
            if roles is None and config is not None:
                try:
                    from chateval_dspy.program.roles import resolve_roles

                    roles = resolve_roles(config.roles, config.task_spec, config.role_file)
                except Exception as exc:  # noqa: BLE001 - personas are a nicety; the trace goes on without them
                    log.info("tracing without personas: %s", exc)
            self._resolved[key] = (config, roles)
        return self._resolved[key]

    def __call__(self, record: dict, inputs: Mapping[str, str] | None = None, *, ended_ns: int | None = None,
                 parent=None) -> str | None:
        """Trace one record (``inputs``: the item, else looked up by the record's id); returns the trace id,
        or None when the record is an error line or tracing failed (logged)."""
        if record.get("error") or "id" not in record:
            return None
        ended_ns = ended_ns if ended_ns is not None else time.time_ns()
        started = time.perf_counter()
        try:
            config, roles = self._panel(record.get("format"))
            if inputs is None:
                inputs = self._inputs.get(str(record["id"]))
            trace_id = trace_record(record, inputs, config=config, roles=roles, model=self.model, tags=self.tags,
                                    metadata=self.metadata, experiment_id=self.experiment_id, ended_ns=ended_ns, parent=parent)
        except Exception as exc:  # noqa: BLE001 - a trace is a view of the run; it must never stop the run
            with self._lock:
                self.failures += 1
                first = self.failures == 1
            (log.warning if first else log.debug)("could not trace item %s: %s: %s", record.get("id"),
                                                  type(exc).__name__, str(exc)[:300])
            return None
        drain = False
        with self._lock:
            self.seconds += time.perf_counter() - started
            if trace_id:
                self.trace_ids.append(trace_id)
            self._since_flush += 1
            if self.flush_every and self._since_flush >= self.flush_every:
                self._since_flush, drain = 0, True
        if drain:
            self.flush()
        return trace_id

    def on_item(self, callback: Callable[[dict], None] | None = None) -> Callable[[dict], None]:
        """An ``on_item`` callback that traces each record, then calls ``callback`` (a progress bar). Its
        ``resumed`` is ``catch_up``: ``evaluate`` calls it with the records it resumed, so that a rerun traces
        those a killed run wrote but did not trace."""

        def on_item(record: dict) -> None:
            self(record)
            if callback is not None:
                callback(record)

        on_item.resumed = self.catch_up
        return on_item

    def catch_up(self, records: Iterable[dict]) -> int:
        """Trace the ``records`` (read back from a results file) that have no stored trace of their run yet, so a
        rerun leaves one trace per item: a run killed after an item's results line and before MLflow stored its
        trace left it without one. Returns how many it traced; a fault is logged, never raised.

        A record is matched to its trace by run key and item id; one without a usable run key is left alone.
        A stored trace without a root span (a kill while MLflow wrote it) is deleted and made again.
        """
        records = [r for r in records if not r.get("error") and "id" in r and _RUN_KEY.fullmatch(str(r.get("run_key")))]
        if not records:
            return 0
        try:
            stored = self._stored({str(r["run_key"]) for r in records})
        except Exception as exc:  # noqa: BLE001 - a trace is a view of the run; it must never stop the run
            log.warning("could not look up the traces of resumed items, so none was traced again: %s: %s",
                        type(exc).__name__, str(exc)[:300])
            return 0
        missing = [r for r in records if (str(r["run_key"]), str(r["id"])) not in stored]
        if missing:
            log.info("tracing %d resumed item(s) that an interrupted run left without a trace", len(missing))
        return sum(self(r) is not None for r in missing)

    def _stored(self, keys: set[str]) -> set[tuple[str, str]]:
        """``(run key, item id)`` of the whole stored traces of runs ``keys``; torn ones are deleted."""
        import mlflow

        client = mlflow.MlflowClient()
        experiment = self.experiment_id or mlflow.tracking.fluent._get_experiment_id()
        whole, torn = set(), []
        for key in sorted(keys):
            token = None
            while True:
                page = client.search_traces(locations=[experiment], filter_string=f"tag.`chateval.run_key` = '{key}'",
                                            max_results=500, page_token=token, include_spans=True)
                for trace in page:
                    spans = trace.data.spans if trace.data is not None else []
                    # The root span ends, and is written, after every span under it: without it, a kill cut the
                    # writing short.
                    if any(s.parent_id is None for s in spans):
                        whole.add((key, (trace.info.tags or {}).get("chateval.item_id")))
                    else:
                        torn.append(trace.info.trace_id)
                token = page.token
                if not token:
                    break
        if torn:
            client.delete_traces(experiment, trace_ids=torn)
        return whole

    def flush(self) -> None:
        """Wait until MLflow has written every trace made so far."""
        try:
            import mlflow

            mlflow.flush_trace_async_logging()
        except Exception as exc:  # noqa: BLE001
            log.warning("flushing MLflow traces failed: %s", exc)

    def link_to_run(self, run_id: str) -> None:
        """Flush, then list the traces under the MLflow run ``run_id`` (its Traces tab)."""
        if not self.trace_ids:
            return
        self.flush()
        import mlflow

        client = mlflow.MlflowClient()
        for i in range(0, len(self.trace_ids), 100):  # MLflow links at most 100 traces per call
            try:
                client.link_traces_to_run(self.trace_ids[i:i + 100], run_id=run_id)
            except Exception as exc:  # noqa: BLE001
                log.warning("could not link traces to run %s: %s", run_id, str(exc)[:300])
                return
