"""A saved evaluator's files checked as untrusted input: the card (``check_card``) and the DSPy state
(``check_program_state``), before anything is built from them (what is refused: docs/production.md, "A saved
program is untrusted input").

The state handed to DSPy is built from the checked parts only. The checks are by hand, not pydantic models: demo
fields differ per signature, and pydantic's errors would need rewriting into these messages.
"""

from __future__ import annotations

import json
import logging
import re
import typing

import dspy

import chateval_dspy.limits as limits
from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.saved.certificate import check_certificate
from chateval_dspy.errors import ConfigError, shown
from chateval_dspy.lm.pricing import CACHE_RATES, UNPRICED
from chateval_dspy.program.chateval import ChatEval
from chateval_dspy.program.confidence import METHODS, check_guarantee
from chateval_dspy.program.roles import Role, make_role

log = logging.getLogger(__name__)

CARD_FORMAT = 1
# The card keys a loader reads to build the evaluator; each is checked. ``referee_models`` (a mixed panel's
# ``{role slug: model name}``) is, like ``model``, only a default *name* for the loader's LM.
CARD_CONFIGURING = ("card_format", "model", "config", "roles", "referee_models")
# The card keys that describe how the evaluator was made; nothing reads them to configure anything.
CARD_DESCRIPTIVE = ("created", "versions", "dataset", "dataset_hash", "split", "optimizer", "optimizer_settings",
                    "metric", "search", "dev_metrics", "test_metrics", "cost", "skipped_rows", "labels", "calibration",
                    "certificate")
# The card's ``calibration``: a summary of calibration.json (``card.calibration_block``), which it must match.
CALIBRATION_CARD_KEYS = ("method", "breakpoints", "threshold", "level", "risk", "fitted_on")
# DSPy writes these predictor keys empty; any content would let the file choose an LM, its sampling or decoding.
EMPTY_PREDICTOR_KEYS = {"lm": None, "traces": [], "train": [], "fields": {}}
# A bootstrapped demo is marked ``augmented``; its ``logprobs`` (kept when weighted scores were on) never reach a prompt.
DEMO_MARKERS = ("augmented",)
DEMO_DROPPED = ("logprobs",)
# A model *name* (``provider/model``, ``openai-compatible/<served id>``): no scheme, query, spaces or settings.
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+/-]*$")
# The cost block: per-item figures (numbers; dollars may be the word ``unpriced``) and ``by_model``, per model
# name, the same figures over the run.
COST_BY_MODEL = "by_model"
# Per model, the one word among its figures: which cache rates its price had (``Price.cache_rates``).
CACHE_RATES_KEY = "cache_rates"


def check_model_name(model, where, *, key: str = "model") -> None:
    """A card's model is a default *name* only: never an endpoint URL, a key or call settings."""
    if model is None or model == "":
        return
    if not isinstance(model, str) or len(model) > limits.MAX_MODEL_NAME_CHARS:
        raise ConfigError(f"{where}: key {key!r} must be a model name of at most {limits.MAX_MODEL_NAME_CHARS} "
                          f"characters (limits.MAX_MODEL_NAME_CHARS), got {shown(model, 80)}")
    if "://" in model or not MODEL_NAME.match(model):
        raise ConfigError(f"{where}: key {key!r} must be a model name such as 'openai/gpt-4o-mini', not an endpoint "
                          f"URL, credentials or settings (got {model[:80]!r}); pass the LM to load(lm=LMSpec(model=...))")


def check_referee_models(referees, config: DebateConfig, where) -> None:
    """A card's ``referee_models``: referees of the panel, each to a model *name* (the rule of ``model``)."""
    if not isinstance(referees, dict) or not referees or len(referees) > limits.MAX_ROLES:
        raise ConfigError(f"{where}: key 'referee_models' must map referees of the panel to model names")
    for slug, name in referees.items():
        if slug not in config.roles:
            raise ConfigError(f"{where}: key 'referee_models' names {str(slug)[:40]!r}, which is not a referee of the "
                              f"panel ({', '.join(config.roles)})")
        check_model_name(name, where, key=f"referee_models.{slug}")


