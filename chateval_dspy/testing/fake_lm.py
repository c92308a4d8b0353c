"""A scripted, deterministic LM for tests and overhead benchmarks.

A DSPy engine, so a program runs against it as against a real server (same adapter, JSON schema and parsing);
each call is recorded with what it was shown, for tests of visibility, call counts and prompts.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import dspy
from dspy.lm15 import Message, Response, TextPart, Usage, response_to_events

# A prompt field as DSPy renders it: its name and its text, up to the next field.
FIELD = re.compile(r"\[\[ ## (\w+) ## \]\]\n(.*?)(?=\n\n\[\[ ## \w+ ## \]\]|\n\nRespond with|\Z)", re.S)


# Fields a prompt may state in its static part (the system message) rather than beside the item's texts.
STATIC_FIELDS = ("persona",)


def prompt_fields(system: str, user: str) -> dict[str, str]:
    """The input fields a call was shown: the last user message's, plus the referee's persona wherever it stands.

    Example:
        >>> prompt_fields("Rules.\\n\\n[[ ## persona ## ]]\\nYou are strict.", "[[ ## question ## ]]\\nq?")
        {'persona': 'You are strict.', 'question': 'q?'}
    """
    static = {k: v.strip() for k, v in FIELD.findall(system or "") if k in STATIC_FIELDS}
    return {**static, **{k: v.strip() for k, v in FIELD.findall(user or "")}}


@dataclass
class Call:
    """One request as the fake LM saw it."""

    system: str
    user: str
    outputs: list[str]  # the output fields the schema asks for
    inputs: dict[str, str] = field(default_factory=dict)  # the last user message's fields
    config: dict = field(default_factory=dict)
    schema: dict = field(default_factory=dict)  # the JSON schema of the expected output
    n_messages: int = 1  # > 1 when demonstrations precede the question
    history: tuple[tuple[str, str], ...] = ()  # (role, text) of every message before the last: the demos

    @property
    def kind(self) -> str:
        """``summary``, ``argument``, ``verdict``, or ``other``: an optimizer's own signature (proposals, reflections)."""
        steps = (("summary", "summary"), ("argument", "argument"), ("evidence", "verdict"))
        return next((kind for name, kind in steps if name in self.outputs), "other")


def schema_filler(call: Call) -> dict:
    """Any valid object for the requested schema: the first enum value, or a short text."""
    by_type = {"integer": 1, "number": 1, "array": [], "boolean": True}
    return {name: prop["enum"][0] if "enum" in prop else by_type.get(prop.get("type"), f"{name} from the fake LM")
            for name, prop in call.schema.get("properties", {}).items()}


TOPICAL_CHAT = ("naturalness", "coherence", "engagingness", "groundedness")
CONTEXT_FIELDS = ("discussion", "persona")


def spec_filler(call: Call, persona: str) -> dict:
    """A valid verdict for any task's schema, from the item's content (never its position).

    A pairwise field ``<criterion>_1``/``_2`` is about its own response: the inputs whose names end in 1
    and 2 (``answer_1``, ``answer_2``), or else the last two inputs of the prompt; any other field is about
    the last input (where the judged response usually stands). An integer scale's point grows with that
    text's length, one point per 10 characters (an empty response gets the lowest); a label is picked by
    length and field name. A stated preference follows the first criterion's two scores.
    """
    texts = {k: v for k, v in call.inputs.items() if k not in CONTEXT_FIELDS}
    ones, twos = sorted(k for k in texts if k.endswith("1")), sorted(k for k in texts if k.endswith("2"))
    pair = (texts[ones[-1]], texts[twos[-1]]) if ones and twos else tuple(list(texts.values())[-2:])
    out: dict = {"evidence": f"verdict by <{persona}>"}
    for name, prop in call.schema.get("properties", {}).items():
        values = prop.get("enum")
        if name == "preference" or not values:
            continue
        about = pair[int(name[-1]) - 1] if len(pair) == 2 and name[-2:] in ("_1", "_2") else list(texts.values())[-1]
        size = len(about.strip()) // 10
        if all(isinstance(v, int) for v in values):
            out[name] = values[min(len(values) - 1, size)]
        else:
            out[name] = values[(size + sum(map(ord, name))) % len(values)]
    if "preference" in call.outputs:
        firsts = [k for k in out if k.endswith("_1") and k[:-2] + "_2" in out]
        a, b = (out[firsts[0]], out[firsts[0][:-2] + "_2"]) if firsts else (0, 0)
        out["preference"] = "1" if a > b else "2" if b > a else "tie"
    return out


