"""People against people and the alternative annotator test: agreement figures against hand
computations and published worked examples, the test against a hand computation and planted judges, the readers of
people's labels as untrusted input, and ``chateval certify`` end to end."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from repo_paths import TEST_DATA
from scipy import stats
from sklearn.metrics import cohen_kappa_score

from chateval_dspy.errors import DataError
from chateval_dspy.testing.sim_annotators import simulate
from optim.certify.agreement import alpha, cohen, fleiss, panel_beside_people, people_agreement
from optim.certify.alt_test import MIN_ITEMS, alt_test, by_rejections
from optim.certify.people import People, from_columns, from_long, from_traces, read_people
from optim.certify.report import certify, read_verdicts
from optim.cli.main import main
from optim.review.agreement import alpha as review_alpha

# Krippendorff (2011), "Computing Krippendorff's alpha-reliability", section C: 4 observers, 12 units, missing values.
KRIPPENDORFF_2011 = [[1, 1, 1], [2, 2, 3, 2], [3, 3, 3, 3], [3, 3, 3, 3], [2, 2, 2, 2], [1, 2, 3, 4], [4, 4, 4, 4],
                     [1, 1, 2, 1], [2, 2, 2, 2], [5, 5, 5], [1, 1], [3]]
# Wikipedia's worked example of Fleiss' kappa: 10 subjects, 14 raters, 5 categories (counts per category).
FLEISS_TABLE = [[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
                [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]]
FAST = {"n_resamples": 200}


# --- agreement ----------------------------------------------------------------------------------------------------

def test_cohen_matches_hand_computation_and_scikit_learn():
    # 2x2 by hand: observed agreement 7/10; marginals a: 6 yes/4 no, b: 5/5 -> p_e = 0.5; kappa = (0.7-0.5)/0.5 = 0.4
    a = list("yyyyyynnnn")
    b = list("yyyynnnnny")
    assert cohen(a, b) == pytest.approx(0.4)
    rng = np.random.default_rng(3)
    for _ in range(60):
        n, k = int(rng.integers(2, 50)), int(rng.integers(2, 6))
        x, y = rng.integers(1, k + 1, n).astype(float), rng.integers(1, k + 1, n).astype(float)
        for level, weights in (("nominal", None), ("ordinal", "linear"), ("interval", "quadratic")):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                expected = cohen_kappa_score(x, y, weights=weights)
            got = cohen([str(v) for v in x], [str(v) for v in y], level)
            assert (math.isnan(expected) and math.isnan(got)) or got == pytest.approx(expected)


def test_fleiss_matches_the_worked_example_and_a_hand_computation():
    units = [[c for c, k in enumerate(row) for _ in range(k)] for row in FLEISS_TABLE]
    assert fleiss(units) == pytest.approx(0.2099, abs=5e-4)
    # By hand, 3 items x 2 raters: P_i = 1, 0, 1 -> P = 2/3; p_x = 3/6, p_y = 3/6 -> P_e = 1/2; kappa = 1/3.
    assert fleiss([["x", "x"], ["x", "y"], ["y", "y"]]) == pytest.approx(1 / 3)
    # Items with another number of raters are left out (Fleiss needs a fixed number); all agreeing: undefined.
    assert fleiss([["x", "x"], ["x", "y"], ["y", "y"], ["x", "y", "y"]]) == pytest.approx(1 / 3)
    assert math.isnan(fleiss([["x", "x"], ["x", "x"]]))


def test_alpha_matches_krippendorff_2011_and_the_review_pages_hand_written_alpha():
    assert [round(alpha(KRIPPENDORFF_2011, level), 3) for level in ("nominal", "ordinal", "interval")] == \
        [0.743, 0.815, 0.849]
    rng = np.random.default_rng(5)
    for _ in range(20):
        units = [list(rng.integers(1, 5, int(rng.integers(1, 5)))) for _ in range(int(rng.integers(3, 30)))]
        for level in ("nominal", "interval"):
            expected = review_alpha(units, level)
            got = alpha(units, level)
            assert (expected is None and math.isnan(got)) or got == pytest.approx(expected)


def test_people_agreement_gives_each_figure_its_items_and_interval():
    study = simulate(120, [0.8, 0.8, 0.6], 0.8, seed=2)
    people = People(study.people, "sim")
    figures = {f.name: f.estimate for f in people_agreement(people, "nominal", **FAST)}
    assert set(figures) == {"Cohen's kappa a1 ~ a2", "Cohen's kappa a1 ~ a3", "Cohen's kappa a2 ~ a3",
                            "Fleiss' kappa", "Krippendorff's alpha (nominal)"}
    for estimate in figures.values():
        assert estimate.n == 120 and estimate.low <= estimate.value <= estimate.high
    # The less accurate person agrees less with the others.
    assert figures["Cohen's kappa a1 ~ a2"].value > figures["Cohen's kappa a1 ~ a3"].value


def test_panel_beside_people_shows_a_better_panel_above_the_people():
    study = simulate(150, [0.7, 0.7, 0.7], 0.95, seed=4)
    rows = panel_beside_people(People(study.people, "sim"), study.judge, "nominal", **FAST)
    assert [r.person for r in rows] == ["a1", "a2", "a3"]
    assert all(r.panel.value > r.people.value and r.panel.n == r.people.n == 150 for r in rows)
    # An abstention is a class of its own: it can only lower the panel's kappa.
    judged = dict(study.judge) | {str(i): None for i in range(30)}
    lower = panel_beside_people(People(study.people, "sim"), judged, "nominal", **FAST)
    assert all(lo.panel.value < r.panel.value for lo, r in zip(lower, rows))


# --- the alternative annotator test -------------------------------------------------------------------------------

def _tiny() -> tuple[dict, dict]:
    """30 items of four kinds, whose indicators are worked out by hand in the test below."""
    kinds = [({"a": "1", "b": "1", "c": "2"}, "1")] * 10 + [({"a": "1", "b": "2", "c": "2"}, "2")] * 15 + \
        [({"a": "1", "b": "1", "c": "1"}, "2")] * 3 + [({"a": "1", "b": "1", "c": "1"}, "1")] * 2
    return {str(i): j for i, (_, j) in enumerate(kinds)}, {str(i): p for i, (p, _) in enumerate(kinds)}


def test_alt_test_matches_a_hand_computation():
    judged, labels = _tiny()
    # d = W_h - W_f per item (a tie of alignments counts for both: d = 0). Leaving out a: kind 1 ties (the judge and
    # a each match one of b, c), kind 2 the judge wins (-1), kind 3 a wins (+1), kind 4 ties. Leaving out b: only
    # kind 3 differs (+1). Leaving out c: kind 1 the judge wins, kind 3 c wins.
    diffs = {"a": [-1] * 15 + [1] * 3 + [0] * 12, "b": [1] * 3 + [0] * 27, "c": [-1] * 10 + [1] * 3 + [0] * 17}
    eps = 0.1
    by_hand = {}
    for who, d in diffs.items():
        d = np.array(d, dtype=float)
        t = (d.mean() - eps) / (d.std(ddof=1) / math.sqrt(len(d)))
        by_hand[who] = stats.t.cdf(t, len(d) - 1)
    assert by_hand["b"] == pytest.approx(0.5)  # mean(d) = 0.1 = epsilon: t = 0
    result = alt_test(judged, labels, epsilon=eps, **FAST)
    assert [c.annotator for c in result.comparisons] == ["a", "b", "c"]
    assert [c.p_value for c in result.comparisons] == pytest.approx([by_hand[w] for w in "abc"])
    # BY with m = 3 rejects the k smallest p-values for the largest k with p_(k) <= k/3 * 0.05 / (11/6).
    thresholds = [k / 3 * 0.05 / (11 / 6) for k in (1, 2, 3)]
    ranked = sorted(by_hand.values())
    k = max((i + 1 for i in range(3) if ranked[i] <= thresholds[i]), default=0)
    expected = [by_hand[w] <= (ranked[k - 1] if k else -1) for w in "abc"]
    assert expected == [True, False, True]
    assert [c.rejected for c in result.comparisons] == expected
    assert result.omega == pytest.approx(2 / 3) and result.replaces is True
    # W_f: the judge is at least as aligned on every item but kind 3's, for each person.
    assert [c.judge_wins for c in result.comparisons] == pytest.approx([27 / 30] * 3)
    assert result.rho.value == pytest.approx(27 / 30) and result.rho.n == 30
    line = result.line()
    assert line.startswith("can replace an annotator on this data: yes (omega=0.67") and "p-values: a " in line


# The authors' published outputs (github.com/nitaytech/AltTest, alt_test_example.ipynb, "Example (paper's data)",
# commit 13eada2): winning rate omega and advantage probability rho, printed to two decimals, per LLM, on their data
# (tests/data/alt_test_published.json: two of their sets, item ids replaced by indices), with their epsilons.
PUBLISHED = {
    ("mtbench", "accuracy", 0.2): {"gemini_flash": (0.00, 0.72), "gemini_pro": (0.00, 0.76), "gpt-4o": (0.00, 0.77),
                                   "llama-31": (0.00, 0.69), "gpt-4o-mini": (0.00, 0.74),
                                   "mistral-v03": (0.00, 0.68)},
    ("lesion", "neg_rmse", 0.15): {"gemini_flash": (0.17, 0.71), "gemini_pro": (1.00, 0.81), "gpt-4o": (0.00, 0.62),
                                   "gpt-4o-mini": (0.67, 0.73)},
}


@pytest.mark.parametrize(("dataset", "scoring", "epsilon"), list(PUBLISHED))
def test_alt_test_reproduces_the_authors_published_example(dataset, scoring, epsilon):
    data = json.loads((TEST_DATA / "alt_test_published.json").read_text(encoding="utf-8"))
    found = data["sets"][dataset]
    labels: dict[str, dict] = {}
    for who, answers in found["humans"].items():
        for item, value in answers.items():
            labels.setdefault(item, {})[who] = value
    for llm, (omega, rho) in PUBLISHED[(dataset, scoring, epsilon)].items():
        result = alt_test(found["llms"][llm], labels, scoring=scoring, epsilon=epsilon, n_resamples=20)
        assert result.missing is None and not result.skipped, llm
        assert (round(result.omega, 2), round(result.rho.value, 2)) == (omega, rho), llm
        assert result.replaces is (omega >= 0.5), llm


def test_benjamini_yekutieli_thresholds():
    h4 = 1 + 1 / 2 + 1 / 3 + 1 / 4
    at = [k / 4 * 0.05 / h4 for k in range(1, 5)]
    # The step-up rule: the largest rank under its threshold carries every smaller p-value with it.
    assert by_rejections([at[2] - 1e-9, at[1] + 1e-6, 0.9, at[0] + 1e-6]) == [True, True, False, True]
    assert by_rejections([at[0] + 1e-6, 0.5, 0.6, 0.7]) == [False] * 4


@pytest.mark.parametrize(("judge", "replaces"), [(0.95, True), (0.35, False)])
def test_a_planted_judge_is_recognised(judge, replaces):
    verdicts = [alt_test(s.judge, s.people, **FAST).replaces
                for s in (simulate(100, [0.75, 0.75, 0.75], judge, seed=seed) for seed in range(10))]
    assert verdicts.count(replaces) >= 9


def test_too_few_people_or_items_say_what_is_missing():
    study = simulate(100, [0.8, 0.8], 0.9, seed=1)
    result = alt_test(study.judge, study.people, **FAST)
    assert result.replaces is None
    assert "not tested: 2 people with >= 30 items" in result.line() and "(need 3)" in result.line()
    few = simulate(MIN_ITEMS - 1, [0.8, 0.8, 0.8], 0.9, seed=1)
    result = alt_test(few.judge, few.people, **FAST)
    assert result.replaces is None and "a1 has 29 item(s)" in result.line()


def test_rating_scales_use_neg_rmse_and_leave_abstentions_out():
    study = simulate(60, [0.7, 0.7, 0.7], 0.95, classes=("1", "2", "3", "4", "5"), seed=3)
    judged = dict(study.judge) | {"0": None}
    result = alt_test(judged, study.people, scoring="neg_rmse", **FAST)
    assert result.abstained == 1 and all(c.n == 59 for c in result.comparisons)


# --- reading people's labels --------------------------------------------------------------------------------------

def test_columns_and_long_files_read_the_same_labels(tmp_path):
    wide = tmp_path / "wide.csv"
    wide.write_text("id,a1,a2,a3\nq1,1,2,1\nq2,tie,,2\n", encoding="utf-8")
    long = tmp_path / "long.jsonl"
    long.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": "q1", "annotator": "a1", "label": 1}, {"id": "q1", "annotator": "a2", "label": "2"},
        {"id": "q1", "annotator": "a3", "label": 1.0}, {"id": "q2", "annotator": "a1", "label": "tie"},
        {"id": "q2", "annotator": "a3", "label": 2}]), encoding="utf-8")
    expected = {"q1": {"a1": "1", "a2": "2", "a3": "1"}, "q2": {"a1": "tie", "a3": "2"}}
    assert from_columns(str(wide), ["a1", "a2", "a3"]).labels == expected
    assert read_people(str(long)).labels == expected


@pytest.mark.parametrize(("text", "message"), [
    ("id,annotator,label\nq1,ann,1\nq1,ann,2\n", "row 3: 'ann' labelled item 'q1' twice"),
    ("id,annotator,label\n,ann,1\n", "row 2: field 'id': a row needs an item id"),
    ("id,annotator,label\nq1,\"ann\x1b[2J\",1\n", "row 2: field 'annotator'"),
    ("id,annotator,label\nq1,ann,\"" + "x" * 60 + "\"\n", "row 2: field 'label'"),
])
def test_long_files_are_untrusted(tmp_path, text, message):
    path = tmp_path / "people.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=message.replace("[", r"\[")) as caught:
        from_long(str(path))
    assert str(path) in str(caught.value)


def test_columns_file_refuses_missing_columns_and_repeated_items(tmp_path):
    path = tmp_path / "wide.jsonl"
    path.write_text('{"id": 1, "a1": 1, "a2": 2}\n{"id": 1, "a1": 2, "a2": 2}\n', encoding="utf-8")
    with pytest.raises(DataError, match="no row has the annotator column"):
        from_columns(str(path), ["a1", "zz"])
    with pytest.raises(DataError, match="row 2: field 'id': item '1' appears twice"):
        from_columns(str(path), ["a1", "a2"])


class Feedback(SimpleNamespace):
    """What ``human_answers`` reads of an MLflow Feedback assessment (it checks the class name)."""


def _trace(item: str, answers: dict, kind: str = "HUMAN"):
    assessments = [Feedback(name="label", value=v, valid=True, create_time_ms=1,
                            source=SimpleNamespace(source_type=kind, source_id=who)) for who, v in answers.items()]
    return SimpleNamespace(info=SimpleNamespace(trace_id=f"tr-{item}", tags={"chateval.item_id": item},
                                                assessments=assessments), data=SimpleNamespace(request="{}"))


def test_review_page_reviewers_are_read_by_source():
    traces = [_trace("q1", {"ann": "1", "bo": "2"}), _trace("q2", {"ann": "tie"}), _trace("q3", {"llm": "1"}, "LLM_JUDGE")]
    people = from_traces(traces, source="mlflow:review")
    assert people.labels == {"q1": {"ann": "1", "bo": "2"}, "q2": {"ann": "tie"}}
    with pytest.raises(DataError, match="mlflow:review trace 'tr-q9' row 1: field 'reviewer'"):
        from_traces([_trace("q9", {"ann\n- forged": "1"})], source="mlflow:review")


# --- joining a results file, and the command ----------------------------------------------------------------------

def _write_study(tmp_path, study, *, extra_result: bool = False):
    labels = tmp_path / "labels.csv"
    rows = ["id,a1,a2,a3"] + [f"{i},{by['a1']},{by['a2']},{by['a3']}" for i, by in study.people.items()]
    labels.write_text("\n".join(rows) + "\n", encoding="utf-8")
    results = tmp_path / "results.jsonl"
    lines = [{"id": int(i), "prediction": v, "human": None} for i, v in study.judge.items()]
    if extra_result:
        lines.append({"id": 99999, "prediction": "1"})
    results.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return str(labels), str(results)


def test_results_and_labels_must_name_the_same_items(tmp_path):
    study = simulate(40, [0.8, 0.8, 0.8], 0.9, seed=1)
    labels, results = _write_study(tmp_path, study, extra_result=True)
    with pytest.raises(DataError, match=r"1 judged item\(s\) no person labelled \(e.g. \['99999'\]\)"):
        certify(results, read_people(labels, annotators=["a1", "a2", "a3"]), **FAST)
    # Labelled items the panel did not judge are refused, or left out when asked (judged items nobody labelled never).
    Path(results).write_text("".join(json.dumps({"id": i, "prediction": "1"}) + "\n" for i in range(35)),
                             encoding="utf-8")
    with pytest.raises(DataError, match=r"\(40 labelled, 35 judged\): 5 labelled item\(s\) with no results line"):
        certify(results, read_people(labels, annotators=["a1", "a2", "a3"]), **FAST)
    cert = certify(results, read_people(labels, annotators=["a1", "a2", "a3"]), judged_only=True, **FAST)
    assert len(cert.people.labels) == 35 and all(c.n == 35 for c in cert.test.comparisons)


def test_pointwise_results_need_a_criterion(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": 1, "prediction": {"coherence": 2, "naturalness": 3}}\n{"id": 2, "prediction": null}\n',
                    encoding="utf-8")
    with pytest.raises(DataError, match="row 1: field 'prediction': the prediction holds scores"):
        read_verdicts(str(path))
    assert read_verdicts(str(path), criterion="coherence") == {"1": "2", "2": None}


def test_lines_of_chateval_score_are_read_by_winner_or_scores(tmp_path):
    path = tmp_path / "scored.jsonl"
    path.write_text('{"id": "a", "format": "pairwise", "winner": "2", "scores": {"answer_1": 3, "answer_2": 8}}\n'
                    '{"id": "b", "format": "pairwise", "winner": null, "scores": null}\n', encoding="utf-8")
    assert read_verdicts(str(path)) == {"a": "2", "b": None}
    path.write_text('{"id": "c", "format": "pointwise", "winner": null, "scores": {"coherence": 2}}\n', encoding="utf-8")
    assert read_verdicts(str(path), criterion="coherence") == {"c": "2"}
    path.write_text('{"id": "d", "format": "pairwise"}\n', encoding="utf-8")
    with pytest.raises(DataError, match="needs a prediction .chateval evaluate. or a winner / scores"):
        read_verdicts(str(path))


def test_certify_command_prints_every_table(tmp_path, capsys):
    study = simulate(80, [0.75, 0.75, 0.75], 0.95, seed=7)
    labels, results = _write_study(tmp_path, study)
    assert main(["certify", "--results", results, "--dataset", labels, "--annotators", "a1,a2,a3",
                 "--resamples", "200"]) == 0
    out = capsys.readouterr().out
    assert f"people: {labels}, 80 items, 3 people" in out and "level nominal" in out
    assert "Cohen's kappa a1 ~ a2" in out and "Fleiss' kappa" in out and "Krippendorff's alpha (nominal)" in out
    assert out.count("n=80") >= 11  # 5 figures among people, 2 per person beside the panel
    assert "alternative annotator test: can replace an annotator on this data: yes" in out
    assert "epsilon=0.1" in out
    assert main(["certify", "--results", results, "--dataset", labels, "--annotators", "a1,a2",
                 "--epsilon", "0.2", "--resamples", "200"]) == 0
    assert "not tested: 2 people" in capsys.readouterr().out


def test_usr_release_is_read_per_aspect_with_the_shipped_ids(tmp_path):
    # The release's shape (values made up): ids count responses in file order, as topical_chat_usr.jsonl's do.
    release = [{"context": "hi", "fact": "f", "annotators": ["sm", "me", "er"], "responses": [
        {"response": "r0", "model": "Original Ground Truth", "Overall": [5, 4, 4], "Natural": [3, 3, 2]},
        {"response": "r1", "model": "Argmax Decoding", "Overall": [2, 2, 1], "Natural": [1, 2, 2]}]},
        {"context": "yo", "fact": "g", "annotators": ["sm", "fl", "yf"], "responses": [
            {"response": "r2", "model": "Original Ground Truth", "Overall": [3, 4, 3], "Natural": [2, 2, 2]}]}]
    path = tmp_path / "tc_usr_data.json"
    path.write_text(json.dumps(release), encoding="utf-8")
    people = read_people(str(path), usr_aspect="Overall")
    assert people.labels == {"0": {"sm": "5", "me": "4", "er": "4"}, "1": {"sm": "2", "me": "2", "er": "1"},
                             "2": {"sm": "3", "fl": "4", "yf": "3"}}
    with pytest.raises(DataError, match="row 1: field 'Engaging': a response needs 3 ratings"):
        read_people(str(path), usr_aspect="Engaging")


def test_rating_scales_certify_with_a_criterion_at_the_ordinal_level(tmp_path):
    study = simulate(60, [0.7, 0.7, 0.7], 0.9, classes=("1", "2", "3", "4", "5"), seed=8)
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps({"id": i, "prediction": {"overall": float(v)}}) + "\n"
                               for i, v in study.judge.items()), encoding="utf-8")
    cert = certify(str(results), People(study.people, "sim"), criterion="overall", **FAST)
    assert cert.level == "ordinal" and cert.test.scoring == "neg_rmse"
    assert "Krippendorff's alpha (ordinal)" in "\n".join(cert.lines())


def test_certificate_benchmark_separates_planted_judges(capsys):
    from optim.bench.main import main as bench

    assert bench(["certificate", "--draws", "6", "--items", "60", "--population-items", "3000"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == {"better", "equal", "slightly", "worse"}
    assert "- (no true null)" in rows["better"] and rows["worse"].split()[5] == "3"  # 3 true nulls (of 3 people)


def test_people_only_without_results_and_levels_need_numbers(tmp_path, capsys):
    study = simulate(40, [0.8, 0.8, 0.8], 0.9, seed=1)
    labels, _ = _write_study(tmp_path, study)
    assert main(["certify", "--dataset", labels, "--annotators", "a1,a2,a3", "--resamples", "100"]) == 0
    out = capsys.readouterr().out
    assert "Krippendorff's alpha (nominal)" in out and "panel" not in out and "alternative annotator" not in out
    assert main(["certify", "--dataset", labels, "--annotators", "a1,a2,a3", "--level", "interval"]) == 2
    assert "level interval needs numbers; some people's labels are not" in capsys.readouterr().err
