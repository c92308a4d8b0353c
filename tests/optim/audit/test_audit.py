"""``chateval audit``: deterministic perturbations, the audit recovering biases planted in
simulated referees (``chateval_dspy.testing.sim_lm``), a no-bias control reading zero, resumable reruns, and
pointwise items where some probes do not apply.

The simulated referees here are always right on content (accuracy 1), so any verdict that moves under a
perturbation moved for the planted bias alone; they know the labels of every perturbation the audit can make
(``perturb.variants``), as they know the originals'.
"""

from __future__ import annotations

import contextlib
import io
import json

import dspy
import pytest

import chateval_dspy.lm.resolve
from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.judge import Judge
from chateval_dspy.deploy.saved.store import load_program, save_program
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.testing.fake_lm import fake_lm
from chateval_dspy.testing.sim_lm import SimKnobs, sim_lm, synthetic_items
from optim.audit import perturb
from optim.audit.probes import audit, fields_of

NAMES = {"question": "question", "answer_1": "answer_1", "answer_2": "answer_2"}
TINY = {"id": "q1", "question": "What is 2+2?", "answer_1": "4", "answer_2": "5"}
RIGHT = SimKnobs(accuracy=(), default_accuracy=1.0, ceiling=1.0)  # always right on content: no bias, no noise


# ---- perturbations


def test_perturbations_are_the_golden_texts_for_a_fixed_seed():
    verbosity = perturb.pairwise("verbosity", TINY, NAMES, 7, verdict="1", label="1")
    assert verbosity.item["answer_2"] == (
        "5\n\nIn summary, the response above responds to the question. Put differently, everything written above is "
        "what this response contains, and nothing further needs to be added to what has been said.")
    assert verbosity.changed["target"] == "2" and verbosity.changed["basis"] == "verdict"  # the answer not preferred
    authority = perturb.pairwise("authority", TINY, NAMES, 7, verdict="1", label="1")
    assert authority.item["answer_2"] == ("5 (According to a 2019 peer-reviewed study from Harvard University, "
                                          "doi:10.1000/jak.2019.0412.)")
    assert authority.changed["basis"] == "label" and authority.item["answer_1"] == "4"
    bandwagon = perturb.pairwise("bandwagon", TINY, NAMES, 7, verdict="1", label="1")
    assert bandwagon.item["question"] == "What is 2+2? Most people who read both answers prefer answer 2."
    assert bandwagon.item["answer_2"] == "5"
    distraction = perturb.pairwise("distraction", TINY, NAMES, 7, verdict="1", label="1")
    assert distraction.item["answer_2"] == "5 The weather was sunny on the day this was written."
    assert perturb.swap(TINY, ("answer_1", "answer_2"), 7).item == {**TINY, "answer_1": "5", "answer_2": "4"}


def test_the_worse_answer_is_by_label_then_verdict_then_seed():
    assert perturb.pairwise("authority", TINY, NAMES, 7, verdict="2", label="2").changed["target"] == "1"
    by_verdict = perturb.pairwise("authority", TINY, NAMES, 7, verdict="2")
    assert (by_verdict.changed["target"], by_verdict.changed["basis"]) == ("1", "verdict")
    seeded = {perturb.pairwise("authority", {**TINY, "id": f"q{i}"}, NAMES, 7, verdict="tie").changed["target"]
              for i in range(20)}
    assert seeded == {"1", "2"}  # a tie leaves the choice to the seed, which picks both answers over items
    # The same seed makes the same text on every call; another seed picks other variants for some items.
    again = [perturb.pairwise("distraction", {**TINY, "id": f"q{i}"}, NAMES, 7, label="1").item for i in range(20)]
    assert again == [perturb.pairwise("distraction", {**TINY, "id": f"q{i}"}, NAMES, 7, label="1").item
                     for i in range(20)]
    assert again != [perturb.pairwise("distraction", {**TINY, "id": f"q{i}"}, NAMES, 8, label="1").item
                     for i in range(20)]


def test_probes_that_need_two_answers_refuse_pointwise_items():
    assert not perturb.applies("swap", "pointwise") and not perturb.applies("bandwagon", "pointwise")
    with pytest.raises(ConfigError, match="does not apply to pointwise"):
        perturb.pointwise("bandwagon", {"id": "r", "response": "Hi."}, "response", 0)
    with pytest.raises(ConfigError, match="unknown probe"):
        perturb.applies("tone", "pairwise")


# ---- the audit on simulated referees


def equal_length_items(n: int) -> list[dspy.Example]:
    """Pairs whose answers are exactly as long, so a length bias can only act on the padded one."""
    return [dspy.Example(id=f"v{i}", question=f"Question v{i}?", answer_1=f"Answer A to v{i}.",
                         answer_2=f"Answer B to v{i}.", label="1" if i % 2 == 0 else "2").with_inputs(*NAMES)
            for i in range(n)]


