"""Mixed-model panels: each referee may run on its own LM, as in "Replacing Judges with Juries".

Two scripted OpenAI-compatible servers stand for two models. Every request a server receives is recorded, so
"each referee's calls reach only its own server" is counted on the servers themselves, by the persona each
request carries.
"""

from __future__ import annotations

import contextlib
import json
import re

import pytest

import chateval_dspy.lm.resolve as lm_module
from chateval_dspy.config import DebateConfig
from chateval_dspy.data.spec import DataSpec
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.judge import load
from chateval_dspy.deploy.saved.store import CARD_FILE, CARD_MD, load_program, save_program
from chateval_dspy.errors import ConfigError, FatalLMError
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.roles import resolve_roles
from chateval_dspy.run import identity
from chateval_dspy.run.evaluate_dataset import evaluate_dataset
from chateval_dspy.testing.fake_lm import prompt_fields
from chateval_dspy.testing.fake_server import FakeOpenAIServer
from optim.cli.flags import lm_spec

PANEL = ("critic", "scientist")
PERSONAS = {r.slug: r.persona("pairwise") for r in resolve_roles(PANEL, "pairwise")}
ITEM = {"question": "What is 2+2?", "answer_1": "4", "answer_2": "It is five, I believe."}


def speakers(server: FakeOpenAIServer) -> list[str]:
    """Who made each request the server received: a referee slug by its persona, or ``summarizer``."""
    out = []
    for request in server.requests:
        messages = request["body"]["messages"]
        system = next((m["content"] for m in messages if m["role"] == "system"), "")
        # The persona stands in the static part or after the item's texts (lm.layout): read it wherever it is.
        persona = prompt_fields(system, messages[-1]["content"]).get("persona", "").strip()
        out.append(next((slug for slug, text in PERSONAS.items() if text == persona), "summarizer"))
    return out


@pytest.fixture
def two():
    """The two server objects, their URLs and a way to count what each received."""
    a, b = FakeOpenAIServer(model="alpha"), FakeOpenAIServer(model="beta")
    with a as a_url, b as b_url:
        yield {"a": a, "b": b, "a_url": a_url, "b_url": b_url}


def test_each_referee_reaches_only_its_own_server_and_usage_is_per_model(two, tmp_path):
    cfg = DebateConfig(roles=PANEL, turns=2, strategy="simultaneous_talk_with_summarizer")
    lm = LMSpec(model=two["a_url"], referee_models={"scientist": two["b_url"]}, cache=False)
    run = evaluate_dataset(DataSpec("faireval", limit=2), cfg, lm, out=tmp_path / "r.jsonl", concurrency=2)
    on_a, on_b = speakers(two["a"]), speakers(two["b"])
    # The scientist's turns (2 turns x 2 orders x 2 items), and nothing else, went to its own server; the
    # critic and the summarizer (the main LM's) went to the main server. Referees of a round ran in threads.
    assert on_b == ["scientist"] * 8
    assert sorted(set(on_a)) == ["critic", "summarizer"] and on_a.count("critic") == 8
    assert on_a.count("summarizer") == 2 * 2  # one summary per non-final round, per order, per item
    lines = [json.loads(x) for x in run.out.read_text().splitlines()]
    for line in lines:
        used = line["usage_by_model"]
        assert set(used) == {"openai-compatible/alpha", "openai-compatible/beta"}
        assert used["openai-compatible/beta"]["calls"] == 4 and used["openai-compatible/alpha"]["calls"] == 6
        assert sum(u["prompt_tokens"] for u in used.values()) == line["prompt_tokens"]
        assert all(u["seconds"] > 0 for u in used.values())
        assert line["cost_usd"] is None  # two private endpoints: unpriced, never 0
    usage = run.result.model_usage()
    assert usage["openai-compatible/beta"]["calls"] == len(on_b) and usage["openai-compatible/alpha"]["calls"] == len(on_a)
    assert run.referee_models == {"scientist": "openai-compatible/beta"}
    assert "referee_models=scientist=openai-compatible/beta" in "  ".join(f"{k}={v}" for k, v in run.header().items())
    # The same call resumes its file: the referee assignment is part of the run's identity, so nothing is judged again.
    before = len(two["a"].requests) + len(two["b"].requests)
    again = evaluate_dataset(DataSpec("faireval", limit=2), cfg, lm, out=tmp_path / "r.jsonl")
    assert again.result.resumed == 2 and len(two["a"].requests) + len(two["b"].requests) == before
    # The same panel on one model is another run: its key differs and it refuses the mixed run's file.
    with pytest.raises(ConfigError, match="holds results of another run"):
        evaluate_dataset(DataSpec("faireval", limit=2), cfg, LMSpec(model=two["a_url"], cache=False),
                         out=tmp_path / "r.jsonl")


