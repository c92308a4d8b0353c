"""The DSPy program: signatures (the prompts), personas, one referee, strategies, the debate loop,
and the pure functions around it (aggregation, position calibration, weighted scores).

``ChatEval`` (``chateval.py``) is what optimizers compile and what is saved and loaded. Names are imported
on first use (``chateval_dspy.lazy``): the task and strategy definitions load without DSPy.
"""

import chateval_dspy.lazy as lazy

__getattr__, __dir__ = lazy.exports(__name__, {
    "ChatEval": "chateval_dspy.program.chateval",
    "STRATEGIES": "chateval_dspy.program.strategies",
    "build_evaluator": "chateval_dspy.program.chateval",
})

__all__ = ["STRATEGIES", "ChatEval", "build_evaluator"]
