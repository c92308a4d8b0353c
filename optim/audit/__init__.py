"""The bias audit (``chateval audit``), one idea per module: ``perturb`` (deterministic perturbations of one item),
``measures`` (the figures, each with its 95% interval), ``probes`` (running a panel on originals and perturbations,
resumably), ``columns`` (a file's extra columns), ``saved`` (a saved evaluator's audit and its MLflow run),
``recovery`` (the benchmark of planted biases).
"""
