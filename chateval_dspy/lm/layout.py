"""How a judge call's prompt is laid out so that providers' prompt caches reuse it, and its lean format text.

Caches reuse the longest shared prefix, so what repeats comes first (docs/architecture.md, "Prompts"):

    system   instructions + the output format (+ persona)  same for every call of a predictor, on every item
    demos    user/assistant pairs                          same for every call of a predictor, on every item
    user     the item's texts (question, answers)          same for every call of the item in one answer order
             (| the persona)                               same for every call of that referee
             | what changed within the item (discussion)   new on every call
"""

from __future__ import annotations

import re
import textwrap
import typing
from collections import Counter

from dspy.adapters.utils import get_annotation_name

# Fields by what they hold: the referee's own static text, and what changes within an item.
REFEREE_FIELDS = ("persona",)
TURN_FIELDS = ("discussion",)
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def text_block(text: str, marked: bool = False) -> dict:
    """A text content block, ``marked`` as a cache breakpoint (Anthropic's ``cache_control``) or not."""
    return {"type": "text", "text": text, **({"cache_control": {"type": "ephemeral"}} if marked else {})}


def field_order(names) -> list[str]:
    """Input field names in layout order: the item's texts (declared order), then the referee's, then the turn's.

    Example:
        >>> field_order(["question", "answer_1", "answer_2", "discussion", "persona"])
        ['question', 'answer_1', 'answer_2', 'persona', 'discussion']
    """
    return sorted(names, key=lambda n: (n in TURN_FIELDS, n in REFEREE_FIELDS))  # stable: declared order within each


def item_fields(names) -> list[str]:
    """The fields holding the item's texts (everything but the referee's and the turn's).

    Example:
        >>> item_fields(["material", "discussion"])
        ['material']
    """
    return [n for n in field_order(names) if n not in REFEREE_FIELDS + TURN_FIELDS]


def description(name: str, field) -> str:
    """A field's own description, or '' when DSPy filled in its placeholder (``${name}``)."""
    desc = (field.json_schema_extra or {}).get("desc") or ""
    return "" if desc == f"${{{name}}}" else desc.strip()


def _shared_sentences(descs: dict[str, str]) -> list[str]:
    """Sentences that end the descriptions of two or more fields, in order (said once for them all)."""
    split = {k: _SENTENCE.split(v) for k, v in descs.items() if v}
    counts = Counter(s for sentences in split.values() for s in dict.fromkeys(sentences))
    return [s for s in dict.fromkeys(s for v in split.values() for s in v) if counts[s] > 1]


def inputs_text(signature) -> str:
    """The input fields, in layout order, each with its description; a note several fields share is said once.

    Example:
        >>> import dspy
        >>> class S(dspy.Signature):
        ...     a: str = dspy.InputField(desc="First. Data only.")
        ...     b: str = dspy.InputField(desc="Data only.")
        ...     persona: str = dspy.InputField(desc="who you are")
        ...     out: str = dspy.OutputField()
        >>> print(inputs_text(S))
        Each input comes under a [[ ## name ## ]] header:
        - a (First), b: Data only.
        - persona: who you are
    """
    fields = signature.input_fields
    order = field_order(fields)
    descs = {n: description(n, fields[n]) for n in order}
    shared = _shared_sentences(descs)
    note = " ".join(shared)
    grouped = [n for n in order if shared and descs[n].endswith(note)]
    lines = ["Each input comes under a [[ ## name ## ]] header:"]
    for name in order:
        if grouped and name == grouped[0]:
            own = [(n, descs[n][: -len(note)].strip().rstrip(".")) for n in grouped]
            lines.append("- " + ", ".join(f"{n} ({d})" if d else n for n, d in own) + f": {note}")
        elif name not in grouped:
            lines.append(f"- {name}: {descs[name]}" if descs[name] else f"- {name}")
    return "\n".join(lines)


def value_text(annotation) -> str:
    """What values an output field takes, in words ('' for free text).

    Example:
        >>> from typing import Literal
        >>> value_text(Literal[1, 2, 3]), value_text(Literal["1", "2", "tie"]), value_text(str)
        ('an integer from 1 to 3', 'one of: 1, 2, tie', '')
    """
    if annotation is str:
        return ""
    if typing.get_origin(annotation) is typing.Literal:
        values = typing.get_args(annotation)
        ints = [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        if len(ints) == len(values) > 1 and sorted(ints) == list(range(min(ints), max(ints) + 1)):
            return f"an integer from {min(ints)} to {max(ints)}"
        return "one of: " + ", ".join(str(v) for v in values)
    return get_annotation_name(annotation)


def outputs_text(signature) -> str:
    """The output fields, in order, with their values and descriptions: what to put in the JSON object.

    Example:
        >>> import dspy
        >>> from typing import Literal
        >>> S = dspy.make_signature({"question": (str, dspy.InputField()),
        ...                          "evidence": (str, dspy.OutputField(desc="your reasons")),
        ...                          "score": (Literal[1, 2, 3], dspy.OutputField())}, "Rate it.")
        >>> print(outputs_text(S))
        Reply with a JSON object holding these fields, in this order:
        - evidence: your reasons
        - score (an integer from 1 to 3)
    """
    lines = ["Reply with a JSON object holding these fields, in this order:"]
    for name, field in signature.output_fields.items():
        values, desc = value_text(field.annotation), description(name, field)
        head = f"- {name} ({values})" if values else f"- {name}"
        lines.append(f"{head}: {desc}" if desc else head)
    return "\n".join(lines)


def lean_system(signature) -> str:
    """The system message when the LM enforces the JSON schema: instructions, then the inputs and outputs once."""
    return "\n\n".join([textwrap.dedent(signature.instructions).strip(), inputs_text(signature),
                        outputs_text(signature)])
