"""Compiling against human labels (issue #3): DSPy optimizers make a measurable difference on a toy task."""

from __future__ import annotations

import dspy
import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.demos import label_demo
from chateval_dspy.run.metrics import accuracy
from chateval_dspy.testing.fake_lm import Call, fake_lm
from optim.tuning.compile import OPTIMIZERS, OptimizerSettings, compile_evaluator, optimizer_progress
from optim.tuning.objectives import agreement, balanced, make_metric, score_error


def _item(i: int, good_first: bool, easy: bool) -> dspy.Example:
    good, bad = f"correct answer {i}", f"wrong answer {i}"
    mark = "obviously " if easy else ""
    a1, a2 = (mark + good, bad) if good_first else (bad, mark + good)
    return dspy.Example(id=str(i), question=f"q{i}", answer_1=a1, answer_2=a2,
                        label="1" if good_first else "2").with_inputs("question", "answer_1", "answer_2")


def toy_judge(call: Call) -> dict:
    """Right when shown demonstrations or when the good answer is marked 'obviously'; else position-biased."""
    if call.kind == "argument":
        return {"argument": "ok"}
    if call.kind != "verdict":
        return {name: "text" for name in call.outputs}
    a1, a2 = call.inputs["answer_1"], call.inputs["answer_2"]
    if call.n_messages > 1 or "obviously" in a1 + a2:
        first_good = "correct" in a1
        return {"evidence": "content", "score_1": 9 if first_good else 2, "score_2": 2 if first_good else 9}
    return {"evidence": "position", "score_1": 9, "score_2": 2}


def _accuracy(program, items) -> float:
    return accuracy([x.label for x in items], [program(**x.inputs()).preference for x in items])


@pytest.fixture
def toy():
    train = [_item(i, i % 2 == 0, easy=True) for i in range(6)]
    test = [_item(i, i % 2 == 0, easy=False) for i in range(10, 16)]
    return train, test


@pytest.mark.parametrize("optimizer", ["labeled", "bootstrap"])
def test_compiling_improves_agreement_where_demos_matter(toy, optimizer):
    train, test = toy
    cfg = DebateConfig(roles=("critic", "scientist"), turns=1)
    student = build_evaluator(cfg)
    with dspy.context(lm=fake_lm(toy_judge), adapter=DebateAdapter()):
        before = _accuracy(student, test)
        compiled = compile_evaluator(student, optimizer=optimizer, trainset=train, valset=train[:2], metric=agreement,
                                     settings=OptimizerSettings(max_demos=2))
        after = _accuracy(compiled, test)
    assert before == 0.0  # position bias + calibration = ties on every hard item
    assert after == 1.0
    # every role's judge got its own demonstrations; the student is untouched
    judges = {n: p for n, p in compiled.named_predictors() if n.endswith(".judge")}
    assert len(judges) == 2 and all(len(p.demos) == 2 for p in judges.values())
    assert all(len(p.demos) == 0 for _, p in student.named_predictors())


def test_bootstrap_tunes_argument_predictors_too(toy):
    train, _ = toy
    cfg = DebateConfig(roles=("critic", "scientist"), turns=2)
    with dspy.context(lm=fake_lm(toy_judge), adapter=DebateAdapter()):
        compiled = compile_evaluator(build_evaluator(cfg), optimizer="bootstrap", trainset=train, valset=None,
                                     metric=agreement, settings=OptimizerSettings(max_demos=1))
    demos = {n: len(p.demos) for n, p in compiled.named_predictors()}
    assert demos == {"debate.referees['critic'].argue": 1, "debate.referees['critic'].judge": 1,
                     "debate.referees['scientist'].argue": 1, "debate.referees['scientist'].judge": 1}


@pytest.mark.parametrize("optimizer", ["bootstrap_rs", "mipro", "simba"])
def test_other_optimizers_run_on_every_role(toy, optimizer):
    train, test = toy
    cfg = DebateConfig(roles=("critic", "scientist"), turns=1)
    with dspy.context(lm=fake_lm(toy_judge), adapter=DebateAdapter()):
        compiled = compile_evaluator(build_evaluator(cfg), optimizer=optimizer, trainset=train + test[:4],
                                     valset=test[4:], metric=agreement,
                                     settings=OptimizerSettings(max_demos=1, candidates=2))
    assert {n for n, _ in compiled.named_predictors()} >= {"debate.referees['critic'].judge",
                                                          "debate.referees['scientist'].judge"}
    progress = optimizer_progress(compiled)  # what `chateval compile` logs to MLflow as optimizer.dev_score
    assert progress and all(0.0 <= score <= 100.0 for _, score in progress)


