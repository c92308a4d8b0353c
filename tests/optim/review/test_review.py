"""Where the panel is unsure, people decide: the uncertainty score, the label questions, and
``chateval review`` against a real ``mlflow server``.

The score's components are checked one by one on hand-made records. Against the server, six FairEval items are
judged with traces on a scripted fake LM whose referees are sure, split, biased by position, or fail to answer,
item by item; ``chateval review`` must then queue the items that are uncertain for those stated reasons, create
the task's questions as label schemas, add nothing on a rerun, and leave answers (two reviewers on one trace)
readable as labels by ``optim.tuning.labels``.
"""

from __future__ import annotations

import json
from types import SimpleNamespace as NS

import pytest
from chateval_cli import chateval_captured

from chateval_dspy.errors import ConfigError
from chateval_dspy.program.task import TaskSpec, as_task
from chateval_dspy.testing.fake_lm import default_responder
from chateval_dspy.testing.fake_server import FakeOpenAIServer
from optim.review import questions as q
from optim.review import sources, uncertainty
from optim.review.queue import queue_url
from optim.review.uncertainty import WEIGHTS

LABELS_TASK = TaskSpec.from_dict({
    "name": "rag", "format": "pointwise",
    "inputs": [{"name": "question"}, {"name": "answer", "judged": True}],
    "criteria": [{"name": "faithful", "description": "every claim is supported", "scale": ["pass", "fail", "unsure"]},
                 {"name": "relevance", "description": "it answers the question", "scale": "1-5"}]})


def pair(s1, s2, pref=None):
    return {"score_1": s1, "score_2": s2, **({"preference": pref} if pref else {})}


# ---- the uncertainty score, component by component -----------------------------------------------------------

def test_weights_sum_to_one_so_the_score_stays_in_0_1():
    assert sum(WEIGHTS.values()) == pytest.approx(1.0)
    assert set(WEIGHTS) == set(uncertainty.COMPONENTS)


def test_split_counts_referees_who_disagree_in_each_order():
    agree = {"format": "pairwise", "referees": {"a": [pair(8, 2), pair(7, 3)], "b": [pair(9, 1), pair(6, 2)]}}
    assert uncertainty.split(agree) == (0.0, None)
    split, reason = uncertainty.split({"format": "pairwise", "referees": {"a": [pair(8, 2), pair(8, 2)],
                                                                          "b": [pair(2, 8), pair(8, 2)]}})
    assert split == 0.5 and reason == "referees split (order 1: a 1, b 2)"  # one order of two split fully
    # Three referees: 1, 2 and tie is as far apart as votes get; 2 against 1 is half way.
    three = {"a": [pair(8, 2)], "b": [pair(2, 8)], "c": [pair(5, 5)]}
    assert uncertainty.split({"format": "pairwise", "referees": three})[0] == 1.0
    three["c"] = [pair(8, 2)]
    assert uncertainty.split({"format": "pairwise", "referees": three})[0] == pytest.approx(0.5)
    # A stated preference is the referee's vote, whatever its scores.
    stated = {"a": [pair(5, 5, "1")], "b": [pair(5, 5, "2")]}
    assert uncertainty.split({"format": "pairwise", "referees": stated})[0] == 1.0
    # Abstentions do not vote: one verdict left is no split.
    assert uncertainty.split({"format": "pairwise", "referees": {"a": [pair(8, 2)], "b": [None]}})[0] == 0.0


def test_split_on_pointwise_criteria_uses_the_scale():
    record = {"format": "pointwise", "referees": {
        "a": [{"naturalness": 1, "coherence": 2, "engagingness": 3, "groundedness": 1}],
        "b": [{"naturalness": 3, "coherence": 2, "engagingness": 3, "groundedness": 1}]}}
    value, reason = uncertainty.split(record)
    assert value == pytest.approx((1.0 + 0 + 0 + 0) / 4) and reason == "referees split (naturalness 1/3)"
    labels = {"format": "pointwise", "referees": {"a": [{"faithful": "pass", "relevance": 4}],
                                                "b": [{"faithful": "fail", "relevance": 5}]}}
    value, _ = uncertainty.split(labels, LABELS_TASK)
    assert value == pytest.approx((1.0 + 1 / 4) / 2)  # labels: a 1:1 split of two votes; 1-5: a range of 1 of 4


