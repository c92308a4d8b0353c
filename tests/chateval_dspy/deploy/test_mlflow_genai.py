"""A judge MLflow understands, against a real tracking server.

A ``mlflow server`` process (sqlite backend, temporary artifact root, loopback, no job runner) is started once
for the module; the LM is the scripted fake behind an OpenAI-compatible URL, called with a planted API key.
``mlflow.genai.evaluate`` with ``chateval_dspy.mlflow_judge`` must give one Feedback per item (or criterion) on
the task's scale with the panel's rationale; each debate must be one trace with the span tree orders x rounds x
referees; and nothing the server stored (its sqlite file and artifact root) may hold the key. The same judge is
checked on the default local store too.
"""

from __future__ import annotations

import contextlib
import json
import shutil

import pytest
from stored_traces import span_tree

import chateval_dspy
from chateval_dspy.config import DebateConfig
from chateval_dspy.data.loaders import load_dataset
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.store import save_program
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.testing.fake_server import FakeOpenAIServer

PLANTED = "sk-planted-GENAI-0123456789abcdef"
MODEL = "openai-compatible/fake-served"
N = 6


@pytest.fixture(scope="module")
def lm_url():
    """The fake LM's URL; every request to it must carry the planted key (so a leak would have had a source)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CHATEVAL_API_KEY", PLANTED)
        with FakeOpenAIServer() as url:
            yield url


@pytest.fixture(scope="module")
def evaluators(tmp_path_factory):
    """Saved evaluators: ``pairwise`` (FairEval's task) and ``pointwise`` (Topical-Chat's four criteria)."""
    root = tmp_path_factory.mktemp("evaluators")
    out = {}
    for name, cfg in (("pairwise", DebateConfig(roles=("critic", "scientist"), turns=2)),
                      ("pointwise", DebateConfig(format="pointwise", roles=("critic", "scientist"), turns=1))):
        program = build_evaluator(cfg)
        out[name] = save_program(program, root / name, make_card(program, model=MODEL))
    return out


@pytest.fixture
def on_server(tracking_server, monkeypatch):
    """MLflow pointed at the tracking server, as a user's ``MLFLOW_TRACKING_URI`` would; restored afterwards."""
    import mlflow

    uri, _ = tracking_server
    previous = mlflow.get_tracking_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    mlflow.set_tracking_uri(uri)
    yield uri
    mlflow.flush_trace_async_logging()
    mlflow.set_tracking_uri(previous)


def pairwise_rows(n: int = N) -> list[dict]:
    """FairEval items as an app's answers judged against references: the question in, ChatGPT's answer out."""
    items, _ = load_dataset("faireval")
    return [{"inputs": {"question": x.question}, "outputs": x.answer_1,
             "expectations": {"expected_response": x.answer_2}} for x in items[:n]]


def pointwise_rows(n: int = N) -> list[dict]:
    items, _ = load_dataset("topical_chat")
    return [{"inputs": {"dialogue_history": x.dialogue_history, "fact": x.fact}, "outputs": x.response}
            for x in items[:n]]


def feedbacks_of(result, name_prefix: str = "chateval") -> list:
    """Every Feedback the evaluation run logged, read back from the store."""
    import mlflow

    mlflow.flush_trace_async_logging()
    traces = mlflow.search_traces(run_id=result.run_id, return_type="list")
    assert len(traces) == N  # one evaluated row each; the debates are not the run's
    return [a for t in traces for a in t.info.assessments if a.name.startswith(name_prefix)]


PREFERENCES = ("answer_1", "answer_2", "tie")


