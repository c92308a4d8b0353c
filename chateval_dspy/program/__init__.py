"""The DSPy program: signatures (the prompts), personas, one referee, strategies, the debate loop,
and the pure functions around it (aggregation, position calibration, weighted scores).

``ChatEval`` (``chateval.py``) is what optimizers compile and what is saved and loaded. This package's
``__init__`` imports nothing: the task and strategy definitions load without DSPy.
"""
