"""Nothing read or answered may choose an endpoint. An OpenAI-compatible endpoint
that answers every request with a 307 to another port used to have every prompt sent to, and answered by, that
other endpoint (rc 0); batch mode uploaded and read there too. Now a 3xx is an error naming the endpoint and the
Location it tried to send us to, and the run stops; the other port receives nothing.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dspy
import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.errors import FatalLMError, cause_of
from chateval_dspy.lm.batch.openai_batches import OpenAIBatches
from chateval_dspy.lm.batch.provider import BatchRequest
from chateval_dspy.lm.engine import OpenAICompatEngine
from chateval_dspy.lm.resolve import resolve_lm, served_model_id
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.run import records
from chateval_dspy.run.evaluate_dataset import evaluate_dataset
from chateval_dspy.testing.fake_server import FakeOpenAIServer

CFG = DebateConfig(roles=("critic",), turns=1)
REFUSED = r"answered HTTP 307, a redirect to 'http://127\.0\.0\.1:\d+/v1/[a-z/]+'.*not followed"


class Elsewhere:
    """The port a redirect points at: it records every request that reaches it and answers 500."""

    def __init__(self):
        self.seen: list[str] = []

    def __enter__(self) -> str:
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _record(self):
                seen.append(f"{self.command} {self.path}")
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_GET = do_POST = do_DELETE = _record

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def test_a_redirecting_endpoint_stops_the_run_and_the_other_port_gets_nothing(tmp_path):
    other = Elsewhere()
    with other as other_root, FakeOpenAIServer(redirect=other_root) as url:
        spec = LMSpec(model=url, served_model="fake-served", timeout=2, cache=False)
        with pytest.raises(FatalLMError, match=REFUSED) as refused:
            evaluate_dataset(DataSpec("faireval", limit=2), CFG, spec, out=tmp_path / "r.jsonl")
    print(f"\nredirecting endpoint: {refused.value}")
    assert other_root in str(refused.value) and url in str(refused.value)
    assert other.seen == [] and records.read_records(tmp_path / "r.jsonl") == []


def test_the_model_list_and_a_single_call_are_not_redirected_either():
    other = Elsewhere()
    with other as other_root, FakeOpenAIServer(redirect=other_root) as url:
        with pytest.raises(FatalLMError, match=REFUSED):
            served_model_id(url, "key")  # the model id a base URL's run uses, read before any call
        with pytest.raises(FatalLMError, match=REFUSED), resolve_lm(url):
            pass
        engine = OpenAICompatEngine(url, "fake-served", timeout=2)
        lm = dspy.LM("openai-compatible/fake-served", engine=engine, cache=False, num_retries=0)
        with pytest.raises(Exception) as stopped:  # DSPy wraps an engine's error; the debate looks through it
            lm("hello")
        assert cause_of(stopped.value, FatalLMError) is not None and "a redirect to" in str(stopped.value)
        assert engine.breaker.error() is not None  # every later call of the run fails at once
    assert other.seen == []


def test_batch_uploads_and_reads_are_not_redirected():
    other = Elsewhere()
    server = FakeOpenAIServer()
    with other as other_root, server as url:
        batches = OpenAIBatches(url, "key")
        body = {"model": "fake-served", "messages": [{"role": "user", "content": "hi"}]}
        batch_id = batches.submit([BatchRequest("r1", body)], "wave-1")  # submitted before the redirects begin
        server.redirect = other_root
        with pytest.raises(FatalLMError, match=r"could not submit batch wave-2: HTTP 307, a redirect to"):
            batches.submit([BatchRequest("r2", body)], "wave-2")
        for read in (lambda: batches.state(batch_id), lambda: batches.outcomes(batch_id, ["r1"]),
                     lambda: batches.find("wave-1")):
            with pytest.raises(FatalLMError, match=r"HTTP 307, a redirect to 'http://127\.0\.0\.1:\d+/v1/"):
                read()
    assert other.seen == []
