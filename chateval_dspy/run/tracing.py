"""Every debate an MLflow trace: one judged item becomes one trace that reads like the debate itself.

A trace is built *after* the item is judged, from what its results record already holds (the
transcripts, the referees' verdicts, tokens and seconds), with explicit span times. The debate loop
is untouched, so tracing off costs nothing, and a tracing fault is logged, never raised into a batch.

The span tree of one item (``debate_tree``)::

    chateval <task> · <item id>       root (EVALUATOR): the item as judged -> the panel's verdict (first)
    |-- order 1                       CHAIN: the item in this answer order (pairwise; pointwise has one order)
    |   |-- round 1                   CHAIN: "talk" or "verdict"
    |   |   |-- critic                LLM: persona and the discussion it was shown -> what it said (+ its verdict)
    |   |   |-- scientist
    |   |   `-- summarizer            (simultaneous_talk_with_summarizer, after each non-final round)
    |   `-- round 2 ...
    `-- order 2 (answers swapped) ...

The root's name is the trace's name in MLflow's trace list (``chateval faireval · q17``: task and item), and its
outputs (the trace's response preview) start with the verdict: the preferred response's field name or ``tie``
(pairwise), the scores (pointwise). The root carries the item's LM calls, tokens (``mlflow.chat.tokenUsage``, so
MLflow's trace list shows them), seconds and the panel's config; each trace is tagged ``chateval.item_id`` (and
``chateval.run_key``, ``chateval.task``, ``chateval.model`` and what the caller adds). Readers find the root by
its ``chateval.item_id`` attribute (``debate_span``), never by its name: traces written before the name carried
task and item have a root named just ``chateval``.

Timing: the debate measures every turn (its ``started`` epoch seconds, ``seconds``, and the
``prompt_tokens``/``completion_tokens`` of its LM calls, None when the LM cache answered) and each span
is laid out by them (``chateval.timing`` is ``"measured"``). Results files written before turns were
measured hold each item's total seconds only: then the item's time is laid out over its turns in speaking
order (concurrent turns of a round side by side) and every span says ``"estimated"``.

Secrets: every text that goes into a trace (span names, inputs, outputs, attributes, tags) is scrubbed of credential
values (``secret_values``: environment variables named like a key or token, the key file that
``CHATEVAL_API_KEY_FILE`` names, and values a command registers, such as ``chateval serve``'s token).

The default rule (``tracing_default``): ``--trace``/``--no-trace`` decide when given; otherwise tracing is
on when MLflow is the run's tracking target and the run judges at most ``DEFAULT_MAX_ITEMS`` items, a
number of debates a person will actually read. MLflow is the target of ``chateval evaluate`` unless
``--no-mlflow``, and of ``chateval score`` when ``--tracking-uri`` or ``$MLFLOW_TRACKING_URI`` names a store.
A server (``chateval serve``) judges an unbounded number of items: there it is off unless asked for.

MLflow writes traces from a background queue: ``Tracer.flush`` waits for it (about a second even when it is
empty, since the queue polls once a second), and ``Tracer.link_to_run`` flushes, then lists the traces under
a run. Cost (BENCHMARKS.md): a few milliseconds per item in the batch's thread, the writing in MLflow's.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from chateval_dspy.program import calibration
from chateval_dspy.program.debate import guard
from chateval_dspy.program.strategies import STRATEGIES, SUMMARIZER, Utterance, render
from chateval_dspy.program.task import as_task

log = logging.getLogger(__name__)

# Tracing is on by default for runs of at most this many items (and MLflow as the tracking target).
DEFAULT_MAX_ITEMS = 100
# Texts longer than this are cut in a trace (a trace is for reading; the results file keeps everything).
MAX_TRACE_TEXT = 20_000
# Traces created between two drains of MLflow's export queue (it drops traces when 1,000 tasks wait).
FLUSH_EVERY = 200
REDACTED = "[REDACTED]"
TRACE_HELP = (f"log each judged item as an MLflow trace (orders, rounds, referee turns). Default: on when MLflow "
              f"is the tracking target and the run judges at most {DEFAULT_MAX_ITEMS} items")
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)", re.I)
_MIN_SECRET_CHARS = 8
_registered: set[str] = set()
_NS = 1_000_000_000
_RUN_KEY = re.compile(r"[\w.-]{1,100}")  # a run key as a trace filter may quote it
# The root span's attribute that marks it as a debate's (the span readers look for) and holds the item's id.
ROOT_ATTRIBUTE = "chateval.item_id"
ROOT_PREFIX = "chateval"  # a root's name begins with it (and was exactly it before names carried task and item)
_NAME_ID_CHARS = 80  # an item id in a span name is cut here: the trace list shows one line per trace


# ---- secrets -----------------------------------------------------------------------------------------------

def secrets_in_environment() -> list[str]:
    """Values of environment variables that look like credentials (long enough to be one).

    Example:
        >>> import os
        >>> os.environ["DOCTEST_API_KEY"] = "sk-doctest-123456"
        >>> "sk-doctest-123456" in secrets_in_environment()
        True
        >>> del os.environ["DOCTEST_API_KEY"]
    """
    return [v for k, v in os.environ.items() if _SECRET_NAME.search(k) and len(v) >= _MIN_SECRET_CHARS]


def register_secret(value: str | None) -> None:
    """Treat ``value`` as a secret from now on (a token read from a variable of any name)."""
    if value and len(value) >= _MIN_SECRET_CHARS:
        _registered.add(value)


def secret_values() -> list[str]:
    """Every value no trace, param, tag or artifact may hold: credential variables, the key in the file that
    ``CHATEVAL_API_KEY_FILE`` names, and registered values; longest first, so a key inside another is not
    left half-masked."""
    found = set(secrets_in_environment()) | _registered
    key_file = os.environ.get("CHATEVAL_API_KEY_FILE")
    if key_file:
        try:
            key = Path(key_file).read_text(encoding="utf-8").strip()
        except OSError:
            key = ""
        if len(key) >= _MIN_SECRET_CHARS:
            found.add(key)
    return sorted(found, key=len, reverse=True)


def scrub(value, secrets: Iterable[str] | None = None):
    """``value`` (texts, and dicts and lists of them) with every secret replaced by ``[REDACTED]``.

    Example:
        >>> scrub({"said": "my key is sk-12345678", "n": [1, "sk-12345678"]}, secrets=["sk-12345678"])
        {'said': 'my key is [REDACTED]', 'n': [1, '[REDACTED]']}
    """
    secrets = secret_values() if secrets is None else list(secrets)
    if not secrets:
        return value
    return _scrub(value, secrets)


def _scrub(value, secrets: list[str]):
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, Mapping):
        return {_scrub(k, secrets) if isinstance(k, str) else k: _scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_scrub(v, secrets) for v in value]
    return value


# ---- the default rule --------------------------------------------------------------------------------------

def tracing_default(flag: bool | None, *, mlflow_target: bool, items: int | None) -> bool:
    """Whether to trace: the flag when given; else on when MLflow is the tracking target and the run judges a
    known number of items, at most ``DEFAULT_MAX_ITEMS`` (``items=None``: unbounded, a server).

    Example:
        >>> tracing_default(None, mlflow_target=True, items=20), tracing_default(None, mlflow_target=True, items=500)
        (True, False)
        >>> tracing_default(None, mlflow_target=False, items=5), tracing_default(True, mlflow_target=False, items=None)
        (False, True)
    """
    if flag is not None:
        return bool(flag)
    return mlflow_target and items is not None and items <= DEFAULT_MAX_ITEMS


def at_most_lines(path: str | Path, n: int) -> bool:
    """Whether the file has at most ``n`` non-blank lines, reading no further than line ``n + 1``
    (a cheap upper bound on its rows, for the default rule)."""
    count = 0
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                count += 1
                if count > n:
                    return False
    return True


# ---- the span tree, as plain data ----------------------------------------------------------------------------

CUT_MARK = re.compile(r" \[\.\.\. \d+ more characters in the results file\]$")  # how _cut ends a text it cut


def _cut(text: str) -> str:
    if len(text) <= MAX_TRACE_TEXT:
        return text
    return text[:MAX_TRACE_TEXT] + f" [... {len(text) - MAX_TRACE_TEXT} more characters in the results file]"


def was_cut(text) -> bool:
    """Whether a text read back from a trace is one that tracing cut to fit (its full text is not in the trace)."""
    return isinstance(text, str) and CUT_MARK.search(text) is not None


def _node(name: str, span_type: str, start: int, end: int, *, inputs=None, outputs=None, attributes=None,
          error: str | None = None, children=None) -> dict:
    return {"name": name, "span_type": span_type, "start_ns": int(start), "end_ns": int(max(end, start)),
            "inputs": inputs, "outputs": outputs, "attributes": attributes or {}, "error": error,
            "children": children or []}


def _measured(transcripts: list[list[dict]]) -> bool:
    utterances = [u for t in transcripts for u in t]
    return bool(utterances) and all(isinstance(u.get("started"), (int, float)) and
                                    isinstance(u.get("seconds"), (int, float)) for u in utterances)


def _steps(transcript: list[dict], concurrent: bool) -> list[list[int]]:
    """The transcript's utterance indices grouped into steps that follow one another in time: one per turn
    (one_by_one), or a round's turns side by side (concurrent strategies), and each summary on its own."""
    steps: list[list[int]] = []
    last_round = None
    for i, u in enumerate(transcript):
        if concurrent and u["speaker"] != SUMMARIZER and u["round"] == last_round and steps \
                and transcript[steps[-1][0]]["speaker"] != SUMMARIZER:
            steps[-1].append(i)
        else:
            steps.append([i])
        last_round = u["round"]
    return steps


