"""A saved evaluator from a stranger: loading it must not let it choose where data goes or what it costs.

A program directory may come from a registry, a colleague or a download. ``load_program`` and ``load``
accept from it only what an evaluator is (instructions, demos, the panel config, personas), each checked
against the signatures' fields and scales and against ``chateval_dspy.limits``; anything else is a
``ConfigError`` naming the file and the key, and the LM is always the caller's.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
import textwrap
import typing
from pathlib import Path

import dspy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chateval_dspy import limits
from chateval_dspy.config import DebateConfig
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.judge import load
from chateval_dspy.deploy.saved.store import CARD_FILE, PROGRAM_FILE, load_program, save_program
from chateval_dspy.errors import ChatEvalError, ConfigError
from chateval_dspy.lm.spec import LMSpec
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.roles import same_roles
from chateval_dspy.testing.fake_server import FakeOpenAIServer

ITEM = {"id": "a", "question": "Which?", "answer_1": "short", "answer_2": "a considerably longer answer"}
JUDGE = "debate.referees['critic'].judge"
ARGUE = "debate.referees['scientist'].argue"
DEMO = {"question": "dq", "answer_1": "x", "answer_2": "y", "persona": "p", "discussion": "d", "evidence": "e",
        "preference": "1", "score_1": 7, "score_2": 3}
FILE_LM = {"_dspy_lm_class": "dspy.clients.lm.LM", "model": "openai/gpt-4o-mini", "model_type": "chat", "cache": True,
           "num_retries": 3, "temperature": 1.7, "max_tokens": None, "api_base": None, "finetuning_model": None,
           "launch_kwargs": {}, "train_kwargs": {}}


def _save(directory: Path, fmt: str = "pairwise") -> Path:
    cfg = DebateConfig(format=fmt, roles=("critic", "scientist"), strategy="simultaneous_talk_with_summarizer", turns=2)
    program = build_evaluator(cfg)
    if fmt == "pairwise":
        program.debate.referees["critic"].judge.demos = [dspy.Example(**DEMO)]
    else:
        program.debate.referees["critic"].judge.demos = [dspy.Example(
            dialogue_history="h", fact="f", response="r", persona="p", discussion="d", evidence="e", naturalness=2,
            coherence=3, engagingness=1, groundedness=0)]
    program.debate.referees["scientist"].argue.signature = \
        program.debate.referees["scientist"].argue.signature.with_instructions("Argue with numbers.")
    return save_program(program, directory, make_card(program, model="openai-compatible/fake-served", dataset="toy"))


@pytest.fixture
def saved(tmp_path) -> Path:
    return _save(tmp_path / "prog")


def edit(directory: Path, name: str, change) -> Path:
    """Rewrite one JSON file of a saved evaluator with ``change(data)`` (which edits ``data`` in place)."""
    path = directory / name
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))
    return directory


def refused(directory: Path, *needles: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_program(directory)
    text = str(err.value)
    for needle in needles:
        assert needle in text, f"{needle!r} not in: {text}"
    return text


def assert_clean(program) -> None:
    """What every loaded program must be: no predictor LM or call settings, everything within the limits."""
    cfg = program.config
    assert 1 <= len(cfg.roles) <= limits.MAX_ROLES and 1 <= cfg.turns <= limits.MAX_TURNS
    assert 0 <= cfg.parse_retries <= limits.MAX_PARSE_RETRIES
    assert limits.MIN_TEXT_CHARS <= cfg.max_text_chars <= limits.MAX_TEXT_CHARS
    for role in program.roles:
        assert all(len(text) <= limits.MAX_PERSONA_CHARS for _, text in role.personas)
    for name, predictor in program.named_predictors():
        assert predictor.lm is None and predictor.config == {}, name
        assert not predictor.traces and not predictor.train, name
        assert len(predictor.signature.instructions) <= limits.MAX_INSTRUCTION_CHARS
        assert len(predictor.demos) <= limits.MAX_DEMOS_PER_PREDICTOR
        fields = predictor.signature.fields
        total = 0
        for demo in predictor.demos:
            for key, value in demo.items():
                if key == "augmented":
                    assert isinstance(value, bool)
                    continue
                annotation = fields[key].annotation
                if typing.get_origin(annotation) is typing.Literal:
                    assert any(type(value) is type(a) and value == a for a in typing.get_args(annotation)), (key, value)
                else:
                    assert isinstance(value, str) and len(value) <= limits.MAX_DEMO_TEXT_CHARS
                    total += len(value)
        assert total <= limits.MAX_DEMO_CHARS_PER_PREDICTOR


# ---------------------------------------------------------------- items 1 and 2: the LM is the caller's


def test_a_predictor_lm_in_program_json_is_refused_and_never_called(saved):
    mine_server, theirs_server = FakeOpenAIServer(), FakeOpenAIServer(model="theirs")
    with mine_server as mine, theirs_server as theirs:
        edit(saved, PROGRAM_FILE, lambda s: s[JUDGE].update(lm={**FILE_LM, "api_base": theirs}))
        with pytest.raises(ConfigError) as err:
            load(saved, lm=LMSpec(model=mine))
    text = str(err.value)
    assert PROGRAM_FILE in text and JUDGE in text and "'lm'" in text
    assert theirs_server.requests == [] and mine_server.requests == []


def test_a_clean_program_runs_on_the_callers_lm_only(saved):
    mine_server, theirs_server = FakeOpenAIServer(), FakeOpenAIServer(model="theirs")
    with mine_server as mine, theirs_server, load(saved, lm=LMSpec(model=mine)) as judge:
        assert judge(ITEM).winner == "2"
        assert_clean(judge.program)
        calls = judge.config.calls_per_item()
    assert len(mine_server.requests) == calls and theirs_server.requests == []
    assert all(r["body"].get("temperature") != 1.7 for r in mine_server.requests)


def test_per_predictor_config_is_refused_and_no_request_carries_it(saved):
    mine_server = FakeOpenAIServer()
    with mine_server as mine:
        edit(saved, PROGRAM_FILE, lambda s: s[ARGUE].update(config={"temperature": 1.7}))
        with pytest.raises(ConfigError) as err:
            load(saved, lm=LMSpec(model=mine))
    assert PROGRAM_FILE in str(err.value) and ARGUE in str(err.value) and "'config'" in str(err.value)
    assert mine_server.requests == []


@pytest.mark.parametrize(("key", "value"), [
    ("lm", FILE_LM),
    ("config", {"temperature": 1.7}),
    ("config", {}),
    ("traces", [{"inputs": {}, "outputs": {}}]),
    ("train", [{"question": "q"}]),
    ("fields", {"score_1": {"cuts": [1.5]}}),
    ("callbacks", []),
    ("forward", "anything"),
    ("max_tokens", 100000),
])
def test_predictor_keys_beyond_instructions_and_demos_are_refused(saved, key, value):
    edit(saved, PROGRAM_FILE, lambda s: s[JUDGE].update({key: value}))
    refused(saved, PROGRAM_FILE, JUDGE, repr(key))


def test_a_card_model_that_is_an_endpoint_is_refused_even_with_model_given(saved):
    servers = FakeOpenAIServer(), FakeOpenAIServer(model="theirs")
    with servers[0] as mine, servers[1] as theirs:
        edit(saved, CARD_FILE, lambda c: c.update(model=theirs))
        for kwargs in ({}, {"lm": LMSpec(model=mine)}):
            with pytest.raises(ConfigError, match="key 'model' must be a model name"):
                load(saved, **kwargs)
    assert all(s.requests == [] for s in servers)


@pytest.mark.parametrize("model", [
    "http://127.0.0.1:9/v1", "https://user:secret@example.com/v1", "openai/gpt-4o-mini?api_key=sk-123",
    "openai/gpt-4o-mini api_base=http://x", "openai/gpt\n4o", "x" * (limits.MAX_MODEL_NAME_CHARS + 1), 42,
    {"model": "openai/gpt-4o-mini", "api_base": "http://x"},
])
def test_card_model_is_a_name_only(saved, model):
    edit(saved, CARD_FILE, lambda c: c.update(model=model))
    refused(saved, CARD_FILE, "'model'")


@pytest.mark.parametrize("model", ["openai/gpt-4o-mini", "openai-compatible//models/gemma-3.gguf", "ollama/llama3:8b",
                                   "vertex_ai/claude-3-5-sonnet@20240620", "embedded/gemma-3-270m-q4_k_m"])
def test_card_model_names_still_load(saved, model):
    edit(saved, CARD_FILE, lambda c: c.update(model=model))
    assert load_program(saved)[1]["model"] == model


@pytest.mark.parametrize(("key", "value"), [
    ("lm", FILE_LM), ("temperature", 1.7), ("api_base", "http://127.0.0.1:9/v1"), ("lm_kwargs", {"max_tokens": 9}),
    ("endpoint", "http://x"), ("max_calls", 10**9),
])
def test_unknown_card_keys_are_refused(saved, key, value):
    edit(saved, CARD_FILE, lambda c: c.update({key: value}))
    refused(saved, CARD_FILE, repr(key), "unknown key")


# ---------------------------------------------------------------- item 3: every value range- and size-checked


def _set_demo(**changes):
    return lambda s: s[JUDGE]["demos"][0].update(changes)


@pytest.mark.parametrize(("change", "needles"), [
    (_set_demo(score_1=99), ["score_1", "one of 1, 2, 3"]),
    (_set_demo(score_1=True), ["score_1"]),
    (_set_demo(score_2=7.0), ["score_2"]),
    (_set_demo(score_1="7"), ["score_1"]),
    (_set_demo(preference="3"), ["preference", "'1', '2', 'tie'"]),
    (_set_demo(id="row-7"), ["'id'", "not a field of the signature"]),
    (_set_demo(question=["not", "text"]), ["question"]),
    (_set_demo(augmented="yes"), ["augmented"]),
    (_set_demo(evidence="e" * (limits.MAX_DEMO_TEXT_CHARS + 1)), ["evidence", "limits.MAX_DEMO_TEXT_CHARS"]),
    (lambda s: s[JUDGE].update(demos=[DEMO] * (limits.MAX_DEMOS_PER_PREDICTOR + 1)),
     ["'demos'", "limits.MAX_DEMOS_PER_PREDICTOR"]),
    (lambda s: s[JUDGE].update(demos=[{**DEMO, "discussion": "d" * (limits.MAX_DEMO_CHARS_PER_PREDICTOR // 2)}] * 2),
     ["limits.MAX_DEMO_CHARS_PER_PREDICTOR"]),
    (lambda s: s[JUDGE].update(demos="many"), ["'demos'"]),
    (lambda s: s[ARGUE]["signature"].update(instructions="i" * (limits.MAX_INSTRUCTION_CHARS + 1)),
     [ARGUE, "instructions", "limits.MAX_INSTRUCTION_CHARS"]),
    (lambda s: s[ARGUE]["signature"].update(instructions=None), ["instructions"]),
    (lambda s: s[ARGUE]["signature"]["fields"][0].update(description="d" * (limits.MAX_FIELD_TEXT_CHARS + 1)),
     ["limits.MAX_FIELD_TEXT_CHARS"]),
    (lambda s: s[ARGUE]["signature"]["fields"].pop(), ["'signature.fields'"]),
    (lambda s: s[ARGUE]["signature"].update(extra="x"), ["'signature'"]),
    (lambda s: s.pop(ARGUE), ["missing predictor", ARGUE]),
    (lambda s: s.update({"debate.referees['intruder'].judge": s[JUDGE]}), ["unknown key", "intruder"]),
    (lambda s: s.update(metadata=[1]), ["'metadata'"]),
])
def test_program_values_are_checked(saved, change, needles):
    edit(saved, PROGRAM_FILE, change)
    refused(saved, PROGRAM_FILE, "not a valid program state", *needles)


@pytest.mark.parametrize(("change", "needles"), [
    (lambda c: c["config"].update(turns=1_000_000), ["'config'", "limits.MAX_TURNS"]),
    (lambda c: c["config"].update(turns=limits.MAX_TURNS + 1), ["limits.MAX_TURNS"]),
    (lambda c: c["config"].update(turns=True), ["turns"]),
    (lambda c: c["config"].update(parse_retries=10**6), ["limits.MAX_PARSE_RETRIES"]),
    (lambda c: c["config"].update(max_text_chars=10**9), ["limits.MAX_TEXT_CHARS"]),
    (lambda c: c["config"].update(calibrate="yes"), ["calibrate"]),
    (lambda c: c["config"].update(roles="critic"), ["roles"]),
    (lambda c: c["config"].update(colour="red"), ["unknown config keys: colour"]),
    (lambda c: c.update(config=[1, 2]), ["'config'"]),
    (lambda c: c.update(config={**c["config"], "roles": list(same_roles(limits.MAX_ROLES + 1))},
                        roles=[{"slug": s, "name": s, "personas": {"*": "p"}} for s in same_roles(limits.MAX_ROLES + 1)]),
     ["limits.MAX_ROLES"]),
    (lambda c: c["roles"][0]["personas"].update({"*": "p" * (limits.MAX_PERSONA_CHARS + 1)}),
     ["limits.MAX_PERSONA_CHARS"]),
    (lambda c: c["roles"][0].update(name="n" * (limits.MAX_ROLE_NAME_CHARS + 1)), ["limits.MAX_ROLE_NAME_CHARS"]),
    (lambda c: c["roles"][0]["personas"].update(ranking="p"), ["persona for 'ranking'"]),
    (lambda c: c["roles"][0].update(lm=FILE_LM), ["slug, name and personas"]),
    (lambda c: c["roles"].reverse(), ["does not match the config's roles"]),
    (lambda c: c.update(card_format=True), ["card format True"]),
    (lambda c: c.update(versions=["1.0"]), ["'versions'"]),
])
def test_card_values_are_checked(saved, change, needles):
    edit(saved, CARD_FILE, change)
    refused(saved, CARD_FILE, *needles)


@pytest.mark.parametrize(("name", "text"), [
    (PROGRAM_FILE, '{"metadata": {"n": 1' + "0" * 5000 + "}}"),  # a number too long to convert
    (PROGRAM_FILE, "[" * 100_000 + "]" * 100_000),  # nesting deeper than the parser's recursion
    (CARD_FILE, '{"card_format": 1, "cost": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    (CARD_FILE, b"\xff\xfe{}"),
    (PROGRAM_FILE, '"just a string"'),
])
def test_unparseable_files_are_config_errors(saved, name, text):
    (saved / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    refused(saved, name)


def test_values_at_the_limits_still_load(saved):
    def at_limits(s):
        s[ARGUE]["signature"]["instructions"] = "i" * limits.MAX_INSTRUCTION_CHARS
        s[JUDGE]["demos"] = [{**DEMO, "augmented": True, "logprobs": {"content": []}}] * limits.MAX_DEMOS_PER_PREDICTOR

    edit(saved, PROGRAM_FILE, at_limits)
    edit(saved, CARD_FILE, lambda c: c["roles"][0]["personas"].update({"*": "p" * limits.MAX_PERSONA_CHARS}))
    program, _ = load_program(saved)
    assert_clean(program)
    judge = program.debate.referees["critic"].judge
    assert len(judge.demos) == limits.MAX_DEMOS_PER_PREDICTOR
    assert "logprobs" not in judge.demos[0] and judge.demos[0]["augmented"] is True  # never reaches a prompt


def load_in_a_small_process(directory: Path) -> str:
    """``load_program(directory)`` in a child that cannot allocate more than 512 MiB past its imports.

    What it prints: ``ConfigError: <message>``, or the name of any other exception (a MemoryError is what
    reading a huge or endless file whole would end in).
    """
    script = textwrap.dedent(f"""
        import resource
        from chateval_dspy.lm.offline import ensure_offline
        ensure_offline()
        from chateval_dspy.deploy.saved.store import load_program
        from chateval_dspy.errors import ConfigError
        size = int(open("/proc/self/status").read().split("VmSize:")[1].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size + 512 * 1024**2, resource.RLIM_INFINITY))
        try:
            load_program({str(directory)!r})
            print("loaded")
        except ConfigError as exc:
            print("ConfigError:", exc)
        except BaseException as exc:
            print("other:", type(exc).__name__)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize(("name", "limit"), [(PROGRAM_FILE, "limits.MAX_PROGRAM_FILE_BYTES"),
                                             (CARD_FILE, "limits.MAX_CARD_FILE_BYTES")])
