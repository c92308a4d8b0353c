"""Running a program over items: the batch runner (``evaluate``), its resumable results files and
run identity (``records``), agreement metrics with CIs, and the printed summary table.

This package's ``__init__`` imports nothing, so a light module of it loads without DSPy. The runner is
``chateval_dspy.evaluate`` (``chateval_dspy.run.evaluate`` names its module once any code has imported it).
"""
