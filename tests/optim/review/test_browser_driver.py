"""The headless-Chromium test driver (tests/support/browser.py) against a tiny local form server.

One browser serves the whole module: starting Chromium is the slow part (a few seconds).
"""

from __future__ import annotations

import html
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest
from browser import Browser, CDPError, find_chromium, key_event

pytestmark = [pytest.mark.slow,  # a real browser (Debian's chromium)
              pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed")]

LAST_SENTENCE = "This closing sentence must survive in full, down to its final word: marmalade."
FILLER = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor. "
PARAGRAPH = (FILLER * 40)[: 3000 - len(LAST_SENTENCE) - 1] + " " + LAST_SENTENCE

FORM_PAGE = f"""<!doctype html>
<html><head><title>form</title></head><body>
<h1>Press 1, 2 or t</h1>
<form id="f" method="POST" action="/save"><input type="hidden" name="value" id="v"></form>
<p id="long">{PARAGRAPH}</p>
<div style="height: 1500px"></div>
<script>
document.addEventListener("keydown", (e) => {{
  if (["1", "2", "t"].includes(e.key)) {{
    document.getElementById("v").value = e.key;
    document.getElementById("f").submit();
  }}
}});
</script>
</body></html>"""


class _Handler(BaseHTTPRequestHandler):
    server: _FormServer

    def do_GET(self) -> None:
        self.server.cookies.append(self.headers.get("Cookie", ""))
        if self.path == "/saved":
            body = f"<!doctype html><body><p>Saved: {html.escape(self.server.posted[-1])}</p></body>"
        else:
            body = FORM_PAGE
        self._reply(200, body)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        fields = parse_qs(self.rfile.read(length).decode())
        self.server.posted.append(fields.get("value", [""])[0])
        self.send_response(303)
        self.send_header("Location", "/saved")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _reply(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass  # keeps pytest output clean


class _FormServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.posted: list[str] = []
        self.cookies: list[str] = []

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture(scope="module")
def server():
    srv = _FormServer()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with Browser(tmp_path_factory.mktemp("chromium-profile"), width=1400, height=1000) as b:
        yield b


def test_key_press_submits_form_and_follows_redirect(browser, server):
    browser.open(server.base + "/")
    assert "Press 1, 2 or t" in browser.text()
    with browser.expect_load():
        browser.press("2")
    browser.wait_for(lambda: "Saved: 2" in browser.text(), timeout=10)
    assert server.posted == ["2"]
    assert browser.url() == server.base + "/saved"


def test_wait_for_tolerates_navigation_without_expect_load(browser, server):
    browser.open(server.base + "/")
    browser.press("t")  # the page unloads under the polling below; evaluate errors there must be retried
    browser.wait_for(lambda: "Saved: t" in browser.text(), timeout=10)
    assert server.posted[-1] == "t"


def test_long_paragraph_text_is_complete(browser, server):
    assert len(PARAGRAPH) == 3000
    browser.open(server.base + "/")
    text = browser.text()
    assert LAST_SENTENCE in text
    assert browser.evaluate("document.getElementById('long').textContent.length") == 3000
    assert '<p id="long">' in browser.html()


def test_screenshot_is_a_full_page_png(browser, server, tmp_path):
    browser.open(server.base + "/")
    path = browser.screenshot(tmp_path / "shot.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk always comes first
    assert width == 1400
    assert height > 1000  # taller than the 1000px viewport: the whole page, not just what is on screen
    assert len(data) > 1000


def test_cookie_reaches_server(browser, server):
    browser.open(server.base + "/")
    browser.set_cookie("session", "abc123")
    browser.open(server.base + "/")
    assert "session=abc123" in server.cookies[-1]
    assert any(c["name"] == "session" for c in browser.cookies())


def test_errors_and_timeouts_are_reported(browser, server):
    browser.open(server.base + "/")
    with pytest.raises(CDPError, match="boom"):
        browser.evaluate("(() => { throw new Error('boom') })()")
    with pytest.raises(AssertionError, match="Press 1, 2 or t"):  # the failure quotes the page text
        browser.wait_for(lambda: False, timeout=0.3)


def test_key_event_fields():
    assert key_event("1") == {"key": "1", "code": "Digit1", "windowsVirtualKeyCode": 49, "nativeVirtualKeyCode": 49,
                              "text": "1", "unmodifiedText": "1"}
    assert key_event("Enter")["text"] == "\r"
    assert key_event("T")["modifiers"] == 8
    with pytest.raises(ValueError):
        key_event("NoSuchKey")
