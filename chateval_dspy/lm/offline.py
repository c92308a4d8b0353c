"""Switch off the phone-home lookups of LiteLLM, MLflow, Ray and the HF hub, for a process we own.

The CLI, benchmarks and tests call ``ensure_offline()`` first, before LiteLLM's first import (else it waits seconds
for a cost map from the internet). Importing ``chateval_dspy`` never calls it: these variables change other
libraries' behaviour in the user's process (``HF_HUB_OFFLINE`` stops Hugging Face downloads).
"""

from __future__ import annotations

import os

OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_OFFLINE_MODE": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "true",
    "HF_HUB_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def ensure_offline() -> None:
    """Set every variable of ``OFFLINE_ENV`` that is not set yet: a user's explicit setting wins."""
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
