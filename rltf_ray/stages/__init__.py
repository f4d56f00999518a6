"""Pipeline stages. Each is a Ray Data `map_batches` function over Arrow batches that reads
and writes the columns its node kind declares (`rltf_ray.graph.columns`)."""
from __future__ import annotations

from typing import Callable

import pyarrow as pa

from rltf_ray.errors import StageFailure
from rltf_ray.graph import columns


class StageError(StageFailure):
    """A stage got or wrote rows it should not have (columns, lengths, a dead engine)."""


class _RowMetrics:
    """Rows in flight per stage, a Ray gauge (`ray_rltf_stage_rows_in_flight`) for watching a
    long step live, tagged with the run (`tracking.run_tag`) and the stage. Each Ray Data
    worker process reports its own (Ray tags it with the worker), so a dashboard sums over
    workers by `run` and `stage`. Ray exports it periodically and keeps
    a value for two report intervals: a worker that Ray stopped between exporting a batch's
    rows and exporting their return leaves that count on view until it ages out. The rows each
    stage finished are therefore counted by the driver (`ray_rltf_stage_rows`,
    rltf_ray.tracking)."""

    def __init__(self):
        self.in_flight: dict[tuple[str, str], int] = {}  # (run, stage) -> rows
        self.gauge = None

    def _ensure(self) -> bool:
        if self.gauge is None:
            try:
                from ray.util.metrics import Gauge

                self.gauge = Gauge("rltf_stage_rows_in_flight", "rltf_ray: rows inside a pipeline stage",
                                   tag_keys=("run", "stage"))
            except Exception:  # outside a Ray worker there is no metrics agent; the stage still runs
                return False
        return True

    def add(self, run: str, node: str, n: int) -> None:
        key = (run, node)  # a worker process may serve the stages of two runs
        self.in_flight[key] = self.in_flight.get(key, 0) + n
        if self._ensure():
            self.gauge.set(self.in_flight[key], tags={"run": run, "stage": node})


ROWS = _RowMetrics()


def arrow_stage(kind: str, node: str, fn: Callable[[list[dict]], list[dict]], round: int = 1, run: str = ""):
    """Wrap a row-list function as an Arrow batch function that enforces the column contract;
    `run` tags its rows-in-flight gauge."""
    reads, writes = columns(kind, round)

    def stage(batch: pa.Table) -> pa.Table:
        missing = [c for c in reads if c not in batch.column_names]
        if missing:
            raise StageError(f"node '{node}' ({kind}): input batch lacks columns {missing}")
        n = batch.num_rows
        ROWS.add(run, node, n)
        try:
            rows = fn(batch.to_pylist())
        except BaseException:
            ROWS.add(run, node, -n)
            raise
        ROWS.add(run, node, -n)
        for r in rows[:1]:
            absent = [c for c in writes if c not in r]
            if absent:
                raise StageError(f"node '{node}' ({kind}): stage did not write columns {absent}")
        return pa.Table.from_pylist(rows)

    return stage


def concat_blocks(tables: list[pa.Table]) -> pa.Table:
    """A step's Ray Data blocks as one table. Each block's types were inferred from its own
    rows, so a list column that is empty in every row of one block (no revision, no learned
    critique there) is list<null> in it and list<string> in another: null promotes to the
    other's type instead of failing the step."""
    return pa.concat_tables(tables, promote_options="permissive")

