"""ChatEval: the debate wrapped in position calibration and aggregation.

``ChatEval`` is the DSPy program that optimizers compile and that is saved and
loaded. Calibration and aggregation are pure functions around the one debate.
"""

from __future__ import annotations

import dspy

from chateval_dspy.concurrency import parallel_map
from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.engine import bounds_of, item_scope
from chateval_dspy.program import calibration
from chateval_dspy.program.aggregate import pairwise_verdict, pointwise_verdict
from chateval_dspy.program.debate import Debate
from chateval_dspy.program.roles import Role, resolve_roles


class ChatEval(dspy.Module):
    """A multi-referee debate evaluator of ``config``'s shape; ``roles`` (default: resolved from ``config.roles`` and
    ``config.role_file``) lets a saved evaluator pass the personas from its card.

    The prediction's fields are a results line's (``run.evaluate.result_record``; ``preference`` None when every
    referee abstained). Each call is one item, within the LM's ``item_deadline``. With calibration the two answer
    orders run at once, unless ``parallel_orders`` is False (not part of the config: it changes time, never a verdict).

    Example:
        >>> program = ChatEval(DebateConfig(roles=("critic",), turns=1))
        >>> for name, _ in program.named_predictors():
        ...     print(name)
        debate.referees['critic'].argue
        debate.referees['critic'].judge
    """

    def __init__(self, config: DebateConfig, roles: list[Role] | None = None, *, parallel_orders: bool = True):
        super().__init__()
        self.config = config
        self.parallel_orders = parallel_orders
        self.roles = roles or resolve_roles(config.roles, config.task_spec, config.role_file)
        if [r.slug for r in self.roles] != list(config.roles):
            raise ConfigError(f"roles {[r.slug for r in self.roles]} do not match the config's {list(config.roles)}")
        self.debate = Debate(config, self.roles)

    def forward(self, **inputs) -> dspy.Prediction:
        task = self.config.task_spec
        missing = [k for k in task.input_names if k not in inputs]
        if missing:
            raise TypeError(f"ChatEval({task.name}) needs inputs {list(task.input_names)}; missing {missing}")
        # One forward is one judged item: all its calls share the LM's item deadline.
        with item_scope(bounds_of(dspy.settings.lm)):
            if self.config.format == "pairwise":
                return self._pairwise(inputs)
            return self._pointwise(inputs)

    def _pairwise(self, inputs: dict) -> dspy.Prediction:
        how, task = self.config.aggregate, self.config.task_spec
        orders = [inputs, calibration.swap(inputs, task)] if self.config.calibrate else [inputs]
        first, *swapped = self._debates(orders)
        runs = [(first, first.verdicts)] + [
            (second, {k: calibration.unswap_scores(v, task) for k, v in second.verdicts.items()}) for second in swapped]
        per_order = [pairwise_verdict(list(verdicts.values()), how, task)[0] for _, verdicts in runs]
        pooled = [v for _, verdicts in runs for v in verdicts.values()]
        pref, means = pairwise_verdict(pooled, how, task)
        referees = {slug: [verdicts[slug] for _, verdicts in runs] for slug in self.debate.referees}
        return dspy.Prediction(
            preference=pref,
            **{name: (means[name] if means else None) for name in task.output_fields},
            consistent=calibration.consistent(*per_order) if len(per_order) == 2 else None,
            order_preferences=per_order,
            **self._common(runs, referees, abstained=pref is None),
        )

    def _debates(self, orders: list[dict]) -> list[dspy.Prediction]:
        """One debate per answer order, at once when allowed; results (and the DSPy trace) in order."""
        if not self.parallel_orders or len(orders) < 2:
            return [self.debate(**order) for order in orders]
        trace = dspy.settings.trace

        def one(order: dict) -> tuple[dspy.Prediction, list | None]:
            if trace is None:
                return self.debate(**order), None
            # Each order traces into a list of its own, joined below in order: BootstrapFewShot picks a
            # predictor's demo by the order of its calls, which must not depend on which thread ran first.
            with dspy.context(trace=[]):
                return self.debate(**order), dspy.settings.trace

        done = parallel_map(one, orders, len(orders))
        if trace is not None:
            for _, steps in done:
                trace.extend(steps)
            if dspy.settings.max_trace_size > 0:  # as Predict keeps it: the newest steps, at most this many
                del trace[:max(0, len(trace) - dspy.settings.max_trace_size)]
        return [pred for pred, _ in done]

    def _pointwise(self, inputs: dict) -> dspy.Prediction:
        run = self.debate(**inputs)
        task = self.config.task_spec
        scores = pointwise_verdict(list(run.verdicts.values()), self.config.aggregate, task)
        return dspy.Prediction(
            **{name: (scores[name] if scores else None) for name in task.output_fields},
            consistent=None,
            **self._common([(run, run.verdicts)], {k: [v] for k, v in run.verdicts.items()}, abstained=scores is None),
        )

    @staticmethod
    def _common(runs, referees, abstained: bool) -> dict:
        reasons = {f"order{i + 1}:{k}": v for i, (run, _) in enumerate(runs) for k, v in run.abstentions.items()}
        return {
            "referees": referees,
            "transcripts": [[u.__dict__ for u in run.transcript] for run, _ in runs],
            "abstentions": reasons,
            "abstained": (sorted(set(reasons.values()))[0] if reasons else "no_verdict") if abstained else None,
            "calls": sum(run.calls for run, _ in runs),
        }


def build_evaluator(config: DebateConfig, roles: list[Role] | None = None) -> ChatEval:
    """The one builder the CLI, Optuna trials and loaders go through."""
    return ChatEval(config, roles)
