"""Scoring files past one process: resumable results files (``score_file``), parts by id (``parts``), Ray and
Spark."""
