"""The judge certificate in the card, and the gates on it (issue 34, section 4)."""

from __future__ import annotations

import json
import random

import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.store import load_program, make_card, read_card, save_program
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.run.metrics import Estimate
from optim.audit.probes import AuditReport, Finding
from optim.certify.certificate import CardCertificate, audit_part, fill, people_part
from optim.certify.gates import GateRefused, Gates, check_gates, enforce
from optim.certify.people import People
from optim.certify.report import certify


def _people_cert(tmp_path, *, panel_better: bool):
    """certify() on 40 items and three people who agree 3 items in 4 with the truth; the panel always (better) or
    one item in 2 (worse)."""
    rng = random.Random(7)
    truth = {str(i): rng.choice("12") for i in range(40)}
    flip = {"1": "2", "2": "1"}
    labels = {i: {who: t if rng.random() < 0.75 else flip[t] for who in ("a1", "a2", "a3")} for i, t in truth.items()}
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps({"id": i, "prediction": t if panel_better or int(i) % 2 else flip[t]}) + "\n"
                               for i, t in truth.items()), encoding="utf-8")
    return certify(str(results), People(labels, "people.csv"), n_resamples=200)


def _audit(flips: float, robust: float) -> AuditReport:
    report = AuditReport(model="fake/card-model", data="faireval split all, first 40", seed=0, out=None)
    report.findings = [Finding("position (calibrated)", "flip rate", Estimate(flips, flips / 2, min(1, flips * 2), 40)),
                       Finding("position (calibrated)", "position bias", Estimate(-0.1, -0.3, 0.1, 40)),
                       Finding("verbosity", "robustness rate", Estimate(robust, robust - 0.1, 1.0, 40)),
                       Finding("authority", "robustness rate", Estimate(0.95, 0.85, 1.0, 40)),
                       Finding("authority", "flip rate", None, "n/a")]
    return report


@pytest.fixture
def program_dir(tmp_path):
    program = build_evaluator(DebateConfig(roles=("critic",), turns=1))
    card = make_card(program, model="fake/card-model", cost={"calls_per_item": 4.0, "cost_usd_per_item": 0.0003})
    return program, save_program(program, tmp_path / "prog", card)


def test_certificate_round_trips_through_save_and_load(tmp_path, program_dir):
    program, path = program_dir
    fill(path, "people", people_part(_people_cert(tmp_path, panel_better=True)))
    written = fill(path, "audit", audit_part(_audit(0.05, 0.95), calibrated=True))
    assert written.people["alt_test"]["replaces"] is True and written.cost["usd_per_1000"] == pytest.approx(0.3)
    assert [f["figure"] for f in written.audit["figures"]] == ["flip rate", "position bias", "robustness rate",
                                                               "robustness rate"]  # a figure without value is left out
    _, card = load_program(path)
    assert CardCertificate.from_dict(card["certificate"]) == written
    md = (path / "card.md").read_text(encoding="utf-8")
    assert "can replace an annotator on this data: yes" in md and "verbosity robustness rate: 0.950" in md
    assert "cost per 1,000 verdicts: $0.300000" in md
    assert written.metrics()["certificate.audit.position_calibrated_flip_rate"].value == 0.05
    # a later audit replaces its part only
    again = fill(path, "audit", audit_part(_audit(0.2, 0.5), calibrated=True))
    assert again.people == written.people and again.audit["figures"][0]["estimate"]["value"] == 0.2
    # saving the same program again (a rerun) keeps the certificate; another program's save drops it
    save_program(program, path, make_card(program, model="fake/card-model"))
    assert read_card(path)["certificate"]["audit"] == again.audit
    program.debate.referees["critic"].judge.signature = program.debate.referees["critic"].judge.signature \
        .with_instructions("Another instruction.")
    save_program(program, path, make_card(program, model="fake/card-model"))
    assert "certificate" not in read_card(path)


def _forge(card: dict, change) -> dict:
    card = json.loads(json.dumps(card))
    change(card["certificate"])
    return card