def test_single_model_identity_and_run_keys_are_unchanged():
    """Existing results files must keep their keys: a spec without referee models has the identity it always had."""
    assert LMSpec("embedded").identity() == {"model": "embedded", "served_model": None, "temperature": 0.0,
                                             "max_tokens": None}
    mixed = LMSpec("embedded", referee_models={"critic": "openai/gpt-4o-mini"})
    assert mixed.identity()["referee_models"] == {"critic": "openai/gpt-4o-mini"}
    cfg = DebateConfig()
    assert identity.run_key(cfg, mixed.identity(), []) != identity.run_key(cfg, LMSpec("embedded").identity(), [])


def test_referee_flags_on_the_command_line(two, tmp_path, capsys):
    from optim.cli.main import main

    out = tmp_path / "r.jsonl"
    code = main(["evaluate", "--dataset", "faireval", "--limit", "1", "--role", "critic", "--role", "scientist",
                 "--turns", "1", "--model", two["a_url"], "--referee", f"scientist={two['b_url']}", "--out", str(out),
                 "--no-progress", "--no-cache", "--no-mlflow"])
    printed = capsys.readouterr().out
    assert code == 0
    assert speakers(two["b"]) == ["scientist", "scientist"] and speakers(two["a"]) == ["critic", "critic"]
    # The summary names the referee's model and reports calls, tokens, seconds and dollars per model.
    assert "referee_models=scientist=openai-compatible/beta" in printed
    # calls, cached calls, prompt, cached prompt, cache write and completion tokens, LM seconds, USD
    rows = {m: re.search(rf"^\s*{re.escape(m)}\s+(\d+)\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+[\d.]+\s+unpriced\s*$", printed,
                         re.M)
            for m in ("openai-compatible/alpha", "openai-compatible/beta")}
    assert all(rows.values()), printed
    assert [int(r.group(1)) for r in rows.values()] == [2, 2]


def test_a_bad_referee_is_a_clear_error_before_any_model_starts(monkeypatch, tmp_path):
    started = []
    real = lm_module.resolve_lm

    @contextlib.contextmanager
    def watched(spec, **kwargs):
        started.append(spec)
        if spec == "embedded":  # never reached: the embedded model would start last
            raise AssertionError("the embedded model was started")
        with real(spec, **kwargs) as lm:
            yield lm

    monkeypatch.setattr(lm_module, "resolve_lm", watched)
    with pytest.raises(ConfigError, match="referee 'critic': unknown model 'gpt4'"):
        LMSpec(referee_models={"critic": "gpt4"})
    with pytest.raises(ConfigError, match="--referee takes SLUG=MODEL"):
        lm_spec(_args(referee=["critic"]))
    # A referee that is not on the panel.
    with pytest.raises(ConfigError, match="referee 'psychologist' is given a model but is not on the panel"):
        evaluate_dataset(DataSpec("faireval", limit=1), DebateConfig(roles=PANEL),
                         LMSpec(referee_models={"psychologist": "openai/gpt-4o-mini"}), out=tmp_path / "r.jsonl")
    assert started == []
    # A referee naming a URL nobody answers: the URL is tried first, and the error names the referee and the URL.
    with FakeOpenAIServer() as url:
        dead = url  # closed below: nothing listens there any more
    with pytest.raises(FatalLMError, match=rf"referee 'scientist': cannot reach the LM server at {re.escape(dead)}"):
        evaluate_dataset(DataSpec("faireval", limit=1), DebateConfig(roles=PANEL),
                         LMSpec(referee_models={"scientist": dead}), out=tmp_path / "r.jsonl")
    assert started == [dead]


