"""Referee personas: the built-in five, role files, the same-role ablation, and per-role predictors."""

from __future__ import annotations

import json

import pytest

from chateval_dspy import limits
from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.program.debater import Debater
from chateval_dspy.program.roles import (
    DEFAULT_ORDER,
    SAME_ROLE_PERSONA,
    first_roles,
    load_role_file,
    persona_keys,
    resolve_roles,
    role_library,
    same_roles,
)
from chateval_dspy.testing.fake_lm import fake_lm

PAIRWISE_ITEM = {"question": "Which is better?", "answer_1": "first answer", "answer_2": "second answer"}

BUILT_IN = ("general_public", "critic", "news_author", "psychologist", "scientist")

ROLE_YAML = """
roles:
  - slug: lawyer
    name: Lawyer
    persona: You are a   lawyer who
      reads every word.
  - slug: critic
    name: Harsh Critic
    persona:
      pairwise: You hate everything.
"""


def test_five_built_in_personas():
    library = role_library()
    assert tuple(library) == BUILT_IN == DEFAULT_ORDER
    for fmt in ("pairwise", "pointwise"):
        personas = [library[s].persona(fmt) for s in BUILT_IN]
        assert len(set(personas)) == 5 and all(len(p) > 40 for p in personas)
    for slug in BUILT_IN:  # each role has its own text per format
        assert library[slug].persona("pairwise") != library[slug].persona("pointwise")
    assert [library[s].name for s in BUILT_IN] == ["General Public", "Critic", "News Author", "Psychologist",
                                                    "Scientist"]


def test_first_roles():
    assert first_roles(2) == ("general_public", "critic")
    assert first_roles(5) == BUILT_IN
    for bad in (0, 6, 9):
        with pytest.raises(ConfigError, match="--roles takes 1 to 5"):
            first_roles(bad)


def test_yaml_role_file_adds_and_overrides(tmp_path):
    path = tmp_path / "roles.yaml"
    path.write_text(ROLE_YAML, encoding="utf-8")
    library = role_library(path)
    assert library["lawyer"].persona("pairwise") == "You are a lawyer who reads every word."  # whitespace normalised
    assert library["lawyer"].persona("pointwise") == library["lawyer"].persona("pairwise")  # "*" serves every format
    assert library["critic"].name == "Harsh Critic"
    assert library["critic"].persona("pairwise") == "You hate everything."
    assert library["scientist"] == role_library()["scientist"]  # the rest untouched
    with pytest.raises(ConfigError, match="no persona for the 'pointwise' format"):
        library["critic"].persona("pointwise")


def test_json_role_file(tmp_path):
    path = tmp_path / "roles.json"
    path.write_text(json.dumps({"roles": [{"slug": "editor", "name": "Editor",
                                           "persona": {"pairwise": "P text", "pointwise": "S text"}}]}),
                    encoding="utf-8")
    (role,) = resolve_roles(["editor"], "pointwise", path)
    assert role.persona("pointwise") == "S text" and role.persona("pairwise") == "P text"
    assert load_role_file(path)["editor"].name == "Editor"


def test_custom_role_reaches_the_lm(tmp_path, run):
    path = tmp_path / "roles.yaml"
    path.write_text(ROLE_YAML, encoding="utf-8")
    lm = fake_lm()
    run(build_evaluator(DebateConfig(roles=("lawyer",), turns=1, calibrate=False, role_file=str(path))), lm,
        **PAIRWISE_ITEM)
    assert lm.engine.calls[0].inputs["persona"] == "You are a lawyer who reads every word."


def test_custom_role_without_persona_for_the_format_fails_before_any_call(tmp_path):
    path = tmp_path / "roles.yaml"
    path.write_text(ROLE_YAML, encoding="utf-8")
    with pytest.raises(ConfigError, match="'critic' has no persona for the 'pointwise' format"):
        build_evaluator(DebateConfig(format="pointwise", roles=("critic",), role_file=str(path)))


