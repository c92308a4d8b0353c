"""End to end: the judge's calls reach a provider through the real path (DSPy; LiteLLM for Anthropic), the provider
bills them by its caching rule (the fakes in ``chateval_dspy.testing``), and the results price what it billed."""

from __future__ import annotations

import dspy
import pytest

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.loaders import load_dataset
from chateval_dspy.data.splits import select
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.lm.resolve import resolve_lm
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.demos import with_label_demos
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.records import read_records
from chateval_dspy.testing.billing import AnthropicCaching, OpenAICaching
from chateval_dspy.testing.fake_anthropic import FakeAnthropicServer
from chateval_dspy.testing.fake_server import FakeOpenAIServer


def _judged(model: str, tmp_path, n: int = 3) -> list[dict]:
    """``n`` FairEval items judged by a one-referee panel whose verdict predictor holds 4 labelled demonstrations."""
    items, _ = load_dataset("faireval")
    cfg = DebateConfig(roles=("critic",), turns=1)
    program = with_label_demos(build_evaluator(cfg), select(items, "train", seed=0)[:4], k=4)
    out = tmp_path / "results.jsonl"
    with resolve_lm(model, timeout=30, retries=0) as lm, dspy.context(lm=lm, adapter=DebateAdapter()):
        evaluate(program, select(items, "test", seed=0)[:n], cfg, out=out, run_key=model)
    return read_records(out)


def _usd(records, rates) -> float:
    """The bill by hand: uncached input, cached reads, cache writes and output at their own rates (per token)."""
    inp, read, write, out = rates
    return sum((r["prompt_tokens"] - r["cached_prompt_tokens"] - r["cache_write_tokens"]) * inp
               + r["cached_prompt_tokens"] * read + r["cache_write_tokens"] * write + r["completion_tokens"] * out
               for r in records)


def test_openai_bills_the_static_part_from_its_cache_and_the_results_price_it(tmp_path, monkeypatch):
    fake = FakeOpenAIServer(billing=OpenAICaching(), model="gpt-4o-mini")
    with fake as base:
        monkeypatch.setenv("OPENAI_BASE_URL", base)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
        records = _judged("openai/gpt-4o-mini", tmp_path)
    first, *later = records
    # The static part (instructions, format, persona, 4 demonstrations) is over 1,024 tokens: every call after the
    # first reads it, in whole steps of 128 tokens.
    assert first["prompt_tokens"] > 2 * 1024
    assert all(r["cached_prompt_tokens"] >= 1024 and r["cached_prompt_tokens"] % 128 == 0 for r in later)
    assert all(r["cache_write_tokens"] == 0 for r in records)  # OpenAI bills no writes
    expected = _usd(records, (0.15e-6, 0.075e-6, 0.15e-6, 0.6e-6))
    assert sum(r["cost_usd"] for r in records) == pytest.approx(expected, rel=1e-9)
    assert sum(r["cost_usd"] for r in records) < _usd(records, (0.15e-6, 0.15e-6, 0.15e-6, 0.6e-6))


def test_anthropic_gets_breakpoints_writes_once_and_reads_after(tmp_path, monkeypatch):
    fake = FakeAnthropicServer(billing=AnthropicCaching())
    with fake as base:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", base)
        monkeypatch.setenv("ANTHROPIC_API_BASE", base)
        monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-a-key")
        records = _judged("anthropic/claude-sonnet-4-5", tmp_path)
    bodies = [q["body"] for q in fake.requests]
    marks = [sum("cache_control" in b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"])
             + sum("cache_control" in b for b in body.get("system") or () if isinstance(b, dict)) for body in bodies]
    # One breakpoint per call: the end of the static part (the last demonstration). A one-referee, one-round panel
    # reads no item's texts twice in an order, so they are not marked (a write there would never be read).
    assert marks == [1] * len(bodies)
    first, *later = records
    # Written once, by the first call; every later call (the first item's other answer order included) reads it.
    assert first["cache_write_tokens"] >= 1024 and sum(r["cache_write_tokens"] for r in records) == first["cache_write_tokens"]
    assert all(r["cached_prompt_tokens"] >= 2 * first["cache_write_tokens"] for r in later)
    expected = _usd(records, (3e-6, 0.3e-6, 3.75e-6, 15e-6))  # LiteLLM's cost map: reads at 10%, writes at 125%
    assert sum(r["cost_usd"] for r in records) == pytest.approx(expected, rel=1e-9)
    assert all(r["usage_by_model"]["anthropic/claude-sonnet-4-5"]["cache_rates"] == "read+write" for r in records)


def test_the_caching_suite_prices_rows_before_and_after_and_states_its_targets(tmp_path, capsys):
    """``python -m optim.bench caching`` on two items: every row judged through a fake provider, both layouts."""
    import json

    from optim.bench.main import main

    out = tmp_path / "caching.json"
    assert main(["caching", "--limit", "2", "--demos", "1", "--models", "openai/gpt-4o-mini", "--skip-embedded",
                 "--out", str(out), "--markdown"]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    rows = {(r["config"], r["layout"]): r for r in report["rows"]}
    assert set(rows) == {(c, lay) for c in ("panel", "single", "compiled") for lay in ("before", "after")}
    assert rows[("panel", "after")]["prompt_tokens_per_item"] < rows[("panel", "before")]["prompt_tokens_per_item"]
    assert rows[("panel", "before")]["calls_per_item"] == 8 and rows[("single", "after")]["calls_per_item"] == 2
    for r in rows.values():
        assert r["items"] == 2 and r["usd_per_1000"]["value"] <= r["usd_list_per_1000"]["value"] + 1e-12
    table = capsys.readouterr().out
    assert "USD/1,000 verdicts, with the cache [95% CI]" in table and "panel USD per 1,000 verdicts" in table