def _args(**given):
    import argparse

    from optim.cli import flags

    parser = argparse.ArgumentParser()
    flags.add_lm_flags(parser)
    args = parser.parse_args([])
    for key, value in given.items():
        setattr(args, key, value)
    return args


@pytest.mark.slow
def test_card_and_load_round_trip_the_assignment(two, tmp_path, recwarn):
    from optim.tuning.compile import OptimizerSettings, compile_and_save

    cfg = DebateConfig(roles=PANEL, turns=1, calibrate=False)
    lm = LMSpec(model=two["a_url"], referee_models={"scientist": two["b_url"]}, cache=False)
    done = compile_and_save(DataSpec("faireval", limit=5), cfg, lm, optimizer="labeled", out=tmp_path / "p",
                            settings=OptimizerSettings(max_demos=1))
    assert set(speakers(two["b"])) == {"scientist"} and "scientist" not in speakers(two["a"])
    card = json.loads((tmp_path / "p" / CARD_FILE).read_text())
    # Names only: a URL's LM is recorded as openai-compatible/<served id>, never the URL.
    assert card["model"] == "openai-compatible/alpha" and card["referee_models"] == {"scientist": "openai-compatible/beta"}
    assert two["b_url"] not in json.dumps(card) and two["a_url"] not in json.dumps(card)
    assert set(card["cost"]["by_model"]) == {"openai-compatible/alpha", "openai-compatible/beta"}
    assert "referee models: scientist `openai-compatible/beta`" in (tmp_path / "p" / CARD_MD).read_text()
    assert load_program(tmp_path / "p")[1]["referee_models"] == done.card["referee_models"]  # the strict loader reads it

    # The names cannot be reached: load() says which argument gives the endpoint.
    with pytest.raises(ConfigError, match="compiled for 'openai-compatible/alpha'.*pass model="):
        load(tmp_path / "p", lm=LMSpec(cache=False))
    # referee_models= rebinds the scientist to its endpoint; model= gives the main one.
    a_before, b_before = len(two["a"].requests), len(two["b"].requests)
    with load(tmp_path / "p", lm=LMSpec(model=two["a_url"], referee_models={"scientist": two["b_url"]}, cache=False)) as judge:
        verdict = judge(ITEM)
    assert speakers(two["b"])[b_before:] == ["scientist"] and speakers(two["a"])[a_before:] == ["critic"]
    assert set(verdict.usage_by_model) == {"openai-compatible/alpha", "openai-compatible/beta"}
    assert verdict.cost_usd is None
    assert not [w for w in recwarn if "now run" in str(w.message)]  # every referee runs on what it was compiled for
    # model= alone overrides the whole panel with one LM, and says so.
    b_before = len(two["b"].requests)
    with pytest.warns(UserWarning, match="scientist openai-compatible/beta -> openai-compatible/alpha"), \
            load(tmp_path / "p", lm=LMSpec(model=two["a_url"], cache=False)) as judge:
        judge(ITEM)
    assert len(two["b"].requests) == b_before
    # A referee the panel does not have cannot be rebound.
    with pytest.raises(ConfigError, match="not on the panel"):
        load(tmp_path / "p", lm=LMSpec(model=two["a_url"], referee_models={"psychologist": two["b_url"]}, cache=False))


