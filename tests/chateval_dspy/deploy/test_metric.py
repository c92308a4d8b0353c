"""A tuned evaluator as another program's DSPy metric: ``as_metric`` values for pairwise and
pointwise judges, abstentions, the cache, and the metric driving ``dspy.Evaluate`` and ``BootstrapFewShot``.

One scripted engine answers both the student program (``question -> answer``) and the judge's referees, so every
outcome is known in advance: a referee scores an answer by the quality word it carries (GOOD 9, OK 5, BAD 2), and
an answer holding JUNK makes every verdict unparseable (the panel abstains).
"""

from __future__ import annotations

import contextlib
import logging
from types import SimpleNamespace

import dspy
import pytest

import chateval_dspy as ce
import chateval_dspy.lm.resolve
from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.judge import Verdict
from chateval_dspy.deploy.saved.store import save_program
from chateval_dspy.deploy.serving.as_metric import MetricScale, as_metric, pointwise_value, scales_of
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.testing.fake_lm import ScriptedEngine, default_responder

QUALITY = {"GOOD": 9, "OK": 5, "BAD": 2}
# What the student answers to each question (the fake LM's "other" calls), and so how it fares against "OK ref".
STUDENT = {"q-good": "GOOD answer", "q-ok": "OK answer", "q-bad": "BAD answer", "q-junk": "JUNK answer"}
RATINGS = {"naturalness": 3, "coherence": 1, "engagingness": 2, "groundedness": 1}  # on 1-3, 1-3, 1-3, 0-1


def quality(text: str) -> int:
    return next((score for word, score in QUALITY.items() if word in text), 5)


def responder(call):
    if call.kind == "other":  # the student program
        return {"answer": STUDENT.get(call.inputs.get("question"), "OK answer")}
    if call.kind == "verdict" and "score_1" in call.outputs:
        a1, a2 = call.inputs["answer_1"], call.inputs["answer_2"]
        if "JUNK" in a1 + a2:
            return "no JSON here"  # fails to parse on every retry: the referee abstains
        return {"evidence": f"{a1[:10]} vs {a2[:10]}", "score_1": quality(a1), "score_2": quality(a2)}
    if call.kind == "verdict":
        return {"evidence": "rated", **RATINGS}
    return default_responder(call)


def first_slot_wins(call):
    """A referee with pure position bias: answer 1 always wins."""
    if call.kind == "verdict":
        return {"evidence": "first is best", "score_1": 8, "score_2": 3}
    return default_responder(call)


@pytest.fixture
def engine(monkeypatch):
    """One scripted engine behind every LM that load() builds (and the student's, in the tests that want it)."""
    shared = ScriptedEngine(responder)

    @contextlib.contextmanager
    def fake_resolve(spec, **kwargs):
        yield dspy.LM("fake/judge", engine=shared, cache=False, num_retries=0)

    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", fake_resolve)
    return shared


def judge_calls(engine) -> int:
    return sum(c.kind in ("argument", "verdict", "summary") for c in engine.calls)


@pytest.fixture
def saved(tmp_path):
    def save(**config):
        program = build_evaluator(DebateConfig(roles=("critic", "scientist"), turns=1, **config))
        return save_program(program, tmp_path / "_".join(f"{k}-{v}" for k, v in config.items()),
                            make_card(program, model="fake/judge"))
    return save


PAIRWISE = {"question": "example.question", "answer_1": "prediction.answer"}
POINTWISE = {"dialogue_history": "example.history", "fact": "example.fact", "response": "prediction.reply"}


def qa(question: str, answer: str = "OK ref") -> dspy.Example:
    return dspy.Example(question=question, answer=answer).with_inputs("question")


# ---------------------------------------------------------------- pairwise


