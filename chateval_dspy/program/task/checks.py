"""The checks of a task spec, made when it is built: names, scales, descriptions, templates and shape.

A spec may come from a file, a judge card or MLflow params, so every value is checked against ``limits`` before
any model starts; errors name the key (the caller adds the source).
"""

from __future__ import annotations

import re

import chateval_dspy.limits as limits
from chateval_dspy.errors import ConfigError, shown
from chateval_dspy.program.task.parts import Criterion, Preference
from chateval_dspy.program.task.scale import Scale
from chateval_dspy.program.task.templates import check_template

FORMATS = ("pointwise", "pairwise")
NAME = re.compile(rf"^[a-z][a-z0-9_]{{0,{limits.MAX_TASK_NAME_CHARS - 1}}}$")
# Names the prompts, the debate and the results lines use for themselves; an input or criterion cannot take them.
RESERVED = frozenset({
    "argument", "discussion", "persona", "evidence", "preference", "reasoning", "final",
    "config", "id", "label", "human", "expected", "format", "prediction", "consistent", "order_preferences",
    "referees", "transcripts", "abstained", "abstentions", "calls", "correct", "prompt_tokens",
    "completion_tokens", "cached_calls", "seconds", "truncated", "empty", "run_key", "error", "row", "instructions",
    "cached_prompt_tokens", "cache_write_tokens", "cost_usd", "usage_by_model", "group_id", "system_id",
})


def check_spec(spec) -> None:
    """Everything in a ``TaskSpec`` that does not depend on the defaults (names, scales, descriptions, shape)."""
    if not isinstance(spec.name, str) or not NAME.match(spec.name):
        raise ConfigError(f"key 'name': a task name must match {NAME.pattern}, got {shown(spec.name, 60)}")
    if spec.format not in FORMATS:
        raise ConfigError(f"key 'format': unknown format {shown(spec.format, 40)}; choose one of: pointwise, pairwise")
    names = _check_inputs(spec)
    _check_criteria(spec, names)
    _check_texts(spec)
    if spec.format != "pairwise":
        if spec.responses or spec.preference is not None:
            raise ConfigError("keys 'responses' and 'preference' belong to pairwise tasks; this task is pointwise")
        return
    _check_pairwise(spec, names)


def _check_inputs(spec) -> set[str]:
    """The inputs' names, descriptions and defaults; their names."""
    _check_count(spec.inputs, "inputs", "input field", "inputs", "MAX_TASK_INPUTS")
    names: set[str] = set()
    for i, inp in enumerate(spec.inputs):
        at = f"inputs[{i}]"
        _check_name(inp.name, at, names, "input")
        _check_text(inp.description, f"{at}.description", empty_ok=True)
        check_template(inp.description, (), f"{at}.description")
        if not isinstance(inp.judged, bool):
            raise ConfigError(f"key '{at}.judged': must be true or false, got {shown(inp.judged, 40)}")
        if inp.default is not None:
            _check_text(inp.default, f"{at}.default")
    return names


def _check_criteria(spec, names: set[str]) -> None:
    """The criteria's names (no clash with an input or the program's own fields), descriptions and scales."""
    _check_count(spec.criteria, "criteria", "criterion", "criteria", "MAX_CRITERIA")
    pairwise = spec.format == "pairwise"
    seen: set[str] = set()
    for i, c in enumerate(spec.criteria):
        at = f"criteria[{i}]"
        if not isinstance(c, Criterion):
            raise ConfigError(f"key '{at}': expected a Criterion, got {type(c).__name__}")
        _check_name(c.name, at, seen, "criterion")
        fields = (f"{c.name}_1", f"{c.name}_2") if pairwise else (c.name,)
        clash = [f for f in fields if f in names or f in RESERVED]
        if clash:
            raise ConfigError(f"key '{at}.name': criterion {c.name!r} gives the field {clash[0]!r}, which "
                              f"{'is an input' if clash[0] in names else 'the program uses itself'}; rename it")
        if not isinstance(c.description, str) or not c.description.strip():
            raise ConfigError(f"key '{at}.description': criterion {c.name!r} has no description; say what a referee "
                              "should judge, e.g. 'does every claim follow from the context?'")
        _check_text(c.description, f"{at}.description")
        check_template(c.description, ("n", "response") if pairwise else (), f"{at}.description")
        if not isinstance(c.scale, Scale):
            raise ConfigError(f"key '{at}.scale': expected a Scale, got {type(c.scale).__name__}")


