"""Production (issue #4): load with one call, typed verdicts, batch, safe loading, HTTP API (files: test_score_file.py)."""

from __future__ import annotations

import contextlib
import json
import threading

import dspy
import httpx
import pandas as pd
import pytest
from local_http import uvicorn_thread

from chateval_dspy.deploy.saved.judge import Verdict, load
from chateval_dspy.deploy.saved.store import CARD_FILE
from chateval_dspy.errors import ConfigError, DataError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.testing.fake_lm import ScriptedEngine

ITEM = {"id": "a", "question": "Which?", "answer_1": "short", "answer_2": "a considerably longer answer"}


def test_load_gives_the_same_verdicts_as_the_program_in_memory(saved, engine):
    program, path = saved
    with dspy.context(lm=dspy.LM("fake/x", engine=ScriptedEngine(), cache=False), adapter=DebateAdapter()):
        expected = program(**{k: v for k, v in ITEM.items() if k != "id"})
    with load(path) as judge:
        verdict = judge(ITEM)
    assert isinstance(verdict, Verdict)
    assert verdict.id == "a" and verdict.format == "pairwise"
    assert verdict.winner == expected.preference == "2"
    assert verdict.scores == {"answer_1": expected.score_1, "answer_2": expected.score_2}
    assert verdict.referees == expected.referees
    assert set(verdict.rationales) == {"critic", "scientist"} and all(len(r) == 2 for r in verdict.rationales.values())
    assert verdict.consistent is True and verdict.calls == 8 and verdict.prompt_tokens > 0


def test_a_judge_also_takes_the_tasks_fields_as_keyword_arguments(saved, engine):
    _, path = saved
    with load(path) as judge:
        by_dict = judge(ITEM)
        by_keywords = judge(id="a", question=ITEM["question"], answer_1=ITEM["answer_1"], answer_2=ITEM["answer_2"])
        unnamed = judge(question=ITEM["question"], answer_1=ITEM["answer_1"], answer_2=ITEM["answer_2"])
    same = ("id", "winner", "scores", "criteria", "referees", "rationales", "consistent", "calls", "prompt_tokens")
    assert {k: getattr(by_keywords, k) for k in same} == {k: getattr(by_dict, k) for k in same}
    assert unnamed.winner == by_dict.winner and unnamed.scores == by_dict.scores


@pytest.mark.parametrize(("args", "kwargs", "needles"), [
    ((ITEM,), {"question": "q"}, ["not both", "'question'"]),
    ((), {}, ["give the item", "question, answer_1, answer_2"]),
    ((), {"question": "q", "answer_1": "a", "answer_2": "b", "answer_3": "c"}, ["'answer_3'", "not inputs"]),
    ((), {"question": "q", "answer_1": "a"}, ["missing field(s) 'answer_2'"]),
])
def test_a_keyword_call_names_the_field_it_cannot_use(saved, engine, args, kwargs, needles):
    _, path = saved
    with load(path) as judge, pytest.raises(TypeError) as err:
        judge(*args, **kwargs)
    assert all(needle in str(err.value) for needle in needles), str(err.value)
    assert engine.calls == []


def test_keyword_fields_are_checked_as_a_dicts_are(saved, engine):
    _, path = saved
    with load(path) as judge, pytest.raises(DataError, match="field 'question': field is empty"):
        judge(question=" ", answer_1="a", answer_2="b")


def test_the_lm_is_chosen_at_load_time_and_a_different_model_warns(saved, engine):
    _, path = saved
    with pytest.warns(UserWarning, match="compiled for fake/card-model and now runs on fake/other"):
        with load(path, lm=LMSpec(model="other")) as judge:
            assert judge.lm.model == "fake/other"


def test_card_from_an_incompatible_version_is_an_error_naming_the_version(saved, engine):
    _, path = saved
    card = json.loads((path / CARD_FILE).read_text())
    card["versions"]["chateval-dspy"] = "9.1.0"
    (path / CARD_FILE).write_text(json.dumps(card))
    with pytest.raises(ConfigError, match=r"chateval-dspy==9\.1\.0"):
        load(path)


def test_a_pickled_program_is_refused_unless_trusted(saved, engine, tmp_path):
    program, _ = saved
    pickled = tmp_path / "pickled"
    program.save(str(pickled), save_program=True)
    with pytest.raises(ConfigError, match="trust_pickle=True"):
        load(pickled, lm=LMSpec(model="x"))
    assert engine.calls == []
    with load(pickled, lm=LMSpec(model="x"), trust_pickle=True) as judge:
        assert judge(ITEM).winner == "2"


def test_evaluate_batch_keeps_order_and_reports_bad_rows(saved, engine):
    _, path = saved
    # An empty question is a malformed row (an empty answer is data since it is judged).
    frame = pd.DataFrame([ITEM, {**ITEM, "id": "b", "question": ""}, {**ITEM, "id": "c", "answer_1": "a long one here"}])
    with load(path) as judge:
        out = judge.evaluate_batch(frame, concurrency=3)
    assert list(out["id"]) == ["a", "b", "c"]
    assert out.loc[1, "error"] and "question" in out.loc[1, "error"] and "row 2" in out.loc[1, "error"]
    assert out.loc[0, "winner"] == "2" and pd.isna(out.loc[0, "error"])


