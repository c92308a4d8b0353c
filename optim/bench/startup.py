"""Start-up time: ``import dspy``, ``import chateval_dspy`` and ``chateval --help``, each in fresh interpreters.

Each run is one new process, after one unrecorded warm-up each; the commands take turns, so a busy moment falls on
all of them. Runs are appended to a raw JSONL file as they end: a rerun measures only the runs missing.
``--quick-start`` also runs the README's quick start under ``--load`` busy loops (issue 32). Figures:
benchmarks/startup.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from optim.bench import common as bench

TARGETS = {"import dspy": None, "import chateval_dspy": 1.0, "chateval --help": 0.5}


def command(target: str) -> list[str]:
    """The process one run of ``target`` starts."""
    return [*chateval_command(), "--help"] if target == "chateval --help" else [sys.executable, "-c", target]


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


def chateval_command() -> list[str]:
    """How this interpreter starts ``chateval`` (the installed script where there is one)."""
    script = Path(sys.executable).with_name("chateval")
    return [str(script)] if script.exists() else [sys.executable, "-m", "optim.cli"]


@contextlib.contextmanager
def cpu_load(processes: int) -> Iterator[list[int]]:
    """``processes`` busy-loop Python processes for the block's duration (their pids); each is ended by its pid."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(0, processes))]
    try:
        yield [b.pid for b in busy]
    finally:
        for b in busy:
            b.kill()
            b.wait()


def quick_start_once(limit: int, timeout_s: float) -> dict:
    """One quick start on the embedded model: wall seconds, exit status, items judged and abstained."""
    with tempfile.TemporaryDirectory(prefix="chateval-quick-") as tmp:
        out = Path(tmp) / "results.jsonl"
        argv = [*chateval_command(), "evaluate", "--dataset", "faireval", "--limit", str(limit), "--no-mlflow",
                "--no-progress", "--no-cache", "--out", str(out)]
        env = {**os.environ, "CHATEVAL_CACHE_DIR": str(Path(tmp) / "cache")}
        start = time.perf_counter()
        try:
            done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
            code, err = done.returncode, done.stderr
        except subprocess.TimeoutExpired:
            code, err = None, f"still running after {timeout_s:.0f} s"
        seconds = time.perf_counter() - start
        rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()] if out.exists() else []
    judged = sum(r.get("prediction") is not None for r in rows)
    return {"seconds": seconds, "exit": code, "items": len(rows), "judged": judged,
            "abstained": sum(bool(r.get("abstained")) for r in rows), "per_item": seconds / max(1, limit),
            "finished": code == 0 and len(rows) == limit, "error": None if code == 0 else err.strip()[-400:]}


def quick_start(limit: int, load: int, timeout_s: float, raw: Path) -> dict:
    """The quick start on the machine as it is, then under ``load`` busy processes, one run each. Each run is appended
    to ``raw`` as it ends; a rerun with the same limit and load measures only the runs missing."""
    have = {}
    if raw.exists():
        for line in raw.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row.get("limit") == limit and row.get("load_processes") == load:
                have[row["machine"]] = row
    for machine, busy in (("idle", 0), ("loaded", load)):
        if machine in have:
            continue
        with cpu_load(busy):
            if busy:
                time.sleep(5)  # let the load average see the busy processes
            before = round(os.getloadavg()[0], 2)
            have[machine] = {"machine": machine, "limit": limit, "load_processes": load, "load_average_before": before,
                             **quick_start_once(limit, timeout_s)}
        raw.parent.mkdir(parents=True, exist_ok=True)
        with raw.open("a", encoding="utf-8") as out:
            out.write(json.dumps(have[machine]) + "\n")
    return {"limit": limit, "load_processes": load, "cores": os.cpu_count(), "idle": have["idle"],
            "loaded": have["loaded"]}


