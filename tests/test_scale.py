"""Scale out (issue #4): Ray Data workers load the saved evaluator and share an OpenAI-compatible LM server."""

from __future__ import annotations

import dspy
import pandas as pd
import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.store import make_card, save_program
from chateval_dspy.lm.resolve import resolve_lm
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.testing.fake_server import FakeOpenAIServer

ITEMS = [{"id": f"i{i}", "question": f"q{i}", "answer_1": "a" * (5 + 15 * i), "answer_2": "b" * (40 - 10 * i)}
         for i in range(4)]


@pytest.fixture
def saved(tmp_path):
    program = build_evaluator(DebateConfig(roles=("critic",), turns=1))
    return save_program(program, tmp_path / "prog", make_card(program, model="openai-compatible/fake-served"))


def test_a_base_url_selects_an_openai_compatible_server(saved):
    from chateval_dspy.deploy.judge import load

    with FakeOpenAIServer() as url, load(saved, model=url) as judge:
        verdicts = [judge(x) for x in ITEMS]
        assert judge.lm.model == "openai-compatible/fake-served"  # discovered from /v1/models
    # answer lengths decide the fake's scores: i0 and i1 favour answer 2, i2 and i3 answer 1
    assert [v.winner for v in verdicts] == ["2", "2", "1", "1"]


def test_resolve_lm_reports_a_dead_endpoint_clearly():
    from chateval_dspy.errors import LMError

    with pytest.raises(LMError, match="cannot reach the LM server at http://127.0.0.1:9/v1"):
        with resolve_lm("http://127.0.0.1:9/v1"):
            pass


def test_ray_data_workers_judge_a_dataset(saved, tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    from chateval_dspy.deploy.ray import judge_dataset

    monkeypatch.setenv("CHATEVAL_CACHE_DIR", str(tmp_path / "cache"))  # workers inherit it: no stale answers
    with FakeOpenAIServer() as url:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
        try:
            ds = ray.data.from_pandas(pd.DataFrame(ITEMS))
            out = judge_dataset(ds, str(saved), model=url, actors=1, batch_size=2).to_pandas()
        finally:
            ray.shutdown()
    out = out.sort_values("id").reset_index(drop=True)
    assert list(out["id"]) == ["i0", "i1", "i2", "i3"]
    assert list(out["winner"]) == ["2", "2", "1", "1"]
    assert out["error"].isna().all()


def test_dspy_context_is_untouched_by_loading(saved):
    # load() binds its LM to the evaluator, never to DSPy's global settings
    from chateval_dspy.deploy.judge import load

    with FakeOpenAIServer() as url, load(saved, model=url):
        assert dspy.settings.lm is None


def test_mlflow_pyfunc_model_judges_without_pickle(saved, tmp_path, monkeypatch):
    import mlflow

    from optim import tracking

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with FakeOpenAIServer() as url:
        monkeypatch.setenv("CHATEVAL_MODEL", url)
        monkeypatch.delenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", raising=False)
        with tracking.run("t", params={}):
            info = tracking.log_pyfunc_model(saved)
        model = mlflow.pyfunc.load_model(info.model_uri)
        out = model.predict(pd.DataFrame(ITEMS))
    assert list(out["winner"]) == ["2", "2", "1", "1"]
    assert out["scores"].map(type).eq(str).all()  # nested columns arrive as JSON text
