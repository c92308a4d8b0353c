"""The judge certificate in the card, and the gates on it."""

from __future__ import annotations

import json
import random

import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.store import load_program, read_card, save_program
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
    gates = Gates(require=("replaces-annotator",), max_position_flips=0.10, min_robustness=0.90)
    failures = check_gates(cert, gates, program=str(path))
    assert [f.figure for f in failures] == ["alternative annotator test", "position (calibrated) flip rate",
                                            "verbosity robustness rate"]
    assert failures[1].value == "0.250 95% CI [0.125, 0.500], n=40" and failures[1].gate == "--max-position-flips 0.1"
    assert failures[0].value.startswith("does not replace an annotator (omega=0.00")
    assert not failures[1].fix
    with pytest.raises(GateRefused) as caught:
        enforce(read_card(path), gates, path)
    assert all(f.line() in str(caught.value) for f in failures) and "not registered" in str(caught.value)
    # the same figures pass looser gates; no certificate at all names the commands that measure it
    assert check_gates(cert, Gates(max_position_flips=0.3, min_robustness=0.5)) == []
    missing = check_gates(None, Gates(require=("replaces-annotator",), min_robustness=0.9), program="p")
    assert [f.fix.split(" ")[1] for f in missing] == ["certify", "audit"]


def test_gate_flags_are_shared_by_compile_and_search(tmp_path):
    from optim.cli.flags import gates
    from optim.cli.main import build_parser

    people = tmp_path / "people.csv"
    people.write_text("id,a1,a2,a3,note\nq1,1,1,2,x\nq2,2,2,2,y\n", encoding="utf-8")
    for command in (["compile", "--dataset", "faireval", "--out", "p"], ["search", "--dataset", "faireval", "--trials", "1"]):
        args = build_parser().parse_args([*command, "--require", "replaces-annotator", "--max-position-flips", "0.1",
                                          "--min-robustness", "0.9"])
        assert gates(args) == Gates(("replaces-annotator",), 0.1, 0.9)
        assert not gates(build_parser().parse_args(command)).any
        read = gates(build_parser().parse_args([*command, "--require", "replaces-annotator", "--people", str(people),
                                                "--annotators", "a1,a2,a3"])).people
        assert read.labels == {"q1": {"a1": "1", "a2": "1", "a3": "2"}, "q2": {"a1": "2", "a2": "2", "a3": "2"}}
    with pytest.raises(ConfigError, match="--min-robustness is a rate from 0 to 1"):
        Gates(min_robustness=90)


def _fair(call) -> dict:
    """A referee judging by content: the answer whose opening sorts first wins, so text added after an answer or
    to the question, and the answers' order, never move it."""
    if call.kind != "verdict":
        return {name: "ok" for name in call.outputs}
    first = call.inputs["answer_1"][:40] < call.inputs["answer_2"][:40]
    return {"evidence": "content", "score_1": 8 if first else 3, "score_2": 3 if first else 8}


def _padded(call) -> dict:
    """A referee swayed by verbosity: an answer restating itself (the audit's padding says "In other words", "As
    mentioned" or "Put differently") wins; otherwise it judges by content, as ``_fair``."""
    if call.kind != "verdict":
        return {name: "ok" for name in call.outputs}
    said = [any(p in call.inputs[a] for p in ("In other words", "As mentioned", "Put differently"))
            for a in ("answer_1", "answer_2")]
    if said[0] != said[1]:
        return {"evidence": "length", "score_1": 8 if said[0] else 3, "score_2": 3 if said[0] else 8}
    return _fair(call)


def _gated_compile(tmp_path, monkeypatch, judge, gates, registered: list):
    """``compile_and_save`` on 3 FairEval items per split with a scripted referee, tracked, asking to register."""
    import contextlib

    import chateval_dspy.lm.resolve as lm_module
    import optim.tuning.compile as compile_module
    from chateval_dspy.data.spec import DataSpec
    from chateval_dspy.lm.spec import LMSpec
    from chateval_dspy.testing.fake_lm import fake_lm
    from optim.tracking.runs import TrackingSpec
    from optim.tuning.compile import OptimizerSettings, compile_and_save

    @contextlib.contextmanager
    def fake_resolve(*args, **kwargs):
        yield fake_lm(judge)

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lm_module, "resolve_lm", fake_resolve)
    monkeypatch.setattr(compile_module.mlflow_model, "log_models", lambda *a, **kw: registered.append(kw))
    tracking = TrackingSpec(enabled=True, uri=f"sqlite:///{tmp_path}/mlflow.db", register="judge")
    return compile_and_save(DataSpec("faireval", limit=3), DebateConfig(roles=("critic",), turns=1), LMSpec(cache=False),
                            optimizer="labeled", out=tmp_path / "p", tracking=tracking,
                            settings=OptimizerSettings(max_demos=1), gates=gates)


