"""Where the panel is unsure, people decide: judged items ranked by uncertainty into an MLflow review queue.

``uncertainty`` scores one results record (pure), ``sources`` reads results files and traced debates back as
records, ``questions`` turns a task's criteria into the label questions reviewers answer, and ``queue`` puts
the most uncertain items into an MLflow review queue (``chateval review``). The review page (``chateval review
serve``): ``desk`` reads the queue and writes answers, ``reviewers`` keys each reviewer's link, ``page`` draws it,
``server`` serves it, and for the queue's owner ``agreement`` (Krippendorff's alpha) and ``export`` (JSONL, CSV).
"""
