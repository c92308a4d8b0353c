"""Optuna over panel shapes: the search space, the study and its trials."""
