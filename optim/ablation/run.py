"""Which referee earns its cost: the panel judged whole, with each referee left out, and with each referee alone.

Every variant is the full panel's ``DebateConfig`` with other ``roles``, compared item by item
(``optim.ablation.paired``) and set against its tokens and US dollars per item. Each variant's results go to
``out/<variant>.jsonl``, resumed as ``chateval evaluate`` does; with tracking, one parent MLflow run and one child
per variant (``AblationRuns``).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.run.metrics import Estimate, plain, primary_metric
from chateval_dspy.run.result import RunResult
from optim.ablation.paired import mcnemar_exact, paired_delta
from optim.tracking import runs as mlflow_runs
from optim.tracking.evaluation import config_params, run_params, unpriced_marks

SUMMARY_FILE = "ablation.json"
PLOT_FILE = "ablation.png"


@dataclass(frozen=True)
class Variant:
    """One panel of the ablation: its display ``name``, file ``slug``, ``roles``, and which referee it leaves
    out or keeps alone (both, for a panel of two: leaving one out keeps the other alone)."""

    name: str
    slug: str
    roles: tuple[str, ...]
    left_out: str | None = None
    alone: str | None = None


def variants(roles: tuple[str, ...]) -> list[Variant]:
    """The full panel, each referee left out, each referee alone; a panel judged twice under two names is one.

    Example:
        >>> [v.name for v in variants(("critic", "scientist"))]
        ['full panel', 'without critic (scientist alone)', 'without scientist (critic alone)']
        >>> len(variants(("a", "b", "c")))
        7
    """
    roles = tuple(roles)
    if len(roles) < 2:
        raise ConfigError(f"an ablation needs a panel of at least 2 referees, got {len(roles)} "
                          f"({', '.join(roles) or 'none'}): with one there is nothing to leave out; "
                          "name more (--roles N, or --role SLUG repeated)")
    out = [Variant("full panel", "full", roles)]
    for r in roles:
        rest = tuple(x for x in roles if x != r)
        alone = rest[0] if len(rest) == 1 else None
        out.append(Variant(f"without {r}" + (f" ({alone} alone)" if alone else ""), f"without-{r}", rest, r, alone))
    if len(roles) > 2:
        out += [Variant(f"{r} alone", f"alone-{r}", (r,), alone=r) for r in roles]
    return out


@dataclass
class VariantResult:
    """One variant as judged, and (but for the full panel) its paired comparison with the full panel."""

    variant: Variant
    config: DebateConfig
    out: Path
    key: str
    result: RunResult
    metrics: dict
    agreement: Estimate
    vs_full: dict | None = None

    def cost(self) -> dict:
        return self.result.cost()

    def tokens_per_item(self) -> float:
        cost = self.cost()
        return cost["prompt_tokens_per_item"] + cost["completion_tokens_per_item"]

    def to_dict(self) -> dict:
        v = self.variant
        vs = None if self.vs_full is None else {**self.vs_full, "delta": self.vs_full["delta"].to_dict()}
        return {"variant": v.name, "slug": v.slug, "roles": list(v.roles), "left_out": v.left_out, "alone": v.alone,
                "results": str(self.out), "run_key": self.key, "n": self.result.n,
                "agreement": self.agreement.to_dict(), "metrics": plain(self.metrics), "vs_full": vs,
                "cost": {**self.cost(), "tokens_per_item": self.tokens_per_item()}}


@dataclass
class AblationResult:
    """What ``ablate`` measured: every variant's figures, where they are, and the MLflow run holding them."""

    data: DataSpec
    config: DebateConfig
    model: str
    metric: str  # the agreement figure compared (``metrics.primary_metric``)
    test: str  # the paired test against the full panel
    out: Path
    rows: list[VariantResult]
    referee_models: dict[str, str] = field(default_factory=dict)
    plot: Path | None = None
    mlflow_run_id: str | None = None

    @property
    def full(self) -> VariantResult:
        return self.rows[0]

    def row(self, slug: str) -> VariantResult:
        """The variant with file ``slug`` (``full``, ``without-<role>``, ``alone-<role>``)."""
        found = {r.variant.slug: r for r in self.rows}
        if slug not in found:
            raise KeyError(f"no variant {slug!r}; variants: {', '.join(found)}")
        return found[slug]

    def to_dict(self) -> dict:
        from chateval_dspy.run.evaluate_dataset import run_header

        header = run_header(self.data, self.config, self.model, self.full.result.n, referee_models=self.referee_models)
        return {"header": header, "metric": self.metric, "test": self.test, "rows": [r.to_dict() for r in self.rows]}

    def table(self) -> str:
        """The printed table (``report.ablation_table``)."""
        from optim.ablation.report import ablation_table

        return ablation_table(self.to_dict())


