"""The billing fakes: OpenAI's and Anthropic's prompt-caching rules, the HTTP fakes' usage, and the billed engine.

The rules are tested with one token per character, so thresholds are exact; the fakes with o200k_base tokens.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
import warnings

import dspy
import pytest

from chateval_dspy.testing.billing import (
    AnthropicCaching,
    Bill,
    CacheControlError,
    OpenAICaching,
    Segment,
    anthropic_min_tokens,
    billed_lm,
    chat_segments,
    o200k,
    o200k_tokens,
)
from chateval_dspy.testing.fake_anthropic import FakeAnthropicServer
from chateval_dspy.testing.fake_server import FakeOpenAIServer


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def segs(*texts: str, marks: tuple[int, ...] = ()) -> list[Segment]:
    return [Segment(t, i in marks) for i, t in enumerate(texts)]


# -- OpenAI's rule -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("shared", "cached"), [(1023, 0), (1024, 1024), (1100, 1024), (1151, 1024), (1152, 1152),
                                                (1300, 1280)])
def test_openai_counts_a_shared_prefix_from_1024_in_steps_of_128(shared, cached):
    billing = OpenAICaching(encode=chars)
    assert billing.bill(segs("a" * 3000)).cache_read_tokens == 0  # a cold cache
    bill = billing.bill(segs("a" * shared + "b" * 500))
    assert bill == Bill(prompt_tokens=shared + 500, cache_read_tokens=cached)
    assert bill.openai_usage(7) == {"prompt_tokens": shared + 500, "completion_tokens": 7,
                                    "total_tokens": shared + 507, "prompt_tokens_details": {"cached_tokens": cached}}


def test_openai_repeats_round_down_and_never_exceed_the_prompt():
    billing = OpenAICaching(encode=chars)
    assert [billing.bill(segs("x" * 1100)).cache_read_tokens for _ in range(2)] == [0, 1024]
    assert billing.bill(segs("x" * 1000)).cache_read_tokens == 0  # all of it is shared, but under 1,024


def test_openai_cache_spans_requests_per_model():
    billing = OpenAICaching(encode=chars)
    first, other = "p" * 1500, "q" * 1500
    billing.bill(segs(first, "one"), model="m")
    billing.bill(segs(other, "two"), model="m")
    assert billing.bill(segs(first, "three"), model="m").cache_read_tokens == 1408  # 1,500 shared, after another
    assert billing.bill(segs(first, "three"), model="n").cache_read_tokens == 0  # another model, another cache
    billing.reset()
    assert billing.bill(segs(first, "three"), model="m").cache_read_tokens == 0


def test_o200k_loads_offline_and_leaves_the_environment_alone():
    before = os.environ.get("TIKTOKEN_CACHE_DIR")
    o200k.cache_clear()
    assert o200k().name == "o200k_base"
    assert os.environ.get("TIKTOKEN_CACHE_DIR") == before
    assert len(o200k_tokens(" word" * 100)) == 100


def test_openai_bills_o200k_tokens_of_chat_messages():
    system = "You judge answers. " * 300
    first = chat_segments(system, [{"role": "user", "content": "Question: one?"}])
    second = chat_segments(None, [{"role": "system", "content": system}, {"role": "user", "content": "Question: 2?"}])
    a, b = [t for s in first for t in o200k_tokens(s.text)], [t for s in second for t in o200k_tokens(s.text)]
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    billing = OpenAICaching()
    assert billing.bill(first) == Bill(len(a), 0)
    assert billing.bill(second) == Bill(len(b), 1024 + (shared - 1024) // 128 * 128)


# -- Anthropic's rule ----------------------------------------------------------------------------------------------

def test_anthropic_writes_then_reads_at_a_breakpoint():
    billing = AnthropicCaching(encode=chars, min_tokens=1024)
    assert billing.bill(segs("s" * 1200, "question one", marks=(0,))) == Bill(1212, 0, 1200)
    second = billing.bill(segs("s" * 1200, "question 2", marks=(0,)))
    assert second == Bill(1210, 1200, 0)
    assert second.anthropic_usage(5) == {"input_tokens": 10, "cache_read_input_tokens": 1200,
                                         "cache_creation_input_tokens": 0, "output_tokens": 5}


def test_anthropic_writes_only_what_follows_the_read_prefix():
    billing = AnthropicCaching(encode=chars, min_tokens=1024)
    billing.bill(segs("s" * 1200, "d" * 600, "q1", marks=(0, 1)))
    assert billing.bill(segs("s" * 1200, "e" * 600, "q2", marks=(0, 1))) == Bill(1802, 1200, 600)
    assert billing.bill(segs("s" * 1200, "e" * 600, "q3", marks=(0, 1))) == Bill(1802, 1800, 0)


def test_anthropic_ignores_prefixes_under_the_minimum():
    billing = AnthropicCaching(encode=chars, min_tokens=1024)
    for _ in range(2):
        assert billing.bill(segs("s" * 1000, "q", marks=(0,))) == Bill(1001, 0, 0)
    # A short first breakpoint adds nothing; a long enough second one writes the whole prefix up to it.
    assert billing.bill(segs("s" * 1000, "t" * 100, "q", marks=(0, 1))) == Bill(1101, 0, 1100)


def test_anthropic_minimum_by_model():
    assert anthropic_min_tokens("anthropic/claude-3-5-haiku-20241022") == 2048
    assert anthropic_min_tokens("claude-3-haiku-20240307") == 2048
    assert anthropic_min_tokens("anthropic/claude-sonnet-4-5") == 1024
    assert anthropic_min_tokens("claude-3-7-sonnet-latest") == 1024
    billing = AnthropicCaching(encode=chars)
    prompt = segs("s" * 1500, "q", marks=(0,))
    billing.bill(prompt, model="claude-3-5-haiku-20241022")
    billing.bill(prompt, model="claude-sonnet-4-5")
    assert billing.bill(prompt, model="claude-3-5-haiku-20241022").cache_read_tokens == 0
    assert billing.bill(prompt, model="claude-sonnet-4-5").cache_read_tokens == 1500


@pytest.mark.parametrize(("between", "read"), [(19, 1200), (20, 1200), (21, 0)])
def test_anthropic_looks_back_20_blocks_for_a_written_prefix(between, read):
    billing = AnthropicCaching(encode=chars, min_tokens=1024)
    blocks = ["s" * 1200] + [f"b{i:02d}" for i in range(between)]
    billing.bill(segs(*blocks, marks=(0,)))
    bill = billing.bill(segs(*blocks, marks=(between,)))  # only the last block is marked now
    assert (bill.cache_read_tokens, bill.cache_write_tokens) == (read, 1200 + 3 * between - read)


def test_anthropic_refuses_more_than_four_breakpoints():
    billing = AnthropicCaching(encode=chars)
    assert billing.bill(segs(*"abcd", marks=(0, 1, 2, 3))) == Bill(4, 0, 0)
    with pytest.raises(CacheControlError, match="A maximum of 4 blocks with cache_control may be provided. Found 5"):
        billing.bill(segs(*"abcde", marks=(0, 1, 2, 3, 4)))


def test_chat_segments_mark_blocks_and_open_messages_with_roles():
    out = chat_segments([{"type": "text", "text": "S", "cache_control": {"type": "ephemeral"}}],
                        [{"role": "user", "content": [{"type": "text", "text": "A", "cache_control": {"type": "ephemeral"}},
                                                      {"type": "text", "text": "B"}]},
                         {"role": "assistant", "content": "C"}])
    assert out == [Segment("<|system|>\nS", True), Segment("<|user|>\nA", True), Segment("B"),
                   Segment("<|assistant|>\nC")]
    assert chat_segments("S", []) == chat_segments(None, [{"role": "system", "content": "S"}])


# -- HTTP fakes ----------------------------------------------------------------------------------------------------

LONG_SYSTEM = "Judge the two answers on accuracy and helpfulness, citing the question. " * 200  # ~2,600 tokens


def test_fake_openai_server_reports_cached_tokens_to_the_openai_client():
    import openai

    with FakeOpenAIServer(billing=OpenAICaching()) as base:
        client = openai.OpenAI(base_url=base, api_key="x", max_retries=0)
        usages = [client.chat.completions.create(model="fake-served", messages=[
            {"role": "system", "content": LONG_SYSTEM}, {"role": "user", "content": f"[[ ## q ## ]]\n{q}"}]).usage
            for q in ("first?", "second?")]
    assert usages[0].prompt_tokens_details.cached_tokens == 0
    cached = usages[1].prompt_tokens_details.cached_tokens
    assert 1024 <= cached <= usages[1].prompt_tokens and (cached - 1024) % 128 == 0
    assert usages[1].prompt_tokens - cached < 128 + 20  # only the question and the rounding are uncached
    assert usages[1].total_tokens == usages[1].prompt_tokens + usages[1].completion_tokens


def test_fake_openai_server_without_billing_keeps_its_usage():
    with FakeOpenAIServer() as base:
        request = urllib.request.Request(base + "/chat/completions", method="POST", data=json.dumps(
            {"model": "m", "messages": [{"role": "user", "content": "x" * 40}]}).encode())
        usage = json.loads(urllib.request.urlopen(request).read())["usage"]
    assert usage == {"prompt_tokens": 10, "completion_tokens": usage["completion_tokens"],
                     "total_tokens": usage["total_tokens"]}


def _post(base: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(base + "/v1/messages", method="POST", data=json.dumps(body).encode())
    try:
        with urllib.request.urlopen(request) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_fake_anthropic_server_refuses_five_breakpoints_like_the_api():
    block = {"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}
    with FakeAnthropicServer() as base:
        status, body = _post(base, {"model": "claude-sonnet-4-5", "max_tokens": 10,
                                    "messages": [{"role": "user", "content": [block] * 5}]})
    assert status == 400 and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error" and "Found 5" in body["error"]["message"]


def _marked_messages(question: str) -> list[dict]:
    mark = {"type": "ephemeral"}
    return [{"role": "system", "content": [{"type": "text", "text": LONG_SYSTEM, "cache_control": mark}]},
            {"role": "user", "content": [{"type": "text", "text": "[[ ## q ## ]]\n", "cache_control": mark},
                                         {"type": "text", "text": question}]}]


def test_cache_control_survives_dspy_and_litellm_to_the_anthropic_wire():
    server = FakeAnthropicServer()
    with server as base, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # messages= dicts are deprecated for DSPy 3.5
        lm = dspy.LM("anthropic/claude-3-5-haiku-20241022", engine="litellm", api_base=base, api_key="x", cache=False)
        lm(messages=_marked_messages("first?"))
        lm(messages=_marked_messages("second?"))
    sent = server.requests[0]
    assert sent["path"] == "/v1/messages"
    assert sent["body"]["system"] == _marked_messages("")[0]["content"]  # blocks and marks unchanged
    assert sent["body"]["messages"] == _marked_messages("first?")[1:]
    first, second = server.bills
    assert first.cache_read_tokens == 0 and first.cache_write_tokens > 2048  # the system block and the user marker
    assert (second.cache_read_tokens, second.cache_write_tokens) == (first.cache_write_tokens, 0)
    usage = lm.history[-1]["usage"]  # as LiteLLM reads the Anthropic usage
    assert usage["cache_read_input_tokens"] == second.cache_read_tokens
    assert usage["prompt_tokens"] == second.prompt_tokens  # LiteLLM adds the three input counters back up
    assert usage["prompt_tokens_details"]["cached_tokens"] == second.cache_read_tokens


class MarkedJSON(dspy.JSONAdapter):
    """Marks the end of the system prompt, as a caching-aware adapter would."""

    def format(self, signature, demos, inputs):
        messages = super().format(signature, demos, inputs)
        head = {"role": "system", "content": [{"type": "text", "text": messages[0]["content"],
                                                "cache_control": {"type": "ephemeral"}}]}
        return [head, *messages[1:]]


@pytest.mark.parametrize("model", ["anthropic/claude-sonnet-4-5", "anthropic/claude-3-5-haiku-20241022"])
def test_fake_anthropic_server_answers_dspy_predict_through_litellm(model):
    server = FakeAnthropicServer()
    with server as base, dspy.context(lm=dspy.LM(model, engine="litellm", api_base=base, api_key="x", cache=False),
                                      adapter=MarkedJSON()):
        assert dspy.Predict("question -> answer")(question="Why?").answer == "answer from the fake LM"
    body = server.requests[0]["body"]
    assert body["system"][0]["cache_control"] == {"type": "ephemeral"}  # an adapter's marks reach the wire too
    # LiteLLM asks newer models for native structured output; 3.5 Haiku gets JSON mode, which LiteLLM drops.
    assert ("output_format" in body) == ("sonnet" in model)


def test_fake_anthropic_server_answers_litellms_json_tool():
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    server = FakeAnthropicServer()
    with server as base, warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        lm = dspy.LM("anthropic/claude-3-5-haiku-20241022", engine="litellm", api_base=base, api_key="x", cache=False)
        out = lm(messages=[{"role": "user", "content": "Why?"}],
                 response_format={"type": "json_schema", "json_schema": {"name": "out", "schema": schema}})
    assert json.loads(out[0]) == {"answer": "answer from the fake LM"}
    body = server.requests[0]["body"]
    assert body["tool_choice"]["name"] == "json_tool_call" and body["tools"][0]["input_schema"] == schema


# -- The billed engine ---------------------------------------------------------------------------------------------

def test_billed_engine_reports_openai_style_usage():
    lm = billed_lm()
    predict = dspy.Predict(dspy.Signature("question -> answer", LONG_SYSTEM))
    with dspy.context(lm=lm, adapter=dspy.JSONAdapter()):
        predict(question="first?")
        predict(question="second?")
    first, second = lm.engine.bills
    assert first.cache_read_tokens == 0 and second.cache_read_tokens >= 2048
    assert second.prompt_tokens - second.cache_read_tokens < 200
    request = dspy.lm15.Request(model="fake/billed", messages=(dspy.lm15.Message.user("second?"),),
                                system=LONG_SYSTEM)
    usage = lm.engine.complete(request).usage
    assert usage.input_tokens == lm.engine.bills[-1].prompt_tokens
    assert usage.cache_read_tokens == lm.engine.bills[-1].cache_read_tokens and usage.cache_write_tokens is None
    assert usage.output_tokens > 0 and lm.engine.calls[0].outputs == ["answer"]
