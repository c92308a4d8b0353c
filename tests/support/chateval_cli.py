"""The ``chateval`` command run in this process, three ways: as is, with few bootstrap resamples, and with its
output captured."""

from __future__ import annotations

import contextlib
import io

# Few resamples: the tests that use them check that CIs are there and ordered, not how precise they are.
RESAMPLES = 20


def chateval(args: list[str]) -> int:
    """``chateval ARGS``; its exit code."""
    from optim.cli.main import main

    return main(args)


def chateval_few_resamples(*argv: str) -> int:
    """``chateval ARGV --resamples 20`` (``report`` as is: it only reads figures back and has no --resamples)."""
    from optim.cli.main import main

    extra = [] if argv[0] == "report" else ["--resamples", str(RESAMPLES)]
    return main([*argv, *extra])


def chateval_captured(*argv: str) -> tuple[int, str, str]:
    """``chateval ARGV``: its exit code, stdout and stderr."""
    from optim.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()