@pytest.mark.parametrize(("entry", "message"), [
    ({"slug": "Bad-Slug", "name": "X", "persona": "p"}, "'slug' must match"),
    ({"slug": "1abc", "name": "X", "persona": "p"}, "'slug' must match"),
    ({"name": "X", "persona": "p"}, "'slug' must match"),
    ({"slug": "referee_2", "name": "X", "persona": "p"}, "reserved for the same-role ablation"),
    ({"slug": "ok", "persona": "p"}, "'name' is missing"),
    ({"slug": "ok", "name": "X"}, "'persona' must be a text or a mapping"),
    ({"slug": "ok", "name": "X", "persona": "  "}, "non-empty text"),
    ({"slug": "ok", "name": "X", "persona": {"ranking": "p"}}, "persona for 'ranking'"),
    ("just text", "expected a mapping with slug"),
])
def test_bad_role_entries(tmp_path, entry, message):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"roles": [{"slug": "fine", "name": "Fine", "persona": "p"}, entry]}), encoding="utf-8")
    with pytest.raises(ConfigError, match=message) as err:
        load_role_file(path)
    assert "bad.json role #2" in str(err.value)


@pytest.mark.parametrize(("name", "text", "needle"), [
    ("dup.yaml", "roles:\n  - {slug: a, name: A, persona: p}\n  - {slug: a, name: B, persona: q}\n", "duplicate slug 'a'"),
    ("broken.yaml", "roles: [unclosed", "not valid YAML"),
    ("x.json", "{", "not valid JSON"),
    ("shape.yaml", "- slug: a\n", "expected a mapping with a 'roles' list"),
    ("missing.yaml", None, "cannot read role file"),
])
def test_bad_role_files(tmp_path, name, text, needle):
    path = tmp_path / name
    if text is not None:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=needle):
        load_role_file(path)


def test_unknown_role_lists_known_slugs(tmp_path):
    with pytest.raises(ConfigError) as err:
        resolve_roles(["critic", "astronaut"], "pairwise")
    text = str(err.value)
    assert "unknown role 'astronaut'" in text
    assert all(slug in text for slug in BUILT_IN)
    assert "referee_1..referee_N" in text
    path = tmp_path / "roles.yaml"
    path.write_text(ROLE_YAML, encoding="utf-8")
    with pytest.raises(ConfigError, match="lawyer"):
        resolve_roles(["astronaut"], "pairwise", path)
    with pytest.raises(ConfigError, match="unknown role"):
        build_evaluator(DebateConfig(roles=("astronaut",)))


def test_same_roles_identical_personas_distinct_predictors(run):
    assert same_roles(3) == ("referee_1", "referee_2", "referee_3")
    program = build_evaluator(DebateConfig(roles=same_roles(3), turns=2, calibrate=False))
    referees = program.debate.referees
    assert {d.persona for d in referees.values()} == {SAME_ROLE_PERSONA}
    assert [d.name for d in referees.values()] == ["Referee 1", "Referee 2", "Referee 3"]
    predictors = [p for d in referees.values() for p in (d.argue, d.judge)]
    assert len({id(p) for p in predictors}) == 6
    lm = fake_lm()
    run(program, lm, **PAIRWISE_ITEM)
    assert {c.inputs["persona"] for c in lm.engine.calls} == {SAME_ROLE_PERSONA}
    assert len(lm.engine.calls) == 6


def test_named_predictors_one_pair_per_role():
    program = build_evaluator(DebateConfig(roles=("general_public", "critic", "scientist"), turns=2))
    names = [name for name, _ in program.named_predictors()]
    assert names == [f"debate.referees['{s}'].{p}" for s in ("general_public", "critic", "scientist")
                     for p in ("argue", "judge")]
    assert "debate.referees['critic'].argue" in names and "debate.referees['critic'].judge" in names
    predictors = [p for _, p in program.named_predictors()]
    assert len({id(p) for p in predictors}) == len(predictors)
    # Tuning one role's instructions leaves the others' alone.
    critic = program.debate.referees["critic"]
    critic.judge.signature = critic.judge.signature.with_instructions("Be harsh.")
    others = [p for n, p in program.named_predictors() if n.endswith(".judge") and "critic" not in n]
    assert all(p.signature.instructions != "Be harsh." for p in others)


