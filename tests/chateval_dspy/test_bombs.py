"""Finding 1: a ~500-byte YAML alias bomb (or a deeply nested JSON file) under a task's ``name:``, ``format:``, a
criterion's ``scale:``, a role's ``slug:``, a label file or a card took the process to gigabytes and a raw
``MemoryError``. Every one is now refused while parsing, naming the file, in under 2 s and within 200 MB.

The bombs run in one child process whose address space is capped at its size after the imports plus 200 MB, so
that a bomb that gets through fails the test with a ``MemoryError`` instead of taking the machine down.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from repo_paths import ROOT

from chateval_dspy import limits
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.roles import load_role_file, role_library
from chateval_dspy.program.task import TaskSpec, load_task

CAP_MB = 200
SECONDS = 2.0

# Runs each case in argv[1] (a JSON list of [case, entry point, path]) under the memory cap; prints one JSON line.
CHILD = r"""
import json, resource, sys, time
import yaml
from chateval_dspy.deploy.saved.store import read_card
from chateval_dspy.errors import ChatEvalError
from chateval_dspy.program.roles import load_role_file
from chateval_dspy.program.task import load_task
from optim.tuning.labels import read_labels

ENTRY = {
    "task": load_task,
    "role": load_role_file,
    "card": read_card,
    "labels": lambda path: read_labels([path], "pairwise"),
    "labels_task": lambda path: read_labels([sys.argv[2]], path),
    "unbounded": lambda path: repr(yaml.safe_load(open(path).read())),  # the bug itself, as the control
}

def address_space():
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024

cap = address_space() + CAP_MB * 2**20
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
results = {}
for case, entry, path in json.loads(sys.argv[1]):
    start = time.perf_counter()
    try:
        ENTRY[entry](path)
        got = {"error": None}
    except ChatEvalError as exc:
        got = {"error": type(exc).__name__, "message": str(exc)[:1000]}
    except BaseException as exc:  # MemoryError, RecursionError: what the finding saw
        got = {"error": "raw " + type(exc).__name__}
    got["seconds"] = time.perf_counter() - start
    results[case] = got
