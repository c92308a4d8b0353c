"""Saved evaluators (issue #3): JSON state + judge card, loaded back into an identical program."""

from __future__ import annotations

import json

import dspy
import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.store import CARD_FILE, PROGRAM_FILE, load_program, save_program
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.testing.fake_lm import fake_lm

ITEMS = [
    {"question": "q1", "answer_1": "short", "answer_2": "a much longer answer"},
    {"question": "q2", "answer_1": "a long and careful answer", "answer_2": "brief"},
]


def _compiled(tmp_path):
    cfg = DebateConfig(roles=("critic", "psychologist"), strategy="simultaneous_talk_with_summarizer", turns=2)
    program = build_evaluator(cfg)
    program.debate.referees["critic"].judge.demos = [
        dspy.Example(question="dq", answer_1="x", answer_2="y", persona="p", discussion="d", evidence="e",
                     score_1=7, score_2=3)]
    program.debate.referees["psychologist"].argue.signature = \
        program.debate.referees["psychologist"].argue.signature.with_instructions("Argue kindly.")
    path = save_program(program, tmp_path / "prog", make_card(program, model="fake/scripted", dataset="toy"))
    return program, path


def _run(program, items):
    lm = fake_lm()
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        preds = [program(**x) for x in items]
    return preds, [(c.system, c.user, c.n_messages) for c in lm.engine.calls]


def test_round_trip_gives_identical_prompts_and_predictions(tmp_path):
    program, path = _compiled(tmp_path)
    loaded, card = load_program(path)
    assert card["model"] == "fake/scripted" and card["config"]["strategy"] == "simultaneous_talk_with_summarizer"
    p1, calls1 = _run(program, ITEMS)
    p2, calls2 = _run(loaded, ITEMS)
    assert sorted(calls1) == sorted(calls2)  # same instructions, demos and inputs, call for call
    assert [p.preference for p in p1] == [p.preference for p in p2]
    assert [p.referees for p in p1] == [p.referees for p in p2]
    assert loaded.debate.referees["psychologist"].argue.signature.instructions == "Argue kindly."


def test_saved_directory_is_plain_json_with_a_card(tmp_path):
    _, path = _compiled(tmp_path)
    state = json.loads((path / PROGRAM_FILE).read_text())
    assert "debate.referees['critic'].judge" in state
    card = json.loads((path / CARD_FILE).read_text())
    assert {"model", "config", "roles", "versions", "created", "card_format"} <= set(card)
    assert card["versions"]["dspy"] == dspy.__version__
    assert [r["slug"] for r in card["roles"]] == ["critic", "psychologist"]
    assert (path / "card.md").read_text().startswith("# Judge card")


def test_loading_uses_personas_from_the_card_not_the_library(tmp_path):
    _, path = _compiled(tmp_path)
    card = json.loads((path / CARD_FILE).read_text())
    card["roles"][0]["personas"] = {"*": "A persona only the card knows."}
    (path / CARD_FILE).write_text(json.dumps(card))
    loaded, _ = load_program(path)
    assert loaded.debate.referees["critic"].persona == "A persona only the card knows."


def test_bad_directories_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="not a saved evaluator"):
        load_program(tmp_path)
    _, path = _compiled(tmp_path)
    card = json.loads((path / CARD_FILE).read_text())
    card["card_format"] = 99
    (path / CARD_FILE).write_text(json.dumps(card))
    with pytest.raises(ConfigError, match="card format 99"):
        load_program(path)


def test_corrupt_state_or_card_is_a_clear_error(tmp_path):
    _, path = _compiled(tmp_path)
    (path / PROGRAM_FILE).write_text('{"debate.referees[\'critic\'].judge": 42}')
    with pytest.raises(ConfigError, match="not a valid program state"):
        load_program(path)
    card = json.loads((path / CARD_FILE).read_text())
    del card["roles"]
    (path / CARD_FILE).write_text(json.dumps(card))
    with pytest.raises(ConfigError, match="malformed card"):
        load_program(path)


def test_card_says_when_its_cost_was_answered_from_the_cache(tmp_path):
    program = build_evaluator(DebateConfig())
    fresh = {"calls_per_item": 8.0, "cached_calls_per_item": 0.0, "prompt_tokens_per_item": 900.0}
    cached = {"calls_per_item": 8.0, "cached_calls_per_item": 8.0, "prompt_tokens_per_item": 0.0}
    path = save_program(program, tmp_path / "a", make_card(program, model="fake/scripted", cost=fresh))
    assert "LM cache" not in (path / "card.md").read_text()
    path = save_program(program, tmp_path / "b", make_card(program, model="fake/scripted", cost=cached))
    assert "8.0 of 8.0 calls per item were answered from the LM cache" in (path / "card.md").read_text()


def test_no_lm_or_logprobs_are_saved_and_dspy_still_reads_the_file(tmp_path):
    program = build_evaluator(DebateConfig(roles=("critic",), turns=1))
    judge = program.debate.referees["critic"].judge
    judge.lm = dspy.LM("openai/gpt-4o-mini", temperature=1.7)
    judge.demos = [dspy.Example(question="dq", answer_1="x", answer_2="y", persona="p", discussion="d", evidence="e",
                                score_1=7, score_2=3, augmented=True, logprobs={"content": [{"token": "7"}]})]
    path = save_program(program, tmp_path / "p", make_card(program, model="fake/scripted"))
    state = json.loads((path / PROGRAM_FILE).read_text())
    assert all(entry["lm"] is None for name, entry in state.items() if name != "metadata")
    assert "logprobs" not in state["debate.referees['critic'].judge"]["demos"][0]
    fresh = build_evaluator(program.config)
    fresh.load(str(path / PROGRAM_FILE))  # DSPy's own loader still reads what we write
    loaded, _ = load_program(path)
    assert loaded.debate.referees["critic"].judge.lm is None
    assert loaded.debate.referees["critic"].judge.demos[0]["score_1"] == 7
