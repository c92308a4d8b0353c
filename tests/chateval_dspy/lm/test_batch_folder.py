"""Folder batches: a wave's input file for vLLM's offline runner, and its output file read back.

``data/vllm_run_batch_output.jsonl`` is laid out as vLLM 0.8's ``run_batch`` writes it (one
``BatchRequestOutput.model_dump_json()`` a line, from ``vllm/entrypoints/openai/run_batch.py`` and the
``ChatCompletionResponse`` / ``ErrorResponse`` models of ``vllm/entrypoints/openai/protocol.py``): ids
``vllm-<hex>`` and ``vllm-batch-<hex>``, ``chat.completion`` bodies, and for request-3 a 400 (context too long)
with no body and the flat ``ErrorResponse`` in ``error``. The other error shapes vLLM writes (a bare string from
``make_error_request_output``; the nested ``{"error": {...}}`` of vLLM 0.10 on) are written inline below.
"""

from __future__ import annotations

import json
import logging
import shlex
import shutil

import pytest
from repo_paths import TEST_DATA

from chateval_dspy.errors import ConfigError, FatalLMError
from chateval_dspy.lm.batch.folder import FolderBatches
from chateval_dspy.lm.batch.provider import BatchRequest

RECORDED = TEST_DATA / "vllm_run_batch_output.jsonl"
MODEL = "Qwen/Qwen2.5-1.5B-Instruct"
ASKED = ["request-1", "request-2", "request-3"]  # the custom_ids of ``requests()``, as the driver journals them


def requests(n=3, model="gpt-4o-mini"):
    return [BatchRequest(f"request-{i}", {"model": model, "messages": [{"role": "user", "content": f"q{i}"}],
                                          "max_tokens": 64}) for i in range(1, n + 1)]


def lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def answer(custom_id, content="ok", **extra):
    """An output line as vLLM writes a successful one."""
    body = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "tool_calls": []},
                         "logprobs": None, "finish_reason": "stop", "stop_reason": None}],
            "usage": {"prompt_tokens": 3, "total_tokens": 4, "completion_tokens": 1}}
    return {"id": "vllm-1", "custom_id": custom_id, "response": {"status_code": 200, "request_id": "vllm-batch-1",
                                                                  "body": body}, "error": None, **extra}


def write(path, records, tail=""):
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail, encoding="utf-8")


@pytest.fixture
def wave(tmp_path):
    batches = FolderBatches(tmp_path / "waves", model=MODEL)
    batches.submit(requests(), "w1")
    return batches


def test_submit_writes_openai_batch_lines_with_the_served_model(tmp_path):
    batches = FolderBatches(tmp_path / "waves", model=MODEL)
    sent = requests()
    assert batches.submit(sent, "w1") == "w1"
    path = tmp_path / "waves" / "w1.input.jsonl"
    assert path.read_bytes().endswith(b"\n")
    written = lines(path)
    assert [set(line) for line in written] == [{"custom_id", "method", "url", "body"}] * 3
    assert [line["custom_id"] for line in written] == ["request-1", "request-2", "request-3"]
    assert {(line["method"], line["url"]) for line in written} == {("POST", "/v1/chat/completions")}
    assert [line["body"] for line in written] == [{**r.body, "model": MODEL} for r in sent]
    assert sent[0].body["model"] == "gpt-4o-mini"  # the caller's body is left alone
    assert sorted(p.name for p in (tmp_path / "waves").iterdir()) == ["w1.input.jsonl"]  # no temp file left


def test_without_a_model_the_bodies_keep_theirs(tmp_path):
    batches = FolderBatches(tmp_path)
    batches.submit(requests(), "w1")
    assert {line["body"]["model"] for line in lines(tmp_path / "w1.input.jsonl")} == {"gpt-4o-mini"}


def test_submit_again_is_a_no_op_but_another_wave_under_the_label_is_refused(wave):
    path = wave.input_path("w1")
    before = path.read_bytes()
    assert wave.submit(requests(), "w1") == "w1"
    with pytest.raises(ConfigError, match="already holds a different wave"):
        wave.submit(requests(2), "w1")
    assert path.read_bytes() == before


def test_an_output_left_from_an_earlier_run_is_refused(tmp_path):
    batches = FolderBatches(tmp_path, model=MODEL)
    shutil.copy(RECORDED, tmp_path / "w1.output.jsonl")
    with pytest.raises(ConfigError, match="left from an earlier run"):
        batches.submit(requests(), "w1")
    assert not (tmp_path / "w1.input.jsonl").exists()


