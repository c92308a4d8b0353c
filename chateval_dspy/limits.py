"""Upper bounds on everything a configuration, a role file or a saved evaluator can ask for, in one place.

Whatever reaches ``DebateConfig``, the role loader or ``store.load_program`` (from flags, trials, cards, downloads)
is checked against these, so no file or flag can ask for unbounded LM calls, prompt text or memory; searches and the
CLI draw their ranges from here. At every panel maximum an item costs at most
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
DEFAULT_DEMOS = 2  # per predictor when none is asked for: the labelled demos' and the optimizers' default
MAX_DEMO_TEXT_CHARS = 200_000  # one demo field: a judged text (<= MAX_TEXT_CHARS) or a whole discussion
MAX_DEMO_CHARS_PER_PREDICTOR = 400_000  # ~100k tokens of demos per call: what a 128k-token context holds
MAX_MODEL_NAME_CHARS = 200  # the card's model is a name (provider/model), never an endpoint or settings
MAX_PROGRAM_FILE_BYTES = 16 * MIB  # read before parsing; a bootstrapped 5-referee program is ~2 MB
MAX_CARD_FILE_BYTES = 1 * MIB  # read before parsing; a card is a few KB plus at most 10 referees' personas
MAX_MLMODEL_FILE_BYTES = 1 * MIB  # an MLflow model's MLmodel file, read to find the evaluator inside a pyfunc
# A confidence map's breakpoints: the fit rounds raw confidences to thousandths, so it has at most 1,001
MAX_CONFIDENCE_BREAKPOINTS = 1_024
MAX_CALIBRATION_FILE_BYTES = 256 * KIB  # read before parsing; a map of 1,024 breakpoints is ~50 KB of JSON
MAX_CASCADE_FILE_BYTES = 256 * KIB  # cascade.json, read before parsing: 8 stages are ~1 KB, the rest its report
MAX_CASCADE_STAGES = 8  # a cascade's stages; each is a whole saved evaluator, loaded and bound to its LM

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

# ---- any YAML or JSON document read from a file (task, role, card, program files) ----
# An alias is a reference, so a 500-byte "billion laughs" file parses into a few objects that a repr, a join or a
# walk expands to gigabytes: the size a document loads to is bounded, not only the bytes it is read from.
MAX_DOC_NODES = 20_000  # scalars, lists and mappings; a full role file (100 roles x 3 personas) has ~1,500
MAX_DOC_DEPTH = 32  # nesting; the built-in tasks are 4 deep, a saved program.json under 10
MAX_DOC_CHARS = 4 * MIB  # scalar text, an aliased scalar counted at every use; above the largest YAML file limit


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


class BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses what only a bomb needs (an alias of a list or mapping, merge keys included;
    past ``MAX_DOC_NODES``, ``MAX_DOC_DEPTH`` or ``MAX_DOC_CHARS`` with aliases counted at each use) with a
    ``ConfigError`` naming the stream's ``name`` and the line.

    Example:
        >>> yaml.load("a: &x [1, 2]\\nb: *x", BoundedLoader)
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: <unicode string> line 2, column 4: an alias of a list or mapping is refused ...
        >>> yaml.load("a: &x one\\nb: *x", BoundedLoader)
        {'a': 'one', 'b': 'one'}
    """

    def __init__(self, stream):
        super().__init__(stream)
        self.nodes = self.depth = self.chars = 0
        self.scalar_chars: dict[str, int] = {}  # anchor -> its scalar's length; collections are never aliased

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            size = self.scalar_chars.get(event.anchor)
            if size is None and event.anchor in self.anchors:
                self._refuse("an alias of a list or mapping is refused (that is how YAML bombs grow)", event)
            self._count(size or 0, event)
            return super().compose_node(parent, index)
        self._count(len(event.value) if isinstance(event, yaml.ScalarEvent) else 0, event)
        self.depth += 1
        if self.depth > MAX_DOC_DEPTH:
            self._refuse(f"nested more than {MAX_DOC_DEPTH} levels deep (limits.MAX_DOC_DEPTH)", event)
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        if isinstance(node, yaml.ScalarNode) and getattr(event, "anchor", None):
            self.scalar_chars[event.anchor] = len(node.value)
        return node

    def construct_mapping(self, node, deep=False):
        # A key written twice keeps only its last value in PyYAML: which one the author meant is unknowable.
        seen = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                key = self.construct_object(key_node)
                if key in seen:
                    self._refuse(f"the key {key_node.value!r} is given twice in one mapping", key_node)
                seen.add(key)
        return super().construct_mapping(node, deep)

    def _count(self, chars: int, event) -> None:
        self.nodes += 1
        self.chars += chars
        if self.nodes > MAX_DOC_NODES:
            self._refuse(f"more than {MAX_DOC_NODES} values (limits.MAX_DOC_NODES)", event)
        if self.chars > MAX_DOC_CHARS:
            self._refuse(f"more than {MAX_DOC_CHARS} characters once aliases are expanded (limits.MAX_DOC_CHARS)",
                         event)

    def _refuse(self, problem: str, event) -> None:
        mark = event.start_mark
        raise ConfigError(f"{self.name} line {mark.line + 1}, column {mark.column + 1}: {problem}")


