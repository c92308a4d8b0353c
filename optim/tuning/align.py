"""``judge.align(traces, CompileAligner(...))``: an MLflow judge's panel tuned by ``chateval compile``'s optimizers.

``CompileAligner`` reads the human feedback on the traces (``chateval_dspy.deploy.mlflow.trace_labels``'s rule),
splits it into train and dev by its seed, and runs one of ``OPTIMIZERS`` over every referee's instructions and
demonstrations on the judge's own LM. Held-out figures are ``chateval compile --labels mlflow:<experiment>``'s job.
"""

from __future__ import annotations

import dspy

from chateval_dspy.data.splits import grouping, split
from chateval_dspy.deploy.mlflow.trace_labels import labels_from_traces
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.adapter import DebateAdapter
from optim.tuning.compile import OPTIMIZERS, OptimizerSettings, compile_evaluator
from optim.tuning.objectives import make_metric


class CompileAligner:
    """An MLflow alignment optimizer (``align(judge, traces) -> judge``) that compiles the panel. ``metric``:
    ``agreement``/``balanced`` (pairwise) or ``score_error`` (pointwise), default the first; ``dev``: the share of
    labelled items held out to select on (optimizers that select), drawn by ``settings.seed`` (docs/production.md).
    """

    def __init__(self, optimizer: str = "bootstrap", *, settings: OptimizerSettings | None = None,
                 metric: str | None = None, dev: float = 0.3):
        if optimizer not in OPTIMIZERS:
            raise ConfigError(f"unknown optimizer {optimizer!r}; choose one of: {', '.join(OPTIMIZERS)}")
        if not 0 <= dev < 1:
            raise ConfigError(f"dev must lie in [0, 1), got {dev}")
        self.optimizer, self.settings, self.metric, self.dev = optimizer, settings or OptimizerSettings(), metric, dev

    def align(self, judge, traces):
        loaded = judge.chateval
        task = loaded.task
        got = labels_from_traces(traces, task)
        items = list(got.items.values())
        if not items:
            raise ConfigError(f"align: none of the {len(list(traces))} traces carries usable human feedback")
        parts = split(items, seed=self.settings.seed, fractions=(1 - self.dev, self.dev, 0.0), group=grouping(task))
        train, dev = parts["train"] or items, parts["dev"]
        metric = make_metric(self.metric, task, train)
        with dspy.context(lm=loaded.lm, adapter=DebateAdapter()):
            compiled = compile_evaluator(loaded.program, optimizer=self.optimizer, trainset=train, valset=dev,
                                         metric=metric, settings=self.settings)
        card = {**got.card(), "optimizer": self.optimizer, "train": len(train), "dev": len(dev)}
        return judge.retuned(compiled, card)
