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

Importing the package loads only its errors: every other name is imported on first use (PEP 562), so
``import chateval_dspy`` neither pays for DSPy, LiteLLM or pandas nor sets any environment variable.
"""

import chateval_dspy.lazy as lazy
from chateval_dspy.errors import BudgetExceeded, ChatEvalError, ConfigError, DataError, FatalLMError

# Type checkers read the lazy table below as these imports (a name bound to ``False`` rather than ``typing``'s,
# which mypy and pyright read alike, so that importing the package does not import ``typing``); a test keeps the two
# in step.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from chateval_dspy.config import DebateConfig
    from chateval_dspy.data.loaders import load_dataset
    from chateval_dspy.data.spec import DataSpec
    from chateval_dspy.data.splits import select, split
    from chateval_dspy.deploy.mlflow.judge import mlflow_judge
    from chateval_dspy.deploy.saved.judge import Judge, Verdict, load
    from chateval_dspy.deploy.serving.as_metric import as_metric
    from chateval_dspy.lm.adapter import DebateAdapter
    from chateval_dspy.lm.resolve import configure_cache, resolve_lm
    from chateval_dspy.lm.spec import LMSpec
    from chateval_dspy.program.chateval import ChatEval, build_evaluator
    from chateval_dspy.program.strategies import STRATEGIES
    from chateval_dspy.program.task import TaskSpec, load_task
    from chateval_dspy.run.evaluate import evaluate
    from chateval_dspy.run.evaluate_dataset import evaluate_dataset

# Public name -> the module that defines it, imported when the name is first used.
_LAZY = {
    "ChatEval": "chateval_dspy.program.chateval",
    "DataSpec": "chateval_dspy.data.spec",
    "DebateConfig": "chateval_dspy.config",
    "Judge": "chateval_dspy.deploy.saved.judge",
    "DebateAdapter": "chateval_dspy.lm.adapter",
    "LMSpec": "chateval_dspy.lm.spec",
    "STRATEGIES": "chateval_dspy.program.strategies",
    "TaskSpec": "chateval_dspy.program.task",
    "Verdict": "chateval_dspy.deploy.saved.judge",
    "as_metric": "chateval_dspy.deploy.serving.as_metric",
    "build_evaluator": "chateval_dspy.program.chateval",
    "configure_cache": "chateval_dspy.lm.resolve",
    "evaluate": "chateval_dspy.run.evaluate",
    "evaluate_dataset": "chateval_dspy.run.evaluate_dataset",
    "load": "chateval_dspy.deploy.saved.judge",
    "load_dataset": "chateval_dspy.data.loaders",
    "load_task": "chateval_dspy.program.task",
    "mlflow_judge": "chateval_dspy.deploy.mlflow.judge",  # imports MLflow only when called
    "resolve_lm": "chateval_dspy.lm.resolve",
    "select": "chateval_dspy.data.splits",
    "split": "chateval_dspy.data.splits",
}
__getattr__, __dir__ = lazy.exports(__name__, _LAZY)

__all__ = [
    "BudgetExceeded",
    "ChatEval",
    "ChatEvalError",
    "ConfigError",
    "DataError",
    "DataSpec",
    "DebateConfig",
    "FatalLMError",
    "Judge",
    "DebateAdapter",
    "LMSpec",
    "STRATEGIES",
    "TaskSpec",
    "Verdict",
    "as_metric",
    "build_evaluator",
    "configure_cache",
    "evaluate",
    "evaluate_dataset",
    "load",
    "load_dataset",
    "load_task",
    "mlflow_judge",
    "resolve_lm",
    "select",
    "split",
]

