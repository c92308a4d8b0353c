"""Batch mode against hostile files and servers: nothing read or written through a link, a
pipe or a second name; no answer to a request never made is journaled; a request answered twice differently is
asked again; results are read within a size that follows the requests made; a list of batches is read a bounded
number of pages.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading

import httpx
import pytest
from batch_runs import batch_spec, by_length, live_verdicts
from repo_paths import ROOT
from said import said

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.errors import ConfigError, FatalLMError
from chateval_dspy.limits import MAX_BATCH_RESULT_LINE_BYTES, batch_result_bytes
from chateval_dspy.lm.batch import openai_batches
from chateval_dspy.lm.batch.anthropic import AnthropicBatches
from chateval_dspy.lm.batch.folder import FolderBatches
from chateval_dspy.lm.batch.journal import ANSWERS, JOURNAL, Journal
from chateval_dspy.lm.batch.openai_batches import OpenAIBatches
from chateval_dspy.lm.batch.provider import BatchRequest, Outcome, asked_outcomes, capped_lines
from chateval_dspy.run.evaluate_dataset import evaluate_dataset
from chateval_dspy.testing.fake_batches import FakeBatches
from chateval_dspy.testing.fake_server import FakeOpenAIServer

DATA = DataSpec("faireval", limit=2)
KEEP = b"someone else's file, with no newline"
ASKED = ["request-1", "request-2", "request-3"]




@pytest.fixture(scope="module")
def live(tmp_path_factory):
    return live_verdicts(tmp_path_factory.mktemp("live") / "live.jsonl", DATA)


def finishes(call, seconds: float = 60.0):
    """``call()``'s exception (or None), failing the test if it is still blocked after ``seconds`` (a named pipe
    opened for reading waits for a writer forever: the guard keeps such a bug from hanging the suite)."""
    caught = []

    def run():
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            caught.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "blocked (on a named pipe?)"
    return caught[0] if caught else None


# ---------------------------------------------------------------- links inside <out>.batches/


def test_a_run_refuses_journal_files_linked_elsewhere_and_leaves_their_targets_alone(tmp_path):
    out = tmp_path / "r.jsonl"
    folder = tmp_path / "r.jsonl.batches"
    folder.mkdir()
    victims = [tmp_path / "victim-journal", tmp_path / "victim-answers"]
    for victim in victims:
        victim.write_bytes(KEEP)
    (folder / JOURNAL).symlink_to(victims[0])
    (folder / ANSWERS).symlink_to(victims[1])
    fake = FakeBatches()
    with FakeOpenAIServer(responder=by_length, batches=fake) as url, \
            pytest.raises(ConfigError, match=f"{JOURNAL} is a symbolic link; refusing to follow it"):
        evaluate_dataset(DATA, DebateConfig(), batch_spec(url), out=out)
    assert [v.read_bytes() for v in victims] == [KEEP, KEEP]
    assert fake.created == []


@pytest.mark.parametrize("name", [JOURNAL, ANSWERS])
def test_a_journal_file_linked_in_is_refused_by_name(tmp_path, name):
    victim = tmp_path / "victim"
    victim.write_bytes(KEEP)
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / name).symlink_to(victim)
    with pytest.raises(ConfigError) as raised:
        Journal(tmp_path / "j")
    assert str(tmp_path / "j" / name) in str(raised.value) and "symbolic link" in str(raised.value)
    assert victim.read_bytes() == KEEP


def test_a_journal_file_hard_linked_elsewhere_is_never_written(tmp_path):
    journal = Journal(tmp_path / "j")
    journal.intent("w0001-ab", 1, [BatchRequest("c1", {"model": "m"})])
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    os.link(victim, tmp_path / "j" / ANSWERS)  # the same file under a second name
    with pytest.raises(ConfigError, match=f"{ANSWERS} has 2 hard links; refusing to write"):
        journal.answer("c1", {"choices": []})
    assert victim.read_bytes() == b"precious\n"
    with pytest.raises(ConfigError, match="hard links"):
        Journal(tmp_path / "j")


def test_a_named_pipe_as_a_journal_file_is_refused_without_blocking(tmp_path):
    (tmp_path / "j").mkdir()
    os.mkfifo(tmp_path / "j" / JOURNAL)
    error = finishes(lambda: Journal(tmp_path / "j"))
    assert isinstance(error, ConfigError) and "is not a regular file" in str(error)
    assert str(tmp_path / "j" / JOURNAL) in str(error)


def test_a_linked_journal_folder_is_refused(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "j").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="is a symbolic link"):
        Journal(tmp_path / "j")


def test_a_torn_last_line_of_the_journal_is_still_cut_off(tmp_path):
    journal = Journal(tmp_path / "j")
    journal.intent("w0001-ab", 1, [BatchRequest("c1", {"model": "m"})])
    with open(tmp_path / "j" / JOURNAL, "ab") as f:
        f.write(b'{"event": "submit')  # a kill mid-write
    assert Journal(tmp_path / "j").batches["w0001-ab"].custom_ids == ["c1"]
    assert (tmp_path / "j" / JOURNAL).read_bytes().endswith(b"]}\n")


@pytest.mark.parametrize("line, why", [
    ({"custom_id": "c9", "body": {"choices": []}}, r"\(no journaled batch asked c9\)"),
    ({"custom_id": "c1", "body": {"choices": ["forged"]}}, r"\(a second, different answer to c1\)"),
    ({"custom_id": "c1", "body": "text"}, ""),
])
def test_a_journaled_answer_this_program_did_not_write_is_refused(tmp_path, line, why):
    journal = Journal(tmp_path / "j")
    journal.intent("w0001-ab", 1, [BatchRequest("c1", {"model": "m"})])
    journal.answer("c1", {"choices": []})
    with open(tmp_path / "j" / ANSWERS, "a") as f:
        f.write(json.dumps(line) + "\n")
    with pytest.raises(ConfigError, match=f"{ANSWERS} line 2: not an answer this program wrote ?{why}; move the"):
        Journal(tmp_path / "j")


# ---------------------------------------------------------------- --batch-dir's files


def folder_wave(tmp_path) -> FolderBatches:
    batches = FolderBatches(tmp_path / "waves", model="m")
    batches.submit([BatchRequest(i, {"model": "m", "messages": []}) for i in ASKED], "w1")
    return batches


def output_line(custom_id: str, content: str = "ok") -> str:
    body = {"id": "x", "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}
    return json.dumps({"id": "vllm-1", "custom_id": custom_id, "error": None,
                       "response": {"status_code": 200, "request_id": "r", "body": body}}) + "\n"


def test_an_output_linked_out_of_the_batch_folder_is_refused(tmp_path):
    wave = folder_wave(tmp_path)
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text("".join(output_line(i) for i in ASKED))
    wave.output_path("w1").symlink_to(elsewhere)
    for read in (lambda: wave.state("w1"), lambda: wave.outcomes("w1", ASKED)):
        with pytest.raises(ConfigError, match="w1.output.jsonl is a symbolic link; refusing to follow it"):
            read()


def test_an_input_replaced_by_a_link_is_refused(tmp_path):
    wave = folder_wave(tmp_path)
    real = tmp_path / "copy.jsonl"
    real.write_bytes(wave.input_path("w1").read_bytes())
    wave.input_path("w1").unlink()
    wave.input_path("w1").symlink_to(real)
    with pytest.raises(ConfigError, match="w1.input.jsonl is a symbolic link"):
        FolderBatches(tmp_path / "waves", model="m").state("w1")
    with pytest.raises(ConfigError, match="w1.input.jsonl is a symbolic link"):
        wave.submit([BatchRequest(i, {"model": "m", "messages": []}) for i in ASKED], "w1")


def test_a_named_pipe_as_the_output_is_refused_without_blocking(tmp_path):
    wave = folder_wave(tmp_path)
    os.mkfifo(wave.output_path("w1"))
    for read in (lambda: wave.state("w1"), lambda: wave.outcomes("w1", ASKED)):
        error = finishes(read)
        assert isinstance(error, ConfigError) and "w1.output.jsonl is not a regular file" in str(error)


def test_an_output_larger_than_its_requests_can_take_is_refused_unread(tmp_path):
    wave = folder_wave(tmp_path)
    with open(wave.output_path("w1"), "wb") as f:
        f.truncate(450 * 2**20)  # sparse: 450 MB that take no disk, and would take memory if read
    cap = batch_result_bytes(3)
    for read in (lambda: wave.state("w1"), lambda: wave.outcomes("w1", ASKED)):
        with pytest.raises(FatalLMError, match=f"over the {cap}-byte limit on a batch file for its 3 requests"):
            read()


def test_an_output_line_longer_than_an_answer_can_be_is_refused(tmp_path):
    wave = folder_wave(tmp_path)
    wave.output_path("w1").write_text(output_line("request-1") + output_line("request-2", "x" * (5 * 2**20)))
    with pytest.raises(FatalLMError, match=f"line 2 is over the {MAX_BATCH_RESULT_LINE_BYTES}-byte limit on one line"):
        wave.outcomes("w1", ASKED)


@pytest.mark.parametrize("chunks, number", [([b"12345\n", b"123456"], 2), ([b"12", b"3456\n1"], 1),
                                            ([b"\n\n123456789\n"], 3)])
def test_a_streamed_line_is_never_held_past_its_limit(chunks, number):
    with pytest.raises(FatalLMError, match=f"results line {number} is over the 5-byte limit on one line"):
        list(capped_lines(chunks, 100, "results", max_line=5))


# ---------------------------------------------------------------- answers never asked, answers given twice


def test_a_request_answered_twice_alike_is_answered_and_differently_is_not():
    ok = lambda cid, raw: Outcome(cid, body=raw)  # noqa: E731
    same = asked_outcomes([(1, "a", {"x": 1}), (2, "a", {"x": 1})], {"a"}, "f", ok)
    assert same == [Outcome("a", body={"x": 1})]
    (forged,) = asked_outcomes([(1, "a", {"x": 0}), (2, "a", {"x": 1})], {"a"}, "f", ok)
    assert forged.body is None and forged.error["code"] == "conflicting_answers" and forged.error["status"] is None


def test_answers_to_requests_never_made_are_not_journaled(tmp_path, live, caplog):
    caplog.set_level(logging.WARNING, logger="chateval_dspy.lm.batch.provider")
    def pad(batch_id, lines):
        strangers = [{**lines[0], "custom_id": f"c{n:040x}"} for n in range(500)]
        return lines + strangers

    fake = FakeBatches(forge=pad)
    out = tmp_path / "b.jsonl"
    with FakeOpenAIServer(responder=by_length, batches=fake) as url:
        run = evaluate_dataset(DATA, DebateConfig(), batch_spec(url), out=out)
    assert said(out) == live
    answers = (tmp_path / "b.jsonl.batches" / ANSWERS).read_text().splitlines()
    assert sorted(json.loads(a)["custom_id"] for a in answers) == sorted(fake.submitted)
    assert run.batch["submitted"] == len(fake.submitted) == 16
    assert "500 line(s) answer requests this batch never asked; ignored" in caplog.text


def test_a_forged_first_copy_of_an_answer_is_not_trusted(tmp_path, live):
    def forge(batch_id, lines):
        if batch_id != fake.created[0]:
            return lines
        # Before each answer, a forged one under its id: the copy a first-wins reader would keep.
        forged = json.loads(json.dumps(lines))
        for line in forged:
            line["response"]["body"]["choices"][0]["message"]["content"] = "forged: no verdict here {"
        return forged + lines

    fake = FakeBatches(forge=forge)
    out = tmp_path / "b.jsonl"
    with FakeOpenAIServer(responder=by_length, batches=fake) as url:
        run = evaluate_dataset(DATA, DebateConfig(), batch_spec(url), out=out)
    assert said(out) == live  # not one abstention, not one forged turn
    first = fake.requests_in(fake.created[0])
    assert all(fake.submitted[cid] == 2 for cid in first)  # each went out again, once
    assert run.batch["waves"] == 5
    answers = [json.loads(a) for a in (tmp_path / "b.jsonl.batches" / ANSWERS).read_text().splitlines()]
    assert len(answers) == len({a["custom_id"] for a in answers}) == len(fake.submitted)


# ---------------------------------------------------------------- results sized by the requests made


def test_anthropic_results_are_capped_by_the_requests_asked():
    message = {"id": "m", "model": "c", "content": [{"type": "text", "text": "x" * 1000}], "stop_reason": "end_turn"}
    line = json.dumps({"custom_id": "stranger", "result": {"type": "succeeded", "message": message}}).encode()
    results = b"\n".join([line] * (batch_result_bytes(1) // len(line) + 10))
    batch = {"id": "msgbatch_1", "processing_status": "ended", "request_counts": {},
             "results_url": "http://api.test/v1/messages/batches/msgbatch_1/results"}

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/results"):
            return httpx.Response(200, content=iter([results]))  # streamed: no length said
        return httpx.Response(200, json=batch)

    provider = AnthropicBatches(api_key="k", base_url="http://api.test", retries=0)
    provider._client = httpx.Client(transport=httpx.MockTransport(handle))
    with pytest.raises(FatalLMError, match=f"results is over the {batch_result_bytes(1)}-byte cap"):
        provider.outcomes("msgbatch_1", ["a"])
    assert provider.outcomes("msgbatch_1", [f"r{i}" for i in range(100)]) == []  # room enough; none asked


MEMORY_SCRIPT = r"""
import json, resource, sys
import httpx, openai
from chateval_dspy.errors import FatalLMError
from chateval_dspy.lm.batch.openai_batches import OpenAIBatches