def _times(transcripts: list[list[dict]], start: int, end: int, concurrent: bool) -> list[list[tuple[int, int]]]:
    """``(start_ns, end_ns)`` of every utterance: measured when the utterances carry their times, else the
    item's interval laid out over its sequential steps (equal shares)."""
    if _measured(transcripts):
        # The duration in its own int: added to epoch seconds first, it would lose its last digits to rounding.
        return [[(int(u["started"] * _NS), int(u["started"] * _NS) + int(u["seconds"] * _NS)) for u in t]
                for t in transcripts]
    plans = [_steps(t, concurrent) for t in transcripts]
    total = sum(len(p) for p in plans) or 1
    share = (end - start) / total
    out, k = [], 0
    for transcript, plan in zip(transcripts, plans):
        slots: list[tuple[int, int]] = [(start, start)] * len(transcript)
        for step in plan:
            for i in step:
                # Offsets in float, times in int: nanoseconds since 1970 exceed a float's precision.
                slots[i] = (start + int(k * share), start + int((k + 1) * share))
            k += 1
        out.append(slots)
    return out


def _shown(transcript: list[dict], i: int, strategy) -> list[Utterance]:
    """What the speaker of utterance ``i`` was shown: the strategy's rule over what was said before it."""
    before = [Utterance(**{k: u[k] for k in ("round", "speaker", "name", "text", "kind")}) for u in transcript[:i]]
    u = transcript[i]
    if u["speaker"] == SUMMARIZER:
        return [b for b in before if b.round == u["round"] or b.speaker == SUMMARIZER]
    return strategy.visible(before, u["round"]) if strategy is not None else before