def check_pairwise(result, debates: list | None):
    every = feedbacks_of(result)
    feedbacks = [f for f in every if f.name == "chateval"]
    assert len(feedbacks) == N and {f.name for f in every} == {"chateval", *(f"chateval/preferred/{p}" for p in PREFERENCES)}
    # The shares of items where each answer was preferred, from one boolean per possible preference.
    shares = [result.metrics[f"chateval/preferred/{p}/mean"] for p in PREFERENCES]
    assert sum(shares) == pytest.approx(1.0) and shares == [sum(f.value == p for f in feedbacks) / N for p in PREFERENCES]
    for f in feedbacks:
        assert f.value in PREFERENCES and f.error is None  # a preference, never a bare "1" or "2"
        assert f.rationale.startswith("Panel: ") and "Order 1 (answers as given):\n- Critic " in f.rationale
        assert "Order 2 (answers swapped, answer_2 shown first;" in f.rationale
        assert f.source.source_type == "LLM_JUDGE" and f.source.source_id == f"chateval:{MODEL}"
        referees = json.loads(f.metadata["chateval.referees"])
        assert set(referees) == {"critic", "scientist"} and all(len(v) == 2 for v in referees.values())
        assert f.metadata["chateval.consistent"] in ("true", "false") and int(f.metadata["chateval.calls"]) == 8
    if debates is not None:
        # One trace per judged item: orders x rounds x referees, each linked from its row's feedback.
        assert len(debates) == N
        order = [["round 1", ["critic", "scientist"]], ["round 2", ["critic", "scientist"]]]
        for t in debates:
            name = f"chateval faireval · {t.info.tags['chateval.item_id']}"
            assert span_tree(t) == [[name, [["order 1", order], ["order 2 (answers swapped)", order]]]]
        assert {f.metadata["mlflow.assessment.scorerTraceId"] for f in feedbacks} == {t.info.trace_id for t in debates}
        rows = {f.trace_id for f in feedbacks}
        assert {t.info.tags["chateval.item_id"] for t in debates} == rows


def debate_traces(scorer_name: str = "chateval") -> list:
    import mlflow

    mlflow.flush_trace_async_logging()
    return mlflow.search_traces(filter_string=f"tags.`chateval.scorer` = '{scorer_name}'", return_type="list")


# ---- against the tracking server ---------------------------------------------------------------------------

@pytest.mark.slow
def test_genai_evaluate_gives_one_feedback_per_item_and_one_trace_per_debate(on_server, evaluators, lm_url):
    import mlflow

    mlflow.set_experiment("genai-pairwise")
    with chateval_dspy.load(evaluators["pairwise"], lm=LMSpec(model=lm_url, cache=False)) as judge:
        scorer = chateval_dspy.mlflow_judge(judge, trace=True)
        assert isinstance(scorer, mlflow.genai.judges.base.Judge)
        result = mlflow.genai.evaluate(data=pairwise_rows(), scorers=[scorer])
    check_pairwise(result, debate_traces())
    assert list(result.result_df["chateval/value"].map(lambda v: v in PREFERENCES)) == [True] * N


def test_a_pointwise_judge_gives_one_feedback_per_criterion_on_its_scale(on_server, evaluators, lm_url):
    import mlflow

    mlflow.set_experiment("genai-pointwise")
    with chateval_dspy.load(evaluators["pointwise"], lm=LMSpec(model=lm_url, cache=False)) as judge:
        result = mlflow.genai.evaluate(data=pointwise_rows(), scorers=[chateval_dspy.mlflow_judge(judge)])
        scales = {c.name: c.scale for c in judge.task.criteria}
    feedbacks = feedbacks_of(result)
    assert len(feedbacks) == N * 4
    for f in feedbacks:
        criterion = f.name.removeprefix("chateval/")
        low, high = scales[criterion].low, scales[criterion].high
        assert isinstance(f.value, (int, float)) and low <= f.value <= high, (f.name, f.value)
        assert f.rationale.startswith("Panel: naturalness ") and "Critic: " in f.rationale
    # Numeric values aggregate into run metrics, one per criterion.
    assert {"chateval/naturalness/mean", "chateval/groundedness/mean"} <= set(result.metrics)


