"""Peak memory of a Bi-NAC run on this machine: the actor and the critic (two learners), their
vLLM engines and the reference actor, as the run's own sampler sees the node (used memory,
MemTotal - MemAvailable, every second). Run it with the machine to itself: every process
on it counts.

    .venv/bin/python benchmarks/bench_binac_memory.py --config pipelines/configs/expansion.yaml \\
        --steps 4 [--preset binac] [key=value ...]

Prints, per step: the node's peak used memory since the previous step, the learner's and
the actor engine's peak RSS, and the step's seconds (rollout, train); then the run's peak.
"""
from __future__ import annotations

import sys

from common import config_args, run_pipeline


def main() -> int:
    ap = config_args(__doc__, steps=4)
    ap.add_argument("--preset", default="binac")
    a = ap.parse_args()
    rows = run_pipeline(a.config, [f"run.steps={a.steps}", *a.overrides], preset=a.preset)
    print("| step | node used GB (peak) | learner RSS GB | engine RSS GB | s / step | rollout s | train s | trained |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for m in rows:
        who = "actor" if m.get("actor_trained") else "critic" if m.get("critic_trained") else "-"
        print(f"| {m['step'] + 1} | {m['node_memory_peak_gb']:.2f} | {m['learner_peak_rss_gb']:.2f} | "
              f"{m['engine_peak_rss_gb']:.2f} | {m['seconds_step']:.1f} | {m['seconds_rollout']:.1f} | "
              f"{m['seconds_train']:.1f} | {who} |")
    print(f"\nrun peak, node used memory: {max(m['node_memory_peak_gb'] for m in rows):.2f} GB "
          f"({a.preset}, {a.config}, {' '.join(a.overrides)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
