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

# Public name -> the module that defines it, imported when the name is first used.
__getattr__, __dir__ = lazy.exports(__name__, {
    "ChatEval": "chateval_dspy.program.chateval",
    "DataSpec": "chateval_dspy.data.spec",
    "DebateConfig": "chateval_dspy.config",
    "Judge": "chateval_dspy.deploy.judge",
    "JudgeAdapter": "chateval_dspy.lm.adapter",
    "LMError": "chateval_dspy.errors",  # the deprecated name of FatalLMError
    "LMSpec": "chateval_dspy.lm.spec",
    "STRATEGIES": "chateval_dspy.program.strategies",
    "TaskSpec": "chateval_dspy.program.task",
    "Verdict": "chateval_dspy.deploy.judge",
    "as_metric": "chateval_dspy.deploy.metric",
    "build_evaluator": "chateval_dspy.program.chateval",
    "configure_cache": "chateval_dspy.lm.resolve",
    "evaluate": "chateval_dspy.run.evaluate",
    "evaluate_dataset": "chateval_dspy.run.evaluate_dataset",
    "load": "chateval_dspy.deploy.judge",
    "load_dataset": "chateval_dspy.data.loaders",
    "load_task": "chateval_dspy.program.task",
    "mlflow_judge": "chateval_dspy.deploy.mlflow_judge",  # imports MLflow only when called
    "resolve_lm": "chateval_dspy.lm.resolve",
    "select": "chateval_dspy.data.loaders",
    "split": "chateval_dspy.data.loaders",
})

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
    "JudgeAdapter",
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

