"""Request tags for a shared LLM gateway's spend tracking: ``chateval``, ``task:<name>``, ``run:<id>``.

Our engines' requests carry them in one header (``x-litellm-tags``; strict servers refuse unknown body fields),
which the LiteLLM proxy logs and other servers ignore. A tag holds no secret; the workers of one sweep share a run
id through ``$CHATEVAL_RUN_ID``.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import re
import sys
import uuid

from chateval_dspy.concurrency import set_within

log = logging.getLogger(__name__)

TAG_HEADER = "x-litellm-tags"
RUN_ID_VARIABLE = "CHATEVAL_RUN_ID"
# The header is a comma-separated list: a tag keeps to characters that cannot split or break it.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:/@+=-]+")
_TAGS: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("chateval_request_tags", default=())
_GENERATED: list[str] = []  # one generated run id a process


def clean(tag: str) -> str:
    """``tag`` with anything that could split the header's list made ``_``, at most 120 characters.

    Example:
        >>> clean("task:my task, v2")
        'task:my_task_v2'
    """
    return _UNSAFE.sub("_", str(tag)).strip("_")[:120]


def run_id() -> str:
    """``$CHATEVAL_RUN_ID``, else the active MLflow run's id, else one generated for this process (logged once)."""
    given = os.environ.get(RUN_ID_VARIABLE, "").strip()
    if given:
        return given
    mlflow = sys.modules.get("mlflow")  # only a process that already uses MLflow has a run to name
    active = mlflow.active_run() if mlflow is not None and hasattr(mlflow, "active_run") else None
    if active is not None:
        return active.info.run_id
    if not _GENERATED:
        _GENERATED.append(uuid.uuid4().hex[:12])
        log.info("run id for the gateway's request tags: %s (set %s to choose one)", _GENERATED[0], RUN_ID_VARIABLE)
    return _GENERATED[0]


def header() -> dict[str, str]:
    """``{"x-litellm-tags": "..."}`` for requests sent now, or {} outside ``tagging``."""
    tags = _TAGS.get()
    return {TAG_HEADER: ",".join(tags)} if tags else {}


def tagging(task: str | None = None) -> contextlib.AbstractContextManager[tuple[str, ...]]:
    """Tag the requests sent inside (threads that copy the context keep them); nested, it adds the task."""
    tags = _TAGS.get() or ("chateval", f"run:{clean(run_id())}")
    if task and not any(t.startswith("task:") for t in tags):
        tags = (*tags, f"task:{clean(task)}")
    return set_within(_TAGS, tags)
