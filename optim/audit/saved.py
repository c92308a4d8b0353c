"""The audit of a saved evaluator on a dataset, as ``chateval audit`` runs it, and its MLflow run."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from chateval_dspy.data.spec import DataSpec
from chateval_dspy.lm.spec import LMSpec
from optim.audit.probes import CLI_PROBES, AuditReport, audit


def data_name(data: DataSpec) -> str:
    """How the report names the items: dataset, split and limit.

    Example:
        >>> data_name(DataSpec("faireval", limit=20))
        'faireval split all, first 20'
    """
    limit = f", first {data.limit}" if data.limit else ""
    return f"{Path(data.dataset).name} split {data.split}{limit}"


def audit_saved(program: str | Path, data: DataSpec, *, out: str | Path, probes=CLI_PROBES, seed: int = 0,
                lm: LMSpec | None = None, concurrency: int = 1, family_columns: tuple[str, ...] = (),
                bias_column: str | None = None, judge_family: str | None = None) -> AuditReport:
    """``audit`` of the evaluator saved at ``program`` (loaded on ``lm``, its model None: the card's) on ``data``'s
    items; ``family_columns`` and ``bias_column`` name the data file's columns for self-preference and per-type
    accuracy."""
    from chateval_dspy.deploy.saved.judge import load
    from optim.audit.columns import families_and_types

    columns = families_and_types(data.dataset, family_columns=family_columns, bias_column=bias_column,
                                 judge_family=judge_family, id_column=dict(data.columns).get("id", "id"))
    with load(program, lm=lm, slots=concurrency) as judge:
        if data.task is None and data.format is None:  # a custom file's items are the evaluator's task's
            data = replace(data, task=judge.task)
        items, _ = data.items()
        return audit(judge, items, out=out, probes=probes, seed=seed, concurrency=concurrency, data=data_name(data),
                     **columns)


def certify_audit(program: str | Path, report: AuditReport):
    """The audit written as the certificate's ``audit`` part into the card of the evaluator saved at ``program``
    (replacing an earlier audit's); None when ``program`` has no card to write (an MLflow model URI)."""
    from chateval_dspy.deploy.saved.store import read_card
    from optim.certify.certificate import audit_part, fill

    if not (Path(program) / "card.json").is_file():
        return None
    calibrated = bool((read_card(program).get("config") or {}).get("calibrate"))  # which position figure gates read
    return fill(program, "audit", audit_part(report, calibrated=calibrated))


def log_audit(report: AuditReport, *, uri: str | None = None, certificate=None, program=None) -> str:
    """The id of a new MLflow run holding the audit: params (model, data, seed), each figure with its interval, the
    folder's perturbations and results, and the evaluator's ``certificate`` when the audit filled one."""
    from optim.certify.certificate import log_certificate
    from optim.tracking import runs

    params = {"model": report.model, "data": report.data, "seed": report.seed}
    with runs.run("audit", params=params, tags={"chateval.command": "audit"}, uri=uri) as active:
        runs.log_metrics(report.metrics())
        runs.log_file(report.out, "audit")
        if certificate is not None:
            log_certificate(certificate, program)
        return active.info.run_id