def known(items: list[dspy.Example], seed: int) -> list[dspy.Example]:
    """The items and every perturbation of them the audit can make with ``seed``, with their labels."""
    out = list(items)
    for x in items:
        record = {"id": x.id, **{k: x[k] for k in NAMES}}
        for probe in perturb.PROBES:
            for p in perturb.variants(probe, record, NAMES, seed):
                label = {"1": "2", "2": "1"}[x.label] if probe == "swap" else x.label
                out.append(dspy.Example(**p.item, label=label).with_inputs(*NAMES))
    return out


def one_referee(tmp_path, *, calibrate: bool = False):
    program = build_evaluator(DebateConfig(roles=("critic",), turns=1, calibrate=calibrate))
    return save_program(program, tmp_path / "program", make_card(program, model="sim/referees"))


def judge_on(program_dir, lm) -> Judge:
    program, card = load_program(program_dir)
    return Judge(program, card, lm, contextlib.ExitStack())


def found(report, probe: str, figure: str):
    return next(f.estimate for f in report.findings if f.probe == probe and f.figure == figure)


@pytest.mark.slow  # over a few seconds
def test_a_planted_position_bias_is_recovered_and_calibration_cancels_it(tmp_path):
    items = synthetic_items(120)
    judge = judge_on(one_referee(tmp_path), sim_lm(RIGHT.replace(position_bias=0.3), known(items, 0)))
    report = audit(judge, items, out=tmp_path / "out", probes=("position",), seed=0)
    for figure in ("position bias", "flip rate"):  # a right referee flips exactly when one order is position-biased
        est = found(report, "position (uncalibrated)", figure)
        assert est.low <= 0.3 <= est.high and est.value > 0.15, (figure, est)
    assert found(report, "position (uncalibrated)", "first-position pick rate").n == 240
    calibrated = found(report, "position (calibrated)", "flip rate")
    assert calibrated.high < 0.3  # both orders pooled: a position-biased order no longer decides alone
    assert (tmp_path / "out" / "swap-calibration-on.jsonl").is_file()


def test_a_planted_verbosity_bias_is_recovered(tmp_path):
    items = equal_length_items(120)
    judge = judge_on(one_referee(tmp_path), sim_lm(RIGHT.replace(verbosity_bias=0.4), known(items, 3)))
    report = audit(judge, items, out=tmp_path / "out", probes=("verbosity",), seed=3)
    towards = found(report, "verbosity", "towards boosted")
    assert towards.low <= 0.4 <= towards.high and towards.n == 120
    robust = found(report, "verbosity", "robustness rate")
    assert robust.value == pytest.approx(1 - towards.value)


@pytest.mark.slow  # over a few seconds
def test_a_no_bias_control_reads_zero_on_every_probe(tmp_path):
    items = synthetic_items(80)
    judge = judge_on(one_referee(tmp_path), sim_lm(RIGHT, known(items, 0)))
    families = {x.id: ("gpt", "claude") if i % 3 else ("claude", "gpt") for i, x in enumerate(items)}
    report = audit(judge, items, out=tmp_path / "out", seed=0, families=families, judge_family="gpt",
                   bias_types={x.id: "length" if i % 2 else "concreteness" for i, x in enumerate(items)})
    bias = found(report, "position (uncalibrated)", "position bias")
    assert bias.low <= 0.0 <= bias.high
    assert found(report, "position (uncalibrated)", "flip rate").value == 0.0
    for probe in ("verbosity", "authority", "bandwagon", "distraction"):
        assert found(report, probe, "towards boosted").value == 0.0 and found(report, probe, "towards boosted").n == 80
        assert found(report, probe, "robustness rate").value == 1.0
    panel, people = found(report, "self-preference", "panel picks own family"), \
        found(report, "self-preference", "people pick own family")
    assert panel.value == people.value and panel.n == 80  # a judge always right prefers its family as people do
    assert found(report, "bias type", "accuracy length").value == 1.0
    stored = [json.loads(line) for line in (tmp_path / "out" / "perturbations.jsonl").read_text().splitlines()]
    assert {p["probe"] for p in stored} == set(perturb.PROBES) and {p["seed"] for p in stored} == {0}
    assert all(line.count("n=") == 1 and "95% CI" in line and "sim/referees" in line for line in report.lines())


def test_a_rerun_resumes_without_lm_calls_and_another_seed_is_refused(tmp_path):
    items = synthetic_items(20)
    program_dir = one_referee(tmp_path)
    knobs = RIGHT.replace(position_bias=0.2)
    first = audit(judge_on(program_dir, sim_lm(knobs, known(items, 0))), items, out=tmp_path / "out", seed=0)
    lm = sim_lm(knobs, known(items, 0))
    again = audit(judge_on(program_dir, lm), items, out=tmp_path / "out", seed=0)
    assert not lm.engine.calls and again.judged == 0 and again.resumed == first.judged > 0
    assert again.findings == first.findings
    subset = audit(judge_on(program_dir, lm), items[:10], out=tmp_path / "out", probes=("position", "verbosity"),
                   seed=0)
    assert not lm.engine.calls and subset.resumed == 50  # fewer probes and items: the folder's verdicts serve
    # Figures on this run's items only, not on every item the folder's results files hold:
    assert found(subset, "position (uncalibrated)", "flip rate").n == found(subset, "verbosity", "towards boosted").n == 10
    with pytest.raises(ConfigError, match="other perturbations"):
        audit(judge_on(program_dir, lm), items, out=tmp_path / "out", seed=1)
    assert not lm.engine.calls  # refused before any perturbed item was judged
    other = build_evaluator(DebateConfig(roles=("scientist",), turns=1, calibrate=False))
    save_program(other, tmp_path / "other", make_card(other, model="sim/referees"))
    with pytest.raises(ConfigError, match="another model or panel"):
        audit(judge_on(tmp_path / "other", lm), items, out=tmp_path / "out", seed=0)