def test_inconsistent_is_answer_orders_that_disagree():
    assert uncertainty.inconsistent({"consistent": True}) == (0.0, None)
    assert uncertainty.inconsistent({"consistent": None}) == (0.0, None)  # an order abstained: counted elsewhere
    assert uncertainty.inconsistent({"consistent": False, "order_preferences": ["1", "2"]}) == \
        (1.0, "answer orders disagree (1 then 2)")


def test_margin_is_narrow_where_the_panel_scores_are_close():
    assert uncertainty.margin({"format": "pairwise", "score_1": 10.0, "score_2": 1.0}) == (0.0, None)
    assert uncertainty.margin({"format": "pairwise", "score_1": 5.5, "score_2": 5.5})[0] == 1.0  # a tie
    assert uncertainty.margin({"format": "pairwise", "score_1": 7.0, "score_2": 4.0})[0] == pytest.approx(1 - 3 / 9,
                                                                                                         abs=1e-3)
    assert uncertainty.margin({"format": "pairwise", "score_1": None, "score_2": None}) == (0.0, None)
    # Pointwise: a mean halfway between two points is as narrow as it gets; label scales have no margin.
    value, reason = uncertainty.margin({"format": "pointwise", "prediction": {
        "naturalness": 2.5, "coherence": 2.0, "engagingness": 3, "groundedness": 0.75}})
    assert value == pytest.approx((1.0 + 0 + 0 + 0.5) / 4) and reason.startswith("between two points (naturalness")
    assert uncertainty.margin({"format": "pointwise", "prediction": {"faithful": "pass", "relevance": 4.0}},
                              LABELS_TASK) == (0.0, None)


def test_abstained_is_the_share_of_missing_verdicts():
    assert uncertainty.abstained({"referees": {"a": [pair(1, 2), pair(1, 2)]}}) == (0.0, None)
    value, reason = uncertainty.abstained({"referees": {"a": [None, pair(1, 2)], "b": [pair(1, 2), pair(1, 2)]},
                                           "abstentions": {"order1:a@2": "parse_failure"}})
    assert value == 0.25 and reason == "1 of 4 verdicts missing (parse_failure)"
    assert uncertainty.abstained({"abstained": "parse_failure", "referees": {"a": [None]}}) == \
        (1.0, "the panel abstained (parse_failure)")


def test_spread_reads_the_weighted_scores_distance_from_the_stated_rating():
    assert uncertainty.spread({"referees": {"a": [pair(7, 3)]}}) == (0.0, None)  # no --weighted-scores
    sure = {"a": [{**pair(7, 3), "expected": {"score_1": 7.0, "score_2": 3.0}}]}
    assert uncertainty.spread({"referees": sure})[0] == 0.0
    coin = {"a": [{**pair(7, 3), "expected": {"score_1": 7.5, "score_2": 2.5}}]}
    assert uncertainty.spread({"referees": coin})[0] == 1.0
    wide = {"a": [{**pair(7, 3), "expected": {"score_1": 5.0, "score_2": 3.0}}]}
    assert uncertainty.spread({"referees": wide})[0] == 1.0  # capped


