"""Fakes that bill input tokens by the providers' prompt-caching rules, so cost tests and benchmarks need no network.

OpenAI (platform.openai.com/docs/guides/prompt-caching): caching is automatic and per model; a request's cached
tokens are the longest token prefix it shares with an earlier request's prompt, counted only from 1,024 tokens and
then in steps of 128 (1,023 shared -> 0, 1,100 -> 1,024, 1,300 -> 1,280); usage reports the whole prompt as
``prompt_tokens`` and the hit as ``prompt_tokens_details.cached_tokens``. Anthropic
(docs.anthropic.com/en/docs/build-with-claude/prompt-caching): caching happens only at ``cache_control``
breakpoints on system and message content blocks, at most 4 per request (more is a 400). Each breakpoint's prefix
is read from the cache if that exact prefix was written before, looking back over up to 20 earlier block
boundaries, and is otherwise written; a prefix shorter than the model's minimum (``anthropic_min_tokens``) is
neither written nor read. Usage reports ``cache_read_input_tokens`` (billed at 10%), ``cache_creation_input_tokens``
(from the end of the read prefix to the last cacheable breakpoint, billed at 125%) and ``input_tokens`` (the rest).
TTLs are ignored (a run lasts minutes). Tokens are o200k_base ids (tiktoken, offline from the files LiteLLM ships);
a prompt is its segments in order (system first, each message opened by a role marker ``<|role|>\\n``), each
tokenised on its own as a chat template's special tokens stop merges across messages, so equal leading messages
give equal leading tokens. Tool definitions and output formats are not counted.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import itertools
import json
import os
import threading
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import dspy

from chateval_dspy.testing.fake_lm import Call, ScriptedEngine, default_responder

O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
_ENV_LOCK = threading.Lock()

# (name fragment, minimum cacheable prefix), first match wins. Anthropic's table: 1,024 for Sonnet 4.5/4, Opus 4.1/4,
# Sonnet 3.7/3.5, Opus 3; 2,048 for Haiku 3.5 and Haiku 3. The rows for the newest models (Haiku 4.5, Opus 4.5/4.6:
# 4,096; Sonnet 4.6: 2,048) come from the same table as copied by gateway docs (docs.orq.ai), not checked at source.
ANTHROPIC_MIN_TOKENS = (("haiku-4", 4096), ("opus-4-5", 4096), ("opus-4-6", 4096), ("sonnet-4-6", 2048),
                        ("3-5-haiku", 2048), ("3-haiku", 2048), ("haiku-3", 2048))


def anthropic_min_tokens(model: str) -> int:
    """The minimum cacheable prefix for an Anthropic model name (1,024 unless the table says otherwise).

    Example:
        >>> anthropic_min_tokens("anthropic/claude-3-5-haiku-20241022"), anthropic_min_tokens("claude-sonnet-4-5")
        (2048, 1024)
    """
    name = model.rsplit("/", 1)[-1].lower()
    return next((n for fragment, n in ANTHROPIC_MIN_TOKENS if fragment in name), 1024)


class CacheControlError(ValueError):
    """A request Anthropic's API would refuse with a 400 (invalid_request_error)."""


def _litellm_tokenizers() -> str | None:
    # find_spec locates the package without importing it (importing LiteLLM costs seconds).
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
    return str(folder) if folder.is_dir() else None


@functools.cache
def o200k():
    """tiktoken's o200k_base encoding, loaded offline from LiteLLM's bundled copy.

    tiktoken reads its cache folder from ``TIKTOKEN_CACHE_DIR`` at load time only, so the variable points at
    LiteLLM's folder for the duration of the load (unless it already names a folder holding the file) and is
    then restored: nothing else in the process sees a change.
    """
    import tiktoken

    key = hashlib.sha1(O200K_URL.encode()).hexdigest()
    with _ENV_LOCK:
        saved = os.environ.get("TIKTOKEN_CACHE_DIR")
        folder = _litellm_tokenizers()
        swap = folder is not None and not (saved and os.path.exists(os.path.join(saved, key)))
        if swap:
            os.environ["TIKTOKEN_CACHE_DIR"] = folder
        try:
            return tiktoken.get_encoding("o200k_base")
        finally:
            if swap and saved is None:
                os.environ.pop("TIKTOKEN_CACHE_DIR", None)
            elif swap:
                os.environ["TIKTOKEN_CACHE_DIR"] = saved


