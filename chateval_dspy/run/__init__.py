"""Running a program over items: the batch runner (``evaluate``), its resumable results files and
run identity (``records``), agreement metrics with CIs, and the printed summary table.

``RunResult`` is imported on first use (``chateval_dspy.lazy``), so importing a light module of this
package does not import DSPy. The runner is ``chateval_dspy.evaluate`` (``chateval_dspy.run.evaluate``
names its module, as it does once any code has imported that module).
"""

import chateval_dspy.lazy as lazy

__getattr__, __dir__ = lazy.exports(__name__, {"RunResult": "chateval_dspy.run.result"})

__all__ = ["RunResult"]
