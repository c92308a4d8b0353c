"""A tuned evaluator in production, one subpackage per idea: a saved evaluator and ``load()`` (``saved``), the
evaluator in MLflow (``mlflow``), scoring files past one process (``scale``), and verdicts for other programs over
HTTP or as a DSPy metric (``serving``)."""
