"""Run identity: what makes two runs the same run (``run_key``), the LM identities it hashes, and ``digest``.

A results file resumes only under the same key; every results line carries it (``records``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable


def run_key(config, lm: dict, items: Iterable, program_state: dict | None = None,
            calibration: dict | None = None) -> str:
    """What makes two runs the same run: the panel's config, the LM's identity, the exact items (ids, inputs and
    labels) and, when given, the program's tuned state and its calibration (``Calibration.to_dict()``).

    Only config fields off their defaults count, and None leaves the state and calibration out, so new fields and
    uncalibrated runs keep the keys they always had.

    Example:
        >>> from chateval_dspy.config import DebateConfig
        >>> a = run_key(DebateConfig(), {"model": "m"}, [])
        >>> a == run_key(DebateConfig(turns=3), {"model": "m"}, []), len(a)
        (False, 12)
    """
    from chateval_dspy.data.splits import dataset_hash

    key = {"config": config.changes(), **lm, "items": dataset_hash(items)}
    if program_state is not None:
        key["program"] = digest(program_state)
    if calibration is not None:
        key["calibration"] = digest(calibration)
    return digest(key)


def digest(parts) -> str:
    """A short stable hash of JSON-able ``parts`` (the run key's, and the benchmarks' own keys)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


# Sampling settings change the answers; transport settings (keys, URLs, timeouts, retries) do not, and a
# credential must not feed a hash that is written into every results line.
SAMPLING_KWARGS = ("temperature", "max_tokens", "max_completion_tokens", "top_p", "top_k", "n", "stop", "seed",
                   "frequency_penalty", "presence_penalty", "logit_bias", "reasoning_effort", "response_format")


def lm_identity(lm) -> dict:
    """The part of a ``dspy.LM`` that decides its answers: the model and its sampling settings.

    Example:
        >>> import dspy
        >>> lm_identity(dspy.LM("openai/m", temperature=0.5, max_tokens=64, api_key="sk-x"))
        {'model': 'openai/m', 'temperature': 0.5, 'max_tokens': 64}
    """
    if lm is None:
        return {"model": None}
    kwargs = getattr(lm, "kwargs", None) or {}
    return {"model": getattr(lm, "model", repr(lm)), **{k: kwargs[k] for k in SAMPLING_KWARGS if k in kwargs}}


def context_identity() -> dict:
    """The identity of the LMs in the current DSPy context: the main LM's (``lm_identity``), plus a mixed panel's
    referee LMs by role slug when any are bound (so a single-model run's key is what it always was).

    Example:
        >>> import dspy
        >>> from chateval_dspy.lm.bound import binding
        >>> with dspy.context(lm=dspy.LM("openai/a")), binding({"critic": dspy.LM("openai/b")}):
        ...     context_identity()["referees"]["critic"]["model"]
        'openai/b'
    """
    import dspy

    from chateval_dspy.lm.bound import referee_lms

    out = lm_identity(dspy.settings.lm)
    referees = referee_lms()
    if referees:
        out["referees"] = {slug: lm_identity(lm) for slug, lm in sorted(referees.items())}
    return out
