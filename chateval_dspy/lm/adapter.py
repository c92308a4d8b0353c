"""The adapter every judge call goes through: DSPy's JSONAdapter, with its per-signature work done once.

DSPy's JSONAdapter rebuilds a pydantic model and its JSON schema (the response format) and re-renders
the system message (field descriptions and structure) on every call, although both depend only on the
signature. A debate makes many calls with a handful of signatures, so that rebuilding was about half
of the framework's own time per LM call (see BENCHMARKS.md, "overhead"). This subclass memoises
both per signature class and instructions; the prompts and schemas are byte-for-byte DSPy's.

Optimizers create new signature classes as they rewrite instructions; the memo holds them weakly,
so a long compile does not keep every candidate alive.
"""

from __future__ import annotations

import threading
import weakref

import dspy

_ABSENT = object()


class JudgeAdapter(dspy.JSONAdapter):
    """``dspy.JSONAdapter`` that builds each signature's response format and system message once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def _remember(self, signature, key, build):
        # Instructions are part of the key because a signature class's docstring can be reassigned in place.
        key = (key, signature.instructions)
        with self._lock:
            per_signature = self._memo.setdefault(signature, {})
            value = per_signature.get(key, _ABSENT)
        if value is _ABSENT:
            value = build()  # outside the lock: two threads may both build once, harmlessly
            with self._lock:
                per_signature[key] = value
        return value

    def _prepare_response_format(self, lm, lm_kwargs, signature):
        # The choice depends on the LM's capabilities too, so they are part of the key.
        key = ("response_format", "response_format" in lm.supported_params, bool(lm.supports_response_schema))

        def build():
            probe: dict = {}
            super(JudgeAdapter, self)._prepare_response_format(lm, probe, signature)
            return probe.get("response_format", _ABSENT)

        fmt = self._remember(signature, key, build)
        if fmt is not _ABSENT:
            lm_kwargs["response_format"] = fmt

    def format_system_message(self, signature) -> str:
        return self._remember(signature, "system", lambda: super(JudgeAdapter, self).format_system_message(signature))
