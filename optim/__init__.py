"""Tuning chateval-dspy evaluators: DSPy optimizers, Optuna panel search, MLflow tracking.

One subpackage per idea: ``tuning`` (labels, metrics, ``chateval compile``), ``search`` (Optuna over panel shapes),
``tracking`` (MLflow runs and models, shared stores, reports), ``ablation`` (which referee earns its cost),
``review`` (people label what the panel is unsure of), ``bench`` (the benchmarks), ``cli`` (the ``chateval`` command).

Imports go one way: ``optim`` uses ``chateval_dspy``; production code never imports ``optim``.
"""