def check_cost(cost, where) -> None:
    """A card's ``cost``: figures (numbers, or ``unpriced`` for dollars) and ``by_model``, per model name, the same
    (plus ``cache_rates``, a ``Price.cache_rates`` word or null)."""
    def figures(block, at: str, nested: bool) -> None:
        if not isinstance(block, dict) or len(block) > 40:
            raise ConfigError(f"{where}: key {at!r} must be a mapping of at most 40 cost figures")
        for key, value in block.items():
            if nested and key == COST_BY_MODEL:
                if not isinstance(value, dict) or len(value) > limits.MAX_ROLES + 1:
                    raise ConfigError(f"{where}: key '{at}.{COST_BY_MODEL}' must map at most {limits.MAX_ROLES + 1} "
                                      "model names to their figures")
                for name, inner in value.items():
                    check_model_name(name, where, key=f"{at}.{COST_BY_MODEL}")
                    figures(inner, f"{at}.{COST_BY_MODEL}.{name}", False)
                continue
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not nested and key == CACHE_RATES_KEY:
                if value is not None and value not in CACHE_RATES.values():
                    raise ConfigError(f"{where}: key '{at}.{key}' must be one of {', '.join(CACHE_RATES.values())} "
                                      f"or null, got {shown(value, 80)}")
                continue
            if not isinstance(key, str) or len(key) > 80 or not (
                    number or value is None or (value == UNPRICED and "usd" in key)):
                raise ConfigError(f"{where}: key '{at}.{str(key)[:80]}' must be a number (dollars: a number or "
                                  f"{UNPRICED!r}), got {shown(value, 80)}")

    figures(cost, "cost", True)


def check_calibration_block(block, where) -> None:
    """A card's ``calibration`` summary: ``CALIBRATION_CARD_KEYS``, each by the rule of ``calibration.json``."""
    if not isinstance(block, dict) or set(block) != set(CALIBRATION_CARD_KEYS):
        raise ConfigError(f"{where}: key 'calibration' must hold exactly {', '.join(CALIBRATION_CARD_KEYS)}")
    if block["method"] not in METHODS:
        raise ConfigError(f"{where}: key 'calibration.method' must be one of {', '.join(METHODS)}, got "
                          f"{shown(block['method'], 40)}")
    n = block["breakpoints"]
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= limits.MAX_CONFIDENCE_BREAKPOINTS:
        raise ConfigError(f"{where}: key 'calibration.breakpoints' must be a count from 1 to "
                          f"{limits.MAX_CONFIDENCE_BREAKPOINTS}, got {shown(n, 40)}")
    check_guarantee(block, f"{where}: key 'calibration'")


def check_card(card: dict, where) -> tuple[DebateConfig, list[Role]]:
    """The config and personas of a card, every key and value checked (``where`` names the card in errors)."""
    unknown = sorted(str(k)[:40] for k in set(card) - set(CARD_CONFIGURING) - set(CARD_DESCRIPTIVE))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(repr(k) for k in unknown)}: a card holds only "
                          f"{', '.join(CARD_CONFIGURING + CARD_DESCRIPTIVE)}; the LM and its settings come from "
                          "the caller, never from a card")
    for key in ("model", "config", "roles"):
        if key not in card:
            raise ConfigError(f"{where}: malformed card, missing or wrong field '{key}'")
    check_model_name(card["model"], where)
    try:
        config = DebateConfig.from_dict(card["config"])
    except ConfigError as exc:
        raise ConfigError(f"{where}: key 'config': {exc}") from exc
    if "referee_models" in card:
        check_referee_models(card["referee_models"], config, where)
    for key, check in (("cost", check_cost), ("calibration", check_calibration_block), ("certificate", check_certificate)):
        if key in card:
            check(card[key], where)
    entries = card["roles"]
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: malformed card, missing or wrong field 'roles' (expected a list)")
    if len(entries) > limits.MAX_ROLES:
        raise ConfigError(f"{where}: key 'roles' has {len(entries)} referees; the limit is {limits.MAX_ROLES} "
                          "(limits.MAX_ROLES)")
    roles = []
    for i, entry in enumerate(entries, start=1):
        at = f"{where}: key 'roles' #{i}"
        if not isinstance(entry, dict) or set(entry) != {"slug", "name", "personas"}:
            raise ConfigError(f"{at}: malformed card, expected exactly slug, name and personas")
        roles.append(make_role(entry["slug"], entry["name"], entry["personas"], at, same_role_slugs=True,
                               normalise=False))
    if [r.slug for r in roles] != list(config.roles):
        raise ConfigError(f"{where}: key 'roles' {[r.slug for r in roles]} does not match the config's roles "
                          f"{list(config.roles)}")
    for role in roles:
        try:
            role.persona(config.task_spec)
        except ConfigError as exc:
            raise ConfigError(f"{where}: key 'roles': {exc}") from exc
    versions = card.get("versions", {})
    if not isinstance(versions, dict) or not all(isinstance(k, str) and isinstance(v, str) and len(v) <= 100
                                                 for k, v in versions.items()):
        raise ConfigError(f"{where}: key 'versions' must map package names to version strings")
    return config, roles


