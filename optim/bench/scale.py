"""Scale-out throughput: verdicts per second of ``chateval score --concurrency N`` beside Ray Data and Spark scoring
with the same N items in flight, and what a SIGKILLed Ray job pays again when it is rerun.

The LM is ``FakeOpenAIServer`` answering after a fixed delay, so the figures measure orchestration, not a model;
"repeated" is the LM calls beyond what the final verdicts needed. Method and figures: benchmarks/scale.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from chateval_dspy.config import DebateConfig
from chateval_dspy.data.loaders import load_dataset
from chateval_dspy.data.splits import select
from chateval_dspy.deploy.saved.card import make_card
from chateval_dspy.deploy.saved.store import save_program
from chateval_dspy.deploy.scale.parts import part_files, read_results
from chateval_dspy.program.chateval import build_evaluator
from chateval_dspy.testing.fake_server import FakeOpenAIServer
from optim.bench import common as bench

# A Ray scoring job in a process of its own (the kill target): argv = evaluator, out, url, items JSON, actors,
# items in flight per actor, batch size.
RAY_JOB = """
import json, sys
from chateval_dspy.lm.offline import ensure_offline
ensure_offline()
import pandas as pd, ray
from chateval_dspy.deploy.scale.ray import score_dataset
evaluator, out, url, items, actors, per_actor, batch = sys.argv[1:8]
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
ds = ray.data.from_pandas(pd.DataFrame(json.loads(items)))
report = score_dataset(ds, evaluator, out=out, model=url, actors=int(actors), concurrency=int(per_actor),
                       batch_size=int(batch), cache=False)
