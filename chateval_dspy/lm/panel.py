"""Mixed-model panels (as in Verga et al., 2024, "Replacing Judges with Juries"): a referee may run on an LM of its
own, bound by its role slug at run time. Each referee's turn runs under the LM bound to its slug (``referee_lm``);
every other call (the summarizer, other referees, an optimizer's prompts) uses the context's main LM.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import dspy

import chateval_dspy.limits as limits
from chateval_dspy.errors import ConfigError, FatalLMError, shown
from chateval_dspy.lm.bound import referee_lms


def check_referee_models(referees, *, where: str = "referee_models") -> tuple[tuple[str, str], ...]:
    """``{slug: model}`` (or its pairs) as sorted pairs, each model checked as ``--model`` is.

    Example:
        >>> check_referee_models({"scientist": "http://127.0.0.1:8000/v1", "critic": "openai/gpt-4o-mini"})
        (('critic', 'openai/gpt-4o-mini'), ('scientist', 'http://127.0.0.1:8000/v1'))
    """
    from chateval_dspy.lm.resolve import check_model_spec

    pairs = list(referees.items()) if isinstance(referees, Mapping) else list(referees or ())
    if len(pairs) > limits.MAX_ROLES:
        raise ConfigError(f"{where}: at most {limits.MAX_ROLES} referees (limits.MAX_ROLES), got {len(pairs)}")
    out: dict[str, str] = {}
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not isinstance(pair[0], str) or not pair[0]:
            raise ConfigError(f"{where}: expected role slug -> model, got {shown(pair, 80)}")
        slug, model = pair
        if slug in out:
            raise ConfigError(f"{where}: referee {slug!r} is given a model twice")
        out[slug] = check_model_spec(model, f"referee {slug!r}")
    return tuple(sorted(out.items()))


def parse_referees(values: list[str] | None) -> dict[str, str]:
    """``--referee SLUG=MODEL`` flags as ``{slug: model}`` (the model may hold ``=`` itself, as a URL's query can).

    Example:
        >>> parse_referees(["critic=openai/gpt-4o-mini", "scientist=http://host:8000/v1"])
        {'critic': 'openai/gpt-4o-mini', 'scientist': 'http://host:8000/v1'}
    """
    out: dict[str, str] = {}
    for value in values or []:
        slug, sep, model = value.partition("=")
        if not sep or not slug.strip() or not model.strip():
            raise ConfigError(f"--referee takes SLUG=MODEL (e.g. critic=openai/gpt-4o-mini), got {shown(value, 200)}")
        if slug.strip() in out:
            raise ConfigError(f"--referee {slug.strip()!r} is given twice")
        out[slug.strip()] = model.strip()
    return dict(check_referee_models(out, where="--referee"))


def check_panel(referees: Mapping[str, str], roles) -> None:
    """Every referee given a model must sit on the panel (``roles``: its slugs); a ``ConfigError`` otherwise.

    Example:
        >>> check_panel({"critic": "openai/gpt-4o-mini"}, ("general_public", "scientist"))
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: referee 'critic' is given a model but is not on the panel (general_public, ...
    """
    missing = [slug for slug in referees if slug not in roles]
    if missing:
        raise ConfigError(f"referee {missing[0]!r} is given a model but is not on the panel ({', '.join(roles)}); "
                          "name a referee of the panel (--role SLUG)")


def referee_names() -> dict[str, str]:
    """``{slug: model name}`` of the bound referees (what a card records; a URL's LM is ``openai-compatible/<id>``).

    Example:
        >>> from chateval_dspy.lm.bound import binding
        >>> with binding({"critic": dspy.LM("openai/gpt-4o-mini")}):
        ...     referee_names()
        {'critic': 'openai/gpt-4o-mini'}
    """
    return {slug: lm.model for slug, lm in sorted(referee_lms().items())}


@contextlib.contextmanager
def open_panel(main: str, referees: Mapping[str, str] | None = None, **kwargs) -> Iterator[tuple[dspy.LM, dict]]:
    """Start the ``main`` LM (the summarizer's and unassigned referees') and each of ``referees``' (``{slug: model}``),
    each distinct model once; yields ``(main LM, {slug: LM})``, stops them all on exit. ``kwargs`` are ``resolve_lm``'s
    (``served_model`` for ``main`` only)."""
    from chateval_dspy.lm import resolve  # looked up at call time, so tests can replace resolve_lm

    referees = dict(referees or {})
    served = kwargs.pop("served_model", None)
    specs = list(dict.fromkeys([main, *referees.values()]))
    # URLs are reached (and model strings built) before the embedded server starts, so a referee naming an
    # unreachable URL fails at once, with the referee named, not after the embedded model has loaded.
    order = sorted(specs, key=lambda s: s == resolve.EMBEDDED)
    named = {spec: [slug for slug, s in referees.items() if s == spec] for spec in specs}
    with contextlib.ExitStack() as stack:
        lms: dict[str, dspy.LM] = {}
        for spec in order:
            try:
                lms[spec] = stack.enter_context(resolve.resolve_lm(
                    spec, served_model=served if spec == main else None, **kwargs))
            except (FatalLMError, ConfigError) as exc:
                if spec == main:
                    raise
                raise type(exc)(f"referee {', '.join(map(repr, named[spec]))}: {exc}") from exc
        yield lms[main], {slug: lms[spec] for slug, spec in referees.items()}
