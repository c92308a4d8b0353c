"""Items with human labels: loaders for the built-in datasets (shipped here as package data) and for
users' own JSONL/CSV files (``loaders``), and the seeded train/dev/test split every later step reuses.
"""