print(json.dumps(report.to_dict()))
"""

# The same for Spark local[2]: argv = evaluator, out, url, items JSON, items in flight per task.
SPARK_JOB = """
import json, os, sys
from chateval_dspy.lm.offline import ensure_offline
ensure_offline()
import pandas as pd
from pyspark.sql import SparkSession
from chateval_dspy.deploy.scale.spark import score_spark
evaluator, out, url, items, per_task = sys.argv[1:6]
os.environ["PYSPARK_PYTHON"] = sys.executable
spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
df = spark.createDataFrame(pd.DataFrame(json.loads(items))).repartition(2)
print(json.dumps(score_spark(df, evaluator, out=out, model=url, concurrency=int(per_task), cache=False).to_dict()))
"""


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, from /proc (Linux): a Ray job's raylet, workers and actors."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    out, todo = [], [pid]
    while todo:
        above = todo.pop()
        children = [p for p, parent in parents.items() if parent == above]
        out += children
        todo += children
    return out


def kill_tree(job: subprocess.Popen) -> None:
    """SIGKILL ``job`` (started with ``start_new_session=True``) and every process below it, each by its pid."""
    below = descendants(job.pid)
    os.killpg(job.pid, signal.SIGKILL)
    for pid in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    job.wait(timeout=30)


def verdict_lines(out: Path) -> dict[str, int]:
    """How many verdict lines each id has across the part files of ``out``."""
    counts: Counter[str] = Counter()
    for part in part_files(out):
        for line in part.read_text(encoding="utf-8").splitlines():
            try:  # read while the job writes: a torn line is not yet a verdict
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and not record.get("error"):
                counts[record["id"]] += 1
    return dict(counts)


def start_ray_job(saved: str, out: Path, url: str, rows: list[dict], *, actors: int, per_actor: int,
                  batch: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", RAY_JOB, saved, str(out), url, json.dumps(rows), str(actors),
                             str(per_actor), str(batch)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def start_spark_job(saved: str, out: Path, url: str, rows: list[dict], *, per_task: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SPARK_JOB, saved, str(out), url, json.dumps(rows), str(per_task)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def kill_when_written(job: subprocess.Popen, out: Path, lines: int, timeout: float = 180) -> int:
    """Wait until ``out`` holds ``lines`` verdicts (or the job ends, or ``timeout``), then kill the job; lines then."""
    deadline = time.monotonic() + timeout
    try:
        while sum(verdict_lines(out).values()) < lines and job.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        kill_tree(job)
    return sum(verdict_lines(out).values())


def _rows(limit: int, seed: int, repeat: int = 1) -> list[dict]:
    """The test items, each ``repeat`` times under ids ``<id>.<k>`` (a longer job on the same texts)."""
    items, _ = load_dataset("faireval")
    chosen = [{k: x[k] for k in ("question", "answer_1", "answer_2")} | {"id": str(x["id"])}
              for x in select(items, "test", seed=seed, limit=limit)]
    if repeat == 1:
        return chosen
    return [{**x, "id": f"{x['id']}.{k}"} for k in range(repeat) for x in chosen]


def _time_cli(saved: str, rows: list[dict], workdir: Path, url: str, n: int) -> float:
    src, out = workdir / "items.jsonl", workdir / "score.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "optim.cli.main", "score", saved, "--in", str(src), "--out", str(out),
                    "--model", url, "--concurrency", str(n), "--no-progress", "--no-trace", "--no-cache"],
                   check=True, capture_output=True)
    return time.perf_counter() - start


def _time_ray(ray, saved: str, rows: list[dict], out: Path, url: str, actors: int, per_actor: int) -> float:
    import pandas as pd

    from chateval_dspy.deploy.scale.ray import score_dataset

    frame = pd.DataFrame(rows)
    blocks = [frame.iloc[i::actors] for i in range(actors)]  # a block per actor: one block would feed one actor
    start = time.perf_counter()
    score_dataset(ray.data.from_pandas(blocks), saved, out=str(out), model=url, actors=actors,
                  concurrency=per_actor, batch_size=-(-len(rows) // actors), cache=False,
                  ray_remote_args={"num_cpus": 1})
    return time.perf_counter() - start


def _time_spark(spark, saved: str, rows: list[dict], out: Path, url: str, per_task: int) -> float:
    import pandas as pd

    from chateval_dspy.deploy.scale.spark import score_spark

    df = spark.createDataFrame(pd.DataFrame(rows)).repartition(2)
    start = time.perf_counter()
    score_spark(df, saved, out=str(out), model=url, concurrency=per_task, cache=False)
    return time.perf_counter() - start


def _kill_rerun(ray, saved: str, rows: list[dict], workdir: Path, url: str, server, actors: int, per_actor: int) -> dict:
    import pandas as pd

    from chateval_dspy.deploy.scale.ray import score_dataset

    out = workdir / "killed"
    server.requests.clear()
    batch = max(1, len(rows) // (2 * actors))
    job = start_ray_job(saved, out, url, rows, actors=actors, per_actor=per_actor, batch=batch)
    written = kill_when_written(job, out, max(1, len(rows) // 3))
    report = score_dataset(ray.data.from_pandas(pd.DataFrame(rows)), saved, out=str(out), model=url, actors=actors,
                           concurrency=per_actor, batch_size=batch, cache=False)
    results = read_results(out)
    per_item = int(results["calls"].max())
    return {"written_at_kill": written, "rerun_scored": report.scored, "calls": len(server.requests),
            "calls_needed": int(results["calls"].sum()), "repeated": len(server.requests) - int(results["calls"].sum()),
            "one_partition_in_flight_calls": per_actor * per_item, "job_in_flight_calls": actors * per_actor * per_item,
            "one_verdict_each": verdict_lines(out) == dict.fromkeys(map(str, results["id"]), 1)}


def _measure(args, workdir: Path, saved: str, rows: list[dict]) -> dict:
    import ray

    n, actors = args.concurrency, 2
    per = max(1, n // actors)
    server = FakeOpenAIServer(delay=args.delay)
    with server as url:
        seconds = {"score": _time_cli(saved, rows, workdir, url, n)}
        start = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            started = {"ray": time.perf_counter() - start}
            seconds["ray"] = _time_ray(ray, saved, rows, workdir / "ray", url, actors, per)
            kill = _kill_rerun(ray, saved, rows, workdir, url, server, actors, per)
        finally:
            ray.shutdown()
        start = time.perf_counter()
        from pyspark.sql import SparkSession

        os.environ["PYSPARK_PYTHON"] = sys.executable
        spark = (SparkSession.builder.master("local[2]").appName("chateval-bench-scale")
                 .config("spark.ui.enabled", "false").config("spark.local.dir", str(workdir / "spark")).getOrCreate())
        try:
            started["spark"] = time.perf_counter() - start
            seconds["spark"] = _time_spark(spark, saved, rows, workdir / "spark-out", url, per)
        finally:
            spark.stop()
    return {"seconds": seconds, "startup_seconds": started, "kill": kill, "in_flight": n, "actors": actors,
            "per_worker": per}


def run_scale(args) -> dict:
    bench.isolate_cache()
    workdir = Path(tempfile.mkdtemp(prefix="chateval-bench-scale-"))
    cfg = DebateConfig() if args.panel == "default" else DebateConfig(roles=("critic",), turns=1)
    program = build_evaluator(cfg)
    saved = str(save_program(program, workdir / "evaluator", make_card(program, model="openai-compatible/fake-served")))
    rows = _rows(args.limit, args.seed, args.repeat)
    got = _measure(args, workdir, saved, rows)
    rate = {k: len(rows) / s for k, s in got["seconds"].items()}
    report = {**got, "verdicts_per_second": rate, "ratio_to_score": {k: rate[k] / rate["score"] for k in ("ray", "spark")}}
    report["header"] = bench.header(args, suite="scale", model=f"FakeOpenAIServer, {args.delay * 1000:.0f} ms per call",
                                    data="faireval", n=len(rows),
                                    split=f"test (seed {args.seed})" + (f", {args.limit} items x {args.repeat}"
                                                                        if args.repeat > 1 else ""),
                                    panel=f"{args.panel}: {', '.join(cfg.roles)}, {cfg.turns} turn(s)",
                                    in_flight=f"{args.concurrency} items (score --concurrency {args.concurrency}; Ray "
                                              f"{got['actors']} actors x {got['per_worker']}; Spark local[2] x "
                                              f"{got['per_worker']})")
    return bench.write_report(args.out, report)


def scale_markdown(report: dict, markdown: bool = True) -> str:
    from optim.bench.markdown import stated, table

    secs, rate, start = report["seconds"], report["verdicts_per_second"], report["startup_seconds"]
    body = [["chateval score (CLI)", f"{secs['score']:.1f}", f"{rate['score']:.2f}", "1.00", "-"]]
    body += [[name, f"{secs[key]:.1f}", f"{rate[key]:.2f}", f"{report['ratio_to_score'][key]:.2f}",
              f"{start[key]:.1f}"] for key, name in (("ray", "Ray Data"), ("spark", "Spark local[2]"))]
    kill = report["kill"]
    lines = [stated(report["header"], markdown), "",
             f"panel: {report['header']['panel']}; in flight: {report['header']['in_flight']}", "",
             table(["runner", "seconds", "verdicts/s", "x score (target >= 0.8)", "cluster start s (not counted)"],
                   body, markdown), "",
             table(["Ray job SIGKILLed at", "rerun scored", "LM calls", "calls needed", "repeated",
                    "target: <= one partition in flight", "whole job in flight", "one verdict per item"],
                   [[f"{kill['written_at_kill']} verdicts", kill["rerun_scored"], kill["calls"], kill["calls_needed"],
                     kill["repeated"], kill["one_partition_in_flight_calls"], kill["job_in_flight_calls"],
                     kill["one_verdict_each"]]], markdown)]
    return "\n".join(lines)


def add_parser(sub) -> None:
    sc = sub.add_parser("scale", help="verdicts/s of chateval score vs Ray vs Spark, and a killed Ray job's repeats "
                                      "(fake LM with a fixed delay)")
    sc.add_argument("--limit", type=int, default=24, help="FairEval test items (default 24)")
    sc.add_argument("--seed", type=int, default=0)
    sc.add_argument("--repeat", type=int, default=1,
                    help="judge each item this many times under its own id: a longer job on the same texts")
    sc.add_argument("--concurrency", type=int, default=8, help="items in flight in every runner (default 8)")
    sc.add_argument("--delay", type=float, default=0.2, help="seconds per call of the fake LM (default 0.2)")
    sc.add_argument("--panel", default="small", choices=["small", "default"],
                    help="small: one critic, one turn (default); default: the default panel")
    sc.add_argument("--out", default=str(bench.BENCH_DIR / "scale.json"))
    bench.markdown_flag(sc)
