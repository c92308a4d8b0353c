"""LM plumbing, entered once at the edge: the offline switches, ``resolve_lm`` (embedded server,
base URL or LiteLLM string), the OpenAI-compatible engine and the JSON adapter."""

from chateval_dspy.lm.offline import ensure_offline

ensure_offline()  # before dspy/litellm are imported below

from chateval_dspy.lm.adapter import JudgeAdapter  # noqa: E402
from chateval_dspy.lm.resolve import EMBEDDED, configure_cache, resolve_lm  # noqa: E402

__all__ = ["EMBEDDED", "JudgeAdapter", "configure_cache", "ensure_offline", "resolve_lm"]
