"""Prompt rows for each RL step, from a JSONL/Parquet file or the task's generator.

A prompt file is validated whole, before Ray starts, and every bad row is reported with its
line, id and reason: bytes that are not UTF-8, a line that is not a JSON object, a missing,
empty or non-string `prompt`, a missing `meta` or one the task cannot score (the task's own
solution must score as correct against it), a null or duplicate `prompt_id`, and a prompt
too long for the engine's context with the first turn's `max_tokens`. With
`source.on_bad_row: error` (the default) the run stops with the list; with `skip` the bad rows
go to `bad_rows.jsonl` beside the run's outputs, are counted, and the rest train."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rltf_ray.config import ConfigError
from rltf_ray.graph import SourceParams
from rltf_ray.tasks import Task

SEED_STRIDE = 100_000  # generator problems per seed before two seeds' streams meet
MAX_LISTED = 20  # bad rows named in the error; all of them go to bad_rows.jsonl with skip


@dataclass
class PromptFile:
    rows: list[dict]
    bad: list[dict] = field(default_factory=list)  # {"line", "prompt_id", "reason", "raw"}


def _raw_lines(p: Path) -> list[tuple[int, object, str]]:
    """(line, parsed JSON or an error reason string wrapped in Exception, raw text)."""
    if p.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [(i + 1, r, json.dumps(r, default=str)[:2000]) for i, r in enumerate(pq.read_table(p).to_pylist())]
    out = []
    for i, line in enumerate(p.read_bytes().split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            out.append((i, ValueError(f"not valid UTF-8 (byte {e.start})"), line[:2000].decode("utf-8", "replace")))
            continue
        try:
            out.append((i, json.loads(text), text[:2000]))
        except json.JSONDecodeError as e:
            out.append((i, ValueError(f"not valid JSON ({e.msg})"), text[:2000]))
    return out


def _row_problem(task: Task, r: object, line: int) -> tuple[dict | None, str]:
    """(row, "") or (None, the reason it is bad)."""
    if isinstance(r, Exception):
        return None, str(r)
    if not isinstance(r, dict):
        return None, "a prompt row must be a JSON object"
    prompt, meta = r.get("prompt"), r.get("meta")
    if not isinstance(prompt, str) or not prompt.strip():
        return None, "missing, empty or non-string 'prompt'"
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError:
            return None, "'meta' is a string but not JSON"
    if not isinstance(meta, dict):
        return None, "missing 'meta' object (the ground truth)"
    reason = task.validate_meta(meta)
    if reason:
        return None, f"meta: {reason}"
    pid = r.get("prompt_id", f"row-{line}")
    if pid is None or (isinstance(pid, str) and not pid.strip()):
        return None, "null or empty 'prompt_id'"
    return {"prompt_id": str(pid), "prompt": prompt, "meta": json.dumps(meta, sort_keys=True)}, ""


def read_prompt_file(path: str, task: Task, fits=None, key: str = "source.path") -> PromptFile:
    """Every row of the file, validated; `fits(prompt) -> reason or ""` checks its length."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{key}: file not found: {p}")
    if p.suffix not in (".jsonl", ".json", ".parquet"):
        raise ConfigError(f"{key}: {p} must end in .jsonl or .parquet")
    out = PromptFile([])
    seen: dict[str, int] = {}
    for line, r, raw in _raw_lines(p):
        row, reason = _row_problem(task, r, line)
        if row is not None and row["prompt_id"] in seen:
            reason = f"duplicate prompt_id {row['prompt_id']!r} (first on line {seen[row['prompt_id']]})"
        elif row is not None and fits is not None:
            reason = fits(row["prompt"])
        if reason:
            pid = r.get("prompt_id") if isinstance(r, dict) else None
            out.bad.append({"line": line, "prompt_id": pid, "reason": reason, "raw": raw})
            continue
        seen[row["prompt_id"]] = line
        out.rows.append(row)
    return out


def bad_rows_error(path: str, bad: list[dict], key: str = "source.path") -> ConfigError:
    listed = "\n".join(f"  {path}:{b['line']} (prompt_id {b['prompt_id']!r}): {b['reason']}" for b in bad[:MAX_LISTED])
    more = f"\n  ... and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
    fix = ("Fix them, or set pipeline.prompts.on_bad_row=skip to train on the rest "
           "(the bad rows then go to bad_rows.jsonl)." if key == "source.path" else
           "Fix them: a held-out set is scored whole, never with rows left out.")
    return ConfigError(f"{key}: {len(bad)} bad row(s) in {path}:\n{listed}{more}\n{fix}")


def load_eval_rows(task: Task, path: str, limit: int) -> list[dict]:
    """The held-out problems of `eval.path` (the prompt-file format), validated whole: any bad
    row is an error, and the first `limit` rows are used."""
    got = read_prompt_file(path, task, key="eval.path")
    if got.bad:
        raise bad_rows_error(path, got.bad, key="eval.path")
    if not got.rows:
        raise ConfigError(f"eval.path: {path} has no rows")
    return got.rows[:limit]


class PromptSource:
    """The step's prompts. Runs with the same `seed` see the same prompts in the same order
    (what pipelines/compare.py relies on); another seed reads another stream: generator
    problems from seed x 100,000 on, or a seeded permutation of a finite training split or of
    a prompt file's rows."""

    def __init__(self, task: Task, params: SourceParams, steps: int, seed: int = 0, fits=None):
        self.task, self.params, self.seed = task, params, seed
        self.file_rows, self.bad_rows = None, []
        if params.path:
            got = read_prompt_file(params.path, task, fits)
            if got.bad and params.on_bad_row == "error":
                raise bad_rows_error(params.path, got.bad)
            self.file_rows, self.bad_rows = got.rows, got.bad
            if not self.file_rows:
                raise ConfigError(f"source.path: {params.path} has no usable prompt rows")
            if len(self.file_rows) < params.prompts_per_step:
                raise ConfigError(f"source.path: {len(self.file_rows)} usable rows, fewer than "
                                  f"prompts_per_step={params.prompts_per_step}")
            if seed:
                import random

                random.Random(seed).shuffle(self.file_rows)

    def write_bad_rows(self, out: Path) -> None:
        if self.bad_rows:
            with open(out / "bad_rows.jsonl", "w") as f:
                for b in self.bad_rows:
                    f.write(json.dumps(b) + "\n")

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
