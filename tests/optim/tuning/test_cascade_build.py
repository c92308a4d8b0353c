"""``chateval cascade``: a cascade declared in YAML or by flags, built on labelled items (every stage
judges both halves, maps fitted and thresholds chosen on the calibration half), saved, and reported on the check half.

The referees are the simulated ones (``chateval_dspy.testing.sim_lm``) with item difficulty, behind DSPy's real
adapter, priced at a stated rate so that dollars are measured: a cheap stage (one referee) and a panel of five.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import pytest

import chateval_dspy.lm.resolve
from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.store import CALIBRATION_FILE, save_program
from chateval_dspy.errors import ConfigError
from chateval_dspy.lm.pricing import attach_price, stated_price
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.roles import DEFAULT_ORDER
from chateval_dspy.testing.sim_lm import SimKnobs, sim_lm, synthetic_items
from optim.tuning.calibrate import calibration_items
from optim.tuning.cascade import build_cascade, declare, parse_stage, read_declaration

ITEMS = synthetic_items(500)  # the test split: 200 items, 100 per half
# A cheap referee weaker than the panel's, so that the panel is worth its price on the items the cheap one doubts.
KNOBS = SimKnobs(difficulty_spread=1.0, accuracy=(("scientist", 0.75),), default_accuracy=0.85)
PRICE = "1,2"  # US dollars per million input and output tokens, stated for the simulated model


@contextlib.contextmanager
def sim_models(made: list | None = None):
    """Every model spec resolves to the priced simulated referees; each LM made is appended to ``made``."""
    @contextlib.contextmanager
    def resolve(spec="embedded", **kwargs):
        lm = attach_price(sim_lm(KNOBS, ITEMS), stated_price(PRICE))
        if made is not None:
            made.append(lm)
        yield lm

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
        yield


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Two saved evaluators (a single referee; five referees, one round; both answer orders) and a labelled file."""
    root = tmp_path_factory.mktemp("cascade")
    data = root / "sim.jsonl"
    data.write_text("".join(json.dumps({k: x[k] for k in ("id", "question", "answer_1", "answer_2", "label")}) + "\n"
                            for x in ITEMS), encoding="utf-8")
    for name, roles in (("single", ("scientist",)), ("panel", tuple(DEFAULT_ORDER))):
        program = build_evaluator(DebateConfig(roles=roles, turns=1))
        save_program(program, root / "programs" / name, make_card(program, model="sim/referees"))
    return root, data


@pytest.fixture(scope="module")
def built(saved):  # only slow tests use it
    """The two-stage cascade built at level 0.8, risk 0.2."""
    root, data = saved
    declared = declare([f"single={root / 'programs' / 'single'}", f"panel={root / 'programs' / 'panel'}"],
                       level=0.8, risk=0.2)
    with sim_models():
        report = build_cascade(declared, DataSpec(str(data), format="pairwise"), out=root / "cascade",
                               out_dir=root / "out")
    return root, data, declared, report


def write(path, text: str):
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("text, key", [
    ("level: 0.85\nrisk: 0.1\n", "exactly level, risk, stages"),
    ("level: 1.5\nrisk: 0.1\nstages: [{name: a, program: p}]\n", "key 'level'"),
    ("level: 0.85\nrisk: yes\nstages: [{name: a, program: p}]\n", "key 'risk'"),
    ("level: 0.85\nrisk: 0.1\nstages: []\n", "key 'stages'"),
    ("level: 0.85\nrisk: 0.1\nstages: [{name: Big Name, program: p}]\n", "key 'stages[1].name'"),
    ("level: 0.85\nrisk: 0.1\nstages: [{name: a, program: p}, {name: a, program: q}]\n", "must differ"),
    ("level: 0.85\nrisk: 0.1\nstages: [{name: a, program: p, api_key: sk-x}]\n", "key 'stages[1]'"),
    ("level: 0.85\nrisk: 0.1\nstages: [{name: a, program: [p]}]\n", "key 'stages[1].program'"),
    ("level: 0.85\nrisk: 0.1\nstages: [{name: a, program: p, model: 'http://evil:8000/v1'}]\n",
     "key 'stages[1].model'"),
    ("level: 0.85\nrisk: 0.1\nstages: [{name: a, program: p, model: {base_url: x}}]\n", "key 'stages[1].model'"),
    ("level: 0.85\nrisk: 0.1\nstages:\n" + "".join(f"  - {{name: s{i}, program: p}}\n" for i in range(9)),
     "1 to 8 stages"),
    ("- just\n- a list\n", "exactly level, risk, stages"),
    ("level: [unclosed\n", "is not valid YAML"),
    ("a: &x [1, 2]\nb: *x\nc: *x\n", "an alias of a list or mapping is refused"),
])
def test_a_declaration_is_checked_naming_the_file_and_the_key(tmp_path, text, key):
    path = write(tmp_path / "cascade.yaml", text)
    with pytest.raises(ConfigError) as err:
        read_declaration(path)
    assert str(path) in str(err.value) and key in str(err.value)