def _as_said(verdict: dict | None, swapped: bool, task) -> dict | None:
    """A referee's verdict as it was given in its answer order (records keep order 2's mapped back)."""
    if verdict is None or not swapped:
        return verdict
    return calibration.unswap_scores(verdict, task)  # the swap is its own inverse


def _usage(prompt: int | None, completion: int | None) -> dict:
    prompt, completion = int(prompt or 0), int(completion or 0)
    return {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}


def preference_name(winner: str | None, task) -> str | None:
    """A pairwise verdict as people read it: the preferred response's field name, ``tie``, or None.

    Example:
        >>> preference_name("2", as_task("pairwise")), preference_name("tie", as_task("pairwise"))
        ('answer_2', 'tie')
    """
    if winner in ("1", "2"):
        return task.responses[int(winner) - 1]
    return winner


def root_name(task_name: str, item_id) -> str:
    """The root span's name, which MLflow shows as the trace's name: task and item.

    Example:
        >>> root_name("faireval", "q17")
        'chateval faireval · q17'
    """
    item = str(item_id)
    if len(item) > _NAME_ID_CHARS:
        item = item[:_NAME_ID_CHARS] + "..."
    return f"{ROOT_PREFIX} {task_name} · {item}"


def _panel_outputs(record: dict, task) -> dict:
    # The verdict leads: MLflow previews a trace's response as the start of the root's outputs JSON.
    if task.format != "pairwise":
        return {"scores": record.get("prediction"), "abstained": record.get("abstained")}
    out = {"verdict": preference_name(record.get("prediction"), task), "winner": record.get("prediction"),
           "consistent": record.get("consistent"), "abstained": record.get("abstained"),
           "order_preferences": record.get("order_preferences")}
    out.update({k: v for k, v in record.items() if re.fullmatch(r"[a-z][a-z0-9_]*_[12]", k)})
    return out


