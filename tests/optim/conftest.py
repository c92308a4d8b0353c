"""The scripted three-referee panel behind every model (test_ablate, test_run_lifecycle)."""

from __future__ import annotations

import contextlib

import dspy
import pytest
from ablation_panel import DATA, PANEL, panel_script

import chateval_dspy.lm.resolve
from chateval_dspy.testing.fake_lm import ScriptedEngine


@pytest.fixture
def scripted(monkeypatch):
    """resolve_lm hands out one LM over a ScriptedEngine whose responder the test sets (``scripted.responder``)."""
    engine = ScriptedEngine()

    @contextlib.contextmanager
    def resolve(spec="embedded", **kwargs):
        yield dspy.LM("fake/scripted", engine=engine, cache=False, num_retries=0)

    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
    engine.responder = panel_script(DATA, PANEL)
    return engine