def test_duplicate_custom_ids_are_refused(tmp_path):
    with pytest.raises(ValueError, match="not unique"):
        FolderBatches(tmp_path).submit(requests(1) * 2, "w1")


@pytest.mark.parametrize("label", ["", "../w1", "a/b", ".hidden", "..", "w 1", "w1\n", "x" * 201, None])
def test_unsafe_labels_are_refused(tmp_path, label):
    batches = FolderBatches(tmp_path / "waves")
    with pytest.raises(ConfigError, match="no safe file name"):
        batches.submit(requests(), label)
    with pytest.raises(ConfigError, match="no safe file name"):
        batches.find(label)
    assert not (tmp_path / "waves").exists()


def test_find_sees_a_submitted_wave(tmp_path):
    batches = FolderBatches(tmp_path, model=MODEL)
    assert batches.find("w1") is None
    batches.submit(requests(), "w1")
    assert FolderBatches(tmp_path).find("w1") == "w1"  # a fresh process after a kill


def test_command_runs_vllms_batch_runner(tmp_path):
    folder = tmp_path / "my waves"
    batches = FolderBatches(folder, model=MODEL)
    batches.submit(requests(), "w1")
    command = batches.command("w1")
    assert command == (f"python -m vllm.entrypoints.openai.run_batch -i {shlex.quote(str(folder / 'w1.input.jsonl'))} "
                       f"-o {shlex.quote(str(folder / 'w1.output.jsonl'))} --model {MODEL}")
    assert shlex.split(command)[4] == str(folder / "w1.input.jsonl")


def test_command_takes_the_model_from_the_requests_when_not_given(tmp_path):
    batches = FolderBatches(tmp_path)
    batches.submit(requests(), "w1")
    assert batches.command("w1").endswith("--model gpt-4o-mini")
    batches.submit(requests(1) + [BatchRequest("request-9", {"model": "other", "messages": []})], "w2")
    with pytest.raises(ConfigError, match="do not name one model"):
        batches.command("w2")


def test_waiting_for_the_output_is_in_progress(wave):
    state = wave.state("w1")
    assert (state.status, state.terminal) == ("in_progress", False)
    assert state.counts == {"total": 3, "completed": 0, "failed": 0}
    assert state.detail.startswith(f"waiting for {wave.output_path('w1')}; run: python -m vllm")
    assert wave.outcomes("w1", ASKED) == []


def test_a_recorded_vllm_output_completes_the_wave(wave):
    shutil.copy(RECORDED, wave.output_path("w1"))
    state = wave.state("w1")
    assert (state.status, state.terminal) == ("completed", True)
    assert state.counts == {"total": 3, "completed": 2, "failed": 1}
    one, two, three = wave.outcomes("w1", ASKED)
    assert (one.custom_id, two.custom_id, three.custom_id) == ("request-1", "request-2", "request-3")
    assert one.error is None and one.body["object"] == "chat.completion"
    assert json.loads(one.body["choices"][0]["message"]["content"])["verdict"] == "A"
    assert two.body["usage"]["completion_tokens"] == 17
    assert three.body is None
    assert three.error["status"] == 400 and three.error["code"] == "BadRequestError"
    assert three.error["message"].startswith("This model's maximum context length is 32768 tokens.")


def test_a_partial_output_is_in_progress_and_a_torn_last_line_waits(wave):
    whole = RECORDED.read_text(encoding="utf-8").splitlines(keepends=True)
    wave.output_path("w1").write_text(whole[0] + whole[1][:40], encoding="utf-8")  # the engine is mid-line
    state = wave.state("w1")
    assert state.status == "in_progress"
    assert state.counts == {"total": 3, "completed": 1, "failed": 0}
    assert state.detail.startswith("1 of 3 answers in ")
    assert [o.custom_id for o in wave.outcomes("w1", ASKED)] == ["request-1"]


def test_a_last_line_without_a_newline_counts_once_it_parses(wave):
    write(wave.output_path("w1"), [answer("request-1"), answer("request-2")], tail=json.dumps(answer("request-3")))
    assert wave.state("w1").status == "completed"