def test_a_huge_file_is_refused_before_it_is_read(saved, name, limit):
    with open(saved / name, "r+b") as f:
        f.truncate(64 * 1024**3)  # 64 GiB, sparse: nothing is written
    out = load_in_a_small_process(saved)
    assert out.startswith("ConfigError:") and name in out and limit in out, out


def test_a_file_that_never_ends_is_refused(saved):
    (saved / CARD_FILE).unlink()
    (saved / CARD_FILE).symlink_to("/dev/zero")
    out = load_in_a_small_process(saved)
    assert out.startswith("ConfigError:") and "not a regular file" in out, out


def test_nothing_is_saved_that_load_would_refuse(tmp_path):
    program = build_evaluator(DebateConfig(roles=("critic",), turns=1))
    program.debate.referees["critic"].judge.demos = [dspy.Example(**DEMO)] * (limits.MAX_DEMOS_PER_PREDICTOR + 1)
    with pytest.raises(ConfigError, match="MAX_DEMOS_PER_PREDICTOR"):
        save_program(program, tmp_path / "p", make_card(program, model="fake/x"))
    assert not (tmp_path / "p").exists()
    with pytest.raises(ConfigError, match="unknown judge card field"):
        make_card(program, model="fake/x", temperature=1.7)
    with pytest.raises(ConfigError, match="model name"):
        make_card(program, model="http://127.0.0.1:9/v1")