def test_the_score_is_the_stated_weighted_sum_and_ranks_most_uncertain_first():
    sure = {"id": "sure", "format": "pairwise", "consistent": True, "score_1": 9.0, "score_2": 2.0,
            "referees": {"a": [pair(9, 2), pair(9, 2)], "b": [pair(9, 2), pair(9, 2)]}}
    unsure = {"id": "unsure", "format": "pairwise", "consistent": False, "order_preferences": ["1", "2"],
              "score_1": 5.0, "score_2": 5.0, "abstentions": {"order2:b@2": "parse_failure"},
              "referees": {"a": [pair(8, 2), pair(2, 8)], "b": [pair(2, 8), None]}}
    u = uncertainty.uncertainty(unsure)
    expected = sum(WEIGHTS[k] * v for k, v in u.components.items())
    assert u.score == pytest.approx(expected)
    # Order 2 has one verdict left, so only order 1 (a 1:1 split) counts for the split.
    assert u.components == {"split": 1.0, "inconsistent": 1.0, "margin": 1.0, "abstained": 0.25, "spread": 0.0}
    assert u.explain().startswith("unsure: U=0.78")
    assert "answer orders disagree" in u.explain() and "1 of 4 verdicts missing" in u.explain()
    ranked = uncertainty.rank([sure, {"id": "x", "error": "row 3: bad"}, unsure])
    assert [r.item_id for _, r in ranked] == ["unsure", "sure"]  # the error line is no judged item
    assert uncertainty.uncertainty(sure).explain() == "sure: U=0.044  narrow margin (score 9 vs 2 on 1-10)"


# ---- questions from the task's criteria -------------------------------------------------------------------------

def test_pairwise_asks_one_preference_question_that_labels_reads():
    from optim.tuning.labels import PAIRWISE_NAMES

    (question,) = q.questions("pairwise")
    assert question.name == "preference" and question.name in PAIRWISE_NAMES
    assert question.options == ("1", "2", "tie") and "answer_1" in question.instruction


def test_scored_tasks_ask_one_question_per_criterion_on_its_scale():
    asked = {x.name: x for x in q.questions(LABELS_TASK)}
    assert list(asked) == ["faithful", "relevance"]
    assert asked["faithful"].options == ("pass", "fail", "unsure") and asked["faithful"].low is None
    assert (asked["relevance"].low, asked["relevance"].high, asked["relevance"].options) == (1, 5, ())
    assert asked["relevance"].instruction == "it answers the question (1-5)"
    topical = [x.name for x in q.questions(as_task("pointwise"))]
    assert topical == ["naturalness", "coherence", "engagingness", "groundedness"]
    reserved = TaskSpec.from_dict({**LABELS_TASK.to_dict(), "criteria": [
        {"name": "feedback", "description": "d", "scale": "1-3"}]})
    with pytest.raises(ConfigError, match="reserved"):
        q.questions(reserved)


def test_results_are_matched_to_traces_by_item_and_run():
    def trace(tid, item, key, ms):
        return NS(info=NS(trace_id=tid, tags={sources.ITEM_TAG: item, sources.RUN_TAG: key}, request_time=ms))

    traces = [trace("old", "1", "k1", 1), trace("new", "1", "k1", 2), trace("other-run", "2", "k2", 3),
              trace("any", "3", "k9", 4)]
    got = sources.match([{"id": 1, "run_key": "k1"}, {"id": 2, "run_key": "k1"}, {"id": 3}], traces)
    assert got == {"1": "new", "3": "any"}  # item 2 was traced in another run only; item 3's record has no key


def test_a_score_verdict_line_ranks_as_its_evaluate_line_does():
    from chateval_dspy.deploy.saved.judge import Verdict

    line = {"id": "q1", "format": "pairwise", "human": "1", "prediction": "tie", "score_1": 6.0, "score_2": 5.0,
            "order_preferences": ["1", "2"], "consistent": False, "abstained": None, "abstentions": {},
            "referees": {"a": [pair(8, 2, "1"), pair(3, 8, "2")], "b": [pair(4, 8, "2"), pair(8, 2, "1")]},
            "transcripts": [], "calls": 4, "prompt_tokens": 10, "completion_tokens": 5, "seconds": 0.1}
    scored = Verdict.from_record(line).to_dict()  # what chateval score writes
    back = sources.normalized(scored, as_task("pairwise"))
    got, want = uncertainty.uncertainty(back), uncertainty.uncertainty(line)
    assert got.components == want.components and got.score == want.score
    assert sources.normalized(line, as_task("pairwise")) is line


def test_the_review_page_url_is_the_mlflow_ui_route():
    assert queue_url("http://h:5000", "7", "rq-9") == "http://h:5000/#/experiments/7/review-queue?selectedQueueId=rq-9"
    assert queue_url("sqlite:///mlruns/mlflow.db", "7", "rq-9").startswith("http://127.0.0.1:5000/#/experiments/7/")


