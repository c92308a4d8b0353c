"""Items with human labels: loaders for the built-in datasets (shipped here as package data) and for
users' own JSONL/CSV files, and the seeded train/dev/test split every later step reuses.

Names are imported on first use (``chateval_dspy.lazy``).
"""

import chateval_dspy.lazy as lazy

__getattr__, __dir__ = lazy.exports(__name__, {
    name: "chateval_dspy.data.loaders" for name in ("dataset_hash", "item_from_record", "load_dataset", "select", "split")})

__all__ = ["dataset_hash", "item_from_record", "load_dataset", "select", "split"]
