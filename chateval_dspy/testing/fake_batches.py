"""OpenAI's Batch API (``/v1/files``, ``/v1/batches``) for the scripted fake server, with fault knobs.

``FakeOpenAIServer`` owns a ``FakeBatches`` and hands it every files/batches request (``route``); each batched
request is answered with the server's own ``reply``, so its usage follows the server's billing. Batches move on
only when read (retrieve, list, cancel): no background threads.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs

ENDPOINT = "/v1/chat/completions"
EXPIRED = {"code": "batch_expired", "message": "This request could not be executed before the completion window expired."}
_JSON_LIMIT = 1 << 20  # a batch create or cancel body is a few hundred bytes
_DRAIN_LIMIT = 64 << 20  # past this a refused upload is cut off rather than read to its end


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


@dataclass
class _File:
    meta: dict
    data: bytes


@dataclass
class _Batch:
    obj: dict  # the API object, as retrieve returns it
    started: float
    requests: list[tuple[str, dict]] = field(default_factory=list)
    problems: list[dict] = field(default_factory=list)  # set at create: the batch will end "failed"
    ids: list[str] = field(default_factory=list)  # every custom_id read, valid line or not
    expire: bool = False


def _new_id(prefix: str) -> str:
    return prefix + uuid.uuid4().hex[:24]


def _read_lines(data: bytes, endpoint: str) -> tuple[list[tuple[str, dict]], list[dict], list[str]]:
    """The valid requests of an input file, its problems (as batch ``errors`` entries), every custom_id read."""
    requests, problems, ids = [], [], []
    seen: set[str] = set()

    def problem(code: str, message: str, param: str | None = None, line: int | None = None) -> None:
        problems.append({"code": code, "message": message, "param": param, "line": line})

    for number, raw in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            problem("invalid_json_line", "This line is not parseable as valid JSON.", line=number)
            continue
        cid = line.get("custom_id") if isinstance(line, dict) else None
        if not isinstance(cid, str) or not cid:
            problem("missing_required_parameter", "Missing required parameter: 'custom_id'.", "custom_id", number)
            continue
        ids.append(cid)
        if cid in seen:
            problem("duplicate_custom_id", "The custom_id for each request must be unique.", "custom_id", number)
        elif line.get("method") != "POST" or line.get("url") != endpoint or not isinstance(line.get("body"), dict):
            problem("invalid_request", f"Each line must POST a JSON body to {endpoint}.", line=number)
        else:
            requests.append((cid, line["body"]))
        seen.add(cid)
    if not requests and not problems:
        problem("empty_file", "The input file has no requests.")
    return requests, problems, ids


def _multipart(headers, data: bytes) -> tuple[dict[str, str], tuple[str, bytes] | None]:
    """The text fields of a multipart/form-data body and its ``file`` part as ``(filename, bytes)``."""
    head = f"Content-Type: {headers.get('Content-Type', '')}\r\n\r\n".encode()
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + data)
    if not message.is_multipart():
        raise _HTTPError(400, "Expected a multipart/form-data body.")
    fields, upload = {}, None
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        if name == "file":
            upload = (part.get_filename() or "upload.jsonl", payload)
        elif name:
            fields[name] = payload.decode("utf-8", "replace")
    return fields, upload


class FakeBatches:
    """The files and batches a fake OpenAI server holds, and how its batches misbehave.

    Args:
        delay: Seconds from creation until a batch finishes (it reads ``in_progress`` until then).
        expire: The next this many valid batches end ``expired``, answering only part of their requests.
        expire_keep: The share of an expired batch's requests (rounded down) that got answered.
        fail: ``fail(custom_id, body) -> status | None`` or ``{custom_id: status}``: requests that fail with
            that HTTP status (a line in the error file) instead of being answered.
        fail_times: How many times each custom_id fails, counted over all batches (so a resubmission succeeds).
        fail_batches: The next this many valid batches end ``failed`` as a whole, with no output.
        max_upload_bytes: Larger uploads are refused with 413.
        create_delay: Seconds a batch creation takes to answer, the batch already created (a client killed
            meanwhile never learns its id: the case a submitter must find again by its metadata).
        clock: Seconds now (``time.time``); tests may pass their own to skip waiting.
        forge: ``forge(batch_id, lines) -> lines``: rewrites a finishing batch's output lines (dicts, as
            written) before they are stored: answers to requests never made, second copies, padding.
        endless_list: The list of batches always says ``has_more`` and repeats its first page.

    ``submitted``, ``created``, ``requests_in`` and ``listed`` let tests count what was asked.
    """

    def __init__(self, *, delay: float = 0.0, expire: int = 0, expire_keep: float = 0.5,
                 fail: Callable[[str, dict], int | None] | dict | None = None, fail_times: int = 1,
                 fail_batches: int = 0, max_upload_bytes: int = 200 << 20, clock: Callable[[], float] = time.time,
                 create_delay: float = 0.0, forge: Callable[[str, list[dict]], list[dict]] | None = None,
                 endless_list: bool = False):
        self.delay, self.expire, self.expire_keep = delay, expire, expire_keep
        self.fail, self.fail_times, self.fail_batches = fail, fail_times, fail_batches
        self.max_upload_bytes, self.clock, self.create_delay = max_upload_bytes, clock, create_delay
        self.forge, self.endless_list = forge, endless_list
        self.listed = 0  # list requests answered
        self.reply: Callable[[dict], dict] | None = None  # set by the server that owns this
        self.submitted: Counter[str] = Counter()  # custom_id -> lines carrying it, over all batches
        self.created: list[str] = []  # batch ids, oldest first
        self.files: dict[str, _File] = {}
        self.batches: dict[str, _Batch] = {}
        self._failed: Counter[str] = Counter()
        self._lock = threading.RLock()

    def requests_in(self, batch_id: str) -> list[str]:
        """The custom_ids read from a batch's input file, in file order ([] for an unknown batch)."""
        with self._lock:
            return list(self.batches[batch_id].ids) if batch_id in self.batches else []

    # ---- files

    def add_file(self, data: bytes, filename: str, purpose: str) -> dict:
        """Store a file and return its file object."""
        meta = {"id": _new_id("file-"), "object": "file", "bytes": len(data), "created_at": int(self.clock()),
                "filename": filename, "purpose": purpose, "status": "processed", "expires_at": None,
                "status_details": None}
        with self._lock:
            self.files[meta["id"]] = _File(meta, data)
        return meta

    def _file(self, file_id: str) -> _File:
        with self._lock:
            if file_id not in self.files:
                raise _HTTPError(404, f"No such File object: {file_id}")
            return self.files[file_id]

    def _upload(self, headers, rfile) -> dict:
        size = int(headers.get("Content-Length") or 0)
        if size > self.max_upload_bytes:
            # read what the client is still sending (up to a bound), else closing on unread bytes resets the
            # connection and the client never sees the 413
            left = min(size, _DRAIN_LIMIT)
            while left > 0 and (chunk := rfile.read(min(left, 1 << 16))):
                left -= len(chunk)
            raise _HTTPError(413, f"File too large: {size} bytes (at most {self.max_upload_bytes}).")
        fields, upload = _multipart(headers, rfile.read(size))
        if upload is None or not fields.get("purpose"):
            raise _HTTPError(400, "Both 'file' and 'purpose' are required.")
        return self.add_file(upload[1], upload[0], fields["purpose"])

    # ---- batches

    def create(self, input_file_id: str, endpoint: str = ENDPOINT, completion_window: str = "24h",
               metadata: dict | None = None) -> dict:
        """Start a batch over an uploaded ``purpose="batch"`` file; it reads ``validating`` until next read."""
        if endpoint != ENDPOINT:
            raise _HTTPError(400, f"This fake batches only {ENDPOINT}, not {endpoint!r}.")
        if completion_window != "24h":
            raise _HTTPError(400, "completion_window must be '24h'.")
        source = self._file(input_file_id)
        if source.meta["purpose"] != "batch":
            raise _HTTPError(400, f"File {input_file_id} has purpose {source.meta['purpose']!r}, not 'batch'.")
        requests, problems, ids = _read_lines(source.data, endpoint)
        now = self.clock()
        obj = {"id": _new_id("batch_"), "object": "batch", "endpoint": endpoint, "input_file_id": input_file_id,
               "completion_window": completion_window, "status": "validating", "output_file_id": None,
               "error_file_id": None, "created_at": int(now), "in_progress_at": None, "expires_at": int(now) + 86400,
               "finalizing_at": None, "completed_at": None, "failed_at": None, "expired_at": None,
               "cancelling_at": None, "cancelled_at": None, "request_counts": {"total": 0, "completed": 0, "failed": 0},
               "metadata": metadata, "errors": None, "model": next((b.get("model") for _, b in requests), None)}
        batch = _Batch(obj, now, requests, problems, ids)
        with self._lock:
            if not problems and self.fail_batches > 0:
                self.fail_batches -= 1
                batch.problems = [{"code": "batch_failed", "message": "injected batch failure", "param": None,
                                   "line": None}]
            elif not problems and self.expire > 0:
                self.expire -= 1
                batch.expire = True
            self.submitted.update(ids)
            self.created.append(obj["id"])
            self.batches[obj["id"]] = batch
            answer = dict(obj)
        time.sleep(self.create_delay)
        return answer

    def _batch(self, batch_id: str) -> _Batch:
        if batch_id not in self.batches:
            raise _HTTPError(404, f"No batch found with id '{batch_id}'.")
        batch = self.batches[batch_id]
        self._advance(batch)
        return batch

    def retrieve(self, batch_id: str) -> dict:
        """The batch object now (reading it is what moves it on)."""
        with self._lock:
            return dict(self._batch(batch_id).obj)

    def list(self, limit: int = 20, after: str | None = None) -> dict:
        """Batches newest first, ``limit`` of them after the batch id ``after``."""
        with self._lock:
            self.listed += 1
            ids = self.created[::-1]
            start = ids.index(after) + 1 if after in ids and not self.endless_list else 0
            page = [dict(self._batch(i).obj) for i in ids[start:start + limit]]
            return {"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                    "last_id": page[-1]["id"] if page else None,
                    "has_more": self.endless_list or start + limit < len(ids)}

    def cancel(self, batch_id: str) -> dict:
        """Cancel an unfinished batch: ``cancelling`` now, ``cancelled`` (no output) when next read."""
        with self._lock:
            batch = self._batch(batch_id)
            status = batch.obj["status"]
            if status in ("validating", "in_progress"):
                batch.obj.update(status="cancelling", cancelling_at=int(self.clock()))
            elif status not in ("cancelling", "cancelled"):
                raise _HTTPError(409, f"Cannot cancel a batch with status '{status}'.")
            return dict(batch.obj)

    def _advance(self, batch: _Batch) -> None:
        """Move a batch on as far as the clock allows (the caller holds the lock)."""
        obj, now = batch.obj, self.clock()
        if obj["status"] == "cancelling":
            obj.update(status="cancelled", cancelled_at=int(now),
                       request_counts={"total": len(batch.requests), "completed": 0, "failed": 0})
        elif obj["status"] == "validating" and batch.problems:
            obj.update(status="failed", failed_at=int(now), errors={"object": "list", "data": batch.problems})
        elif obj["status"] == "validating":
            obj.update(status="in_progress", in_progress_at=int(now),
                       request_counts={"total": len(batch.requests), "completed": 0, "failed": 0})
        if obj["status"] == "in_progress" and now - batch.started >= self.delay:
            self._finish(batch, int(now))

    def _injected(self, custom_id: str, body: dict) -> int | None:
        """The status this request fails with this time, if any (consuming one of its ``fail_times``)."""
        if self.fail is None or self._failed[custom_id] >= self.fail_times:
            return None
        status = self.fail.get(custom_id) if isinstance(self.fail, dict) else self.fail(custom_id, body)
        if status:
            self._failed[custom_id] += 1
        return status

    def _finish(self, batch: _Batch, now: int) -> None:
        """Answer the batch's requests into an output file and an error file, and close it."""
        if self.reply is None:
            raise RuntimeError("FakeBatches.reply is unset: give this FakeBatches to a FakeOpenAIServer")
        keep = int(len(batch.requests) * self.expire_keep) if batch.expire else len(batch.requests)
        out, err = [], []
        for i, (cid, body) in enumerate(batch.requests):
            line = {"id": _new_id("batch_req_"), "custom_id": cid, "response": None, "error": None}
            status = None if i >= keep else self._injected(cid, body)
            if i >= keep:
                line["error"] = dict(EXPIRED)
            elif status:
                kind = "server_error" if status >= 500 else "invalid_request_error"
                line["response"] = {"status_code": status, "request_id": _new_id("req_"),
                                    "body": {"error": {"message": "injected", "type": kind, "param": None, "code": None}}}
            else:
                line["response"] = {"status_code": 200, "request_id": _new_id("req_"), "body": self.reply(body)}
            (out if line["response"] and line["response"]["status_code"] == 200 else err).append(line)
        obj = batch.obj
        if self.forge is not None:
            out = self.forge(obj["id"], out)
        obj.update(finalizing_at=now, request_counts={"total": len(batch.requests), "completed": len(out),
                                                      "failed": len(err)})
        if out:
            obj["output_file_id"] = self.add_file(_jsonl(out), f"{obj['id']}_output.jsonl", "batch_output")["id"]
        if err:
            obj["error_file_id"] = self.add_file(_jsonl(err), f"{obj['id']}_error.jsonl", "batch_output")["id"]
        obj.update({"status": "expired", "expired_at": now} if batch.expire else {"status": "completed", "completed_at": now})

    # ---- HTTP

    def route(self, method: str, target: str, headers, rfile) -> tuple[int, bytes, str] | None:
        """Answer one HTTP request as ``(status, body, content type)``; None when ``target`` is no files/batches path."""
        path, _, query = target.partition("?")
        parts = path.rstrip("/").split("/")[1:]
        if parts[:1] != ["v1"] or len(parts) < 2 or parts[1] not in ("files", "batches"):
            return None
        try:
            status, payload = self._dispatch(method, parts[1], parts[2:], parse_qs(query), headers, rfile)
        except _HTTPError as e:
            status, payload = e.status, {"error": {"message": e.message, "type": e.kind, "param": None, "code": None}}
        if isinstance(payload, bytes):
            return status, payload, "application/octet-stream"
        return status, json.dumps(payload).encode(), "application/json"

    def _dispatch(self, method: str, kind: str, rest: list[str], query: dict, headers, rfile) -> tuple[int, dict | bytes]:
        if kind == "files":
            if method == "POST" and not rest:
                return 200, self._upload(headers, rfile)
            if method == "GET" and len(rest) == 1:
                return 200, dict(self._file(rest[0]).meta)
            if method == "GET" and len(rest) == 2 and rest[1] == "content":
                return 200, self._file(rest[0]).data
            if method == "DELETE" and len(rest) == 1:
                with self._lock:
                    self._file(rest[0])
                    del self.files[rest[0]]
                return 200, {"id": rest[0], "object": "file", "deleted": True}
        elif method == "POST" and not rest:
            body = _json_body(headers, rfile)
            return 200, self.create(body.get("input_file_id", ""), body.get("endpoint", ""),
                                    body.get("completion_window", ""), body.get("metadata"))
        elif method == "GET" and not rest:
            limit = int(query.get("limit", ["20"])[0])
            return 200, self.list(max(1, min(limit, 100)), query.get("after", [None])[0])
        elif method == "GET" and len(rest) == 1:
            return 200, self.retrieve(rest[0])
        elif method == "POST" and len(rest) == 2 and rest[1] == "cancel":
            _json_body(headers, rfile)  # read whatever was sent, so the connection stays in step
            return 200, self.cancel(rest[0])
        raise _HTTPError(404, f"Invalid URL ({method} /v1/{kind}/{'/'.join(rest)})")


def _jsonl(lines: list[dict]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _json_body(headers, rfile) -> dict:
    size = int(headers.get("Content-Length") or 0)
    if size > _JSON_LIMIT:
        raise _HTTPError(413, "Request body too large.")
    try:
        body = json.loads(rfile.read(size) or b"{}")
    except ValueError as e:
        raise _HTTPError(400, "The body is not valid JSON.") from e
    if not isinstance(body, dict):
        raise _HTTPError(400, "The body must be a JSON object.")
    return body
