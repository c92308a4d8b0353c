"""OpenAICompatEngine: the wire body, error translation and usage, against a local stdlib HTTP server."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dspy
import pytest
from dspy import lm15

from chateval_dspy.lm.engine import DeadlineExceeded, OpenAICompatEngine, RestartingEngine
from chateval_dspy.testing.fake_server import FakeOpenAIServer

SCHEMA = {"type": "object", "properties": {"evidence": {"type": "string"}, "score_1": {"type": "integer"},
                                           "note": {"type": "string", "maxLength": 10}},
          "required": ["evidence", "score_1"]}
SECRET = "sk-test-DO-NOT-LEAK-1234"


def request(response_format=None, **config):
    return lm15.Request(model="m", messages=(lm15.Message.user("hi"),),
                        config=lm15.Config(response_format=response_format, **config))


def engine(**kwargs):
    return OpenAICompatEngine("http://127.0.0.1:9/v1", "served-model", api_key=SECRET, **kwargs)


# --- the request body -----------------------------------------------------------------------------------------


def test_json_schema_response_format_is_translated_for_openai():
    fmt = {"type": "json_schema", "schema": SCHEMA, "name": "PairwiseVerdict"}
    body = engine().request_body(request(fmt))
    assert body["response_format"] == {"type": "json_schema",
                                       "json_schema": {"name": "PairwiseVerdict", "schema": SCHEMA, "strict": True}}
    assert body["model"] == "served-model"
    assert body["messages"] == [{"role": "user", "content": "hi"}]


def test_strict_flag_and_default_name_pass_through():
    body = engine().request_body(request({"type": "json_schema", "schema": SCHEMA, "strict": False}))
    assert body["response_format"]["json_schema"]["strict"] is False
    assert body["response_format"]["json_schema"]["name"] == "output"


def test_compact_json_caps_strings_and_forbids_free_whitespace():
    fmt = {"type": "json_schema", "schema": SCHEMA, "name": "v"}
    body = engine(compact_json=True, max_string_chars=77).request_body(request(fmt))
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["evidence"]["maxLength"] == 77
    assert schema["properties"]["note"]["maxLength"] == 10  # an existing cap is kept
    assert "maxLength" not in schema["properties"]["score_1"]
    assert schema["x-guidance"]["whitespace_flexible"] is False
    assert "maxLength" not in SCHEMA["properties"]["evidence"] and "x-guidance" not in SCHEMA  # input not mutated


def test_without_compact_json_the_schema_is_unchanged():
    body = engine().request_body(request({"type": "json_schema", "schema": SCHEMA, "name": "v"}))
    assert body["response_format"]["json_schema"]["schema"] == SCHEMA


def test_other_response_formats_and_sampling_settings():
    body = engine().request_body(request({"type": "json_object"}, temperature=0.7, max_tokens=12, top_p=0.9, seed=3,
                                         stop=("END",)))
    assert body["response_format"] == {"type": "json_object"}
    assert (body["temperature"], body["max_tokens"], body["top_p"], body["seed"], body["stop"]) == (0.7, 12, 0.9, 3,
                                                                                                   ["END"])
    bare = engine().request_body(request())
    assert set(bare) == {"model", "messages"}


def test_system_prompt_comes_first():
    req = lm15.Request(model="m", system="be brief", messages=(lm15.Message.user("hi"),))
    assert engine().request_body(req)["messages"] == [{"role": "system", "content": "be brief"},
                                                       {"role": "user", "content": "hi"}]


def test_repr_never_shows_the_api_key():
    eng = engine()
    assert SECRET not in repr(eng) and SECRET not in str(eng)
    assert "served-model" in repr(eng)
    lm = dspy.LM("openai-compatible/served-model", engine=eng)
    assert SECRET not in repr(lm)
    with pytest.raises(TypeError):  # an LM over this engine refuses to be saved rather than writing the key
        lm.dump_state()


# --- against a tiny OpenAI-compatible server --------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - the stdlib's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        status, payload = self.server.reply
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for name, value in self.server.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.seen, httpd.reply, httpd.headers = [], (200, {}), {}
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def url(httpd):
    return f"http://127.0.0.1:{httpd.server_address[1]}/v1"


GOOD = {"id": "cmpl-1", "object": "chat.completion", "created": 0, "model": "served-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": '{"a": 1}'}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 4, "total_tokens": 15}}


def test_good_response_with_usage(server):
    server.reply = (200, GOOD)
    eng = OpenAICompatEngine(url(server), "served-model", api_key=SECRET, max_retries=0, timeout=5)
    fmt = {"type": "json_schema", "schema": SCHEMA, "name": "v"}
    response = eng.complete(request(fmt, temperature=0.0))
    eng.close()
    assert response.message.text == '{"a": 1}'
    assert response.finish_reason == "stop"
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == (11, 4, 15)
    (seen,) = server.seen
    assert seen["path"] == "/v1/chat/completions"
    assert seen["auth"] == f"Bearer {SECRET}"  # the key is sent, as a bearer token
    assert seen["body"]["response_format"]["type"] == "json_schema"
    assert seen["body"]["response_format"]["json_schema"]["schema"] == SCHEMA


def test_unknown_finish_reason_and_missing_usage(server):
    reply = json.loads(json.dumps(GOOD))
    reply["choices"][0]["finish_reason"] = "tool_calls"
    del reply["usage"]
    server.reply = (200, reply)
    response = OpenAICompatEngine(url(server), "m", max_retries=0, timeout=5).complete(request())
    assert response.finish_reason == "stop"
    assert response.usage.input_tokens == 0 and response.usage.total_tokens == 0


def test_http_500_is_a_server_error(server):
    server.reply = (500, {"error": {"message": "kaput", "type": "server_error"}})
    eng = OpenAICompatEngine(url(server), "m", max_retries=0, timeout=5)
    with pytest.raises(lm15.ServerError) as err:
        eng.complete(request())
    assert err.value.status == 500
    assert len(server.seen) == 1  # max_retries=0: no retry


def test_empty_choices_is_a_server_error(server):
    server.reply = (200, {**GOOD, "choices": []})
    with pytest.raises(lm15.ServerError, match="no choices"):
        OpenAICompatEngine(url(server), "m", max_retries=0, timeout=5).complete(request())


# A 429 is waited out, never raised as the call's error: tests/chateval_dspy/lm/test_rate_limits.py.
@pytest.mark.parametrize(("status", "error"), [(401, lm15.AuthError), (400, lm15.InvalidRequestError)])
def test_other_statuses(server, status, error):
    server.reply = (status, {"error": {"message": "nope", "type": "x"}})
    with pytest.raises(error):
        OpenAICompatEngine(url(server), "m", max_retries=0, timeout=5).complete(request())


def test_connection_refused_is_a_transport_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket is closed
    eng = OpenAICompatEngine(f"http://127.0.0.1:{port}/v1", "m", max_retries=0, timeout=2)
    with pytest.raises(lm15.TransportError, match="cannot connect"):
        eng.complete(request())


def test_engine_serves_a_dspy_program(server, run):
    """The engine behind dspy.LM: a one-referee debate parses the server's JSON."""
    from chateval_dspy.config import DebateConfig
    from chateval_dspy.program.chateval import build_evaluator

    reply = json.loads(json.dumps(GOOD))
    reply["choices"][0]["message"]["content"] = json.dumps({"evidence": "ok", "preference": "2", "score_1": 3, "score_2": 9})
    server.reply = (200, reply)
    eng = OpenAICompatEngine(url(server), "served-model", max_retries=0, timeout=5)
    lm = dspy.LM("openai-compatible/served-model", engine=eng, cache=False, num_retries=0)
    pred = run(build_evaluator(DebateConfig(roles=("critic",), turns=1, calibrate=False)), lm,
               question="q", answer_1="a", answer_2="b")
    assert pred.preference == "2" and pred.abstained is None
    assert server.seen[0]["body"]["response_format"]["json_schema"]["schema"]["properties"]["score_1"]


