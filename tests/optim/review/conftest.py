"""The review page's items, judged with traces on a fake LM and queued for two reviewers on a real ``mlflow server``
(test_review_page, test_review_browser, test_review_labellers)."""

from __future__ import annotations

import json

import pytest
from chateval_cli import chateval_captured
from review_items import EXAMPLES, PAIRS, RAG

from chateval_dspy.testing.fake_server import FakeOpenAIServer


@pytest.fixture(scope="module")
def queued(tracking_server, tmp_path_factory):
    """The items judged with traces and queued for ann and bo: ``(uri, experiment id, work dir)``."""
    import mlflow

    uri, _ = tracking_server
    work = tmp_path_factory.mktemp("review-page")
    for name, rows in (("pairs.jsonl", PAIRS), ("rag.jsonl", RAG)):
        (work / name).write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.MonkeyPatch.context() as mp, FakeOpenAIServer() as lm:
        mp.chdir(work)
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        common = ("--roles", "2", "--turns", "1", "--model", lm, "--no-cache", "--trace", "--no-progress")
        for argv in (("--format", "pairwise", "--dataset", "pairs.jsonl", "--out", "pairs.jsonl.out"),
                     ("--task", str(EXAMPLES / "rag.yaml"), "--dataset", "rag.jsonl", "--out", "rag.out")):
            code, out, err = chateval_captured("evaluate", *argv, *common)
            assert code == 0, out + err
        for results, queue, extra in (("pairs.jsonl.out", "pairs", ()),
                                      ("rag.out", "rag", ("--task", str(EXAMPLES / "rag.yaml")))):
            code, out, err = chateval_captured("review", results, "--queue", queue, "--top", "4",
                                               "--reviewer", "ann", "--reviewer", "bo", *extra)
            assert code == 0, out + err
        mlflow.set_tracking_uri(uri)
        mlflow.flush_trace_async_logging()
        yield uri, mlflow.get_experiment_by_name("chateval-dspy").experiment_id, work
