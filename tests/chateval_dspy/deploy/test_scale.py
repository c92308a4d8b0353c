"""Scale out (issue #4): a saved evaluator loaded against a shared OpenAI-compatible LM server, and as an MLflow model."""

from __future__ import annotations

import dspy
import pandas as pd
import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.store import save_program
from chateval_dspy.lm.resolve import resolve_lm
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.testing.fake_server import FakeOpenAIServer

ITEMS = [{"id": f"i{i}", "question": f"q{i}", "answer_1": "a" * (5 + 15 * i), "answer_2": "b" * (40 - 10 * i)}
         for i in range(4)]


@pytest.fixture
def saved(tmp_path):
    program = build_evaluator(DebateConfig(roles=("critic",), turns=1))
    return save_program(program, tmp_path / "prog", make_card(program, model="openai-compatible/fake-served"))


def test_a_base_url_selects_an_openai_compatible_server(saved):
    from chateval_dspy.deploy.saved.judge import load

    with FakeOpenAIServer() as url, load(saved, lm=LMSpec(model=url)) as judge:
        verdicts = [judge(x) for x in ITEMS]
        assert judge.lm.model == "openai-compatible/fake-served"  # discovered from /v1/models
    # answer lengths decide the fake's scores: i0 and i1 favour answer 2, i2 and i3 answer 1
    assert [v.winner for v in verdicts] == ["2", "2", "1", "1"]


def test_resolve_lm_reports_a_dead_endpoint_clearly():
    from chateval_dspy.errors import FatalLMError

    with pytest.raises(FatalLMError, match="cannot reach the LM server at http://127.0.0.1:9/v1"):
        with resolve_lm("http://127.0.0.1:9/v1"):
            pass


# Ray Data and Spark scoring (lazy ``judge_dataset``, resumable ``score_dataset``/``score_spark``, Ray's knobs and
# no deprecated arguments) are tested on real clusters in tests/chateval_dspy/deploy/test_resumable_scoring.py.


def test_dspy_context_is_untouched_by_loading(saved):
    # load() binds its LM to the evaluator, never to DSPy's global settings
    from chateval_dspy.deploy.saved.judge import load

    with FakeOpenAIServer() as url, load(saved, lm=LMSpec(model=url)):
        assert dspy.settings.lm is None


@pytest.mark.slow  # over a few seconds
def test_mlflow_pyfunc_model_judges_without_pickle(saved, tmp_path, monkeypatch):
    import mlflow

    from chateval_dspy.deploy.saved.verdicts import VERDICT_COLUMNS
    from optim.tracking import runs as tracking
    from optim.tracking.models import log_pyfunc_model

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with FakeOpenAIServer() as url:
        monkeypatch.setenv("CHATEVAL_MODEL", url)
        monkeypatch.delenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", raising=False)
        with tracking.run("t", params={}):
            info = log_pyfunc_model(saved)
        model = mlflow.pyfunc.load_model(info.model_uri)
        out = model.predict(pd.DataFrame(ITEMS))
    assert list(out["winner"]) == list(out["verdict"]) == ["2", "2", "1", "1"]
    assert list(out.columns[:len(VERDICT_COLUMNS)]) == [name for name, _ in VERDICT_COLUMNS]  # the verdict first
    assert out["scores"].map(type).eq(str).all()  # nested columns arrive as JSON text
