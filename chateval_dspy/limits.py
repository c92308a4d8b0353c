"""Upper bounds on everything a configuration, a role file or a saved evaluator can ask for, in one place.

A panel's shape comes from flags, Optuna trials, judge cards and role files, and a saved evaluator
may come from a registry, a colleague or a download: whatever reaches ``DebateConfig``, the role
loader or ``store.load_program`` is checked against these numbers, so that no file or flag can ask
for unbounded LM calls, prompt text or memory. Anything that searches or builds configurations
(the Optuna search space, the CLI) should draw its ranges from here.

With every panel limit at its maximum an item costs at most
2 orders x (10 referees x 10 turns + 9 summaries) x (1 + 5 retries) = 1,308 LM calls.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from chateval_dspy.errors import ConfigError

KIB = 1024
MIB = 1024 * KIB

# ---- the panel (DebateConfig) ----
MAX_ROLES = 10  # the paper's panels have 1-5 referees; each referee costs a call per turn per answer order
MAX_TURNS = 10  # the paper saw no gain past 3-4 rounds; each round costs a call per referee
MAX_PARSE_RETRIES = 5  # each retry is a paid call; an LM that fails six times in a row will not parse
MIN_TEXT_CHARS = 200  # a judged text cut shorter leaves too little to judge
MAX_TEXT_CHARS = 100_000  # ~25k tokens per judged text: the three texts of an item still fit a 128k context
MAX_PATH_CHARS = 4096  # a role_file path in a config: Linux's PATH_MAX

# ---- personas (role files and judge cards) ----
MAX_PERSONA_CHARS = 4_000  # sent on every call of its referee; the built-in personas are ~300 characters
MAX_ROLE_NAME_CHARS = 100  # a display name, shown in transcripts
MAX_ROLE_FILE_ROLES = 100  # a role file is a library that panels pick from, not a panel
MAX_ROLE_FILE_BYTES = 2 * MIB  # read before parsing: 100 roles x 3 personas x 4,000 characters (1.2 MB) fit

# ---- a saved evaluator (program.json, card.json) ----
MAX_INSTRUCTION_CHARS = 20_000  # sent on every call; built-in ~500, MIPROv2/GEPA proposals a few thousand
MAX_FIELD_TEXT_CHARS = 1_000  # a signature field's prefix or description; the built-in ones are under 150
MAX_DEMOS_PER_PREDICTOR = 16  # DSPy's own default for labelled demos; every demo is sent on every call
MAX_DEMO_TEXT_CHARS = 200_000  # one demo field: a judged text (<= MAX_TEXT_CHARS) or a whole discussion
MAX_DEMO_CHARS_PER_PREDICTOR = 400_000  # ~100k tokens of demos per call: what a 128k-token context holds
MAX_MODEL_NAME_CHARS = 200  # the card's model is a name (provider/model), never an endpoint or settings
MAX_PROGRAM_FILE_BYTES = 16 * MIB  # read before parsing; a bootstrapped 5-referee program is ~2 MB
MAX_CARD_FILE_BYTES = 1 * MIB  # read before parsing; a card is a few KB plus at most 10 referees' personas
MAX_MLMODEL_FILE_BYTES = 1 * MIB  # an MLflow model's MLmodel file, read to find the evaluator inside a pyfunc

# ---- a task spec (a task file, or the task inside a config or judge card) ----
MAX_TASK_FILE_BYTES = 256 * KIB  # read before parsing; the built-in specs are ~2 KB, instructions dominate
MAX_TASK_INPUTS = 10  # each input is a judged text sent on every call (each up to max_text_chars)
MAX_CRITERIA = 20  # each criterion is an output field of every verdict (two, pairwise)
MAX_SCALE_POINTS = 101  # an integer scale's width, e.g. 0-100; wider scales are not ratings
MAX_SCALE_LABELS = 20  # a label scale (pass/fail, A-F ...) is a short list of classes
MAX_LABEL_CHARS = 40  # one label of a scale; it is an enum value of the JSON schema
# A criterion's or input's description; with the data note appended it stays within MAX_FIELD_TEXT_CHARS.
MAX_TASK_DESCRIPTION_CHARS = 800
MAX_TASK_NAME_CHARS = 40  # task, input and criterion names are identifiers (field names of the prompts)


def read_bounded(path: str | Path, limit: int, limit_name: str, what: str = "file") -> bytes:
    """At most ``limit`` bytes of the regular file ``path``, whatever the file claims to be (a FIFO, a device or
    a sparse giant never gets read); a ``ConfigError`` naming ``what``, the path and the limit otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"cannot read {what} {path}: missing or not a regular file")
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    if len(data) > limit:
        raise ConfigError(f"{what} {path} is larger than {limit} bytes ({limit_name}); refusing to read it")
    return data


def read_config_file(path: str | Path, limit: int, limit_name: str, what: str):
    """The parsed content of a YAML or JSON file (JSON by its ``.json`` suffix), read with ``read_bounded``;
    a ``ConfigError`` naming ``what`` and the path for bad UTF-8, bad syntax or nesting too deep to parse."""
    path = Path(path)
    raw = read_bounded(path, limit, limit_name, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from exc
    as_json = path.suffix.lower() == ".json"
    try:
        return json.loads(text) if as_json else yaml.safe_load(text)
    except (ValueError, RecursionError, yaml.YAMLError) as exc:  # ValueError: JSON errors and over-long numbers
        raise ConfigError(f"{what} {path} is not valid {'JSON' if as_json else 'YAML'}: {str(exc)[:300]}") from exc
