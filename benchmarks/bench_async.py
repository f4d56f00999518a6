"""Asynchronous overlap (run.max_staleness) against the synchronous loop, same prompts.

    .venv/bin/python benchmarks/bench_async.py [--config pipelines/configs/tiny.yaml] [--steps 6] [--cluster] [key=value ...]

Runs the real pipeline once per staleness k in {0, 1} and prints the throughput (seconds
between finished steps, after the first step) and the engines' version lag. On one machine
the engines and the learner share its cores, so overlap can only hide idle time. The last
column models a cluster where they have their own nodes: a k = 1 step then costs
max(rollout, train + sync) instead of their sum, from the k = 0 run's own timings.

--cluster measures that case instead of modelling it: each run gets a fresh
`ray.cluster_utils.Cluster` of three Ray nodes on this machine, a head (the driver, Serve,
Ray Data's tasks; every core) and two worker nodes whose raylets, and so every worker they
start, are pinned to disjoint halves of the cores: the engine node (resource `engine_node`)
and the learner node (`learner_node`, one training worker). Weights cross between the
nodes' object stores as on a real cluster. On 2 cores each side has one core."""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager, nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import config_args, mean, run_pipeline  # noqa: E402


def halves() -> tuple[list[int], list[int]]:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("--cluster needs at least 2 cores: one for the engine node, one for the learner node")
    return cores[:len(cores) // 2], cores[len(cores) // 2:]


def cluster_overrides() -> list[str]:
    engine, learner = halves()
    return ["engine.num_engines=1", "engine.resources={engine_node: 1}",
            f"engine.cpu_threads_bind='{','.join(map(str, engine))}'",
            "trainer.num_workers=1", "trainer.resources={learner_node: 1}",
            f"trainer.cpu_threads_per_worker={len(learner)}"]


@contextmanager
def pinned_cluster(object_store_gib: float = 2.0):
    """A three-node Ray on this machine; yields its address for the pipeline's RAY_ADDRESS."""
    from ray.cluster_utils import Cluster

    from rltf_ray.ray_start import apply_embedded_ray_env

    apply_embedded_ray_env()  # the nodes' processes inherit it, as an embedded Ray's do
    store = int(object_store_gib * 2**30)
    every = os.sched_getaffinity(0)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 8, "object_store_memory": store})
    try:
        for cores, resource in zip(halves(), ("engine_node", "learner_node")):
            # affinity is inherited through fork and exec: the raylet, its agents and workers
            os.sched_setaffinity(0, cores)
            try:
                cluster.add_node(num_cpus=1, resources={resource: 1}, object_store_memory=store)
            finally:
                os.sched_setaffinity(0, every)
        yield cluster.address
    finally:
        cluster.shutdown()


def main() -> int:
    ap = config_args(__doc__, steps=6)
    ap.add_argument("--cluster", action="store_true", help="measure on a pinned three-node Ray (see above)")
    a = ap.parse_args()
    extra = cluster_overrides() if a.cluster else []
    runs = {}
    for k in (0, 1):
        with pinned_cluster() if a.cluster else nullcontext() as address:
            runs[k] = run_pipeline(a.config, [f"run.steps={a.steps}", f"run.max_staleness={k}", "loss.rollout_cap=2.0",
                                              *extra, *a.overrides], prefix=f"rltf_bench_async_k{k}_",
                                   env={"RAY_ADDRESS": address} if address else None)
    sync = runs[0][1:]
    cluster = sum(max(m["seconds_rollout"], m["seconds_train"] + m["seconds_sync"]) for m in sync) / len(sync)
    serial = sum(m["seconds_rollout"] + m["seconds_train"] + m["seconds_sync"] for m in sync) / len(sync)
    where = "a pinned three-node Ray (engine node and learner node on disjoint cores)" if a.cluster else "one Ray"
    print(f"\nconfig {a.config} {' '.join(extra + a.overrides)}, {a.steps} steps (the first is not counted), {where}")
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
