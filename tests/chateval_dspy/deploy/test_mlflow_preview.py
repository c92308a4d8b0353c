"""What MLflow shows of a ChatEval judge: preferences that read as preferences, run metrics for
them, rationales per answer order, traces named by task and item, and verdicts first in a trace's preview.

Everything runs ``mlflow.genai.evaluate`` for real on a local sqlite store in ``tmp_path`` (copied from the
migrated template), with the scripted fake LM behind an OpenAI-compatible URL. The fake LM scores an answer by its
length, so each row's preference is known: the longer answer wins, equal lengths tie.
"""

from __future__ import annotations

import json
import shutil

import pytest

import chateval_dspy
from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.store import save_program
from chateval_dspy.errors import DataError
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.task import TaskSpec
from chateval_dspy.run import tracing
from chateval_dspy.testing.fake_server import FakeOpenAIServer
from optim.review import sources

MODEL = "openai-compatible/fake-served"
LONG, SHORT, SAME = "A long and careful answer, with reasons.", "Short.", "Same length."
PREFERENCES = ("answer_1", "answer_2", "tie")
# A pairwise task of one's own: its responses are named, and its preferences say those names.
DRAFTS = TaskSpec.from_dict({
    "name": "drafts", "format": "pairwise",
    "inputs": [{"name": "brief"}, {"name": "draft", "judged": True}, {"name": "rewrite", "judged": True}],
    "criteria": [{"name": "quality", "description": "how well {response} meets the brief", "scale": "1-10"}]})


@pytest.fixture(scope="module")
def lm_url():
    with FakeOpenAIServer() as url:
        yield url


@pytest.fixture(scope="module")
def evaluators(tmp_path_factory):
    """Saved one-referee, one-round panels: the built-in pairwise task, and ``DRAFTS``."""
    root = tmp_path_factory.mktemp("evaluators")
    out = {}
    for name, cfg in (("pairwise", DebateConfig(roles=("critic",), turns=1)),
                      ("drafts", DebateConfig(task=DRAFTS, roles=("critic",), turns=1))):
        program = build_evaluator(cfg)
        out[name] = save_program(program, root / name, make_card(program, model=MODEL))
    return out


