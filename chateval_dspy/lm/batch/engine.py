"""``BatchEngine``: a DSPy engine whose calls are answered by the wave driver instead of a live request.

Each call builds the body a live call sends (``OpenAICompatEngine.request_body``), waits for its wave, and turns the
answer into DSPy's response, or a failed request into the error a live call would raise (the same abstention).
"""

from __future__ import annotations

import openai
import pydantic
from dspy import lm15
from dspy.lm15 import Response

from chateval_dspy.lm.adapter import current_style
from chateval_dspy.lm.batch.anthropic import with_marks
from chateval_dspy.lm.batch.provider import BatchRequest
from chateval_dspy.lm.batch.waves import BatchCallError, Waves, request_id
from chateval_dspy.lm.engine import OpenAICompatEngine


class BatchEngine(OpenAICompatEngine):
    """``dspy.LM(name, engine=BatchEngine(waves, model), num_retries=0)``, ``model`` the id the requests name."""

    def __init__(self, waves: Waves, model: str, **kwargs):
        super().__init__("batch", model, **kwargs)
        self.waves = waves

    @property
    def bounds(self) -> None:
        """None: no call or item deadline, as a call waits for its wave (minutes to hours) however long that is."""
        return None

    def _client(self, base_url: str, api_key: str):
        return None  # no live requests: the driver's provider holds the connection

    def __repr__(self) -> str:
        return f"BatchEngine(provider={self.waves.provider.name!r}, model={self.model!r})"

    def complete(self, request) -> Response:
        body = self.request_body(request)
        if self.waves.provider.name == "anthropic":  # it caches only at breakpoints, which DSPy's request cannot carry
            body = with_marks(body, current_style().mark_item)
        try:
            answer = self.waves.call(BatchRequest(request_id(body), body))
        except BatchCallError as exc:
            raise as_lm_error(exc.error, self.waves.provider.name) from exc
        try:
            completion = openai.types.chat.ChatCompletion.model_validate(answer)
        except pydantic.ValidationError as exc:
            raise lm15.ServerError(f"{self.waves.provider.name}: an answer that is not a chat completion "
                                   f"({exc.error_count()} problem(s))") from exc
        return self._response(completion)


def as_lm_error(error: dict, provider: str) -> Exception:
    """The DSPy error a live call would raise for a request that failed inside a batch.

    Example:
        >>> type(as_lm_error({"status": 400, "code": "invalid_request_error", "message": "bad"}, "openai")).__name__
        'InvalidRequestError'
        >>> type(as_lm_error({"status": None, "code": "batch_expired", "message": "late"}, "openai")).__name__
        'TimeoutError'
    """
    status, code = error.get("status"), str(error.get("code") or "error")[:80]
    text = f"{provider} batch: {code}: {str(error.get('message') or '')[:300]}"
    if status == 429:
        return lm15.RateLimitError(text, status=429)
    if status in (401, 403):
        return lm15.AuthError(text, status=status)
    if isinstance(status, int) and 400 <= status < 500:
        cls = lm15.ContextLengthError if "context" in text.lower() else lm15.InvalidRequestError
        return cls(text, status=status)
    if status is None:  # the batch ran out (expired, failed, cancelled) before this request was answered
        return lm15.TimeoutError(text, provider=provider)
    return lm15.ServerError(text, status=status)
