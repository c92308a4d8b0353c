"""The seeded split every step reuses: its parts, in order, and their shares of the items.

Kept apart from the loaders (which need DSPy) so that ``DataSpec`` and the ``chateval`` parser name the parts
without importing DSPy; ``loaders.split`` makes the split.
"""

SPLITS = ("train", "dev", "test")
SPLIT_FRACTIONS = (0.4, 0.2, 0.4)