def _field_check(annotation):
    """``(accepts(value), scale text)`` for one signature field: a Literal scale or text."""
    if typing.get_origin(annotation) is typing.Literal:
        allowed = typing.get_args(annotation)
        # type() as well as ==: True == 1 and 7.0 == 7, neither of which is a point of the scale
        return (lambda v: any(type(v) is type(a) and v == a for a in allowed),
                "one of " + ", ".join(repr(a) for a in allowed))
    if annotation is str:
        return (lambda v: isinstance(v, str) and len(v) <= limits.MAX_DEMO_TEXT_CHARS,
                f"a text of at most {limits.MAX_DEMO_TEXT_CHARS} characters (limits.MAX_DEMO_TEXT_CHARS)")
    return (lambda v: False, f"a value of type {annotation!r}, which a saved demo cannot hold")


def _check_signature(raw, signature, at: str) -> dict:
    if not isinstance(raw, dict) or set(raw) != {"instructions", "fields"}:
        raise ConfigError(f"{at}: key 'signature' must hold exactly 'instructions' and 'fields'")
    text = raw["instructions"]
    if not isinstance(text, str) or len(text) > limits.MAX_INSTRUCTION_CHARS:
        raise ConfigError(f"{at}: key 'signature.instructions' must be a text of at most "
                          f"{limits.MAX_INSTRUCTION_CHARS} characters (limits.MAX_INSTRUCTION_CHARS), got "
                          f"{len(text) if isinstance(text, str) else type(text).__name__}")
    fields = raw["fields"]
    if not isinstance(fields, list) or len(fields) != len(signature.fields):
        raise ConfigError(f"{at}: key 'signature.fields' must list the signature's {len(signature.fields)} fields "
                          f"({', '.join(signature.fields)})")
    out = []
    for name, entry in zip(signature.fields, fields):
        if not isinstance(entry, dict) or set(entry) != {"prefix", "description"} or not all(
                isinstance(v, str) and len(v) <= limits.MAX_FIELD_TEXT_CHARS for v in entry.values()):
            raise ConfigError(f"{at}: key 'signature.fields' entry for {name!r} must hold exactly a prefix and a "
                              f"description, texts of at most {limits.MAX_FIELD_TEXT_CHARS} characters "
                              "(limits.MAX_FIELD_TEXT_CHARS)")
        out.append({"prefix": entry["prefix"], "description": entry["description"]})
    return {"instructions": text, "fields": out}