def default_responder(call: Call) -> dict:
    """Arguments name the speaker; verdicts depend on content (lengths), never on position."""
    persona = call.inputs.get("persona", "")[:40]
    if call.kind == "other":
        return schema_filler(call)
    if call.kind == "summary":
        return {"summary": f"summary of {call.inputs.get('discussion', '').count('round')} turns"}
    if call.kind == "argument":
        return {"argument": f"argument by <{persona}>"}
    if set(call.outputs) == {"evidence", "preference", "score_1", "score_2"}:
        a1, a2 = call.inputs.get("answer_1", ""), call.inputs.get("answer_2", "")
        s1, s2 = min(10, 1 + len(a1) // 10), min(10, 1 + len(a2) // 10)
        return {"evidence": f"verdict by <{persona}>", "score_1": s1, "score_2": s2}
    if set(call.outputs) == {"evidence", *TOPICAL_CHAT}:
        return {"evidence": f"verdict by <{persona}>", "naturalness": 2, "coherence": 2, "engagingness": 3,
                "groundedness": 1 if call.inputs.get("fact", "")[:10].lower() in call.inputs.get("response", "").lower()
                else 0}
    return spec_filler(call, persona)  # any other task: a valid verdict for its schema


def content_text(content) -> str:
    """A message's text, whether its content is a string or a list of content blocks."""
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or () if isinstance(b, dict))


def respond(responder: Callable[[Call], dict | str], call: Call) -> tuple[dict | str, str]:
    """The responder's answer to ``call`` and its text as sent; a script written for scores alone states the
    preference its scores imply."""
    out = responder(call)
    if isinstance(out, dict) and "preference" in call.outputs and "preference" not in out and "score_1" in out:
        s1, s2 = out["score_1"], out["score_2"]
        out = {"evidence": out.get("evidence", ""), "preference": "1" if s1 > s2 else "2" if s2 > s1 else "tie", **out}
    return out, out if isinstance(out, str) else json.dumps(out)


class ScriptedEngine:
    """A DSPy engine whose answers come from ``responder(call) -> dict | str``.

    Args:
        responder: Returns the output fields as a dict (sent as JSON) or raw text (to test parse failures),
            or raises a ``dspy.lm15`` error to simulate an LM fault.
        latency: Seconds to sleep per call (0 for overhead measurements).
    """

    supports_response_schema = True
    supported_params = frozenset({"response_format", "temperature", "max_tokens", "seed"})

    def __init__(self, responder: Callable[[Call], dict | str] = default_responder, latency: float = 0.0):
        self.responder, self.latency = responder, latency
        self.calls: list[Call] = []
        self._lock = threading.Lock()

    def complete(self, request) -> Response:
        system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system or ())
        user = request.messages[-1].text or ""
        fmt = request.config.response_format or {}
        schema = fmt.get("schema") or {}
        config = {"temperature": request.config.temperature, "max_tokens": request.config.max_tokens}
        call = Call(system, user, list(schema.get("properties", {})), prompt_fields(system, user),
                    config, schema, len(request.messages),
                    tuple((m.role, m.text or "") for m in request.messages[:-1]))
        with self._lock:
            self.calls.append(call)
        if self.latency:
            time.sleep(self.latency)
        _, text = respond(self.responder, call)
        return Response(id=None, model="fake", message=Message.assistant([TextPart(text)]), finish_reason="stop",
                        usage=Usage(input_tokens=(len(system) + len(user)) // 4, output_tokens=len(text) // 4,
                                    total_tokens=(len(system) + len(user) + len(text)) // 4))

    def stream(self, request):
        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


def fake_lm(responder: Callable[[Call], dict | str] = default_responder, latency: float = 0.0) -> dspy.LM:
    """A ``dspy.LM`` over a ``ScriptedEngine`` (reachable as ``lm.engine``), with the cache off."""
    return dspy.LM("fake/scripted", engine=ScriptedEngine(responder, latency), cache=False, temperature=0.0,
                   max_tokens=256, num_retries=0)