@pytest.mark.slow
def test_chateval_evaluate_with_tracing_logs_one_trace_per_item_under_its_run(on_server, lm_url, tmp_path,
                                                                              monkeypatch):
    """What ``chateval evaluate --dataset faireval --limit 3 --trace`` does, through the same calls."""
    import mlflow

    from chateval_dspy.data.spec import DataSpec
    from chateval_dspy.lm.spec import LMSpec
    from chateval_dspy.run.evaluate_dataset import evaluate_dataset
    from optim.tracking import runs as tracking
    from optim.tracking.evaluation import log_evaluation

    monkeypatch.chdir(tmp_path)
    data = DataSpec("faireval", limit=3)
    cfg = DebateConfig(roles=("critic", "scientist"), turns=2)
    items, _ = data.items()
    tracer = tracking.tracer_for(None, items=items, config=lambda fmt: cfg, tags={"chateval.command": "evaluate"})
    assert tracer is not None  # on by default: MLflow is the target and 3 items is a run people read
    done = evaluate_dataset(data, cfg, LMSpec(model=lm_url, cache=False), on_item=tracer.on_item())
    run_id = log_evaluation(done, done.result.metrics(), uri=on_server)
    tracer.link_to_run(run_id)
    traces = mlflow.search_traces(run_id=run_id, return_type="list")
    assert sorted(t.info.tags["chateval.item_id"] for t in traces) == sorted(str(x.id) for x in items)
    order = [["round 1", ["critic", "scientist"]], ["round 2", ["critic", "scientist"]]]
    assert all(span_tree(t) == [[f"chateval faireval · {t.info.tags['chateval.item_id']}",
                                 [["order 1", order], ["order 2 (answers swapped)", order]]]] for t in traces)
    assert tracking.tracer_for(None, items=items * 40, config=cfg) is None  # 120 items: off unless --trace


def human(trace_id: str, name: str, value, who: str) -> None:
    import mlflow
    from mlflow.entities import AssessmentSource, AssessmentSourceType

    mlflow.log_feedback(trace_id=trace_id, name=name, value=value,
                        source=AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id=who))


@pytest.fixture(scope="module")
def reviewed(tracking_server, lm_url, tmp_path_factory):
    """11 FairEval train items judged by ``chateval evaluate --trace`` on the server, then labelled by people in
    MLflow: ann on all, bo agreeing with her on the first two and splitting evenly with her on the last.

    Yields ``(uri, work dir, labels source, traces, the item ids labelled)``."""
    import mlflow

    from optim.cli.main import main

    uri, _ = tracking_server
    work = tmp_path_factory.mktemp("reviewed")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        assert main(["evaluate", "--dataset", "faireval", "--split", "train", "--limit", "11", "--roles", "2",
                     "--turns", "1", "--model", lm_url, "--no-cache", "--trace", "--no-progress"]) == 0
        (results,) = (work / "results").glob("*.jsonl")
        key = json.loads(results.read_text().splitlines()[0])["run_key"]
        mlflow.set_tracking_uri(uri)
        mlflow.flush_trace_async_logging()
        traces = mlflow.search_traces(filter_string=f"tags.`chateval.run_key` = '{key}'", return_type="list")
        assert len(traces) == 11
        truth = {str(x.id): x.label for x in load_dataset("faireval")[0]}
        flipped = {"1": "2", "2": "1", "tie": "1"}
        for i, t in enumerate(traces):
            right = truth[t.info.tags["chateval.item_id"]]
            human(t.info.trace_id, "label", flipped[right], "ann")  # ann first answers wrongly,
            human(t.info.trace_id, "label", right, "ann")  # then corrects it: her latest answer counts
            if i < 2:
                human(t.info.trace_id, "preference", right, "bo")
            elif i == 10:
                human(t.info.trace_id, "label", flipped[right], "bo")  # 1:1 with ann, an even split
        mlflow.flush_trace_async_logging()
        order = [t.info.trace_id for t in traces]  # read again, now with their feedback, in the same order
        fetched = {t.info.trace_id: t for t in mlflow.search_traces(filter_string=f"tags.`chateval.run_key` = '{key}'",
                                                                     return_type="list")}
        traces = [fetched[i] for i in order]
        labelled = {t.info.tags["chateval.item_id"] for t in traces[:10]}
        yield uri, work, f"mlflow:chateval-dspy?filter=tags.`chateval.run_key` = '{key}'", traces, labelled