def run_startup(args) -> dict:
    targets = [t for t in TARGETS if args.only is None or t in args.only.split(",")]
    raw = Path(args.raw)
    got = measure(raw, targets, args.runs)
    report = {"targets": {t: figures(got[t], TARGETS[t]) for t in targets}, "raw": str(raw)}
    if args.quick_start:
        report["quick_start"] = quick_start(args.limit, args.load, args.quick_timeout, Path(args.quick_raw))
    quick = {"model": "none for the imports; the quick start: embedded (Gemma 3 270M Q4_K_M)",
             "data": f"none for the imports; the quick start: FairEval, its first {args.limit} item(s)",
             "split": "- (the quick start: FairEval's file order)"} if args.quick_start else {}
    report["header"] = bench.header(args, suite="startup", **{"model": "none (no LM is called)", "data": "none",
                                                              "split": "-", **quick},
                                    n=args.runs, load_average=round(os.getloadavg()[0], 2),
                                    measured="wall seconds from process start to exit, one warm-up run each first")
    report["header"].pop("lm_threads")  # no LM runs here
    return bench.write_report(args.out, report)


def startup_markdown(report: dict, markdown: bool = True) -> str:
    from optim.bench.markdown import stated, table

    rows = [[name, f"{f['median']:.2f}", f"{f['min']:.2f}-{f['max']:.2f}",
             "-" if f["target"] is None else f"<= {f['target']:.1f}", "-" if f["met"] is None else f["met"]]
            for name, f in report["targets"].items()]
    header = report["header"]
    text = "\n".join([stated(header, markdown), "", f"{header['measured']}; load average (1 min) at the start: "
                      f"{header['load_average']}", "",
                      table(["fresh process", f"median s ({header['n']} runs)", "min-max s", "target s",
                             "met"], rows, markdown)])
    quick = report.get("quick_start")
    return text if quick is None else text + "\n\n" + quick_start_markdown(quick, markdown)


def quick_start_markdown(quick: dict, markdown: bool = True) -> str:
    """The quick start's two runs side by side: idle and under the stated load."""
    from optim.bench.markdown import table

    rows = [[f"{name} ({quick['load_processes']} busy processes on {quick['cores']} cores)" if name == "loaded"
             else "as it is (no added load)", f"{run['load_average_before']}", f"{run['seconds']:.1f}",
             f"{run['per_item']:.1f}", run["exit"], f"{run['judged']} of {quick['limit']}", run["abstained"],
             run["finished"]]
            for name, run in (("idle", quick["idle"]), ("loaded", quick["loaded"]))]
    return "\n".join([f"quick start: `chateval evaluate --dataset faireval --limit {quick['limit']}` on the embedded "
                      "model (Gemma 3 270M Q4_K_M), FairEval's first items, DSPy cache off, one run each", "",
                      table(["machine", "load avg (1 min) before", "wall s", "s per item", "exit", "judged",
                             "abstained", "finished"], rows, markdown)])


def add_parser(sub) -> None:
    st = sub.add_parser("startup", help="seconds to import dspy, import chateval_dspy and run chateval --help, "
                                        "each in fresh processes, beside the targets (no LM)")
    st.add_argument("--runs", type=int, default=5, help="runs per command (default 5)")
    st.add_argument("--only", metavar="NAME,...", help=f"some of: {', '.join(TARGETS)} (default: all)")
    st.add_argument("--raw", default=str(bench.RAW_DIR / "startup.jsonl"),
                    help="each run's seconds, appended as measured; a rerun measures only the runs missing")
    st.add_argument("--out", default=str(bench.BENCH_DIR / "startup.json"))
    bench.markdown_flag(st)
    st.add_argument("--quick-start", action="store_true",
                    help="also run the quick start on the embedded model idle and under --load (minutes)")
    st.add_argument("--limit", type=int, default=2, help="items of the quick start (default 2)")
    st.add_argument("--load", type=int, default=8, help="busy-loop processes of the loaded quick start (default 8)")
    st.add_argument("--quick-timeout", type=float, default=3600.0,
                    help="seconds after which a quick start counts as not finished (default 3600)")
    st.add_argument("--quick-raw", default=str(bench.RAW_DIR / "startup_quick.jsonl"),
                    help="each quick start run, appended as measured; a rerun measures only the runs missing")
