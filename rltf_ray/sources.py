"""Prompt rows for each RL step, from a file, a local Hugging Face dataset folder or the
task's generator.

A prompt file (JSONL, Parquet, or a folder written by `datasets.save_to_disk`) is validated
whole, before Ray starts, and every bad row is reported with its file, line, id and reason:
bytes that are not UTF-8, a line that is not a JSON object, a missing or empty prompt (a
string, or a list of chat messages ending with a user turn), a `meta` the task cannot score
(the task's own solution must score as correct against it), a null or duplicate id, a mapped
column that is missing, and a prompt too long for the engine's context with the first turn's
`max_tokens`; then the file's columns as a whole (a reward function's required parameter that
no column supplies is a ConfigError). The columns are the source node's to name (`prompt_key`, `id_key`, `meta_keys`;
docs/data.md). With `on_bad_row: error` (the default) the run stops with the list; with
`skip` the bad rows go to `bad_rows.jsonl` beside the run's outputs, are counted, and the
rest train."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rltf_ray.config import ConfigError
from rltf_ray.graph import SourceParams
from rltf_ray.tasks import Task

SEED_STRIDE = 100_000  # generator problems per seed before two seeds' streams meet
MAX_LISTED = 20  # bad rows named in the error; all of them go to bad_rows.jsonl with skip
ROLES = ("system", "user", "assistant")
_MISSING = object()


@dataclass
class PromptFile:
    rows: list[dict]
    bad: list[dict] = field(default_factory=list)  # {"line", "prompt_id", "reason", "raw"}


def _dataset_folder(p: Path, key: str) -> list[dict]:
    """The rows of a `datasets.save_to_disk` folder, read with pyarrow (its Arrow stream files
    in the order its state.json lists them): nothing is fetched, and `datasets` is not needed."""
    import pyarrow as pa

    if (p / "dataset_dict.json").is_file():
        splits = json.loads((p / "dataset_dict.json").read_text()).get("splits", [])
        raise ConfigError(f"{key}: {p} holds several splits ({', '.join(splits)}); point it at one, "
                          f"e.g. {p / (splits[0] if splits else 'train')}")
    if not (p / "state.json").is_file():
        raise ConfigError(f"{key}: {p} is a folder but not a Hugging Face dataset saved with "
                          "save_to_disk (no state.json); give a .jsonl or .parquet file, or that folder")
    files = [f["filename"] for f in json.loads((p / "state.json").read_text()).get("_data_files", [])]
    rows: list[dict] = []
    for name in files:
        with pa.OSFile(str(p / name)) as f:
            rows += pa.ipc.open_stream(f).read_all().to_pylist()
    return rows


def _raw_lines(p: Path, key: str) -> list[tuple[int, object, str]]:
    """(line, parsed JSON or an error reason string wrapped in Exception, raw text)."""
    if p.is_dir() or p.suffix == ".parquet":
        if p.is_dir():
            table = _dataset_folder(p, key)
        else:
            import pyarrow.parquet as pq

            table = pq.read_table(p).to_pylist()
        return [(i + 1, r, json.dumps(r, default=str)[:2000]) for i, r in enumerate(table)]
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


def _chat(prompt: list, col: str) -> tuple[list | None, str]:
    """(the messages, "") or (None, why a chat prompt is malformed)."""
    for i, m in enumerate(prompt):
        if not (isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)):
            return None, (f"'{col}' message {i} must be {{'role': system|user|assistant, "
                          f"'content': str}}, got {json.dumps(m, default=str)[:120]}")
    if not prompt or prompt[-1]["role"] != "user" or not prompt[-1]["content"].strip():
        return None, f"'{col}' as chat messages must end with a non-empty user message"
    return [{"role": m["role"], "content": m["content"]} for m in prompt], ""


def x0_messages(prompt: str, chat: list | None, system: str | None) -> str:
    """The `messages` column: x0 as chat messages (JSON), with the system prompt first unless
    the chat prompt has its own; "" when x0 is the prompt alone."""
    msgs = chat or [{"role": "user", "content": prompt}]
    if system and not any(m["role"] == "system" for m in msgs):
        msgs = [{"role": "system", "content": system}] + msgs
    return json.dumps(msgs) if (chat or system) else ""


def with_system(rows: list[dict], system: str | None) -> list[dict]:
    """Generated rows (the task's own prompts) with the configured system prompt."""
    if not system:
        return rows
    return [{**r, "messages": r.get("messages") or x0_messages(r["prompt"], None, system)} for r in rows]


def _column(r: dict, path: str):
    """A column by name, or a dotted path into nested objects (reward_model.ground_truth)."""
    if path in r:
        return r[path]
    v = r
    for part in path.split("."):
        if not isinstance(v, dict) or part not in v:
            return _MISSING
        v = v[part]
    return v


def _meta(r: dict, params: SourceParams, where: str) -> tuple[dict | None, str]:
    if params.meta_keys is not None:
        m = params.meta_keys
        pairs = m.items() if isinstance(m, dict) else [(c, c) for c in m]
        meta = {}
        for k, col in pairs:
            meta[k] = _column(r, col)
            if meta[k] is _MISSING:
                return None, f"missing column '{col}' (named in {where}.meta_keys)"
        return meta, ""
    if "meta" in r:
        meta = r["meta"]
        if isinstance(meta, str):
            try:
                meta = json.loads(meta)
            except json.JSONDecodeError:
                return None, "'meta' is a string but not JSON"
        if not isinstance(meta, dict):
            return None, "'meta' must be an object (the ground truth)"
        return meta, ""
    return {k: v for k, v in r.items() if k not in (params.prompt_key, params.id_key)}, ""


def _row_problem(task: Task, r: object, line: int, params: SourceParams, where: str) -> tuple[dict | None, str]:
    """(row, "") or (None, the reason it is bad)."""
    if isinstance(r, Exception):
        return None, str(r)
    if not isinstance(r, dict):
        return None, "a prompt row must be a JSON object"
    col = params.prompt_key
    prompt, chat = r.get(col), None
    if isinstance(prompt, list):
        chat, reason = _chat(prompt, col)
        if chat is None:
            return None, reason
        text = chat[-1]["content"]
    elif isinstance(prompt, str) and prompt.strip():
        text = prompt
    else:
        return None, (f"missing, empty or non-string '{col}' (a string or a list of chat messages; "
                      f"{where}.prompt_key names the column)")
    meta, reason = _meta(r, params, where)
    if meta is None:
        return None, reason
    if task.scores_prompt:  # reward functions get the prompt as the file has it (TRL's shapes)
        meta = {**meta, "_prompt": prompt}
    reason = task.validate_meta(meta)
    if reason:
        return None, f"meta: {reason}"
    pid = r.get(params.id_key, f"row-{line}")
    if pid is None or (isinstance(pid, str) and not pid.strip()):
        return None, f"null or empty '{params.id_key}'"
    return {"prompt_id": str(pid), "prompt": text, "messages": x0_messages(text, chat, params.system_prompt),
            "meta": json.dumps(meta, sort_keys=True, default=str)}, ""


def read_prompt_file(path: str, task: Task, fits=None, key: str = "pipeline.prompts.path",
                     params: SourceParams | None = None) -> PromptFile:
    """Every row of the file, validated; `fits(row) -> reason or ""` checks its length."""
    p = Path(path)
    params = params or SourceParams()
    if not p.exists():
        raise ConfigError(f"{key}: file not found: {p}")
    if not p.is_dir() and p.suffix not in (".jsonl", ".json", ".parquet"):
        raise ConfigError(f"{key}: {p} must end in .jsonl or .parquet, or be a dataset folder")
    where = key.rsplit(".", 1)[0] if key.endswith(".path") else "pipeline.prompts"
    out = PromptFile([])
    seen: dict[str, int] = {}
    for line, r, raw in _raw_lines(p, key):
        row, reason = _row_problem(task, r, line, params, where)
        if row is not None and row["prompt_id"] in seen:
            reason = f"duplicate prompt_id {row['prompt_id']!r} (first on line {seen[row['prompt_id']]})"
        elif row is not None and fits is not None:
            reason = fits(row)
        if reason:
            pid = r.get(params.id_key) if isinstance(r, dict) else None
            out.bad.append({"line": line, "prompt_id": pid, "reason": reason, "raw": raw})
            continue
        seen[row["prompt_id"]] = line
        out.rows.append(row)
    if out.rows:
        _columns(task, out.rows, key)
    return out


def _columns(task: Task, rows: list[dict], key: str) -> None:
    """The columns are known once the whole file is read: the task checks that they supply
    what it needs (a reward function's required parameters). For reward functions, a column
    that some rows lack is None in them, as in a Hugging Face dataset of these rows: every
    answer of a batch then gets every keyword."""
    metas = [json.loads(r["meta"]) for r in rows]
    columns = {k for m in metas for k in m} - {"_prompt"}
    task.check_columns(columns, key)
    if task.scores_prompt:
        for r, m in zip(rows, metas):
            if len(m) - ("_prompt" in m) < len(columns):
                r["meta"] = json.dumps({**dict.fromkeys(columns), **m}, sort_keys=True, default=str)


def bad_rows_error(path: str, bad: list[dict], key: str = "pipeline.prompts.path") -> ConfigError:
    listed = "\n".join(f"  {path}:{b['line']} (prompt_id {b['prompt_id']!r}): {b['reason']}" for b in bad[:MAX_LISTED])
    more = f"\n  ... and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
    fix = (f"Fix them, or set {key.rsplit('.', 1)[0]}.on_bad_row=skip to train on the rest "
           "(the bad rows then go to bad_rows.jsonl)." if key != "eval.path" else
           "Fix them: a held-out set is scored whole, never with rows left out.")
    return ConfigError(f"{key}: {len(bad)} bad row(s) in {path}:\n{listed}{more}\n{fix}")


def load_eval_rows(task: Task, path: str, limit: int, params: SourceParams | None = None,
                   key: str = "eval.path") -> list[dict]:
    """The held-out problems of `eval.path` (or of the file that config `key` names), read
    with the training prompts' column mapping and system prompt (`params`), validated whole:
    any bad row is an error, and the first `limit` rows are used."""
    got = read_prompt_file(path, task, key=key, params=params)
    if got.bad:
        raise bad_rows_error(path, got.bad, key=key)
    if not got.rows:
        raise ConfigError(f"{key}: {path} has no rows")
    return got.rows[:limit]


def held_out_rows(task: Task, E, params: SourceParams) -> list[dict] | None:
    """The problems an evaluation scores (`E`, the eval config): the first `E.prompts` rows of
    `E.path`, else of the task's test split; None for a task that generates none."""
    if E.path:
        return load_eval_rows(task, E.path, E.prompts, params)
    return with_system(task.held_out(E.prompts), params.system_prompt) if task.generates else None


def calibration_rows(task: Task, E, params: SourceParams, train_prompts: set[str] = frozenset()) -> list[dict]:
    """The calibration problems of the eval config `E`, which no evaluation of the test split
    scores: the first `E.calibration_prompts` rows of `E.calibration_path`, else the task's test
    split after its first `E.prompts` problems (`Task.calibration`). A ConfigError when a
    calibration row's prompt is also a scored one, or one of `train_prompts` (a training file's),
    and when the scored problems come from a file (`E.path`) but the calibration ones would not."""
    if E.calibration_path:
        rows = load_eval_rows(task, E.calibration_path, E.calibration_prompts, params, key="eval.calibration_path")
        scored = {r["prompt"] for r in held_out_rows(task, E, params) or []}
        for what, prompts in (("a scored problem (eval.path or the task's test split)", scored),
                              ("a training prompt", set(train_prompts))):
            both = [r["prompt"] for r in rows if r["prompt"] in prompts]
            if both:
                raise ConfigError(f"eval.calibration_path: {len(both)} of its rows are also {what}, e.g. "
                                  f"{both[0][:80]!r}; calibration problems must be ones that are never scored "
                                  "or trained on")
        return rows
    if E.path:
        raise ConfigError("eval.path gives the scored problems from a file, so the calibration problems "
                          "(a room check, a temperature choice) need a file of their own: set eval.calibration_path "
                          "to prompts that are neither scored nor trained on")
    if not task.generates:
        raise ConfigError(f"task {task.name}: it generates no problems, so it has no calibration split; set "
                          "eval.calibration_path to prompts that are neither scored nor trained on")
    return with_system(task.calibration(E.calibration_prompts, E.prompts), params.system_prompt)


class PromptSource:
    """The step's prompts. Runs with the same `seed` see the same prompts in the same order
    (what rltf-ray compare relies on); another seed reads another stream: generator
    problems from seed x 100,000 on, or a seeded permutation of a finite training split or of
    a prompt file's rows."""

    def __init__(self, task: Task, params: SourceParams, steps: int, seed: int = 0, fits=None,
                 key: str = "pipeline.prompts.path"):
        self.task, self.params, self.seed = task, params, seed
        self.file_rows, self.bad_rows = None, []
        if params.path:
            got = read_prompt_file(params.path, task, fits, key, params)
            if got.bad and params.on_bad_row == "error":
                raise bad_rows_error(params.path, got.bad, key)
            self.file_rows, self.bad_rows = got.rows, got.bad
            if not self.file_rows:
                raise ConfigError(f"{key}: {params.path} has no usable prompt rows")
            if len(self.file_rows) < params.prompts_per_step:
                raise ConfigError(f"{key}: {len(self.file_rows)} usable rows, fewer than "
                                  f"prompts_per_step={params.prompts_per_step}")
            if seed:
                import random

                random.Random(seed).shuffle(self.file_rows)
        elif not task.generates:
            raise ConfigError(f"{key}: task '{task.name}' has no problem generator (its prompts come from "
                              f"your data); set {key} to a JSONL, Parquet or dataset folder")

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
            rows = with_system([next(self.task.rows("train", self._index(step * n + i), 1)) for i in range(n)],
                               self.params.system_prompt)
        else:
            total = len(self.file_rows)
            rows = [self.file_rows[(step * n + i) % total] for i in range(n)]
        return [{"messages": "", **r, "step": step} for r in rows]
