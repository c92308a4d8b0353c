"""Which LM each referee of a loaded evaluator runs on.

A mixed panel's card names each referee's model too (``referee_models``). The rule: ``load(path)`` runs every
referee on its card name (a LiteLLM string or ``embedded``); ``model=`` overrides the whole panel with one LM;
``referee_models={slug: spec}`` rebinds those referees (a URL, a LiteLLM string, ``embedded``), the others
following ``model=`` if given, else their card names. A card name ``openai-compatible/<id>`` (a base URL's LM)
cannot be reached from the name: such a referee needs ``referee_models=`` (or ``model=``).
"""

from __future__ import annotations

import warnings

import dspy

from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.batch.setup import BATCH_PREFIX
from chateval_dspy.lm.resolve import EMBEDDED, EMBEDDED_MODEL_ID


def default_model(card: dict) -> str:
    """The LM spec of the card's model name (the panel's LM when the caller names none)."""
    return _spec_for_name(card.get("model") or "", "this evaluator",
                          "model= in load()'s LMSpec, or --model (a base URL or LiteLLM model string)")


def _spec_for_name(model: str, who: str, how: str) -> str:
    """The LM spec a card's model *name* stands for, or a ConfigError saying how to give the endpoint."""
    if model == EMBEDDED_MODEL_ID:
        return EMBEDDED
    if model.startswith("openai-compatible/") or not model:
        raise ConfigError(f"{who} was compiled for {model or 'an unknown model'!r}, which cannot be reached "
                          f"from its name alone: pass {how}")
    return model


def referee_specs(card: dict, roles, *, model: str | None, referee_models: dict[str, str] | None) -> dict[str, str]:
    """``{slug: spec}`` of the referees that run on an LM of their own (the rule in the module's docstring).

    Example:
        >>> card = {"model": "openai/gpt-4o-mini", "referee_models": {"critic": "openai/gpt-4o"}}
        >>> referee_specs(card, ("critic", "scientist"), model=None, referee_models=None)
        {'critic': 'openai/gpt-4o'}
        >>> referee_specs(card, ("critic", "scientist"), model="http://h:8000/v1", referee_models=None)
        {}
        >>> referee_specs(card, ("critic", "scientist"), model=None, referee_models={"scientist": "embedded"})
        {'critic': 'openai/gpt-4o', 'scientist': 'embedded'}
    """
    from chateval_dspy.lm.panel import check_panel, check_referee_models

    given = dict(check_referee_models(referee_models or {}))
    check_panel(given, roles)
    out = {} if model is not None else {
        slug: _spec_for_name(name, f"referee {slug!r}", f"referee_models={{{slug!r}: URL}} (or model= for the "
                             "whole panel)")
        for slug, name in (card.get("referee_models") or {}).items() if slug not in given}
    return {**out, **given}


def warn_if_moved(card: dict, lm: dspy.LM, referee_lms: dict[str, dspy.LM], roles) -> None:
    """Warn about every referee (and the main LM) that now runs on another model than the card's."""
    compiled = card.get("model")
    if compiled and lm.model.removeprefix(BATCH_PREFIX) != compiled:  # batched, it is still the same model
        warnings.warn(f"this evaluator was compiled for {compiled} and now runs on {lm.model}: its instructions "
                      "and demonstrations were tuned for another model, so its agreement figures may not hold",
                      UserWarning, stacklevel=3)
    named = card.get("referee_models") or {}
    moved = {slug: (named.get(slug) or compiled, (referee_lms.get(slug) or lm).model) for slug in roles}
    moved = {slug: pair for slug, pair in moved.items() if pair[0] and pair[0] != pair[1] and slug in named}
    if moved:
        warnings.warn("referee(s) compiled for another model now run on: " + ", ".join(
            f"{slug} {was} -> {now}" for slug, (was, now) in moved.items()), UserWarning, stacklevel=3)
