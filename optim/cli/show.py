"""What the commands print: the summary table after a run, and a progress bar while it runs."""

from __future__ import annotations

import contextlib
import sys


def summary(result, header: dict, seed: int, n_resamples: int | None = None) -> dict:
    """Print agreement (with CIs, beside the baseline), cost (with US dollars, per model too); returns the metrics."""
    from chateval_dspy.run.table import summary_table

    metrics = result.metrics(seed=seed, n_resamples=n_resamples)
    print(summary_table(metrics, result.cost(), header, abstentions=result.abstention_counts(),
                        models=result.model_usage()))
    return metrics


@contextlib.contextmanager
def progress(total: int | None, enabled: bool = True):
    """A tqdm bar on stderr; yields the per-item callback."""
    from tqdm import tqdm

    with tqdm(total=total, unit="item", disable=not enabled, file=sys.stderr) as bar:
        yield lambda record: bar.update(1)


def wave_progress(enabled: bool = True):
    """A callback that prints batch mode's progress to stderr, one line per look at the wave's batches."""
    told = []

    def show(p: dict) -> None:
        if not told and p.get("expected"):  # said up front even without progress lines: what the run will take
            told.append(True)
            print(f"batch mode through {p['provider']}: {p['expected']} wave(s) expected (the debate's longest chain "
                  "of dependent calls, per group of items judged at once)", file=sys.stderr)
        if not enabled:
            return
        expected = f"/{p['expected']}" if p.get("expected") else ""
        batches = "; ".join(f"{b['id']} {b['status']} {b.get('completed', 0)}/{b.get('total', '?')}"
                            + (f" ({b['detail']})" if b.get("detail") and b["detail"] != b["status"] else "")
                            for b in p["batches"])
        usd = "unpriced" if p["usd"] is None else f"${p['usd']:.6f}"
        print(f"wave {p['wave']}{expected}: {p['requests']} request(s), {p['answered']} answered; {batches}; "
              f"submitted {p['submitted']}; cost so far {usd}", file=sys.stderr, flush=True)
    return show


def fitted(report, *, command: str, level: float | None, risk: float | None, resumed: str, log) -> int:
    """What ``calibrate`` and ``cascade`` print of their report (``resumed``: the line when it read verdicts
    back); ``log()`` logs it to MLflow (None: not logged). Exit 0 also when the level is not reached: the report
    says so, with the best level reachable."""
    if report.resumed:
        print(resumed, file=sys.stderr)
    print("\n".join(report.lines()))
    if not report.reached:
        print(f"{command}: level {level:g} not reached at risk {risk:g}; no threshold saved", file=sys.stderr)
    if log is not None:
        print(f"mlflow run: {log()}")
    return 0
