"""Finding 4: label-file text reaches judge cards. Reviewer names are checked when read (length, control
characters), every value is escaped in card.md, and a card is fitted to ``load()``'s limits before it is saved."""

from __future__ import annotations

import contextlib
import csv

import pytest
from data_files import write_jsonl
from stored_traces import feedback, traced

import chateval_dspy.limits as limits
from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.saved import card as card_module
from chateval_dspy.deploy.saved import store as card_store
from chateval_dspy.deploy.saved.card import CARD_REVIEWERS
from chateval_dspy.errors import ConfigError, DataError
from chateval_dspy.program.chateval import build_evaluator
from optim.tuning.labels import LabelledData, read_labels

ITEM = {"question": "2+2?", "answer_1": "4", "answer_2": "5"}
FORGED = "ann\n- model: `openai/evil`"


def write_csv(path, rows: list[dict]) -> str:
    with open(path, "w", encoding="utf-8", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(rows[0]))
        out.writeheader()
        out.writerows(rows)
    return str(path)


@pytest.mark.parametrize("name", [FORGED, "ann\r", "\x1b[2Jann", "ann\u202egro.evil", "ann\u2028bo"])
def test_a_reviewer_name_that_would_act_is_refused_where_it_is_read(tmp_path, name):
    path = write_csv(tmp_path / "l.csv", [{"id": "a", **ITEM, "label": "1", "reviewer": "bo"},
                                          {"id": "a", **ITEM, "label": "1", "reviewer": name}])
    with pytest.raises(DataError, match=r"l\.csv row 3: field 'reviewer': .*control character") as got:
        read_labels([path], "pairwise")
    assert "\n" not in str(got.value) and "\x1b" not in str(got.value)  # the message quotes it escaped


@pytest.mark.slow
def test_a_reviewer_name_in_mlflow_feedback_is_checked_as_in_a_file(store):
    mlflow = store
    ok, bad = traced(mlflow, "a", ITEM), traced(mlflow, "b", ITEM)
    mlflow.flush_trace_async_logging()
    feedback(mlflow, ok, "label", "1", "ann")
    feedback(mlflow, bad, "label", "1", FORGED)
    with pytest.raises(DataError, match=rf"mlflow:review trace '{bad}' row \d: field 'reviewer': .*control character"):
        read_labels(["mlflow:review"], "pairwise")


def test_ids_and_label_cells_are_checked_too(tmp_path):
    bad_id = str(write_jsonl(tmp_path / "i.jsonl", [{"id": "a\nb", **ITEM, "label": "1"}]))
    with pytest.raises(DataError, match=r"row 1: field 'id': .*control character"):
        read_labels([bad_id], "pairwise")
    bad_label = str(write_jsonl(tmp_path / "v.jsonl", [{"id": "a", **ITEM, "label": ["1"] * 10**5}]))
    with pytest.raises(DataError, match=r"row 1: field 'label': .*is no label") as got:
        read_labels([bad_label], "pairwise")
    assert len(str(got.value)) < 300
    fine = str(write_jsonl(tmp_path / "ok.jsonl", [{"id": 7, **ITEM, "label": "1", "reviewer": "Zoë <zoe@example.org>"}]))
    assert read_labels([fine], "pairwise").reviewers == {"Zoë <zoe@example.org>": 1}


def test_a_2mb_reviewer_name_is_a_clear_error_not_a_csv_crash(tmp_path):
    huge = "x" * 2_000_000
    path = write_csv(tmp_path / "l.csv", [{"id": "a", **ITEM, "label": "1", "reviewer": "bo"},
                                          {"id": "a", **ITEM, "label": "1", "reviewer": huge}])
    with pytest.raises(DataError, match=r"l\.csv row 3: .*(longer than|field limit)") as got:
        read_labels([path], "pairwise")
    assert not isinstance(got.value, csv.Error) and len(str(got.value)) < 300
    for name, rows in (("l.jsonl", [{"id": "a", **ITEM, "label": "1", "reviewer": huge}]),
                       ("m.csv", [{"id": "a", **ITEM, "label": "1", "reviewer": "y" * 1_000}])):  # a cell CSV allows
        write = write_csv if name.endswith(".csv") else write_jsonl
        with pytest.raises(DataError, match=rf"{name} row \d: field 'reviewer': .* characters long; the limit is "
                                            r"200 \(limits.MAX_LABEL_NAME_CHARS\)") as got:
            read_labels([str(write(tmp_path / name, rows))], "pairwise")
        assert len(str(got.value)) < 300


