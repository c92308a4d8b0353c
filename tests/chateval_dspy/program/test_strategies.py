"""Who sees what under each communication strategy.

A ``Tagger`` responder makes every turn unique per (referee, round), so the
assertions can say exactly which turns were in each referee's discussion.
Simultaneous strategies run a round's referees in threads, so calls are
identified by persona, never by their position in the call log.
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.roles import resolve_roles
from chateval_dspy.program.strategies import STRATEGIES, SUMMARIZER, Utterance, render
from chateval_dspy.testing.fake_lm import fake_lm

ROLES = ("general_public", "critic", "scientist")
NOBODY = render([])
ITEM = {"question": "What is 2+2?", "answer_1": "4", "answer_2": "5"}


class Tagger:
    """Turns read ``TURN(slug,round)``; summaries read ``SUMMARY(n)``; records what each turn was shown."""

    def __init__(self, roles, fmt: str = "pairwise"):
        self.slug_of = {role.persona(fmt): role.slug for role in resolve_roles(roles, fmt)}
        self.rounds: Counter = Counter()
        self.summaries = 0
        self.seen: dict[tuple[str, int], str] = {}
        self.order: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def __call__(self, call):
        with self._lock:
            if call.kind == "summary":
                self.summaries += 1
                key = (SUMMARIZER, self.summaries)
            else:
                slug = self.slug_of[call.inputs["persona"]]
                self.rounds[slug] += 1
                key = (slug, self.rounds[slug])
            self.seen[key] = call.inputs["discussion"]
            self.order.append(key)
        tag = f"TURN({key[0]},{key[1]})"
        if call.kind == "summary":
            return {"summary": f"SUMMARY({key[1]})"}
        if call.kind == "argument":
            return {"argument": tag}
        return {"evidence": tag, "score_1": 5, "score_2": 6}


def debate(strategy: str, turns: int, roles=ROLES):
    tagger = Tagger(roles)
    lm = fake_lm(tagger)
    program = build_evaluator(DebateConfig(roles=roles, strategy=strategy, turns=turns, calibrate=False))
    return tagger, lm, program


def turn(slug: str, rnd: int) -> str:
    return f"TURN({slug},{rnd})"


# --- the visibility rules as pure functions ---------------------------------------------------------------


def _u(rnd, speaker, kind="argument"):
    return Utterance(rnd, speaker, speaker.title(), f"{speaker}@{rnd}", kind)


TRANSCRIPT = [_u(1, "a"), _u(1, "b"), _u(1, SUMMARIZER, "summary"),
              _u(2, "a"), _u(2, "b"), _u(2, SUMMARIZER, "summary")]


def test_registry_names_and_flags():
    assert list(STRATEGIES) == ["one_by_one", "simultaneous_talk", "simultaneous_talk_with_summarizer"]
    assert [s.summarize for s in STRATEGIES.values()] == [False, False, True]
    assert [s.concurrent_rounds for s in STRATEGIES.values()] == [False, True, True]


def test_one_by_one_rule_shows_every_turn_but_no_summary():
    seen = STRATEGIES["one_by_one"].visible(TRANSCRIPT, 3)
    assert [u.text for u in seen] == ["a@1", "b@1", "a@2", "b@2"]


def test_simultaneous_rule_hides_the_current_round():
    seen = STRATEGIES["simultaneous_talk"].visible(TRANSCRIPT, 2)
    assert [u.text for u in seen] == ["a@1", "b@1"]
    assert STRATEGIES["simultaneous_talk"].visible(TRANSCRIPT[:2], 1) == []


def test_summarizer_rule_shows_only_the_latest_earlier_summary():
    rule = STRATEGIES["simultaneous_talk_with_summarizer"].visible
    assert [u.text for u in rule(TRANSCRIPT, 2)] == ["summarizer@1"]
    assert [u.text for u in rule(TRANSCRIPT, 3)] == ["summarizer@2"]
    assert rule(TRANSCRIPT, 1) == []


def test_render_names_speaker_and_round():
    assert render([_u(1, "a"), _u(2, "b")]) == "[A, round 1]: a@1\n\n[B, round 2]: b@2"
    assert "nobody has spoken" in render([])


# --- visibility through the real debate loop and the fake LM -------------------------------------------------


def test_one_by_one_each_referee_sees_everyone_before_them(run):
    tagger, lm, program = debate("one_by_one", turns=2)
    run(program, lm, **ITEM)
    a, b, c = ROLES
    # Sequential: the call order is fixed.
    assert tagger.order == [(a, 1), (b, 1), (c, 1), (a, 2), (b, 2), (c, 2)]
    assert tagger.seen[(a, 1)] == NOBODY
    assert turn(a, 1) in tagger.seen[(b, 1)] and turn(c, 1) not in tagger.seen[(b, 1)]
    assert turn(a, 1) in tagger.seen[(c, 1)] and turn(b, 1) in tagger.seen[(c, 1)]
    round2_a = tagger.seen[(a, 2)]
    assert all(turn(s, 1) in round2_a for s in ROLES) and turn(a, 2) not in round2_a
    # In the verdict round, B sees A's verdict with its scores, C sees A's and B's.
    assert turn(a, 2) in tagger.seen[(b, 2)] and "Scores: score_1=5, score_2=6" in tagger.seen[(b, 2)]
    assert turn(c, 2) not in tagger.seen[(b, 2)]
    assert turn(a, 2) in tagger.seen[(c, 2)] and turn(b, 2) in tagger.seen[(c, 2)]


def test_one_by_one_turns_appear_in_speaking_order(run):
    tagger, lm, program = debate("one_by_one", turns=2)
    run(program, lm, **ITEM)
    seen = tagger.seen[(ROLES[2], 2)]
    positions = [seen.index(turn(s, r)) for r in (1, 2) for s in ROLES[:3] if (r, s) != (2, ROLES[2])]
    assert positions == sorted(positions)
    assert seen.startswith("[General Public, round 1]: ")


def test_simultaneous_talk_round_sees_only_earlier_rounds(run):
    tagger, lm, program = debate("simultaneous_talk", turns=3)
    pred = run(program, lm, **ITEM)
    assert pred.abstained is None
    for slug in ROLES:
        assert tagger.seen[(slug, 1)] == NOBODY
    for slug in ROLES:
        r2 = tagger.seen[(slug, 2)]
        assert all(turn(s, 1) in r2 for s in ROLES), r2
        assert not any(turn(s, 2) in r2 for s in ROLES), r2
        r3 = tagger.seen[(slug, 3)]
        assert all(turn(s, r) in r3 for s in ROLES for r in (1, 2)), r3
        assert not any(turn(s, 3) in r3 for s in ROLES), r3
    # B in round 2 concretely: A's round-1 turn yes, A's round-2 turn no.
    assert turn("general_public", 1) in tagger.seen[("critic", 2)]
    assert turn("general_public", 2) not in tagger.seen[("critic", 2)]


def test_simultaneous_talk_referees_of_a_round_run_concurrently(run):
    """Each call waits at a barrier for all three referees of its round: only concurrent calls get through."""
    barrier = threading.Barrier(len(ROLES), timeout=5)
    tagger = Tagger(ROLES)

    def responder(call):
        barrier.wait()
        return tagger(call)

    program = build_evaluator(DebateConfig(roles=ROLES, strategy="simultaneous_talk", turns=2, calibrate=False))
    pred = run(program, fake_lm(responder), **ITEM)
    assert pred.abstentions == {}
    assert pred.preference == "2"


def test_summarizer_round_two_sees_only_the_summary(run):
    tagger, lm, program = debate("simultaneous_talk_with_summarizer", turns=3)
    pred = run(program, lm, **ITEM)
    for slug in ROLES:
        assert tagger.seen[(slug, 1)] == NOBODY
        assert tagger.seen[(slug, 2)] == "[Summary, round 1]: SUMMARY(1)"
        assert tagger.seen[(slug, 3)] == "[Summary, round 2]: SUMMARY(2)"
        assert "TURN(" not in tagger.seen[(slug, 2)] + tagger.seen[(slug, 3)]
    # The summarizer condenses its round (plus the previous summary), never older raw turns.
    first, second = tagger.seen[(SUMMARIZER, 1)], tagger.seen[(SUMMARIZER, 2)]
    assert all(turn(s, 1) in first for s in ROLES)
    assert all(turn(s, 2) in second for s in ROLES)
    assert "SUMMARY(1)" in second and not any(turn(s, 1) in second for s in ROLES)
    summaries = [u for u in pred.transcripts[0] if u["speaker"] == SUMMARIZER]
    assert [(u["round"], u["kind"], u["text"]) for u in summaries] == [(1, "summary", "SUMMARY(1)"),
                                                                      (2, "summary", "SUMMARY(2)")]


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_single_round_sees_nothing_under_simultaneous_strategies(run, strategy):
    tagger, lm, program = debate(strategy, turns=1)
    run(program, lm, **ITEM)
    seen = [tagger.seen[(s, 1)] for s in ROLES]
    if strategy == "one_by_one":
        assert seen[0] == NOBODY and turn(ROLES[0], 1) in seen[1]
    else:
        assert seen == [NOBODY] * len(ROLES)
    assert tagger.summaries == 0


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_transcript_records_every_turn_with_round_and_kind(run, strategy):
    tagger, lm, program = debate(strategy, turns=2, roles=ROLES[:2])
    pred = run(program, lm, **ITEM)
    turns = [(u["speaker"], u["round"], u["kind"]) for u in pred.transcripts[0] if u["speaker"] != SUMMARIZER]
    assert turns == [(s, 1, "argument") for s in ROLES[:2]] + [(s, 2, "verdict") for s in ROLES[:2]]
    texts = {(u["speaker"], u["round"]): u["text"] for u in pred.transcripts[0]}
    assert texts[(ROLES[0], 1)] == turn(ROLES[0], 1)
    assert texts[(ROLES[1], 2)].startswith(turn(ROLES[1], 2) + " Prefers: answer 2. Scores:")
