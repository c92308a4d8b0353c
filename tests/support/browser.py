"""A small headless-Chromium driver for tests, speaking the DevTools protocol over ``--remote-debugging-pipe``.

No websocket client or browser-automation package is installed here, so this talks CDP directly: Chromium
reads NUL-terminated JSON commands on its fd 3 and writes replies and events on its fd 4.

    with Browser(tmp_path / "profile") as b:
        b.open(url)                      # returns after the page's load event
        with b.expect_load():            # the key submits a form: wait for the page it leads to
            b.press("2")
        b.wait_for(lambda: "Saved: 2" in b.text())
        b.screenshot(tmp_path / "page.png")

Every wait has a deadline and fails with an ``AssertionError`` that quotes the page text, so a broken page
shows up as a readable test failure rather than a hung run.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The Debian package's /usr/bin/chromium is a shell launcher that sources /etc/chromium.d (which loads
# extensions and, on some hosts, trips over its own /dev/shm check); the binary behind it needs none of that.
_CANDIDATES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser")

_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-dev-shm-usage",  # container /dev/shm is often tiny; Chromium crashes rather than degrade
    "--hide-scrollbars",
    "--remote-debugging-pipe",
)

# Runs in the child before Chromium: Popen can keep fds open but not renumber them, and doing the dup2 in a
# preexec_fn would be undone by close_fds, which runs after it.
_FD_WRAPPER = (
    "import os,sys; r,w=int(sys.argv[1]),int(sys.argv[2]); os.dup2(r,3); os.dup2(w,4); os.close(r); os.close(w); "
    "os.execv(sys.argv[3], sys.argv[3:])"
)

# Keys whose DevTools description is not derivable from the character itself.
_SPECIAL_KEYS = {
    "Enter": ("Enter", 13, "\r"),
    "Tab": ("Tab", 9, ""),
    "Escape": ("Escape", 27, ""),
    "Backspace": ("Backspace", 8, ""),
    "Delete": ("Delete", 46, ""),
    " ": ("Space", 32, " "),
    "ArrowLeft": ("ArrowLeft", 37, ""),
    "ArrowUp": ("ArrowUp", 38, ""),
    "ArrowRight": ("ArrowRight", 39, ""),
    "ArrowDown": ("ArrowDown", 40, ""),
}


class CDPError(RuntimeError):
    """A DevTools command answered with an error (or the JS it evaluated threw)."""


def find_chromium() -> str | None:
    for name in _CANDIDATES:
        path = name if os.path.isabs(name) else shutil.which(name)
        if path and os.access(path, os.X_OK):
            return path
    return None


def _high_fd(fd: int) -> int:
    """Move ``fd`` to a number >= 10 so that making it 3 or 4 in the child can never overwrite the other end."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


