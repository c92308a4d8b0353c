"""The simulated referees against their own equations, and the simulation study.

Rates are checked against exact 99% binomial intervals over a couple of thousand items, so a
simulator that drifted from its stated model fails; the study's sanity tests check that it finds
the planted signal and finds none when every knob is at "no signal".
"""

from __future__ import annotations

import json

import dspy
import pytest
from scipy import stats

from chateval_dspy.config import DebateConfig
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.testing.fake_lm import Call
from chateval_dspy.testing.sim_lm import SimKnobs, SimReferees, label_table, prevailing, sim_lm, synthetic_items
from optim.bench.simulate import SMOKE, Budget, run_sections, theory
from optim.bench.simulate.world import independent_roles, judge, make_world
from optim.tuning.compile import OptimizerSettings, compile_evaluator
from optim.tuning.objectives import agreement


def within(k: int, n: int, p: float) -> bool:
    """Whether ``p`` lies in the exact 99% interval of ``k`` successes in ``n``.

    99%, not 95%: each check is one fixed draw (the simulator is seeded), and a dozen checks at 95% would
    put one of them outside by chance; the intervals stay far narrower than the effects they tell apart.
    """
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.99, method="exact")
    return ci.low <= p <= ci.high


def single(world, n_roles: int = 1, **changes) -> DebateConfig:
    return DebateConfig(roles=tuple(r.slug for r in world.roles[:n_roles]), turns=1, calibrate=False,
                        aggregate="majority", strategy="simultaneous_talk").replace(**changes)


@pytest.mark.slow  # over a few seconds
def test_a_referee_of_accuracy_07_is_right_07_of_the_time():
    world = make_world(SimKnobs(default_accuracy=0.7), 0, {"test": 2000}, roles=independent_roles(1))
    judged = judge(world, single(world), world.splits["test"])
    assert within(sum(judged.correct), 2000, 0.7)
    assert not within(sum(judged.correct), 2000, 0.65) and not within(sum(judged.correct), 2000, 0.75)


@pytest.mark.slow  # over a few seconds
def test_position_bias_says_answer_1_at_its_set_rate():
    knobs = SimKnobs(default_accuracy=0.8, position_bias=0.3)
    world = make_world(knobs, 1, {"test": 2000}, roles=independent_roles(1))
    judged = judge(world, single(world), world.splits["test"])
    # Labels alternate 1/2: "answer 1" is said by the bias, or by an own verdict that picks answer 1.
    assert within(round(judged.first_rate * 2000), 2000, 0.3 + 0.7 * 0.5)
    assert within(sum(judged.correct), 2000, 0.7 * 0.8 + 0.3 * 0.5)


def test_herding_copies_the_verdict_seen_at_its_set_rate():
    knobs = SimKnobs(default_accuracy=0.6, herding=0.4)
    world = make_world(knobs, 2, {"test": 1200}, roles=independent_roles(2))
    cfg = single(world, 2, strategy="one_by_one")
    program = build_evaluator(cfg, world.roles)
    agree = 0
    with dspy.context(lm=world.lm, adapter=DebateAdapter()):
        for x in world.splits["test"]:
            verdicts = program(**x.inputs()).referees
            agree += verdicts["sim_1"][0]["preference"] == verdicts["sim_2"][0]["preference"]
    # The second copies the first with 0.4, else both are independently right with 0.6.
    assert within(agree, 1200, 0.4 + 0.6 * (0.6 ** 2 + 0.4 ** 2))
    assert not within(agree, 1200, 0.6 ** 2 + 0.4 ** 2)


def test_a_discussion_that_states_no_leaning_cannot_be_copied():
    assert prevailing("(nobody has spoken yet: you speak first)") is None
    assert prevailing("Prefers: answer 2. I lean to answer 1. The panel leans to answer 2.") == "2"


@pytest.mark.parametrize("labels_right,expected", [(True, 0.6 + 4 * 0.04), (False, 0.6 - 4 * 0.04)],
                         ids=["right demos", "wrong demos"])
@pytest.mark.slow  # over a few seconds
def test_demos_move_accuracy_by_their_stated_gain_and_loss(labels_right, expected):
    knobs = SimKnobs(default_accuracy=0.6)
    world = make_world(knobs, 3, {"train": 4, "test": 1500}, roles=independent_roles(1))
    train = world.splits["train"]
    if not labels_right:  # demos that state the wrong answer about their own item
        train = [x.copy(label="2" if x.label == "1" else "1") for x in train]
    cfg = single(world)
    with dspy.context(lm=world.lm, adapter=DebateAdapter()):
        program = compile_evaluator(build_evaluator(cfg, world.roles), optimizer="labeled", trainset=train,
                                    valset=None, metric=agreement, settings=OptimizerSettings(max_demos=4))
    assert len(program.debate.referees["sim_1"].judge.demos) == 4
    judged = judge(world, cfg, world.splits["test"], program)
    assert within(sum(judged.correct), 1500, expected)