def _check_demos(raw, signature, at: str) -> list[dict]:
    if not isinstance(raw, list):
        raise ConfigError(f"{at}: key 'demos' must be a list")
    if len(raw) > limits.MAX_DEMOS_PER_PREDICTOR:
        raise ConfigError(f"{at}: key 'demos' has {len(raw)} demos; the limit is {limits.MAX_DEMOS_PER_PREDICTOR} "
                          "(limits.MAX_DEMOS_PER_PREDICTOR)")
    checks = {name: _field_check(field.annotation) for name, field in signature.fields.items()}
    out, total = [], 0
    for i, demo in enumerate(raw, start=1):
        if not isinstance(demo, dict):
            raise ConfigError(f"{at}: demo #{i} must be a mapping of the signature's fields")
        clean = {}
        for key, value in demo.items():
            if key in DEMO_DROPPED:
                continue
            if key in DEMO_MARKERS:
                if not isinstance(value, bool):
                    raise ConfigError(f"{at}: demo #{i} key {key!r} must be true or false")
            elif key not in checks:
                raise ConfigError(f"{at}: demo #{i} key {str(key)[:40]!r} is not a field of the signature "
                                  f"({', '.join(checks)})")
            else:
                accepts, scale = checks[key]
                if not accepts(value):
                    raise ConfigError(f"{at}: demo #{i} key {key!r} must be {scale}, got {shown(value, 80)}")
                total += len(value) if isinstance(value, str) else 0
            clean[key] = value
        out.append(clean)
    if total > limits.MAX_DEMO_CHARS_PER_PREDICTOR:
        raise ConfigError(f"{at}: key 'demos' holds {total} characters of text; the limit is "
                          f"{limits.MAX_DEMO_CHARS_PER_PREDICTOR} (limits.MAX_DEMO_CHARS_PER_PREDICTOR)")
    return out


def check_program_state(raw, program: ChatEval, where) -> dict:
    """The DSPy state for ``program`` built from the allowed parts of ``raw`` (a parsed ``program.json``): every
    predictor present with exactly its signature's fields, instructions and demos within ``limits``, demo outputs on
    the signature's scales, and no LM, config, traces or other keys (a ``ConfigError`` naming ``where``, the
    predictor, the key and the limit otherwise)."""
    def fail(detail: str) -> ConfigError:
        return ConfigError(f"{where}: not a valid program state for this card: {detail}")

    if not isinstance(raw, dict):
        raise fail(f"expected a JSON object, got {type(raw).__name__}")
    predictors = dict(program.named_predictors())
    unknown = sorted(str(k)[:80] for k in set(raw) - set(predictors) - {"metadata"})
    if unknown:
        raise fail(f"unknown key(s) {unknown}; this card's program has the predictors {sorted(predictors)}")
    missing = sorted(set(predictors) - set(raw))
    if missing:
        raise fail(f"missing predictor(s) {missing}")
    meta = raw.get("metadata", {})
    versions = meta.get("dependency_versions", {}) if isinstance(meta, dict) else None
    if not isinstance(versions, dict):
        raise fail("key 'metadata' must be a mapping with a 'dependency_versions' mapping")
    if versions.get("dspy") not in (None, dspy.__version__):
        log.warning("%s was saved with dspy %s; this is dspy %s", where, str(versions.get("dspy"))[:40],
                    dspy.__version__)
    state = {}
    for name, predictor in predictors.items():
        entry = raw[name]
        if not isinstance(entry, dict):
            raise fail(f"predictor {name!r} must be a mapping, got {type(entry).__name__}")
        extra = sorted(str(k)[:40] for k in set(entry) - {"signature", "demos"} - set(EMPTY_PREDICTOR_KEYS))
        if extra:
            raise fail(f"predictor {name!r} key(s) {extra}: a saved predictor holds only its signature and demos; "
                       "its LM and call settings come from the caller")
        for key, empty in EMPTY_PREDICTOR_KEYS.items():
            if key in entry and entry[key] != empty:
                raise fail(f"predictor {name!r} key {key!r} must be {json.dumps(empty)}: a saved evaluator does not "
                           "choose its LM, sampling, decoding or traces")
        if "signature" not in entry:
            raise fail(f"predictor {name!r} has no key 'signature'")
        try:
            signature = _check_signature(entry["signature"], predictor.signature, f"predictor {name!r}")
            demos = _check_demos(entry.get("demos", []), predictor.signature, f"predictor {name!r}")
        except ConfigError as exc:
            raise fail(str(exc)) from None
        state[name] = {"signature": signature, "demos": demos, "lm": None}
    return state


def check_loaded(program: ChatEval, where) -> None:
    """After loading: no predictor may carry an LM, call settings, traces or decision settings of its own."""
    for name, predictor in program.named_predictors():
        if predictor.lm is not None or predictor.config or getattr(predictor, "fields", None) \
                or predictor.traces or predictor.train:
            raise ConfigError(f"{where}: predictor {name!r} carries its own LM or settings after loading")
