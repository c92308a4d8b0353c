"""The DSPy program: signatures (the prompts), personas, one referee, strategies, the debate loop,
and the pure functions around it (aggregation, position calibration, weighted scores).

``ChatEval`` (``chateval.py``) is what optimizers compile and what is saved and loaded.
"""

from chateval_dspy.program.chateval import ChatEval, build_evaluator
from chateval_dspy.program.strategies import STRATEGIES

__all__ = ["STRATEGIES", "ChatEval", "build_evaluator"]