@functools.lru_cache(maxsize=8192)
def o200k_tokens(text: str) -> tuple[int, ...]:
    """o200k_base token ids of ``text``; special-token text is ordinary text here. Memoised: prompts repeat."""
    return tuple(o200k().encode(text, disallowed_special=()))


@dataclass(frozen=True)
class Segment:
    """A piece of prompt text in order; ``breakpoint`` when an Anthropic ``cache_control`` mark ends it."""

    text: str
    breakpoint: bool = False


def _block_text(block) -> str:
    if isinstance(block, str):
        return block
    if "text" in block:
        return str(block["text"])
    return json.dumps({k: v for k, v in block.items() if k != "cache_control"}, sort_keys=True)


def chat_segments(system, messages: Iterable[dict]) -> list[Segment]:
    """The segments of a chat request (OpenAI or Anthropic shape): the system blocks, then each message's content
    blocks, a role marker opening each message's first block; a block with ``cache_control`` ends at a breakpoint.
    """
    turns = ([{"role": "system", "content": system}] if system else []) + list(messages)
    out: list[Segment] = []
    for turn in turns:
        content = turn.get("content")
        blocks = content if isinstance(content, list) else [content or ""]
        marker = f"<|{turn.get('role', 'user')}|>\n"
        for i, block in enumerate(blocks or [""]):
            mark = isinstance(block, dict) and bool(block.get("cache_control"))
            out.append(Segment((marker if i == 0 else "") + _block_text(block), mark))
    return out


def request_segments(request) -> list[Segment]:
    """The segments of a ``dspy.lm15.Request`` (no cache marks: lm15 types carry none)."""
    system = request.system if isinstance(request.system, str) else "".join(p.text for p in request.system or ())
    messages = [{"role": m.role, "content": m.text if m.text is not None else
                 "\n".join(getattr(p, "text", None) or repr(p) for p in m.parts)} for m in request.messages]
    return chat_segments(system, messages)


@dataclass(frozen=True)
class Bill:
    """One request's input tokens as billed: all of them, those read from the cache and those written to it."""

    prompt_tokens: int
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0

    def openai_usage(self, completion_tokens: int) -> dict:
        """OpenAI's chat completion ``usage`` (prompt_tokens include the cached ones)."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": self.prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cache_read_tokens}}

    def anthropic_usage(self, output_tokens: int) -> dict:
        """Anthropic's Messages ``usage`` (the three input counters are disjoint)."""
        uncached = self.prompt_tokens - self.cache_read_tokens - self.cache_write_tokens
        return {"input_tokens": uncached, "cache_read_input_tokens": self.cache_read_tokens,
                "cache_creation_input_tokens": self.cache_write_tokens, "output_tokens": output_tokens}

    def lm15_usage(self, output_tokens: int) -> dspy.lm15.Usage:
        """``dspy.lm15.Usage`` as for OpenAI: input includes the cached tokens; writes are not reported."""
        return dspy.lm15.Usage(input_tokens=self.prompt_tokens, output_tokens=output_tokens,
                               cache_read_tokens=self.cache_read_tokens,
                               cache_write_tokens=self.cache_write_tokens or None)


class _PromptCache:
    """Tokenising and thread-safe per-model cache state shared by both rules."""

    def __init__(self, encode: Callable[[str], Iterable[int]] | None = None):
        self.encode = encode or o200k_tokens
        self._lock = threading.Lock()
        self._store: dict[str, set[bytes]] = {}

    def count(self, text: str) -> int:
        """Tokens in ``text`` (output tokens, say)."""
        return len(tuple(self.encode(text)))

    def reset(self) -> None:
        """Forget every cached prefix (a cold cache)."""
        with self._lock:
            self._store.clear()