# ---- against a real tracking server ----------------------------------------------------------------------------

ITEMS = 6
BEHAVIOURS = ["sure", "split", "biased", "silent", "sure", "split"]  # what the referees do on item i


def judged_items():
    """The items ``chateval evaluate --dataset faireval --split train --limit 6`` judges."""
    from chateval_dspy.data.spec import DataSpec

    return DataSpec("faireval", split="train", limit=ITEMS).items()[0]


def scripted(items):
    """Referees that are sure (both prefer the first answer, 9 to 2), split (the critic for answer 1, the other
    referee for answer 2), biased (both prefer whichever answer is shown first), or silent (the critic never answers in JSON;
    the other prefers answer 1 narrowly), item by item."""
    by_question = {x.question[:60]: (BEHAVIOURS[i], x) for i, x in enumerate(items)}

    def respond(call):
        if call.kind != "verdict" or call.inputs.get("question", "")[:60] not in by_question:
            return default_responder(call)  # an argument, or an item of another dataset
        behaviour, item = by_question[call.inputs.get("question", "")[:60]]
        swapped = call.inputs.get("answer_1", "")[:60] != item.answer_1[:60]
        critic = "critic" in call.inputs.get("persona", "").lower()

        def prefer(first: int, second: int) -> dict:  # scores of the item's answer 1 and 2, in this order
            s1, s2 = (second, first) if swapped else (first, second)
            return {"evidence": f"{behaviour} verdict", "score_1": s1, "score_2": s2}

        if behaviour == "sure":
            return prefer(9, 2)
        if behaviour == "split":
            return prefer(8, 3) if critic else prefer(3, 8)
        if behaviour == "biased":
            return {"evidence": "the first answer", "score_1": 8, "score_2": 3}
        return "I would rather not say." if critic else prefer(7, 6)

    return respond


@pytest.fixture(scope="module")
def lm_url():
    with FakeOpenAIServer(responder=scripted(judged_items())) as url:
        yield url


@pytest.fixture(scope="module")
def judged(tracking_server, lm_url, tmp_path_factory):
    """Six FairEval train items judged with traces on the server: ``(uri, work dir, results file, experiment)``."""
    import mlflow

    uri, _ = tracking_server
    work = tmp_path_factory.mktemp("review")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        code, out, err = chateval_captured("evaluate", "--dataset", "faireval", "--split", "train", "--limit", str(ITEMS),
                                           "--roles", "2", "--turns", "1", "--model", lm_url, "--no-cache", "--trace",
                                           "--no-progress", "--out", "results/judged.jsonl")
        assert code == 0, out + err
        mlflow.set_tracking_uri(uri)
        mlflow.flush_trace_async_logging()
        experiment = mlflow.get_experiment_by_name("chateval-dspy").experiment_id
    yield uri, work, work / "results" / "judged.jsonl", experiment


@pytest.fixture
def on_server(judged, monkeypatch):
    import mlflow

    uri, work, _, _ = judged
    monkeypatch.chdir(work)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    yield judged
    from mlflow.genai.review_queues import delete_review_queue, list_review_queues

    for queue in list_review_queues(experiment_id=judged[3]):  # each test's queues are its own
        delete_review_queue(queue.queue_id)
    mlflow.set_tracking_uri(previous)


def human(trace_id: str, name: str, value, who: str) -> None:
    """A person's answer, as the Review page (or ``mlflow.log_feedback``) stores it."""
    import mlflow
    from mlflow.entities import AssessmentSource, AssessmentSourceType

    mlflow.log_feedback(trace_id=trace_id, name=name, value=value,
                        source=AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id=who))


def queue_items(queue_id: str) -> set[str]:
    from mlflow.genai.review_queues import list_review_queue_items

    return {i.item_id for i in list_review_queue_items(queue_id)}


def queue_named(experiment: str, name: str):
    from mlflow.genai.review_queues import list_review_queues

    (found,) = [x for x in list_review_queues(experiment_id=experiment) if x.name == name]
    return found


