"""The span tree of one judged item, as plain data, built *after* the item is judged from what its results record
already holds (the transcripts, the referees' verdicts, tokens and seconds). The debate loop is untouched, so
tracing off costs nothing.

The tree (``debate_tree``)::

    chateval <task> · <item id>       root (EVALUATOR): the item as judged -> the panel's verdict (first)
    |-- order 1                       CHAIN: the item in this answer order (pairwise; pointwise has one order)
    |   |-- round 1                   CHAIN: "talk" or "verdict"
    |   |   |-- critic                LLM: persona and the discussion it was shown -> what it said (+ its verdict)
    |   |   |-- scientist
    |   |   `-- summarizer            (simultaneous_talk_with_summarizer, after each non-final round)
    |   `-- round 2 ...
    `-- order 2 (answers swapped) ...

The root's name and response preview are what MLflow's trace list shows (docs/production.md, "With MLflow").
Readers find the root by its ``chateval.item_id`` attribute (``debate_span``), never by its name: older traces'
roots are named just ``chateval``. Span times: ``timing``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass

from chateval_dspy.program import calibration
from chateval_dspy.program.debate import guard
from chateval_dspy.program.strategies import STRATEGIES, SUMMARIZER, Utterance, render
from chateval_dspy.program.task import as_task
from chateval_dspy.run.tracing.timing import NS, measured, span_times

# Texts longer than this are cut in a trace (a trace is for reading; the results file keeps everything).
MAX_TRACE_TEXT = 20_000
# The root span's attribute that marks it as a debate's (the span readers look for) and holds the item's id.
ROOT_ATTRIBUTE = "chateval.item_id"
ROOT_PREFIX = "chateval"  # a root's name begins with it (and was exactly it before names carried task and item)
_NAME_ID_CHARS = 80  # an item id in a span name is cut here: the trace list shows one line per trace


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


def _shown(transcript: list[dict], i: int, strategy) -> list[Utterance]:
    """What the speaker of utterance ``i`` was shown: the strategy's rule over what was said before it."""
    before = [Utterance(**{k: u[k] for k in ("round", "speaker", "name", "text", "kind")}) for u in transcript[:i]]
    u = transcript[i]
    if u["speaker"] == SUMMARIZER:
        return [b for b in before if b.round == u["round"] or b.speaker == SUMMARIZER]
    return strategy.visible(before, u["round"]) if strategy is not None else before


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


# A verdict's confidence, and the verdict a calibrated evaluator withheld for a person: the review reads them back.
SELECTIVE_OUTPUTS = ("confidence", "confidence_calibrated", "withheld")


def _panel_outputs(record: dict, task) -> dict:
    # The verdict leads: MLflow previews a trace's response as the start of the root's outputs JSON.
    selective = {k: record[k] for k in SELECTIVE_OUTPUTS if record.get(k) is not None}
    if task.format != "pairwise":
        return {"scores": record.get("prediction"), "abstained": record.get("abstained"), **selective}
    out = {"verdict": preference_name(record.get("prediction"), task), "winner": record.get("prediction"),
           "consistent": record.get("consistent"), "abstained": record.get("abstained"),
           "order_preferences": record.get("order_preferences")}
    out.update({k: v for k, v in record.items() if re.fullmatch(r"[a-z][a-z0-9_]*_[12]", k)})
    return {**out, **selective}


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
        inputs: The item's inputs as given (truncated here as the panel saw them); None: the order spans name
            no judged texts.
        config: None: the record's format's built-in task, and no discussion shown.
        roles: The referees (``Role`` objects) for their personas; None: personas are left out.

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
    start = end - int(float(record.get("seconds") or 0.0) * NS)
    times = span_times(transcripts, start, end, bool(debate.strategy and debate.strategy.concurrent_rounds))
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
        was_measured = measured(record.get("transcripts") or [])
        return cls(record, task, strategy, personas, {"chateval.timing": "measured" if was_measured else "estimated"})

    @property
    def measured(self) -> bool:
        return self.timing["chateval.timing"] == "measured"

    @property
    def referees(self) -> dict:
        return self.record.get("referees") or {}

    def swapped(self, o: int) -> bool:
        return self.task.format == "pairwise" and o == 1

    def verdict(self, slug: str, o: int) -> dict | None:
        """A referee's verdict in answer order ``o`` as it was given (in that order's positions; records keep
        order 2's mapped back, and the swap is its own inverse)."""
        verdicts = self.referees.get(slug) or []
        verdict = verdicts[o] if o < len(verdicts) else None
        return calibration.unswap_scores(verdict, self.task) if self.swapped(o) else verdict


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