def test_pairwise_win_tie_loss_against_the_reference(saved, engine):
    with ce.load(saved(), lm=LMSpec(cache=False)) as judge:
        metric = as_metric(judge, inputs=PAIRWISE, reference="example.answer")
        gold = qa("Which?")
        assert metric(gold, dspy.Prediction(answer="GOOD answer")) == 1.0
        assert metric(gold, dspy.Prediction(answer="OK answer")) == 0.5
        assert metric(gold, dspy.Prediction(answer="BAD answer")) == 0.0
    # The program's answer is answer_1 and the reference answer_2 in the order the judge was given (the swapped
    # order runs at the same time, so either may have called first).
    pair = [(c.inputs["answer_1"], c.inputs["answer_2"]) for c in engine.calls[:4]]
    assert ("GOOD answer", "OK ref") in pair and set(pair) <= {("GOOD answer", "OK ref"), ("OK ref", "GOOD answer")}
    # A calibrated judge pools both orders itself: one judge call (2 referees x 1 turn x 2 orders) per pair.
    assert metric.judged == 3 and judge_calls(engine) == 3 * 4


def test_with_a_trace_the_metric_is_a_pass_by_its_threshold(saved, engine):
    with ce.load(saved(), lm=LMSpec(cache=False)) as judge:
        gold = qa("Which?")
        lenient = as_metric(judge, inputs=PAIRWISE, reference="example.answer")  # 0.5: a tie with the reference passes
        strict = as_metric(judge, inputs=PAIRWISE, reference="example.answer", threshold=1.0)
        tie, win = dspy.Prediction(answer="OK answer"), dspy.Prediction(answer="GOOD answer")
        assert lenient(gold, tie, trace=[]) is True and lenient(gold, dspy.Prediction(answer="BAD"), trace=[]) is False
        assert strict(gold, tie, trace=[]) is False and strict(gold, win, trace=[]) is True


def test_an_uncalibrated_judge_is_asked_in_both_orders_by_the_metric(saved, engine):
    engine.responder = first_slot_wins
    with ce.load(saved(calibrate=False), lm=LMSpec(cache=False)) as judge:
        metric = as_metric(judge, inputs=PAIRWISE, reference="example.answer")
        result = metric.result(qa("Which?"), dspy.Prediction(answer="mine"))
    # Pure position bias wins one order and loses the other: the average says "as good as the reference".
    assert result.value == 0.5 and [v.winner for v in result.verdicts] == ["1", "1"]
    assert metric.judged == 2
    orders = [(c.inputs["answer_1"], c.inputs["answer_2"]) for c in engine.calls if c.kind == "verdict"]
    assert orders == [("mine", "OK ref")] * 2 + [("OK ref", "mine")] * 2


def test_an_abstention_scores_zero_is_logged_and_counted(saved, engine, caplog):
    with ce.load(saved(), lm=LMSpec(cache=False)) as judge:
        metric = as_metric(judge, inputs=PAIRWISE, reference="example.answer")
        with caplog.at_level(logging.WARNING, logger="chateval_dspy.deploy.serving.as_metric"):
            result = metric.result(qa("Which?"), dspy.Prediction(answer="JUNK answer"))
            assert metric(qa("Which?"), dspy.Prediction(answer="JUNK answer"), trace=[]) is False
        before = len(engine.calls)
        blank = metric.result(qa("Which?"), dspy.Prediction(answer="  "))
    assert result.value == 0.0 and result.abstained.startswith("parse_failure") and result.verdicts[0].winner is None
    assert "no verdict" in caplog.text and "JUNK answer" in caplog.text
    # A blank answer is a failed answer: scored 0 without paying the panel.
    assert blank.value == 0.0 and blank.abstained == "blank:answer_1" and len(engine.calls) == before
    assert metric.abstentions == {result.abstained: 2, "blank:answer_1": 1}


def test_verdicts_are_cached_per_judged_item(saved, engine):
    with ce.load(saved(), lm=LMSpec(cache=False)) as judge:
        metric = as_metric(judge, inputs=PAIRWISE, reference="example.answer")
        uncached = as_metric(judge, inputs=PAIRWISE, reference="example.answer", cache_size=0)
        for _ in range(2):
            assert metric(qa("Which?"), dspy.Prediction(answer="GOOD answer")) == 1.0
        paid = judge_calls(engine)
        assert metric(qa("Which?", answer="BAD ref"), dspy.Prediction(answer="GOOD answer")) == 1.0  # a new pair
        for _ in range(2):
            uncached(qa("Which?"), dspy.Prediction(answer="GOOD answer"))
    assert paid == 4 and metric.judged == 2 and metric.cache_hits == 1
    assert uncached.judged == 2 and uncached.cache_hits == 0


