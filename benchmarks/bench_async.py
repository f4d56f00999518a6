"""Asynchronous overlap (run.max_staleness) against the synchronous loop, same prompts.

    .venv/bin/python benchmarks/bench_async.py [--config pipelines/configs/tiny.yaml] [--steps 6] [key=value ...]

Runs the real pipeline once per staleness k in {0, 1} and prints the throughput (seconds
between finished steps, after the first step) and the engines' version lag. On one machine
the engines and the learner share its cores, so overlap can only hide idle time. The last
column models a cluster where they have their own nodes: a k = 1 step then costs
max(rollout, train + sync) instead of their sum, from the k = 0 run's own timings."""
from __future__ import annotations

import sys

from common import config_args, mean, run_pipeline


def main() -> int:
    a = config_args(__doc__, steps=6).parse_args()
    runs = {k: run_pipeline(a.config, [f"run.steps={a.steps}", f"run.max_staleness={k}", "loss.tis_cap=2.0",
                                       *a.overrides], prefix=f"rltf_bench_async_k{k}_")
            for k in (0, 1)}
    sync = runs[0][1:]
    cluster = sum(max(m["seconds_rollout"], m["seconds_train"] + m["seconds_sync"]) for m in sync) / len(sync)
    serial = sum(m["seconds_rollout"] + m["seconds_train"] + m["seconds_sync"] for m in sync) / len(sync)
    print(f"\nconfig {a.config} {' '.join(a.overrides)}, {a.steps} steps (the first is not counted)")
    print("| max_staleness | s / step (finish to finish) | rollout s | train s | sync s | lag per step "
          "| modelled cluster s / step |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for k, rows in runs.items():
        ends = [m["finished_at"] for m in rows]
        per = (ends[-1] - ends[0]) / (len(ends) - 1)
        r = rows[1:]
        model = f"{cluster:.2f} (vs {serial:.2f} in series)" if k == 1 else "-"
        print(f"| {k} | {per:.2f} | {mean(r, 'seconds_rollout'):.2f} | {mean(r, 'seconds_train'):.2f} | "
              f"{mean(r, 'seconds_sync'):.2f} | {[m['engine_version_lag'] for m in rows]} | {model} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
