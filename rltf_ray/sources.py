"""Prompt rows for each RL step, from a JSONL/Parquet file or the task's generator.

File rows are validated up front (before Ray starts): each needs a non-empty string
`prompt` and a `meta` object (the ground truth the task scores against)."""
from __future__ import annotations

import json
from pathlib import Path

from rltf_ray.config import ConfigError
from rltf_ray.graph import SourceParams
from rltf_ray.tasks import Task


def read_prompt_file(path: str) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"source.path: file not found: {p}")
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        raw = [(i + 1, r) for i, r in enumerate(pq.read_table(p).to_pylist())]
    elif p.suffix in (".jsonl", ".json"):
        raw = []
        for i, line in enumerate(p.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                raw.append((i, json.loads(line)))
            except json.JSONDecodeError as e:
                raise ConfigError(f"{p}:{i}: not valid JSON ({e.msg})") from None
    else:
        raise ConfigError(f"source.path: {p} must end in .jsonl or .parquet")
    rows = []
    for line, r in raw:
        if not isinstance(r, dict):
            raise ConfigError(f"{p}:{line}: a prompt row must be an object")
        prompt, meta = r.get("prompt"), r.get("meta")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ConfigError(f"{p}:{line}: missing or empty 'prompt' string")
        if isinstance(meta, str):
            try:
                meta = json.loads(meta)
            except json.JSONDecodeError:
                raise ConfigError(f"{p}:{line}: 'meta' is a string but not JSON") from None
        if not isinstance(meta, dict):
            raise ConfigError(f"{p}:{line}: missing 'meta' object (the ground truth)")
        rows.append({"prompt_id": str(r.get("prompt_id", f"row-{line}")), "prompt": prompt,
                     "meta": json.dumps(meta, sort_keys=True)})
    if not rows:
        raise ConfigError(f"{p}: no prompt rows")
    return rows


SEED_STRIDE = 100_000  # generator problems per seed before two seeds' streams meet


class PromptSource:
    """The step's prompts. Runs with the same `seed` see the same prompts in the same order
    (what pipelines/compare.py relies on); another seed reads another stream: generator
    problems from seed x 100,000 on, or a seeded permutation of a finite training split or of
    a prompt file's rows."""

    def __init__(self, task: Task, params: SourceParams, steps: int, seed: int = 0):
        self.task, self.params, self.seed = task, params, seed
        self.file_rows = read_prompt_file(params.path) if params.path else None
        if self.file_rows is not None and len(self.file_rows) < params.prompts_per_step:
            raise ConfigError(f"source.path: {len(self.file_rows)} rows, fewer than "
                              f"prompts_per_step={params.prompts_per_step}")
        if self.file_rows is not None and seed:
            import random

            random.Random(seed).shuffle(self.file_rows)

    def _index(self, k: int) -> int:
        """The k-th training problem of this seed's stream."""
        size = self.task.train_size
        if size is None:  # an unbounded generator: a disjoint stretch per seed
            return self.seed * SEED_STRIDE + k
        if not hasattr(self, "_order"):  # a finite split: a seeded permutation (seed 0: in order)
            import random

            self._order = list(range(size))
            if self.seed:
                random.Random(self.seed).shuffle(self._order)
        return self._order[k % size]

    def rows_for_step(self, step: int) -> list[dict]:
        n = self.params.prompts_per_step
        if self.file_rows is None:
            rows = [next(self.task.rows("train", self._index(step * n + i), 1)) for i in range(n)]
        else:
            total = len(self.file_rows)
            rows = [self.file_rows[(step * n + i) % total] for i in range(n)]
        return [{**r, "step": step} for r in rows]