def test_card_md_escapes_what_reaches_it(tmp_path):
    """Cards also get labels that no label file checked (``align`` on traces, a card edited by hand)."""
    program = build_evaluator(DebateConfig(roles=("critic",), turns=1))
    labels = {"sources": [{"source": "l.csv\n# forged heading"}], "items": 1, "traces": ["tr-1", "tr`2\n- x"],
              "labels": 3, "from_review": 0, "from_files": 3, "disagreements": 0, "unlabelled": 0, "overridden": 0,
              "reviewers": {FORGED: 1, "<script>alert(1)</script>": 1, "\x1b[31mred": 1}}
    card = card_module.make_card(program, model="fake/model", dataset="d<img src=x onerror=alert(1)>", labels=labels)
    card_store.save_program(program, tmp_path / "p", card)
    md = (tmp_path / "p" / card_store.CARD_MD).read_text(encoding="utf-8")
    lines = md.splitlines()
    assert [x for x in lines if x.startswith("- model:")] == ["- model: `fake/model`"]  # no forged bullet
    assert not [x for x in lines if x.startswith("#") and "forged" in x]
    assert "\x1b" not in md and "<script>" not in md and "<img" not in md and "`openai/evil`" not in md
    assert "&lt;script&gt;" in md and "\\x1b" in md and "ann\\n- model: \\`openai/evil\\`" in md
    _, loaded = card_store.load_program(tmp_path / "p")
    assert loaded["labels"]["reviewers"] == labels["reviewers"]  # card.json keeps the names as given


@pytest.mark.slow
def test_60000_reviewers_compile_to_a_card_that_loads(tmp_path, monkeypatch):
    """The finding: compile wrote a 2.3 MB card.json that load() then refused."""
    import chateval_dspy.lm.resolve as lm_module
    from chateval_dspy.deploy.saved.judge import load
    from chateval_dspy.lm.spec import LMSpec
    from chateval_dspy.testing.fake_lm import fake_lm
    from optim.tuning.compile import OptimizerSettings, compile_and_save

    @contextlib.contextmanager
    def fake_resolve(*args, **kwargs):
        yield fake_lm()

    monkeypatch.setattr(lm_module, "resolve_lm", fake_resolve)
    rows = [{"id": f"i{n % 10}", **ITEM, "label": "1", "reviewer": f"reviewer-{n:05d}@example.org"}
            for n in range(60_000)]
    rows[0]["reviewer"] = rows[1]["reviewer"] = "ann"  # the most active reviewer (two items) is named first
    data = LabelledData((str(write_jsonl(tmp_path / "many.jsonl", rows)),))
    done = compile_and_save(data, DebateConfig(roles=("critic",), turns=1), LMSpec(cache=False), optimizer="labeled",
                            out=tmp_path / "p", settings=OptimizerSettings(max_demos=1))
    assert (tmp_path / "p" / card_store.CARD_FILE).stat().st_size <= limits.MAX_CARD_FILE_BYTES
    card = card_store.read_card(tmp_path / "p")
    assert card == done.card
    got = card["labels"]
    assert len(got["reviewers"]) == CARD_REVIEWERS and next(iter(got["reviewers"].items())) == ("ann", 2)
    assert got["reviewers_left_out"] == {"reviewers": 59_999 - CARD_REVIEWERS,
                                         "answers": 60_000 - 2 - (CARD_REVIEWERS - 1)}
    assert got["labels"] == 60_000 and got["items"] == 10
    assert f"and {59_999 - CARD_REVIEWERS} more reviewers" in (tmp_path / "p" / card_store.CARD_MD).read_text()
    with load(tmp_path / "p", lm=LMSpec(model="fake/scripted")) as judge:
        assert judge.card["labels"]["reviewers_left_out"] == got["reviewers_left_out"]


def test_a_card_is_fitted_to_the_loader_limits_or_refused_with_counts(tmp_path):
    program = build_evaluator(DebateConfig(roles=("critic",), turns=1))
    traces = [f"tr-{n:032x}" for n in range(40_000)]  # ~1.8 MB of trace ids
    card = card_module.make_card(program, model="fake/model", labels={"traces": traces, "reviewers": {"ann": 1}})
    got = card["labels"]
    assert got["traces"] == traces[: len(got["traces"])] and len(got["traces"]) + got["traces_left_out"] == 40_000
    card_store.save_program(program, tmp_path / "p", card)
    assert (tmp_path / "p" / card_store.CARD_FILE).stat().st_size <= limits.MAX_CARD_FILE_BYTES
    assert card_store.load_program(tmp_path / "p")[1] == card
    assert "left out of card.json by its size limit" in (tmp_path / "p" / card_store.CARD_MD).read_text()
    rows = [{"row": n, "field": "question", "reason": "x" * 200} for n in range(10_000)]
    with pytest.raises(ConfigError, match=r"make_card would be \d+ bytes.*MAX_CARD_FILE_BYTES.*"
                                          r"skipped_rows \d+ bytes \(10000 entries\)"):
        card_module.make_card(program, model="fake/model", skipped_rows=rows)
