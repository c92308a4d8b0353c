"""Switch off the phone-home lookups of LiteLLM, MLflow and the HF hub.

Called before dspy/litellm/mlflow are imported (package import, CLI, tests):
without it, importing LiteLLM waits for a cost map from the internet. Uses
``setdefault`` so a user's explicit setting still wins.
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
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
