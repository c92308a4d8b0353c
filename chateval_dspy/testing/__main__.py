"""``python -m chateval_dspy.testing``: the scripted OpenAI-compatible server, for trying the CLI
(or an installed wheel) end to end without a model: it prints its base URL
(``http://127.0.0.1:<port>/v1``) for ``chateval evaluate --model URL``."""

from __future__ import annotations

import argparse
import threading

from chateval_dspy.testing.fake_server import FakeOpenAIServer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m chateval_dspy.testing", description=__doc__.split("\n")[0])
    parser.parse_args(argv)
    with FakeOpenAIServer() as base_url:
        print(base_url, flush=True)
        threading.Event().wait()  # until killed


if __name__ == "__main__":
    main()
