"""Fake-LM responders shared by test modules."""

from __future__ import annotations

from chateval_dspy.testing.fake_lm import default_responder


def by_length(call):
    """The default answers, but verdict scores that differ per item and answer order (each answer's length modulo
    10), so that equal verdicts mean something and a cross-wired answer shows."""
    out = default_responder(call)
    if call.kind == "verdict" and "score_1" in out:
        a1, a2 = call.inputs.get("answer_1", ""), call.inputs.get("answer_2", "")
        out = {**out, "score_1": 1 + len(a1) % 10, "score_2": 1 + len(a2) % 10}
    return out
