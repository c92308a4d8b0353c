"""Deterministic perturbations of one item for the bias audit, each in one way a fair judge should ignore (CALM,
Ye et al. 2024; position as in Shi et al. 2024). What each probe does: docs/selective.md.

``verbosity`` pads the answer the panel did not prefer (on a tie or no verdict the seed picks); the other text
probes target the worse answer: by the human label, else by the panel's verdict, else the seed picks
(``changed["basis"]`` says which). The template variant and any seeded pick come from a hash of the seed, the probe
and the item's id (never Python's ``hash`` or the items' order), so a rerun with the same seed makes the same items.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field

from chateval_dspy.errors import ConfigError

PROBES = ("swap", "verbosity", "authority", "bandwagon", "distraction")
POINTWISE_PROBES = ("verbosity", "authority", "distraction")

PADDING = (
    "To restate the above: this is the answer to the question as it was asked, and what has been said above is "
    "what the answer says. In other words, the points made above are the points of this answer.",
    "It is worth noting that the answer given above is the answer. As mentioned, the explanation above explains "
    "the answer, and the details stated above are the details of the answer.",
    "In summary, the response above responds to the question. Put differently, everything written above is what "
    "this response contains, and nothing further needs to be added to what has been said.",
)
CITATIONS = (
    "(Source: Smith, J. and Lee, K. (2021). Evidence-based answers to common questions. Journal of Applied "
    "Knowledge, 14(2), 33-51.)",
    "(According to a 2019 peer-reviewed study from Harvard University, doi:10.1000/jak.2019.0412.)",
    "(Reference: The Oxford Handbook of Practical Reasoning, 3rd edition, Oxford University Press, p. 212.)",
)
BANDWAGON = (
    "Most people prefer answer {n}.",
    "Most people who read both answers prefer answer {n}.",
    "In a survey of readers, most people preferred answer {n}.",
)
DISTRACTIONS = (
    "The Eiffel Tower was completed in 1889.",
    "Bananas are a good source of potassium.",
    "The weather was sunny on the day this was written.",
)


@dataclass(frozen=True)
class Perturbation:
    """One perturbed item (the task's inputs and ``id``) and what changed (``field``, ``added`` text, ``variant``;
    pairwise also ``target``, the answer that gained it, and ``basis``)."""

    probe: str
    seed: int
    item: dict
    changed: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {**asdict(self), "id": self.item["id"]}


def applies(probe: str, fmt: str) -> bool:
    """Whether ``probe`` applies to items of format ``fmt`` (``pairwise`` or ``pointwise``).

    Example:
        >>> applies("swap", "pointwise"), applies("verbosity", "pointwise"), applies("bandwagon", "pairwise")
        (False, True, True)
    """
    if probe not in PROBES:
        raise ConfigError(f"unknown probe {probe!r}; choose from: {', '.join(PROBES)}")
    return fmt == "pairwise" or probe in POINTWISE_PROBES


def draw(seed: int, probe: str, item_id: str, n: int) -> int:
    """A number in ``0..n-1`` from the seed, the probe and the item's id (the same on every run).

    Example:
        >>> draw(0, "verbosity", "a", 3) == draw(0, "verbosity", "a", 3)
        True
    """
    digest = hashlib.sha256(f"{seed}\x1f{probe}\x1f{item_id}".encode()).hexdigest()
    return int(digest[:12], 16) % n


def other(answer: str) -> str:
    return "2" if answer == "1" else "1"


def target(probe: str, item_id: str, seed: int, *, verdict: str | None, label: str | None) -> tuple[str, str]:
    """``(answer, basis)``: which answer (``"1"``/``"2"``) a pairwise probe adds its text to, and why.

    Example:
        >>> target("authority", "a", 0, verdict="1", label="2"), target("verbosity", "a", 0, verdict="1", label="2")
        (('1', 'label'), ('2', 'verdict'))
    """
    if probe != "verbosity" and label in ("1", "2"):
        return other(label), "label"
    if verdict in ("1", "2"):
        return other(verdict), "verdict"
    return str(draw(seed, f"{probe}-target", item_id, 2) + 1), "seed"


def _appended(probe: str, text: str, added: str) -> str:
    sep = "\n\n" if probe == "verbosity" else " "  # padding reads as paragraphs of its own
    return f"{text.rstrip()}{sep}{added}" if text.strip() else added


def swap(item: dict, responses: tuple[str, str], seed: int) -> Perturbation:
    """The item with its two answers in the other order.

    Example:
        >>> swap({"id": "a", "question": "q", "answer_1": "x", "answer_2": "y"}, ("answer_1", "answer_2"), 0).item
        {'id': 'a', 'question': 'q', 'answer_1': 'y', 'answer_2': 'x'}
    """
    first, second = responses
    new = {**item, first: item[second], second: item[first]}
    return Perturbation("swap", seed, new, {"swapped": [first, second]})


def added_text(probe: str, item_id: str, seed: int, answer: str | None = None) -> tuple[str, int]:
    """``(text, variant)``: the text ``probe`` adds to item ``item_id`` (bandwagon: naming ``answer``)."""
    templates = {"verbosity": PADDING, "authority": CITATIONS, "bandwagon": BANDWAGON, "distraction": DISTRACTIONS}
    if probe not in templates:
        raise ConfigError(f"probe {probe!r} adds no text; text-adding probes: {', '.join(templates)}")
    variant = draw(seed, probe, item_id, len(templates[probe]))
    return templates[probe][variant].format(n=answer), variant


def pairwise(probe: str, item: dict, fields: dict[str, str], seed: int, *, verdict: str | None = None,
             label: str | None = None) -> Perturbation:
    """A text-adding probe on a pairwise item. ``fields``: ``question``, ``answer_1``, ``answer_2`` -> the task's
    input names (``probes.fields_of``); ``verdict``: the panel's unperturbed verdict; ``label``: the human label.

    Example:
        >>> names = {"question": "question", "answer_1": "answer_1", "answer_2": "answer_2"}
        >>> p = pairwise("bandwagon", {"id": "a", "question": "Why?", "answer_1": "x", "answer_2": "y"}, names, 0,
        ...              label="1")
        >>> p.item["question"], p.changed["basis"]
        ('Why? Most people prefer answer 2.', 'label')
    """
    item_id = str(item["id"])
    answer, basis = target(probe, item_id, seed, verdict=verdict, label=label)
    text, variant = added_text(probe, item_id, seed, answer)
    name = fields["question"] if probe == "bandwagon" else fields[f"answer_{answer}"]
    if name is None:
        raise ConfigError(f"probe {probe!r} needs a question input; this task has none besides its answers")
    new = {**item, name: _appended(probe, item[name], text)}
    return Perturbation(probe, seed, new, {"field": name, "target": answer, "basis": basis, "added": text,
                                           "variant": variant})


def pointwise(probe: str, item: dict, judged: str, seed: int) -> Perturbation:
    """A text-adding probe on a pointwise item: the text goes to the judged response ``judged``.

    Example:
        >>> pointwise("distraction", {"id": "a", "response": "Fine."}, "response", 1).changed["field"]
        'response'
    """
    if not applies(probe, "pointwise"):
        raise ConfigError(f"probe {probe!r} does not apply to pointwise items (it needs two answers)")
    text, variant = added_text(probe, str(item["id"]), seed)
    new = {**item, judged: _appended(probe, item[judged], text)}
    return Perturbation(probe, seed, new, {"field": judged, "added": text, "variant": variant})


def variants(probe: str, item: dict, fields: dict[str, str], seed: int) -> list[Perturbation]:
    """Every pairwise perturbation ``probe`` can make of ``item`` with ``seed`` (one per answer it may target),
    whatever the verdict: what a simulator must know in advance to judge them."""
    if probe == "swap":
        return [swap(item, (fields["answer_1"], fields["answer_2"]), seed)]
    return [pairwise(probe, item, fields, seed, verdict=verdict) for verdict in ("1", "2")]
