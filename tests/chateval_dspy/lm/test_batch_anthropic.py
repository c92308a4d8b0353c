"""Anthropic Message Batches: the OpenAI <-> Anthropic translation, and the provider against the fake server."""

from __future__ import annotations

import json
import time
import traceback

import httpx
import pytest

from chateval_dspy.errors import ConfigError, FatalLMError
from chateval_dspy.lm.batch import anthropic as batches
from chateval_dspy.lm.batch.anthropic import AnthropicBatches, chat_completion, messages_params
from chateval_dspy.lm.batch.provider import BatchRequest
from chateval_dspy.testing.fake_anthropic import FakeAnthropicServer

SYSTEM = "Judge the two answers on accuracy and helpfulness, citing the question. " * 200  # ~2,600 tokens
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
KEY = "sk-ant-test-SECRET-0123456789"


def body(question: str, schema: dict | None = SCHEMA) -> dict:
    out = {"model": "anthropic/claude-sonnet-4-5", "temperature": 0.0, "max_tokens": 200,
           "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}
    if schema:
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "v", "schema": schema, "strict": True}}
    return out


def echo(call) -> dict:
    return {"answer": f"re: {call.user}"}


def requests(*ids: str) -> list[BatchRequest]:
    return [BatchRequest(i, body(f"question {i}")) for i in ids]


def wait(provider: AnthropicBatches, batch_id: str, limit: float = 10.0):
    deadline = time.monotonic() + limit
    while not (state := provider.state(batch_id)).terminal:
        assert time.monotonic() < deadline, state
        time.sleep(0.05)
    return state


# -- translation -----------------------------------------------------------------------------------------------------