def test_the_panel_leaves_no_steps_in_the_trace_being_bootstrapped(saved, engine):
    with ce.load(saved(), lm=LMSpec(cache=False)) as judge, dspy.context(trace=[]):
        metric = as_metric(judge, inputs=PAIRWISE, reference="example.answer")
        assert metric(qa("Which?"), dspy.Prediction(answer="GOOD answer"), trace=dspy.settings.trace) is True
        assert dspy.settings.trace == []  # else BootstrapFewShot would look for demos of the judge's predictors


def test_gepa_feedback_call_gets_the_score_and_the_referees_evidence(saved, engine):
    with ce.load(saved(), lm=LMSpec(cache=False)) as judge:
        metric = as_metric(judge, inputs=PAIRWISE, reference="example.answer")
        out = metric(qa("Which?"), dspy.Prediction(answer="GOOD answer"), [], "self", [])
    assert out.score == 1.0 and "critic" in out.feedback and "GOOD answe vs OK ref" in out.feedback


# ---------------------------------------------------------------- pointwise


def chat(response: str = "I love that movie too") -> tuple[dspy.Example, dspy.Prediction]:
    example = dspy.Example(history="A: seen any films?", fact="Alien is from 1979").with_inputs("history", "fact")
    return example, dspy.Prediction(reply=response)


def test_pointwise_averages_the_criteria_on_their_scales(saved, engine):
    example, prediction = chat()
    with ce.load(saved(format="pointwise"), lm=LMSpec(cache=False)) as judge:
        every = as_metric(judge, inputs=POINTWISE)
        two = as_metric(judge, inputs=POINTWISE, criteria=("coherence", "engagingness"))
        wider = as_metric(judge, inputs=POINTWISE, scales={"naturalness": (1, 5)})
        values = every(example, prediction), two(example, prediction), wider(example, prediction)
    # naturalness 3 of 1-3 -> 1, coherence 1 -> 0, engagingness 2 -> 0.5, groundedness 1 of 0-1 -> 1
    assert values == ((1 + 0 + 0.5 + 1) / 4, (0 + 0.5) / 2, (0.5 + 0 + 0.5 + 1) / 4)
    assert next(c for c in engine.calls if c.kind == "verdict").inputs["response"] == "I love that movie too"


def test_label_scales_count_their_good_labels(saved, engine):
    example, prediction = chat()
    with ce.load(saved(format="pointwise"), lm=LMSpec(cache=False)) as judge:
        with pytest.raises(ConfigError, match=r"label criteria \['groundedness'\] need their good label"):
            as_metric(judge, inputs=POINTWISE, scales={"groundedness": ["0", "1"]})
        yes = as_metric(judge, inputs=POINTWISE, criteria=("groundedness",), scales={"groundedness": ["0", "1"]},
                        good={"groundedness": "1"})
        no = as_metric(judge, inputs=POINTWISE, criteria=("groundedness",), scales={"groundedness": ["0", "1"]},
                       good={"groundedness": ["0"]})
        assert yes(example, prediction) == 1.0 and no(example, prediction) == 0.0
    labels = MetricScale(labels=("poor", "fair", "good"), good=frozenset({"fair", "good"}))
    assert pointwise_value({"style": "fair", "tone": "poor", "len": 2}, {"style": labels, "tone": labels,
                                                                          "len": MetricScale(low=0, high=4)}) == 0.5


def test_a_callable_maps_the_fields(saved, engine):
    example, prediction = chat()
    with ce.load(saved(format="pointwise"), lm=LMSpec(cache=False)) as judge:
        metric = as_metric(judge, inputs=lambda ex, pred: {"dialogue_history": ex.history, "fact": ex.fact,
                                                           "response": pred.reply.upper()})
        assert metric(example, prediction) == 0.625
    assert next(c for c in engine.calls if c.kind == "verdict").inputs["response"] == "I LOVE THAT MOVIE TOO"