def address_space():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

body = {"id": "x", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "y" * 4000}, "finish_reason": "stop"}]}
LINE = (json.dumps({"id": "r", "custom_id": "stranger", "response": {"status_code": 200, "body": body},
                    "error": None}) + "\n").encode()
TOTAL, sent = 450 * 2**20, [0]

def stream():  # 450 MB of answers to a request never made, made as they are read
    chunk = LINE * 64
    while sent[0] < TOTAL:
        sent[0] += len(chunk)
        yield chunk

BATCH = {"id": "batch_1", "object": "batch", "endpoint": "/v1/chat/completions", "input_file_id": "file-in",
         "completion_window": "24h", "status": "completed", "output_file_id": "file-out", "error_file_id": None,
         "created_at": 0, "request_counts": {"total": 1, "completed": 1, "failed": 0}}

def handle(request):
    if request.url.path.endswith("/content"):
        return httpx.Response(200, content=stream())
    return httpx.Response(200, json=BATCH)

provider = OpenAIBatches("http://api.test/v1", "k")
provider.client = openai.OpenAI(base_url="http://api.test/v1", api_key="k", max_retries=0,
                                http_client=httpx.Client(transport=httpx.MockTransport(handle)))
cap = address_space() + 200 * 2**20
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
try:
    provider.outcomes("batch_1", ["c1"])
    print(json.dumps({"error": None, "sent": sent[0]}))
