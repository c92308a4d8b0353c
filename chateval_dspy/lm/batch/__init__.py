"""Batch mode: a run's LM calls through the providers' Batch APIs, in waves (``waves``), resumable (``journal``)."""