def traces_by_item(experiment: str, results) -> dict[str, str]:
    records = [json.loads(line) for line in results.read_text().splitlines()]
    return sources.match(records, sources.search(experiment, spans=False))


@pytest.mark.slow
def test_scripted_referees_make_the_uncertainty_the_results_show(on_server):
    _, _, results, _ = on_server
    records = {r["id"]: r for r in map(json.loads, results.read_text().splitlines())}
    behaviour = {str(x.id): BEHAVIOURS[i] for i, x in enumerate(judged_items())}
    scores = {i: uncertainty.uncertainty(r) for i, r in records.items()}
    by = {b: [scores[i] for i in records if behaviour[i] == b] for b in set(BEHAVIOURS)}
    assert all(u.components["split"] == 1.0 for u in by["split"])
    assert all(u.components["inconsistent"] == 1.0 for u in by["biased"])
    assert all(u.components["abstained"] == 0.5 for u in by["silent"])
    assert all(u.score < 0.05 for u in by["sure"])
    assert min(u.score for u in by["split"]) > max(u.score for b in ("biased", "silent", "sure") for u in by[b])


def test_review_creates_the_questions_and_queues_the_most_uncertain_traces(on_server):
    from mlflow.genai.label_schemas import list_label_schemas

    uri, _, results, experiment = on_server
    code, out, err = chateval_captured("review", str(results), "--queue", "unsure", "--top", "3", "--reviewer", "Alice",
                                       "--reviewer", "bob", "--explain")
    assert code == 0, out + err
    behaviour = {str(x.id): BEHAVIOURS[i] for i, x in enumerate(judged_items())}
    traces = traces_by_item(experiment, results)
    expected = {traces[i] for i, b in behaviour.items() if b in ("split", "biased")}  # U 0.5, 0.5, 0.45
    found = queue_named(experiment, "unsure")
    assert queue_items(found.queue_id) == expected and found.users == ["alice", "bob"]
    schemas = {s.name: s for s in list_label_schemas(experiment)}
    preference = schemas["preference"]
    assert preference.input.options == ["1", "2", "tie"] and found.schema_ids == [preference.schema_id]
    assert "which answer is better overall" in preference.instruction.lower()
    assert f"MLflow's queue: {uri}/#/experiments/{experiment}/review-queue?selectedQueueId={found.queue_id}" in out
    assert "review page: chateval review serve --queue unsure (each reviewer's own link" in out
    assert "3 added, 0 already queued" in out
    assert out.count("[added]") == 3 and "referees split (order 1: general_public 2, critic 1; order 2" in out


def test_the_page_walks_the_queue_most_uncertain_first(on_server):
    """All items of one call share a creation time in MLflow: the page follows the call's ranking, not trace ids;
    a later top-up's items come after."""
    from optim.review.desk import open_desk

    _, _, results, experiment = on_server

    def added(*argv) -> list[str]:
        code, out, err = chateval_captured("review", str(results), "--queue", "ordered", *argv, "--explain")
        assert code == 0, out + err
        return [line.split("] ", 1)[1].split(":", 1)[0] for line in out.splitlines() if line.startswith("[added]")]

    traces = traces_by_item(experiment, results)
    first = added("--top", "5")
    desk = open_desk("ordered", experiment="chateval-dspy")
    assert len(first) == 5 and desk.trace_ids == [traces[i] for i in first]
    later = added("--budget", "6")
    desk.reload()
    assert len(later) == 1 and desk.trace_ids == [traces[i] for i in first + later]


def test_a_second_review_adds_nothing_new(on_server):
    _, _, results, experiment = on_server
    assert chateval_captured("review", str(results), "--queue", "again", "--top", "2")[0] == 0
    found = queue_named(experiment, "again")
    before = queue_items(found.queue_id)
    code, out, _ = chateval_captured("review", str(results), "--queue", "again", "--top", "2")
    assert code == 0 and "0 added, 2 already queued" in out
    assert queue_items(found.queue_id) == before and len(before) == 2


