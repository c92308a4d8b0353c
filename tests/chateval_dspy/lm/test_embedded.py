"""End to end on the real embedded model (Gemma 3 270M via xllamacpp), through the CLI, as a user runs it.

Issue #2: 2 FairEval items and 2 Topical-Chat items, no network, no manual server step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from repo_paths import ROOT

pytestmark = pytest.mark.embedded


def _run(tmp_path, *args):
    env = dict(os.environ, CHATEVAL_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-m", "optim.cli", "evaluate", *args, "--no-progress", "--no-mlflow"],
                          capture_output=True, text=True, env=env, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_faireval_end_to_end(tmp_path):
    out = tmp_path / "fair.jsonl"
    stdout = _run(tmp_path, "--dataset", "faireval", "--limit", "2", "--out", str(out))
    records = _records(out)
    assert [r["id"] for r in records] == ["1", "2"]
    for r in records:
        assert r["human"] in ("1", "2", "tie")
        # Constrained decoding must give every referee a verdict in range, in both orders.
        assert r["abstained"] is None, r["abstentions"]
        assert r["prediction"] in ("1", "2", "tie")
        assert r["calls"] == 8  # 2 roles x 2 turns x 2 orders
        assert r["prompt_tokens"] > 0 and r["completion_tokens"] > 0
        assert isinstance(r["consistent"], bool)
        for verdicts in r["referees"].values():
            assert len(verdicts) == 2
            assert all(1 <= v[k] <= 10 for v in verdicts for k in ("score_1", "score_2"))
        assert len(r["transcripts"]) == 2 and len(r["transcripts"][0]) == 4
    assert "embedded/gemma-3-270m-q4_k_m" in stdout
    assert "accuracy" in stdout and "kappa" in stdout and "[" in stdout


def test_topical_chat_end_to_end(tmp_path):
    out = tmp_path / "tc.jsonl"
    # Two items at once: two slots of the embedded server.
    _run(tmp_path, "--dataset", "topical_chat", "--limit", "2", "--turns", "1", "--roles", "2", "--out", str(out),
         "--concurrency", "2")
    records = _records(out)
    assert len(records) == 2
    for r in records:
        assert r["abstained"] is None, r["abstentions"]
        assert r["calls"] == 2
        assert 1 <= r["prediction"]["naturalness"] <= 3 and 0 <= r["prediction"]["groundedness"] <= 1
        assert set(r["human"]) >= {"naturalness", "coherence", "engagingness", "groundedness"}


def test_embedded_server_renders_gemma_template():
    from chateval_dspy.lm.resolve import EmbeddedServer, _post_json

    with EmbeddedServer(slots=1) as base_url:
        prompt = _post_json(base_url[: -len("/v1")] + "/apply-template",
                            {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "hello"}]})["prompt"]
    assert "<start_of_turn>user" in prompt and "hello" in prompt and "<start_of_turn>model" in prompt


def test_custom_pointwise_task_end_to_end(tmp_path):
    """The embedded model judges a declared task (a label scale and a 1-5 scale) from the CLI, and every
    verdict parses under the spec's scales."""
    import shutil

    examples = ROOT / "data" / "examples"
    for name in ("rag.yaml", "rag.jsonl"):
        shutil.copy(examples / name, tmp_path / name)
    out = tmp_path / "rag-results.jsonl"
    _run(tmp_path, "--task", "rag.yaml", "--dataset", "rag.jsonl", "--limit", "2", "--roles", "1", "--turns", "1",
         "--skip-bad-rows",
         "--columns", "question=q,context=ctx,answer=gen,faithful=gold.faithful,relevance=gold.relevance",
         "--out", str(out))
    records = _records(out)
    assert len(records) == 2
    for r in records:
        assert r["abstained"] is None and not r["abstentions"], r["abstentions"]
        assert r["prediction"]["faithful"] in ("pass", "fail")
        assert 1 <= r["prediction"]["relevance"] <= 5
        for verdicts in r["referees"].values():
            assert all(v["faithful"] in ("pass", "fail") and v["relevance"] in range(1, 6) for v in verdicts)
