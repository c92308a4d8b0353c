"""An MLflow store on local sqlite in a fresh working directory (test_labels, test_label_integrity)."""

from __future__ import annotations

import pytest


@pytest.fixture
def store(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("review")
    yield mlflow
    mlflow.flush_trace_async_logging()