def test_mistakes_are_config_errors_naming_the_fix(saved, engine):
    with ce.load(saved(), lm=LMSpec(cache=False)) as judge:
        with pytest.raises(ConfigError, match="pass reference="):
            as_metric(judge, inputs=PAIRWISE)
        with pytest.raises(ConfigError, match="must name 'answer_1'"):
            as_metric(judge, inputs={"question": "example.question"}, reference="example.answer")
        with pytest.raises(ConfigError, match="'example.<field>' or 'prediction.<field>'"):
            as_metric(judge, inputs={"question": "question", "answer_1": "prediction.answer"}, reference="example.answer")
        with pytest.raises(ConfigError, match="threshold"):
            as_metric(judge, inputs=PAIRWISE, reference="example.answer", threshold=2)
        typo = as_metric(judge, inputs={"question": "example.question", "answer_1": "prediction.answr"},
                         reference="example.answer")
        with pytest.raises(ConfigError, match=r"prediction\.answr not found .* it has answer"):
            typo(qa("Which?"), dspy.Prediction(answer="GOOD"))
    with ce.load(saved(format="pointwise"), lm=LMSpec(cache=False)) as judge:
        with pytest.raises(ConfigError, match="reference= is for pairwise"):
            as_metric(judge, inputs=POINTWISE, reference="example.answer")
        with pytest.raises(ConfigError, match=r"criteria \['fluency'\] have no known scale"):
            as_metric(judge, inputs=POINTWISE, criteria=("fluency",))
        missing = as_metric(judge, inputs={"dialogue_history": "example.history", "fact": "example.fact"})
        with pytest.raises(ConfigError, match="not a valid pointwise item .*response"):
            missing(*chat())
    assert judge_calls(engine) == 0


# ---------------------------------------------------------------- a declared task, read generically


class StubJudge:
    """A judge of a declared task, as the metric sees it: a format, a config with a task spec, and verdicts."""

    def __init__(self, fmt, task_spec, winner_of=None, scores=None, calibrate=True):
        self.format, self.program = fmt, SimpleNamespace(named_predictors=lambda: [])
        self.config = SimpleNamespace(task_spec=task_spec, calibrate=calibrate)
        self.program.config = self.config
        self.winner_of, self.scores, self.items = winner_of, scores, []

    def __call__(self, item, **kwargs):
        self.items.append(item)
        pairwise = self.format == "pairwise"
        return Verdict(id=item["id"], format=self.format, winner=self.winner_of(item) if pairwise else None,
                       scores=None if pairwise else self.scores, rationales={}, referees={}, consistent=None,
                       abstained=None, calls=1, prompt_tokens=0, completion_tokens=0, seconds=0.0)


def test_a_declared_pairwise_task_names_its_own_response_fields():
    task = SimpleNamespace(responses=("draft_a", "draft_b"), criteria=())
    judge = StubJudge("pairwise", task, winner_of=lambda item: "1" if item["draft_a"] == "mine" else "2",
                      calibrate=False)
    with pytest.raises(ConfigError, match="must name 'draft_a'"):
        as_metric(judge, inputs={"topic": "example.topic", "answer_1": "prediction.text"}, reference="example.text")
    metric = as_metric(judge, inputs={"topic": "example.topic", "draft_a": "prediction.text"}, reference="example.text")
    # The stub always prefers the program's text, in either slot: a win both ways.
    assert metric(dspy.Example(topic="t", text="theirs"), dspy.Prediction(text="mine")) == 1.0
    assert [(i["draft_a"], i["draft_b"]) for i in judge.items] == [("mine", "theirs"), ("theirs", "mine")]


def test_a_declared_pointwise_task_gives_the_criteria_and_scales():
    task = SimpleNamespace(judged=("answer",), criteria=(
        SimpleNamespace(name="faithful", scale=SimpleNamespace(low=None, high=None, labels=("pass", "fail"))),
        SimpleNamespace(name="relevance", scale=SimpleNamespace(low=1, high=5, labels=()))))
    judge = StubJudge("pointwise", task, scores={"faithful": "pass", "relevance": 4})
    assert scales_of(judge.program) == {"faithful": MetricScale(labels=("pass", "fail")),
                                        "relevance": MetricScale(low=1, high=5)}
    with pytest.raises(ConfigError, match=r"label criteria \['faithful'\] need their good label"):
        as_metric(judge, inputs={"question": "example.question", "answer": "prediction.answer"})
    metric = as_metric(judge, inputs={"question": "example.question", "answer": "example.answer"},
                       good={"faithful": "pass"})
    assert metric(dspy.Example(question="q", answer="a"), dspy.Prediction()) == (1 + 0.75) / 2
    # The task's judged input is checked for text even when it does not come from the prediction.
    assert metric.result(dspy.Example(question="q", answer=" "), dspy.Prediction()).abstained == "blank:answer"