# ---------------------------------------------------------------- fuzz: mutations of both files


KEYS = ["lm", "config", "traces", "train", "fields", "callbacks", "demos", "signature", "instructions", "augmented",
        "logprobs", "temperature", "api_base", "model", "turns", "roles", "personas", "metadata", "id", "score_1"]
LIMITS = [limits.MAX_INSTRUCTION_CHARS, limits.MAX_PERSONA_CHARS, limits.MAX_FIELD_TEXT_CHARS,
          limits.MAX_ROLE_NAME_CHARS, limits.MAX_MODEL_NAME_CHARS, limits.MAX_DEMO_TEXT_CHARS, limits.MAX_PATH_CHARS]
long_text = st.builds(lambda n, d, c: c * max(0, n + d), st.sampled_from(LIMITS), st.integers(-2048, 2048),
                      st.sampled_from(["x", "é", " ", "[[ ## score_1 ## ]]"]))
scalars = (st.none() | st.booleans() | st.integers(-10, 20) | st.integers(-(10**30), 10**30)
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12) | long_text
           | st.sampled_from(["1", "2", "tie", "critic", "pairwise", "http://127.0.0.1:9/v1", "openai/gpt-4o-mini"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=4), max_leaves=8)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _mutate(data, path, how, key, value):
    """Apply one mutation at ``path`` if it still exists: replace the value, delete it, or add a key/element."""
    parent, node = None, data
    for step in path:
        if not isinstance(node, (dict, list)) or (isinstance(node, dict) and step not in node) or (
                isinstance(node, list) and not (isinstance(step, int) and step < len(node))):
            return data
        parent, node = node, node[step]
    if how == "replace":
        if parent is None:
            return value
        parent[path[-1]] = value
    elif how == "delete" and parent is not None:
        del parent[path[-1]]
    elif how == "add" and isinstance(node, dict):
        node[key] = value
    elif how == "add" and isinstance(node, list):
        node.append(value)
    return data


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    out = {}
    for fmt in ("pairwise", "pointwise"):
        directory = _save(tmp_path_factory.mktemp(fmt) / "prog", fmt)
        out[fmt] = {name: json.loads((directory / name).read_text()) for name in (PROGRAM_FILE, CARD_FILE)}
    return out


mutation = st.tuples(st.sampled_from([PROGRAM_FILE, CARD_FILE]), st.randoms(use_true_random=False),
                     st.sampled_from(["replace", "replace", "delete", "add"]), st.sampled_from(KEYS) | st.text(max_size=6),
                     values)


@settings(max_examples=150, deadline=None, database=None,  # no example files left in the working tree
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(fmt=st.sampled_from(["pairwise", "pointwise"]), mutations=st.lists(mutation, min_size=1, max_size=3))
def test_fuzz_load_program_returns_a_clean_program_or_a_chateval_error(bases, fmt, mutations):
    files = copy.deepcopy(bases[fmt])
    for name, rnd, how, key, value in mutations:
        path = rnd.choice(list(_paths(files[name])))
        files[name] = _mutate(files[name], path, how, key, value)
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            Path(tmp, name).write_text(json.dumps(data))
        try:
            program, card = load_program(tmp)
        except ChatEvalError:
            return
        assert_clean(program)
        assert isinstance(card, dict)