def test_unknown_optimizer_and_empty_train_are_config_errors(toy):
    student = build_evaluator(DebateConfig(roles=("critic",), turns=1))
    with pytest.raises(ConfigError, match="choose one of: " + ", ".join(OPTIMIZERS)):
        compile_evaluator(student, optimizer="adam", trainset=toy[0], valset=None, metric=agreement)
    with pytest.raises(ConfigError, match="non-empty train"):
        compile_evaluator(student, optimizer="bootstrap", trainset=[], valset=None, metric=agreement)


def test_label_demo_writes_the_human_label_as_a_verdict():
    ex = _item(1, good_first=False, easy=False)
    demo = label_demo(ex, "pairwise", "a critic")
    assert (demo.score_1, demo.score_2, demo.persona) == (4, 8, "a critic")
    scoring = dspy.Example(dialogue_history="h", fact="f", response="r",
                           human={"naturalness": 2.6, "coherence": 1.2, "engagingness": 3.0, "groundedness": 0.4})
    d = label_demo(scoring, "pointwise", "p")
    assert (d.naturalness, d.coherence, d.engagingness, d.groundedness) == (3, 1, 3, 0)


def test_metrics_for_optimizers():
    ex = _item(1, True, False)
    assert agreement(ex, dspy.Prediction(preference="1")) == 1.0
    assert agreement(ex, dspy.Prediction(preference=None)) == 0.0
    train = [dspy.Example(label=lab) for lab in ["1", "1", "1", "2"]]
    weighted = balanced(train)
    # rare labels weigh more: 4/(2*1) for "2", 4/(2*3) for "1"
    assert weighted(dspy.Example(label="2"), dspy.Prediction(preference="2")) == pytest.approx(2.0)
    assert weighted(dspy.Example(label="1"), dspy.Prediction(preference="1")) == pytest.approx(2 / 3)
    human = {"naturalness": 3.0, "coherence": 1.0, "engagingness": 2.0, "groundedness": 1.0}
    pred = dspy.Prediction(abstained=None, naturalness=2.0, coherence=1.0, engagingness=2.0, groundedness=0.0)
    # errors scaled by range: 1/2, 0, 0, 1 -> mean 0.375
    assert score_error(dspy.Example(human=human), pred) == pytest.approx(0.625)
    with pytest.raises(ConfigError, match="does not apply"):
        make_metric("score_error", "pairwise", train)


@pytest.mark.slow
def test_an_interrupted_compile_resumes_without_judging_finished_items_again(tmp_path, monkeypatch):
    """Issue #6: rerunning the same compile command after a crash finishes the job."""
    import contextlib

    import chateval_dspy.lm.resolve as lm_module
    import optim.tuning.compile as compile_module
    from optim.cli.main import main

    monkeypatch.chdir(tmp_path)
    lms = []

    @contextlib.contextmanager
    def fake_resolve(*args, **kwargs):
        lms.append(fake_lm(toy_judge))
        yield lms[-1]

    monkeypatch.setattr(lm_module, "resolve_lm", fake_resolve)
    real = compile_module.compile_evaluator

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # as if killed while the optimizer ran

    args = ["compile", "--dataset", "faireval", "--limit", "3", "--turns", "1", "--roles", "1", "--optimizer", "labeled",
            "--out", "programs/p", "--no-progress", "--no-mlflow", "--no-cache"]
    monkeypatch.setattr(compile_module, "compile_evaluator", crash)
    assert main(args) == 130
    assert len((tmp_path / "programs/p/results/test_before.jsonl").read_text().splitlines()) == 3
    monkeypatch.setattr(compile_module, "compile_evaluator", real)
    assert main(args) == 0
    assert len(lms[-1].engine.calls) == 3 * 2  # only the "after" test items were judged on the rerun
    assert (tmp_path / "programs/p/card.json").exists()
    assert main(args) == 2  # a finished evaluator is never overwritten


# --- chateval compile as a function ---------------------------------------------------------------------------