class OpenAICaching(_PromptCache):
    """OpenAI's automatic prefix caching: ``bill(segments, model) -> Bill`` with ``cache_read_tokens`` the hit, counted
    from ``min_tokens`` in steps of ``step``; ``encode`` turns text into token ids (default: o200k_base).

    Example (one token per character):
        >>> billing = OpenAICaching(encode=lambda text: map(ord, text))
        >>> [billing.bill([Segment("x" * 1300)]).cache_read_tokens for _ in range(2)]
        [0, 1280]
    """

    def __init__(self, encode: Callable[[str], Iterable[int]] | None = None, min_tokens: int = 1024, step: int = 128):
        super().__init__(encode)
        self.min_tokens, self.step = min_tokens, step

    def bill(self, segments: Iterable[Segment], model: str = "") -> Bill:
        tokens = [t for seg in segments for t in self.encode(seg.text)]
        # A digest of every checkpoint prefix (1,024, 1,152, ...): shared prefixes are prefix-closed, so the
        # hit is the last checkpoint before the first miss, and an earlier prompt registers all of its own.
        digest, keys, start = hashlib.blake2b(digest_size=16), [], 0
        for end in range(self.min_tokens, len(tokens) + 1, self.step):
            digest.update(array("I", tokens[start:end]).tobytes())
            keys.append((end, digest.digest()))
            start = end
        with self._lock:
            seen = self._store.setdefault(model, set())
            cached = max((end for end, key in itertools.takewhile(lambda k: k[1] in seen, keys)), default=0)
            seen.update(key for _, key in keys)
        return Bill(len(tokens), cached)


class AnthropicCaching(_PromptCache):
    """Anthropic's explicit caching: ``bill(segments, model) -> Bill`` with reads and writes at breakpoints.

    ``encode`` defaults to o200k_base, a stand-in for Anthropic's own tokenizer; ``min_tokens=None`` takes
    ``anthropic_min_tokens(model)`` per request; more marks than ``max_breakpoints`` raise ``CacheControlError``.
    """

    def __init__(self, encode: Callable[[str], Iterable[int]] | None = None, min_tokens: int | None = None,
                 lookback: int = 20, max_breakpoints: int = 4):
        super().__init__(encode)
        self.min_tokens, self.lookback, self.max_breakpoints = min_tokens, lookback, max_breakpoints

    def bill(self, segments: Iterable[Segment], model: str = "") -> Bill:
        segments = list(segments)
        marks = [i for i, seg in enumerate(segments) if seg.breakpoint]
        if len(marks) > self.max_breakpoints:
            raise CacheControlError(f"A maximum of {self.max_breakpoints} blocks with cache_control may be "
                                    f"provided. Found {len(marks)}.")
        minimum = self.min_tokens if self.min_tokens is not None else anthropic_min_tokens(model)
        digest, ends, keys, total = hashlib.blake2b(digest_size=16), [], [], 0
        for seg in segments:
            ids = array("I", self.encode(seg.text))
            digest.update(ids.tobytes())
            total += len(ids)
            ends.append(total)
            keys.append(digest.digest())
        cacheable = [i for i in marks if ends[i] >= minimum]
        read = 0
        with self._lock:
            written = self._store.setdefault(model, set())
            for i in cacheable:
                hit = next((j for j in range(i, max(-1, i - self.lookback - 1), -1)
                            if ends[j] >= minimum and keys[j] in written), None)
                read = max(read, ends[hit]) if hit is not None else read
            written.update(keys[i] for i in cacheable)
        last = max((ends[i] for i in cacheable), default=0)
        return Bill(total, read, max(0, last - read))


class BilledEngine(ScriptedEngine):
    """``ScriptedEngine`` whose usage follows OpenAI's caching rule, for benchmarks with no HTTP in the way.

    Each response carries ``dspy.lm15.Usage(input_tokens=<whole prompt>, output_tokens=...,
    cache_read_tokens=<hit>)``; ``bills`` keeps each request's ``Bill``. Pass one ``billing`` to several engines
    to share a cache between them.
    """

    def __init__(self, responder: Callable[[Call], dict | str] = default_responder, latency: float = 0.0,
                 billing: OpenAICaching | None = None):
        super().__init__(responder, latency)
        self.billing = billing or OpenAICaching()
        self.bills: list[Bill] = []

    def complete(self, request) -> dspy.lm15.Response:
        response = super().complete(request)
        bill = self.billing.bill(request_segments(request), model=request.model)
        with self._lock:
            self.bills.append(bill)
        output = self.billing.count(response.message.text or "")
        return replace(response, usage=bill.lm15_usage(output))


def billed_lm(responder: Callable[[Call], dict | str] = default_responder, model: str = "fake/billed",
              billing: OpenAICaching | None = None) -> dspy.LM:
    """A ``dspy.LM`` over a ``BilledEngine`` (reachable as ``lm.engine``), with the cache off."""
    return dspy.LM(model, engine=BilledEngine(responder, billing=billing), cache=False, temperature=0.0,
                   max_tokens=256, num_retries=0)
