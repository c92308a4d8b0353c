"""What a panel judges: the task spec (inputs, criteria on their scales, instructions), as YAML/JSON or Python.

The referees' signatures are built from it (``signatures.signatures_for``), with ``Literal`` outputs, so decoding,
the JSON schema, the optimizers and the saved-program checks follow the spec; the two benchmarks are built-in specs
(``tasks/*.yaml``). Modules, in import order: ``templates``, ``scale``, ``parts``, ``checks``, ``parsing``,
``spec`` (``TaskSpec``), ``loading``. The task file: docs/tasks.md.
"""

from chateval_dspy.program.task.loading import as_task, builtin_task, load_task, read_task_file
from chateval_dspy.program.task.parts import Criterion, InputSpec, Preference
from chateval_dspy.program.task.scale import Scale
from chateval_dspy.program.task.spec import TaskSpec
from chateval_dspy.program.task.templates import DATA_NOTE, placeholders, render

__all__ = ["DATA_NOTE", "Criterion", "InputSpec", "Preference", "Scale", "TaskSpec", "as_task", "builtin_task",
           "load_task", "placeholders", "read_task_file", "render"]
