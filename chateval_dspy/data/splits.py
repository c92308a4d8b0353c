"""The seeded split every step reuses: its parts, in order, and their shares of the items.

Kept apart from the loaders (which need DSPy) so that ``DataSpec`` and the ``chateval`` parser name the parts
without importing DSPy; ``loaders.split`` makes the split.
"""

SPLITS = ("train", "dev", "test")
SPLIT_FRACTIONS = (0.4, 0.2, 0.4)


def split_record(seed: int, limit: int | None, parts: dict) -> dict:
    """The split as a saved evaluator's card records it: seed, shares, item limit and each part's size.

    Example:
        >>> split_record(0, 5, {"train": [1, 2], "dev": [3], "test": [4, 5]})
        {'seed': 0, 'fractions': [0.4, 0.2, 0.4], 'limit': 5, 'sizes': {'train': 2, 'dev': 1, 'test': 2}}
    """
    return {"seed": seed, "fractions": list(SPLIT_FRACTIONS), "limit": limit, "sizes": {k: len(v) for k, v in parts.items()}}