def test_an_experiment_of_traces_ranks_as_its_results_file_does(on_server):
    import mlflow

    _, _, results, experiment = on_server
    records = {r["id"]: r for r in map(json.loads, results.read_text().splitlines())}
    traces = traces_by_item(experiment, results)
    for item_id, trace_id in traces.items():
        back = sources.record_from_trace(mlflow.get_trace(trace_id))
        assert back["id"] == item_id and back["trace_id"] == trace_id
        assert uncertainty.uncertainty(back) == uncertainty.uncertainty(records[item_id])
    key = records[next(iter(records))]["run_key"]
    code, out, err = chateval_captured("review", f"mlflow:chateval-dspy?filter=tags.`chateval.run_key` = '{key}'",
                                       "--queue", "from-traces", "--top", "3")
    assert code == 0, err
    behaviour = {str(x.id): BEHAVIOURS[i] for i, x in enumerate(judged_items())}
    expected = {traces[i] for i, b in behaviour.items() if b in ("split", "biased")}
    assert queue_items(queue_named(experiment, "from-traces").queue_id) == expected


def test_an_item_waiting_in_another_queue_is_not_queued_again(on_server):
    _, _, results, experiment = on_server
    assert chateval_captured("review", str(results), "--queue", "first", "--top", "2")[0] == 0
    waiting = queue_items(queue_named(experiment, "first").queue_id)
    code, out, err = chateval_captured("review", "mlflow:chateval-dspy", "--queue", "second", "--top", "4", "--explain")
    assert code == 0, err
    assert "2 added, 0 already queued, 0 already answered, 2 waiting in another queue" in out
    assert out.count("[in another queue]") == 2 and "several origins" not in err
    assert not queue_items(queue_named(experiment, "second").queue_id) & waiting


def test_items_without_a_trace_are_counted_and_the_fix_is_named(on_server, tmp_path):
    _, _, results, _ = on_server
    lines = results.read_text().splitlines()
    partly = tmp_path / "partly.jsonl"
    ghost = {**json.loads(lines[0]), "id": "never-traced", "consistent": False}
    partly.write_text("\n".join([*lines, json.dumps(ghost)]) + "\n")
    code, out, err = chateval_captured("review", str(partly), "--queue", "partly", "--top", "2", "--explain")
    assert code == 0 and "1 of 7 items have no trace" in err and "--trace" in err
    assert "[no trace] never-traced" in out
    alone = tmp_path / "alone.jsonl"
    alone.write_text(json.dumps(ghost) + "\n")
    code, _, err = chateval_captured("review", str(alone), "--queue", "partly")
    assert code == 2 and "none of the 1 items" in err and "--trace" in err and len(err.strip().splitlines()) == 1


def test_a_scored_task_gets_one_numeric_question_per_criterion(on_server, lm_url):
    from mlflow.genai.label_schemas import list_label_schemas

    code, out, err = chateval_captured("evaluate", "--dataset", "topical_chat", "--limit", "3", "--roles", "2",
                                       "--turns", "1", "--model", lm_url, "--no-cache", "--trace", "--no-progress",
                                       "--out", "results/scored.jsonl")
    assert code == 0, out + err
    code, out, err = chateval_captured("review", "results/scored.jsonl", "--queue", "scored", "--top", "2")
    assert code == 0, err
    experiment = on_server[3]
    schemas = {s.name: s for s in list_label_schemas(experiment)}
    task = as_task("pointwise")
    for criterion in task.criteria:
        s = schemas[criterion.name]
        assert (s.input.min_value, s.input.max_value) == (criterion.scale.low, criterion.scale.high)
        assert s.instruction == f"{criterion.description} ({criterion.scale})"
    found = queue_named(experiment, "scored")
    assert sorted(found.schema_ids) == sorted(schemas[c.name].schema_id for c in task.criteria)
    assert len(queue_items(found.queue_id)) == 2