def check_depth(value, source: str, limit: int = MAX_DOC_DEPTH) -> None:
    """A ``ConfigError`` naming ``source`` if parsed JSON nests deeper than ``limit`` (walked without recursion).

    Example:
        >>> check_depth([[[1]]], "a.json", 2)
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: a.json is nested more than 2 levels deep (limits.MAX_DOC_DEPTH)
    """
    level = [value] if isinstance(value, (dict, list)) else []
    for _ in range(limit):  # one breadth-first level per pass: memory is one level, never a call stack
        level = [v for x in level for v in (x.values() if isinstance(x, dict) else x) if isinstance(v, (dict, list))]
    if level:
        raise ConfigError(f"{source} is nested more than {limit} levels deep (limits.MAX_DOC_DEPTH)")


def _unique_keys(pairs: list) -> dict:
    """A JSON object whose keys are all different: ``json`` keeps a repeated key's last value silently."""
    data = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"the key {key!r} is given twice in one object")
        data[key] = value
    return data


def parse_json(text: str | bytes, source: str):
    """The parsed JSON ``text`` of ``source``, at most ``MAX_DOC_DEPTH`` deep; a ``ConfigError`` naming ``source``
    otherwise (bad JSON, bad UTF-8, over-long numbers, nesting).

    Example:
        >>> parse_json("[" * 100_000, "deep.json")
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: deep.json is not valid JSON: nested too deeply to parse
    """
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError as exc:
        raise ConfigError(f"{source} is not valid JSON: nested too deeply to parse") from exc
    except ValueError as exc:  # JSON syntax, UTF-8 and numbers too long to convert
        raise ConfigError(f"{source} is not valid JSON: {str(exc)[:300]}") from exc
    check_depth(data, source)
    return data


def parse_yaml(text: str, source: str):
    """The parsed YAML ``text`` of ``source`` through ``BoundedLoader``; else a ``ConfigError`` naming it and the line.

    Example:
        >>> parse_yaml("a: [1", "t.yaml")
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: t.yaml is not valid YAML (line 1, column 6): expected ',' or ']', but got '<stream end>'
    """
    loader = None
    try:
        loader = BoundedLoader(text)  # its reader refuses some characters as it is built
        loader.name = source  # what the refusals name
        return loader.get_single_data()
    except ConfigError:  # a refusal, already naming the file and line; a ValueError, hence caught here first
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"{source} is not valid YAML{where}: {str(exc.problem or exc.context)[:300]}") from exc
    except (ValueError, RecursionError, yaml.YAMLError) as exc:  # ValueError: integers too long to convert
        raise ConfigError(f"{source} is not valid YAML: {str(exc)[:300]}") from exc
    finally:
        if loader is not None:
            loader.dispose()


def read_config_file(path: str | Path, limit: int, limit_name: str, what: str):
    """A YAML or JSON file (by its ``.json`` suffix) parsed, read within ``limit`` bytes; else a ``ConfigError``.

    Example:
        >>> _ = (tmp / "t.yaml").write_text("a: &x [1]\\nb: *x")
        >>> read_config_file(tmp / "t.yaml", 100, "LIMIT", "task file")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        chateval_dspy.errors.ConfigError: task file .../t.yaml line 2, column 4: an alias of a list or mapping ...
    """
    path = Path(path)
    raw = read_bounded(path, limit, limit_name, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc}") from exc
    parse = parse_json if path.suffix.lower() == ".json" else parse_yaml
    return parse(text, f"{what} {path}")


# ---- people's labels (label files, MLflow feedback) ----
MAX_LABEL_NAME_CHARS = 200  # a reviewer's name (an e-mail or user id) or a labelled item's id; shown on judge cards

# ---- data files (datasets, label files, files to score: JSONL, JSON arrays, CSV) ----
# A data file is read whole before its rows are parsed: its size is checked first (a sparse or endless file is never
# read), and its rows are counted as they are parsed, since a row of a few bytes ("{}") parses to hundreds.
MAX_DATA_FILE_BYTES = 2 * 1024 * MIB  # generous: MAX_DATA_ROWS items of 2 KB each fit
MAX_DATA_ROWS = 1_000_000  # lines, CSV records or JSON array elements: far past any labelled evaluation set


# ---- batch mode: what a Batch API or a self-hosted engine hands back (lm/batch) ----
# A wave's results are untrusted and read into memory: their size follows the requests the wave made, so that a
# one-item run cannot be handed (and parse) hundreds of megabytes.
MAX_BATCH_ANSWER_BYTES = 1 * MIB  # one answer: a chat completion of a few thousand tokens; larger is not one
BATCH_RESULT_BYTES_PER_REQUEST = 2 * MIB  # a result line: an answer of at most MAX_BATCH_ANSWER_BYTES, its envelope
BATCH_RESULT_SLACK_BYTES = 1 * MIB  # blank lines, and the error lines of a batch that failed as a whole
# One line of results, parsed whole: an answer of MAX_BATCH_ANSWER_BYTES however its text is escaped, its envelope.
MAX_BATCH_RESULT_LINE_BYTES = 4 * MIB
MAX_BATCH_RESULT_BYTES = 512 * MIB  # whatever the wave: tens of thousands of answers
# Finding a batch by its label reads the provider's list of batches, newest first, 100 a page: the batch sought
# was submitted by the run being resumed, so a list that goes on past this (or repeats itself) is not looked through.
MAX_BATCH_LIST_PAGES = 50


def batch_result_bytes(requests: int) -> int:
    """The most a batch's results file may hold for ``requests`` requests (per request, slack, a cap).

    Example:
        >>> batch_result_bytes(8) // MIB, batch_result_bytes(10**6) // MIB
        (17, 512)
    """
    return min(MAX_BATCH_RESULT_BYTES, BATCH_RESULT_SLACK_BYTES + max(0, requests) * BATCH_RESULT_BYTES_PER_REQUEST)
