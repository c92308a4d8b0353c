"""What the commands print: the summary table after a run, and a progress bar while it runs."""

from __future__ import annotations

import contextlib
import sys


def summary(result, header: dict, seed: int) -> dict:
    """Print agreement (with CIs, beside the baseline), cost (with US dollars, per model too); returns the metrics."""
    from chateval_dspy.run.table import summary_table

    metrics = result.metrics(seed=seed)
    print(summary_table(metrics, result.cost(), header, abstentions=result.abstention_counts(),
                        models=result.model_usage()))
    return metrics


@contextlib.contextmanager
def progress(total: int | None, enabled: bool = True):
    """A tqdm bar on stderr; yields the per-item callback."""
    from tqdm import tqdm

    with tqdm(total=total, unit="item", disable=not enabled, file=sys.stderr) as bar:
        yield lambda record: bar.update(1)