def config_summary(config) -> dict:
    """The panel's shape, as trace attributes.

    Example:
        >>> from chateval_dspy.config import DebateConfig
        >>> config_summary(DebateConfig(roles=("critic",), turns=1))["chateval.roles"]
        'critic'
    """
    if config is None:
        return {}
    return {"chateval.task": config.task_spec.name, "chateval.format": config.format,
            "chateval.strategy": config.strategy, "chateval.turns": config.turns,
            "chateval.roles": ",".join(config.roles), "chateval.aggregate": config.aggregate,
            "chateval.calibrate": config.calibrate, "chateval.consensus_stop": config.consensus_stop}


def debate_tree(record: dict, inputs: Mapping[str, str] | None = None, *, config=None, roles=None,
                ended_ns: int | None = None) -> dict:
    """The span tree of one judged item as plain data: ``{name, span_type, start_ns, end_ns, inputs, outputs,
    attributes, error, children}`` per span (see the module docstring for the shape).

    Args:
        record: The item's results record (``run.evaluate.judge_item``: transcripts, referees, tokens, seconds).
        inputs: The item's inputs as given (truncated here as the panel saw them); None: the order spans name
            no judged texts.
        config: The panel's ``DebateConfig``: its task, strategy (what each speaker was shown) and limits;
            None: the record's format's built-in task, and no discussion shown.
        roles: The referees (``Role`` objects) for their personas; None: personas are left out.
        ended_ns: When the item finished (``time.time_ns()``; default now).

    Example:
        >>> record = {"id": "q1", "format": "pairwise", "prediction": "1", "consistent": True, "abstained": None,
        ...           "referees": {"critic": [{"score_1": 8, "score_2": 3}, {"score_1": 7, "score_2": 4}]},
        ...           "transcripts": [[{"round": 1, "speaker": "critic", "name": "Critic", "text": "1 wins",
        ...                             "kind": "verdict"}],
        ...                           [{"round": 1, "speaker": "critic", "name": "Critic", "text": "2 wins",
        ...                             "kind": "verdict"}]],
        ...           "calls": 2, "prompt_tokens": 100, "completion_tokens": 20, "seconds": 0.5}
        >>> tree = debate_tree(record, {"question": "2+2?", "answer_1": "4", "answer_2": "5"})
        >>> [(o["name"], [r["name"] for r in o["children"]]) for o in tree["children"]]
        [('order 1', ['round 1']), ('order 2 (answers swapped)', ['round 1'])]
        >>> turn = tree["children"][1]["children"][0]["children"][0]
        >>> turn["name"], turn["outputs"]["verdict"], tree["children"][1]["inputs"]["answer_1"]
        ('critic', {'score_1': 4, 'score_2': 7}, '5')
    """
    debate = _Debate.of(record, config, roles)
    task, transcripts = debate.task, record.get("transcripts") or []
    end = ended_ns if ended_ns is not None else time.time_ns()
    start = end - int(float(record.get("seconds") or 0.0) * _NS)
    times = _times(transcripts, start, end, bool(debate.strategy and debate.strategy.concurrent_rounds))
    if debate.measured and times and any(times):
        start = min(s for t in times for s, _ in t)
        end = max(end, max(e for t in times for _, e in t))
    shown_item = _shown_item(inputs, task, config)
    orders = [_order_node(debate, o, transcript, times[o], shown_item, start) for o, transcript in enumerate(transcripts)]
    root_inputs = {"id": str(record.get("id")), **(shown_item or {})}
    attributes = _root_attributes(record, config, debate.timing)
    failed = record.get("abstained") if record.get("calls") is None else None  # the item raised: no debate at all
    return _node(root_name(task.name, record.get("id")), "EVALUATOR", start, end, inputs=root_inputs,
                 outputs=_panel_outputs(record, task), attributes=attributes, error=failed, children=orders)


