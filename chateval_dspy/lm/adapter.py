"""The adapter every judge call goes through: DSPy's JSONAdapter with ``lm.layout``'s layout, the lean format when
the LM enforces the JSON schema, and Anthropic ``cache_control`` marks (carried by LiteLLM).

DSPy rebuilds the response format's pydantic model and the system message on every call, about half of its own
time per call (BENCHMARKS.md, "overhead"), though both depend only on the signature: they are memoised per
signature class (held weakly, as optimizers create many) and instructions.
"""

from __future__ import annotations

import contextvars
import threading
import weakref
from dataclasses import dataclass

import dspy
from dspy.adapters.utils import format_field_value

from chateval_dspy.concurrency import set_within
from chateval_dspy.lm.layout import REFEREE_FIELDS, field_order, item_fields, lean_system, text_block

_ABSENT = object()
# Models reached through LiteLLM that cache only at explicit cache_control breakpoints (Anthropic's rule).
MARKED_PREFIXES = ("anthropic/", "bedrock/anthropic.", "vertex_ai/claude")


@dataclass(frozen=True)
class Style:
    """How one call is rendered: the lean format (the LM enforces the schema), Anthropic cache marks, and the
    debate's ``placement`` of the persona and of the item's mark."""

    lean: bool = False
    marks: bool = False
    persona_static: bool = False
    mark_item: bool = True


# Set around each call by ``DebateAdapter.__call__``; ``format`` outside a call renders the complete format.
_STYLE: contextvars.ContextVar[Style | None] = contextvars.ContextVar("chateval_judge_style", default=None)
# The debate's plan for the calls it makes in this context (``placement``); a call outside a debate has none.
_PLACEMENT: contextvars.ContextVar[dict | None] = contextvars.ContextVar("chateval_placement", default=None)


def current_style() -> Style:
    """The style of the call being made in this context (an engine under the adapter reads its cache marks here)."""
    return _STYLE.get() or Style()


def placement(*, persona_static: bool, mark_item: bool):
    """Calls made inside the block put the persona in the static part, or not, and mark the item's texts, or not.

    The debate knows what the adapter cannot: whether another referee's predictor shares the static text (then the
    persona must come after the item's texts, which they share) and whether another call of the item reads the
    prefix through the item's texts (else an Anthropic cache write there is paid for and never read).
    """
    return set_within(_PLACEMENT, {"persona_static": persona_static, "mark_item": mark_item})


def rendering(style: Style):
    """Render with ``style`` inside the block (``DebateAdapter`` sets it per call; tests and tools set it to look).

    Example:
        >>> from chateval_dspy.program.signatures import signatures_for
        >>> with rendering(Style(lean=True)):
        ...     system = DebateAdapter().format(signatures_for("pairwise")[0], [], {})[0]["content"]
        >>> "Outputs will be a JSON object" in system
        False
    """
    return set_within(_STYLE, style)


def wants_marks(lm) -> bool:
    """Whether ``lm``'s provider caches only at ``cache_control`` breakpoints (Anthropic, also via Bedrock/Vertex).

    Example:
        >>> import dspy
        >>> wants_marks(dspy.LM("anthropic/claude-3-5-haiku-20241022")), wants_marks(dspy.LM("openai/gpt-4o-mini"))
        (True, False)
    """
    return str(getattr(lm, "model", "")).startswith(MARKED_PREFIXES)


