"""The HTTP API against hostile requests: deep JSON, oversized bodies, unguarded docs.

A stub evaluator stands in for a loaded judge: what is tested here is the server around it, and no request
that reaches the stub needs an LM.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from local_http import free_port, uvicorn_thread

from chateval_dspy.deploy.serving.http import MAX_JSON_DEPTH, create_app

ITEM = {"id": "a", "question": "Which?", "answer_1": "short", "answer_2": "a considerably longer answer"}
TOKEN = {"Authorization": "Bearer s3cret"}


class StubJudge:
    """What create_app uses of a Judge; a verdict echoes the item's id."""

    format = "pairwise"
    card = {"model": "stub/card", "versions": {}}
    lm = SimpleNamespace(model="stub/model")

    def __call__(self, item, *, row=None, source="item"):
        return SimpleNamespace(to_dict=lambda: {"id": str(item.get("id", row)), "winner": "2"})


@contextlib.contextmanager
def serving(**kwargs):
    """A real uvicorn server (in a thread) around a stub judge; yields its port."""
    with uvicorn_thread(create_app(StubJudge(), **kwargs), log_level="critical") as port:
        yield port


def raw_exchange(port: int, request: bytes, wait: float = 10.0) -> tuple[int | None, dict, bytes, bool]:
    """Send ``request`` as is (maybe an unfinished body) and read one response.

    Returns (status or None if none came within ``wait``, lower-cased headers, body, whether the server then
    closed the connection within 2 s).
    """
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        s.sendall(request)
        data = b""
        try:
            while b"\r\n\r\n" not in data:
                part = s.recv(65536)
                if not part:
                    break
                data += part
        except TimeoutError:
            return None, {}, b"", False
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines[1:] if ": " in line)
        while len(body) < int(headers.get("content-length", 0)):
            part = s.recv(65536)
            if not part:
                break
            body += part
        s.settimeout(2.0)
        try:
            closed = s.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            closed = True
        except TimeoutError:
            closed = False
        return int(lines[0].split()[1]), headers, body, closed


# ---------------------------------------------------------------- item 14: JSON the parser cannot take


def test_a_deeply_nested_body_is_a_400_naming_the_problem():
    """200 KB of '[' answered 500 with a RecursionError traceback; it must be a one-line 400."""
    with serving() as port:
        url = f"http://127.0.0.1:{port}"
        r = httpx.post(f"{url}/evaluate", content=b"[" * 200_000, headers={"Content-Type": "application/json"},
                       timeout=30)
        assert r.status_code == 400
        assert r.headers["content-type"].startswith("application/json")
        error = r.json()["error"]
        assert "nest" in error and "deep" in error and "\n" not in error and "Traceback" not in r.text
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200


def test_nesting_is_capped_at_a_fixed_depth_not_at_the_recursion_limit():
    """A body that parses but nests past the cap (here in an ignored field) is refused alike,
    so nothing later walks a structure near the recursion limit; ordinary nesting still gets judged."""
    def nested(depth):
        return json.loads("[" * depth + "]" * depth)

    with serving() as port:
        url = f"http://127.0.0.1:{port}/evaluate"
        # The item object and the list around it count: 2 + (MAX_JSON_DEPTH - 1) levels is one too many.
        deep = httpx.post(url, json=[{**ITEM, "meta": nested(MAX_JSON_DEPTH - 1)}], timeout=30)
        assert deep.status_code == 400 and f"more than {MAX_JSON_DEPTH} levels" in deep.json()["error"]
        deep_id = httpx.post(url, json={**ITEM, "id": nested(500)}, timeout=30)
        assert deep_id.status_code == 400 and "deep" in deep_id.json()["error"]
        fine = httpx.post(url, json=[{**ITEM, "meta": nested(MAX_JSON_DEPTH - 2)}], timeout=30)
        assert fine.status_code == 200 and fine.json() == [{"id": "a", "winner": "2"}]


def test_json_that_python_refuses_to_decode_is_a_400_not_a_500():
    """An integer past Python's digit limit raised a bare ValueError (500); it is bad JSON here."""
    with serving() as port:
        body = b'{"question": "q", "answer_1": "a", "answer_2": "b", "id": ' + b"7" * 50_000 + b"}"
        r = httpx.post(f"http://127.0.0.1:{port}/evaluate", content=body, timeout=30)
        assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
        bad_utf8 = httpx.post(f"http://127.0.0.1:{port}/evaluate", content=b'{"id": "\xff"}', timeout=30)
        assert bad_utf8.status_code == 400 and "not valid JSON" in bad_utf8.json()["error"]


# ---------------------------------------------------------------- item 15: bodies past --max-body-bytes


def test_a_chunked_body_gets_413_as_soon_as_it_passes_the_limit():
    """A chunked body (no Content-Length) was read whole before the size check; the server
    must answer 413 once the limit is passed, here without the client ever finishing the body, and then close."""
    limit = 10_000
    chunk = b"x" * 4096
    unfinished = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(8))  # 32 KB, no last chunk
    head = (b"POST /evaluate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")
    with serving(max_body_bytes=limit) as port:
        status, headers, body, closed = raw_exchange(port, head + unfinished)
        assert status == 413, "no answer while the body was still coming: the server waited to read all of it"
        assert f"limit of {limit} bytes" in json.loads(body)["error"]
        assert headers.get("connection") == "close" and closed  # the rest of the upload is not read


