"""Tuning a panel to people's labels, one idea per module.

``labels`` (where labels come from and where labelled items go), ``objectives`` (the per-item metrics DSPy's
optimizers maximise), ``compile`` (``chateval compile`` as a function), ``align`` (an MLflow judge's alignment
optimizer that runs ``compile``'s optimizers).
"""