class DebateAdapter(dspy.JSONAdapter):
    """``dspy.JSONAdapter`` with the cache-friendly layout (``lm.layout``), memoised per signature.

    Example:
        >>> from chateval_dspy.program.signatures import signatures_for
        >>> argue, _ = signatures_for("pairwise")
        >>> inputs = {"question": "q", "answer_1": "a", "answer_2": "b", "discussion": "(none)", "persona": "p"}
        >>> user = DebateAdapter().format(argue, [], inputs)[-1]["content"]
        >>> [line for line in user.splitlines() if line.startswith("[[")]
        ['[[ ## question ## ]]', '[[ ## answer_1 ## ]]', '[[ ## answer_2 ## ]]', '[[ ## persona ## ]]', '[[ ## discussion ## ]]']
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def _remember(self, signature, key, build):
        # Instructions are part of the key because a signature class's docstring can be reassigned in place.
        key = (key, signature.instructions)
        with self._lock:
            per_signature = self._memo.setdefault(signature, {})
            value = per_signature.get(key, _ABSENT)
        if value is _ABSENT:
            value = build()  # outside the lock: two threads may both build once, harmlessly
            with self._lock:
                per_signature[key] = value
        return value

    def _prepare_response_format(self, lm, lm_kwargs, signature):
        # The choice depends on the LM's capabilities too, so they are part of the key.
        key = ("response_format", "response_format" in lm.supported_params, bool(lm.supports_response_schema))

        def build():
            probe: dict = {}
            super(DebateAdapter, self)._prepare_response_format(lm, probe, signature)
            return probe.get("response_format", _ABSENT)

        fmt = self._remember(signature, key, build)
        if fmt is not _ABSENT:
            lm_kwargs["response_format"] = fmt

    def style_for(self, lm, signature) -> Style:
        """The call's style: lean when a JSON schema goes with the request, marks for Anthropic models."""
        probe: dict = {}
        self._prepare_response_format(lm, probe, signature)
        fmt = probe.get("response_format")
        # DSPy hands a schema over as a pydantic model class (or, from some callers, the json_schema dict).
        schema = isinstance(fmt, type) or (isinstance(fmt, dict) and fmt.get("type") == "json_schema")
        return Style(lean=schema, marks=wants_marks(lm), **(_PLACEMENT.get() or {}))

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        with rendering(self.style_for(lm, signature)):
            return super().__call__(lm, lm_kwargs, signature, demos, inputs)

    async def acall(self, lm, lm_kwargs, signature, demos, inputs):
        with rendering(self.style_for(lm, signature)):
            return await super().acall(lm, lm_kwargs, signature, demos, inputs)

    def format_system_message(self, signature) -> str:
        if current_style().lean:
            return self._remember(signature, "lean", lambda: lean_system(signature))
        return self._remember(signature, "complete", lambda: self._complete_system(signature))

    def _complete_system(self, signature) -> str:
        # For an LM that enforces no schema: the lean text, then DSPy's own JSON skeleton with its notes on each value.
        structure = self.format_field_structure(signature)
        return lean_system(signature) + "\n\n" + structure[structure.index("Outputs will be"):]

    def _user_parts(self, signature, inputs: dict) -> tuple[str, str]:
        """The user message as (the item's texts, the rest): fields in layout order, the reminder last."""
        fields, item = signature.input_fields, set(item_fields(signature.input_fields))
        static = set(REFEREE_FIELDS) if current_style().persona_static else set()
        blocks = {True: [], False: []}
        for name in field_order(fields):
            if name in inputs and name not in static:
                value = format_field_value(field_info=fields[name], value=inputs[name])
                blocks[name in item].append(f"[[ ## {name} ## ]]\n{value}")
        return "\n\n".join(blocks[True]), "\n\n".join(blocks[False])

    def format_user_message_content(self, signature, inputs, prefix: str = "", suffix: str = "",
                                    main_request: bool = False) -> str:
        item, rest = self._user_parts(signature, inputs)
        reminder = self.user_message_output_requirements(signature) if main_request and not current_style().lean else ""
        return "\n\n".join(p for p in (prefix, item, rest, reminder, suffix) if p).strip()

    def format(self, signature, demos, inputs):
        messages = super().format(signature, demos, inputs)
        style = current_style()
        if style.persona_static:
            messages[0] = {**messages[0], "content": messages[0]["content"] + self._referee_block(signature, inputs)}
        return self._marked(signature, inputs, messages, style.mark_item) if style.marks else messages

    @staticmethod
    def _referee_block(signature, inputs: dict) -> str:
        """The referee's own fields, at the end of the static part (its persona: the same on every call)."""
        parts = [f"[[ ## {name} ## ]]\n{format_field_value(field_info=signature.input_fields[name], value=inputs[name])}"
                 for name in REFEREE_FIELDS if name in signature.input_fields and name in inputs]
        return "".join("\n\n" + p for p in parts)

    def _marked(self, signature, inputs: dict, messages: list[dict], mark_item: bool) -> list[dict]:
        """Breakpoints at the end of the static part (system and demos) and at the end of the item's texts."""
        out = [dict(m) for m in messages]
        static = len(out) - 2  # the last message before the question: the system message or the last demo
        out[static]["content"] = [text_block(out[static]["content"], marked=True)]
        item, _ = self._user_parts(signature, inputs)
        content = out[-1]["content"]
        if mark_item and item and content.startswith(item) and len(content) > len(item):
            cut = len(item) + 2 if content[len(item):len(item) + 2] == "\n\n" else len(item)
            out[-1]["content"] = [text_block(content[:cut], marked=True), text_block(content[cut:])]
        return out


__all__ = ["DebateAdapter", "Style", "current_style", "placement", "rendering", "wants_marks"]