@dataclass(frozen=True)
class _Debate:
    """What every span of one item's tree is built from: the record and the panel that judged it."""

    record: dict
    task: object
    strategy: object
    personas: dict
    timing: dict

    @classmethod
    def of(cls, record: dict, config, roles) -> _Debate:
        task = config.task_spec if config is not None else as_task(record.get("format") or "pairwise")
        strategy = STRATEGIES.get(config.strategy) if config is not None else None
        personas = {r.slug: r.persona(task) for r in roles} if roles else {}
        measured = _measured(record.get("transcripts") or [])
        return cls(record, task, strategy, personas, {"chateval.timing": "measured" if measured else "estimated"})

    @property
    def measured(self) -> bool:
        return self.timing["chateval.timing"] == "measured"

    @property
    def referees(self) -> dict:
        return self.record.get("referees") or {}

    def swapped(self, o: int) -> bool:
        return self.task.format == "pairwise" and o == 1

    def verdict(self, slug: str, o: int) -> dict | None:
        """A referee's verdict in answer order ``o`` as it was given (in that order's positions)."""
        verdicts = self.referees.get(slug) or []
        return _as_said(verdicts[o] if o < len(verdicts) else None, self.swapped(o), self.task)


def _shown_item(inputs: Mapping[str, str] | None, task, config) -> dict | None:
    """The item's inputs as the panel read them: cut at the config's limit, guarded, and cut to fit a trace."""
    if inputs is None:
        return None
    limit = config.max_text_chars if config is not None else None
    shown = {}
    for name in task.input_names:
        text = str(inputs.get(name, ""))
        if limit is not None and len(text) > limit:
            text = text[:limit] + f" [... truncated {len(text) - limit} characters]"
        shown[name] = _cut(guard(text))
    return shown


def _turn_node(debate: _Debate, transcript: list[dict], o: int, i: int, times: list, is_verdict: bool) -> dict:
    """One referee's (or the summarizer's) turn: what it was shown -> what it said, and its verdict."""
    u = transcript[i]
    said = {"text": _cut(u["text"]), "kind": u["kind"]}
    turn_inputs = {"round": u["round"], "step": {"argument": "argue", "verdict": "verdict",
                                                 "summary": "summarize"}.get(u["kind"], u["kind"])}
    if u["speaker"] in debate.personas:
        turn_inputs["persona"] = debate.personas[u["speaker"]]
    if debate.strategy is not None or u["speaker"] == SUMMARIZER:
        turn_inputs["discussion"] = _cut(render(_shown(transcript, i, debate.strategy)))
    reason = (debate.record.get("abstentions") or {}).get(f"order{o + 1}:{u['speaker']}@{u['round']}")
    if is_verdict and u["speaker"] in debate.referees:
        said["verdict"] = debate.verdict(u["speaker"], o)
    if reason:
        said["abstained"] = reason
    attributes = {"chateval.role": u["speaker"], "chateval.name": u["name"], "chateval.round": u["round"],
                  "chateval.order": o + 1, "chateval.kind": u["kind"], **debate.timing}
    if "prompt_tokens" in u or "completion_tokens" in u:
        attributes["mlflow.chat.tokenUsage"] = _usage(u.get("prompt_tokens"), u.get("completion_tokens"))
    for key in ("calls", "seconds"):
        if key in u:
            attributes[f"chateval.{key}"] = u[key]
    s, e = times[i]
    return _node(u["speaker"], "LLM", s, e, inputs=turn_inputs, outputs=said, attributes=attributes, error=reason)