def test_summarizer_is_a_predictor_only_under_its_strategy():
    program = build_evaluator(DebateConfig(roles=("critic",), strategy="simultaneous_talk_with_summarizer"))
    assert "debate.summarizer" in [n for n, _ in program.named_predictors()]
    program = build_evaluator(DebateConfig(roles=("critic",), strategy="simultaneous_talk"))
    assert all("summarizer" not in n for n, _ in program.named_predictors())


def test_debater_uses_the_format_persona():
    (role,) = resolve_roles(["critic"], "pointwise")
    debater = Debater(role, "pointwise")
    assert debater.persona == role.persona("pointwise") and debater.slug == "critic" and debater.name == "Critic"
    assert [n for n, _ in debater.named_predictors()] == ["argue", "judge"]


def _role_file(tmp_path, roles) -> str:
    path = tmp_path / "roles.json"
    path.write_text(json.dumps({"roles": roles}), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(("roles", "limit"), [
    ([{"slug": f"r{i}", "name": "R", "persona": "p"} for i in range(limits.MAX_ROLE_FILE_ROLES + 1)],
     "limits.MAX_ROLE_FILE_ROLES"),
    ([{"slug": "long", "name": "Long", "persona": "p" * (limits.MAX_PERSONA_CHARS + 1)}], "limits.MAX_PERSONA_CHARS"),
    ([{"slug": "long", "name": "Long", "persona": {"pointwise": "p " * limits.MAX_PERSONA_CHARS}}],
     "limits.MAX_PERSONA_CHARS"),
    ([{"slug": "long", "name": "N" * (limits.MAX_ROLE_NAME_CHARS + 1), "persona": "p"}], "limits.MAX_ROLE_NAME_CHARS"),
])
def test_role_files_are_bounded(tmp_path, roles, limit):
    with pytest.raises(ConfigError, match=limit.replace(".", r"\.")):
        load_role_file(_role_file(tmp_path, roles))


def test_a_role_file_over_its_size_is_refused_before_parsing(tmp_path):
    path = tmp_path / "roles.yaml"
    path.write_text("roles: []\n#" + "x" * limits.MAX_ROLE_FILE_BYTES, encoding="utf-8")
    with pytest.raises(ConfigError, match=r"limits\.MAX_ROLE_FILE_BYTES"):
        load_role_file(path)


def test_a_role_file_nested_past_the_parser_is_a_config_error(tmp_path):
    path = tmp_path / "roles.json"
    path.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_role_file(path)


def test_a_role_file_at_the_limits_loads(tmp_path):
    roles = [{"slug": f"r{i}", "name": "N" * limits.MAX_ROLE_NAME_CHARS, "persona": "p" * limits.MAX_PERSONA_CHARS}
             for i in range(limits.MAX_ROLE_FILE_ROLES)]
    library = load_role_file(_role_file(tmp_path, roles))
    assert len(library) == limits.MAX_ROLE_FILE_ROLES
    assert len(library["r0"].persona("pairwise")) == limits.MAX_PERSONA_CHARS


def test_a_builtin_task_reads_its_formats_personas_and_any_other_task_only_the_general_one():
    from chateval_dspy.program.task import TaskSpec, builtin_task

    faireval, topical_chat = builtin_task("pairwise"), builtin_task("pointwise")
    assert persona_keys(faireval) == ("pairwise", "*")
    assert persona_keys(topical_chat) == (topical_chat.format, "*")
    assert persona_keys(TaskSpec.from_dict({**faireval.to_dict(), "name": "own"})) == ("*",)
