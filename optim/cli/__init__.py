"""The ``chateval`` command: one module per command, each only parsing flags and calling library functions."""