class AblationHooks:
    """What ``ablate`` tells its caller as it goes; the CLI shows a progress bar per variant, the defaults stay silent."""

    def progress(self, variant: Variant, total: int) -> contextlib.AbstractContextManager:
        """A context yielding the per-item callback while ``variant`` is judged, or None."""
        return contextlib.nullcontext()

    def judged(self, row: VariantResult) -> None:
        """``row``'s items are all judged (or were, by an earlier run)."""

    def wave(self, progress: dict) -> None:
        """Batch mode: a look at the current wave's batches (``lm.batch.waves.Waves``)."""


def _correct(records: list[dict]) -> dict[str, bool]:
    return {str(r["id"]): r["prediction"] == r["human"] for r in records if r.get("human") is not None}


def compare(full: list[dict], row: list[dict], config: DebateConfig, *, seed: int = 0,
            n_resamples: int | None = None) -> dict:
    """``row``'s agreement against the full panel's on the items both judged (their results records).

    Pairwise: the exact McNemar test and the difference in accuracy with a paired bootstrap CI; scored tasks:
    the difference in the primary figure with a paired bootstrap CI (``p`` is None).
    """
    task = config.task_spec
    pairwise = task.format == "pairwise"
    by_id = {str(r["id"]): r for r in row}
    pairs = [(f, by_id[str(f["id"])]) for f in full if str(f["id"]) in by_id and f.get("human") is not None]
    if not pairwise:  # a correlation is over verdicts: an item either panel abstained on is left out of both
        pairs = [(f, r) for f, r in pairs if f["prediction"] is not None and r["prediction"] is not None]
    delta = paired_delta(task, [f["human"] for f, _ in pairs], [r["prediction"] for _, r in pairs],
                         [f["prediction"] for f, _ in pairs], seed=seed, n_resamples=n_resamples)
    if pairwise:
        return {**mcnemar_exact(_correct([f for f, _ in pairs]), _correct([r for _, r in pairs])), "delta": delta}
    return {"test": "paired bootstrap", "n": len(pairs), "p": None, "delta": delta}


@contextlib.contextmanager
def _cache_per_variant(lm: LMSpec):
    """Yields ``use(key)``, which gives the variant of run ``key`` an LM cache of its own (when ``lm`` caches).

    Variants share prompts (a referee's first turn is the same on every panel it opens), so under one cache
    only the first variant judged would pay for them, and every later one would look cheaper than it is.
    A variant's own cache still replays its finished calls when a killed run is rerun.
    """
    from chateval_dspy.lm import resolve

    root = (Path(lm.cache_dir) if lm.cache_dir else resolve.default_cache_dir()) / "ablate"

    def use(key: str) -> None:
        if lm.cache:
            resolve.configure_cache(True, root / key)
    try:
        yield use
    finally:
        resolve.configure_cache(lm.cache, lm.cache_dir)


