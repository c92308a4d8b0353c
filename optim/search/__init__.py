"""Optuna over panel shapes, one idea per module.

``space`` (what a trial may choose), ``study`` (storage, budget, shared attributes, dead workers),
``objective`` (one trial), ``finish`` (test and save the best panel), ``run`` (``chateval search``
as a function), ``worker`` (which process holds a trial, and whether it still lives).
"""
