"""The fake server's Batch API, driven by the official ``openai`` client as production code drives OpenAI."""

from __future__ import annotations

import json
import time

import openai
import pytest

from chateval_dspy.testing.fake_batches import FakeBatches
from chateval_dspy.testing.fake_server import FakeOpenAIServer


def _lines(ids, endpoint="/v1/chat/completions") -> bytes:
    return "".join(json.dumps({"custom_id": cid, "method": "POST", "url": endpoint,
                               "body": {"model": "gpt-x", "messages": [{"role": "user", "content": f"hi {cid}"}]}}) + "\n"
                   for cid in ids).encode()


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key="k", max_retries=0)


def _submit(client, data: bytes, **metadata):
    upload = client.files.create(file=("in.jsonl", data), purpose="batch")
    return client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h",
                                 metadata=metadata or None)


def _jsonl(client, file_id) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()] if file_id else []


def test_happy_path_answers_every_request():
    server = FakeOpenAIServer()
    with server as url:
        client = _client(url)
        data = _lines(["a", "b", "c"])
        upload = client.files.create(file=("in.jsonl", data), purpose="batch")
        assert (upload.object, upload.purpose, upload.bytes, upload.filename) == ("file", "batch", len(data), "in.jsonl")
        assert upload.id.startswith("file-") and client.files.content(upload.id).content == data
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
        assert batch.id.startswith("batch_") and batch.status == "validating"
        done = client.batches.retrieve(batch.id)
        out = _jsonl(client, done.output_file_id)
    assert done.status == "completed" and done.completed_at and done.error_file_id is None
    assert done.request_counts.model_dump() == {"total": 3, "completed": 3, "failed": 0}
    assert [line["custom_id"] for line in out] == ["a", "b", "c"]
    assert all(line["id"].startswith("batch_req_") and line["error"] is None for line in out)
    assert {line["response"]["status_code"] for line in out} == {200}
    assert out[0]["response"]["body"] == server.reply(json.loads(data.splitlines()[0])["body"])
    assert server.batches.created == [batch.id] and server.batches.requests_in(batch.id) == ["a", "b", "c"]
    assert server.batches.submitted == {"a": 1, "b": 1, "c": 1} and server.requests == []


def test_delay_keeps_a_batch_in_progress_until_it_has_passed():
    now = [1000.0]
    with FakeOpenAIServer(batches=FakeBatches(delay=60, clock=lambda: now[0])) as url:
        client = _client(url)
        batch = _submit(client, _lines(["a"]))
        running = client.batches.retrieve(batch.id)
        now[0] += 59
        still = client.batches.retrieve(batch.id)
        now[0] += 1
        done = client.batches.retrieve(batch.id)
    assert (running.status, still.status, done.status) == ("in_progress", "in_progress", "completed")
    assert running.output_file_id is None and running.in_progress_at == 1000
    assert done.completed_at == 1060 and done.request_counts.completed == 1


def test_delay_on_the_real_clock():
    with FakeOpenAIServer(batches=FakeBatches(delay=0.5)) as url:
        client = _client(url)
        batch = _submit(client, _lines(["a"]))
        assert client.batches.retrieve(batch.id).status == "in_progress"
        time.sleep(0.55)
        assert client.batches.retrieve(batch.id).status == "completed"


def test_an_expired_batch_answers_only_its_first_share():
    with FakeOpenAIServer(batches=FakeBatches(expire=1, expire_keep=0.5)) as url:
        client = _client(url)
        first = client.batches.retrieve(_submit(client, _lines(["a", "b", "c", "d", "e"])).id)
        second = client.batches.retrieve(_submit(client, _lines(["f"])).id)
        out, err = _jsonl(client, first.output_file_id), _jsonl(client, first.error_file_id)
    assert first.status == "expired" and first.expired_at and second.status == "completed"
    assert first.request_counts.model_dump() == {"total": 5, "completed": 2, "failed": 3}
    assert [line["custom_id"] for line in out] == ["a", "b"]
    assert [line["custom_id"] for line in err] == ["c", "d", "e"]
    assert all(line["response"] is None and line["error"]["code"] == "batch_expired" for line in err)


@pytest.mark.parametrize("fail", [{"b": 500, "c": 400}, lambda cid, body: {"b": 500, "c": 400}.get(cid)])
def test_a_failed_request_succeeds_when_resubmitted(fail):
    server = FakeOpenAIServer(batches=FakeBatches(fail=fail))
    with server as url:
        client = _client(url)
        first = client.batches.retrieve(_submit(client, _lines(["a", "b", "c"])).id)
        out, err = _jsonl(client, first.output_file_id), _jsonl(client, first.error_file_id)
        again = client.batches.retrieve(_submit(client, _lines(["b", "c"])).id)
        redo = _jsonl(client, again.output_file_id)
    assert first.status == "completed" and first.request_counts.model_dump() == {"total": 3, "completed": 1, "failed": 2}
    assert [line["custom_id"] for line in out] == ["a"]
    assert {line["custom_id"]: line["response"]["status_code"] for line in err} == {"b": 500, "c": 400}
    kinds = {line["custom_id"]: line["response"]["body"]["error"]["type"] for line in err}
    assert kinds == {"b": "server_error", "c": "invalid_request_error"} and all(line["error"] is None for line in err)
    assert again.error_file_id is None and [line["custom_id"] for line in redo] == ["b", "c"]
    assert server.batches.submitted == {"a": 1, "b": 2, "c": 2}
    assert server.batches.requests_in(again.id) == ["b", "c"]