@pytest.mark.slow
def test_a_gated_compile_measures_its_gates_on_the_test_split_and_registers_a_judge_that_passes(tmp_path,
                                                                                               monkeypatch):
    import mlflow

    registered: list = []
    done = _gated_compile(tmp_path, monkeypatch, _fair, Gates(max_position_flips=0.10, min_robustness=0.90),
                          registered)
    assert [kw["registered_name"] for kw in registered] == ["judge"]
    audit = done.card["certificate"]["audit"]
    assert audit["data"] == "faireval test split (seed 0), 3 items" and audit["calibrated"] is True
    got = {(f["probe"], f["figure"]): f["estimate"] for f in audit["figures"]}
    assert got[("position (calibrated)", "flip rate")]["value"] == 0.0
    assert [got[(p, "robustness rate")]["value"] for p in ("verbosity", "authority", "bandwagon", "distraction")] \
        == [1.0] * 4
    assert got[("verbosity", "robustness rate")]["n"] == 3  # every test item, judged before and after
    assert "verbosity robustness rate: 1.000" in (tmp_path / "p" / "card.md").read_text(encoding="utf-8")
    run = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").get_run(done.mlflow_run_id)
    assert run.data.metrics["certificate.audit.verbosity_robustness_rate"] == 1.0


@pytest.mark.slow
def test_a_gated_compile_that_fails_names_the_failing_figure_and_registers_nothing(tmp_path, monkeypatch):
    registered: list = []
    with pytest.raises(GateRefused) as caught:
        _gated_compile(tmp_path, monkeypatch, _padded, Gates(min_robustness=0.90), registered)
    assert registered == [] and "not registered" in str(caught.value)
    assert "verbosity robustness rate: 0.000 95% CI [0.000, " in str(caught.value)
    assert "--min-robustness 0.9" in str(caught.value) and "not in the certificate" not in str(caught.value)
    # the evaluator stays saved with the figures that refused it
    figures = read_card(tmp_path / "p")["certificate"]["audit"]["figures"]
    assert {f["probe"] for f in figures} == {"verbosity", "authority", "bandwagon", "distraction"}


def test_a_gate_without_its_data_is_refused_before_anything_is_judged(tmp_path, monkeypatch, capsys):
    """No LM is reachable here: each refusal comes before the first call, naming the gate and what to pass."""
    from chateval_dspy.data.spec import DataSpec
    from chateval_dspy.lm.spec import LMSpec
    from optim.tuning.compile import compile_and_save

    monkeypatch.chdir(tmp_path)

    def compile_with(gates, dataset="faireval"):
        return compile_and_save(DataSpec(dataset, limit=3), lambda fmt: DebateConfig(format=fmt, roles=("critic",), turns=1),
                                LMSpec(model="http://127.0.0.1:9"),
                                optimizer="labeled", out=tmp_path / "p", gates=gates)

    with pytest.raises(ConfigError, match=r"--require replaces-annotator .* pass --people FILE --annotators"):
        compile_with(Gates(require=("replaces-annotator",)))
    elsewhere = People({f"x{i}": {"a": "1", "b": "1", "c": "2"} for i in range(40)}, "people.csv")
    with pytest.raises(ConfigError, match=r"people.csv\) cover none of the 3 test split item"):
        compile_with(Gates(require=("replaces-annotator",), people=elsewhere))
    with pytest.raises(ConfigError, match="--max-position-flips measures verdicts with the answers swapped"):
        compile_with(Gates(max_position_flips=0.1), "topical_chat")
    assert not (tmp_path / "p" / "card.json").exists()
    from optim.cli.main import main

    assert main(["compile", "--dataset", "faireval", "--out", "p", "--annotators", "a1,a2,a3"]) == 2
    assert "--annotators names the label columns of --people FILE" in capsys.readouterr().err


