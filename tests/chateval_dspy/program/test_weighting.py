"""Logprob-weighted (G-Eval style) scores (issue #5)."""

from __future__ import annotations

import math

import dspy
import pytest
from dspy.lm15 import Message, Response, TextPart, TokenLogprob, TopLogprob, Usage, response_to_events

from chateval_dspy.config import DebateConfig
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.lm.engine import OpenAICompatEngine
from chateval_dspy.program.aggregate import mean_scores
from chateval_dspy.program.calibration import unswap_scores
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.weighting import expected_scores


def _tok(text, alts=()):
    return {"token": text, "logprob": math.log(alts[0][1]) if alts else 0.0,
            "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in alts]}


def test_expected_score_renormalises_over_valid_ratings_only():
    content = [_tok('{"evidence": "ok", "score_1": '), _tok("7", [("7", 0.5), ("8", 0.25), ("x", 0.2), ("0", 0.05)]),
               _tok(', "score_2": '), _tok("1", [("1", 0.9)]), _tok("0"), _tok("}")]
    out = expected_scores(content, {"score_1": (1, 10), "score_2": (1, 10)})
    # "x" and "0" are not ratings; a "10" in two tokens has no single distribution and is left out
    assert out == {"score_1": pytest.approx((7 * 0.5 + 8 * 0.25) / 0.75)}


class LogprobEngine:
    """Answers verdicts with scores 6/6 but puts more mass on 7 for answer 1 and on 5 for answer 2."""

    supports_response_schema = True
    supported_params = frozenset({"response_format", "temperature", "max_tokens", "logprobs", "top_logprobs"})

    def __init__(self):
        self.logprob_requests = []

    def complete(self, request):
        self.logprob_requests.append(request.config.logprobs)
        props = (request.config.response_format or {}).get("schema", {}).get("properties", {})
        if "argument" in props:
            return self._reply([("{\"argument\": \"fine\"}", None)])
        user = request.messages[-1].text
        first_long = user.index("LONG") < user.index("SHORT")
        hi, lo = (("7", 0.3), ("5", 0.1)), (("5", 0.3), ("7", 0.1))
        return self._reply([('{"evidence": "e", "preference": "tie", "score_1": ', None),
                            ("6", (("6", 0.6),) + (hi if first_long else lo)),
                            (', "score_2": ', None), ("6", (("6", 0.6),) + (lo if first_long else hi)), ("}", None)])

    def _reply(self, pieces):
        text = "".join(t for t, _ in pieces)
        logprobs = tuple(TokenLogprob(t, math.log(a[0][1]) if a else 0.0,
                                      top=tuple(TopLogprob(x, math.log(p)) for x, p in (a or ())))
                         for t, a in pieces)
        return Response(id=None, model="lp", message=Message.assistant([TextPart(text)]), finish_reason="stop",
                        usage=Usage(input_tokens=1, output_tokens=1, total_tokens=2), logprobs=logprobs)

    def stream(self, request):
        return response_to_events(self.complete(request))

    def close(self):
        pass


def test_weighted_scores_break_a_tie_the_integers_cannot():
    item = {"question": "q", "answer_1": "LONG answer", "answer_2": "SHORT"}
    engine = LogprobEngine()
    lm = dspy.LM("lp/x", engine=engine, cache=False)
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        plain = build_evaluator(DebateConfig(roles=("critic",), turns=1))(**item)
        weighted = build_evaluator(DebateConfig(roles=("critic",), turns=1, weighted_scores=True))(**item)
    assert plain.preference == "tie" and (plain.score_1, plain.score_2) == (6, 6)
    assert weighted.preference == "1" and weighted.consistent
    assert weighted.score_1 == pytest.approx((6 * 0.6 + 7 * 0.3 + 5 * 0.1) / 1.0)
    assert weighted.referees["critic"][1]["expected"]["score_1"] == pytest.approx(weighted.score_1)  # unswapped
    assert engine.logprob_requests == [None, None, 10, 10]  # only weighted verdicts ask for logprobs


def test_unswap_and_mean_use_the_expected_scores():
    v = {"preference": "1", "score_1": 7, "score_2": 3, "expected": {"score_1": 6.5, "score_2": 3.5}}
    assert unswap_scores(v)["expected"] == {"score_1": 3.5, "score_2": 6.5}
    assert mean_scores([v, {"score_1": 5, "score_2": 5, "preference": "tie"}]) == {"score_1": 5.75, "score_2": 4.25}


def test_engine_asks_for_and_returns_logprobs():
    from dspy.lm15 import Config, Request

    engine = OpenAICompatEngine("http://127.0.0.1:9/v1", "m")
    body = engine.request_body(Request(model="m", messages=(Message.user("hi"),), config=Config(logprobs=5)))
    assert body["logprobs"] is True and body["top_logprobs"] == 5
    assert "logprobs" not in engine.request_body(Request(model="m", messages=(Message.user("hi"),)))
