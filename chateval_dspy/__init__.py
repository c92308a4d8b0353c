"""chateval-dspy: ChatEval's multi-referee debate as an optimizable DSPy program.

Example:
    >>> import dspy, chateval_dspy as ce
    >>> cfg = ce.DebateConfig(format="pairwise", roles=("general_public", "critic"))
    >>> program = ce.build_evaluator(cfg)
    >>> with ce.resolve_lm("embedded") as lm, dspy.context(lm=lm, adapter=ce.JudgeAdapter()):  # doctest: +SKIP
    ...     verdict = program(question="...", answer_1="...", answer_2="...")
"""

from chateval_dspy.offline import ensure_offline

ensure_offline()  # must precede the first import of dspy/litellm

from chateval_dspy.adapter import JudgeAdapter  # noqa: E402
from chateval_dspy.config import DebateConfig  # noqa: E402
from chateval_dspy.data import load_dataset, select, split  # noqa: E402
from chateval_dspy.errors import ChatEvalError, ConfigError, DataError, LMError  # noqa: E402
from chateval_dspy.evaluate import evaluate  # noqa: E402
from chateval_dspy.lm import configure_cache, resolve_lm  # noqa: E402
from chateval_dspy.program import ChatEval, build_evaluator  # noqa: E402
from chateval_dspy.strategies import STRATEGIES  # noqa: E402

__all__ = [
    "ChatEval",
    "ChatEvalError",
    "ConfigError",
    "DataError",
    "DebateConfig",
    "JudgeAdapter",
    "LMError",
    "STRATEGIES",
    "build_evaluator",
    "configure_cache",
    "evaluate",
    "load_dataset",
    "resolve_lm",
    "select",
    "split",
]