class _Seen:
    """Records what compile_and_save reports, in order."""

    def __init__(self):
        self.events = []

    def progress(self, stage, total):
        import contextlib

        self.events.append(("progress", stage, total))
        return contextlib.nullcontext(lambda record: self.events.append(("item", stage)))

    def compiling(self, optimizer, n_train, n_dev):
        self.events.append(("compiling", optimizer, n_train, n_dev))

    def optimized(self, optimizer, metric, dev_scores):
        self.events.append(("optimized", optimizer))

    def tested(self, stage, result, figures, header):
        self.events.append(("tested", stage, result.n, "accuracy" in figures, header["split"]))


@pytest.mark.slow
def test_compile_and_save_is_the_compile_command_as_a_function(tmp_path, monkeypatch):
    """The before/after test, the card and the save are one library call on frozen specs."""
    import contextlib

    import chateval_dspy.lm.resolve as lm_module
    from chateval_dspy.data.spec import DataSpec
    from chateval_dspy.deploy.saved.store import load_program
    from chateval_dspy.lm.spec import LMSpec
    from optim.tuning.compile import compile_and_save

    @contextlib.contextmanager
    def fake_resolve(*args, **kwargs):
        yield fake_lm(toy_judge)

    monkeypatch.setattr(lm_module, "resolve_lm", fake_resolve)
    seen = _Seen()
    data, cfg, lm = DataSpec("faireval", limit=3), DebateConfig(roles=("critic",), turns=1), LMSpec(cache=False)
    done = compile_and_save(data, cfg, lm, optimizer="labeled", out=tmp_path / "p",
                            settings=OptimizerSettings(max_demos=1), hooks=seen)
    assert done.mlflow_run_id is None and done.model == "fake/scripted"
    assert done.card["optimizer"] == "labeled" and done.card["optimizer_settings"]["max_demos"] == 1
    assert set(done.card["test_metrics"]) == {"before", "after"}
    loaded, card = load_program(tmp_path / "p")
    assert card == done.card and [len(p.demos) for _, p in loaded.named_predictors()] == \
        [len(p.demos) for _, p in done.program.named_predictors()]
    said = [e for e in seen.events if e[0] != "item"]
    assert said == [("progress", "before", 3), ("tested", "before", 3, True, "test (seed 0)"),
                    ("compiling", "labeled", 3, 3), ("optimized", "labeled"),
                    ("progress", "after", 3), ("tested", "after", 3, True, "test (seed 0)")]
    assert [e for e in seen.events if e[0] == "item"] == [("item", "before")] * 3 + [("item", "after")] * 3
    with pytest.raises(ConfigError, match="already holds a compiled evaluator"):
        compile_and_save(data, cfg, lm, optimizer="labeled", out=tmp_path / "p", settings=OptimizerSettings(max_demos=1))


def test_compile_flag_defaults_and_choices_come_from_optimizer_settings():
    """--max-demos/--candidates/--auto/--threads default to OptimizerSettings' fields."""
    import argparse

    from optim.cli import compile as compile_command
    from optim.cli.main import build_parser
    from optim.tuning.settings import BUDGETS

    args = build_parser().parse_args(["compile", "--dataset", "faireval", "--out", "o"])
    default = OptimizerSettings()
    assert (args.max_demos, args.candidates, args.auto, args.threads) == \
        (default.max_demos, default.candidates, default.auto, default.threads)
    parser = argparse.ArgumentParser()
    compile_command.add_command(parser.add_subparsers(dest="command"),
                                OptimizerSettings(max_demos=5, candidates=7, auto="heavy", threads=3))
    args = parser.parse_args(["compile", "--dataset", "faireval", "--out", "o"])
    assert (args.max_demos, args.candidates, args.auto, args.threads) == (5, 7, "heavy", 3)
    auto = next(a for a in build_parser()._subparsers._group_actions[0].choices["compile"]._actions
                if a.dest == "auto")
    assert tuple(auto.choices) == BUDGETS


@pytest.mark.parametrize("bad,message", [({"max_demos": 17}, "limits.MAX_DEMOS_PER_PREDICTOR"),
                                         ({"auto": "huge"}, "choose one of: light, medium, heavy"),
                                         ({"threads": 0}, "threads must be positive"),
                                         ({"candidates": 0}, "candidates must be positive")])
def test_optimizer_settings_refuse_what_no_optimizer_can_do(bad, message):
    """A frozen spec checks itself, as DebateConfig does, before any model starts."""
    with pytest.raises(ConfigError, match=message):
        OptimizerSettings(**bad)
