"""Fitting a verdict confidence to people's labels (``fit_confidence_map``), and measuring how well calibrated it is
(``calibration_error``, ``reliability_diagram``). Fit on a calibration split that tuning never saw: a map fitted on
the items it is judged on looks better calibrated than it is.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from chateval_dspy.errors import ConfigError
from chateval_dspy.program.confidence import NEEDS_PERSON, TOLERANCE, ConfidenceMap, agrees, evidence, raw_confidence
from chateval_dspy.program.task import TaskSpec, as_task
from chateval_dspy.run.metrics import Estimate, bootstrap

PLATT_GRID = 101  # points a Platt curve is tabulated at: steps of 0.01 in raw confidence


def _columns(confidence: Sequence[float], agreed: Sequence[bool]) -> tuple[np.ndarray, np.ndarray]:
    conf = np.asarray(confidence, dtype=float)
    hit = np.asarray(agreed, dtype=float)
    if conf.ndim != 1 or conf.shape != hit.shape:
        raise ConfigError(f"confidences and agreements must be two lists of one length, got {conf.shape} and {hit.shape}")
    if not len(conf):
        raise ConfigError("no labelled verdicts: calibration needs verdicts that people labelled")
    if not np.all(np.isfinite(conf)) or conf.min() < 0 or conf.max() > 1:
        raise ConfigError("every confidence must be a number in [0, 1]")
    return conf, hit


def fit_confidence_map(raw: Sequence[float], agreed: Sequence[bool], method: str = "isotonic") -> ConfidenceMap:
    """The non-decreasing map from raw confidence to the share of verdicts people agreed with: ``isotonic``
    (scikit-learn's ``IsotonicRegression``: no shape assumed, smooth from a few hundred verdicts) or ``platt`` (a
    logistic curve: two parameters, steadier on small splits; one that would fall becomes the agreement rate).

    Example:
        >>> cmap = fit_confidence_map([0.1, 0.2, 0.8, 0.9], [True, False, True, True])
        >>> cmap(0.1), cmap(0.9)
        (0.5, 1.0)
    """
    x, y = _columns(raw, agreed)
    # Thousandths: finer raw values change nothing measurable and would let a fit outgrow the breakpoint limit.
    x = np.round(x, 3)
    if method == "isotonic":
        from sklearn.isotonic import IsotonicRegression

        fit = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit(x, y)
        return ConfidenceMap(raw=tuple(map(float, fit.X_thresholds_)), calibrated=tuple(map(float, fit.y_thresholds_)),
                             method="isotonic", n=len(x))
    if method == "platt":
        return ConfidenceMap(raw=tuple(np.linspace(0.0, 1.0, PLATT_GRID).tolist()),
                             calibrated=tuple(_platt(x, y).tolist()), method="platt", n=len(x))
    raise ConfigError(f"unknown calibration method {method!r}; choose one of: isotonic, platt")


def _platt(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Platt's curve tabulated on the grid; the agreement rate where it would fall or one class is missing."""
    if len(np.unique(y)) < 2:
        return np.full(PLATT_GRID, float(y.mean()))
    from sklearn.linear_model import LogisticRegression

    # Nearly unregularised: the one feature lies in [0, 1], and the default penalty would flatten the curve.
    fit = LogisticRegression(C=1e4).fit(x.reshape(-1, 1), y.astype(int))
    if fit.coef_[0, 0] <= 0:
        return np.full(PLATT_GRID, float(y.mean()))
    return np.clip(fit.predict_proba(np.linspace(0.0, 1.0, PLATT_GRID).reshape(-1, 1))[:, 1], 0.0, 1.0)


def expected_calibration_error(confidence, agreed, bins: int = 10) -> float:
    """Sum over ``bins`` equal-width confidence bins of (share of verdicts in the bin) x |agreement rate - mean
    confidence| in the bin; a confidence of 1 falls in the top bin.

    Example:
        >>> round(expected_calibration_error([0.05, 0.15, 0.95, 0.95], [0, 1, 1, 0]), 4)
        0.45
    """
    conf, hit = np.asarray(confidence, dtype=float), np.asarray(agreed, dtype=float)
    return float(sum(n / len(conf) * abs(rate - mean) for _, n, mean, rate in _bins(conf, hit, bins)))


def _bins(conf: np.ndarray, hit: np.ndarray, bins: int) -> Iterator[tuple[int, int, float, float]]:
    """Per non-empty equal-width confidence bin (a confidence of 1 in the top one): its index, verdicts, mean
    confidence and agreement rate."""
    which = np.minimum((conf * bins).astype(int), bins - 1)
    for b in np.unique(which):
        inside = which == b
        yield b, int(inside.sum()), conf[inside].mean(), hit[inside].mean()


