"""The task interface and its registry.

A task scores an answer against a problem's ground truth (`meta`) and critiques it; a task
that generates its own problems also turns an index into a prompt and its `meta`. Adding
one is a subclass plus `@register_task("name")`: `check` (or `score`, for any reward other
than correct/format) is all a task whose prompts come from a file needs; reward functions
as TRL or verl write them need no subclass at all (`rltf_ray/tasks/rewards.py`).
"""
from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from rltf_ray.errors import ConfigError
from rltf_ray.plugins import load_env_plugins

if TYPE_CHECKING:  # the config module is not imported at run time: tasks stay below it
    from rltf_ray.config import TaskConfig

MAX_ANSWER_CHARS = 20_000  # the answer inside the tags; anything longer is cut


def last_tagged(text: str, open_tag: str = "<answer>", close_tag: str = "</answer>") -> str | None:
    """The content of the last `<answer>...</answer>` (case-insensitive), or None: two
    reverse scans, linear in the text (a non-greedy regex findall is quadratic on text full
    of unclosed tags: 1.6 s for 40 KB of them)."""
    low = text.lower()
    end = low.rfind(close_tag)
    start = low.rfind(open_tag, 0, end) if end >= 0 else -1
    if start < 0:
        return None
    return text[start + len(open_tag):end][:MAX_ANSWER_CHARS]
LAST_NUMBER = re.compile(r"-?\d[\d,]*")


@dataclass(frozen=True)
class Score:
    reward: float
    correct: bool
    format_ok: bool


