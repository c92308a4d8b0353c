"""``python -m optim.bench latency``: verdict latency of ``chateval serve`` at a stated request rate.

The real app runs under uvicorn on 127.0.0.1, its LM the scripted fake LM with a fixed time per call. Requests are
sent open loop on a seeded schedule, and a latency runs from the request's scheduled time, so a server that falls
behind cannot hide its queue. Figures: benchmarks/latency.md.
"""

from __future__ import annotations

import contextlib
import math
import random
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from chateval_dspy.config import DebateConfig
from chateval_dspy.errors import ConfigError
from chateval_dspy.program.critical_path import critical_path
from optim.bench.common import BENCH_DIR, header, write_report

# The default panel (2 referees, 2 rounds, one_by_one, both orders) and the single judge, both calibrated.
PANELS = {"panel": DebateConfig(), "single": DebateConfig(roles=("general_public",), turns=1)}
MAX_SENDERS = 64  # client threads; a request due while all are busy waits, and its wait is counted


def schedule(n: int, rate: float, *, arrivals: str = "poisson", seed: int = 0) -> list[float]:
    """When each of ``n`` requests is due, in seconds from the start: fixed spacing or a seeded Poisson process.

    Example:
        >>> schedule(3, 2.0, arrivals="fixed")
        [0.0, 0.5, 1.0]
        >>> len(schedule(5, 1.0, seed=1)), schedule(5, 1.0, seed=1) == schedule(5, 1.0, seed=1)
        (5, True)
    """
    if arrivals == "fixed":
        return [i / rate for i in range(n)]
    if arrivals != "poisson":
        raise ValueError(f"unknown arrivals {arrivals!r}; choose one of: poisson, fixed")
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        out.append(round(t, 4))
        t += rng.expovariate(rate)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(judge, **app_options) -> Iterator[str]:
    """``chateval serve``'s app over ``judge``, under uvicorn in a thread on 127.0.0.1; yields its base URL."""
    import uvicorn

    from chateval_dspy.deploy.serving.http import create_app

    port = _free_port()
    # log_config=None: uvicorn's own logging setup would replace (and close) the handlers already installed.
    server = uvicorn.Server(uvicorn.Config(create_app(judge, **app_options), host="127.0.0.1", port=port,
                                           log_level="error", log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        server.should_exit = True
        raise RuntimeError(f"the server on port {port} did not start within 10 s")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def send_open_loop(url: str, payloads: list[dict], due: list[float], *, timeout: float = 120.0) -> list[dict]:
    """POST each payload to ``/evaluate`` at its due time, whatever the earlier ones are doing.

    Returns per request ``status`` (None: no response), ``seconds`` (due time to response) and the
    server's own ``judge_seconds`` for the item (``Verdict.seconds``) and ``calls``.
    """
    import httpx

    out: list[dict] = [{} for _ in payloads]
    limits = httpx.Limits(max_connections=len(payloads), max_keepalive_connections=len(payloads))
    with httpx.Client(base_url=url, timeout=timeout, limits=limits) as client, \
            ThreadPoolExecutor(min(MAX_SENDERS, len(payloads))) as pool:
        start = time.perf_counter()

        def send(i: int) -> None:
            try:
                response = client.post("/evaluate", json=payloads[i])
                body = response.json() if response.status_code == 200 else {}
                out[i] = {"status": response.status_code, "judge_seconds": body.get("seconds"),
                          "calls": body.get("calls")}
            except httpx.HTTPError as exc:
                out[i] = {"status": None, "error": f"{type(exc).__name__}: {exc}"[:200]}
            out[i]["seconds"] = round(time.perf_counter() - (start + due[i]), 4)

        futures = []
        for i, at in enumerate(due):
            wait = start + at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            futures.append(pool.submit(send, i))
        for f in futures:
            f.result()
    return out


def latency_figures(seconds: list[float], *, seed: int = 0) -> dict:
    """p50, p95, max and mean of ``seconds``; p50 and p95 with a 95% percentile-bootstrap CI (none under 3).

    Example:
        >>> f = latency_figures([0.4, 0.5, 0.6, 0.7, 1.0])
        >>> f["p50"]["value"], f["max"], f["p95"]["ci_low"] <= f["p95"]["value"] <= f["p95"]["ci_high"]
        (0.6, 1.0, True)
    """
    from chateval_dspy.run.metrics import bootstrap

    if not seconds:
        none = {"value": math.nan, "ci_low": math.nan, "ci_high": math.nan, "n": 0}
        return {"p50": none, "p95": none, "max": math.nan, "mean": math.nan}

    def at(q: float):
        return lambda x: float(np.percentile(np.asarray(x, dtype=float), q))

    return {"p50": bootstrap(at(50), seconds, seed=seed).to_dict(), "p95": bootstrap(at(95), seconds, seed=seed).to_dict(),
            "max": max(seconds), "mean": float(np.mean(seconds))}


def measure(name: str, config: DebateConfig, *, parallel_orders: bool, payloads: list[dict], due: list[float],
            per_call: float, queue: int, seed: int = 0) -> dict:
    """One row: a fresh judge on the fake LM, served, warmed with one request, then loaded on the schedule."""
    from chateval_dspy.deploy.saved.card import make_card
    from chateval_dspy.deploy.saved.judge import Judge
    from chateval_dspy.program.chateval import ChatEval
    from chateval_dspy.testing.fake_lm import fake_lm

    program = ChatEval(config, parallel_orders=parallel_orders)
    lm = fake_lm(latency=per_call)
    judge = Judge(program, make_card(program, model=lm.model), lm, contextlib.ExitStack())
    with served(judge, queue=queue) as url:
        # The first verdict renders and memoises every prompt template; a long-running server has paid that.
        send_open_loop(url, payloads[:1], [0.0])
        sent = send_open_loop(url, payloads, due)
    ok = [r for r in sent if r["status"] == 200]
    path = critical_path(config, parallel_orders=parallel_orders)
    return {
        "name": name, "config": config.changes(), "parallel_orders": parallel_orders,
        "critical_path": path, "floor_seconds": round(path["chain"] * per_call, 4),
        "sent": len(sent), "ok": len(ok), "rejected": sum(r["status"] == 503 for r in sent),
        "failed": sum(r["status"] not in (200, 503) for r in sent),
        "calls_seen": sorted({r["calls"] for r in ok}),
        "judge_p50": float(np.percentile([r["judge_seconds"] for r in ok], 50)) if ok else math.nan,
        **latency_figures([r["seconds"] for r in ok], seed=seed),
    }


def faireval_payloads(n: int) -> list[dict]:
    """``n`` request bodies, FairEval's items in order (repeated when ``n`` is larger than the set)."""
    from chateval_dspy.data.loaders import load_dataset

    items, _ = load_dataset("faireval")
    rows = [{"id": str(x.id), "question": x.question, "answer_1": x.answer_1, "answer_2": x.answer_2} for x in items]
    return [dict(rows[i % len(rows)], id=f"{rows[i % len(rows)]['id']}#{i}") for i in range(n)]


def run_latency(args) -> dict:
    """Every panel in ``args.panels`` with its orders in parallel and, unless ``args.parallel_only``, in sequence."""
    if args.requests < 1 or not args.rate > 0 or not args.fake_latency >= 0 or args.queue < 1:
        raise ConfigError("--requests and --queue must be positive, --rate above 0 and --fake-latency at least 0")
    due = schedule(args.requests, args.rate, arrivals=args.arrivals, seed=args.seed)
    payloads = faireval_payloads(args.requests)
    rows = []
    for name in args.panels.split(","):
        if name not in PANELS:
            raise ConfigError(f"unknown panel {name!r}; choose from: {', '.join(PANELS)}")
        for parallel in (True,) if args.parallel_only else (True, False):
            rows.append(measure(name, PANELS[name], parallel_orders=parallel, payloads=payloads, due=due,
                                per_call=args.fake_latency, queue=args.queue, seed=args.seed))
    model = f"fake LM, {args.fake_latency * 1000:g} ms per call"
    head = header(args, suite="latency", model=model, data="FairEval (requests cycle through its items)",
                  split="all", n=args.requests, rate_per_s=args.rate, arrivals=args.arrivals, seed=args.seed,
                  per_call_seconds=args.fake_latency, queue=args.queue, server="chateval serve app (uvicorn, "
                  "127.0.0.1, in-process), one item per request")
    return write_report(args.out or BENCH_DIR / "latency.json", {"header": head, "rows": rows})


def latency_markdown(report: dict, markdown: bool = True) -> str:
    """The suite's table: p50/p95/max verdict latency beside the critical path's floor."""
    from optim.bench.markdown import stated, table
    from optim.bench.stats import fmt_est

    h = report["header"]
    out = [stated(h, markdown), "",
           f"Open-loop {h['arrivals']} arrivals at {h['rate_per_s']:g} request/s, {h['n']} requests per row "
           f"(plus one warm-up, not counted), queue {h['queue']}. Latency runs from a request's scheduled time "
           "to its response, in seconds, with 95% bootstrap CIs. Critical path: the longest chain of dependent "
           "LM calls (parse retries not counted); floor = chain x per-call latency.", ""]
    rows = [[r["name"], "parallel" if r["parallel_orders"] else "sequential", r["critical_path"]["calls"],
             r["critical_path"]["chain"], f"{r['floor_seconds']:.2f}", fmt_est(r["p50"], digits=2),
             fmt_est(r["p95"], digits=2), f"{r['max']:.2f}", f"{r['ok']}/{r['sent']}"] for r in report["rows"]]
    out.append(table(["panel", "answer orders", "LM calls", "critical path (calls)", "floor (s)",
                      "p50 (s) [95% CI]", "p95 (s) [95% CI]", "max (s)", "answered"], rows, markdown))
    return "\n".join(out)