print(json.dumps(results))
""".replace("CAP_MB", str(CAP_MB))


def laughs(levels: int = 9) -> str:
    """The "billion laughs" in YAML flow style: 9**9 strings from ~400 bytes, anchors defined inside the value."""
    parts = ["&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    parts += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return f"[{', '.join(parts)}]"


PAIRWISE = ("inputs: [{name: question}, {name: answer_1, judged: true}, {name: answer_2, judged: true}]\n"
            "responses: [answer_1, answer_2]\n")


def bomb_files(d: Path) -> dict[str, tuple[str, Path]]:
    """case -> (entry point, file), every file a few hundred bytes except where size is the point."""
    b = laughs()
    criterion = "criteria: [{name: quality, description: how good it is, scale: %s}]\n"
    files = {
        "task_name": ("task", "t_name.yaml", f"name: {b}\nformat: pairwise\n{PAIRWISE}{criterion % '1-5'}"),
        "task_format": ("task", "t_format.yaml", f"name: t\nformat: {b}\n{PAIRWISE}{criterion % '1-5'}"),
        "task_scale": ("task", "t_scale.yaml", f"name: t\nformat: pairwise\n{PAIRWISE}{criterion % b}"),
        "role_slug": ("role", "r_slug.yaml", f"roles:\n  - slug: {b}\n    name: Bomb\n    persona: You judge.\n"),
        "task_mapping_alias": ("task", "t_map.yaml", "a: &m {k: v}\nname: t\nformat: *m\n"),
        # an aliased scalar counts at every use: 200 KB x 30 is 6 MB of text from a 200 KB file
        "task_scalar_aliases": ("task", "t_chars.yaml", f"name: [&s {'x' * 200_000}{', *s' * 30}]\n"),
        "task_deep_yaml": ("task", "t_deep.yaml", "name: " + "[" * 1000 + "]" * 1000 + "\n"),
        "role_many_values": ("role", "r_nodes.yaml", "roles: [" + "0," * (limits.MAX_DOC_NODES + 10) + "]\n"),
        "task_deep_json": ("task", "t_deep.json", "[" * 100_000 + "]" * 100_000),
        "task_nested_json": ("task", "t_nested.json", '{"name": ' + "[" * 100 + "]" * 100 + "}"),
        "card_deep_json": ("card", "card/card.json", "[" * 500_000),
        "labels_deep_jsonl": ("labels", "l_deep.jsonl", '{"id": "x", "winner": ' + "[" * 200_000 + "]" * 200_000 + "}\n"),
        "labels_task_bomb": ("labels_task", "t_labels.yaml", f"name: t\nformat: {b}\n{PAIRWISE}{criterion % '1-5'}"),
        "control": ("unbounded", "control.yaml", f"name: {b}\n"),
    }
    out = {}
    for case, (entry, name, text) in files.items():
        path = d / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        out[case] = (entry, path.parent if entry == "card" else path)
    return out


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    d = tmp_path_factory.mktemp("bombs")
    files = bomb_files(d)
    labels = d / "labels.jsonl"
    labels.write_text('{"id": "x", "winner": "1"}\n', encoding="utf-8")
    cases = json.dumps([[case, entry, str(path)] for case, (entry, path) in files.items()])
    proc = subprocess.run([sys.executable, "-c", CHILD, cases, str(labels)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return files, json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_control_bomb_is_real(refused):
    # Loaded without bounds and rendered once, the same file exhausts the cap: the cap is what the bombs meet.
    _, results = refused
    assert results["control"]["error"] == "raw MemoryError"


@pytest.mark.parametrize("case", ["task_name", "task_format", "task_scale", "role_slug", "task_mapping_alias",
                                  "labels_task_bomb"])
def test_an_alias_bomb_is_refused_while_parsing_naming_the_file_and_line(refused, case):
    files, results = refused
    got = results[case]
    assert got["error"] == "ConfigError", got
    assert str(files[case][1]) in got["message"] and "line" in got["message"]
    assert "alias of a list or mapping" in got["message"]
    assert got["seconds"] < SECONDS


@pytest.mark.parametrize("case, expected, error", [
    ("task_scalar_aliases", "characters once aliases are expanded", "ConfigError"),
    ("task_deep_yaml", "levels deep", "ConfigError"),
    ("role_many_values", "values (limits.MAX_DOC_NODES)", "ConfigError"),
    ("task_deep_json", "nested too deeply", "ConfigError"),
    ("task_nested_json", "levels deep", "ConfigError"),
    ("card_deep_json", "not valid JSON", "ConfigError"),
    ("labels_deep_jsonl", "nested too deeply", "DataError"),
])
def test_an_oversized_or_overdeep_document_is_refused_naming_the_file(refused, case, expected, error):
    files, results = refused
    got = results[case]
    assert got["error"] == error, got
    assert str(files[case][1]) in got["message"] and expected in got["message"]
    # a 40 KB file runs through the pure-Python scanner before its 20,001st value is refused
    assert got["seconds"] < (10 * SECONDS if case == "role_many_values" else SECONDS)


def legitimate_yaml() -> list[Path]:
    program = ROOT / "chateval_dspy" / "program"
    return sorted([*(ROOT / "data" / "examples").glob("*.yaml"), *(program / "tasks").glob("*.yaml"),
                   program / "roles" / "default.yaml"])


@pytest.mark.parametrize("path", legitimate_yaml(), ids=lambda p: p.name)
def test_legitimate_files_load_exactly_as_before(path, tmp_path):
    text = path.read_text(encoding="utf-8")
    before = yaml.safe_load(text)
    assert limits.parse_yaml(text, str(path)) == before
    as_json = tmp_path / f"{path.stem}.json"
    as_json.write_text(json.dumps(before), encoding="utf-8")
    assert limits.parse_json(as_json.read_text(encoding="utf-8"), str(as_json)) == before
    if "roles" in before:
        assert load_role_file(path) == load_role_file(as_json)
        assert set(role_library()) >= set(load_role_file(path))
    elif "model_list" not in before and "stages" not in before:  # gateway.yaml (LiteLLM's config) and cascade.yaml
        # (optim.tuning.cascade's declaration) are no tasks: only parsed above
        assert load_task(path) == load_task(as_json) == TaskSpec.from_dict(before, str(path))


def test_aliases_of_scalars_still_load():
    assert limits.parse_yaml("a: &x one\nb: [*x, *x]\n", "t.yaml") == {"a": "one", "b": ["one", "one"]}


def test_a_recursive_or_undefined_alias_is_a_config_error():
    with pytest.raises(ConfigError, match=r"t.yaml line 1.*alias of a list"):
        limits.parse_yaml("a: &x [*x]\n", "t.yaml")
    with pytest.raises(ConfigError, match=r"t.yaml is not valid YAML \(line 1.*undefined alias"):
        limits.parse_yaml("a: *nowhere\n", "t.yaml")


@pytest.mark.parametrize("text, parse, source", [
    ("label_map:\n  0: tie\n  1: 1\n  0: 1\n", "yaml", "task.yaml"),
    ('{"referees": {"a": 1}, "referees": {"b": 2}}', "json", "program.json"),
])
def test_a_key_given_twice_in_an_untrusted_file_is_refused_not_last_wins(text, parse, source):
    from chateval_dspy.limits import parse_json, parse_yaml

    with pytest.raises(ConfigError, match="given twice") as err:
        (parse_yaml if parse == "yaml" else parse_json)(text, source)
    assert source in str(err.value)
