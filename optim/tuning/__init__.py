"""Tuning a panel to people's labels: ``chateval compile``, ``calibrate`` and ``cascade`` as functions."""