@pytest.mark.slow  # over a few seconds
def test_instructions_with_the_key_phrase_add_their_stated_gain():
    knobs = SimKnobs(default_accuracy=0.6)
    world = make_world(knobs, 4, {"test": 2000}, roles=independent_roles(1))
    cfg = single(world)
    program = build_evaluator(cfg, world.roles)
    judge_predictor = program.debate.referees["sim_1"].judge
    judge_predictor.signature = judge_predictor.signature.with_instructions(
        f"{judge_predictor.signature.instructions} Before deciding, {knobs.instruction_key}.")
    judged = judge(world, cfg, world.splits["test"], program)
    assert within(sum(judged.correct), 2000, 0.6 + 0.15)


@pytest.mark.slow
def test_panels_match_the_exact_theory():
    knobs = SimKnobs(default_accuracy=0.65, herding=0.5, position_bias=0.2)
    world = make_world(knobs, 5, {"test": 500}, roles=independent_roles(3))
    for strategy, turns, calibrate in (("one_by_one", 2, False), ("simultaneous_talk_with_summarizer", 2, False),
                                       ("simultaneous_talk", 1, True)):
        cfg = single(world, 3, strategy=strategy, turns=turns, calibrate=calibrate)
        judged = judge(world, cfg, world.splits["test"])
        exact = theory.panel([0.65] * 3, knobs, strategy=strategy, turns=turns, calibrate=calibrate)
        assert within(sum(judged.correct), 500, exact["accuracy"]), (strategy, judged.accuracy, exact)
        if calibrate:
            assert within(round(judged.consistency * 500), 500, exact["consistency"])


def test_independent_majority_is_condorcets_binomial():
    for n in range(1, 8):
        assert theory.panel([0.62] * n, SimKnobs())["accuracy"] == pytest.approx(theory.condorcet(0.62, n))


def test_verdicts_are_deterministic_given_the_seed():
    items = synthetic_items(200)
    cfg = DebateConfig(roles=("critic",), turns=1, calibrate=False)

    def verdicts(seed):
        with dspy.context(lm=sim_lm(SimKnobs(seed=seed), items), adapter=DebateAdapter()):
            program = build_evaluator(cfg)
            return [program(**x.inputs()).preference for x in items]

    assert verdicts(0) == verdicts(0)
    assert verdicts(0) != verdicts(1)


def test_an_item_the_simulator_was_not_told_about_gets_no_opinion():
    referees = SimReferees(SimKnobs(), label_table(synthetic_items(2)))
    call = Call("system", "user", ["argument"], {"question": "q", "answer_1": "a", "answer_2": "b", "persona": "p"})
    assert referees(call) == {"argument": "I have no view."}


@pytest.mark.slow
def test_the_study_runs_every_section_from_the_command_line(tmp_path):
    from optim.bench.main import main

    out = tmp_path / "simulate.json"
    assert main(["simulate", "--smoke", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    sections = report["sections"]
    assert set(sections) == {"aggregation", "calibration", "compile", "search", "labels"}
    assert {r["optimizer"] for r in sections["compile"]["rows"]} == set(SMOKE.optimizers)
    assert {(r["sampler"], r["trials"]) for r in sections["search"]["rows"]} == {
        (s, k) for s in ("tpe", "random") for k in SMOKE.trials}
    assert all(r["theory"] is not None for r in sections["aggregation"]["rows"])
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["simulate-aggregation.png", "simulate-compile.png",
                                                               "simulate-search.png"]


SANITY = Budget(seeds=4, train_sizes=(8,), dev=12, test=120, optimizers=("labeled", "bootstrap"), trials=(10,),
                dev_sizes=(10,), search_seeds=4, search_test=120)


@pytest.mark.slow  # over a few seconds
def test_the_study_finds_the_planted_gain():
    found = run_sections(SANITY, ("compile",))["compile"]["rows"]
    assert all(r["gain"]["ci_low"] > 0 for r in found), found


@pytest.mark.slow
def test_with_no_signal_the_study_finds_no_gain():
    found = run_sections(SANITY, ("compile", "search"), no_signal=True)
    for row in found["compile"]["rows"]:
        assert row["gain"]["ci_low"] <= 0 <= row["gain"]["ci_high"], row
    search = found["search"]
    assert search["oracle"]["accuracy"] == pytest.approx(0.5)
    for row in search["rows"]:
        assert row["test_accuracy"]["ci_low"] <= 0.5, row  # no better than a coin (even panels can tie: worse)
        assert row["winners_curse"]["value"] > 0  # the dev winner always looks better than it is