def test_every_error_shape_vllm_and_openai_write(wave):
    failed = {"status_code": 400, "request_id": "vllm-batch-2", "body": None}
    write(wave.output_path("w1"), [
        {"id": "vllm-2", "custom_id": "request-1", "response": failed, "error": "Request must not be sent in stream mode"},
        {"id": "vllm-3", "custom_id": "request-2", "response": {**failed, "status_code": 404}, "error": {"error": {
            "message": "The model `x` does not exist.", "type": "NotFoundError", "param": None, "code": 404}}},
        {"id": "batch_req_1", "custom_id": "request-3", "response": {"status_code": 400, "request_id": "r", "body": {
            "error": {"message": "too long", "type": "invalid_request_error", "code": "context_length_exceeded"}}},
         "error": None},
    ])
    assert [o.error for o in wave.outcomes("w1", ASKED)] == [
        {"status": 400, "code": "request_failed", "message": "Request must not be sent in stream mode"},
        {"status": 404, "code": "NotFoundError", "message": "The model `x` does not exist."},
        {"status": 400, "code": "context_length_exceeded", "message": "too long"},
    ]
    assert wave.state("w1").counts == {"total": 3, "completed": 0, "failed": 3}


@pytest.mark.parametrize("body", [None, "text", ["a"]])
def test_an_answer_without_an_object_body_is_a_failed_request(wave, body):
    line = answer("request-1")
    line["response"]["body"] = body
    write(wave.output_path("w1"), [line])
    (outcome,) = wave.outcomes("w1", ASKED)
    assert outcome.body is None and outcome.error["code"] == "invalid_response"


def test_unknown_and_repeated_custom_ids_are_warned_about(wave, caplog):
    write(wave.output_path("w1"), [answer("request-1", "first"), answer("stranger"), answer("request-1", "second"),
                                   answer("request-2"), answer("request-3")])
    assert wave.state("w1").counts == {"total": 3, "completed": 3, "failed": 0}
    with caplog.at_level(logging.WARNING, logger="chateval_dspy.lm.batch.provider"):
        outcomes = wave.outcomes("w1", ASKED)
    assert [o.custom_id for o in outcomes] == ["request-1", "request-2", "request-3"]
    # Two different answers to one request: neither is trusted, it goes out again.
    assert outcomes[0].body is None and outcomes[0].error["code"] == "conflicting_answers"
    assert "1 line(s) answer requests this batch never asked; ignored" in caplog.text
    assert "line 3: a second, different answer to request-1; neither is kept" in caplog.text


@pytest.mark.parametrize("content, why", [
    ("{not json\n", "line 2 is not JSON"),
    ("[1, 2]\n", "line 2 is not a JSON object"),
    ('{"response": {}}\n', "line 2 has no string custom_id"),
])
def test_a_malformed_whole_line_names_file_and_line(wave, content, why):
    path = wave.output_path("w1")
    write(path, [answer("request-1")], tail=content)
    with pytest.raises(FatalLMError, match=why) as raised:
        wave.state("w1")
    assert str(path) in str(raised.value)


def test_an_oversize_line_is_refused(wave):
    path = wave.output_path("w1")
    write(path, [answer("request-1"), answer("request-2", "x" * 2000)])
    with pytest.raises(FatalLMError, match="line 2 is over the 1024-byte limit on one line") as raised:
        FolderBatches(wave.directory, model=MODEL, max_line_bytes=1024).outcomes("w1", ASKED)
    assert str(path) in str(raised.value)


def test_an_oversize_file_is_refused(wave):
    shutil.copy(RECORDED, wave.output_path("w1"))
    with pytest.raises(FatalLMError, match="over the 1000-byte limit on a batch file"):
        FolderBatches(wave.directory, model=MODEL, max_file_bytes=1000).state("w1")


def test_an_unknown_batch_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="w9.input.jsonl is missing"):
        FolderBatches(tmp_path).state("w9")


def test_a_wave_too_big_to_read_back_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="over the 300-byte limit: submit smaller waves"):
        FolderBatches(tmp_path, max_file_bytes=300).submit(requests(), "w1")
    assert not (tmp_path / "w1.input.jsonl").exists()


def test_a_line_without_a_response_status_is_the_engines_fault(wave):
    write(wave.output_path("w1"), [{"id": "vllm-1", "custom_id": "request-1", "response": None, "error": None}])
    (outcome,) = wave.outcomes("w1", ASKED)
    assert outcome.error == {"status": 502, "code": "request_failed",
                             "message": "the request failed and no more was said"}
