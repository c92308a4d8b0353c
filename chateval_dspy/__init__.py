"""chateval-dspy: ChatEval's multi-referee debate as an optimizable DSPy program.

Example:
    >>> import chateval_dspy as ce
    >>> cfg = ce.DebateConfig(format="pairwise", roles=("general_public", "critic"))
    >>> program = ce.build_evaluator(cfg)
    >>> lm = ce.LMSpec(model=fake_url, cache=False)   # "embedded", a base URL, or a LiteLLM model string
    >>> with lm.judging():
    ...     verdict = program(question="2+2?", answer_1="4", answer_2="5")
    >>> verdict.preference in ("1", "2", "tie"), verdict.calls
    (True, 8)
"""

from chateval_dspy.lm.offline import ensure_offline

ensure_offline()  # must precede the first import of dspy/litellm

from chateval_dspy.config import DebateConfig  # noqa: E402
from chateval_dspy.data.loaders import load_dataset, select, split  # noqa: E402
from chateval_dspy.data.spec import DataSpec  # noqa: E402
from chateval_dspy.deploy.judge import Judge, Verdict, load  # noqa: E402
from chateval_dspy.deploy.metric import as_metric  # noqa: E402
from chateval_dspy.deploy.mlflow_judge import mlflow_judge  # noqa: E402 - imports MLflow only when called
from chateval_dspy.errors import BudgetExceeded, ChatEvalError, ConfigError, DataError, LMError  # noqa: E402
from chateval_dspy.lm.adapter import JudgeAdapter  # noqa: E402
from chateval_dspy.lm.resolve import configure_cache, resolve_lm  # noqa: E402
from chateval_dspy.lm.spec import LMSpec  # noqa: E402
from chateval_dspy.program.chateval import ChatEval, build_evaluator  # noqa: E402
from chateval_dspy.program.strategies import STRATEGIES  # noqa: E402
from chateval_dspy.run.evaluate import evaluate  # noqa: E402
from chateval_dspy.run.evaluate_dataset import evaluate_dataset  # noqa: E402

__all__ = [
    "BudgetExceeded",
    "ChatEval",
    "ChatEvalError",
    "ConfigError",
    "DataError",
    "DataSpec",
    "DebateConfig",
    "Judge",
    "JudgeAdapter",
    "LMError",
    "LMSpec",
    "STRATEGIES",
    "Verdict",
    "as_metric",
    "build_evaluator",
    "configure_cache",
    "evaluate",
    "evaluate_dataset",
    "load",
    "load_dataset",
    "mlflow_judge",
    "resolve_lm",
    "select",
    "split",
]
