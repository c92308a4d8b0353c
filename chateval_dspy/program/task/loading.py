"""Where a task spec comes from: the built-in specs (FairEval, Topical-Chat) and task files (YAML/JSON)."""

from __future__ import annotations

from functools import cache
from importlib import resources
from pathlib import Path

import chateval_dspy.limits as limits
from chateval_dspy.errors import ConfigError, shown
from chateval_dspy.program.task.spec import TaskSpec

# The built-in spec of each config format, and the file that holds it.
BUILTIN = {"faireval": "pairwise", "topical_chat": "pointwise"}


def read_task_file(path: str | Path) -> TaskSpec:
    """A task spec from a YAML or JSON file, read within ``limits.MAX_TASK_FILE_BYTES`` and checked."""
    data = limits.read_config_file(path, limits.MAX_TASK_FILE_BYTES, "limits.MAX_TASK_FILE_BYTES", "task file")
    return TaskSpec.from_dict(data, str(path))


@cache
def _builtin(name: str) -> TaskSpec:
    text = resources.files("chateval_dspy.program").joinpath(f"tasks/{name}.yaml").read_text(encoding="utf-8")
    return TaskSpec.from_dict(limits.parse_yaml(text, f"built-in task {name}"), f"built-in task {name}")


def builtin_task(fmt: str) -> TaskSpec:
    """The built-in spec of a config format: ``pairwise`` -> FairEval's, ``pointwise`` -> Topical-Chat's.

    Example:
        >>> builtin_task("pairwise").name, builtin_task("pointwise").output_fields[0]
        ('faireval', 'naturalness')
    """
    for name, key in BUILTIN.items():
        if key == fmt:
            return _builtin(name)
    raise ConfigError(f"unknown format {shown(fmt, 40)}; choose one of: pairwise, pointwise")


def load_task(name_or_path: str | Path | TaskSpec) -> TaskSpec:
    """A built-in spec by name (``faireval``, ``topical_chat``) or a spec file (``.yaml``/``.yml``/``.json``).

    Example:
        >>> load_task("faireval").output_fields
        ('score_1', 'score_2')
    """
    if isinstance(name_or_path, TaskSpec):
        return name_or_path
    if isinstance(name_or_path, str) and name_or_path in BUILTIN:
        return _builtin(name_or_path)
    path = Path(name_or_path)
    if path.suffix.lower() not in (".yaml", ".yml", ".json"):
        raise ConfigError(f"unknown task {str(name_or_path)[:200]!r}: use a built-in task ({', '.join(BUILTIN)}) or "
                          "a .yaml/.json task file")
    return read_task_file(path)


def as_task(task_or_format: TaskSpec | str) -> TaskSpec:
    """A spec as given, or the built-in spec of a format name."""
    return task_or_format if isinstance(task_or_format, TaskSpec) else builtin_task(task_or_format)

