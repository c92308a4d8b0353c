"""Verdicts for other programs: over HTTP (``http``) and as a DSPy metric (``as_metric``)."""
