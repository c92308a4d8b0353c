"""Items with human labels: loaders for the built-in datasets (shipped here as package data) and for
users' own JSONL/CSV files, and the seeded train/dev/test split every later step reuses."""

from chateval_dspy.data.loaders import dataset_hash, item_from_record, load_dataset, select, split

__all__ = ["dataset_hash", "item_from_record", "load_dataset", "select", "split"]
