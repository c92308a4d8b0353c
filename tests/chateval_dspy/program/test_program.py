"""ChatEval end to end on the fake LM: position calibration, mapping swapped orders back, and aggregation."""

from __future__ import annotations

import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.program.chateval import ChatEval, build_evaluator
from chateval_dspy.program.roles import resolve_roles
from chateval_dspy.testing.fake_lm import default_responder, fake_lm

PAIRWISE_ITEM = {"question": "Which is better?", "answer_1": "first answer", "answer_2": "second answer"}
SCORING_ITEM = {"dialogue_history": "A: hi\nB: hello", "fact": "cats purr", "response": "Did you know cats purr?"}

ROLES = ("general_public", "critic")
GOOD, BAD = "GOOD: a careful, correct answer.", "BAD: wrong."
ITEM = {"question": "Q?", "answer_1": BAD, "answer_2": GOOD}  # the better answer is the original answer 2


def persona_to_slug(roles, fmt="pairwise"):
    return {r.persona(fmt): r.slug for r in resolve_roles(roles, fmt)}


def position_biased(call):
    """Always prefers whatever is shown first."""
    if call.kind == "verdict":
        return {"evidence": "the first one", "score_1": 8, "score_2": 3}
    return default_responder(call)


def content_based(call):
    """Scores depend only on the answer's text, never on its position."""
    if call.kind == "verdict":
        def score(text):
            return 9 if text.startswith("GOOD") else 2
        return {"evidence": "by content", "score_1": score(call.inputs["answer_1"]),
                "score_2": score(call.inputs["answer_2"])}
    return default_responder(call)


# --- 4. mapping back of swapped orders ---------------------------------------------------------------------


def test_position_bias_cancels_out_to_a_tie(run):
    pred = run(build_evaluator(DebateConfig(roles=ROLES, turns=2)), fake_lm(position_biased), **ITEM)
    assert pred.order_preferences == ["1", "2"]  # order 2's "first answer" is the original answer 2
    assert pred.consistent is False
    assert pred.preference == "tie"
    assert pred.score_1 == pred.score_2 == 5.5
    for slug in ROLES:
        # the swapped order's scores and stated preference are mapped back to the original answers
        assert pred.referees[slug] == [{"preference": "1", "score_1": 8, "score_2": 3},
                                       {"preference": "2", "score_1": 3, "score_2": 8}]


def test_position_bias_with_majority_vote_is_also_a_tie(run):
    cfg = DebateConfig(roles=ROLES, turns=1, aggregate="majority")
    pred = run(build_evaluator(cfg), fake_lm(position_biased), **ITEM)
    assert pred.preference == "tie" and pred.consistent is False


def test_content_judge_agrees_across_orders_and_points_to_the_original_answer(run):
    lm = fake_lm(content_based)
    pred = run(build_evaluator(DebateConfig(roles=ROLES, turns=2)), lm, **ITEM)
    assert pred.order_preferences == ["2", "2"]
    assert pred.consistent is True
    assert pred.preference == "2"
    assert (pred.score_1, pred.score_2) == (2, 9)
    for slug in ROLES:  # both orders' scores refer to the original answers
        assert pred.referees[slug] == [{"preference": "2", "score_1": 2, "score_2": 9},
                                       {"preference": "2", "score_1": 2, "score_2": 9}]
    # The second order really was judged swapped (the two orders run at once, so their calls interleave).
    verdicts = [c for c in lm.engine.calls if c.kind == "verdict"]
    assert sorted(c.inputs["answer_1"] for c in verdicts) == sorted([BAD, BAD, GOOD, GOOD])
    assert pred.transcripts[1][-1]["text"].endswith("Scores: score_1=9, score_2=2")  # raw, as the LM saw it


def test_content_judge_prefers_answer_one_when_it_is_better(run):
    item = {"question": "Q?", "answer_1": GOOD, "answer_2": BAD}
    pred = run(build_evaluator(DebateConfig(roles=ROLES, turns=1)), fake_lm(content_based), **item)
    assert pred.preference == "1" and pred.consistent is True and pred.order_preferences == ["1", "1"]


def test_without_calibration_one_order_and_no_consistency(run):
    lm = fake_lm(position_biased)
    pred = run(build_evaluator(DebateConfig(roles=ROLES, turns=1, calibrate=False)), lm, **ITEM)
    assert pred.preference == "1"  # the bias goes uncorrected
    assert pred.consistent is None and pred.order_preferences == ["1"]
    assert len(pred.transcripts) == 1
    assert all(c.inputs["answer_1"] == BAD for c in lm.engine.calls)