class Task(ABC):
    """Base class; subclasses implement `check` (or override `score`), and `make_problem`
    and `prompt_text` when they generate their own problems."""

    name = "task"
    answer_format: str | None = "<answer>...</answer>"
    # False: `score` cannot judge an answer; rewards come from the critic's verdict
    # (llm_judge or openai), in the critique stage (r0) and the reward stage (revisions).
    has_verifier = True

    # The task.params a task takes, with their defaults; given values land in `self.params`.
    # None: the subclass reads cfg.params itself (the built-in tasks) or takes none.
    default_params: dict | None = None

    def __init__(self, cfg: "TaskConfig"):
        self.cfg = cfg
        if self.has_verifier and type(self).check is Task.check and type(self).score is Task.score:
            raise ConfigError(f"task {self.name} ({type(self).__qualname__}): it can score nothing; implement "
                              "check(answer, meta) (is the extracted answer right?) or score(text, meta) (any reward)")
        if cfg.extraction not in ("tag", "last_number"):
            raise ConfigError(f"task.extraction: expected 'tag' or 'last_number', got {cfg.extraction!r}")
        given = dict(cfg.params or {})
        if self.default_params is not None:
            unknown = sorted(set(given) - set(self.default_params))
            if unknown:
                raise ConfigError(f"task.params: unknown key '{unknown[0]}' for {self.name} "
                                  f"(known: {', '.join(self.default_params) or 'none'})")
            self.params = {**self.default_params, **given}
        elif given and type(self).__init__ is Task.__init__:  # nothing would ever read them
            raise ConfigError(f"task.params: {self.name} takes no params (got {', '.join(sorted(given))}); "
                              "a task that takes some declares them in `default_params`")

    # Reward functions receive the prompt as the file has it: it is kept in meta["_prompt"].
    scores_prompt = False

    @property
    def generates(self) -> bool:
        """Whether the task makes its own problems (else they come from a prompt file)."""
        return type(self).make_problem is not Task.make_problem

    @property
    def revision_template(self) -> str:
        """The revision turn's default text: the critique, then a request for this task's format."""
        from rltf_ray.chat import revision_template

        return revision_template(self.answer_format)

    # -- generation (tasks that make their own problems) ---------------------------------
    def make_problem(self, index: int, split: str) -> dict:
        """Problem `index` of `split` ("train" or "test") as its meta; deterministic."""
        raise ConfigError(f"task {self.name}: it generates no problems; give its prompts in a file "
                          "(pipeline.prompts.path) and its held-out problems in eval.path")

    def prompt_text(self, meta: dict) -> str:
        """The prompt of a generated problem."""
        raise ConfigError(f"task {self.name}: it generates no problems, so it has no prompt_text")

    def rows(self, split: str, start: int, count: int) -> Iterator[dict]:
        """Deterministic prompt rows: problem `i` of a split is the same for a given seed."""
        for i in range(start, start + count):
            meta = self.make_problem(i, split)
            yield {"prompt_id": f"{split}-{i}", "prompt": self.prompt_text(meta),
                   "meta": json.dumps(meta, sort_keys=True)}

    # Distinct problems in the test and train splits; None: a generator with no practical limit.
    test_size: int | None = None
    train_size: int | None = None

    def held_out(self, n: int) -> list[dict]:
        """Up to `n` held-out rows, each a distinct problem (by prompt text): fewer when the
        test split is smaller, so an evaluation never counts one problem twice."""
        limit = n if self.test_size is None else min(n, self.test_size)
        seen: set[str] = set()
        out: list[dict] = []
        for i in range(limit * 20 + 100):  # a small generator space repeats; stop eventually
            if len(out) == limit:
                break
            row = next(self.rows("test", i, 1))
            if row["prompt"] not in seen:
                seen.add(row["prompt"])
                out.append(row)
        return out

    def calibration(self, n: int, scored: int) -> list[dict]:
        """`n` calibration rows: the test split's distinct problems that come after the first
        `scored` held-out ones (`held_out(scored)`, the problems an evaluation scores). They
        are never trained on (they are test problems) and never scored, so a choice made on
        them (a room check, a critic's temperature) cannot fit the scored problems. A
        ConfigError when the test split has fewer than `scored + n` distinct problems."""
        if n < 1 or scored < 0:
            raise ValueError(f"calibration: need n >= 1 and scored >= 0, got n={n}, scored={scored}")
        first = len(self.held_out(scored))
        rows = self.held_out(first + n)[first:]
        if len(rows) < n:
            raise ConfigError(
                f"task {self.name}: its test split has {first + len(rows)} distinct problems, too few for "
                f"{scored} scored (eval.prompts) and {n} calibration problems (eval.calibration_prompts) that "
                "do not overlap; lower one of them, give a larger test split, or give calibration problems "
                "in a file of their own (eval.calibration_path)")
        return rows

    # -- scoring ----------------------------------------------------------------------
    def extract(self, text: str) -> tuple[str | None, bool]:
        """(answer or None, format_ok). format_ok means the answer tag was used."""
        tagged = last_tagged(text)
        if self.cfg.extraction == "tag":
            return (tagged.strip() if tagged is not None else None), tagged is not None
        return self.lenient_answer(text if tagged is None else tagged), tagged is not None

    def lenient_answer(self, text: str) -> str | None:
        """The answer when tags are not required (extraction "last_number"): the last integer."""
        nums = LAST_NUMBER.findall(text)
        return nums[-1].replace(",", "") if nums else None

    def check(self, answer: str, meta: dict) -> bool:
        """Whether the extracted `answer` is correct for this problem (override this or `score`;
        a task with neither is refused when it is built)."""
        # reached only from a task that overrides score() but calls Task.score or the default
        # critique(), which use check()
        raise TypeError(f"task {self.name}: the default score() and critique() call check(answer, meta), "
                        f"which {type(self).__qualname__} does not implement")

    def score(self, text: str, meta: dict) -> Score:
        """The reward of a whole response `text` for the problem `meta`: Score(reward, correct,
        format_ok). By default 1 for a correct answer (`check` on the extracted answer), minus
        `task.format_weight` when the answer is not in the task's format. Override it for any
        other reward (partial credit, a rubric, a reward model); `correct` is what accuracy
        and the critique-on-wrong-answers rule count."""
        answer, format_ok = self.extract(text)
        correct = answer is not None and self.check(answer, meta)
        w = self.cfg.format_weight
        return Score(float(correct) + w * (float(format_ok) - 1.0), correct, format_ok)

    def score_batch(self, texts: list[str], metas: list[dict], ids: list | None = None,
                    step: int | None = None) -> list[Score]:
        """The scores of several answers: `ids` their token ids as the engine generated them,
        `step` the RL step (the policy version in a held-out evaluation); None where the caller
        does not know them. By default `score` of each; reward functions (tasks/rewards.py)
        take the whole batch in one call, as TRL calls them."""
        return [self.score(t, m) for t, m in zip(texts, metas)]

    def critique_scored(self, text: str, meta: dict, score: Score) -> str:
        """The critique of an answer already scored (`score`, from `score_batch`): by default
        `critique`; a task whose critique is its verdict alone need not score it again."""
        return self.critique(text, meta)

    def check_columns(self, columns: set[str], key: str) -> None:
        """A ConfigError when the prompt file `key` names, whose rows' meta have `columns`,
        lacks a column the task needs; called once the whole file is read."""

    # Keys every problem's meta must hold (validated for prompt files before a run starts).
    meta_keys: tuple[str, ...] = ("answer",)

    def validate_meta(self, meta: dict) -> str:
        """Why this task cannot score `meta` ("" if it can): a required key is missing, or
        the task's own solution does not score as correct against it."""
        missing = [k for k in self.meta_keys if meta.get(k) is None]
        if missing:
            return f"missing {', '.join(repr(k) for k in missing)} (task {self.name} needs {list(self.meta_keys)})"
        try:
            demo = self.demonstration(meta) if self.has_verifier else None
            if demo is None:  # nothing to check the row against: no reference answer
                return ""
            ok = self.score(demo, meta).correct
            self.critique("", meta)
        except Exception as e:  # any failure to score is the row's problem, named
            return f"the task cannot score it ({type(e).__name__}: {e})"
        return "" if ok else "the reference answer does not verify as correct"

    def demonstration(self, meta: dict) -> str | None:
        """A correct solution in the task's answer format (warm starts; a prompt row is checked
        by scoring it), or None where the row has no reference answer (meta.answer)."""
        if meta.get("answer") is None or not self.answer_format:
            return None
        return self.answer_format.replace("...", str(meta["answer"]))

    def critique(self, text: str, meta: dict) -> str:
        answer, format_ok = self.extract(text)
        if answer is None:
            return (f"Your answer could not be read. Put only your final answer inside "
                    f"{self.answer_format}.")
        return "Your answer is correct." if self.check(answer, meta) else "Your answer is incorrect."


