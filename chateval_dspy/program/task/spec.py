"""The task spec: what a panel judges (inputs, criteria on their scales, instructions) and how a verdict looks.

A ``TaskSpec`` is checked when made (``checks``) and fills in its defaults (``templates``), so a spec's dict (in a
card, a run key, MLflow) always states the exact prompts; ``from_dict`` reads a task file's form (``parsing``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace

from chateval_dspy.errors import ConfigError
from chateval_dspy.program.task.checks import check_resolved, check_spec
from chateval_dspy.program.task.parsing import label_pairs, task_fields
from chateval_dspy.program.task.parts import Criterion, InputSpec, Preference
from chateval_dspy.program.task.scale import Scale
from chateval_dspy.program.task.templates import default_argue, default_material, default_verdict, render


@dataclass(frozen=True)
class TaskSpec:
    """What a panel judges and how a verdict looks; ``signatures.signatures_for(spec)`` builds the prompts.

    Empty instructions, ``material``, ``responses`` and ``preference`` are filled with defaults when it is made. The
    fields are a task file's (docs/tasks.md); ``label_map`` is read before a label is checked and is no part of any
    prompt.

    Args:
        criteria: What each referee rates; pairwise, each criterion ``c`` gives fields ``c_1`` and ``c_2``.
        responses: Pairwise: the two input fields compared (the ones position calibration swaps).
        material: The judged texts as the summarizer reads them (``{input}`` placeholders).

    Example:
        >>> spec = TaskSpec.from_dict({"name": "rag", "format": "pointwise",
        ...     "inputs": [{"name": "question"}, {"name": "context"}, {"name": "answer", "judged": True}],
        ...     "criteria": [{"name": "faithful", "description": "every claim is in the context", "scale": ["pass", "fail"]},
        ...                  {"name": "relevance", "description": "it answers the question", "scale": "1-5"}]})
        >>> [c.name for c in spec.criteria], spec.output_fields
        (['faithful', 'relevance'], ('faithful', 'relevance'))
        >>> TaskSpec.from_dict(spec.to_dict()) == spec
        True
    """

    name: str
    format: str
    inputs: tuple[InputSpec, ...]
    criteria: tuple[Criterion, ...]
    argue: str = ""
    verdict: str = ""
    evidence: str = "the reasons for your ratings, briefly"
    responses: tuple[str, ...] = ()
    preference: Preference | None = None
    material: str = ""
    criteria_in: str = "fields"
    label_map: tuple[tuple[str, str], ...] = ()
    label_map_merge: bool = False

    def __post_init__(self) -> None:
        for key in ("inputs", "criteria", "responses"):  # lists from Python callers; tuples keep the spec hashable
            if isinstance(getattr(self, key), list):
                object.__setattr__(self, key, tuple(getattr(self, key)))
        if isinstance(self.label_map, dict):  # a dict from Python callers, as a file gives it
            object.__setattr__(self, "label_map", label_pairs(self.label_map))
        check_spec(self)
        if self.format == "pairwise":
            self._fill_pairwise()
        for key, default in (("argue", default_argue), ("verdict", default_verdict), ("material", default_material)):
            if not getattr(self, key):
                object.__setattr__(self, key, default(self))
        check_resolved(self)

    def _fill_pairwise(self) -> None:
        """The compared responses (the two judged inputs) and the criteria a preference combines, when not given."""
        if not self.responses:
            judged = self.judged
            if len(judged) != 2:
                raise ConfigError(f"a pairwise task compares two responses: mark exactly two inputs judged, or "
                                  f"name them in 'responses' (judged inputs: {list(judged)})")
            object.__setattr__(self, "responses", judged)
        pref = self.preference or Preference()
        if not pref.combine:
            pref = replace(pref, combine=tuple(c.name for c in self.criteria if c.scale.ordinal))
        object.__setattr__(self, "preference", pref)

    # ---- what the prompts and the debate read -------------------------------------------------------------

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self.inputs)

    @property
    def judged(self) -> tuple[str, ...]:
        """The inputs under judgement (an empty one is data, not a malformed row)."""
        return tuple(i.name for i in self.inputs if i.judged)

    @property
    def criterion(self) -> dict[str, Criterion]:
        return {c.name: c for c in self.criteria}

    @property
    def output_fields(self) -> tuple[str, ...]:
        """The verdict's scored fields, in order: each criterion (pointwise) or ``c_1``, ``c_2`` per criterion."""
        if self.format == "pairwise":
            return tuple(f"{c.name}_{n}" for c in self.criteria for n in (1, 2))
        return tuple(c.name for c in self.criteria)

    def scale_of(self, output_field: str) -> Scale:
        """The scale of a verdict field (``score_1`` -> the scale of ``score``)."""
        name = output_field.rsplit("_", 1)[0] if self.format == "pairwise" else output_field
        return self.criterion[name].scale

    @property
    def ordinal_ranges(self) -> dict[str, tuple[int, int]]:
        """Verdict field -> (low, high) for the integer-scale fields (what weighted scores and means apply to)."""
        return {f: (self.scale_of(f).low, self.scale_of(f).high) for f in self.output_fields if self.scale_of(f).ordinal}

    @property
    def stated_preference(self) -> bool:
        return self.format == "pairwise" and self.preference.stated is not None

    def describe(self, criterion: Criterion, n: int | None = None) -> str:
        """A criterion's description, with ``{n}``/``{response}`` filled for response ``n`` (pairwise)."""
        if n is None:
            values = {"n": "1 or 2", "response": " or ".join(self.responses)}
        else:
            values = {"n": str(n), "response": self.responses[n - 1]}
        return render(criterion.description, values)

    def criteria_text(self) -> str:
        """What ``{criteria}`` stands for: ``name scale (description)`` for each criterion."""
        return ", ".join(f"{c.name} {c.scale} ({self.describe(c)})" for c in self.criteria)

    @property
    def argue_instructions(self) -> str:
        return render(self.argue, {"criteria": self.criteria_text()})

    @property
    def verdict_instructions(self) -> str:
        return render(self.verdict, {"criteria": self.criteria_text()})

    def material_text(self, inputs: dict) -> str:
        """The judged texts as one block, for the summarizer."""
        return render(self.material, {k: inputs[k] for k in self.input_names})

    # ---- serialised form --------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """The task-file form (YAML/JSON): plain values only, defaults written out."""
        out = {
            "name": self.name, "format": self.format,
            "inputs": [{"name": i.name, "description": i.description, "judged": i.judged,
                        **({"default": i.default} if i.default is not None else {})} for i in self.inputs],
            "criteria": [{"name": c.name, "description": c.description, "scale": c.scale.to_dict()}
                         for c in self.criteria],
            "instructions": {"argue": self.argue, "verdict": self.verdict},
            "evidence": self.evidence, "material": self.material, "criteria_in": self.criteria_in,
        }
        if self.format == "pairwise":
            out["responses"] = list(self.responses)
            out["preference"] = {"combine": list(self.preference.combine), "stated": self.preference.stated}
        if self.label_map:  # only when set, so that every other spec's dict (and digest) is what it always was
            out["label_map"] = dict(self.label_map)
        if self.label_map_merge:
            out["label_map_merge"] = True
        return out

    def digest(self) -> str:
        """A short stable hash of the whole spec (instructions included)."""
        text = json.dumps(self.to_dict(), sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def params(self) -> dict:
        """A compact form for MLflow params, whose values must stay short: name, format, inputs (judged ones
        marked ``*``), criteria with their scales, and the digest of the whole spec.

        Example:
            >>> from chateval_dspy.program.task import builtin_task
            >>> builtin_task("pointwise").params()["criteria"]
            ['naturalness:1-3', 'coherence:1-3', 'engagingness:1-3', 'groundedness:0-1']
        """
        return {"name": self.name, "format": self.format,
                "inputs": [i.name + ("*" if i.judged else "") for i in self.inputs],
                "criteria": [f"{c.name}:{c.scale}" for c in self.criteria], "digest": self.digest()}

    @classmethod
    def from_dict(cls, data, source: str = "task") -> TaskSpec:
        """A checked spec from plain values (a task file, a card's config); errors name ``source`` and the key."""
        fields = task_fields(data, source)
        try:
            return cls(**fields)
        except ConfigError as exc:
            raise ConfigError(f"{source}: {exc}") from None