def ablate(data: DataSpec, config: DebateConfig | Callable[[str], DebateConfig], lm: LMSpec, *,
           out: str | Path | None = None, tracking=None, concurrency: int = 1, overwrite: bool = False,
           hooks: AblationHooks | None = None) -> AblationResult:
    """Judge ``data`` with the full panel of ``config``, with each referee left out and with each alone.

    ``config``: at least 2 referees, or a function of the dataset's format. ``out`` (default
    ``results/ablate-<dataset>-<the full panel's run key>``) is resumed by the same call unless ``overwrite``;
    ``tracking``: a ``TrackingSpec`` (None or disabled: nothing goes to MLflow); in batch mode a variant's items go
    in one set of waves.

    Example:
        >>> done = ablate(DataSpec("faireval", limit=2), DebateConfig(roles=("critic", "scientist"), turns=1,
        ...               calibrate=False), LMSpec(model=fake_url, cache=False), out=tmp / "ablation")
        >>> [(r.variant.slug, r.result.n, r.result.calls) for r in done.rows]
        [('full', 2, 4), ('without-critic', 2, 2), ('without-scientist', 2, 2)]
        >>> done.full.cost()["cost_usd_per_item"], done.row("without-critic").vs_full["test"]
        ('unpriced', 'exact McNemar')
    """
    from optim.ablation.report import ablation_plot

    hooks = hooks or AblationHooks()
    if concurrency < 1:
        raise ConfigError(f"concurrency must be positive, got {concurrency}")
    plan = _plan(data, config, lm, out, overwrite)
    runs = AblationRuns(tracking)
    with runs.parent(data, plan):
        model, referees, rows = _judge_variants(plan, data, lm, concurrency, hooks, runs)
        done = AblationResult(data, plan.config, model, plan.metric, plan.test, plan.out, rows, referees)
        summary = done.to_dict()
        (done.out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, ensure_ascii=False, default=str),
                                             encoding="utf-8")
        done.plot = ablation_plot(summary, done.out / PLOT_FILE)
        runs.finish(done)
    return done


@dataclass(frozen=True)
class AblationPlan:
    """What every variant judges, under which config and run key, where its results go, and how it is compared."""

    items: list
    config: DebateConfig
    variants: list[tuple[Variant, DebateConfig, str, Path]]  # each with its config, run key and results file
    out: Path
    metric: str
    test: str


def _plan(data: DataSpec, config, lm: LMSpec, out, overwrite: bool) -> AblationPlan:
    """The variants, their configs, run keys and results files, all checked before any model starts: a file of
    another run is refused up front, not halfway."""
    from chateval_dspy.run import identity
    from chateval_dspy.run.evaluate_dataset import check_task, results_path

    items, fmt = data.items()
    cfg = config(fmt) if callable(config) else config
    panels = variants(cfg.roles)
    check_task(data, cfg)
    lm.check_panel(cfg.roles)
    configs = [replace(cfg, roles=v.roles) for v in panels]
    keys = [identity.run_key(c, lm.identity(), items) for c in configs]
    out = Path(out) if out else Path("results") / f"ablate-{data.name}-{keys[0]}"
    paths = [results_path(out / f"{v.slug}.jsonl", key, overwrite=overwrite) for v, key in zip(panels, keys)]
    test = "exact McNemar" if cfg.format == "pairwise" else "paired bootstrap"
    return AblationPlan(items, cfg, list(zip(panels, configs, keys, paths)), out, primary_metric(cfg.task_spec), test)


def _judge_variants(plan: AblationPlan, data: DataSpec, lm: LMSpec, concurrency: int, hooks: AblationHooks,
                    runs: AblationRuns) -> tuple[str, dict[str, str], list[VariantResult]]:
    """Judge every variant in turn on one LM; returns the model's name, a mixed panel's referee models, the rows."""
    from chateval_dspy.lm.panel import referee_names
    from chateval_dspy.program.chateval import build_evaluator
    from chateval_dspy.run import records
    from chateval_dspy.run.evaluate import evaluate
    from chateval_dspy.run.evaluate_dataset import batch_items, lm_slots

    rows, judged = [], {}
    ci = {"seed": data.seed, "n_resamples": data.resamples}
    at_once = batch_items(concurrency, len(plan.items)) if lm.batch else concurrency
    with lm.judging(lm_slots(plan.config, concurrency), journal=plan.out / "batches", on_wave=hooks.wave) as judging_lm, \
            _cache_per_variant(lm) as use_cache:
        model, referees = judging_lm.model, referee_names()
        runs.judging(model, referees)
        for v, config, key, path in plan.variants:
            use_cache(key)
            with runs.variant(v, config), hooks.progress(v, len(plan.items)) as on_item:
                result = evaluate(build_evaluator(config), plan.items, config, out=path, concurrency=at_once,
                                  on_item=on_item, run_key=key, waves=lm.batch)
                judged[v.slug] = [r for r in records.finished_records(path, key) if not records.is_error(r)]
                figures = result.metrics(**ci)
                agreement = figures.get(plan.metric) or Estimate(math.nan, math.nan, math.nan, 0)
                vs_full = None if v.slug == "full" else compare(judged["full"], judged[v.slug], plan.config, **ci)
                rows.append(VariantResult(v, config, path, key, result, figures, agreement, vs_full))
                runs.variant_done(rows[-1])
            hooks.judged(rows[-1])
    return model, referees, rows


