"""A tuned evaluator in production: saved to disk with its card (``store``), loaded as a ``Judge``
bound to an LM (``judge``), scoring files (``score_file``), serving HTTP (``serve``), and Ray (``ray``)."""