def calibration_error(confidence: Sequence[float], agreed: Sequence[bool], bins: int = 10,
                      resamples: int = 2000, seed: int = 0) -> Estimate:
    """The expected calibration error (``expected_calibration_error``) with a 95% percentile bootstrap CI over
    verdicts (``chateval_dspy.run.metrics.bootstrap``: ``resamples`` paired resamples, seeded). On small samples
    the error is biased upwards (noise in each bin's rate never cancels), and so is its interval.

    Example:
        >>> calibration_error([0.05, 0.15, 0.95, 0.95], [0, 1, 1, 0], resamples=100).n
        4
    """
    conf, hit = _columns(confidence, agreed)
    return bootstrap(lambda c, a: expected_calibration_error(c.astype(float), a.astype(float), bins),
                     conf, hit, seed=seed, n_resamples=resamples)


def panel_verdict(line: dict) -> dict:
    """The results line with the panel's verdict as its ``prediction``: a verdict withheld for a person is still
    the panel's, and a fit or a check must count it, or refitting on a calibrated evaluator's results would drop
    exactly the verdicts below the threshold.

    Example:
        >>> panel_verdict({"prediction": None, "withheld": "2", "abstained": "needs_person"})["prediction"]
        '2'
        >>> panel_verdict({"prediction": None, "abstained": "parse_failure"})["prediction"] is None
        True
    """
    if line.get("abstained") == NEEDS_PERSON and line.get("withheld") is not None:
        return {**line, "prediction": line["withheld"]}
    return line


def calibration_pairs(records: Sequence[dict], task: TaskSpec | str, tolerance: float = TOLERANCE,
                      cmap: ConfidenceMap | None = None) -> tuple[list[float], list[bool]]:
    """Each labelled verdict's confidence (raw, or through ``cmap``) and whether people agreed with it, from
    results lines: one pair per line (pairwise) or per labelled criterion of a line (pointwise, by
    ``chateval_dspy.program.confidence.agrees``). A verdict withheld for a person counts as the panel gave it
    (``panel_verdict``). Lines without a person's label, or without a verdict, are left out.

    Example:
        >>> lines = [{"prediction": "1", "human": "1", "referees": {"a": [{"score_1": 9, "score_2": 2}]}},
        ...          {"prediction": None, "human": "2", "referees": {"a": [None]}}]
        >>> confidence, agreed = calibration_pairs(lines, "pairwise")
        >>> [round(c, 3) for c in confidence], agreed
        ([0.926], [True])
    """
    task = as_task(task)
    confidence, agreed = [], []
    for line in map(panel_verdict, records):
        human, verdict = line.get("human"), line.get("prediction")
        if human is None or verdict is None:
            continue
        for part, ev in evidence(line, task, tolerance).items():
            if task.format == "pairwise":
                hit = verdict == human
            else:
                hit = agrees(verdict.get(part), human.get(part) if isinstance(human, dict) else None,
                             task.scale_of(part), tolerance)
            if hit is None:
                continue
            raw = raw_confidence(ev)
            confidence.append(cmap(raw) if cmap else raw)
            agreed.append(bool(hit))
    return confidence, agreed


def reliability_diagram(confidence: Sequence[float], agreed: Sequence[bool], path: str | Path, title: str, *,
                        model: str, data: str, split: str, bins: int = 10, seed: int = 0) -> Path:
    """A PNG at ``path``: each confidence bin's agreement with people against its mean confidence (a perfectly
    calibrated confidence lies on the diagonal), with the verdicts per bin beneath; the title states ``model``,
    ``data``, ``split``, n and the expected calibration error with its 95% CI.

    Example:
        >>> reliability_diagram([0.2, 0.6, 0.9], [0, 1, 1], tmp / "r.png", "raw", model="m", data="d", split="test").name
        'r.png'
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    conf, hit = _columns(confidence, agreed)
    used, counts, mean_conf, rate = map(np.array, zip(*_bins(conf, hit, bins)))
    ece = calibration_error(conf, hit, bins, seed=seed)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(5, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    top.plot([0, 1], [0, 1], ls="--", color="grey", label="calibrated")
    top.plot(mean_conf, rate, marker="o", color="C0", label="agreement with people")
    top.set(ylim=(0, 1), ylabel="agreement with people")
    top.legend(loc="upper left")
    bottom.bar((used + 0.5) / bins, counts, width=0.9 / bins, color="C0")
    bottom.set(xlim=(0, 1), xlabel="confidence", ylabel="verdicts")
    top.set_title(f"{title}\n{model} | {data} {split} | n={len(conf)} | ECE {ece} (95% bootstrap CI)", fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
