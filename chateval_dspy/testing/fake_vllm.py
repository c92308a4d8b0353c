"""A stand-in for ``vllm run-batch`` watching a batch folder: it answers each wave's ``<label>.input.jsonl`` with a
``<label>.output.jsonl`` in the layout vLLM's offline runner writes (``tests/data/vllm_run_batch_output.jsonl``
holds a recorded one), using a fake server's answers. For tests of batch mode's folder mode (``--batch-dir``).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path

from chateval_dspy.testing.fake_server import FakeOpenAIServer


def run_batch_line(custom_id: str, completion: dict, model: str) -> dict:
    """One output line as vLLM's ``run_batch`` writes a success: ids ``vllm-...``, the body a chat completion.

    Example:
        >>> line = run_batch_line("c1", {"choices": [], "usage": {}}, "m")
        >>> line["custom_id"], line["response"]["status_code"], line["response"]["body"]["model"], line["error"]
        ('c1', 200, 'm', None)
    """
    body = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            **completion, "model": model, "prompt_logprobs": None}
    return {"id": f"vllm-{uuid.uuid4().hex}", "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": f"vllm-batch-{uuid.uuid4().hex}", "body": body},
            "error": None}


class FakeRunBatch:
    """``with FakeRunBatch(folder): ...``: a thread that answers every wave written to ``folder``.

    Args:
        folder: The batch folder (``--batch-dir``); created if missing.
        server: Whose ``reply`` answers each request (default: a ``FakeOpenAIServer`` with the default responder).
        poll: Seconds between looks at the folder.
    """

    def __init__(self, folder: str | Path, server: FakeOpenAIServer | None = None, poll: float = 0.02):
        self.folder, self.server, self.poll = Path(folder), server or FakeOpenAIServer(), poll
        self.waves: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> FakeRunBatch:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._watch, daemon=True, name="fake-vllm-run-batch")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.is_set():
            for path in sorted(self.folder.glob("*.input.jsonl")):
                out = path.with_name(path.name.removesuffix(".input.jsonl") + ".output.jsonl")
                if not out.exists():
                    self._answer(path, out)
            time.sleep(self.poll)

    def _answer(self, path: Path, out: Path) -> None:
        lines = []
        for request in map(json.loads, path.read_text(encoding="utf-8").splitlines()):
            reply = self.server.reply(request["body"])
            completion = {k: reply[k] for k in ("choices", "usage")}
            lines.append(json.dumps(run_batch_line(request["custom_id"], completion, request["body"].get("model", ""))))
        tmp = out.with_name(out.name + ".part")
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.replace(tmp, out)  # the engine's output appears whole, as a finished run_batch leaves it
        self.waves.append(path.name)