def _order_node(debate: _Debate, o: int, transcript: list[dict], times: list, shown_item: dict | None,
                start: int) -> dict:
    """One answer order: its rounds of turns, the item as shown in that order, and its verdicts."""
    last_verdict = {u["speaker"]: i for i, u in enumerate(transcript) if u["kind"] == "verdict"}
    rounds: dict[int, list[dict]] = {}
    for i, u in enumerate(transcript):
        rounds.setdefault(u["round"], []).append(
            _turn_node(debate, transcript, o, i, times, last_verdict.get(u["speaker"]) == i))
    round_nodes = []
    for rnd, turns in rounds.items():
        kinds = {t["outputs"]["kind"] for t in turns} - {"summary"}
        round_nodes.append(_node(
            f"round {rnd}", "CHAIN", min(t["start_ns"] for t in turns), max(t["end_ns"] for t in turns),
            inputs={"round": rnd}, outputs={t["name"]: t["outputs"]["text"] for t in turns},
            attributes={"chateval.round": rnd, "chateval.order": o + 1,
                        "chateval.kind": "verdict" if "verdict" in kinds else "talk", **debate.timing},
            children=turns))
    task, swapped = debate.task, debate.swapped(o)
    shown = calibration.swap(shown_item, task) if shown_item is not None and swapped else shown_item
    order_out = {"preference": (debate.record.get("order_preferences") or [None, None])[o]} \
        if task.format == "pairwise" else {}
    order_out["verdicts"] = {slug: debate.verdict(slug, o) for slug in debate.referees}
    o_start = min((r["start_ns"] for r in round_nodes), default=start)
    o_end = max((r["end_ns"] for r in round_nodes), default=start)
    return _node(f"order {o + 1}" + (" (answers swapped)" if swapped else ""), "CHAIN", o_start, o_end,
                 inputs=shown if shown is not None else {"order": o + 1}, outputs=order_out,
                 attributes={"chateval.order": o + 1, "chateval.swapped": swapped, **debate.timing},
                 children=round_nodes)


def _root_attributes(record: dict, config, timing: dict) -> dict:
    """The root's attributes: the item (``ROOT_ATTRIBUTE``, what readers find the root by), its cost, the panel."""
    attributes = {ROOT_ATTRIBUTE: str(record.get("id")), "chateval.calls": record.get("calls"),
                  "chateval.prompt_tokens": record.get("prompt_tokens"),
                  "chateval.completion_tokens": record.get("completion_tokens"),
                  "chateval.cached_calls": record.get("cached_calls"), "chateval.seconds": record.get("seconds"),
                  "mlflow.chat.tokenUsage": _usage(record.get("prompt_tokens"), record.get("completion_tokens")),
                  **config_summary(config), **timing}
    if record.get("truncated"):
        attributes["chateval.truncated"] = record["truncated"]
    return {k: v for k, v in attributes.items() if v is not None}


def span_names(tree: dict, depth: int = 0) -> list[str]:
    """The tree's span names, indented by depth (what the MLflow UI's tree view shows).

    Example:
        >>> span_names({"name": "chateval", "children": [{"name": "order 1", "children": []}]})
        ['chateval', '  order 1']
    """
    return ["  " * depth + tree["name"]] + [n for c in tree["children"] for n in span_names(c, depth + 1)]


def debate_span(trace):
    """The span of an MLflow trace that holds a debate (the trace's root, or the span under a caller's or an MLflow
    scorer's span), or None: the span with ``ROOT_ATTRIBUTE``, whatever its name (see the module docstring).

    Example:
        >>> from types import SimpleNamespace as NS
        >>> old = NS(name="chateval", attributes={"chateval.item_id": "q1"})
        >>> debate_span(NS(data=NS(spans=[NS(name="my app", attributes={}), old]))).name
        'chateval'
    """
    spans = trace.data.spans if trace.data is not None else []
    return next((s for s in spans if (s.attributes or {}).get(ROOT_ATTRIBUTE) is not None), None)


