"""Label maps that contradict or merge are refused unless stated, and the MLflow run records
how the labels were read."""

from __future__ import annotations

import contextlib
import shutil

import pytest
import yaml
from data_files import LIKERT, write_jsonl  # the same task and file writer

import chateval_dspy.lm.resolve
from chateval_dspy.config import DebateConfig
from chateval_dspy.data.loaders import load_custom, parse_label_map
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.errors import ConfigError, DataError
from chateval_dspy.program.task import TaskSpec
from chateval_dspy.testing.fake_lm import fake_lm
from optim.cli import flags
from optim.cli.main import build_parser, main
from optim.tracking.evaluation import run_params
from optim.tracking.runs import _flat

PANDALM = {
    "name": "pandalm", "format": "pairwise",
    "inputs": [{"name": "instruction"}, {"name": "response1", "judged": True}, {"name": "response2", "judged": True}],
    "criteria": [{"name": "quality", "description": "how well {response} follows the instruction", "scale": "1-5"}],
}


def pairs(labels) -> list[dict]:
    """Pairwise rows with these labels (0 = tie, 1 and 2 the winners, as PandaLM codes them)."""
    return [{"question": f"q{i}", "answer_1": "a", "answer_2": "b", "label": label} for i, label in enumerate(labels)]


# ---- a value given twice -------------------------------------------------------------------------------------


def test_a_value_mapped_twice_to_two_labels_is_an_error_naming_both_entries():
    with pytest.raises(DataError, match=r"gives '0' twice: 0=tie and 0=1"):
        parse_label_map("0=tie,0=1")
    with pytest.raises(DataError, match="twice"):  # the value is its text, spaces aside
        parse_label_map("0=tie, 0 =2")
    assert parse_label_map("0=tie,0=tie") == {"0": "tie"}  # said twice alike: no contradiction


def test_a_cli_map_giving_a_value_twice_stops_the_command(capsys):
    code = main(["evaluate", "--dataset", "x.jsonl", "--format", "pairwise", "--label-map", "0=tie,0=1",
                 "--no-mlflow", "--no-progress"])
    assert code != 0
    assert "0=tie and 0=1" in capsys.readouterr().err


def test_a_task_label_map_giving_a_value_twice_is_an_error():
    # YAML reads 0 as a number and "0" as a text: both are the data's "0"
    with pytest.raises(ConfigError, match=r"label_map': '0' is given twice, as 'tie' and '1'"):
        TaskSpec.from_dict({**PANDALM, "label_map": {0: "tie", "0": "1"}})
    assert TaskSpec.from_dict({**PANDALM, "label_map": {0: "tie", "0": "tie"}}).label_map == (("0", "tie"),)


# ---- two values made one label --------------------------------------------------------------------------------


def test_a_map_that_merges_two_of_the_files_values_is_an_error_naming_the_entry_and_rows(tmp_path):
    path = str(write_jsonl(tmp_path / "p.jsonl", pairs([0, 1, 2, 1, 2, 0])))
    with pytest.raises(DataError) as err:
        load_custom(path, "pairwise", label_map=parse_label_map("0=tie,1=2"))
    message = str(err.value)
    assert "field 'label'" in message and "one label '2'" in message
    assert "'1' (row 2, --label-map entry 1=2)" in message and "'2' (row 3)" in message
    assert "--label-map-merge" in message


def test_the_merge_is_read_when_stated(tmp_path):
    path = str(write_jsonl(tmp_path / "p.jsonl", pairs([0, 1, 2, 1, 2, 0])))
    items = load_custom(path, "pairwise", label_map=parse_label_map("0=tie,1=2"), label_map_merge=True)
    assert [x.label for x in items] == ["tie", "2", "2", "2", "2", "tie"]
    spec = DataSpec(path, format="pairwise", label_map={"0": "tie", "1": "2"}, label_map_merge=True)
    assert [x.label for x in spec.items()[0]] == ["tie", "2", "2", "2", "2", "tie"]
    assert spec.to_dict()["label_map_merge"] is True
    assert "label_map_merge" not in DataSpec(path, format="pairwise").to_dict()  # others' run keys unchanged


def test_two_values_mapped_onto_one_label_are_a_merge(tmp_path):
    path = str(write_jsonl(tmp_path / "p.jsonl", pairs(["A", "B", "C", "A"])))
    with pytest.raises(DataError, match=r"'A' \(row 1, --label-map entry A=1\); 'C' \(row 3, --label-map entry C=1\)"):
        load_custom(path, "pairwise", label_map={"A": "1", "B": "2", "C": "1"})


@pytest.mark.parametrize(("labels", "label_map", "expected"), [
    ([0, 1, 2], {"0": "tie"}, ["tie", "1", "2"]),  # PandaLM's coding: nothing merged
    ([1, 2, 1], {"1": "2", "2": "1"}, ["2", "1", "2"]),  # a swap is one-to-one
    (["a", "1", "b"], {}, ["1", "1", "2"]),  # values alike without the map are no merge of the map's
    ([1, 0, 0], {"0": "2", "2": "tie"}, ["1", "2", "2"]),  # 2 is mapped away but absent: nothing merged
    (["tie", "tie"], {"tie": "tie"}, ["tie", "tie"]),  # an entry that changes nothing
])
def test_maps_that_merge_nothing_in_the_file_are_read(tmp_path, labels, label_map, expected):
    path = str(write_jsonl(tmp_path / "p.jsonl", pairs(labels)))
    assert [x.label for x in load_custom(path, "pairwise", label_map=label_map)] == expected


