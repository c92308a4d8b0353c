"""Secret scrubbing: the credential values that no trace, MLflow param, tag, artifact or assessment may hold.

The values (``secret_values``) are those of environment variables named like a key or token, the key in the file
that ``CHATEVAL_API_KEY_FILE`` names, and values a command registers (``chateval serve``'s token). Traces, the
MLflow judge's feedback and ``chateval serve`` replace them with ``[REDACTED]`` (``scrub``); MLflow tracking refuses
a text that holds one (``optim.tracking.runs.assert_no_secrets``).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

REDACTED = "[REDACTED]"
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)", re.I)
_MIN_SECRET_CHARS = 8
_registered: set[str] = set()


def register_secret(value: str | None) -> None:
    """Treat ``value`` as a secret from now on (a token read from a variable of any name)."""
    if value and len(value) >= _MIN_SECRET_CHARS:
        _registered.add(value)


def forget_secret(value: str) -> None:
    """Stop treating ``value`` as a secret (a token revoked, or a test's own value cleaned up)."""
    _registered.discard(value)


def secret_values() -> list[str]:
    """Every value no trace, param, tag or artifact may hold (see the module docstring); longest first, so a key
    inside another is not left half-masked.

    Example:
        >>> os.environ["DOCTEST_API_KEY"] = "sk-doctest-123456"
        >>> "sk-doctest-123456" in secret_values()
        True
        >>> del os.environ["DOCTEST_API_KEY"]
    """
    found = {v for k, v in os.environ.items() if _SECRET_NAME.search(k)} | _registered
    key_file = os.environ.get("CHATEVAL_API_KEY_FILE")
    if key_file:
        with contextlib.suppress(OSError):  # a key this process cannot read, it cannot leak either
            found.add(Path(key_file).read_text(encoding="utf-8").strip())
    return sorted((v for v in found if len(v) >= _MIN_SECRET_CHARS), key=len, reverse=True)


def scrub(value, secrets: Iterable[str] | None = None):
    """``value`` (texts, and dicts and lists of them) with every secret replaced by ``[REDACTED]``; ``secrets``
    defaults to ``secret_values()`` read now (a caller scrubbing many values reads them once and passes them).

    Example:
        >>> scrub({"said": "my key is sk-12345678", "n": [1, "sk-12345678"]}, secrets=["sk-12345678"])
        {'said': 'my key is [REDACTED]', 'n': [1, '[REDACTED]']}
    """
    secrets = secret_values() if secrets is None else secrets if isinstance(secrets, list) else list(secrets)
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, Mapping) and secrets:
        return {scrub(k, secrets) if isinstance(k, str) else k: scrub(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)) and secrets:
        return [scrub(v, secrets) for v in value]
    return value
