"""LM plumbing, entered once at the edge: the offline switches, ``resolve_lm`` (embedded server,
base URL or LiteLLM string), the OpenAI-compatible engine and the JSON adapter.

Names are imported on first use (``chateval_dspy.lazy``): importing a light module of this package,
such as ``chateval_dspy.lm.offline``, does not import DSPy or the OpenAI client.
"""

import chateval_dspy.lazy as lazy

__getattr__, __dir__ = lazy.exports(__name__, {
    "EMBEDDED": "chateval_dspy.lm.resolve",
    "JudgeAdapter": "chateval_dspy.lm.adapter",
    "configure_cache": "chateval_dspy.lm.resolve",
    "ensure_offline": "chateval_dspy.lm.offline",
    "resolve_lm": "chateval_dspy.lm.resolve",
})

__all__ = ["EMBEDDED", "JudgeAdapter", "configure_cache", "ensure_offline", "resolve_lm"]