# ---------------------------------------------------------------- driving DSPy


def student_lm(engine) -> dspy.LM:
    return dspy.LM("fake/student", engine=engine, cache=False, num_retries=0)


def test_dspy_evaluate_scores_a_program_with_the_judge(saved, engine):
    devset = [qa("q-good"), qa("q-ok"), qa("q-bad")]
    with ce.load(saved(), lm=LMSpec(cache=False)) as judge, dspy.context(lm=student_lm(engine), adapter=dspy.JSONAdapter()):
        metric = as_metric(judge, inputs=PAIRWISE, reference="example.answer")
        evaluate = dspy.Evaluate(devset=devset, metric=metric, num_threads=2, display_progress=False)
        result = evaluate(dspy.Predict("question -> answer"))
        paid = judge_calls(engine)
        again = evaluate(dspy.Predict("question -> answer"))
    assert result.score == 50.0  # win, tie, loss
    assert [(ex.question, pred.answer, score) for ex, pred, score in result.results] == [
        ("q-good", "GOOD answer", 1.0), ("q-ok", "OK answer", 0.5), ("q-bad", "BAD answer", 0.0)]
    # A second evaluation of the same answers is answered from the metric's cache.
    assert again.score == 50.0 and judge_calls(engine) == paid == 3 * 4 and metric.cache_hits == 3


def test_bootstrap_few_shot_keeps_only_demos_the_judge_passes(saved, engine):
    trainset = [qa("q-good"), qa("q-bad"), qa("q-ok"), qa("q-junk")]
    with ce.load(saved(), lm=LMSpec(cache=False)) as judge, dspy.context(lm=student_lm(engine), adapter=dspy.JSONAdapter()):
        metric = as_metric(judge, inputs=PAIRWISE, reference="example.answer")
        lenient = dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=4, max_labeled_demos=0)
        kept = lenient.compile(dspy.Predict("question -> answer"), trainset=trainset).demos
        strict_metric = as_metric(judge, inputs=PAIRWISE, reference="example.answer", threshold=1.0)
        strict = dspy.BootstrapFewShot(metric=strict_metric, max_bootstrapped_demos=4, max_labeled_demos=0)
        only_wins = strict.compile(dspy.Predict("question -> answer"), trainset=trainset).demos
    # Win (1) and tie (0.5) pass the default threshold; the loss and the abstention (0) do not.
    assert [(d.question, d.answer) for d in kept] == [("q-good", "GOOD answer"), ("q-ok", "OK answer")]
    assert all(d.augmented for d in kept)  # bootstrapped from the student's own trace, not copied from the labels
    assert [d.question for d in only_wins] == ["q-good"]
    assert sum(metric.abstentions.values()) == 1


def test_evaluate_then_bootstrap_pays_the_panel_once_per_pair(saved, engine):
    trainset = [qa("q-good"), qa("q-bad")]
    with ce.load(saved(), lm=LMSpec(cache=False)) as judge, dspy.context(lm=student_lm(engine), adapter=dspy.JSONAdapter()):
        metric = ce.as_metric(judge, inputs=PAIRWISE, reference="example.answer")
        dspy.Evaluate(devset=trainset, metric=metric, display_progress=False)(dspy.Predict("question -> answer"))
        paid = judge_calls(engine)
        compiled = dspy.BootstrapFewShot(metric=metric, max_bootstrapped_demos=2, max_labeled_demos=0).compile(
            dspy.Predict("question -> answer"), trainset=trainset)
    assert [d.question for d in compiled.demos] == ["q-good"]
    assert judge_calls(engine) == paid and metric.judged == 2 and metric.cache_hits == 2