@pytest.mark.slow
def test_human_feedback_on_traces_becomes_the_labels_of_a_compile_whose_card_lists_them(reviewed, lm_url,
                                                                                         monkeypatch):
    from optim.cli.main import main

    uri, work, source, traces, labelled = reviewed
    monkeypatch.chdir(work)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    out = work / "programs" / "reviewed"
    assert main(["compile", "--labels", source, "--dataset", "faireval", "--limit", "4", "--roles", "2",
                 "--turns", "1", "--model", lm_url, "--no-cache", "--optimizer", "labeled", "--max-demos", "16",
                 "--out", str(out), "--no-progress", "--no-log-model"]) == 0
    card = json.loads((out / "card.json").read_text())
    got = card["labels"]
    assert sorted(got["traces"]) == sorted(t.info.trace_id for t in traces[:10])  # the 11th split evenly
    assert got["items"] == 10 and got["disagreements"] == 1 and got["unlabelled"] == 1
    assert got["sources"] == [{"source": source, "traces": 11, "items": 10, "labels": 14}]
    assert got["reviewers"] == {"ann": 11, "bo": 3} and got["labels"] == got["from_review"] == 14
    assert card["split"]["sizes"]["train"] == 4 + 10  # the dataset's first 4 train items, then the 10 labelled
    assert "people's labels: 10 items" in (out / "card.md").read_text()
    # Every referee learned from the people's labels: its demos include every labelled item, with their label.
    items = {x.question: x for x in load_dataset("faireval")[0]}
    state = json.loads((out / "program.json").read_text())
    judges = [p for name, p in state.items() if name.endswith(".judge")]
    assert len(judges) == 2
    for predictor in judges:
        shown = {str(items[d["question"]].id): d for d in predictor["demos"]}
        assert labelled <= set(shown)
        for item_id in labelled:
            said = shown[item_id]["evidence"]
            right = {"1": "Answer 1 is better.", "2": "Answer 2 is better.", "tie": "equally good"}[
                items[shown[item_id]["question"]].label]
            assert said.startswith("Human referees") and right in said


def test_align_on_the_mlflow_judge_adds_the_labelled_items_as_demos(reviewed, evaluators, lm_url, monkeypatch):
    from chateval_dspy.lm.adapter import DebateAdapter
    from optim.tuning.align import CompileAligner

    uri, _, _, traces, labelled = reviewed
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with chateval_dspy.load(evaluators["pairwise"], lm=LMSpec(model=lm_url, cache=False)) as judge:
        scorer = chateval_dspy.mlflow_judge(judge)
        aligned = scorer.align(traces)
        assert aligned is not scorer and aligned.name == scorer.name
        before = dict(judge.program.named_predictors())
        after = dict(aligned.chateval.program.named_predictors())
        inputs = {"question": "q", "answer_1": "a", "answer_2": "b", "persona": "p", "discussion": "d"}
        for name, predictor in after.items():
            old = DebateAdapter().format(before[name].signature, before[name].demos, inputs)
            new = DebateAdapter().format(predictor.signature, predictor.demos, inputs)
            if name.endswith(".judge"):
                assert len(predictor.demos) == 2 and before[name].demos == [] and new != old, name
            else:  # talk predictors take no labelled demos: their prompts stay the original's
                assert predictor.demos == [] and new == old, name
        assert sorted(aligned.chateval.card["labels"]["traces"]) == sorted(t.info.trace_id for t in traces[:10])
        assert judge.program.named_predictors()[1][1].demos == []  # the original judge is unchanged
        # With an alignment optimizer: chateval compile's optimizers underneath, on the judge's own LM.
        tuned = scorer.align(traces, CompileAligner("bootstrap"))
        assert tuned.chateval.card["labels"]["optimizer"] == "bootstrap"
        assert tuned.chateval.card["labels"]["train"] + tuned.chateval.card["labels"]["dev"] == 10
        verdict = tuned.chateval({"question": "2+2?", "answer_1": "4", "answer_2": "5"})
        assert verdict.winner in ("1", "2", "tie")
        with pytest.raises(chateval_dspy.errors.ConfigError, match="none of the 1 traces"):
            scorer.align([_unlabelled_trace(traces)])


def _unlabelled_trace(traces):
    import copy

    t = copy.deepcopy(traces[0])
    t.info.assessments = []
    return t


