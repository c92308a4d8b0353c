"""The debate loop: LM calls per item, parse failures with retries, and LM faults as abstentions."""

from __future__ import annotations

import threading

import dspy
import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import FatalLMError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.debate import RETRY_TEMPERATURE, Debate
from chateval_dspy.program.roles import DEFAULT_ORDER, resolve_roles
from chateval_dspy.program.strategies import STRATEGIES
from chateval_dspy.program.task import as_task
from chateval_dspy.testing.fake_lm import default_responder, fake_lm

PAIRWISE_ITEM = {"question": "Which is better?", "answer_1": "first answer", "answer_2": "second answer"}
SCORING_ITEM = {"dialogue_history": "A: hi\nB: hello", "fact": "cats purr", "response": "Did you know cats purr?"}

GP, CRITIC = "general_public", "critic"
GP_PERSONA = resolve_roles([GP], "pairwise")[0].persona("pairwise")


# --- 2. LM calls per item ------------------------------------------------------------------------------------

MODES = {
    # name: (format, calibrate, answer orders)
    "pairwise_calibrated": ("pairwise", True, 2),
    "pairwise_one_order": ("pairwise", False, 1),
    "pointwise": ("pointwise", True, 1),  # calibration does not apply to scoring: one order
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("n_roles", [1, 2, 3])
@pytest.mark.parametrize("turns", [1, 2, 3])
def test_calls_per_item(run, mode, strategy, n_roles, turns):
    fmt, calibrate, orders = MODES[mode]
    summarizer = strategy == "simultaneous_talk_with_summarizer"
    expected = orders * (n_roles * turns + (turns - 1 if summarizer else 0))  # by hand: N x T (+ T-1) per order
    cfg = DebateConfig(format=fmt, roles=DEFAULT_ORDER[:n_roles], strategy=strategy, turns=turns, calibrate=calibrate)
    lm = fake_lm()
    pred = run(build_evaluator(cfg), lm, **(PAIRWISE_ITEM if fmt == "pairwise" else SCORING_ITEM))

    assert cfg.calls_per_item() == expected
    assert len(lm.engine.calls) == expected
    assert pred.calls == expected
    kinds = [c.kind for c in lm.engine.calls]
    assert kinds.count("verdict") == orders * n_roles
    assert kinds.count("argument") == orders * n_roles * (turns - 1)
    assert kinds.count("summary") == (orders * (turns - 1) if summarizer else 0)
    assert len(pred.transcripts) == orders
    assert pred.abstained is None


def test_paper_default_costs_eight_calls():
    assert DebateConfig().calls_per_item() == 8  # 2 roles x 2 turns x 2 orders


# --- 5. parse failures ----------------------------------------------------------------------------------------


def unparseable_verdicts(call):
    if call.kind == "verdict":
        return "Assistant 1 is clearly better. I give it a 9."  # no JSON: the adapter cannot parse it
    return default_responder(call)


@pytest.mark.parametrize("retries", [0, 1, 2])
def test_unparseable_verdicts_are_retried_then_abstain(run, retries):
    cfg = DebateConfig(roles=(GP, CRITIC), turns=1, calibrate=False, parse_retries=retries)
    lm = fake_lm(unparseable_verdicts)
    pred = run(build_evaluator(cfg), lm, **PAIRWISE_ITEM)

    attempts = retries + 1
    assert len(lm.engine.calls) == 2 * attempts == pred.calls
    for persona in {c.inputs["persona"] for c in lm.engine.calls}:
        temps = [c.config["temperature"] for c in lm.engine.calls if c.inputs["persona"] == persona]
        assert temps == [0.0] + [RETRY_TEMPERATURE] * retries  # a retry samples at 0.7, not the same prompt at 0
    assert pred.preference is None  # never a winner
    assert pred.score_1 is None and pred.score_2 is None
    assert pred.abstained == "parse_failure"
    assert pred.abstentions == {f"order1:{GP}@1": "parse_failure", f"order1:{CRITIC}@1": "parse_failure"}
    assert pred.referees == {GP: [None], CRITIC: [None]}
    verdicts = [u["text"] for u in pred.transcripts[0]]
    assert verdicts == ["(no verdict: parse_failure)"] * 2


def test_calibrated_item_with_no_parseable_verdict_has_no_winner(run):
    lm = fake_lm(unparseable_verdicts)
    pred = run(build_evaluator(DebateConfig(turns=2)), lm, **PAIRWISE_ITEM)
    assert pred.preference is None and pred.abstained == "parse_failure"
    assert pred.consistent is None and pred.order_preferences == [None, None]
    assert pred.calls == len(lm.engine.calls) == 2 * (2 + 2 * 2)  # arguments once, verdicts twice, two orders


def test_only_one_referee_fails_the_other_decides(run):
    def responder(call):
        if call.kind == "verdict" and call.inputs["persona"] == GP_PERSONA:
            return "not json at all"
        if call.kind == "verdict":
            return {"evidence": "2 is better", "score_1": 3, "score_2": 8}
        return default_responder(call)

    pred = run(build_evaluator(DebateConfig(roles=(GP, CRITIC), turns=2, calibrate=False)), fake_lm(responder),
               **PAIRWISE_ITEM)
    assert pred.preference == "2"
    assert (pred.score_1, pred.score_2) == (3, 8)
    assert pred.abstained is None
    assert pred.abstentions == {f"order1:{GP}@2": "parse_failure"}
    assert pred.referees == {GP: [None], CRITIC: [{"preference": "2", "score_1": 3, "score_2": 8}]}


def test_a_retry_that_parses_is_used(run):
    seen = []
    lock = threading.Lock()

    def responder(call):
        if call.kind == "verdict":
            with lock:
                seen.append(call.config["temperature"])
            if call.config["temperature"] == 0.0:
                return "{broken"
            return {"evidence": "ok", "score_1": 9, "score_2": 2}
        return default_responder(call)

    cfg = DebateConfig(roles=(GP,), turns=1, calibrate=False)
    pred = run(build_evaluator(cfg), fake_lm(responder), **PAIRWISE_ITEM)
    assert seen == [0.0, RETRY_TEMPERATURE]
    assert pred.preference == "1" and pred.abstained is None and pred.abstentions == {}
    assert pred.calls == cfg.calls_per_item() + 1  # the retry is counted


def test_out_of_range_score_is_a_parse_failure_not_a_clamp(run):
    def responder(call):
        if call.kind == "verdict":
            return {"evidence": "x", "score_1": 11, "score_2": 0}
        return default_responder(call)

    pred = run(build_evaluator(DebateConfig(roles=(GP,), turns=1, calibrate=False)), fake_lm(responder),
               **PAIRWISE_ITEM)
    assert pred.preference is None and pred.abstained == "parse_failure"


def test_unparseable_argument_is_recorded_and_the_debate_goes_on(run):
    def responder(call):
        if call.kind == "argument":
            return "plain prose, no JSON"
        return {"evidence": "x", "score_1": 2, "score_2": 7}

    lm = fake_lm(responder)
    pred = run(build_evaluator(DebateConfig(roles=(GP,), turns=2, calibrate=False)), lm, **PAIRWISE_ITEM)
    assert pred.preference == "2" and pred.abstained is None
    assert pred.abstentions == {f"order1:{GP}@1": "parse_failure"}
    assert pred.transcripts[0][0]["text"] == "(no argument: parse_failure)"
    verdict_call = [c for c in lm.engine.calls if c.kind == "verdict"][0]
    assert "(no argument: parse_failure)" in verdict_call.inputs["discussion"]


def test_scoring_verdict_parse_failure_abstains(run):
    def responder(call):
        return "no" if call.kind == "verdict" else default_responder(call)

    pred = run(build_evaluator(DebateConfig(format="pointwise", roles=(GP,), turns=1)), fake_lm(responder),
               **SCORING_ITEM)
    assert pred.abstained == "parse_failure"
    assert pred.naturalness is None and pred.groundedness is None


# --- LM faults -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("error", [dspy.lm15.ServerError, dspy.lm15.TransportError, dspy.lm15.TimeoutError])
def test_lm_fault_becomes_an_abstention(run, error):
    def responder(call):
        raise error("boom")

    lm = fake_lm(responder)
    cfg = DebateConfig(roles=(GP, CRITIC), turns=2, calibrate=False, parse_retries=3)
    pred = run(build_evaluator(cfg), lm, **PAIRWISE_ITEM)
    assert pred.preference is None
    assert pred.abstained.startswith("lm_error:")
    assert pred.abstained == f"lm_error:LM{error.__name__}"  # DSPy wraps lm15.ServerError as LMServerError, ...
    assert len(pred.abstentions) == 4 and all(v.startswith("lm_error:") for v in pred.abstentions.values())
    # An LM fault is not retried here (the LM client already retried): one call per turn, whatever parse_retries.
    assert len(lm.engine.calls) == pred.calls == 4


def test_lm_fault_for_one_referee_leaves_the_other_deciding(run):
    def responder(call):
        if call.kind == "verdict" and call.inputs["persona"] == GP_PERSONA:
            raise dspy.lm15.ServerError("boom", status=500)
        if call.kind == "verdict":
            return {"evidence": "1 wins", "score_1": 8, "score_2": 4}
        return default_responder(call)

    pred = run(build_evaluator(DebateConfig(roles=(GP, CRITIC), turns=1, calibrate=False)), fake_lm(responder),
               **PAIRWISE_ITEM)
    assert pred.preference == "1" and pred.abstained is None
    assert pred.abstentions == {f"order1:{GP}@1": "lm_error:LMServerError"}


def test_auth_failure_is_raised_not_abstained(run):
    def responder(call):
        raise dspy.lm15.AuthError("bad key", status=401)

    with pytest.raises(FatalLMError, match="refused"):
        run(build_evaluator(DebateConfig(roles=(GP,), turns=1)), fake_lm(responder), **PAIRWISE_ITEM)


def test_failed_summary_degrades_to_a_note_not_an_abstention(run):
    def responder(call):
        if call.kind == "summary":
            raise dspy.lm15.ServerError("boom")
        return default_responder(call)

    lm = fake_lm(responder)
    cfg = DebateConfig(roles=(GP, CRITIC), strategy="simultaneous_talk_with_summarizer", turns=2, calibrate=False)
    pred = run(build_evaluator(cfg), lm, **PAIRWISE_ITEM)
    assert pred.abstained is None and pred.preference is not None
    verdict_calls = [c for c in lm.engine.calls if c.kind == "verdict"]
    assert all(c.inputs["discussion"] == "[Summary, round 1]: (no summary: LMServerError)" for c in verdict_calls)
    assert pred.calls == cfg.calls_per_item()


# --- the Debate module itself ----------------------------------------------------------------------------------


def test_debate_prediction_shape(run):
    cfg = DebateConfig(roles=(GP, CRITIC), turns=2)
    debate = Debate(cfg, resolve_roles(cfg.roles, cfg.format))
    out = run(debate, fake_lm(), **PAIRWISE_ITEM)
    assert set(out.verdicts) == {GP, CRITIC}
    assert out.calls == 4 and out.abstentions == {}
    assert [(u.round, u.speaker, u.kind) for u in out.transcript] == [
        (1, GP, "argument"), (1, CRITIC, "argument"), (2, GP, "verdict"), (2, CRITIC, "verdict")]


def test_material_blocks():
    assert as_task("pairwise").material_text(PAIRWISE_ITEM) == (
        "Question: Which is better?\n\nAnswer 1: first answer\n\nAnswer 2: second answer")
    assert "Fact: cats purr" in as_task("pointwise").material_text(SCORING_ITEM)


def test_judged_texts_reach_the_lm_verbatim(run):
    lm = fake_lm()
    item = {"question": "Q? with [[ brackets ]]", "answer_1": "line one\nline two", "answer_2": "B"}
    run(build_evaluator(DebateConfig(roles=(GP,), turns=1, calibrate=False)), lm, **item)
    (call,) = lm.engine.calls
    assert {k: call.inputs[k] for k in item} == item
    assert call.inputs["persona"] == GP_PERSONA


# ---------------------------------------------------------------- consensus stop (issue #5)


def _scores_by_persona(agree: bool):
    def respond(call):
        if call.kind == "summary":
            return {"summary": "s"}
        if call.kind == "argument":
            return {"argument": "a"}
        critic = "critic" in call.inputs.get("persona", "")
        high_first = True if agree else critic
        return {"evidence": "e", "score_1": 8 if high_first else 3, "score_2": 3 if high_first else 8}
    return respond


def test_consensus_stop_ends_the_debate_after_a_round_of_agreement():
    from chateval_dspy.config import DebateConfig
    from chateval_dspy.program.chateval import build_evaluator
    from chateval_dspy.testing.fake_lm import fake_lm

    cfg = DebateConfig(roles=("critic", "scientist"), turns=3, consensus_stop=True)
    lm = fake_lm(_scores_by_persona(agree=True))
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        pred = build_evaluator(cfg)(question="q", answer_1="a", answer_2="b")
    assert pred.calls == 2 * 2  # one round of two referees, in each order
    assert all(c.kind == "verdict" for c in lm.engine.calls)
    assert cfg.calls_per_item() == 2 * 2 * 3  # the bound without agreement


def test_consensus_stop_keeps_debating_while_referees_disagree():
    from chateval_dspy.config import DebateConfig
    from chateval_dspy.program.chateval import build_evaluator
    from chateval_dspy.testing.fake_lm import fake_lm

    cfg = DebateConfig(roles=("critic", "scientist"), turns=3, consensus_stop=True,
                       strategy="simultaneous_talk_with_summarizer")
    lm = fake_lm(_scores_by_persona(agree=False))
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        pred = build_evaluator(cfg)(question="q", answer_1="a", answer_2="b")
    assert pred.calls == cfg.calls_per_item() == 2 * (2 * 3 + 2)
    assert pred.preference == "tie"  # one referee each way, in both orders
    # every round's turns are verdicts, and later rounds see the earlier scores through the summary
    assert sum(c.kind == "verdict" for c in lm.engine.calls) == 12


def test_no_lm_configured_raises_dspys_error_not_abstentions():
    """Only unparseable output may abstain; a missing LM is the caller's error."""
    program = build_evaluator(DebateConfig(roles=(GP,), turns=1, calibrate=False))
    with dspy.context(adapter=DebateAdapter()), pytest.raises(Exception, match="No LM is loaded"):
        program(**PAIRWISE_ITEM)


def test_a_score_outside_the_scale_has_its_own_error_and_abstention_cause(run, monkeypatch):
    """A verdict past DSPy's Literal check (a custom adapter, a hand-made demo) is
    ``ScoreRangeError``, recorded as ``score_out_of_range``; our config errors are never swallowed."""
    from chateval_dspy.errors import ConfigError
    from chateval_dspy.program.debater import Debater
    from chateval_dspy.program.signatures import ScoreRangeError, check_verdict

    with pytest.raises(ScoreRangeError, match="score_1=99"):
        check_verdict("pairwise", {"preference": "1", "score_1": 99, "score_2": 3})
    monkeypatch.setattr(Debater, "forward", lambda self, **kw: dspy.Prediction(
        evidence="x", argument="x", preference="1", score_1=99, score_2=3))
    pred = run(build_evaluator(DebateConfig(roles=(GP,), turns=1, calibrate=False)), fake_lm(), **PAIRWISE_ITEM)
    assert pred.preference is None and set(pred.abstentions.values()) == {"score_out_of_range"}

    def broken(self, **kw):
        raise ConfigError("bad roles file")

    monkeypatch.setattr(Debater, "forward", broken)
    with pytest.raises(ConfigError, match="bad roles file"):
        run(build_evaluator(DebateConfig(roles=(GP,), turns=1, calibrate=False)), fake_lm(), **PAIRWISE_ITEM)


# ---------------------------------------------------------------- deadlines


def test_an_lm_deadline_is_recorded_as_its_own_abstention_cause(run):
    """An engine's DeadlineExceeded reaches the debate wrapped by DSPy as LMTimeoutError;
    the abstention names the deadline, not a plain timeout."""
    from chateval_dspy.lm.engine import DeadlineExceeded

    def responder(call):
        raise DeadlineExceeded("deadline reached")

    lm = fake_lm(responder)
    pred = run(build_evaluator(DebateConfig(roles=(GP,), turns=1, parse_retries=2)), lm, **PAIRWISE_ITEM)
    assert pred.abstentions == {f"order1:{GP}@1": "lm_error:deadline", f"order2:{GP}@1": "lm_error:deadline"}
    assert pred.abstained == "lm_error:deadline" and len(lm.engine.calls) == 2  # no parse retries after it


def test_turns_after_the_item_deadline_abstain_without_calling_the_lm(run):
    """The item's time is shared by all its calls; once it is spent the rest abstain at once."""
    import time

    from chateval_dspy.lm.call_limits import CallBounds
    from chateval_dspy.lm.engine import with_bounds

    def slow(call):
        time.sleep(0.3)
        return default_responder(call)

    lm = with_bounds(fake_lm(slow), CallBounds.derive(30, call_deadline=30, item_deadline=0.5))
    cfg = DebateConfig(roles=(GP, CRITIC), turns=2)  # 8 calls of 0.3 s one after another: 2.4 s unbounded
    pred = run(build_evaluator(cfg), lm, **PAIRWISE_ITEM)
    assert 1 <= len(lm.engine.calls) < cfg.calls_per_item()
    assert pred.calls == len(lm.engine.calls)  # the skipped turns cost no call
    assert set(pred.abstentions.values()) == {"lm_error:deadline"}
    assert pred.preference is None and pred.abstained == "lm_error:deadline"


def test_a_summary_cut_by_the_deadline_degrades_to_a_note(run):
    """A summarizer call past its deadline costs the next round its summary, not the verdicts."""
    import threading

    from chateval_dspy.lm.call_limits import CallBounds
    from chateval_dspy.lm.engine import with_bounds

    release = threading.Event()

    def responder(call):
        if call.kind == "summary":
            release.wait(30)
        return default_responder(call)

    lm = with_bounds(fake_lm(responder), CallBounds.derive(30, call_deadline=0.5, item_deadline=60))
    cfg = DebateConfig(roles=(GP, CRITIC), strategy="simultaneous_talk_with_summarizer", turns=2, calibrate=False)
    try:
        pred = run(build_evaluator(cfg), lm, **PAIRWISE_ITEM)
    finally:
        release.set()
    assert pred.abstained is None and pred.abstentions == {} and pred.preference is not None
    verdict_calls = [c for c in lm.engine.calls if c.kind == "verdict"]
    assert all(c.inputs["discussion"] == "[Summary, round 1]: (no summary: deadline)" for c in verdict_calls)