class AblationRuns:
    """The ablation's MLflow runs, RUNNING while it judges (with tracking None or disabled, nothing is logged): a
    parent run from the start, and a child run per variant, open while that variant is judged. Dollars MLflow cannot
    hold (``unpriced``) become tags, as for ``chateval evaluate``."""

    def __init__(self, tracking=None):
        self.spec = tracking if tracking is not None and tracking.enabled else None
        self.run_id: str | None = None

    @contextlib.contextmanager
    def parent(self, data: DataSpec, plan: AblationPlan):
        if self.spec is None:
            yield
            return
        scope = {"command": "ablate", "chateval.out": str(plan.out.resolve())}
        # A SIGKILL (nothing can catch it) leaves the runs of this folder RUNNING: the rerun that resumes it ends them.
        mlflow_runs.end_dead_runs(scope, self.spec.uri)
        params = run_params(data, plan.config, "", plan.items, ablation={
            "variants": len(plan.variants), "metric": plan.metric, "test": plan.test})
        params.pop("model")  # known once the LM is up (``judging``)
        with mlflow_runs.run("ablate", params=params, uri=self.spec.uri, tags=scope) as active:
            self.run_id = active.info.run_id
            yield

    def judging(self, model: str, referee_models: dict[str, str]) -> None:
        """Inside the parent run: the model, known once the LM is up."""
        if self.spec is not None:
            mlflow_runs.log_params({"model": model, **({"referee_models": referee_models} if referee_models else {})})

    def variant(self, v: Variant, config: DebateConfig) -> contextlib.AbstractContextManager:
        if self.spec is None:
            return contextlib.nullcontext()
        params = {"config": config_params(config), "variant": v.name, "slug": v.slug,
                  "left_out": v.left_out or "none", "alone": v.alone or "none"}
        return mlflow_runs.run(f"ablate-{v.slug}", params=params, nested=True,
                            tags={"command": "ablate", "chateval.variant": v.slug})

    def variant_done(self, row: VariantResult) -> None:
        """Inside the variant's run: its figures, paired test, cost and results file."""
        if self.spec is None:
            return
        cost = row.cost()
        mlflow_runs.set_tags(unpriced_marks(cost))
        mlflow_runs.log_metrics({**row.metrics, "agreement": row.agreement},
                                {**cost, "tokens_per_item": row.tokens_per_item(), **row.result.abstention_metrics(),
                                 **row.result.model_metrics()})
        if (vs := row.vs_full) is not None:
            mlflow_runs.log_metrics({"vs_full.delta": vs["delta"], "vs_full.n": vs["n"],
                                     **({"vs_full.p": vs["p"]} if vs["p"] is not None else {}),
                                     **{f"vs_full.{k}": vs[k] for k in ("reference_only", "row_only") if k in vs}})
        mlflow_runs.log_file(row.out, "results")

    def finish(self, done: AblationResult) -> None:
        """Inside the parent run: the full panel's figures, every variant's difference, the summary and plot."""
        if self.spec is None:
            return
        full, summary = done.full, {}
        for row in done.rows:
            slug, vs = row.variant.slug, row.vs_full or {}
            summary.update({f"{slug}.agreement": row.agreement.value, f"{slug}.tokens_per_item": row.tokens_per_item()})
            if vs:
                summary[f"{slug}.delta"] = vs["delta"].value
            if vs.get("p") is not None:
                summary[f"{slug}.p"] = vs["p"]
        mlflow_runs.set_tags(unpriced_marks(full.cost()))
        mlflow_runs.log_metrics({**full.metrics, "agreement": full.agreement}, {**full.cost(), **summary})
        mlflow_runs.log_file(done.out / SUMMARY_FILE, "ablation")
        if done.plot is not None:
            mlflow_runs.log_file(done.plot, "ablation")
        done.mlflow_run_id = self.run_id