FORGERIES = [
    (lambda c: c["audit"]["figures"][0]["estimate"].update(value=1.7), "audit.figures[0].estimate.value"),
    (lambda c: c["audit"]["figures"][0]["estimate"].update(value=0.9), "a value inside its interval"),
    (lambda c: c["people"]["alt_test"].update(omega=0.2), "people.alt_test.replaces"),
    (lambda c: c["people"]["agreement"][0]["estimate"].update(n=-3), "people.agreement[0].estimate.n"),
    (lambda c: c["people"].update(agreement=c["people"]["agreement"] * 50), "at most 120"),
    (lambda c: c.update(verdict="trust me"), "key 'certificate' must be a mapping"),
    (lambda c: c.update(program="0" * 32), "measured on another program"),
    (lambda c: c["cost"].update(usd_per_1000=-1), "cost.usd_per_1000"),
]


@pytest.mark.parametrize("change,message", FORGERIES)
def test_a_forged_certificate_is_refused_on_load(tmp_path, program_dir, change, message):
    _, path = program_dir
    fill(path, "people", people_part(_people_cert(tmp_path, panel_better=True)))
    fill(path, "audit", audit_part(_audit(0.05, 0.95), calibrated=True))
    forged = _forge(read_card(path), change)
    (path / "card.json").write_text(json.dumps(forged), encoding="utf-8")
    with pytest.raises(ConfigError, match="card.json") as caught:
        load_program(path)
    assert message in str(caught.value)


def test_gates_refuse_naming_every_failing_figure_and_what_measures_a_missing_one(tmp_path, program_dir):
    _, path = program_dir
    fill(path, "people", people_part(_people_cert(tmp_path, panel_better=False)))
    cert = fill(path, "audit", audit_part(_audit(0.25, 0.5), calibrated=True)).to_dict()
    gates = Gates(require=("replaces-annotator",), max_position_flips=0.10, min_robustness=0.90, max_ece=0.05)
    failures = check_gates(cert, gates, program=str(path))
    assert [f.figure for f in failures] == ["alternative annotator test", "position (calibrated) flip rate",
                                            "verbosity robustness rate", "calibration error (ECE)"]
    assert failures[1].value == "0.250 95% CI [0.125, 0.500], n=40" and failures[1].gate == "--max-position-flips 0.1"
    assert failures[0].value.startswith("does not replace an annotator (omega=0.00")
    assert failures[3].fix == f"chateval calibrate {path} --dataset DATA" and not failures[1].fix
    with pytest.raises(GateRefused) as caught:
        enforce(read_card(path), gates, path)
    assert all(f.line() in str(caught.value) for f in failures) and "not registered" in str(caught.value)
    # the same figures pass looser gates; no certificate at all names the commands that measure it
    assert check_gates(cert, Gates(max_position_flips=0.3, min_robustness=0.5)) == []
    missing = check_gates(None, Gates(require=("replaces-annotator",), min_robustness=0.9), program="p")
    assert [f.fix.split(" ")[1] for f in missing] == ["certify", "audit"]


def test_gate_flags_are_shared_by_compile_and_search():
    from optim.cli.flags import gates
    from optim.cli.main import build_parser

    for command in (["compile", "--dataset", "faireval", "--out", "p"], ["search", "--dataset", "faireval", "--trials", "1"]):
        args = build_parser().parse_args([*command, "--require", "replaces-annotator", "--max-position-flips", "0.1",
                                          "--min-robustness", "0.9", "--max-ece", "0.05"])
        assert gates(args) == Gates(("replaces-annotator",), 0.1, 0.9, 0.05)
        assert not gates(build_parser().parse_args(command)).any
    with pytest.raises(ConfigError, match="--min-robustness is a rate from 0 to 1"):
        Gates(min_robustness=90)


@pytest.mark.slow
def test_compile_registers_only_once_the_certificate_passes_its_gates(tmp_path, monkeypatch):
    """A failing gate registers nothing and leaves the compile to finish; measured, the same call registers it."""
    import contextlib

    import chateval_dspy.lm.resolve as lm_module
    import optim.tuning.compile as compile_module
    from chateval_dspy.data.spec import DataSpec
    from chateval_dspy.lm.spec import LMSpec
    from chateval_dspy.testing.fake_lm import fake_lm
    from optim.tracking.runs import TrackingSpec
    from optim.tuning.compile import OptimizerSettings, compile_and_save
    from tests.test_compile import toy_judge

    @contextlib.contextmanager
    def fake_resolve(*args, **kwargs):
        yield fake_lm(toy_judge)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lm_module, "resolve_lm", fake_resolve)
    registered = []
    monkeypatch.setattr(compile_module.mlflow_model, "log_models", lambda *a, **kw: registered.append(kw))
    tracking = TrackingSpec(enabled=True, uri=f"sqlite:///{tmp_path}/mlflow.db", register="judge")
    gates = Gates(max_position_flips=0.10, min_robustness=0.90)

    def compile_once():
        return compile_and_save(DataSpec("faireval", limit=3), DebateConfig(roles=("critic",), turns=1),
                                LMSpec(cache=False), optimizer="labeled", out=tmp_path / "p", tracking=tracking,
                                settings=OptimizerSettings(max_demos=1), gates=gates)

    with pytest.raises(GateRefused, match="position flip rate: not in the certificate") as caught:
        compile_once()
    assert "chateval audit" in str(caught.value) and registered == []
    fill(tmp_path / "p", "audit", audit_part(_audit(0.05, 0.95), calibrated=True))
    done = compile_once()
    assert [kw["registered_name"] for kw in registered] == ["judge"]
    assert done.card["certificate"]["audit"]["figures"][0]["estimate"]["value"] == 0.05


