"""Workers' niceness (the engines', and the embedded Ray's) on bench_compare's grpo_single step.

    .venv/bin/python benchmarks/bench_nice.py [--model smollm2] [--steps 4] [--repeats 1] [--variants ...]

Ray starts every worker at niceness 15, below its own daemons (GCS, raylet, dashboard and
its agent, log monitor: 0). On a CPU node the engine's OpenMP threads then wait on the run
queue whenever a daemon wakes (docs/benchmarks.md). Variants, run one after
another (interleaved when repeated), each a fresh `pipelines/run.py` process:

ray15     every worker at Ray's default, 15 (rltf_ray's default: engine.nice unset)
engine0   the engines level with Ray's daemons, the other workers at 15 (engine.nice=0)
all0      every worker level with the daemons (RAY_worker_niceness=0 for the embedded Ray)

Two rounds of one run per variant disagreed (docs/benchmarks.md: the machine drifted by more
than any variant's effect): run it with --repeats, and read the spread before the means."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_compare import bench_pipeline, parse_sized, runs_table, sized_parser  # noqa: E402
from common import choose, mean  # noqa: E402

VARIANTS = {"ray15": ({}, []), "engine0": ({}, ["engine.nice=0"]),
            "all0": ({"RAY_worker_niceness": "0"}, [])}


def main() -> int:
    ap = sized_parser(__doc__, steps=4)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = parse_sized(ap)
    names = choose(ap, "--variants", a.variants, VARIANTS)
    base = list(a.overrides)
    rows = []
    for r in range(a.repeats):
        for name in names:
            env, over = VARIANTS[name]
            a.overrides = base + over
            got = bench_pipeline(a.model, "grpo_single", a, f"nice_{name}", env=env)
            rows.append((name, r, got))
            print(f"{name} #{r}: rollout {mean(got, 'seconds_rollout'):.1f} s", flush=True)
    a.overrides = base
    print(runs_table(a, "variant (run)", [(f"{name} ({r})", got) for name, r, got in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
