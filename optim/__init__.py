"""Tuning chateval-dspy evaluators: DSPy optimizers, Optuna panel search, MLflow tracking.

Imports go one way: ``optim`` uses ``chateval_dspy``; production code never imports ``optim``.
"""
