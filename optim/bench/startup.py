"""Start-up time: ``import dspy``, ``import chateval_dspy`` and ``chateval --help``, each in fresh interpreters.

Every run is one new process timed from start to exit (the interpreter's own start included), after one unrecorded
warm-up run each so that bytecode is cached; the three commands take turns, so a busy moment on the machine falls on
all of them. Each run's seconds are appended to a raw JSONL file as it ends: a rerun measures only the runs missing
and renders the same figures from the same file. Figures: the median and the range of the runs, beside the targets
(``import chateval_dspy`` <= 1.0 s, ``chateval --help`` <= 0.5 s; ``import dspy`` is the floor the package builds on).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from optim.bench import common as bench

TARGETS = {"import dspy": None, "import chateval_dspy": 1.0, "chateval --help": 0.5}


def command(target: str) -> list[str]:
    """The process one run of ``target`` starts: the installed ``chateval`` script where there is one."""
    if target == "chateval --help":
        script = Path(sys.executable).with_name("chateval")
        return [str(script), "--help"] if script.exists() else [sys.executable, "-m", "optim.cli", "--help"]
    return [sys.executable, "-c", target]


def time_once(target: str) -> float:
    start = time.perf_counter()
    subprocess.run(command(target), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - start


def read_raw(path: Path) -> dict[str, list[float]]:
    """Seconds per target, in the order measured, from the raw file (none when it does not exist yet)."""
    runs: dict[str, list[float]] = {t: [] for t in TARGETS}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            runs.setdefault(row["target"], []).append(row["seconds"])
    return runs


def measure(path: Path, targets: list[str], runs: int) -> dict[str, list[float]]:
    """The first ``runs`` seconds of each target: those in ``path`` kept, the missing ones measured and appended."""
    have = read_raw(path)
    missing = {t: runs - len(have[t]) for t in targets if len(have[t]) < runs}
    if missing:
        path.parent.mkdir(parents=True, exist_ok=True)
        for t in missing:
            time_once(t)  # warm-up: bytecode written, files in the page cache
        with path.open("a", encoding="utf-8") as raw:
            for _ in range(max(missing.values())):
                for t in [t for t in targets if len(have[t]) < runs]:
                    have[t].append(time_once(t))
                    raw.write(json.dumps({"target": t, "run": len(have[t]), "seconds": have[t][-1]}) + "\n")
                    raw.flush()
    return {t: have[t][:runs] for t in targets}


def figures(seconds: list[float], target: float | None) -> dict:
    middle = statistics.median(seconds)
    return {"median": middle, "min": min(seconds), "max": max(seconds), "runs": seconds, "target": target,
            "met": None if target is None else middle <= target}


def run_startup(args) -> dict:
    targets = [t for t in TARGETS if args.only is None or t in args.only.split(",")]
    raw = Path(args.raw)
    got = measure(raw, targets, args.runs)
    report = {"targets": {t: figures(got[t], TARGETS[t]) for t in targets}, "raw": str(raw)}
    report["header"] = bench.header(args, suite="startup", model="none (no LM is called)", data="none",
                                    split="-", n=args.runs, load_average=round(os.getloadavg()[0], 2),
                                    measured="wall seconds from process start to exit, one warm-up run each first")
    report["header"].pop("lm_threads")  # no LM runs here
    path = bench.write_json(args.out, report)
    return {**report, "path": str(path)}


def startup_markdown(report: dict, markdown: bool = True) -> str:
    from optim.bench.markdown import stated, table

    rows = [[name, f"{f['median']:.2f}", f"{f['min']:.2f}-{f['max']:.2f}",
             "-" if f["target"] is None else f"<= {f['target']:.1f}", "-" if f["met"] is None else f["met"]]
            for name, f in report["targets"].items()]
    header = report["header"]
    return "\n".join([stated(header, markdown), "", f"{header['measured']}; load average (1 min) at the start: "
                      f"{header['load_average']}", "",
                      table(["fresh process", f"median s ({header['n']} runs)", "min-max s", "target s",
                             "met"], rows, markdown)])


def add_parser(sub, common_out: Path) -> None:
    st = sub.add_parser("startup", help="seconds to import dspy, import chateval_dspy and run chateval --help, "
                                        "each in fresh processes, beside the targets (no LM)")
    st.add_argument("--runs", type=int, default=5, help="runs per command (default 5)")
    st.add_argument("--only", metavar="NAME,...", help=f"some of: {', '.join(TARGETS)} (default: all)")
    st.add_argument("--raw", default=str(bench.RAW_DIR / "startup.jsonl"),
                    help="each run's seconds, appended as measured; a rerun measures only the runs missing")
    st.add_argument("--out", default=str(common_out / "startup.json"))
    st.add_argument("--markdown", action="store_true", help="print Markdown tables (default: plain text)")