def test_a_pointwise_map_onto_a_value_already_on_the_scale_is_a_merge(tmp_path):
    rows = [{"answer": f"a{i}", "quality": q} for i, q in enumerate([0, 1, 3, 5])]
    path = str(write_jsonl(tmp_path / "s.jsonl", rows))
    task = TaskSpec.from_dict(LIKERT)
    with pytest.raises(DataError, match=r"field 'quality'.*'0' \(row 1, --label-map entry 0=1\); '1' \(row 2\)"):
        load_custom(path, task, label_map={"0": "1"})
    items = load_custom(path, task, label_map={"0": "1"}, label_map_merge=True)
    assert [x.human["quality"] for x in items] == [1, 1, 3, 5]


def test_a_task_files_merging_map_is_refused_unless_the_task_says_so(tmp_path):
    path = str(write_jsonl(tmp_path / "p.jsonl", pairs([0, 1, 2])))
    merging = {**PANDALM, "inputs": [{"name": "question"}, {"name": "answer_1", "judged": True},
                                     {"name": "answer_2", "judged": True}], "label_map": {0: "tie", 1: "2"}}
    with pytest.raises(DataError, match=r"the task's label_map entry 1: 2"):
        load_custom(path, TaskSpec.from_dict(merging))
    stated = TaskSpec.from_dict({**merging, "label_map_merge": True})
    assert [x.label for x in load_custom(path, stated)] == ["tie", "2", "2"]
    assert stated.to_dict()["label_map_merge"] is True and TaskSpec.from_dict(stated.to_dict()) == stated
    assert "label_map_merge" not in TaskSpec.from_dict(merging).to_dict()  # others' digests unchanged
    task_file = tmp_path / "t.yaml"
    task_file.write_text(yaml.safe_dump({**merging, "label_map_merge": "yes"}), encoding="utf-8")
    with pytest.raises(ConfigError, match="label_map_merge': true or false"):
        DataSpec(path, task=str(task_file)).items()


def test_the_flag_reaches_the_data_spec_and_a_merging_cli_run_stops(tmp_path, capsys, monkeypatch):
    parser = build_parser()
    path = str(write_jsonl(tmp_path / "p.jsonl", pairs([0, 1, 2])))
    args = parser.parse_args(["evaluate", "--dataset", path, "--format", "pairwise", "--label-map", "0=tie,1=2",
                              "--label-map-merge"])
    assert flags.data_spec(args).label_map_merge is True

    @contextlib.contextmanager
    def resolve(spec="embedded", **kwargs):
        yield fake_lm()

    monkeypatch.setattr(chateval_dspy.lm.resolve, "resolve_lm", resolve)
    code = main(["evaluate", "--dataset", path, "--format", "pairwise", "--label-map", "0=tie,1=2", "--no-mlflow",
                 "--no-progress", "--out", str(tmp_path / "r.jsonl")])
    assert code != 0 and "--label-map-merge" in capsys.readouterr().err
    assert not (tmp_path / "r.jsonl").exists()


# ---- how labels were read, in MLflow ---------------------------------------------------------------------------


def test_run_params_state_how_the_labels_were_read(tmp_path):
    path = str(write_jsonl(tmp_path / "p.jsonl", pairs([0, 1, 2])))
    config = DebateConfig(roles=("critic",), turns=1)
    one = DataSpec(path, format="pairwise", label_map={"0": "tie"})
    other = DataSpec(path, format="pairwise", label_map={"0": "1"}, columns={"label": "label"}, skip_bad_rows=True,
                     label_map_merge=True)
    a, b = (_flat(run_params(d, config, "m", d.items()[0])) for d in (one, other))
    assert a["data.label_map"] == "0=tie" and b["data.label_map"] == "0=1"
    assert a["data.columns"] == "-" and b["data.columns"] == "label=label"
    assert a["data.skip_bad_rows"] == "false" and b["data.skip_bad_rows"] == "true"
    assert a["data.label_map_merge"] == "false" and b["data.label_map_merge"] == "true"
    assert {k for k in a if k.startswith("data.")} == {f"data.{k}" for k in (
        "columns", "label_map", "label_map_merge", "group_by", "system", "unlabelled", "skip_bad_rows")}


@pytest.mark.slow
def test_two_mlflow_runs_with_different_maps_differ_in_their_params(tmp_path, mlflow_db):
    import mlflow

    from optim.tracking.evaluation import evaluation_run

    shutil.copy(mlflow_db, tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    path = str(write_jsonl(tmp_path / "p.jsonl", [{**r, "doc": "d"} for r in pairs([0, 1, 2])]))
    config = DebateConfig(roles=("critic",), turns=1)
    ids = []
    for i, label_map in enumerate(({"0": "tie"}, {"0": "1", "1": "2"})):
        data = DataSpec(path, format="pairwise", label_map=label_map, label_map_merge=bool(i))
        with evaluation_run(data, config, data.items()[0], out=tmp_path / f"r{i}.jsonl", uri=uri) as run:
            ids.append(run.run_id)
    client = mlflow.MlflowClient(uri)
    first, second = (client.get_run(i).data.params for i in ids)
    assert first["data.label_map"] == "0=tie" and second["data.label_map"] == "0=1,1=2"
    assert first["data.label_map_merge"] == "false" and second["data.label_map_merge"] == "true"
    assert first["data.group_by"] == second["data.group_by"] == "-"