def test_a_card_naming_litellm_models_rebinds_each_referee_from_the_names(tmp_path, monkeypatch):
    """``load(path)`` alone: each referee runs on its card name; OpenAI model strings reach OPENAI_BASE_URL."""
    server = FakeOpenAIServer(model="gpt-4o-mini")
    with server as url:
        monkeypatch.setenv("OPENAI_BASE_URL", url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-key")
        program = build_evaluator(DebateConfig(roles=PANEL, turns=1, calibrate=False))
        save_program(program, tmp_path / "p", make_card(program, model="openai/gpt-4o-mini",
                                                        referee_models={"scientist": "openai/gpt-4o"}))
        with load(tmp_path / "p", lm=LMSpec(cache=False)) as judge:
            verdict = judge(ITEM)
        # A referee whose card name is a base URL's LM needs its endpoint given again, and is told so.
        card = json.loads((tmp_path / "p" / CARD_FILE).read_text())
        (tmp_path / "p" / CARD_FILE).write_text(json.dumps({**card, "referee_models": {"scientist": "openai-compatible/x"}}))
        with pytest.raises(ConfigError, match=r"referee 'scientist' was compiled for 'openai-compatible/x'.*"
                                              r"pass referee_models=\{'scientist': URL\}"):
            load(tmp_path / "p", lm=LMSpec(cache=False))
        asked = [(r["body"]["model"], who) for r, who in zip(server.requests, speakers(server))]
    assert sorted(asked) == [("gpt-4o", "scientist"), ("gpt-4o-mini", "critic")]
    # Each model priced at its own cost-map price; the item's cost is their sum.
    used = verdict.usage_by_model
    assert set(used) == {"openai/gpt-4o-mini", "openai/gpt-4o"}
    assert all(u["cost_usd"] > 0 for u in used.values())
    assert verdict.cost_usd == pytest.approx(sum(u["cost_usd"] for u in used.values()))
    assert used["openai/gpt-4o"]["cost_usd"] > used["openai/gpt-4o-mini"]["cost_usd"]  # same size, dearer model


def test_card_refuses_referee_models_that_are_urls_or_off_the_panel(tmp_path):
    program = build_evaluator(DebateConfig(roles=PANEL, turns=1))
    save_program(program, tmp_path / "p", make_card(program, model="openai/gpt-4o-mini"))
    path = tmp_path / "p" / CARD_FILE
    card = json.loads(path.read_text())
    for bad, message in (({"scientist": "http://10.0.0.1:8000/v1"}, "referee_models.scientist' must be a model name"),
                         ({"psychologist": "openai/gpt-4o"}, "not a referee of the panel"),
                         ("openai/gpt-4o", "must map referees of the panel")):
        path.write_text(json.dumps({**card, "referee_models": bad}))
        with pytest.raises(ConfigError, match=message):
            load_program(tmp_path / "p")


@pytest.mark.slow
def test_a_search_binds_referee_models_in_every_trial_that_seats_them(two, tmp_path):
    from optim.search.run import run_search
    from optim.search.space import SearchSpace
    from optim.search.study_spec import StudySpec

    lm = LMSpec(model=two["a_url"], referee_models={"scientist": two["b_url"]}, cache=False)
    study = StudySpec("mixed", trials=2, storage=f"sqlite:///{tmp_path / 'o.db'}")
    space = SearchSpace(panels=("distinct",), n_roles=(5, 5), turns=(1, 1))  # every trial seats the scientist
    with pytest.raises(ConfigError, match="referee 'nobody' is given a model but is not on the panel"):
        run_search(DataSpec("faireval", limit=3), DebateConfig(calibrate=False),
                   LMSpec(model=two["a_url"], referee_models={"nobody": two["b_url"]}), study=study, space=space,
                   out=tmp_path / "best")
    assert two["a"].requests == [] and two["b"].requests == []
    done = run_search(DataSpec("faireval", limit=3), DebateConfig(calibrate=False), lm, study=study, space=space,
                      out=tmp_path / "best")
    assert done.saved and set(speakers(two["b"])) == {"scientist"} and "scientist" not in speakers(two["a"])
    assert done.card["referee_models"] == {"scientist": "openai-compatible/beta"}