# ---------------------------------------------------------------- HTTP API


@contextlib.contextmanager
def serving(judge, **kwargs):
    from chateval_dspy.deploy.serving.http import create_app

    with uvicorn_thread(create_app(judge, **kwargs), log_level="error") as port:
        yield f"http://127.0.0.1:{port}"


def test_http_api_validates_and_judges(saved, engine):
    _, path = saved
    with load(path) as judge, serving(judge, token="s3cret", max_body_bytes=5000, max_items=3) as url:
        auth = {"Authorization": "Bearer s3cret"}
        assert httpx.get(f"{url}/health").json()["status"] == "ok"
        assert httpx.get(f"{url}/card").status_code == 401
        assert httpx.get(f"{url}/card", headers=auth).json()["model"] == "fake/card-model"
        assert httpx.post(f"{url}/evaluate", json=ITEM).status_code == 401
        assert httpx.post(f"{url}/evaluate", json=ITEM, headers={"Authorization": "Bearer wrong"}).status_code == 401
        one = httpx.post(f"{url}/evaluate", json=ITEM, headers=auth, timeout=30)
        assert one.status_code == 200 and one.json()["winner"] == "2" and one.json()["id"] == "a"
        many = httpx.post(f"{url}/evaluate", json=[ITEM, {**ITEM, "id": "b"}], headers=auth, timeout=30)
        assert [v["id"] for v in many.json()] == ["a", "b"]
        bad = httpx.post(f"{url}/evaluate", content=b"{not json", headers=auth)
        assert bad.status_code == 400 and "JSON" in bad.json()["error"]
        missing = httpx.post(f"{url}/evaluate", json={"question": "q", "answer_1": "a"}, headers=auth)
        assert missing.status_code == 422 and "answer_2" in missing.json()["error"]
        assert httpx.post(f"{url}/evaluate", json=[1, 2], headers=auth).status_code == 422
        big = httpx.post(f"{url}/evaluate", json={**ITEM, "answer_1": "x" * 6000}, headers=auth)
        assert big.status_code == 413
        assert httpx.post(f"{url}/evaluate", json=[ITEM] * 4, headers=auth).status_code == 413


def test_http_api_sheds_load_past_its_queue(saved, engine):
    _, path = saved
    engine.latency = 0.05  # 8 calls -> ~0.4 s per request
    with load(path) as judge, serving(judge, queue=1) as url:
        results = []

        def post():
            results.append(httpx.post(f"{url}/evaluate", json=ITEM, timeout=30).status_code)

        threads = [threading.Thread(target=post) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert httpx.get(f"{url}/health").status_code == 200  # still up
    assert sorted(results).count(200) >= 1 and 503 in results


def test_load_from_an_mlflow_run_and_a_registered_model(saved, engine, tmp_path, monkeypatch):
    import mlflow

    from optim.tracking import runs as tracking
    from optim.tracking.models import log_dspy_model

    program, path = saved
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with tracking.run("compile", params={"x": 1}) as active:
        tracking.log_file(path, "evaluator")
        info = log_dspy_model(program)
    mlflow.register_model(info.model_uri, "toy-judge")  # a dspy model registered by hand (compile registers the pyfunc)
    with load(f"runs:/{active.info.run_id}") as judge:
        assert judge(ITEM).winner == "2"
    with load("models:/toy-judge/1") as judge:  # the registered model's run holds the JSON evaluator
        assert judge.card["model"] == "fake/card-model" and judge(ITEM).winner == "2"
    with pytest.raises(ConfigError, match="no saved evaluator"):
        with mlflow.start_run() as empty:
            pass
        load(f"runs:/{empty.info.run_id}")


@pytest.mark.slow
def test_pyfunc_latest_and_aliases_load_the_json_evaluator_and_lookups_fail_clearly(saved, engine, tmp_path,
                                                                                            monkeypatch):
    import re

    import mlflow

    from optim.tracking import runs as tracking
    from optim.tracking.models import log_pyfunc_model

    _, path = saved
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_PICKLE_DESERIALIZATION", raising=False)
    with tracking.run("compile", params={"x": 1}) as active:  # no 'evaluator/' artifact: only the pyfunc holds it
        info = log_pyfunc_model(path, registered_name="toy-pyfunc")
    mlflow.MlflowClient().set_registered_model_alias("toy-pyfunc", "champion", "1")
    # The pyfunc is logged as code; its artifacts hold the JSON evaluator, read without trust_pickle.
    for uri in (f"runs:/{active.info.run_id}/pyfunc", "models:/toy-pyfunc/latest", "models:/toy-pyfunc/1",
                "models:/toy-pyfunc@champion", info.model_uri):
        with load(uri) as judge:
            assert judge.card["model"] == "fake/card-model" and judge(ITEM).winner == "2", uri
    for uri in ("models:/no-such-judge/1", "models:/no-such-judge/latest", "models:/toy-pyfunc/7",
                "models:/toy-pyfunc@nobody", "models:/toy-pyfunc/Production", "runs:/0123456789abcdef0123/pyfunc"):
        with pytest.raises(ConfigError, match=re.escape(uri)):
            load(uri)