@pytest.fixture
def store(tmp_path, monkeypatch, mlflow_db):
    """MLflow on a fresh sqlite store in ``tmp_path``; the previous tracking URI is restored afterwards."""
    import mlflow

    shutil.copy(mlflow_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    previous = mlflow.get_tracking_uri()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment("preview")
    yield mlflow
    mlflow.flush_trace_async_logging()
    mlflow.set_tracking_uri(previous)


def rows() -> list[dict]:
    """The app's answer (``answer_1``) against a reference (``answer_2``), with expected preferences in every spelling
    a row may use (one row states none)."""
    def row(q, answer, reference, **expected):
        return {"inputs": {"question": q}, "outputs": answer, "expectations": {"expected_response": reference, **expected}}

    return [row("q1", LONG, SHORT, label="1"),  # answer_1 preferred: agrees
            row("q2", SHORT, LONG, label="answer_1"),  # answer_2 preferred: disagrees
            row("q3", SAME, SAME, preference="tie"),  # a tie: agrees
            row("q4", LONG, SHORT, preference=1),  # a number, as JSON rows give it: agrees
            row("q5", LONG, SHORT)]  # no expected preference: no agreement feedback


def in_row_order(df):
    """The result rows in the order of ``rows()`` (q1..q5): MLflow judges rows at once, so times may interleave."""
    import json

    inputs = df["inputs"] if "inputs" in df else df["request"]
    question = inputs.map(lambda v: (v if isinstance(v, dict) else json.loads(v))["question"])
    return df.assign(_question=question).sort_values("_question")


@pytest.mark.slow  # over a few seconds
def test_a_pairwise_judge_reports_preferences_their_shares_and_agreement(store, evaluators, lm_url):
    mlflow = store
    with chateval_dspy.load(evaluators["pairwise"], lm=LMSpec(model=lm_url, cache=False)) as judge:
        scorer = chateval_dspy.mlflow_judge(judge, trace=True)
        assert str(scorer.feedback_value_type) == "typing.Literal['answer_1', 'answer_2', 'tie']"
        result = mlflow.genai.evaluate(data=rows(), scorers=[scorer])
    df = in_row_order(result.result_df)
    assert list(df["chateval/value"]) == ["answer_1", "answer_2", "tie", "answer_1", "answer_1"]
    assert list(df["chateval/agreement/value"].iloc[:4]) == [True, False, True, True]
    assert result.metrics["chateval/preferred/answer_1/mean"] == pytest.approx(3 / 5)
    assert result.metrics["chateval/preferred/answer_2/mean"] == pytest.approx(1 / 5)
    assert result.metrics["chateval/preferred/tie/mean"] == pytest.approx(1 / 5)
    assert result.metrics["chateval/agreement/mean"] == pytest.approx(3 / 4)  # over the rows that state one
    assert not any(k.startswith("chateval/mean") for k in result.metrics)  # the category itself is not averaged

    # The main feedback is the first assessment of its row, and its rationale walks both answer orders.
    mlflow.flush_trace_async_logging()
    first = mlflow.get_trace(df["trace_id"].iloc[1]).info.assessments[0]
    assert first.name == "chateval" and first.value == "answer_2"
    lines = first.rationale.splitlines()
    assert lines[0].startswith("Panel: prefers answer_2 (answer_1 1, answer_2 5); both answer orders agree; confidence 0.")
    assert lines[1] == "Order 1 (answers as given):"
    assert lines[2].startswith("- Critic prefers answer_2 (answer_1 1, answer_2 5): ")
    assert lines[3] == "Order 2 (answers swapped, answer_2 shown first; votes and scores name the answers as given):"
    assert lines[4].startswith("- Critic prefers answer_2 (answer_1 1, answer_2 5): ")
    agreement = mlflow.get_trace(df["trace_id"].iloc[1]).info.assessments[4]
    assert agreement.name == "chateval/agreement" and agreement.value is False
    assert agreement.rationale == "The panel prefers answer_2; expected: answer_1."


def test_debate_traces_are_named_by_task_and_item_and_preview_the_verdict_first(store, evaluators, lm_url):
    mlflow = store
    with chateval_dspy.load(evaluators["pairwise"], lm=LMSpec(model=lm_url, cache=False)) as judge:
        result = mlflow.genai.evaluate(data=rows()[:3], scorers=[chateval_dspy.mlflow_judge(judge, trace=True)])
    mlflow.flush_trace_async_logging()
    said = dict(zip(result.result_df["trace_id"], result.result_df["chateval/value"]))
    debates = mlflow.search_traces(filter_string="tags.`chateval.scorer` = 'chateval'", return_type="list")
    assert len(debates) == 3
    for t in debates:
        row = t.info.tags["chateval.item_id"]
        assert t.info.tags["mlflow.traceName"] == f"chateval faireval · {row}"  # the trace list's name column
        preview = json.loads(t.data.response)
        assert t.data.response.startswith('{"verdict": ') and preview["verdict"] == said[row]
        assert {"winner", "consistent", "abstained", "order_preferences", "score_1", "score_2"} <= set(preview)
        # Readers find the debate by its attribute, not its name, and read the same verdict back.
        record = sources.record_from_trace(t)
        assert record["id"] == row and tracing.preference_name(record["prediction"], judge.task) == said[row]
        assert len(record["referees"]["critic"]) == 2


def test_old_traces_whose_root_is_named_chateval_still_read(store):
    """A trace written before roots carried task and item (name ``chateval``, the verdict last in its outputs)."""
    mlflow = store
    record = {"id": "old-1", "format": "pairwise", "prediction": "2", "consistent": True, "abstained": None,
              "order_preferences": ["2", "2"], "score_1": 3.0, "score_2": 8.0,
              "referees": {"critic": [{"score_1": 3, "score_2": 8}, {"score_1": 3, "score_2": 8}]},
              "transcripts": [[{"round": 1, "speaker": "critic", "name": "Critic", "text": "2", "kind": "verdict"}]] * 2,
              "calls": 2, "prompt_tokens": 10, "completion_tokens": 2, "seconds": 0.1}
    tree = tracing.debate_tree(record, {"question": "q", "answer_1": "a", "answer_2": "bb"})
    tree["name"] = "chateval"
    tree["outputs"] = {"abstained": None, "winner": "2", "consistent": True, "order_preferences": ["2", "2"],
                       "score_1": 3.0, "score_2": 8.0}
    trace_id = tracing.emit(tree, tags={"chateval.item_id": "old-1"})
    mlflow.flush_trace_async_logging()
    old = mlflow.get_trace(trace_id)
    assert tracing.debate_span(old).name == "chateval"
    back = sources.record_from_trace(old)
    assert (back["id"], back["prediction"], back["score_2"]) == ("old-1", "2", 8.0)
    assert back["referees"]["critic"] == record["referees"]["critic"]


def test_a_custom_task_names_its_preferences_after_its_responses(store, evaluators, lm_url):
    mlflow = store
    data = [{"inputs": {"brief": "b1", "draft": LONG}, "outputs": {"rewrite": SHORT}, "expectations": {"label": "draft"}},
            {"inputs": {"brief": "b2", "draft": SHORT}, "outputs": {"rewrite": LONG}, "expectations": {"label": "draft"}}]
    with chateval_dspy.load(evaluators["drafts"], lm=LMSpec(model=lm_url, cache=False)) as judge:
        scorer = chateval_dspy.mlflow_judge(judge)
        result = mlflow.genai.evaluate(data=data, scorers=[scorer])
        with pytest.raises(DataError, match="expected preference must be draft, rewrite or tie"):
            scorer(inputs={"brief": "b", "draft": "x", "rewrite": "y"}, expectations={"label": "maybe"})
    assert sorted(result.result_df["chateval/value"]) == ["draft", "rewrite"]
    assert result.metrics["chateval/preferred/draft/mean"] == pytest.approx(0.5)
    assert result.metrics["chateval/preferred/rewrite/mean"] == pytest.approx(0.5)
    assert result.metrics["chateval/preferred/tie/mean"] == 0 and result.metrics["chateval/agreement/mean"] == 0.5


@pytest.mark.slow
def test_align_still_learns_from_people_labelling_the_named_debates(store, evaluators, lm_url):
    """People label the debate traces (``label``, in the judge's own words too); ``align`` learns from them."""
    from mlflow.entities import AssessmentSource, AssessmentSourceType

    mlflow = store
    with chateval_dspy.load(evaluators["pairwise"], lm=LMSpec(model=lm_url, cache=False)) as judge:
        scorer = chateval_dspy.mlflow_judge(judge, trace=True)
        mlflow.genai.evaluate(data=rows()[:2], scorers=[scorer])
        mlflow.flush_trace_async_logging()
        debates = mlflow.search_traces(filter_string="tags.`chateval.scorer` = 'chateval'", return_type="list")
        for t, value in zip(debates, ("answer_2", "1")):
            mlflow.log_feedback(trace_id=t.info.trace_id, name="label", value=value,
                                source=AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id="ann"))
        mlflow.flush_trace_async_logging()
        labelled = [mlflow.get_trace(t.info.trace_id) for t in debates]
        aligned = scorer.align(labelled)
    assert sorted(aligned.chateval.card["labels"]["traces"]) == sorted(t.info.trace_id for t in debates)
    demos = [d for name, p in aligned.chateval.program.named_predictors() if name.endswith(".judge") for d in p.demos]
    assert len(demos) == 2
