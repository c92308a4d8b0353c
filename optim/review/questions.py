"""The questions a reviewer answers, made from the task's criteria (MLflow label schemas; docs/review.md).

A question's name is the name its answers carry as Feedback on the trace, so it is exactly what
``optim.tuning.labels`` reads as a label: ``preference`` (1, 2 or tie) for a pairwise task, else one per criterion.
"""

from __future__ import annotations

from dataclasses import dataclass

from chateval_dspy.errors import ConfigError
from chateval_dspy.program.task import TaskSpec, as_task

PREFERENCE = "preference"  # one of optim.tuning.labels.PAIRWISE_NAMES, so an answer is a label
# MLflow's own limits on a question (mlflow.genai.label_schemas.validation).
MAX_OPTIONS, MAX_OPTION_CHARS, MAX_INSTRUCTION_CHARS = 10, 64, 1000
RESERVED = "feedback"  # the experiment's default question in MLflow


@dataclass(frozen=True)
class Question:
    """One question: ``options`` (categorical) or ``low``..``high`` (numeric), and the reviewer's instruction."""

    name: str
    instruction: str
    options: tuple[str, ...] = ()
    low: float | None = None
    high: float | None = None

    def mlflow_input(self):
        """The MLflow input widget of this question."""
        from mlflow.genai.label_schemas import InputCategorical, InputNumeric

        if self.options:
            return InputCategorical(options=list(self.options))
        return InputNumeric(min_value=self.low, max_value=self.high)

    def matches(self, schema) -> bool:
        """Whether an existing MLflow label schema asks this question (same kind of answer, same answers)."""
        try:
            asked = question_of(schema)
        except ConfigError:
            return False
        return (asked.options, asked.low, asked.high) == (self.options, self.low, self.high)


def question_of(schema) -> Question:
    """A label schema read as the question it asks (categorical or numeric; other inputs are not answerable here)."""
    given = schema.input
    options = getattr(given, "options", None)
    if options and not getattr(given, "multi_select", False):
        return Question(schema.name, schema.instruction or "", options=tuple(str(o) for o in options))
    if type(given).__name__ == "InputNumeric":
        return Question(schema.name, schema.instruction or "", low=given.min_value, high=given.max_value)
    raise ConfigError(f"label schema '{schema.name}' asks for {type(given).__name__}; the review page answers "
                      "categorical and numeric questions (the ones chateval review makes)")


def _instruction(text: str) -> str:
    return text if len(text) <= MAX_INSTRUCTION_CHARS else text[:MAX_INSTRUCTION_CHARS - 3] + "..."


def questions(task: TaskSpec | str) -> list[Question]:
    """The task's questions (see the module docstring).

    Example:
        >>> [(q.name, q.options) for q in questions("pairwise")]
        [('preference', ('1', '2', 'tie'))]
        >>> q = questions("pointwise")[0]
        >>> q.name, q.low, q.high, q.instruction
        ('naturalness', 1, 3, 'does it sound like a person? (1-3)')
    """
    task = as_task(task)
    if task.format == "pairwise":
        what = task.preference.stated or f"which response is better overall: 1, 2, or tie ({task.criteria_text()})"
        said = {i.name: i.description.strip().rstrip(".") for i in task.inputs}
        named = [f"{n} is {name}" + (f" ({said[name]})" if said.get(name) else "")
                 for n, name in enumerate(task.responses, start=1)]
        text = f"{what[:1].upper()}{what[1:]}. {', '.join(named)}."  # the task's words: reviewers never see spans
        return [Question(PREFERENCE, _instruction(text), options=("1", "2", "tie"))]
    out = []
    for criterion in task.criteria:
        if criterion.name.casefold() == RESERVED:
            raise ConfigError(f"task {task.name}: criterion '{criterion.name}' is MLflow's reserved question name; "
                              "rename the criterion to review it")
        scale = criterion.scale
        text = _instruction(f"{task.describe(criterion)} ({scale})")
        if scale.ordinal:
            out.append(Question(criterion.name, text, low=scale.low, high=scale.high))
            continue
        if len(scale.labels) > MAX_OPTIONS or any(len(label) > MAX_OPTION_CHARS for label in scale.labels):
            raise ConfigError(f"task {task.name}: criterion '{criterion.name}' has labels MLflow's review page cannot "
                              f"offer (at most {MAX_OPTIONS} labels of at most {MAX_OPTION_CHARS} characters)")
        out.append(Question(criterion.name, text, options=scale.labels))
    return out
