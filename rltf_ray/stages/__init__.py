"""Pipeline stages. Each is a Ray Data `map_batches` function over Arrow batches that reads
and writes the columns its node kind declares (`rltf_ray.graph.columns`)."""
from __future__ import annotations

from typing import Callable

import pyarrow as pa

from rltf_ray.graph import columns


class StageError(RuntimeError):
    pass


def arrow_stage(kind: str, node: str, fn: Callable[[list[dict]], list[dict]], round: int = 1):
    """Wrap a row-list function as an Arrow batch function that enforces the column contract."""
    reads, writes = columns(kind, round)

    def run(batch: pa.Table) -> pa.Table:
        missing = [c for c in reads if c not in batch.column_names]
        if missing:
            raise StageError(f"node '{node}' ({kind}): input batch lacks columns {missing}")
        rows = fn(batch.to_pylist())
        for r in rows[:1]:
            absent = [c for c in writes if c not in r]
            if absent:
                raise StageError(f"node '{node}' ({kind}): stage did not write columns {absent}")
        return pa.Table.from_pylist(rows)

    return run
