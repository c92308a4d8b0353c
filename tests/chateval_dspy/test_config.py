"""DebateConfig: validation with helpful messages, and a lossless dict round trip."""

from __future__ import annotations

import json

import pytest

from chateval_dspy import limits
from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import ChatEvalError, ConfigError
from chateval_dspy.program.roles import same_roles
from chateval_dspy.program.strategies import STRATEGIES


def test_defaults_are_the_papers():
    cfg = DebateConfig()
    assert (cfg.format, cfg.roles, cfg.strategy, cfg.turns, cfg.calibrate, cfg.aggregate) == (
        "pairwise", ("general_public", "critic"), "one_by_one", 2, True, "mean")
    assert cfg.orders == 2


def test_unknown_strategy_lists_the_choices():
    with pytest.raises(ConfigError) as err:
        DebateConfig(strategy="round_robin")
    text = str(err.value)
    assert "unknown strategy 'round_robin'" in text
    assert all(name in text for name in STRATEGIES)


@pytest.mark.parametrize("turns", [0, -1, 1.5, "2"])
def test_turns_must_be_a_positive_integer(turns):
    with pytest.raises(ConfigError, match="turns must be a positive integer"):
        DebateConfig(turns=turns)


def test_roles_must_be_given_and_distinct():
    with pytest.raises(ConfigError, match="at least one role"):
        DebateConfig(roles=())
    with pytest.raises(ConfigError, match="roles must be distinct") as err:
        DebateConfig(roles=("critic", "scientist", "critic"))
    assert "critic" in str(err.value)


@pytest.mark.parametrize(("changes", "message"), [
    ({"format": "ranking"}, "unknown format 'ranking'; choose one of: pairwise, pointwise"),
    ({"aggregate": "median"}, "unknown aggregate 'median'; choose one of: mean, majority"),
    ({"parse_retries": -1}, "parse_retries must be >= 0"),
    ({"max_text_chars": 100}, "max_text_chars must be at least 200"),
])
def test_other_validation(changes, message):
    with pytest.raises(ConfigError, match=message):
        DebateConfig(**changes)


def test_config_errors_are_value_errors_and_chateval_errors():
    with pytest.raises(ValueError):
        DebateConfig(turns=0)
    assert issubclass(ConfigError, ChatEvalError)


def test_roles_become_a_tuple_and_config_is_frozen():
    cfg = DebateConfig(roles=["critic", "scientist"])
    assert cfg.roles == ("critic", "scientist")
    with pytest.raises(AttributeError):
        cfg.turns = 3  # type: ignore[misc]
    assert hash(cfg) == hash(DebateConfig(roles=("critic", "scientist")))


@pytest.mark.parametrize("cfg", [
    DebateConfig(),
    DebateConfig(format="pointwise", roles=("scientist",), strategy="simultaneous_talk_with_summarizer", turns=3,
                 calibrate=False, aggregate="majority", parse_retries=0, max_text_chars=500, role_file="r.yaml"),
])
def test_dict_round_trip(cfg):
    data = cfg.to_dict()
    assert isinstance(data["roles"], list)
    assert json.loads(json.dumps(data)) == data  # plain JSON values
    assert DebateConfig.from_dict(data) == cfg
    assert DebateConfig.from_dict(json.loads(json.dumps(data))) == cfg
    assert set(data) == {"format", "roles", "strategy", "turns", "calibrate", "aggregate", "parse_retries",
                         "max_text_chars", "consensus_stop", "weighted_scores", "role_file"}


def test_from_dict_rejects_unknown_keys_and_validates():
    with pytest.raises(ConfigError, match="unknown config keys: colour, size"):
        DebateConfig.from_dict({"turns": 2, "size": 1, "colour": "red"})
    with pytest.raises(ConfigError, match="turns"):
        DebateConfig.from_dict({"turns": 0})
    assert DebateConfig.from_dict({}) == DebateConfig()


def test_replace_validates():
    cfg = DebateConfig()
    assert cfg.replace(turns=3).turns == 3 and cfg.turns == 2
    with pytest.raises(ConfigError):
        cfg.replace(strategy="nope")


@pytest.mark.parametrize(("kwargs", "orders", "calls"), [
    ({}, 2, 8),
    ({"calibrate": False}, 1, 4),
    ({"format": "pointwise"}, 1, 4),  # calibration does not apply to scoring
    ({"roles": ("critic",), "turns": 1}, 2, 2),
    ({"strategy": "simultaneous_talk_with_summarizer", "turns": 3}, 2, 2 * (2 * 3 + 2)),
    ({"strategy": "simultaneous_talk", "turns": 3}, 2, 12),
])
def test_orders_and_calls_per_item(kwargs, orders, calls):
    cfg = DebateConfig(**kwargs)
    assert cfg.orders == orders and cfg.calls_per_item() == calls


def test_changes_are_the_fields_off_their_defaults():
    assert DebateConfig(format="pointwise").changes() == {"format": "pointwise"}
    cfg = DebateConfig(turns=3, consensus_stop=True)
    assert cfg.changes() == {"format": "pairwise", "turns": 3, "consensus_stop": True}


@pytest.mark.parametrize(("changes", "limit"), [
    ({"turns": limits.MAX_TURNS + 1}, "limits.MAX_TURNS"),
    ({"turns": 1_000_000}, "limits.MAX_TURNS"),
    ({"roles": same_roles(limits.MAX_ROLES + 1)}, "limits.MAX_ROLES"),
    ({"parse_retries": limits.MAX_PARSE_RETRIES + 1}, "limits.MAX_PARSE_RETRIES"),
    ({"max_text_chars": limits.MAX_TEXT_CHARS + 1}, "limits.MAX_TEXT_CHARS"),
    ({"role_file": "r" * (limits.MAX_PATH_CHARS + 1)}, "limits.MAX_PATH_CHARS"),
])
def test_no_config_asks_for_unbounded_work(changes, limit):
    with pytest.raises(ConfigError, match=limit.replace(".", r"\.")):
        DebateConfig(**changes)
    with pytest.raises(ConfigError, match=limit.replace(".", r"\.")):
        DebateConfig.from_dict({**DebateConfig().to_dict(), **changes, "roles": list(changes.get("roles", ["critic"]))})


def test_a_config_at_every_limit_is_valid():
    cfg = DebateConfig(roles=same_roles(limits.MAX_ROLES), turns=limits.MAX_TURNS,
                       parse_retries=limits.MAX_PARSE_RETRIES, max_text_chars=limits.MAX_TEXT_CHARS)
    assert cfg.calls_per_item() == 2 * limits.MAX_ROLES * limits.MAX_TURNS


@pytest.mark.parametrize("changes", [
    {"turns": True}, {"parse_retries": 1.0}, {"parse_retries": False}, {"max_text_chars": "6000"},
    {"max_text_chars": 6000.0}, {"calibrate": "yes"}, {"consensus_stop": 1}, {"weighted_scores": None},
    {"roles": ("critic", ["x"])}, {"roles": 3}, {"strategy": ["one_by_one"]}, {"aggregate": {"mean": 1}},
    {"role_file": 3},
])
def test_config_values_from_a_file_have_their_types(changes):
    with pytest.raises(ConfigError):
        DebateConfig(**changes)
    with pytest.raises(ConfigError):
        DebateConfig.from_dict(changes)


def test_from_dict_wants_a_mapping():
    with pytest.raises(ConfigError, match="mapping"):
        DebateConfig.from_dict(["turns", 2])