def test_certify_and_audit_fill_their_parts_and_a_new_calibration_drops_its_error(tmp_path, program_dir, capsys):
    from types import SimpleNamespace

    from chateval_dspy.deploy.store import save_calibration
    from chateval_dspy.program.confidence import Calibration, ConfidenceMap
    from optim.audit.saved import certify_audit
    from optim.certify.certificate import calibration_part
    from optim.cli.main import main

    _, path = program_dir
    cert = _people_cert(tmp_path, panel_better=True)
    people = tmp_path / "people.jsonl"
    people.write_text("".join(json.dumps({"id": i, **by}) + "\n" for i, by in cert.people.labels.items()),
                      encoding="utf-8")
    assert main(["certify", "--results", str(tmp_path / "results.jsonl"), "--dataset", str(people), "--annotators",
                 "a1,a2,a3", "--resamples", "200", "--program", str(path), "--no-mlflow"]) == 0
    assert "certificate: written into" in capsys.readouterr().out
    assert read_card(path)["certificate"]["people"]["alt_test"]["replaces"] is True
    assert certify_audit("models:/judge/1", _audit(0.05, 0.95)) is None  # a registry's model: no card to write
    assert certify_audit(path, _audit(0.05, 0.95)).audit["calibrated"] is True  # the card's config calibrates
    checked = SimpleNamespace(header={"data": "faireval", "split": "test (seed 0)", "model": "fake/card-model"},
                              ece_calibrated=Estimate(0.04, 0.01, 0.08, 30), n={"check": 30})
    assert fill(path, "calibration", calibration_part(checked)).calibration["ece"]["value"] == 0.04
    assert check_gates(read_card(path)["certificate"], Gates(max_ece=0.05)) == []
    save_calibration(path, Calibration(ConfidenceMap(raw=(0.2, 0.8), calibrated=(0.5, 0.9)), fitted_on={"n": 40}))
    certificate = read_card(path)["certificate"]
    assert "calibration" not in certificate and "people" in certificate and "audit" in certificate


@pytest.mark.slow
def test_search_saves_its_best_but_marks_it_done_only_once_the_certificate_passes(tmp_path, monkeypatch, capsys):
    """``search`` with a gate: the best panel is saved, refused (exit non-zero, naming the figure) and the study is
    not marked done; once audited, the same command passes the gate and finishes."""
    import optuna

    from chateval_dspy.testing.fake_server import FakeOpenAIServer
    from optim.cli.main import main

    monkeypatch.chdir(tmp_path)
    argv = ["search", "--dataset", "faireval", "--limit", "3", "--turns", "1", "--roles", "1", "--no-progress",
            "--study", "s", "--out", "programs/s", "--trials", "1", "--no-mlflow", "--resamples", "20",
            "--min-robustness", "0.9"]
    with FakeOpenAIServer() as url:
        assert main([*argv, "--model", url]) == 2
        assert "robustness rate: not in the certificate" in capsys.readouterr().err
        study = optuna.load_study(study_name="s", storage="sqlite:///mlruns/optuna.db")
        assert "final" not in study.user_attrs and (tmp_path / "programs/s/card.json").exists()
        fill(tmp_path / "programs/s", "audit", audit_part(_audit(0.05, 0.95), calibrated=True))
        assert main([*argv, "--model", url]) == 0
    assert "final" in optuna.load_study(study_name="s", storage="sqlite:///mlruns/optuna.db").user_attrs
    assert read_card(tmp_path / "programs/s")["certificate"]["audit"]["figures"][2]["estimate"]["value"] == 0.95
