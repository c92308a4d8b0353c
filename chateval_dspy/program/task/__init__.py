"""What a panel judges: the task spec (inputs, criteria on their scales, instructions), as YAML/JSON or Python.

A ``TaskSpec`` names the item's input fields (which of them are the judged responses), the criteria a
referee rates (each with a description and a scale: an integer range such as 1-5, or labels such as
pass/fail) and the instructions of the two steps (``argue``, ``verdict``). The signatures every
referee's predictors use are built from it (``signatures.signatures_for``), with ``Literal`` outputs,
so constrained decoding, the JSON schema, the optimizers and the saved-program checks follow the spec.
The two benchmarks are two built-in specs (``tasks/faireval.yaml``, ``tasks/topical_chat.yaml``).

The modules, in import order: ``templates`` (placeholders, default instructions), ``scale`` (a criterion's
scale), ``parts`` (inputs, criteria, preference), ``checks`` (every value checked against ``limits``, before
any model starts), ``parsing`` (a task file's form), ``spec`` (``TaskSpec``) and ``loading`` (built-in specs
and task files).
"""

from chateval_dspy.program.task.loading import as_task, builtin_task, load_task, read_task_file
from chateval_dspy.program.task.parts import Criterion, InputSpec, Preference
from chateval_dspy.program.task.scale import Scale
from chateval_dspy.program.task.spec import TaskSpec
from chateval_dspy.program.task.templates import DATA_NOTE, placeholders, render

__all__ = ["DATA_NOTE", "Criterion", "InputSpec", "Preference", "Scale", "TaskSpec", "as_task", "builtin_task",
           "load_task", "placeholders", "read_task_file", "render"]
