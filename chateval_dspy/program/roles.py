"""Referee personas: the paper's five, the same-role ablation, and user files.

Personas are data, not prompt text: a debater receives its persona as an input
field, so one signature serves every role while each role keeps its own
predictors for an optimizer to tune.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import chateval_dspy.limits as limits
from chateval_dspy.errors import ConfigError, shown
from chateval_dspy.program.task import TaskSpec, as_task, builtin_task

SLUG = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
# The paper's "same role prompt for all agents" ablation: referee_1..referee_N
# all carry this persona, yet each is its own debater with its own predictors.
SAME_ROLE_PERSONA = "You are a careful, fair referee judging the text below."
SAME_ROLE = re.compile(r"^referee_([1-9][0-9]?)$")
FORMATS = ("*", "pairwise", "pointwise")


@dataclass(frozen=True)
class Role:
    """A referee: a stable slug (used in predictor names), a display name and its personas.

    Persona keys: ``pairwise`` and ``pointwise`` (the built-in tasks, FairEval and Topical-Chat) and ``*``
    (any task, and the only one your own task specs read).
    """

    slug: str
    name: str
    personas: tuple[tuple[str, str], ...]

    def persona(self, task: TaskSpec | str) -> str:
        """The persona for a task (or a format's built-in task): its format's (built-ins only), else ``*``.

        Example:
            >>> Role("x", "X", (("*", "You judge."), ("pointwise", "You chat."))).persona("pointwise")
            'You chat.'
        """
        spec = as_task(task)
        table = dict(self.personas)
        keys = persona_keys(spec)
        for key in keys:
            if table.get(key):
                return table[key]
        what = f"the {keys[0]!r} format" if len(keys) > 1 else f"task {spec.name!r}"
        raise ConfigError(f"role {self.slug!r} has no persona for {what}: give it one under "
                          f"{' or '.join(repr(k) for k in keys)} in the role file")


def persona_keys(spec: TaskSpec) -> tuple[str, ...]:
    """Where a role's persona for a task is found: a built-in task's format (``pairwise``, ``pointwise``: personas
    written for FairEval and Topical-Chat), then ``*`` (any task).

    Example:
        >>> persona_keys(builtin_task("pairwise")), persona_keys(TaskSpec.from_dict({**builtin_task("pairwise").to_dict(),
        ...                                                                           "name": "mine"}))
        (('pairwise', '*'), ('*',))
    """
    return (spec.format, "*") if spec == builtin_task(spec.format) else ("*",)


def same_roles(n: int) -> tuple[str, ...]:
    """Slugs for the same-persona ablation with ``n`` referees.

    Example:
        >>> same_roles(2)
        ('referee_1', 'referee_2')
    """
    return tuple(f"referee_{i}" for i in range(1, n + 1))


def make_role(slug, name, personas, where: str, *, same_role_slugs: bool = False, normalise: bool = True) -> Role:
    """A checked ``Role`` from untrusted values (a role file's entry or a judge card's); errors start with ``where``.

    ``personas`` maps ``*`` (any task), ``pairwise`` or ``pointwise`` to a persona text; ``referee_N`` slugs only
    with ``same_role_slugs`` (a saved card of the ablation). ``normalise`` collapses whitespace in names and
    personas, as role files are written by hand; a card keeps the exact text it was compiled with.

    Example:
        >>> make_role("editor", "Editor", {"*": "You edit."}, "roles.yaml role #1").persona("pointwise")
        'You edit.'
    """
    if not isinstance(slug, str) or not SLUG.match(slug):
        raise ConfigError(f"{where}: 'slug' must match {SLUG.pattern} (got {shown(slug, 80)})")
    if SAME_ROLE.match(slug) and not same_role_slugs:
        raise ConfigError(f"{where}: slug {slug!r} is reserved for the same-role ablation")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}: 'name' is missing or empty")
    if len(name) > limits.MAX_ROLE_NAME_CHARS:
        raise ConfigError(f"{where}: 'name' has {len(name)} characters; the limit is {limits.MAX_ROLE_NAME_CHARS} "
                          "(limits.MAX_ROLE_NAME_CHARS)")
    if not isinstance(personas, dict) or not personas:
        raise ConfigError(f"{where}: 'persona' must be a text or a mapping of format -> text")
    texts = {}
    for fmt, text in personas.items():
        if fmt not in FORMATS or not isinstance(text, str) or not text.strip():
            raise ConfigError(f"{where}: persona for {shown(fmt, 40)} must be a non-empty text (keys: * for any task, "
                              "pairwise, pointwise)")
        text = " ".join(text.split()) if normalise else text
        if len(text) > limits.MAX_PERSONA_CHARS:
            raise ConfigError(f"{where}: persona for {fmt!r} has {len(text)} characters; the limit is "
                              f"{limits.MAX_PERSONA_CHARS} (limits.MAX_PERSONA_CHARS)")
        texts[fmt] = text
    return Role(slug, name.strip() if normalise else name, tuple(sorted(texts.items())))


def _parse_roles(data, source: str) -> dict[str, Role]:
    if not isinstance(data, dict) or not isinstance(data.get("roles"), list):
        raise ConfigError(f"{source}: expected a mapping with a 'roles' list")
    if len(data["roles"]) > limits.MAX_ROLE_FILE_ROLES:
        raise ConfigError(f"{source}: {len(data['roles'])} roles; a role file holds at most "
                          f"{limits.MAX_ROLE_FILE_ROLES} (limits.MAX_ROLE_FILE_ROLES)")
    out: dict[str, Role] = {}
    for i, entry in enumerate(data["roles"], start=1):
        where = f"{source} role #{i}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: expected a mapping with slug, name and persona")
        persona = entry.get("persona")
        role = make_role(entry.get("slug"), entry.get("name"), {"*": persona} if isinstance(persona, str) else persona,
                         where)
        if role.slug in out:
            raise ConfigError(f"{where}: duplicate slug {role.slug!r}")
        out[role.slug] = role
    return out


def load_role_file(path: str | Path) -> dict[str, Role]:
    """Read roles from a YAML or JSON file shaped like ``roles/default.yaml``."""
    data = limits.read_config_file(path, limits.MAX_ROLE_FILE_BYTES, "limits.MAX_ROLE_FILE_BYTES", "role file")
    return _parse_roles(data, str(path))


def role_library(role_file: str | Path | None = None) -> dict[str, Role]:
    """The built-in personas, plus (and overridden by) those in ``role_file``."""
    text = resources.files("chateval_dspy.program").joinpath("roles/default.yaml").read_text(encoding="utf-8")
    library = _parse_roles(limits.parse_yaml(text, "built-in roles"), "built-in roles")
    if role_file:
        library.update(load_role_file(role_file))
    return library


def resolve_roles(slugs, fmt: TaskSpec | str, role_file: str | Path | None = None) -> list[Role]:
    """Turn slugs into roles, failing with the list of known slugs (or a role without a persona for the task)."""
    library = role_library(role_file)
    roles = []
    for slug in slugs:
        if SAME_ROLE.match(slug):
            roles.append(Role(slug, f"Referee {SAME_ROLE.match(slug).group(1)}", (("*", SAME_ROLE_PERSONA),)))
        elif slug in library:
            roles.append(library[slug])
        else:
            raise ConfigError(
                f"unknown role {shown(slug, 60)}; choose from: {', '.join(library)} "
                "(or referee_1..referee_N for the same-role ablation)"
            )
    for role in roles:
        role.persona(fmt)  # a custom role without a persona for this format fails here, before any LM call
    return roles


DEFAULT_ORDER = ("general_public", "critic", "news_author", "psychologist", "scientist")


def first_roles(n: int) -> tuple[str, ...]:
    """The first ``n`` personas in the paper's order, for ``--roles N``."""
    if not 1 <= n <= len(DEFAULT_ORDER):
        raise ConfigError(f"--roles takes 1 to {len(DEFAULT_ORDER)} (the built-in personas), got {n}")
    return DEFAULT_ORDER[:n]