@pytest.mark.parametrize("panel_better", [True, False])
def test_replaces_annotator_is_measured_on_the_test_verdicts_against_the_people(tmp_path, program_dir, panel_better):
    """The alternative annotator test of the panel's test-split verdicts (its results file) against the people's
    labels of those items; the people's other items are left out."""
    from optim.certify.measure import HeldOut, measure_and_enforce

    _, path = program_dir
    cert = _people_cert(tmp_path, panel_better=panel_better)
    labels = {**cert.people.labels, "train-only": {"a1": "1", "a2": "1", "a3": "2"}}
    gates = Gates(require=("replaces-annotator",), people=People(labels, "people.csv"))
    held_out = HeldOut([], tmp_path / "results.jsonl", "faireval test split (seed 0), 40 items")
    program, _ = load_program(path)
    if not panel_better:
        with pytest.raises(GateRefused, match=r"alternative annotator test: does not replace an annotator \(omega=0"):
            measure_and_enforce(path, program, gates, lm=None, held_out=held_out)
        assert read_card(path)["certificate"]["people"]["alt_test"]["replaces"] is False
        return
    card, certificate = measure_and_enforce(path, program, gates, lm=None, held_out=held_out)
    part = certificate.people
    assert part["n"] == 40 and part["results"] == str(tmp_path / "results.jsonl") and part["people"] == 3
    assert part["alt_test"]["replaces"] is True and card["certificate"]["people"] == part


def test_certify_and_audit_fill_their_parts_and_a_new_calibration_drops_its_error(tmp_path, program_dir, capsys):
    from types import SimpleNamespace

    from chateval_dspy.deploy.saved.store import save_calibration
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
    save_calibration(path, Calibration(ConfidenceMap(raw=(0.2, 0.8), calibrated=(0.5, 0.9)), fitted_on={"n": 40}))
    certificate = read_card(path)["certificate"]
    assert "calibration" not in certificate and "people" in certificate and "audit" in certificate


@pytest.mark.slow
def test_a_gated_search_measures_its_best_panel_before_it_is_marked_done(tmp_path, monkeypatch, capsys):
    """``search`` with a gate: the best panel is saved and audited on the test split; a referee swayed by padding is
    refused (exit non-zero, naming the figure, the study not marked done), one judging by content passes."""
    import optuna

    from chateval_dspy.testing.fake_server import FakeOpenAIServer
    from optim.cli.main import main

    monkeypatch.chdir(tmp_path)
    argv = ["search", "--dataset", "faireval", "--limit", "3", "--turns", "1", "--roles", "1", "--no-progress",
            "--trials", "1", "--no-mlflow", "--resamples", "20", "--min-robustness", "0.9", "--no-cache"]
    storage = "sqlite:///mlruns/optuna.db"
    with FakeOpenAIServer(responder=_padded) as url:
        assert main([*argv, "--model", url, "--study", "long", "--out", "programs/long"]) == 2
    assert "verbosity robustness rate: 0.000" in capsys.readouterr().err
    assert "final" not in optuna.load_study(study_name="long", storage=storage).user_attrs
    with FakeOpenAIServer(responder=_fair) as url:
        assert main([*argv, "--model", url, "--study", "fair", "--out", "programs/fair"]) == 0
    assert "gates passed, measured on the test split: certificate in programs/fair/card.md" in capsys.readouterr().out
    assert "final" in optuna.load_study(study_name="fair", storage=storage).user_attrs
    audit = read_card(tmp_path / "programs/fair")["certificate"]["audit"]
    assert audit["data"] == "faireval test split (seed 0), 3 items"
    assert {f["estimate"]["value"] for f in audit["figures"] if f["figure"] == "robustness rate"} == {1.0}


@pytest.mark.slow
def test_a_compile_requiring_replaces_annotator_tests_its_test_verdicts_against_the_people(tmp_path, monkeypatch,
                                                                                          capsys):
    """Through the command: the people's labels of the test split's items (and of one train item, left out) are
    tested against the panel's test verdicts; three items are too few for a verdict, which the refusal says."""
    from chateval_dspy.data.spec import DataSpec
    from chateval_dspy.testing.fake_server import FakeOpenAIServer
    from optim.cli.main import main

    monkeypatch.chdir(tmp_path)
    data = DataSpec("faireval", limit=3)
    parts = data.parts(data.load()[0])
    ids = [str(x.id) for x in parts["test"]] + [str(parts["train"][0].id)]
    (tmp_path / "people.csv").write_text("id,a1,a2,a3\n" + "".join(f"{i},1,1,2\n" for i in ids), encoding="utf-8")
    with FakeOpenAIServer() as url:
        assert main(["compile", "--dataset", "faireval", "--limit", "3", "--role", "critic", "--turns", "1",
                     "--optimizer", "labeled", "--out", "p", "--model", url, "--no-mlflow", "--no-progress",
                     "--require", "replaces-annotator", "--people", "people.csv", "--annotators", "a1,a2,a3"]) == 2
    err = capsys.readouterr().err
    assert "alternative annotator test: not tested: 0 people with >= 30 items" in err and "not registered" in err
    part = read_card(tmp_path / "p")["certificate"]["people"]
    assert part["n"] == 3 and part["people"] == 3 and part["results"].endswith("test_after.jsonl")
