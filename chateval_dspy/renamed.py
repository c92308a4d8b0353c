"""Old spellings, still read, each with a deprecation note: a format's old name and functions' old names.

One concept has one name (the README's "Names"). An older spelling is accepted where it is input (a config, a
task file, a role file, a CLI flag, a saved judge, a results file) and warns ``DeprecationWarning`` when used;
nothing writes it any more.

Example:
    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as said:
    ...     warnings.simplefilter("always")
    ...     canonical_format("scoring"), canonical_format("pairwise")
    ('pointwise', 'pairwise')
    >>> [str(w.message) for w in said]
    ["format 'scoring' is renamed 'pointwise'; the old name will be removed"]
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

# Old format name -> the one name. "scoring" was DebateConfig's word for what task files call "pointwise".
FORMAT_ALIASES = {"scoring": "pointwise"}


def canonical_format(fmt, where: str = "format", stacklevel: int = 3):
    """``fmt`` under its one name (anything that is no old name comes back as it is, to be checked by the caller)."""
    if isinstance(fmt, str) and fmt in FORMAT_ALIASES:
        new = FORMAT_ALIASES[fmt]
        warnings.warn(f"{where} {fmt!r} is renamed {new!r}; the old name will be removed", DeprecationWarning,
                      stacklevel=stacklevel)
        return new
    return fmt


def old_names(module: str, renamed: dict[str, str], namespace: dict) -> Callable[[str], object]:
    """A module ``__getattr__`` (PEP 562) that serves each old name in ``renamed`` (old -> new) with a warning.

    Example:
        >>> __getattr__ = old_names("m", {"old": "new"}, {"new": 42})
        >>> with warnings.catch_warnings(record=True) as said:
        ...     warnings.simplefilter("always")
        ...     __getattr__("old"), str(said[0].message)
        (42, 'm.old is renamed m.new; the old name will be removed')
    """
    def __getattr__(name: str):
        if name in renamed:
            warnings.warn(f"{module}.{name} is renamed {module}.{renamed[name]}; the old name will be removed",
                          DeprecationWarning, stacklevel=2)
            return namespace[renamed[name]]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return __getattr__