# --- retries and deadlines ---------------------------------------------------------------------------


def test_the_engine_is_the_only_layer_that_retries(server):
    """The openai client's own retries are off; the engine makes 1 + max_retries attempts."""
    server.reply = (503, {"error": {"message": "busy", "type": "server_error"}})
    eng = OpenAICompatEngine(url(server), "m", max_retries=2, timeout=5)
    assert eng.client.max_retries == 0
    with pytest.raises(lm15.ServerError):
        eng.complete(request())
    assert len(server.seen) == 3


def test_a_request_the_server_refuses_is_not_retried(server):
    """Only transient failures (timeouts, lost connections, 408/409/429, 5xx) are retried."""
    server.reply = (404, {"error": {"message": "no such route", "type": "x"}})
    with pytest.raises(lm15.ServerError):
        OpenAICompatEngine(url(server), "m", max_retries=2, timeout=5).complete(request())
    assert len(server.seen) == 1


def test_a_retry_after_past_the_deadline_ends_the_call_at_once(server):
    """Backoff never sleeps past the call deadline, not even for a server's Retry-After; a rate
    limit is no item's fault, so the call stops the run rather than becoming an abstention."""
    from chateval_dspy.lm.breaker import RateLimited

    server.reply, server.headers = (429, {"error": {"message": "slow down", "type": "x"}}), {"Retry-After": "100"}
    eng = OpenAICompatEngine(url(server), "m", max_retries=2, timeout=5, call_deadline=3)
    start = time.perf_counter()
    with pytest.raises(RateLimited, match="deadline"):
        eng.complete(request())
    seconds = time.perf_counter() - start
    print(f"\n429 with Retry-After 100 s under a 3 s call deadline: {seconds:.2f} s")
    assert len(server.seen) == 1 and seconds < 3


def test_a_hanging_server_is_cut_at_the_call_deadline_and_not_restarted():
    """A server that takes the request and never answers ends the call by its deadline;
    it is still there, so the engine that owns it does not restart it (only a lost server is restarted)."""
    restarts = []
    hanging = FakeOpenAIServer(hang=True)
    with hanging as base:
        eng = RestartingEngine(base, "m", restart=lambda: restarts.append(1) or base, timeout=0.5, max_retries=5,
                               call_deadline=1.5)
        start = time.perf_counter()
        with pytest.raises(DeadlineExceeded):
            eng.complete(request())
        seconds = time.perf_counter() - start
    print(f"\nhanging server, call deadline 1.5 s: {seconds:.2f} s, {len(hanging.requests)} attempt(s)")
    assert restarts == [] and eng.restarts == 0
    assert 1 <= len(hanging.requests) <= 3 and seconds < 1.5 + 5