def key_event(key: str) -> dict[str, Any]:
    """The ``Input.dispatchKeyEvent`` fields for one key, as a real keyboard would send them."""
    if key in _SPECIAL_KEYS:
        code, vk, text = _SPECIAL_KEYS[key]
    elif len(key) == 1 and key.isalpha():
        code, vk, text = f"Key{key.upper()}", ord(key.upper()), key
    elif len(key) == 1 and key.isdigit():
        code, vk, text = f"Digit{key}", ord(key), key
    elif len(key) == 1:
        code, vk, text = "", 0, key
    else:
        raise ValueError(f"no key description for {key!r}")
    event: dict[str, Any] = {"key": key, "code": code, "windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk}
    if key.isalpha() and key.isupper():
        event["modifiers"] = 8  # Shift: a page checking e.shiftKey should see what a person typing it would produce
    if text:
        event["text"] = event["unmodifiedText"] = text
    return event


class Browser:
    """One headless Chromium with one page, driven over the DevTools pipe. Use as a context manager."""

    def __init__(self, profile_dir: str | os.PathLike, width: int = 1280, height: int = 900,
                 timeout: float = 15.0, extra_args: tuple[str, ...] = ()) -> None:
        self.profile_dir = Path(profile_dir)
        self.width, self.height = width, height
        self.timeout = timeout
        self.extra_args = tuple(extra_args)
        self.events: list[dict[str, Any]] = []
        self.proc: subprocess.Popen | None = None
        self.session_id: str | None = None
        self._ids = itertools.count(1)
        self._replies: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._write_lock = threading.Lock()
        self._loads = 0
        self._dead = False
        self._to_chrome = self._from_chrome = -1
        self._reader: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------------------------

    def __enter__(self) -> Browser:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        binary = find_chromium()
        if binary is None:
            pytest.skip("chromium is not installed (looked for " + ", ".join(_CANDIDATES) + ")")
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        self._spawn(binary)
        self._reader = threading.Thread(target=self._read_loop, name="cdp-reader", daemon=True)
        self._reader.start()
        self._attach()

    def _spawn(self, binary: str) -> None:
        cmd_r, cmd_w = os.pipe()  # we write commands, Chromium reads them as fd 3
        rep_r, rep_w = os.pipe()  # Chromium writes replies as fd 4, we read them
        child_r, child_w = _high_fd(cmd_r), _high_fd(rep_w)
        args = [*_FLAGS, f"--user-data-dir={self.profile_dir}", f"--window-size={self.width},{self.height}",
                *self.extra_args, "about:blank"]
        self.log_path = self.profile_dir / "chromium-stderr.log"
        try:
            with open(self.log_path, "wb") as log:
                # A new session makes Chromium and its zygote/renderer children one process group to kill at the end.
                self.proc = subprocess.Popen(
                    [sys.executable, "-c", _FD_WRAPPER, str(child_r), str(child_w), binary, *args],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(child_r, child_w),
                    start_new_session=True,
                )
        finally:
            os.close(child_r)
            os.close(child_w)
        self._to_chrome, self._from_chrome = cmd_w, rep_r

    def _attach(self) -> None:
        targets = self.send("Target.getTargets", session=False, timeout=max(self.timeout, 30.0))["targetInfos"]
        pages = [t for t in targets if t.get("type") == "page"]
        if pages:
            self.target_id = pages[0]["targetId"]
        else:
            self.target_id = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        reply = self.send("Target.attachToTarget", {"targetId": self.target_id, "flatten": True}, session=False)
        self.session_id = reply["sessionId"]
        self.send("Page.enable")
        self.send("Runtime.enable")
        # Pins the page size so screenshots and layout don't depend on how headless sizes its window.
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})

    def close(self) -> None:
        """Ask Chromium to quit, then kill whatever of its process group is left. Safe to call twice."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None and not self._dead:
                with contextlib.suppress(Exception):
                    self.send("Browser.close", session=False, timeout=3.0)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
            # Renderers or the crash handler can outlive the browser process; the whole group goes.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
        for fd in (self._to_chrome, self._from_chrome):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._to_chrome = self._from_chrome = -1
        if self._reader is not None:
            self._reader.join(timeout=5.0)
            self._reader = None

    # ---- protocol --------------------------------------------------------------------------------------

    def _read_loop(self) -> None:
        buf = b""
        try:
            while True:
                chunk = os.read(self._from_chrome, 1 << 16)
                if not chunk:
                    break
                buf += chunk
                *messages, buf = buf.split(b"\0")
                for raw in messages:
                    if raw:
                        self._dispatch(json.loads(raw))
        except (OSError, ValueError):
            pass  # the pipe closed under us during shutdown, or Chromium died mid-message
        finally:
            with self._cond:
                self._dead = True
                self._cond.notify_all()

    def _dispatch(self, message: dict[str, Any]) -> None:
        with self._cond:
            if "id" in message:
                self._replies[message["id"]] = message
            else:
                self.events.append(message)
                if message.get("method") == "Page.loadEventFired" and message.get("sessionId") == self.session_id:
                    self._loads += 1
            self._cond.notify_all()

    def send(self, method: str, params: dict[str, Any] | None = None, *, session: bool = True,
             timeout: float | None = None) -> dict[str, Any]:
        """Send one command and return its ``result``; ``session=False`` addresses the browser, not the page."""
        msg_id = next(self._ids)
        message: dict[str, Any] = {"id": msg_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session_id
        data = json.dumps(message).encode() + b"\0"
        with self._write_lock:
            try:
                while data:
                    data = data[os.write(self._to_chrome, data):]
            except OSError as exc:
                raise CDPError(f"{method}: Chromium is gone ({exc}); {self._log_tail()}") from exc
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with self._cond:
            while msg_id not in self._replies:
                left = deadline - time.monotonic()
                if self._dead:
                    raise CDPError(f"{method}: Chromium closed the pipe; {self._log_tail()}")
                if left <= 0:
                    raise AssertionError(f"{method}: no reply within {timeout or self.timeout:g}s")
                self._cond.wait(left)
            reply = self._replies.pop(msg_id)
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error'].get('message')} {reply['error'].get('data', '')}".rstrip())
        return reply.get("result", {})

    def _log_tail(self) -> str:
        try:
            return "stderr tail: " + self.log_path.read_text(errors="replace")[-2000:]
        except (OSError, AttributeError):
            return "no stderr log"

    # ---- page ------------------------------------------------------------------------------------------

    def evaluate(self, expression: str, timeout: float | None = None) -> Any:
        """The value of a JS expression (promises awaited). Raises ``CDPError`` if it throws."""
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, timeout=timeout)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            description = details.get("exception", {}).get("description") or details.get("text")
            raise CDPError(f"JS error in {expression[:80]!r}: {description}")
        return result["result"].get("value")

    def text(self, timeout: float | None = None) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''", timeout) or ""

    def html(self, timeout: float | None = None) -> str:
        return self.evaluate("document.documentElement ? document.documentElement.outerHTML : ''", timeout) or ""

    def url(self) -> str:
        # The target's URL is known to the browser even while the page's JS context is being replaced.
        return self.send("Target.getTargetInfo", {"targetId": self.target_id}, session=False)["targetInfo"]["url"]

    def open(self, url: str, timeout: float | None = None) -> None:
        """Navigate and return once the new document has fired ``load``."""
        with self._cond:
            before = self._loads
        reply = self.send("Page.navigate", {"url": url})
        if reply.get("errorText"):
            raise AssertionError(f"navigation to {url} failed: {reply['errorText']}")
        # A same-document (fragment) navigation has no loader: no new document, so no load event will come.
        if reply.get("loaderId"):
            self.wait_for_load(before, timeout)

    def reload(self, timeout: float | None = None) -> None:
        with self.expect_load(timeout):
            self.send("Page.reload")

    @contextlib.contextmanager
    def expect_load(self, timeout: float | None = None) -> Iterator[None]:
        """Wait, after the block, for a page load that the block caused (a click, a key that submits a form).

        Counting from before the block means a load that finishes before we start waiting is not missed.
        A redirect after a POST ends in one load, of the final page.
        """
        with self._cond:
            before = self._loads
        yield
        self.wait_for_load(before, timeout)

    def wait_for_load(self, since: int | None = None, timeout: float | None = None) -> None:
        """Wait for a load event after the ``since``-th one (default: the next load from now)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with self._cond:
            target = self._loads if since is None else since
            while self._loads <= target and not self._dead:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            loaded = self._loads > target
        if not loaded:
            self._fail(f"no page load within {timeout or self.timeout:g}s")

    def wait_for(self, predicate: Callable[[], Any], timeout: float | None = None, interval: float = 0.1,
                 message: str = "") -> Any:
        """Poll ``predicate`` until it returns something truthy, and return that.

        Protocol errors count as "not yet": while a key press or form submit swaps documents, evaluating
        in the old page fails with "Execution context was destroyed" and the next try succeeds.
        """
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        last_error: Exception | None = None
        while True:
            try:
                value = predicate()
                if value:
                    return value
            except CDPError as exc:
                last_error = exc
            if time.monotonic() >= deadline:
                detail = f" (last error: {last_error})" if last_error else ""
                self._fail(f"condition not met within {timeout or self.timeout:g}s{detail}. {message}".rstrip())
            time.sleep(interval)

    def _fail(self, why: str) -> None:
        try:
            page = f"URL {self.url()}\npage text:\n{self.text(timeout=3.0)}"
        except Exception as exc:  # the page may be what is broken; report that instead of masking the failure
            page = f"(page text unavailable: {exc})"
        raise AssertionError(f"{why}\n{page[:4000]}")

    # ---- input, cookies, screenshots ------------------------------------------------------------------

    def press(self, key: str) -> None:
        """A real keyDown/keyUp pair, so keydown handlers, keypress, input events and Enter-submits all fire.

        If the key makes the page navigate, the keyUp can land on a document that is going away; that is
        expected, so its failure is ignored. Use ``expect_load`` around the press to wait for the new page.
        """
        event = key_event(key)
        down_type = "keyDown" if "text" in event else "rawKeyDown"  # keyDown with text also types the character
        self.send("Input.dispatchKeyEvent", {"type": down_type, **event})
        up = {k: v for k, v in event.items() if k not in ("text", "unmodifiedText")}
        with contextlib.suppress(CDPError, AssertionError):
            self.send("Input.dispatchKeyEvent", {"type": "keyUp", **up}, timeout=5.0)

    def type(self, text: str) -> None:
        for ch in text:
            self.press(ch)

    def set_cookie(self, name: str, value: str, url: str | None = None, **fields: Any) -> None:
        """Set a cookie for ``url`` (default: the current page); ``fields`` are more ``Network.setCookie`` params."""
        params = {"name": name, "value": value, "url": url or self.url(), **fields}
        if not self.send("Network.setCookie", params).get("success", True):
            raise CDPError(f"Chromium refused cookie {name!r} for {params['url']}")

    def cookies(self) -> list[dict[str, Any]]:
        return self.send("Network.getCookies")["cookies"]

    def screenshot(self, path: str | os.PathLike, full_page: bool = True) -> Path:
        """Write a PNG of the page (all of it, not just the viewport, unless ``full_page`` is false)."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            size = self.send("Page.getLayoutMetrics")["cssContentSize"]
            width = max(int(size["width"]), 1)
            height = max(int(size["height"]), 1)
            params.update(captureBeyondViewport=True, clip={"x": 0, "y": 0, "width": width, "height": height, "scale": 1})
        data = base64.b64decode(self.send("Page.captureScreenshot", params, timeout=max(self.timeout, 30.0))["data"])
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(data)
        return out
