"""A package's public names imported on first use (PEP 562), so importing the package costs nothing.

``import chateval_dspy`` must not pay for DSPy, LiteLLM or pandas, and the ``chateval`` parser must not
either: each package ``__init__`` names where its exports live and imports a module only when one of its
names is first read.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def exports(package: str, where: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` for ``package``, whose name ``n`` lives in module ``where[n]``.

    A name is looked up once and then kept in the package's namespace, as an eager import would keep it.

    Example:
        >>> import types
        >>> pkg = sys.modules["lazy_demo"] = types.ModuleType("lazy_demo")
        >>> pkg.__getattr__, pkg.__dir__ = exports("lazy_demo", {"dedent": "textwrap"})
        >>> pkg.dedent("  x")
        'x'
        >>> "dedent" in vars(pkg), "dedent" in dir(pkg)
        (True, True)
        >>> pkg.nothing
        Traceback (most recent call last):
        ...
        AttributeError: module 'lazy_demo' has no attribute 'nothing'
        >>> del sys.modules["lazy_demo"]
    """

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        vars(sys.modules[package])[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__