def test_nothing_the_tracking_server_stored_holds_the_key(tracking_server, lm_url):
    """Runs after the tests above, which sent the server feedbacks, traces, params and artifacts."""
    import mlflow

    mlflow.flush_trace_async_logging()
    _, root = tracking_server
    stored = [f for f in root.rglob("*") if f.is_file() and f.name != "server.log"]
    assert any(f.name == "server.db" for f in stored) and any("artifacts" in f.parts for f in stored)
    assert [f for f in stored if PLANTED.encode() in f.read_bytes()] == []


# ---- on the default local store, and the judge on its own -------------------------------------------------------

@pytest.mark.slow
def test_on_the_default_local_store_too(evaluators, lm_url, tmp_path, monkeypatch, mlflow_db):
    import mlflow

    from optim.tracking import runs as tracking

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "mlruns").mkdir()
    shutil.copy(mlflow_db, tmp_path / "mlruns" / "mlflow.db")
    previous = mlflow.get_tracking_uri()
    tracking.setup(None)  # sqlite:///mlruns/mlflow.db, artifacts under mlruns/
    try:
        with chateval_dspy.load(evaluators["pairwise"], lm=LMSpec(model=lm_url, cache=False)) as judge:
            result = mlflow.genai.evaluate(data=pairwise_rows(), scorers=[chateval_dspy.mlflow_judge(judge, trace=True)])
        check_pairwise(result, debate_traces())
        stored = [f for f in (tmp_path / "mlruns").rglob("*") if f.is_file()]
        assert [f for f in stored if PLANTED.encode() in f.read_bytes()] == []
    finally:
        mlflow.flush_trace_async_logging()
        mlflow.set_tracking_uri(previous)


def test_the_judge_reads_any_row_shape_and_reports_an_abstention(evaluators, lm_url, monkeypatch):
    import dspy
    from mlflow.entities import Feedback

    import chateval_dspy.lm.resolve
    from chateval_dspy.errors import DataError
    from chateval_dspy.testing.fake_lm import ScriptedEngine

    with chateval_dspy.load(evaluators["pairwise"], lm=LMSpec(model=lm_url, cache=False)) as judge:
        scorer = chateval_dspy.mlflow_judge(judge, name="panel", per_criterion=True,
                                            fields={"answer_2": "expectations.reference"})
        assert "critic, scientist" in scorer.instructions and scorer.timeout == 0
        assert [f.name for f in scorer.get_input_fields()] == ["question", "answer_1", "answer_2"]
        out = scorer(inputs={"question": "2+2?"}, outputs={"answer_1": "4"}, expectations={"reference": "four, surely"})
        assert [f.name for f in out] == ["panel", "panel/score", *(f"panel/preferred/{p}" for p in PREFERENCES)]
        assert all(isinstance(f, Feedback) for f in out)
        assert set(out[1].value) == {"answer_1", "answer_2"} and out[0].value in PREFERENCES
        assert [f.value for f in out[2:]] == [p == out[0].value for p in PREFERENCES]
        with pytest.raises(DataError, match="answer_2.*fields=") as missing:
            chateval_dspy.mlflow_judge(judge)(inputs={"question": "q"}, outputs="only one answer")
        assert "mlflow_judge(judge, fields=" in str(missing.value)

    # A panel whose every verdict fails to parse: a Feedback with an error and the reason, never a made-up value.
    @contextlib.contextmanager
    def garbage(spec, **kwargs):
        yield dspy.LM("fake/garbage", engine=ScriptedEngine(lambda call: "not json"), cache=False, num_retries=0)

    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", garbage)
    with pytest.warns(UserWarning, match="now runs on fake/garbage"), \
            chateval_dspy.load(evaluators["pairwise"], lm=LMSpec(model="garbage")) as judge:
        feedback, *preferred = chateval_dspy.mlflow_judge(judge)(inputs={"question": "q", "answer_1": "a",
                                                                         "answer_2": "b"})
    assert feedback.value is None and feedback.error.error_code == "CHATEVAL_ABSTAINED"
    assert "parse_failure" in feedback.error.error_message and feedback.rationale.startswith("Panel: no verdict")
    assert [f.value for f in preferred] == [False] * 3  # no preference: none preferred, none a made-up share