# ---- to MLflow -----------------------------------------------------------------------------------------------

def emit(tree: dict, *, tags: Mapping[str, str] | None = None, metadata: Mapping[str, str] | None = None,
         experiment_id: str | None = None, parent=None) -> str | None:
    """Create the spans of ``tree`` in MLflow (the active experiment unless ``experiment_id``), every text
    scrubbed of secrets; returns the trace id. ``parent``: a live span to hang the tree under (then it is
    part of that span's trace). ``metadata``: trace metadata of a new trace (MLflow's own keys too)."""
    import mlflow

    secrets = secret_values()
    clean = (lambda v: _scrub(v, secrets)) if secrets else (lambda v: v)

    def build(node, parent_span, **extra):
        span = mlflow.start_span_no_context(clean(node["name"]), span_type=node["span_type"], parent_span=parent_span,
                                            inputs=clean(node["inputs"]), attributes=clean(node["attributes"]),
                                            start_time_ns=node["start_ns"], **extra)
        try:
            for child in node["children"]:
                build(child, span)
        finally:  # a span left open would keep its whole trace in memory, unexported
            if node["error"]:
                span.set_status("ERROR")
            span.end(outputs=clean(node["outputs"]), end_time_ns=node["end_ns"])
        return span

    tags = clean({k: str(v) for k, v in (tags or {}).items()})
    new = {"tags": tags, "metadata": clean(dict(metadata)) if metadata else None, "experiment_id": experiment_id}
    root = build(tree, parent, **({} if parent is not None else new))
    if parent is not None and tags and parent is mlflow.get_current_active_span():
        mlflow.update_current_trace(tags=tags)  # the enclosing trace (a scorer's) is this item's trace
    return root.trace_id


def trace_record(record: dict, inputs: Mapping[str, str] | None = None, *, config=None, roles=None,
                 model: str | None = None, tags: Mapping[str, str] | None = None,
                 metadata: Mapping[str, str] | None = None, experiment_id: str | None = None,
                 ended_ns: int | None = None, parent=None) -> str | None:
    """One judged item as one MLflow trace (``debate_tree`` sent to MLflow); returns the trace id.

    Tags: ``chateval.item_id``, ``chateval.task``, and when known ``chateval.run_key`` and ``chateval.model``,
    plus ``tags``. Exceptions propagate (``Tracer`` is the forgiving wrapper that batches use).
    """
    tree = debate_tree(record, inputs, config=config, roles=roles, ended_ns=ended_ns)
    all_tags = {"chateval.item_id": str(record.get("id")),
                "chateval.task": (config.task_spec.name if config is not None else str(record.get("format")))}
    if record.get("run_key"):
        all_tags["chateval.run_key"] = str(record["run_key"])
    if model:
        all_tags["chateval.model"] = model
        tree["attributes"]["chateval.model"] = model
    all_tags.update(tags or {})
    return emit(tree, tags=all_tags, metadata=metadata, experiment_id=experiment_id, parent=parent)


class Tracer:
    """Traces judged items one by one, as a batch's ``on_item`` callback or around a judge; never raises.

    Args:
        config: The panel's ``DebateConfig``, or a function of the record's format that returns it (as
            ``evaluate_dataset`` takes it); None: the format's built-in task.
        roles: The referees, for their personas (default: resolved from ``config``).
        items: The items judged (``dspy.Example`` or dicts with ``id``), so each trace shows the texts the
            panel read; records carry no inputs of their own.
        model: The LM's model name, as a tag.
        tags: Tags for every trace (``chateval.command``, ...).
        metadata: Trace metadata for every trace.
        experiment_id: Where the traces go (default: MLflow's active experiment).
        flush_every: Drain MLflow's export queue after this many traces (it drops traces beyond 1,000 tasks).

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


def dumps(value) -> str:
    """Compact JSON for metadata and tags (MLflow keeps them as text).

    Example:
        >>> dumps({"critic": [{"score_1": 8}]})
        '{"critic":[{"score_1":8}]}'
    """
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)