def test_a_budget_tops_the_queue_up_and_skips_answered_items(on_server):
    _, _, results, experiment = on_server
    traces = traces_by_item(experiment, results)
    records = [json.loads(line) for line in results.read_text().splitlines()]
    order = [u.item_id for _, u in uncertainty.rank(records)]
    assert chateval_captured("review", str(results), "--queue", "budget", "--top", "2")[0] == 0
    human(traces[order[2]], "preference", "1", "carol")  # the third most uncertain item is answered already
    code, out, _ = chateval_captured("review", str(results), "--queue", "budget", "--budget", "4")
    assert code == 0 and "2 added, 2 already queued, 1 already answered" in out
    assert queue_items(queue_named(experiment, "budget").queue_id) == {traces[i] for i in
                                                                       order[:2] + order[3:5]}
    assert "0 added" in chateval_captured("review", str(results), "--queue", "budget", "--budget", "4")[1]


def test_two_reviewers_answers_on_one_trace_are_both_kept_and_resolved_by_the_labels_rule(on_server):
    import mlflow

    from optim.tuning.labels import labels_from_mlflow

    _, _, results, experiment = on_server
    assert chateval_captured("review", str(results), "--queue", "two", "--top", "2",
                             "--reviewer", "ann", "--reviewer", "bo")[0] == 0
    agreed, split_ = sorted(queue_items(queue_named(experiment, "two").queue_id))
    human(agreed, "preference", "2", "ann")
    human(agreed, "preference", "2", "bo")
    human(split_, "preference", "1", "ann")
    human(split_, "preference", "2", "bo")
    mlflow.flush_trace_async_logging()
    kept = [a for a in mlflow.get_trace(split_).info.assessments if a.name == "preference"]
    assert sorted((a.source.source_id, a.value) for a in kept) == [("ann", "1"), ("bo", "2")]
    got = labels_from_mlflow("mlflow:chateval-dspy")
    card = got.card()
    item_of = {t: i for i, t in traces_by_item(experiment, results).items()}
    assert agreed in card["traces"] and got.items[item_of[agreed]].label == "2"  # both said 2
    assert split_ not in card["traces"] and card["disagreements"] >= 1  # 1:1 is an even split: counted, unlabelled
    assert card["reviewers"]["ann"] >= 2 and card["reviewers"]["bo"] >= 2


def test_answers_on_queued_traces_become_the_labels_and_demos_of_a_compile(on_server, lm_url):
    """The round trip: queue, answers by two reviewers, ``chateval compile --labels mlflow:...``; the card says how
    many labels came from review and from whom, and every referee's demos hold the reviewed items."""
    _, work, results, experiment = on_server
    code, out, err = chateval_captured("review", str(results), "--queue", "round-trip", "--top", str(ITEMS), "--reviewer", "ann",
                                       "--reviewer", "bo")
    assert code == 0, err
    traces = traces_by_item(experiment, results)
    added = {i for i, t in traces.items() if t in queue_items(queue_named(experiment, "round-trip").queue_id)}
    assert added and f"{len(added)} added" in out  # the items earlier tests answered are not queued again
    truth = {str(x.id): x for x in judged_items()}
    for item_id in added:
        for who in ("ann", "bo"):
            human(traces[item_id], "preference", truth[item_id].label, who)
    key = json.loads(results.read_text().splitlines()[0])["run_key"]
    source = f"mlflow:chateval-dspy?filter=tags.`chateval.run_key` = '{key}'"
    program = work / "programs" / "after-review"
    code, out, err = chateval_captured("compile", "--labels", source, "--dataset", "faireval", "--limit", "2",
                                       "--roles", "2", "--turns", "1", "--model", lm_url, "--no-cache",
                                       "--optimizer", "labeled", "--max-demos", "16",
                                       "--out", str(program), "--no-progress", "--no-log-model")
    assert code == 0, out + err
    labels = json.loads((program / "card.json").read_text())["labels"]
    assert {traces[i] for i in added} <= set(labels["traces"])
    assert labels["from_review"] == labels["labels"] and labels["reviewers"]["ann"] >= len(added) \
        and labels["reviewers"]["bo"] >= len(added)
    state = json.loads((program / "program.json").read_text())
    judges = [p for name, p in state.items() if name.endswith(".judge")]
    assert len(judges) == 2
    for predictor in judges:
        shown = {d["question"] for d in predictor["demos"]}
        assert {truth[i].question for i in added} <= shown