def test_fail_times_fails_a_request_more_than_once():
    with FakeOpenAIServer(batches=FakeBatches(fail={"a": 503}, fail_times=2)) as url:
        client = _client(url)
        counts = [client.batches.retrieve(_submit(client, _lines(["a"])).id).request_counts.failed for _ in range(3)]
    assert counts == [1, 1, 0]


@pytest.mark.parametrize("data, code, line", [
    (b'{"custom_id": "a", "method": "POST"\n', "invalid_json_line", 1),
    (_lines(["a"]) + b'{"method": "POST", "url": "/v1/chat/completions", "body": {}}\n', "missing_required_parameter", 2),
    (_lines(["a", "b", "a"]), "duplicate_custom_id", 3),
    (_lines(["a"], endpoint="/v1/embeddings"), "invalid_request", 1),
    (b"\n", "empty_file", None),
])
def test_a_malformed_input_file_fails_the_batch(data, code, line):
    with FakeOpenAIServer() as url:
        client = _client(url)
        batch = client.batches.retrieve(_submit(client, data).id)
    assert batch.status == "failed" and batch.failed_at and batch.output_file_id is None
    assert batch.errors.object == "list"
    assert (batch.errors.data[0].code, batch.errors.data[0].line) == (code, line)


def test_fail_batches_fails_whole_batches_then_stops():
    with FakeOpenAIServer(batches=FakeBatches(fail_batches=1)) as url:
        client = _client(url)
        failed = client.batches.retrieve(_submit(client, _lines(["a"])).id)
        ok = client.batches.retrieve(_submit(client, _lines(["a"])).id)
    assert failed.status == "failed" and failed.errors.data and failed.output_file_id is None
    assert ok.status == "completed"


def test_list_is_newest_first_and_keeps_metadata():
    with FakeOpenAIServer() as url:
        client = _client(url)
        ids = [_submit(client, _lines([str(i)]), run=f"r{i}").id for i in range(3)]
        page = client.batches.list(limit=2)
        everything = list(client.batches.list(limit=2))  # auto-paging follows last_id
    assert [b.id for b in page.data] == ids[::-1][:2] and page.has_more
    assert (page.first_id, page.last_id) == (ids[2], ids[1])
    assert [b.id for b in everything] == ids[::-1]
    assert [b.metadata for b in everything] == [{"run": "r2"}, {"run": "r1"}, {"run": "r0"}]


def test_cancel_stops_an_unfinished_batch():
    with FakeOpenAIServer(batches=FakeBatches(delay=3600)) as url:
        client = _client(url)
        batch = _submit(client, _lines(["a", "b"]))
        cancelling = client.batches.cancel(batch.id)
        cancelled = client.batches.retrieve(batch.id)
        running = client.batches.retrieve(_submit(client, _lines(["a"])).id)
        with pytest.raises(openai.NotFoundError):
            client.batches.retrieve("batch_nope")
    assert cancelling.status == "cancelling" and cancelled.status == "cancelled" and cancelled.output_file_id is None
    assert cancelled.request_counts.total == 2 and running.status == "in_progress"


def test_cancel_refuses_a_finished_batch():
    with FakeOpenAIServer() as url:
        client = _client(url)
        batch = client.batches.retrieve(_submit(client, _lines(["a"])).id)
        with pytest.raises(openai.ConflictError):
            client.batches.cancel(batch.id)


def test_bad_requests_are_refused():
    with FakeOpenAIServer(batches=FakeBatches(max_upload_bytes=1000)) as url:
        client = _client(url)
        with pytest.raises(openai.APIStatusError) as big:
            client.files.create(file=("in.jsonl", b"x" * 5000), purpose="batch")
        small = client.files.create(file=("in.jsonl", _lines(["a"])), purpose="user_data")
        with pytest.raises(openai.BadRequestError):
            client.batches.create(input_file_id=small.id, endpoint="/v1/chat/completions", completion_window="24h")
        with pytest.raises(openai.NotFoundError):
            client.files.content("file-nope")
        assert client.files.delete(small.id).deleted
        with pytest.raises(openai.NotFoundError):
            client.files.retrieve(small.id)
    assert big.value.status_code == 413


def test_upload_keeps_bytes_exactly():
    data = b"line one\r\nline two\n\xe2\x9c\x93 --boundary-like\r\n\r\n"
    with FakeOpenAIServer() as url:
        client = _client(url)
        upload = client.files.create(file=("raw.bin", data), purpose="batch")
        assert client.files.retrieve(upload.id).bytes == len(data)
        assert client.files.content(upload.id).content == data


def test_chat_completions_answer_as_before_and_faults_skip_batches():
    server = FakeOpenAIServer(faults=[503])
    with server as url:
        client = _client(url)
        batch = client.batches.retrieve(_submit(client, _lines(["a"])).id)
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        models = client.models.list()
    assert batch.status == "completed"
    assert chat.model_dump(exclude_none=True)["choices"][0]["message"]["content"] == \
        server.reply({"messages": [{"role": "user", "content": "hi"}]})["choices"][0]["message"]["content"]
    assert [m.id for m in models.data] == ["fake-served"] and len(server.requests) == 2