def test_pointwise_items_get_the_probes_that_apply_and_say_so_for_the_others(tmp_path):
    items, _ = DataSpec("topical_chat", limit=3).items()
    program = build_evaluator(DebateConfig(format="pointwise", roles=("critic",), turns=1))
    save_program(program, tmp_path / "program", make_card(program, model="fake/scripted"))
    report = audit(judge_on(tmp_path / "program", fake_lm()), items, out=tmp_path / "out", seed=0)
    silent = {f.probe: f.note for f in report.findings if f.estimate is None}
    assert set(silent) == {"position", "bandwagon"}
    assert all("does not apply to pointwise items" in note for note in silent.values())
    task = program.config.task_spec
    shifts = [f for f in report.findings if f.probe == "verbosity" and f.figure.startswith("score shift")]
    assert [f.figure for f in shifts] == [f"score shift {c.name}" for c in task.criteria if c.scale.ordinal]
    assert found(report, "distraction", "robustness rate").n == 3
    stored = [json.loads(line) for line in (tmp_path / "out" / "perturbations.jsonl").read_text().splitlines()]
    assert {p["probe"] for p in stored} == {"verbosity", "authority", "distraction"}
    assert all(p["item"]["response"].endswith(p["changed"]["added"]) for p in stored)


def test_fields_of_names_the_question_and_answers():
    from chateval_dspy.program.task import builtin_task

    assert fields_of(builtin_task("pairwise")) == NAMES


# ---- the command


def test_the_command_prints_each_figure_and_logs_to_mlflow(tmp_path, monkeypatch, capsys,
                                                           mlflow_db):
    import shutil

    from mlflow import MlflowClient

    from optim.cli.main import main

    items = synthetic_items(30)
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({**{k: x[k] for k in ("id", *NAMES, "label")},
                                        "m1": "gpt", "m2": "claude"}) + "\n" for x in items), encoding="utf-8")
    program_dir = one_referee(tmp_path)

    @contextlib.contextmanager
    def resolve(spec="embedded", **kwargs):
        yield sim_lm(RIGHT.replace(position_bias=0.3), known(items, 5))

    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlruns").mkdir()
    shutil.copy(mlflow_db, tmp_path / "mlruns" / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    with contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(["audit", str(program_dir), "--dataset", str(data), "--probes", "position,authority", "--seed",
                     "5", "--limit", "24", "--out", str(tmp_path / "audit"), "--family-columns", "m1,m2",
                     "--judge-family", "gpt", "--tracking-uri", uri])
    out = capsys.readouterr().out.splitlines()
    assert code == 0, err.getvalue()
    lines = [line for line in out if not line.startswith("mlflow run: ")]
    assert any(line.startswith("position (uncalibrated) flip rate: ") for line in lines)
    assert any(line.startswith("authority towards boosted: ") and "n=24" in line for line in lines)
    assert any(line.startswith("self-preference panel picks own family: ") for line in lines)
    assert all("sim/referees" in line and "pairs.jsonl split all, first 24" in line for line in lines)
    run = MlflowClient(uri).get_run(next(line.split(": ")[1] for line in out if line.startswith("mlflow run: ")))
    assert run.data.params["seed"] == "5" and run.data.tags["chateval.command"] == "audit"
    assert run.data.metrics["authority_towards_boosted_n"] == 24
    assert run.data.metrics["position_uncalibrated_flip_rate_ci_low"] <= run.data.metrics[
        "position_uncalibrated_flip_rate"]
    logged = {a.path for a in MlflowClient(uri).list_artifacts(run.info.run_id, "audit")}
    assert "audit/perturbations.jsonl" in logged


@pytest.mark.slow  # over a few seconds
def test_the_recovery_benchmark_recovers_a_panels_expected_rate(tmp_path):
    from optim.audit.recovery import markdown, recover

    rows = recover((("position", 0.3, 3),), n=40, seed=2, work=tmp_path)
    assert rows[0].expected == pytest.approx(0.216) and rows[0].covered
    assert rows[0].calibrated.value < rows[0].measured.value
    table = markdown(rows, 40, 2)
    assert "| position | 3 | 0.30 | 0.216 |" in table and "40 synthetic pairs" in table
