"""The ``simulate`` suite's entry: run the sections, write the figures JSON and plots, print the tables."""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from optim.bench import common as bench
from optim.bench.simulate import SECTIONS, budget_from, run_sections
from optim.bench.simulate.report import markdown, plots


def run_simulate(args) -> int:
    """``python -m optim.bench simulate ...``; returns the exit status."""
    sections = SECTIONS if args.sections == "all" else tuple(s.strip() for s in args.sections.split(",") if s.strip())
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown or (args.seeds is not None and args.seeds < 1):
        print(f"bench: error: sections must be among {', '.join(SECTIONS)} and --seeds positive", file=sys.stderr)
        return 2
    budget = budget_from(args.smoke, args.seeds)
    bench.isolate_cache()
    start = time.perf_counter()
    results = run_sections(budget, sections, no_signal=args.no_signal,
                           progress=lambda line: print(f"simulate: {line}", file=sys.stderr, flush=True))
    wall = time.perf_counter() - start
    name = "simulate-no-signal.json" if args.no_signal else "simulate.json"
    default = (Path(tempfile.mkdtemp(prefix="chateval-simulate-")) if args.smoke else bench.BENCH_DIR) / name
    out = Path(args.out) if args.out else default
    header = bench.header(args, suite="simulate", model="simulated referees (chateval_dspy.testing.sim_lm)"
                          + (", every knob at no signal" if args.no_signal else ""),
                          data="synthetic pairwise items, balanced labels (1/2, no ties)", split="per section",
                          n=budget.items, seeds=budget.seeds, wall_seconds=wall, budget=asdict(budget))
    report = {"header": header, "sections": results}
    path = bench.write_json(out, report)
    drawn = plots(report, Path(args.plots) if args.plots else path.parent,
                  prefix="simulate-no-signal" if args.no_signal else "simulate")
    print(markdown(report, markdown=args.markdown))
    print(f"figures: {path}", file=sys.stderr)
    for p in drawn:
        print(f"plot: {p}", file=sys.stderr)
    return 0
