"""Prompt-cache tokens counted and priced: results lines, RunResult, tables, MLflow, cards.

Expected dollars are computed by hand and from LiteLLM's cost map file itself, never through ``lm.pricing``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import re
from pathlib import Path

import dspy
import pytest
from dspy.lm15 import Message, Response, TextPart, Usage

from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.store import CARD_FILE, CARD_MD, load_program, save_program
from chateval_dspy.errors import ConfigError, DataError
from chateval_dspy.lm.adapter import DebateAdapter
from chateval_dspy.lm.pricing import Price, litellm_price, price_for, stated_price
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.task import builtin_task
from chateval_dspy.run.evaluate import evaluate
from chateval_dspy.run.records import read_records
from chateval_dspy.run.result import RunResult
from chateval_dspy.run.table import summary_table
from chateval_dspy.run.usage import TokenCounts, token_counts
from chateval_dspy.testing.fake_lm import ScriptedEngine

PANEL = DebateConfig(roles=("critic",), turns=1)  # 2 calls per item (one per answer order)
HAIKU = "claude-haiku-4-5"


def cost_map(model: str) -> dict:
    folder = Path(importlib.util.find_spec("litellm").submodule_search_locations[0])
    return json.loads((folder / "model_prices_and_context_window_backup.json").read_text())[model]


# --- usage shapes ---------------------------------------------------------------------------------------------


def dspy_native_usage(provider: str, **counts) -> dict:
    """The usage dict DSPy's native route hands its usage tracker for a provider's lm15 Usage."""
    from dspy.clients.call_result import usage_dict

    response = Response(id=None, model="m", message=Message.assistant([TextPart("x")]), finish_reason="stop",
                        usage=Usage(**counts))
    return usage_dict(response, provider)


def test_openai_native_cached_tokens_are_part_of_the_prompt():
    used = dspy_native_usage("openai", input_tokens=10_000, output_tokens=500, cache_read_tokens=6_000)
    assert used["prompt_tokens_details"]["cached_tokens"] == 6_000
    assert token_counts(used) == TokenCounts(10_000, 6_000, 0, 500)


def test_anthropic_native_reads_and_writes_are_added_to_its_disjoint_input_count():
    # Anthropic's input_tokens leaves out cached reads and writes; DSPy's native route adds them to prompt_tokens.
    used = dspy_native_usage("anthropic", input_tokens=100, output_tokens=50, cache_read_tokens=6_000,
                             cache_write_tokens=2_000)
    assert token_counts(used) == TokenCounts(8_100, 6_000, 2_000, 50)


def test_anthropic_through_litellm_counts_each_token_once_even_summed():
    from dspy.clients.legacy_outputs import plain
    from dspy.utils.usage_tracker import UsageTracker
    from litellm.llms.anthropic.chat.transformation import AnthropicConfig

    wire = {"input_tokens": 100, "output_tokens": 50, "cache_read_input_tokens": 6_000,
            "cache_creation_input_tokens": 2_000}
    used = plain(dict(AnthropicConfig().calculate_usage(wire, None)))  # what DSPy's LiteLLM path records
    assert used["cache_read_input_tokens"] == used["prompt_tokens_details"]["cached_tokens"] == 6_000  # both names
    assert token_counts(used) == TokenCounts(8_100, 6_000, 2_000, 50)
    tracker = UsageTracker()
    tracker.add_usage("anthropic/claude-haiku-4-5", used)
    tracker.add_usage("anthropic/claude-haiku-4-5", used)
    assert token_counts(tracker.get_total_tokens()["anthropic/claude-haiku-4-5"]) == TokenCounts(16_200, 12_000,
                                                                                                  4_000, 100)


def test_openai_through_litellm_and_unreported_shapes():
    from dspy.clients.legacy_outputs import plain
    from litellm.types.utils import Usage as LiteLLMUsage

    used = plain(dict(LiteLLMUsage(prompt_tokens=10_000, completion_tokens=500, total_tokens=10_500,
                                   prompt_tokens_details={"cached_tokens": 6_000})))
    assert token_counts(used) == TokenCounts(10_000, 6_000, 0, 500)
    assert token_counts({"prompt_tokens": 7, "completion_tokens": 2, "prompt_tokens_details": None}) == (7, 0, 0, 2)
    assert token_counts(None) == (0, 0, 0, 0)


def test_our_engine_carries_the_servers_cached_tokens():
    from openai.types.chat import ChatCompletion

    from chateval_dspy.lm.engine import OpenAICompatEngine

    body = {"id": "c", "object": "chat.completion", "created": 0, "model": "served",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "{}"}, "finish_reason": "stop"}]}
    engine = OpenAICompatEngine("http://127.0.0.1:9/v1", "served", api_key="x", max_retries=0, timeout=1)
    try:
        cached = engine._response(ChatCompletion.model_validate({**body, "usage": {
            "prompt_tokens": 2_000, "completion_tokens": 10, "total_tokens": 2_010,
            "prompt_tokens_details": {"cached_tokens": 1_536}}}))
        plain = engine._response(ChatCompletion.model_validate({**body, "usage": {
            "prompt_tokens": 20, "completion_tokens": 1, "total_tokens": 21}}))
    finally:
        engine.close()
    assert (cached.usage.input_tokens, cached.usage.cache_read_tokens) == (2_000, 1_536)
    assert plain.usage.cache_read_tokens is None
    from dspy.clients.call_result import usage_dict

    assert token_counts(usage_dict(cached)) == TokenCounts(2_000, 1_536, 0, 10)


# --- prices ---------------------------------------------------------------------------------------------------


def test_gpt_4o_mini_cache_reads_at_the_maps_rate_equal_a_hand_computation():
    entry, price = cost_map("gpt-4o-mini"), litellm_price("openai/gpt-4o-mini")
    assert (price.input_per_mtok, price.cached_prompt_per_mtok, price.output_per_mtok) == (0.15, 0.075, 0.6)
    assert price.cached_prompt_per_mtok == pytest.approx(entry["cache_read_input_token_cost"] * 1e6)
    assert price.cache_rates == "read"  # OpenAI bills no cache writes: the map has no write rate
    usd = price.usd(10_000, 500, cached_prompt_tokens=6_000)
    assert usd == pytest.approx((4_000 * 0.15 + 6_000 * 0.075 + 500 * 0.6) / 1e6) == pytest.approx(0.00135)
    assert usd == pytest.approx(4_000 * entry["input_cost_per_token"] + 6_000 * entry["cache_read_input_token_cost"]
                                + 500 * entry["output_cost_per_token"], rel=1e-9)
    assert price.usd(1_000, 500) == 0.00045  # the two-count call as it always was


def test_claude_haiku_reads_at_a_tenth_and_writes_at_five_quarters_of_input():
    entry, price = cost_map(HAIKU), litellm_price(f"anthropic/{HAIKU}")
    assert entry["cache_read_input_token_cost"] == pytest.approx(0.10 * entry["input_cost_per_token"])
    assert entry["cache_creation_input_token_cost"] == pytest.approx(1.25 * entry["input_cost_per_token"])
    assert price.cache_rates == "read+write"
    # 10,000 prompt tokens: 6,000 read from the cache, 2,000 written to it, 2,000 plain; 500 output.
    usd = price.usd(10_000, 500, cached_prompt_tokens=6_000, cache_write_tokens=2_000)
    by_map = (2_000 * entry["input_cost_per_token"] + 6_000 * entry["cache_read_input_token_cost"]
              + 2_000 * entry["cache_creation_input_token_cost"] + 500 * entry["output_cost_per_token"])
    assert usd == pytest.approx(by_map, rel=1e-9)
    assert usd == pytest.approx((2_000 * 1.0 + 6_000 * 0.1 + 2_000 * 1.25 + 500 * 5.0) / 1e6) == pytest.approx(0.0076)
    with pytest.raises(ValueError, match="must include"):
        price.usd(1_000, 0, cached_prompt_tokens=900, cache_write_tokens=200)


def test_a_model_without_cache_rates_prices_them_as_input_and_says_so():
    from chateval_dspy.lm.pricing import cache_rate_note

    entry, price = cost_map("gpt-3.5-turbo"), price_for("openai/gpt-3.5-turbo")
    assert "cache_read_input_token_cost" not in entry and price.cache_rates == "none"
    assert price.usd(10_000, 500, cached_prompt_tokens=6_000) == price.usd(10_000, 500)
    note = cache_rate_note("openai/gpt-3.5-turbo", {"cache_rates": "none", "cached_prompt_tokens": 6_000})
    assert note == ("openai/gpt-3.5-turbo: no cache rates in LiteLLM's cost map or --price-per-mtok: "
                    "6000 cached prompt tokens priced as input")
    assert cache_rate_note("m", {"cache_rates": "none", "cached_prompt_tokens": 0}) is None  # nothing was cached
    assert cache_rate_note("m", {"cache_rates": None, "cached_prompt_tokens": 5}) is None  # unpriced


def test_a_stated_price_takes_optional_cache_rates():
    assert stated_price("0.15,0.6") == Price(0.15, 0.6, "stated") and stated_price("0.15,0.6").cache_rates == "none"
    four = stated_price("1,5,0.1,1.25")
    assert (four.cached_prompt_per_mtok, four.cache_write_per_mtok, four.per_mtok) == (0.1, 1.25, (1, 5, 0.1, 1.25))
    assert stated_price([1, 5, 0.1]).cache_rates == "read" and stated_price("1,5").per_mtok == (1, 5)
    for text in ("1,5", "1,5,0.1", "1,5,0.1,1.25"):  # what LMSpec keeps states the same price again
        assert stated_price(stated_price(text).per_mtok) == stated_price(text)
    for bad in ("1", "1,2,3,4,5", "1,5,-0.1", "1,5,x"):
        with pytest.raises(ConfigError, match="--price-per-mtok takes two prices"):
            stated_price(bad)


# --- end to end -----------------------------------------------------------------------------------------------


class PromptCachingEngine(ScriptedEngine):
    """The scripted LM, reporting as an OpenAI-style server does: ``share`` of each prompt read from the cache."""

    def __init__(self, share: float = 0.5):
        super().__init__()
        self.share = share

    def complete(self, request) -> Response:
        response = super().complete(request)
        u = response.usage
        return dataclasses.replace(response, usage=Usage(
            input_tokens=u.input_tokens, output_tokens=u.output_tokens, total_tokens=u.total_tokens,
            cache_read_tokens=int(u.input_tokens * self.share)))


def items(n: int) -> list[dspy.Example]:
    return [dspy.Example(id=f"item-{i}", label="1", question=f"question {i}", answer_1="a" * (40 + i),
                         answer_2="b" * 12).with_inputs(*builtin_task("pairwise").input_names) for i in range(n)]


def run_priced(tmp_path, model="openai/gpt-4o-mini", share=0.5):
    lm = dspy.LM(model, engine=PromptCachingEngine(share), cache=False, temperature=0.0, max_tokens=256,
                 num_retries=0)
    with dspy.context(lm=lm, adapter=DebateAdapter()):
        result = evaluate(build_evaluator(PANEL), items(3), PANEL, out=tmp_path / "r.jsonl")
    return result, read_records(tmp_path / "r.jsonl")


def test_evaluate_counts_and_prices_cached_tokens_in_lines_result_and_table(tmp_path):
    entry = cost_map("gpt-4o-mini")
    result, lines = run_priced(tmp_path)
    for line in lines:
        used = line["usage_by_model"]["openai/gpt-4o-mini"]
        assert line["cached_prompt_tokens"] == used["cached_prompt_tokens"] > 0
        assert line["cache_write_tokens"] == used["cache_write_tokens"] == 0
        assert line["cached_prompt_tokens"] < line["prompt_tokens"] == used["prompt_tokens"]
        expected = ((line["prompt_tokens"] - line["cached_prompt_tokens"]) * entry["input_cost_per_token"]
                    + line["cached_prompt_tokens"] * entry["cache_read_input_token_cost"]
                    + line["completion_tokens"] * entry["output_cost_per_token"])
        assert line["cost_usd"] == used["cost_usd"] == pytest.approx(expected, rel=1e-9)
        assert used["cache_rates"] == "read"
    cached = sum(line["cached_prompt_tokens"] for line in lines)
    assert result.cached_prompt_tokens == cached and result.cache_write_tokens == 0
    cost = result.cost()
    assert cost["cached_prompt_tokens_per_item"] == pytest.approx(cached / 3)
    assert cost["cached_prompt_share"] == pytest.approx(cached / result.prompt_tokens)
    assert 0.45 < cost["cached_prompt_share"] <= 0.5
    usage = result.model_usage()["openai/gpt-4o-mini"]
    assert (usage["cached_prompt_tokens"], usage["cache_write_tokens"], usage["cache_rates"]) == (cached, 0, "read")
    printed = summary_table(result.metrics(), cost, {"model": "openai/gpt-4o-mini"}, models=result.model_usage())
    header = next(x for x in printed.splitlines() if x.lstrip().startswith("model  calls"))
    assert "cached prompt  cache write" in header
    assert re.search(rf"openai/gpt-4o-mini\s+6\s+0\s+{result.prompt_tokens}\s+{cached}\s+0\s+{result.completion_tokens}"
                     r"\s+[\d.]+\s+\$0\.\d{6}", printed), printed
    assert re.search(rf"cached_prompt_tokens_per_item\s+{cached / 3:.3f}", printed), printed
    assert "priced as input" not in printed  # gpt-4o-mini has a cache-read rate


def test_a_model_without_cache_rates_says_so_in_the_summary(tmp_path):
    result, lines = run_priced(tmp_path, model="openai/gpt-3.5-turbo")
    assert all(line["usage_by_model"]["openai/gpt-3.5-turbo"]["cache_rates"] == "none" for line in lines)
    entry = cost_map("gpt-3.5-turbo")
    for line in lines:  # cached or not, every prompt token at the input rate
        assert line["cost_usd"] == pytest.approx(line["prompt_tokens"] * entry["input_cost_per_token"]
                                                 + line["completion_tokens"] * entry["output_cost_per_token"], rel=1e-9)
    printed = summary_table(result.metrics(), result.cost(), {}, models=result.model_usage())
    assert (f"openai/gpt-3.5-turbo: no cache rates in LiteLLM's cost map or --price-per-mtok: "
            f"{result.cached_prompt_tokens} cached prompt tokens priced as input") in printed


def test_mlflow_metrics_carry_cached_tokens(tmp_path):
    from optim.tracking.runs import metric_values

    result, _ = run_priced(tmp_path)
    logged = metric_values({}, {**result.cost(), **result.model_metrics()})
    assert logged["cached_prompt_tokens_per_item"] == pytest.approx(result.cached_prompt_tokens / 3)
    assert logged["cache_write_tokens_per_item"] == 0.0
    assert logged["cached_prompt_share"] == pytest.approx(result.cached_prompt_tokens / result.prompt_tokens)
    assert logged["model/openai/gpt-4o-mini/cached_prompt_tokens_per_item"] == pytest.approx(
        result.cached_prompt_tokens / 3)
    assert not any("cache_rates" in k for k in logged)  # a word, not a metric


def test_report_shows_the_cost_by_model_of_a_results_file(tmp_path):
    from optim.tracking.report import model_cost_table

    result, lines = run_priced(tmp_path)
    table = model_cost_table(lines)
    assert re.search(rf"openai/gpt-4o-mini\s+6\s+0\s+{result.prompt_tokens}\s+{result.cached_prompt_tokens}\s+0\s",
                     table), table
    assert model_cost_table([{"id": 1, "prompt_tokens": 5}]) == ""  # written before costs were recorded


# --- old lines, strict reading, the card ----------------------------------------------------------------------

OLD_LINE = {"id": "old", "human": "1", "prediction": "1", "calls": 2, "prompt_tokens": 100, "completion_tokens": 10,
            "seconds": 0.5, "abstained": None, "cost_usd": 2.1e-05,
            "usage_by_model": {"openai/gpt-4o-mini": {"calls": 2, "cached_calls": 0, "prompt_tokens": 100,
                                                      "completion_tokens": 10, "seconds": 0.5, "cost_usd": 2.1e-05}}}


def test_lines_written_before_cache_counts_read_back_as_zero_cached(tmp_path):
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(OLD_LINE) + "\n")
    result = RunResult(PANEL)
    for record in read_records(path):
        result.add(record)
    assert (result.cached_prompt_tokens, result.cache_write_tokens) == (0, 0)
    usage = result.model_usage()["openai/gpt-4o-mini"]
    assert (usage["cached_prompt_tokens"], usage["cache_write_tokens"], usage["cache_rates"]) == (0, 0, None)
    assert result.cost()["cached_prompt_share"] == 0.0 and result.cost()["cost_usd_total"] == pytest.approx(2.1e-05)
    assert math.isnan(RunResult(PANEL).cost()["cached_prompt_share"])  # no prompt tokens: no share


@pytest.mark.parametrize("where, value", [("top", -1), ("top", 1.5), ("top", "12"), ("top", True),
                                          ("model", -3), ("model", None)])
def test_a_bad_cache_count_in_a_results_line_names_file_and_line(tmp_path, where, value):
    bad = json.loads(json.dumps(OLD_LINE))
    name = "cached_prompt_tokens" if where == "top" else "cache_write_tokens"
    (bad if where == "top" else bad["usage_by_model"]["openai/gpt-4o-mini"])[name] = value
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(OLD_LINE) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(DataError, match=rf"r\.jsonl row 2: field '.*{name}': must be a whole number") as caught:
        read_records(path)
    assert caught.value.row == 2 and caught.value.source == str(path)


def test_the_card_carries_cached_tokens_and_checks_cache_rates(tmp_path):
    result, _ = run_priced(tmp_path)
    program = build_evaluator(PANEL)
    path = save_program(program, tmp_path / "p", make_card(program, model="openai/gpt-4o-mini",
                                                           cost=result.card_cost()))
    cost = json.loads((path / CARD_FILE).read_text())["cost"]
    assert cost["cached_prompt_tokens_per_item"] == pytest.approx(result.cached_prompt_tokens / 3)
    assert cost["by_model"]["openai/gpt-4o-mini"]["cached_prompt_tokens"] == result.cached_prompt_tokens
    assert cost["by_model"]["openai/gpt-4o-mini"]["cache_rates"] == "read"
    md = (path / CARD_MD).read_text()
    assert f"({result.cached_prompt_tokens} cached prompt, 0 cache write)" in md
    assert re.search(r"cached_prompt_share 0\.\d{3}", md), md
    load_program(path)  # the strict loader accepts what was written
    card = json.loads((path / CARD_FILE).read_text())
    card["cost"]["by_model"]["openai/gpt-4o-mini"]["cache_rates"] = "free"
    (path / CARD_FILE).write_text(json.dumps(card))
    with pytest.raises(ConfigError, match="cache_rates' must be one of read\\+write, read, write, none"):
        load_program(path)
