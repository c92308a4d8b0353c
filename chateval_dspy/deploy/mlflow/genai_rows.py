"""A row of ``mlflow.genai.evaluate`` read as an item of the task, and the preference its expectations state
(plain data, no MLflow). Where each field comes from is ``chateval_dspy.deploy.mlflow.judge``'s docstring."""

from __future__ import annotations

from collections.abc import Mapping

from chateval_dspy.errors import DataError
from chateval_dspy.run.identity import digest
from chateval_dspy.run.tracing import dumps

SOURCES = ("inputs", "outputs", "expectations")
EXPECTED_RESPONSE = "expected_response"
# Where a row's expectations state the expected preference: the names people's labels take (deploy.mlflow.trace_labels). Not
# the scorer's own name: MLflow's result table would show that expectation in the feedback's own column.
EXPECTED_KEYS = ("label", "preference")


def item_for(task, inputs=None, outputs=None, expectations=None, *, fields: Mapping[str, str] | None = None,
             item_id: str | None = None) -> dict:
    """The item a row of ``mlflow.genai.evaluate`` describes (see the module docstring for where each field
    comes from). Missing fields are left out: validating the item names them.

    Example:
        >>> from chateval_dspy.program.task import as_task
        >>> item_for(as_task("pairwise"), {"question": "2+2?"}, "4", {"expected_response": "5"})
        {'question': '2+2?', 'answer_1': '4', 'answer_2': '5', 'id': '...'}
        >>> item_for(as_task("pairwise"), {"question": "q"}, {"answer_1": "a"}, {"ref": "b"},
        ...          fields={"answer_2": "expectations.ref"}, item_id="row-1")["answer_2"]
        'b'
    """
    row = {"inputs": inputs, "outputs": outputs, "expectations": expectations}
    names = task.input_names
    item: dict = {}
    for ours, path in (fields or {}).items():
        if ours not in names and ours != "id":
            raise DataError(f"fields: {ours!r} is not an input of task {task.name!r} ({', '.join(names)})")
        source, _, key = path.partition(".")
        if source not in SOURCES:
            raise DataError(f"fields: {path!r} must start with one of {', '.join(SOURCES)}")
        value = row.get(source)
        if key and (not isinstance(value, Mapping) or key not in value):
            raise DataError(f"fields: the row has no {path!r}")
        item[ours] = value[key] if key else value

    def take(source) -> None:
        if isinstance(source, Mapping):
            item.update({name: source[name] for name in names if name not in item and name in source})

    def missing() -> list[str]:
        return [n for n in task.judged if n not in item]

    take(inputs)
    if isinstance(inputs, Mapping) and "id" in inputs and "id" not in item:
        item["id"] = inputs["id"]
    take(outputs)
    if outputs is not None and not isinstance(outputs, Mapping) and missing():
        item[missing()[0]] = outputs if isinstance(outputs, str) else dumps(outputs)
    take(expectations)
    if isinstance(expectations, Mapping) and EXPECTED_RESPONSE in expectations and missing():
        item[missing()[0]] = expectations[EXPECTED_RESPONSE]
    if "id" not in item:
        item["id"] = item_id or digest({k: item[k] for k in names if k in item})
    item["id"] = str(item["id"])
    return item


def as_preference(value, task) -> str:
    """An expected preference as ``"1"``, ``"2"`` or ``"tie"``, from any spelling a label file takes (``1``,
    ``"2"``, ``"tie"``, ``a``/``b``, a response's field name such as ``answer_1``).

    Example:
        >>> from chateval_dspy.program.task import as_task
        >>> as_preference("answer_2", as_task("pairwise")), as_preference(1, as_task("pairwise"))
        ('2', '1')
    """
    from chateval_dspy.data.loaders import LABELS

    aliases = {**LABELS, task.responses[0].lower(): "1", task.responses[1].lower(): "2"}
    label = None if isinstance(value, bool) or not isinstance(value, (str, int)) else aliases.get(str(value).strip().lower())
    if label is None:
        raise DataError(f"expectations: an expected preference must be {task.responses[0]}, {task.responses[1]} or tie "
                        f"(or 1, 2, a, b), got {value!r}")
    return label


def expected_preference(expectations, task) -> str | None:
    """The preference a row's ``expectations`` state under the first of ``EXPECTED_KEYS`` it has (``"1"``, ``"2"``,
    ``"tie"``), or None when it states none.

    Example:
        >>> from chateval_dspy.program.task import as_task
        >>> expected_preference({"expected_response": "Paris.", "label": "answer_2"}, as_task("pairwise"))
        '2'
    """
    if not isinstance(expectations, Mapping):
        return None
    for key in EXPECTED_KEYS:
        if expectations.get(key) is not None:
            return as_preference(expectations[key], task)
    return None
