"""How big a review queue gets: the items queued when no size is asked for, and the reviewers MLflow assigns at most.

Apart from ``optim.review.queue`` (which reaches MLflow and DSPy) so that ``chateval review --help`` states them.
"""

DEFAULT_TOP = 20
MAX_REVIEWERS = 10  # MLflow's limit on a queue's assigned users