def test_a_declared_oversized_body_gets_413_and_is_not_drained():
    """With Content-Length past the limit the answer is 413 before the body is read, and the
    connection is closed rather than kept alive while the server reads and discards the rest."""
    limit = 10_000
    head = (b"POST /evaluate HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (limit * 1000))
    with serving(max_body_bytes=limit) as port:
        status, headers, body, closed = raw_exchange(port, head + b"[" + b" " * 1000)
        assert status == 413 and f"the limit is {limit}" in json.loads(body)["error"]
        assert headers.get("connection") == "close" and closed


def test_bodies_within_the_limit_still_work_chunked_or_not():
    """Streaming the body keeps small bodies, chunked or with Content-Length, working."""
    def pieces():
        text = json.dumps([ITEM, {**ITEM, "id": "b"}]).encode()
        yield from (text[i:i + 7] for i in range(0, len(text), 7))

    with serving(max_body_bytes=5000) as port:
        url = f"http://127.0.0.1:{port}/evaluate"
        chunked = httpx.post(url, content=pieces(), timeout=30)
        assert chunked.status_code == 200 and [v["id"] for v in chunked.json()] == ["a", "b"]
        assert httpx.post(url, json=ITEM, timeout=30).json()["id"] == "a"
        over = httpx.post(url, content=(b"x" * 1000 for _ in range(6)), timeout=30)
        assert over.status_code == 413 and over.headers["connection"] == "close"


SERVER = textwrap.dedent("""
    import sys, types
    from chateval_dspy.lm.offline import ensure_offline
    ensure_offline()
    import uvicorn
    from chateval_dspy.deploy.serving.http import create_app

    class Stub:
        format, card, lm = "pairwise", {"versions": {}}, types.SimpleNamespace(model="stub")

    uvicorn.run(create_app(Stub(), max_body_bytes=int(sys.argv[2])), host="127.0.0.1", port=int(sys.argv[1]),
                log_level="critical")
""")


def _peak_rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads peak RSS from /proc")
def test_an_oversized_chunked_body_does_not_grow_server_memory():
    """A 300 MB chunked body grew server RSS 272 -> 805 MiB. Here 24 MB against a 256 KB limit
    (bounded, so a regression costs tens of MB, not the machine): the server's peak RSS must barely move."""
    limit, body_mb = 256_000, 24
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(limit)], env=os.environ.copy(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            assert server.poll() is None, server.stderr.read().decode()
            time.sleep(0.1)
        chunk = b"x" * 65536

        def upload(megabytes):
            return httpx.post(f"{url}/evaluate", content=(chunk for _ in range(megabytes * 16)), timeout=60)

        assert upload(1).status_code == 413  # warm-up: the same path, so the baseline includes its code
        before = _peak_rss_kib(server.pid)
        r = upload(body_mb)
        grown_mib = (_peak_rss_kib(server.pid) - before) / 1024
        assert r.status_code == 413
        assert grown_mib < body_mb / 4, f"server peak RSS grew {grown_mib:.1f} MiB on a {body_mb} MB body"
    finally:
        server.terminate()
        server.wait(10)


# ---------------------------------------------------------------- item 16: the token guards the schema and docs


def test_with_a_token_the_schema_needs_it_and_the_browser_docs_are_off():
    """/docs, /redoc and /openapi.json answered without the bearer token. Now the schema needs
    the token and the HTML docs are not served (a browser page cannot send the header); /health stays open."""
    with serving(token="s3cret") as port:
        url = f"http://127.0.0.1:{port}"
        refused = httpx.get(f"{url}/openapi.json", timeout=10)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert "paths" not in refused.text
        assert httpx.get(f"{url}/openapi.json", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
        schema = httpx.get(f"{url}/openapi.json", headers=TOKEN, timeout=10)
        assert schema.status_code == 200 and "/evaluate" in schema.json()["paths"]
        assert "/openapi.json" not in schema.json()["paths"]
        for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
            for headers in ({}, TOKEN):
                r = httpx.get(f"{url}{page}", headers=headers, timeout=10)
                assert r.status_code == 404 and "swagger" not in r.text.lower() and "redoc" not in r.text.lower()
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        assert httpx.get(f"{url}/card", timeout=10).status_code == 401
        assert httpx.post(f"{url}/evaluate", json=ITEM, timeout=10).status_code == 401


def test_without_a_token_the_schema_and_docs_stay_open():
    """An open server (no token) keeps FastAPI's schema and browser docs."""
    with serving() as port:
        url = f"http://127.0.0.1:{port}"
        assert "/evaluate" in httpx.get(f"{url}/openapi.json", timeout=10).json()["paths"]
        assert httpx.get(f"{url}/docs", timeout=10).status_code == 200
        assert httpx.get(f"{url}/redoc", timeout=10).status_code == 200
