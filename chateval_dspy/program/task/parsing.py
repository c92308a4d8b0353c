"""A task file's form (YAML/JSON mappings) read into the keywords of a ``TaskSpec``.

Only the shape is checked here (known keys, lists and mappings, their lengths); the values are checked when the
spec is built (``checks``). Errors name the source and the key.
"""

from __future__ import annotations

import chateval_dspy.limits as limits
from chateval_dspy.errors import ConfigError, shown
from chateval_dspy.program.task.parts import Criterion, InputSpec, Preference
from chateval_dspy.program.task.scale import Scale

TASK_KEYS = ("name", "format", "inputs", "criteria", "instructions", "evidence", "responses", "preference",
             "material", "criteria_in", "label_map", "label_map_merge")
INPUT_KEYS = ("name", "description", "judged", "default")
CRITERION_KEYS = ("name", "description", "scale")


def task_fields(data, source: str) -> dict:
    """The ``TaskSpec`` keywords of a task file's mapping; errors start with ``source``.

    Example:
        >>> task_fields({"name": "t", "format": "pointwise", "inputs": [{"name": "q"}],
        ...              "criteria": [{"name": "c", "description": "d", "scale": "1-3"}]}, "t.yaml")["criteria"]
        (Criterion(name='c', description='d', scale=Scale(low=1, high=3, labels=())),)
    """
    def fail(detail: str) -> ConfigError:
        return ConfigError(f"{source}: {detail}")

    if not isinstance(data, dict):
        raise fail(f"a task is a mapping of {', '.join(TASK_KEYS)}; got {type(data).__name__}")
    unknown = sorted(str(k)[:40] for k in set(data) - set(TASK_KEYS))
    if unknown:
        raise fail(f"unknown key(s) {', '.join(repr(k) for k in unknown)}; a task has: {', '.join(TASK_KEYS)}")
    for key in ("name", "format", "inputs", "criteria"):
        if key not in data:
            raise fail(f"missing key '{key}'")
    try:
        return _fields(data)
    except ConfigError as exc:
        raise fail(str(exc)) from None


def _fields(data: dict) -> dict:
    inputs = _entries(data["inputs"], "inputs", INPUT_KEYS, limits.MAX_TASK_INPUTS)
    criteria = _entries(data["criteria"], "criteria", CRITERION_KEYS, limits.MAX_CRITERIA)
    parsed_inputs = tuple(InputSpec(e.get("name"), e.get("description", "") if e.get("description") is not None
                                    else "", e.get("judged", False), e.get("default")) for e in inputs)
    parsed_criteria = tuple(_criterion(i, e) for i, e in enumerate(criteria))
    instructions = data.get("instructions") or {}
    if not isinstance(instructions, dict) or set(instructions) - {"argue", "verdict"}:
        raise ConfigError("key 'instructions': a mapping with 'argue' and/or 'verdict' texts")
    preference = _preference(data.get("preference"))
    responses = data.get("responses") or ()
    if not isinstance(responses, (list, tuple)):
        raise ConfigError("key 'responses': a list of the two compared inputs")
    merge = data.get("label_map_merge", False)
    if not isinstance(merge, bool):
        raise ConfigError(f"key 'label_map_merge': true or false, got {shown(merge, 40)}")
    return {"name": data["name"], "format": data["format"], "inputs": parsed_inputs, "criteria": parsed_criteria,
            "argue": _opt_text(instructions.get("argue"), "instructions.argue"),
            "verdict": _opt_text(instructions.get("verdict"), "instructions.verdict"),
            **{key: data[key] for key in ("evidence", "criteria_in") if key in data},  # absent: the spec's default
            "responses": tuple(responses), "preference": preference,
            "material": _opt_text(data.get("material"), "material"), "label_map": label_pairs(data.get("label_map")),
            "label_map_merge": merge}


def _criterion(i: int, entry: dict) -> Criterion:
    if "scale" not in entry:
        raise ConfigError(f"key 'criteria[{i}]': missing key 'scale' (an integer range such as '1-5', or "
                          "a list of labels)")
    try:
        scale = Scale.from_value(entry["scale"])
    except ConfigError as exc:
        raise ConfigError(f"key 'criteria[{i}].scale': {exc}") from None
    return Criterion(entry.get("name"), entry.get("description"), scale)


def _preference(pref) -> Preference | None:
    if pref is None:
        return None
    if not isinstance(pref, dict) or set(pref) - {"combine", "stated"}:
        raise ConfigError("key 'preference': a mapping with 'combine' (criteria names) and/or 'stated' "
                          "(the description of a stated preference)")
    combine = pref.get("combine") or ()
    combine = (combine,) if isinstance(combine, str) else combine
    if not isinstance(combine, (list, tuple)):
        raise ConfigError("key 'preference.combine': a criterion name or a list of them")
    return Preference(tuple(combine), pref.get("stated"))


def label_pairs(raw) -> tuple[tuple[str, str], ...]:
    """``label_map``: a mapping of the data's label values to ours, both texts or numbers (YAML reads 0 as a number).

    Two keys that are one value once read as text (YAML's ``0`` and ``"0"``) with two labels are an error: the
    data's ``0`` would take whichever came last.

    Example:
        >>> label_pairs({0: "tie", "A": 1})
        (('0', 'tie'), ('A', '1'))
    """
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ConfigError("key 'label_map': a mapping of your label values to ours, e.g. {\"0\": tie, \"A\": \"1\"}")
    if len(raw) > limits.MAX_SCALE_LABELS * 10:
        raise ConfigError(f"key 'label_map': {len(raw)} entries; the limit is {limits.MAX_SCALE_LABELS * 10}")
    given: dict[str, str] = {}
    for key, value in raw.items():
        for part in (key, value):
            if (isinstance(part, bool) or not isinstance(part, (str, int, float)) or not str(part).strip()
                    or len(str(part)) > limits.MAX_LABEL_CHARS):
                raise ConfigError(f"key 'label_map': {shown(part, 40)} is no label value (a text or a number)")
        key, value = str(key).strip(), str(value).strip()
        if given.setdefault(key, value) != value:
            raise ConfigError(f"key 'label_map': {shown(key, 40)} is given twice, as {shown(given[key], 40)} and "
                              f"{shown(value, 40)}; say which label it is once")
    return tuple(given.items())


def _opt_text(value, key: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ConfigError(f"key '{key}': expected a text, got {type(value).__name__}")
    return value


def _entries(raw, key: str, allowed: tuple[str, ...], limit: int) -> list[dict]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"key '{key}': a non-empty list")
    if len(raw) > limit:
        raise ConfigError(f"key '{key}': {len(raw)} entries; the limit is {limit}")
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise ConfigError(f"key '{key}[{i}]': a mapping with {', '.join(allowed)}")
        extra = sorted(str(k)[:40] for k in set(entry) - set(allowed))
        if extra:
            raise ConfigError(f"key '{key}[{i}]': unknown key(s) {', '.join(repr(k) for k in extra)}; "
                              f"allowed: {', '.join(allowed)}")
    return raw