except FatalLMError as exc:
    print(json.dumps({"error": "FatalLMError", "message": str(exc), "sent": sent[0]}))
except BaseException as exc:
    print(json.dumps({"error": "raw " + type(exc).__name__, "sent": sent[0]}))
"""


def test_a_huge_output_file_fails_cleanly_within_a_memory_limit():
    done = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["error"] == "FatalLMError", got
    assert f"file file-out is over the {batch_result_bytes(1)}-byte cap" in got["message"]
    assert got["sent"] < 2 * batch_result_bytes(1)  # it stopped reading at the cap, not at the end


# ---------------------------------------------------------------- a list of batches without end


def test_a_list_that_repeats_itself_is_an_error_not_a_loop():
    fake = FakeBatches(endless_list=True)
    with FakeOpenAIServer(batches=fake) as url:
        provider = OpenAIBatches(url, "k")
        provider.submit([BatchRequest("c1", {"model": "m", "messages": []})], "w0001-aa")
        with pytest.raises(FatalLMError, match="the list of batches repeats itself .* looking for batch w0001-zz"):
            provider.find("w0001-zz")
        assert provider.find("w0001-aa") == fake.created[0]  # what it holds is still found
    assert fake.listed == 3


def test_a_list_that_goes_on_is_read_a_bounded_number_of_pages(monkeypatch):
    monkeypatch.setattr(openai_batches, "MAX_BATCH_LIST_PAGES", 3)
    monkeypatch.setattr(openai_batches, "LIST_PAGE", 2)
    fake = FakeBatches()
    with FakeOpenAIServer(batches=fake) as url:
        provider = OpenAIBatches(url, "k")
        for n in range(8):
            provider.submit([BatchRequest("c1", {"model": "m", "messages": []})], f"w{n:04d}-aa")
        with pytest.raises(FatalLMError, match="batch w9999-zz is not among the newest 6 batches and the list goes on"):
            provider.find("w9999-zz")
        assert fake.listed == 3
        assert provider.find("w0004-aa") == fake.created[4]  # the newest three pages hold it