def _check_texts(spec) -> None:
    """Where the criteria go, the evidence text, the instructions and the material template."""
    if spec.criteria_in not in ("fields", "instructions"):
        raise ConfigError(f"key 'criteria_in': choose fields or instructions, got {shown(spec.criteria_in, 40)}")
    _check_text(spec.evidence, "evidence")
    check_template(spec.evidence, (), "evidence")
    for key in ("argue", "verdict", "material"):
        _check_text(getattr(spec, key), "material" if key == "material" else f"instructions.{key}",
                    "MAX_INSTRUCTION_CHARS", empty_ok=True)
    check_template(spec.argue, ("criteria",), "instructions.argue")
    check_template(spec.verdict, ("criteria",), "instructions.verdict")
    check_template(spec.material, spec.input_names, "material")


def _check_pairwise(spec, names: set[str]) -> None:
    """A pairwise task's two responses and how its preference is reached."""
    if spec.responses:
        if not isinstance(spec.responses, tuple) or len(spec.responses) != 2 or len(set(spec.responses)) != 2 \
                or not all(r in names for r in spec.responses):
            raise ConfigError(f"key 'responses': name two different inputs, got {shown(list(spec.responses), 120)} "
                              f"(inputs: {', '.join(spec.input_names)})")
    pref = spec.preference
    if pref is not None:
        if not isinstance(pref, Preference):
            raise ConfigError(f"key 'preference': expected a Preference, got {type(pref).__name__}")
        for name in pref.combine:
            c = spec.criterion.get(name) if isinstance(name, str) else None
            if c is None or not c.scale.ordinal:
                raise ConfigError(f"key 'preference.combine': {shown(name, 40)} is not an integer-scale criterion of this "
                                  f"task ({', '.join(x.name for x in spec.criteria if x.scale.ordinal) or 'none'})")
        if pref.stated is not None:
            _check_text(pref.stated, "preference.stated")
            check_template(pref.stated, (), "preference.stated")
    if not any(c.scale.ordinal for c in spec.criteria) and (pref is None or pref.stated is None):
        raise ConfigError("key 'preference': a pairwise panel needs an integer-scale criterion to compare the "
                          "responses by, or a stated preference (preference.stated: a description)")


def check_resolved(spec) -> None:
    """Checks of the filled-in ``TaskSpec``: the criteria named where they must be; each field's description fits."""
    if spec.criteria_in == "instructions":
        text = spec.verdict_instructions
        missing = [c.name for c in spec.criteria if not re.search(rf"\b{re.escape(c.name)}\b", text)]
        if missing:
            raise ConfigError(f"key 'criteria_in' is 'instructions', but the verdict instructions never name "
                              f"{missing[0]!r}: describe it there (or use {{criteria}}), or set criteria_in: fields")
    for c in spec.criteria:
        for n in ((1, 2) if spec.format == "pairwise" else (None,)):
            if len(spec.describe(c, n)) > limits.MAX_FIELD_TEXT_CHARS:
                raise ConfigError(f"criterion {c.name!r}: its description is longer than "
                                  f"{limits.MAX_FIELD_TEXT_CHARS} characters once filled in (limits.MAX_FIELD_TEXT_CHARS)")


def _check_count(items, key: str, one: str, many: str, limit_name: str) -> None:
    if not isinstance(items, tuple) or not items:
        raise ConfigError(f"key '{key}': a task needs at least one {one}")
    limit = getattr(limits, limit_name)
    if len(items) > limit:
        raise ConfigError(f"key '{key}': {len(items)} {many}; the limit is {limit} (limits.{limit_name})")


def _check_name(name, at: str, seen: set[str], what: str) -> None:
    """A valid, unreserved name not in ``seen`` (the names of the same kind so far), which it joins."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ConfigError(f"key '{at}.name': a name must match {NAME.pattern} (a field name of the prompts), "
                          f"got {shown(name, 60)}")
    if name in RESERVED:
        raise ConfigError(f"key '{at}.name': {name!r} is a name the program uses itself; choose another")
    if name in seen:
        raise ConfigError(f"key '{at}': duplicate {what} name {name!r}")
    seen.add(name)


def _check_text(value, at: str, limit_name: str = "MAX_TASK_DESCRIPTION_CHARS", *, empty_ok: bool = False) -> None:
    limit = getattr(limits, limit_name)
    if not isinstance(value, str) or (not empty_ok and not value.strip()):
        raise ConfigError(f"key '{at}': expected {'a' if empty_ok else 'a non-empty'} text, got {shown(value, 60)}")
    if len(value) > limit:
        raise ConfigError(f"key '{at}': {len(value)} characters; the limit is {limit} (limits.{limit_name})")
