"""Old names still read, each with a deprecation note, and never written: the ``scoring`` format (now ``pointwise``)
and the functions named after it."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.loaders import load_dataset
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.roles import make_role
from chateval_dspy.program.task import builtin_task
from chateval_dspy.renamed import canonical_format

RENAMED = "is renamed 'pointwise'"


def test_the_one_name_passes_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        cfg = DebateConfig(format="pointwise")
        assert canonical_format("pointwise") == "pointwise" and canonical_format("pairwise") == "pairwise"
        assert builtin_task("pointwise").name == "topical_chat"
    assert cfg.format == "pointwise" and cfg.to_dict()["format"] == "pointwise"


def test_a_config_saying_scoring_is_read_as_pointwise_with_a_warning():
    with pytest.warns(DeprecationWarning, match=f"config format 'scoring' {RENAMED}"):
        old = DebateConfig.from_dict({"format": "scoring", "turns": 3})  # as an old card or MLflow params hold it
    assert old == DebateConfig(format="pointwise", turns=3) and old.to_dict()["format"] == "pointwise"


def test_run_keys_keep_the_spelling_existing_results_files_were_keyed_with():
    from chateval_dspy.run.records import run_key

    assert DebateConfig(format="pointwise").changes() == {"format": "scoring"}
    with pytest.warns(DeprecationWarning):
        old = DebateConfig(format="scoring")
    assert run_key(old, {"model": "m"}, []) == run_key(DebateConfig(format="pointwise"), {"model": "m"}, [])


def test_the_builtin_task_and_a_task_spec_read_the_old_name():
    with pytest.warns(DeprecationWarning, match=RENAMED):
        assert builtin_task("scoring") is builtin_task("pointwise")
    with pytest.warns(DeprecationWarning, match=f"task format 'scoring' {RENAMED}"):
        spec = dataclasses.replace(builtin_task("pointwise"), format="scoring")
    assert spec.format == "pointwise"


def test_a_role_file_persona_under_scoring_serves_pointwise():
    with pytest.warns(DeprecationWarning, match=f"persona key 'scoring' {RENAMED}"):
        role = make_role("editor", "Editor", {"pairwise": "P", "scoring": "S"}, "roles.yaml role #1")
    assert role.persona("pointwise") == "S" and dict(role.personas) == {"pairwise": "P", "pointwise": "S"}


def test_a_custom_file_given_format_scoring_loads_as_pointwise(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"id": "1", "dialogue_history": "h", "fact": "f", "response": "r", "naturalness": 2,
                                "coherence": 2, "engagingness": 2, "groundedness": 1}) + "\n", encoding="utf-8")
    with pytest.warns(DeprecationWarning, match=f"--format 'scoring' {RENAMED}"):
        items, fmt = load_dataset(str(path), fmt="scoring")
    assert fmt == "pointwise" and len(items) == 1
    assert DataSpec(str(path), format="scoring").to_dict()["format"] == "scoring"  # a key written before stays


def test_an_unknown_format_names_the_one_name():
    with pytest.raises(ConfigError, match="choose one of: pairwise, pointwise$"):
        DebateConfig(format="ranking")


@pytest.mark.parametrize("module, old, new", [("chateval_dspy.run.metrics", "scoring_report", "pointwise_report"),
                                              ("chateval_dspy.program.aggregate", "scoring_verdict", "pointwise_verdict")])
def test_old_function_names_still_work_and_say_they_are_renamed(module, old, new):
    import importlib

    mod = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{module}.{old} is renamed {module}.{new}"):
        assert getattr(mod, old) is getattr(mod, new)
    with pytest.raises(AttributeError):
        mod.no_such_name  # noqa: B018 - the module's __getattr__ still refuses what it does not know


def test_a_review_queue_takes_old_and_new_results_lines_as_one_format():
    from optim.review.queue import resolve_task

    assert resolve_task(None, [{"format": "scoring"}, {"format": "pointwise"}]).name == "topical_chat"


def test_the_resamples_setting_is_checked():
    assert DataSpec("faireval").resamples is None and "resamples" not in DataSpec("faireval", resamples=50).to_dict()
    with pytest.raises(ConfigError, match="resamples must be a positive integer"):
        DataSpec("faireval", resamples=0)


def test_the_cli_says_format_scoring_is_renamed(caplog):
    from optim.cli import flags
    from optim.cli.main import build_parser

    args = build_parser().parse_args(["evaluate", "--dataset", "mine.jsonl", "--format", "scoring", "--resamples", "50"])
    with caplog.at_level("WARNING", logger="optim.cli.flags"):
        data = flags.data_spec(args)
    assert "--format scoring is renamed pointwise" in caplog.text
    assert (data.format, data.resamples) == ("scoring", 50)  # the old word stays in the data's key until it is read
