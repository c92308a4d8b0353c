"""The memoising adapter sends exactly what DSPy's JSONAdapter sends, and notices when a signature changes."""

from __future__ import annotations

import gc

import dspy

from chateval_dspy.lm.adapter import JudgeAdapter
from chateval_dspy.program.signatures import PairwiseVerdict, ScoringArgument
from chateval_dspy.testing.fake_lm import fake_lm

INPUTS = {"question": "What is 2+2?", "answer_1": "4", "answer_2": "5", "persona": "You are strict.",
          "discussion": "(nothing yet)"}


def _requests(adapter, signature, inputs, times=2):
    lm = fake_lm()
    # without history: DSPy's own call log would otherwise keep every signature alive
    with dspy.context(lm=lm, adapter=adapter, disable_history=True):
        for _ in range(times):
            dspy.Predict(signature)(**inputs)
    return [(c.system, c.user, c.schema) for c in lm.engine.calls]


def test_prompts_and_schema_are_dspy_json_adapters_own():
    inputs = {k: v for k, v in INPUTS.items() if k in PairwiseVerdict.input_fields}
    ours = _requests(JudgeAdapter(), PairwiseVerdict, inputs)
    theirs = _requests(dspy.JSONAdapter(), PairwiseVerdict, inputs)
    assert ours == theirs
    assert ours[0][2]["properties"]["preference"]["enum"] == ["1", "2", "tie"]


def test_a_rewritten_instruction_reaches_the_prompt():
    adapter = JudgeAdapter()
    inputs = {k: v for k, v in INPUTS.items() if k in PairwiseVerdict.input_fields}
    first = _requests(adapter, PairwiseVerdict, inputs, times=1)
    rewritten = PairwiseVerdict.with_instructions("Prefer the shorter answer.")
    second = _requests(adapter, rewritten, inputs, times=1)
    assert "Prefer the shorter answer." in second[0][0]
    assert "Prefer the shorter answer." not in first[0][0]
    # a class whose docstring is reassigned in place is re-rendered too
    mutable = PairwiseVerdict.with_instructions("Version one.")
    _requests(adapter, mutable, inputs, times=1)
    mutable.instructions = "Version two."
    assert "Version two." in _requests(adapter, mutable, inputs, times=1)[0][0]


def test_each_signature_gets_its_own_schema():
    adapter = JudgeAdapter()
    pair = _requests(adapter, PairwiseVerdict, {k: v for k, v in INPUTS.items() if k in PairwiseVerdict.input_fields}, 1)
    scoring_inputs = {k: "x" for k in ScoringArgument.input_fields}
    score = _requests(adapter, ScoringArgument, scoring_inputs, 1)
    assert set(pair[0][2]["properties"]) != set(score[0][2]["properties"])


def test_memo_does_not_keep_discarded_signatures_alive():
    adapter = JudgeAdapter()
    for i in range(5):
        adapter.format_system_message(PairwiseVerdict.with_instructions(f"candidate {i}"))
    kept = PairwiseVerdict.with_instructions("kept")
    adapter.format_system_message(kept)
    gc.collect()
    assert list(adapter._memo.keys()) == [kept]  # an optimizer's discarded candidates are not held by the memo