class FileTask(Task):
    """A task whose problems are rows of a JSONL file (`params.path`, else `builtin`); the
    last `holdout` rows are the test split. Subclasses turn a row into `meta` in `parse_row`
    and list their other params in `extra_params` (popped in `configure`)."""

    builtin: Path
    default_holdout = 10
    extra_params: tuple[str, ...] = ()

    def __init__(self, cfg: "TaskConfig"):
        super().__init__(cfg)
        params = dict(cfg.params)
        path = Path(params.pop("path", self.builtin))
        self.holdout = int(params.pop("holdout", self.default_holdout))
        self.configure({k: params.pop(k) for k in self.extra_params if k in params})
        if params:
            known = ", ".join(("path", "holdout") + self.extra_params)
            raise ConfigError(f"task.params: unknown key '{sorted(params)[0]}' for {self.name} "
                              f"(known: {known})")
        if not path.is_file():
            raise ConfigError(f"task.params.path: file not found: {path}")
        self.problems = []
        for n, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{n}: not valid JSON ({e.msg})") from None
            meta = self.parse_row(row) if isinstance(row, dict) else None
            if meta is None:
                raise ConfigError(f"{path}:{n}: {self.row_schema}")
            self.problems.append(meta)
        if len(self.problems) <= self.holdout:
            raise ConfigError(f"{path}: {len(self.problems)} rows, need more than holdout={self.holdout}")

    row_schema = "a JSON object"

    def configure(self, params: dict) -> None:
        pass

    @abstractmethod
    def parse_row(self, row: dict) -> dict | None:
        """The problem's meta, or None if the row does not fit `row_schema`."""

    @property
    def test_size(self) -> int:
        return self.holdout

    @property
    def train_size(self) -> int:
        return len(self.problems) - self.holdout

    def make_problem(self, index: int, split: str) -> dict:
        train = len(self.problems) - self.holdout
        i = index % train if split == "train" else train + index % self.holdout
        return dict(self.problems[i])


_REGISTRY: dict[str, Callable[["TaskConfig"], Task]] = {}


def register_task(name: str):
    """Class decorator: `@register_task("my_task")` makes `task.name: my_task` build it. In a
    plugin module (config `plugins:`), it registers in every Ray process that loads the plugin."""
    if not isinstance(name, str) or not name or name.startswith("rg:"):
        raise ValueError(f"register_task: a non-empty name not starting with 'rg:' is required, got {name!r}")

    def deco(cls):
        if not (isinstance(cls, type) and issubclass(cls, Task)):
            raise TypeError(f"register_task({name!r}): {cls!r} is not a subclass of rltf_ray.Task")
        old = _REGISTRY.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"register_task({name!r}): already registered by {old.__module__}.{old.__qualname__}")
        _REGISTRY[name] = cls
        cls.name = name
        return cls
    return deco


def task_names() -> list[str]:
    load_env_plugins()
    return sorted(_REGISTRY)


def task_class(name: str) -> type[Task] | None:
    """The registered class (None for an unknown name or a reasoning-gym `rg:` task)."""
    if name not in _REGISTRY:
        load_env_plugins()  # a Ray worker imports the driver's plugins on first use
    return _REGISTRY.get(name)


def task_has_verifier(name: str) -> bool:
    """Without building the task (config validation); unknown names count as verified."""
    cls = task_class(name)
    return True if cls is None else cls.has_verifier


def registered_task(cfg: "TaskConfig") -> Task:
    """The registered task `cfg.name`, built (`rltf_ray.tasks.get_task` also builds `rg:` ones)."""
    if task_class(cfg.name) is None:
        raise ConfigError(f"task.name: unknown task '{cfg.name}' (known: {', '.join(task_names())}, "
                          "or rg:<reasoning-gym dataset>)")
    return _REGISTRY[cfg.name](cfg)
