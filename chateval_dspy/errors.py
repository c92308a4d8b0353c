"""Errors sorted by who can fix them and when: ``ConfigError`` (flags, a roles file or a config), ``DataError`` (an
input file; it names file, row and field), ``FatalLMError`` (point at a working model). Other LM faults inside a
debate (DSPy's ``LMError`` family) are not raised: they become recorded abstentions (``debate.py``).
"""

from __future__ import annotations

import reprlib


class ChatEvalError(Exception):
    """Base class for every error chateval-dspy raises on purpose."""


class ConfigError(ChatEvalError, ValueError):
    """A flag, option, role file or configuration value is wrong."""


class DataError(ChatEvalError, ValueError):
    """An input item is malformed: ``message`` says what and how to fix it; the 1-based ``row``, ``source`` file and
    ``field`` are named where known.

    Example:
        >>> str(DataError("field is empty", source="a.jsonl", row=3, field="answer_2"))
        "a.jsonl row 3: field 'answer_2': field is empty"
    """

    def __init__(self, message: str, *, source: str | None = None, row: int | None = None, field: str | None = None):
        self.source, self.row, self.field, self.reason = source, row, field, message
        where = " ".join(p for p in (source, f"row {row}" if row is not None else None) if p)
        prefix = ": ".join(p for p in (where, f"field '{field}'" if field else None) if p)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class FatalLMError(ChatEvalError, RuntimeError):
    """The language model could not be started or reached, and the run stops.

    Not a DSPy ``LMError`` (one failed call, recorded as an abstention): this ends the run (a model that never
    started, an open breaker, a batch API answering nonsense). Inside DSPy's wrapping find it with ``cause_of``.

    Example:
        >>> issubclass(FatalLMError, ChatEvalError), issubclass(FatalLMError, RuntimeError)
        (True, True)
    """


class BudgetExceeded(FatalLMError):  # noqa: N818 - named after what happened, like the gateway's own error
    """A gateway (the LiteLLM proxy) refuses calls because its budget is spent: the run stops, its results kept,
    and the same command resumes it once the budget is raised or its window resets."""


class SecretError(ChatEvalError, RuntimeError):
    """A credential's value was about to reach a log, a file or MLflow; nothing was written."""


def cause_of(exc: BaseException | None, kind: type[BaseException]) -> BaseException | None:
    """The first exception of ``kind`` in ``exc``'s chain of causes (DSPy wraps engine errors in its own), or None.

    Example:
        >>> try:
        ...     try:
        ...         raise FatalLMError("server died")
        ...     except FatalLMError as inner:
        ...         raise RuntimeError("wrapped") from inner
        ... except RuntimeError as outer:
        ...     print(cause_of(outer, FatalLMError))
        server died
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, kind):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def shown(value, limit: int = 60) -> str:
    """``value`` as an error message shows it: its repr, at most ``limit`` characters, built without ever rendering
    more (``f"{value!r:.60}"`` renders the whole value first: a YAML alias bomb's gigabytes).

    Example:
        >>> shown("x" * 10_000, 12)
        "'xxx...xxxx'"
        >>> bomb = ["lol"] * 9
        >>> for _ in range(9):
        ...     bomb = [bomb] * 9  # 9**10 strings if rendered whole
        >>> len(shown(bomb, 60)) <= 60
        True
        >>> shown(3.0), shown(None)
        ('3.0', 'None')
    """
    cut = reprlib.Repr()  # keyword arguments only from Python 3.12
    cut.maxlevel = 3
    cut.maxtuple = cut.maxlist = cut.maxarray = cut.maxdict = cut.maxset = cut.maxfrozenset = cut.maxdeque = 6
    cut.maxstring = cut.maxlong = cut.maxother = limit
    return cut.repr(value)[:limit]