def test_the_system_text_becomes_one_block_marked_for_caching():
    params = messages_params({"model": "claude-3-5-haiku-20241022", "temperature": 0.3, "stop": ["X", "Y"],
                              "messages": [{"role": "system", "content": "Rules."},
                                           {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                                           {"role": "user", "content": "Q2"}]})
    assert params == {"model": "claude-3-5-haiku-20241022", "max_tokens": 1024, "temperature": 0.3,
                      "system": [{"type": "text", "text": "Rules.", "cache_control": {"type": "ephemeral"}}],
                      "messages": [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
                                   {"role": "user", "content": "Q2"}],
                      "stop_sequences": ["X", "Y"]}
    assert "system" not in messages_params({"model": "m", "messages": [{"role": "user", "content": "hi"}]})


def test_a_json_schema_becomes_the_forced_json_tool():
    params = messages_params(body("q"))
    assert params["model"] == "claude-sonnet-4-5" and params["max_tokens"] == 200
    assert params["tools"] == [{"name": "json_tool_call", "input_schema": SCHEMA}]
    assert params["tool_choice"] == {"type": "tool", "name": "json_tool_call"}
    assert "tools" not in messages_params(body("q", schema=None))


def test_a_request_without_a_model_or_with_a_tool_message_is_refused():
    with pytest.raises(ConfigError, match="no model"):
        messages_params({"messages": []})
    with pytest.raises(ConfigError, match="'tool'"):
        messages_params({"model": "m", "messages": [{"role": "tool", "content": "x"}]})


def test_an_answer_maps_to_a_chat_completion_with_cache_reads_and_writes():
    out = chat_completion({"id": "msg_9", "model": "claude-x", "stop_reason": "max_tokens",
                           "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}],
                           "usage": {"input_tokens": 40, "cache_read_input_tokens": 2000,
                                     "cache_creation_input_tokens": 600, "output_tokens": 7}})
    assert out["object"] == "chat.completion" and out["id"] == "msg_9" and out["model"] == "claude-x"
    assert out["choices"][0]["message"] == {"role": "assistant", "content": "Hello, world"}
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["usage"] == {"prompt_tokens": 2640, "completion_tokens": 7, "total_tokens": 2647,
                            "prompt_tokens_details": {"cached_tokens": 2000},
                            "cache_read_input_tokens": 2000, "cache_creation_input_tokens": 600}


@pytest.mark.parametrize("message", [None, {"content": "text"}, {"content": [{"type": "text", "text": 5}]},
                                     {"content": [], "usage": {"input_tokens": -1}},
                                     {"content": [{"type": "text", "text": "x" * (batches.MAX_TEXT_CHARS + 1)}]}])
def test_a_malformed_or_oversized_answer_is_refused(message):
    with pytest.raises(ValueError):
        chat_completion(message)


# -- against the fake ------------------------------------------------------------------------------------------------

def test_a_batch_runs_to_completion_and_its_answers_come_back_as_chat_completions():
    server = FakeAnthropicServer(echo, batch_delay=0.3, api_key=KEY)
    with server as base, AnthropicBatches(api_key=KEY, base_url=base + "/v1", retries=0) as provider:
        batch_id = provider.submit(requests("a", "b", "c"), label="wave-1")
        first = provider.state(batch_id)
        assert (first.status, first.detail, first.counts) == ("in_progress", "in_progress",
                                                              {"total": 3, "completed": 0, "failed": 0})
        state = wait(provider, batch_id)
        outcomes = provider.outcomes(batch_id, "abc")
        assert provider.find("wave-1") is None  # Anthropic batches carry no label
    assert (state.status, state.detail, state.counts) == ("completed", "ended", {"total": 3, "completed": 3, "failed": 0})
    assert [o.custom_id for o in outcomes] == ["a", "b", "c"] and all(o.error is None for o in outcomes)
    assert [json.loads(o.body["choices"][0]["message"]["content"]) for o in outcomes] == [
        {"answer": f"re: question {i}"} for i in "abc"]
    sent = server.requests[0]
    assert sent["path"] == "/v1/messages/batches" and sent["headers"]["anthropic-version"] == "2023-06-01"
    assert sent["body"]["requests"][0]["params"]["system"][0]["cache_control"] == {"type": "ephemeral"}
    assert server.batch_ids == [batch_id] and server.submitted == {"a": 1, "b": 1, "c": 1}
    # The shared system prefix is written by the first request and read by the others, as billed.
    usage = [o.body["usage"] for o in outcomes]
    assert usage[0]["cache_creation_input_tokens"] > 1024 and usage[0]["prompt_tokens_details"]["cached_tokens"] == 0
    assert usage[1]["prompt_tokens_details"]["cached_tokens"] == usage[0]["cache_creation_input_tokens"]
    assert [u["prompt_tokens"] for u in usage] == [b.prompt_tokens for b in server.bills]


def test_expired_requests_have_no_outcome_and_a_resubmission_answers_them():
    server = FakeAnthropicServer(echo, expire_batches=1)
    with server as base, AnthropicBatches(api_key=KEY, base_url=base) as provider:
        first = provider.submit(requests("a", "b", "c", "d"), label="x")
        state = wait(provider, first)
        assert (state.status, state.counts) == ("expired", {"total": 4, "completed": 2, "failed": 0})
        assert [o.custom_id for o in provider.outcomes(first, "abcd")] == ["a", "b"]
        again = provider.submit(requests("c", "d"), label="y")
        assert wait(provider, again).status == "completed"
        assert [o.custom_id for o in provider.outcomes(again, "cd") if o.body] == ["c", "d"]
    assert server.submitted == {"a": 1, "b": 1, "c": 2, "d": 2} and server.batch_ids == [first, again]
    assert len(server.bills) == 4  # expired requests are not billed


@pytest.mark.parametrize(("kind", "status"), [("overloaded_error", 529), ("invalid_request_error", 400),
                                              ("rate_limit_error", 429), ("api_error", 500), ("made_up_error", None)])
def test_an_errored_request_carries_its_http_status_and_succeeds_when_resubmitted(kind, status):
    with FakeAnthropicServer(echo, fail={"b": kind}) as base, AnthropicBatches(api_key=KEY, base_url=base) as provider:
        first = provider.submit(requests("a", "b"), label="x")
        assert wait(provider, first).counts == {"total": 2, "completed": 1, "failed": 1}
        a, b = provider.outcomes(first, "ab")
        again = provider.submit(requests("b"), label="y")
        wait(provider, again)
        (retried,) = provider.outcomes(again, "b")
    assert a.body and b.body is None and b.error == {"status": status, "code": kind, "message": f"fake {kind}"}
    assert retried.error is None and retried.body


def test_the_key_appears_in_no_repr_and_no_error():
    with FakeAnthropicServer(api_key="the-right-key") as base:
        provider = AnthropicBatches(api_key=KEY, base_url=base, retries=0)
        with pytest.raises(FatalLMError, match="HTTP 401") as refused:
            provider.submit(requests("a"), label="x")
        with pytest.raises(FatalLMError, match="msgbatch_nope") as missing:
            provider.state("msgbatch_nope")
    with pytest.raises(FatalLMError, match="ConnectError") as unreachable:  # the server is gone
        provider.state("msgbatch_gone")
    for text in [repr(provider), str(provider.__dict__)] + [
            "".join(traceback.format_exception(e.type, e.value, e.tb)) for e in (refused, missing, unreachable)]:
        assert KEY not in text
    provider.close()


def test_the_key_comes_from_the_environment_and_its_absence_is_a_config_error(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/")
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicBatches()
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    assert repr(AnthropicBatches()) == "AnthropicBatches(base_url='http://127.0.0.1:9')"


@pytest.mark.parametrize("custom_id", ["", "a.b", "a b", "x" * 65, "é"])
def test_a_custom_id_anthropic_would_refuse_is_refused_before_submitting(custom_id):
    provider = AnthropicBatches(api_key=KEY, base_url="http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="custom_id"):
        provider.submit([BatchRequest(custom_id, body("q"))], label="x")
    with pytest.raises(ConfigError, match="twice"):
        provider.submit(requests("a", "a"), label="x")


# -- untrusted answers -----------------------------------------------------------------------------------------------

def scripted(results: bytes, results_url: str = "http://api.test/v1/messages/batches/msgbatch_1/results",
             status: int = 200, **settings) -> AnthropicBatches:
    """A provider whose API is a script: batch msgbatch_1 has ended with ``results``."""
    batch = {"id": "msgbatch_1", "processing_status": "ended", "results_url": results_url,
             "request_counts": {"processing": 0, "succeeded": 1, "errored": 0, "canceled": 0, "expired": 0}}

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/results"):
            return httpx.Response(status, content=results)
        return httpx.Response(200, json=batch)

    provider = AnthropicBatches(api_key=KEY, base_url="http://api.test", retries=0, **settings)
    provider._client = httpx.Client(transport=httpx.MockTransport(handle), headers=provider._client.headers)
    return provider


def ok(custom_id: str) -> bytes:
    message = {"id": "m", "model": "c", "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}
    return json.dumps({"custom_id": custom_id, "result": {"type": "succeeded", "message": message}}).encode()


@pytest.mark.parametrize("bad", [b"not json", b"[1, 2]", b'{"custom_id": 7}', b'{"custom_id": "a/../b"}'])
def test_a_results_line_without_a_custom_id_names_the_batch_and_line(bad):
    with pytest.raises(FatalLMError, match="batch msgbatch_1 results line 2 "):
        scripted(ok("a") + b"\n" + bad + b"\n" + ok("b")).outcomes("msgbatch_1", "ab")


def test_a_malformed_answer_is_that_requests_error_not_the_batchs():
    bad = json.dumps({"custom_id": "b", "result": {"type": "succeeded", "message": {"content": "x"}}}).encode()
    a, b = scripted(ok("a") + b"\n\n" + bad).outcomes("msgbatch_1", "ab")  # a blank line is no request
    assert a.body["choices"][0]["message"]["content"] == "hi"
    assert b.body is None and b.error["status"] is None and b.error["code"] == "bad_result"


def test_results_over_the_cap_or_on_another_host_are_refused():
    with pytest.raises(FatalLMError, match="cap"):
        scripted(b"\n".join(ok(f"r{i}") for i in range(5)), max_results_bytes=100).outcomes("msgbatch_1", ["r0"])
    with pytest.raises(FatalLMError, match="not on http://api.test"):
        scripted(ok("a"), results_url="http://elsewhere.test/results").outcomes("msgbatch_1", "a")
    with pytest.raises(FatalLMError, match="HTTP 500"):
        scripted(b'{"type": "error", "error": {"type": "api_error", "message": "boom"}}', status=500).outcomes(
            "msgbatch_1", "a")


def test_reads_are_retried_on_a_transient_fault_and_a_submission_never_is(monkeypatch):
    monkeypatch.setattr(batches.time, "sleep", lambda s: None)
    calls = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        if len(calls) % 2:  # every other call is overloaded
            return httpx.Response(529, json={"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
        return httpx.Response(200, json={"id": "msgbatch_1", "processing_status": "in_progress", "request_counts": {}})

    provider = AnthropicBatches(api_key=KEY, base_url="http://api.test", retries=1)
    provider._client = httpx.Client(transport=httpx.MockTransport(handle))
    assert provider.state("msgbatch_1").status == "in_progress" and calls == ["GET", "GET"]
    with pytest.raises(FatalLMError, match="HTTP 529"):
        provider.submit(requests("a"), label="x")
    assert calls == ["GET", "GET", "POST"]