def test_one_order_abstaining_leaves_consistency_unknown(run):
    def responder(call):
        if call.kind == "verdict" and call.inputs["answer_1"] == GOOD:  # only in the swapped order
            return "garbage"
        return content_based(call)

    pred = run(build_evaluator(DebateConfig(roles=ROLES, turns=1)), fake_lm(responder), **ITEM)
    assert pred.order_preferences == ["2", None]
    assert pred.consistent is None
    assert pred.preference == "2" and pred.abstained is None
    assert set(pred.abstentions) == {"order2:general_public@1", "order2:critic@1"}


# --- aggregation through the program -------------------------------------------------------------------------


def split_panel(call):
    """Critic strongly prefers 1; the two others mildly prefer 2: mean says 1, majority says 2."""
    slug = persona_to_slug(("general_public", "critic", "scientist"))[call.inputs["persona"]]
    if call.kind != "verdict":
        return default_responder(call)
    scores = {"critic": (10, 1), "general_public": (5, 6), "scientist": (5, 6)}[slug]
    return {"evidence": slug, "score_1": scores[0], "score_2": scores[1]}


@pytest.mark.parametrize(("how", "expected"), [("mean", "1"), ("majority", "2")])
def test_mean_and_majority_aggregation_differ(run, how, expected):
    cfg = DebateConfig(roles=("general_public", "critic", "scientist"), turns=1, calibrate=False, aggregate=how)
    pred = run(build_evaluator(cfg), fake_lm(split_panel), **PAIRWISE_ITEM)
    assert pred.preference == expected
    assert pred.score_1 == pytest.approx(20 / 3) and pred.score_2 == pytest.approx(13 / 3)  # means either way


def scoring_panel(call):
    slug = persona_to_slug(("general_public", "critic", "scientist"), "pointwise")[call.inputs["persona"]]
    if call.kind != "verdict":
        return default_responder(call)
    scores = {"general_public": (3, 1, 2, 1), "critic": (1, 2, 2, 0), "scientist": (3, 3, 1, 1)}[slug]
    return {"evidence": slug, **dict(zip(("naturalness", "coherence", "engagingness", "groundedness"), scores,
                                         strict=True))}


def test_scoring_mean(run):
    cfg = DebateConfig(format="pointwise", roles=("general_public", "critic", "scientist"), turns=1)
    pred = run(build_evaluator(cfg), fake_lm(scoring_panel), **SCORING_ITEM)
    assert pred.naturalness == pytest.approx(7 / 3)
    assert pred.coherence == 2
    assert pred.engagingness == pytest.approx(5 / 3) and pred.groundedness == pytest.approx(2 / 3)
    assert pred.consistent is None and pred.abstained is None
    assert pred.referees["critic"] == [{"naturalness": 1, "coherence": 2, "engagingness": 2, "groundedness": 0}]


def test_scoring_mode(run):
    cfg = DebateConfig(format="pointwise", roles=("general_public", "critic", "scientist"), turns=1, aggregate="majority")
    pred = run(build_evaluator(cfg), fake_lm(scoring_panel), **SCORING_ITEM)
    # naturalness 3,1,3 -> 3; coherence 1,2,3 all once -> their mean 2; engagingness 2,2,1 -> 2; groundedness 1,0,1 -> 1
    assert (pred.naturalness, pred.coherence, pred.engagingness, pred.groundedness) == (3, 2, 2, 1)


def test_scoring_all_abstain(run):
    pred = run(build_evaluator(DebateConfig(format="pointwise", roles=("critic",), turns=1)),
               fake_lm(lambda call: "nope"), **SCORING_ITEM)
    assert pred.abstained == "parse_failure"
    assert all(pred[a] is None for a in ("naturalness", "coherence", "engagingness", "groundedness"))


# --- the module ------------------------------------------------------------------------------------------------


def test_missing_inputs_are_named(run, fake):
    with pytest.raises(TypeError, match=r"missing \['answer_2'\]"):
        run(build_evaluator(DebateConfig()), fake, question="q", answer_1="a")
    with pytest.raises(TypeError, match="dialogue_history"):
        run(build_evaluator(DebateConfig(format="pointwise")), fake, **PAIRWISE_ITEM)
    assert fake.engine.calls == []


def test_build_evaluator_is_a_chateval_with_its_config():
    cfg = DebateConfig(roles=("critic",), turns=1)
    program = build_evaluator(cfg)
    assert isinstance(program, ChatEval) and program.config is cfg
    assert list(program.debate.referees) == ["critic"]


def test_programs_are_independent_copies(run):
    """deepcopy (what optimizers do) keeps a working program with separate predictors."""
    program = build_evaluator(DebateConfig(roles=ROLES, turns=1))
    clone = program.deepcopy()
    assert clone.debate.referees["critic"].judge is not program.debate.referees["critic"].judge
    pred = run(clone, fake_lm(content_based), **ITEM)
    assert pred.preference == "2"
