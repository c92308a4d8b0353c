"""Who is answering on the review page: each reviewer's own link, and the rule for who may answer (docs/review.md,
"Names that count").

A server without login cannot tell people apart, so a link's key (an HMAC of the reviewer's name and the queue under
the server's secret), not a typed name, says who answers. Only the queue's assigned reviewers (MLflow's queue
``users``) may open it: a valid link of a reviewer no longer assigned is refused. The queue's owner has a link of
their own, keyed apart from every reviewer's, for agreement and the exports.
"""

from __future__ import annotations

import hashlib
import hmac

KEY_CHARS = 32  # 128 bits of the HMAC: unguessable, short enough for a link
INVALID = "this link is not valid for this queue and reviewer; open your own link"


def normal(name: str) -> str:
    """A reviewer's name as MLflow's queue stores its users (trimmed, lower case).

    Example:
        >>> normal("  Ann ")
        'ann'
    """
    return name.strip().lower()


def key_for(secret: str, queue_id: str, reviewer: str) -> str:
    """The key of ``reviewer``'s link to the queue: it cannot be made without the server's secret.

    Example:
        >>> k = key_for("s3cret", "rq-1", "ann")
        >>> len(k), k == key_for("s3cret", "rq-1", "ANN "), k == key_for("s3cret", "rq-1", "bo")
        (32, True, False)
    """
    return _mac(secret, f"{queue_id}\n{normal(reviewer)}")


def _mac(secret: str, message: str) -> str:
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()[:KEY_CHARS]


def key_matches(secret: str, queue_id: str, reviewer: str | None, key: str | None) -> bool:
    """Whether ``key`` is ``reviewer``'s (the check made before anything is read from MLflow)."""
    return bool(reviewer and key) and hmac.compare_digest(key.encode(), key_for(secret, queue_id, reviewer).encode())


def owner_key(secret: str, queue_id: str) -> str:
    """The key of the queue owner's link (its message holds a NUL, which no reviewer's name does).

    Example:
        >>> owner_key("s", "q") != key_for("s", "q", "owner") and owner_matches("s", "q", owner_key("s", "q"))
        True
    """
    return _mac(secret, f"owner\0{queue_id}")


def owner_matches(secret: str, queue_id: str, key: str | None) -> bool:
    return bool(key) and hmac.compare_digest(key.encode(), owner_key(secret, queue_id).encode())


def refusal(secret: str, queue_id: str, reviewer: str | None, key: str | None, assigned: list[str]) -> str | None:
    """Why ``reviewer`` may not answer (a line for the page), or None when the key is theirs and they are assigned.

    Example:
        >>> k = key_for("s", "q", "ann")
        >>> refusal("s", "q", "ann", k, ["ann", "bo"]) is None
        True
        >>> refusal("s", "q", "ann", k, ["bo"])
        "'ann' is not assigned to this queue (its reviewers: bo); ask for: chateval review ... --reviewer ann"
        >>> refusal("s", "q", "bo", k, ["ann", "bo"])
        'this link is not valid for this queue and reviewer; open your own link'
    """
    if not key_matches(secret, queue_id, reviewer, key):
        return INVALID
    if normal(reviewer) not in {normal(u) for u in assigned}:
        return (f"'{normal(reviewer)}' is not assigned to this queue (its reviewers: {', '.join(assigned) or 'none'}); "
                f"ask for: chateval review ... --reviewer {normal(reviewer)}")
    return None