def test_a_declaration_file_is_read_within_its_bound(tmp_path):
    path = write(tmp_path / "cascade.yaml", "level: 0.85\nrisk: 0.1\n#" + "x" * 70_000 + "\n")
    with pytest.raises(ConfigError, match="larger than 65536 bytes"):
        read_declaration(path)
    (tmp_path / "latin1.yaml").write_bytes("level: 0.85 # caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="latin1.yaml: not UTF-8"):
        read_declaration(tmp_path / "latin1.yaml")


def test_flags_declare_what_the_yaml_file_declares(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path / "cascade.yaml", "level: 0.85\nrisk: 0.1\nstages:\n"
                 "  - {name: single, program: programs/single, model: openai/gpt-4o-mini}\n"
                 "  - {name: panel, program: programs/panel}\n")
    from_file = read_declaration(path)
    from_flags = declare(["single=programs/single@openai/gpt-4o-mini", "panel=programs/panel"], level=0.85, risk=0.1)
    assert from_file == from_flags and from_file.stages[1].model is None
    assert from_file.stages[0].program.resolve() == tmp_path / "programs" / "single"
    # The flags are the user's own: a stage may run on a base URL there, as --model allows.
    assert declare(["a=p@http://127.0.0.1:8000/v1"], level=0.85, risk=0.1).stages[0].model == "http://127.0.0.1:8000/v1"


def test_stage_flags_are_checked():
    assert parse_stage("a=dir@vertex_ai/claude@2024")["model"] == "vertex_ai/claude@2024"  # split at the first @
    with pytest.raises(ConfigError, match="NAME=PROGRAM_DIR"):
        parse_stage("programs/single")
    with pytest.raises(ConfigError, match="--agree-at-least"):
        declare(["a=p"], level=None, risk=0.1)
    with pytest.raises(ConfigError, match="stages\\[1\\].name"):
        declare(["A B=p"], level=0.85, risk=0.1)


@pytest.mark.slow  # the shared build judges 200 items on both stages (20 s)
def test_a_reachable_level_saves_thresholds_and_stages_with_their_maps(built):
    from chateval_dspy.deploy.saved.cascade import read_cascade
    from chateval_dspy.program.confidence import Calibration

    root, _, _, report = built
    assert report.reached and report.saved == root / "cascade" / "cascade.json"
    spec = read_cascade(root / "cascade")
    thresholds = [s.threshold for s in report.cascade.stages]
    assert [s.threshold for s in spec.stages] == thresholds and None not in thresholds  # both stages give verdicts
    assert (spec.level, spec.risk) == (0.8, 0.2) and spec.report["reached"] is True
    for stage in spec.stages:
        stored = Calibration.from_dict(json.loads((stage.dir / CALIBRATION_FILE).read_text()), "calibration.json")
        # Every stage is fitted on the same calibration half: 100 verdicts each.
        assert stored.threshold is None and stored.fitted_on["n"] == 100 and "calibration half" in stored.fitted_on["split"]
    # The declared programs are left as they were: the cascade holds copies carrying the fitted maps.
    assert not any((root / "programs" / name / CALIBRATION_FILE).exists() for name in ("single", "panel"))
    # The first stage is tested on every calibration item, the second on those the first did not keep.
    first, second = report.cascade.stages
    assert first.n_calibration == 100 and second.n_calibration == 100 - round(first.coverage.value * 100)


@pytest.mark.slow  # the shared build judges 200 items on both stages (20 s)
def test_the_report_figures_add_up(built):
    _, _, _, report = built
    n = report.header["items"]["check"]
    left = [s.left for s in report.stages]
    assert sum(left) == report.given == report.coverage.n * report.coverage.value == report.agreement.n
    assert [s.reached for s in report.stages] == [n, n - left[0]]  # the panel judged what the single judge passed on
    assert all(s.agreement.n == s.left for s in report.stages)
    assert report.agreement.value * report.agreement.n == pytest.approx(
        sum(s.agreement.value * s.agreement.n for s in report.stages))
    # Dollars: the cascade's are its stages' sums; each stage alone on every item costs at least its share.
    cascade_usd = sum(s.usd for s in report.stages)
    assert report.per_1000["cascade"].value == pytest.approx(1000 * cascade_usd / report.given)
    assert report.per_1000["last_stage"].value == pytest.approx(1000 * report.stages[-1].alone_usd / n)
    assert report.per_1000["first_stage"].value == pytest.approx(1000 * report.stages[0].alone_usd / n)
    assert report.stages[0].usd == pytest.approx(report.stages[0].alone_usd)
    assert 0 < report.stages[1].usd < report.stages[1].alone_usd
    assert report.stages[1].alone_calls > report.stages[0].alone_calls  # the panel is the dear stage
    text = "\n".join(report.lines())
    assert "sim/referees" in text and "test (seed 0)" in text and "n=100 items" in text and "95%" in text
    assert "panel on every item" in text and "single on every item" in text


@pytest.mark.slow  # the shared build judges 200 items on both stages (20 s)
def test_the_dollars_are_those_of_the_results_files(built):
    root, data, _, report = built
    check = {str(x.id) for x in calibration_items(DataSpec(str(data), format="pairwise", split="test"))["check"]}
    for stage, results in zip(report.stages, report.results):
        lines = [json.loads(line) for line in results.read_text().splitlines()]
        assert stage.alone_usd == pytest.approx(sum(r["cost_usd"] for r in lines if r["id"] in check))
        assert stage.alone_calls == sum(r["calls"] for r in lines if r["id"] in check)


@pytest.mark.slow  # the shared build judges 200 items on both stages (20 s)
def test_the_saved_cascade_routes_the_check_half_as_reported(built):
    from chateval_dspy.deploy.saved.judge import load

    root, data, _, report = built
    check = calibration_items(DataSpec(str(data), format="pairwise", split="test"))["check"]
    with sim_models(), load(root / "cascade", lm=LMSpec(cache=False)) as judge:
        stages = [judge({k: x[k] for k in ("question", "answer_1", "answer_2")}).stage for x in check]
    assert [stages.count(s.name) for s in report.stages] == [s.left for s in report.stages]
    assert stages.count(None) == len(check) - report.given


@pytest.mark.slow  # the shared build judges 200 items on both stages (20 s)
def test_an_unreachable_level_is_reported_and_saves_no_threshold(built, monkeypatch, capsys):
    root, data, _, _ = built
    monkeypatch.chdir(root)
    with sim_models():
        code = main_quiet(["cascade", "--stage", f"single={root / 'programs/single'}", "--stage",
                           f"panel={root / 'programs/panel'}", "--agree-at-least", "0.995", "--risk", "0.1",
                           "--dataset", str(data), "--out", str(root / "unreached"), "--out-dir", str(root / "out"),
                           "--no-mlflow", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    said = next(line for line in out.splitlines() if "NOT REACHED" in line)
    best = float(said.split("reachable at this risk with these items is ")[1].split("%")[0]) / 100
    assert 0.5 < best < 0.995 and "No threshold saved" in said
    stored = json.loads((root / "unreached" / "cascade.json").read_text())
    assert [s["threshold"] for s in stored["stages"]] == [None, None]
    assert stored["report"]["best_level"] == pytest.approx(best, abs=1e-3)
    assert "coverage n/a" in out or "coverage 0.0%" in out


@pytest.mark.slow  # the shared build judges 200 items on both stages (20 s)
def test_a_rerun_resumes_every_stage_and_judges_nothing_twice(built):
    root, data, declared, first = built
    made = []
    with sim_models(made):
        again = build_cascade(declared, DataSpec(str(data), format="pairwise"), out=root / "again",
                              out_dir=root / "out")
    assert again.resumed == 400 and made and not any(lm.engine.calls for lm in made)
    assert [s.threshold for s in again.cascade.stages] == [s.threshold for s in first.cascade.stages]
    assert again.results == first.results


def main_quiet(argv: list[str]) -> int:
    from optim.cli.main import main

    with contextlib.redirect_stderr(io.StringIO()):
        return main(argv)


def test_the_spec_and_the_stage_flags_do_not_mix(tmp_path, capsys):
    path = write(tmp_path / "cascade.yaml", "level: 0.85\nrisk: 0.1\nstages: [{name: a, program: p}]\n")
    code = main_quiet(["cascade", "--spec", str(path), "--risk", "0.2", "--dataset", "faireval", "--out",
                       str(tmp_path / "c"), "--no-mlflow"])
    assert code == 2


@pytest.mark.slow  # the shared build judges 200 items on both stages (20 s)
def test_the_command_logs_its_figures_and_files_to_mlflow(built, tmp_path, monkeypatch, capsys,
                                                          mlflow_db):
    from mlflow import MlflowClient

    root, data, _, _ = built
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlruns").mkdir()
    shutil.copy(mlflow_db, tmp_path / "mlruns" / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlruns' / 'mlflow.db'}"
    spec = write(tmp_path / "cascade.yaml", f"level: 0.8\nrisk: 0.2\nstages:\n"
                 f"  - {{name: single, program: {root / 'programs/single'}}}\n"
                 f"  - {{name: panel, program: {root / 'programs/panel'}}}\n")
    with sim_models():
        code = main_quiet(["cascade", "--spec", str(spec), "--dataset", str(data), "--out", str(tmp_path / "c"),
                           "--out-dir", str(root / "out"), "--tracking-uri", uri, "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    run_id = next(line.split(": ")[1] for line in out.splitlines() if line.startswith("mlflow run: "))
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.data.params["stage_2_name"] == "panel" and run.data.params["stage_1_model"] == "sim/referees"
    assert run.data.params["level"] == "0.8" and run.data.tags["chateval.command"] == "cascade"
    metrics = run.data.metrics
    assert metrics["coverage_check_n"] == 100 and metrics["coverage_check_ci_low"] <= metrics["coverage_check"]
    assert {"usd_per_1000_cascade_check", "usd_per_1000_last_stage_check", "panel_left_check"} <= set(metrics)
    logged = {a.path for a in client.list_artifacts(run_id, "cascade")}
    assert {"cascade/cascade.json", "cascade/report.json"} <= logged


@pytest.mark.slow  # compiles two programs and builds a cascade on FairEval with the scripted fake LM
def test_the_readme_cascades_subsection_runs_as_written(sandbox):
    """docs/selective.md "## Cascades", block by block, after the page's compile that makes ``programs/quick`` (the
    whole page also runs in ``test_readme.py``; this checks the section on its own, quicker)."""
    import shlex

    from readme_section import DOCS, blocks, commands

    from optim.cli.main import main

    text = (DOCS / "selective.md").read_text(encoding="utf-8")
    quick = next(c for lang, code, _ in blocks(text) if lang == "bash" for c in commands(code)
                 if c.startswith("chateval compile") and c.endswith("--out programs/quick"))
    section = text[text.index("\n## Cascades\n"): text.index("\n## Bias audit\n")]
    ran, namespace = [], {}
    for lang, code, _ in [("bash", quick, 0), *blocks(section)]:
        if lang == "python":
            exec(compile(code, "README.md (Cascades)", "exec"), namespace)  # noqa: S102 - the README's own example
            ran.append("python")
        for command in commands(code) if lang == "bash" else []:
            out = io.StringIO()
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()) as err:
                assert main(shlex.split(command)[1:]) == 0, f"{command}\n{out.getvalue()}\n{err.getvalue()}"
            ran.append(shlex.split(command)[1])
    assert ran == ["compile", "compile", "cascade", "cascade", "score", "python", "search"]
    lines = [json.loads(line) for line in open("cascade-verdicts.jsonl", encoding="utf-8")]
    assert lines and all(r["stages_run"] == ["single", "panel"] for r in lines)  # no level reached: both stages ran
    assert namespace["verdict"].stages_run == ["single", "panel"] and namespace["verdict"].stage is None


def people_or_off(items) -> callable:
    """A pointwise responder: the people's rounded rating on even-numbered items; on odd ones only the critic gives
    it and every other referee a far rating, so that a lone scientist is right on half the items and a panel of
    both is split exactly where it is wrong."""
    from chateval_dspy.testing.fake_lm import default_responder

    people = {x["response"].strip(): (int(x["id"]) % 2 == 0, x["human"]) for x in items}

    def respond(call):
        out = default_responder(call)
        even, human = people.get(call.inputs.get("response", "").strip(), (True, {}))
        critic = "critic" in call.inputs.get("persona", "").lower()
        for name, score in human.items():
            right = int(round(score))
            out[name] = right if even or critic else (0 if name == "groundedness" else 1 if right >= 2 else 3)
            if name == "groundedness" and not (even or critic):
                out[name] = 1 - right
        return out

    return respond


def test_a_pointwise_cascade_is_built_per_criterion_and_routes_as_reported(tmp_path, monkeypatch):
    """Topical-Chat on the scripted fake LM: both stages calibrated on every labelled criterion; the lone scientist
    keeps nothing (right on half the items), the panel keeps the items its referees agree on, and the saved cascade
    gives each check item's verdict whole at the stage the report counts it."""
    from chateval_dspy.data.loaders import load_dataset
    from chateval_dspy.deploy.saved.judge import load
    from chateval_dspy.testing.fake_lm import fake_lm

    items, _ = load_dataset("topical_chat")

    @contextlib.contextmanager
    def resolve(spec="embedded", **kwargs):
        yield attach_price(fake_lm(people_or_off(items)), stated_price(PRICE))

    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
    cfg = DebateConfig(format="pointwise", roles=("critic",), turns=1)
    for name, roles in (("single", ("scientist",)), ("panel", ("critic", "scientist"))):
        program = build_evaluator(cfg.replace(roles=roles))
        save_program(program, tmp_path / name, make_card(program, model="fake/scripted"))
    report = build_cascade(declare([f"single={tmp_path / 'single'}", f"panel={tmp_path / 'panel'}"], level=0.8,
                                   risk=0.2), DataSpec("topical_chat", limit=40), out=tmp_path / "cascade",
                           out_dir=tmp_path / "out")
    assert report.header["items"] == {"calibration": 20, "check": 20} and report.reached
    single, panel = report.cascade.stages
    assert single.threshold is None and panel.threshold is not None
    left = [s.left for s in report.stages]
    assert left[0] == 0 and 0 < left[1] < 20 and report.agreement.value >= 0.8 and report.agreement.n == 4 * left[1]
    check = calibration_items(DataSpec("topical_chat", limit=40, split="test"))["check"]
    with load(tmp_path / "cascade", lm=LMSpec(cache=False)) as judge:
        verdicts = [judge({k: x[k] for k in ("dialogue_history", "fact", "response")}) for x in check]
    assert [[v.stage for v in verdicts].count(s.name) for s in report.stages] == left
    criteria = len(cfg.task_spec.output_fields)
    for v in verdicts:  # whole or withheld: every criterion or none
        assert (v.scores is None) == (v.stage is None) and (v.scores is None or len(v.scores) == criteria)
        assert v.stage is not None or v.withheld is not None
