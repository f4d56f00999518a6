"""Reward functions as TRL and verl users already have them, with no `Task` subclass.

`task.reward_funcs: [module:function, ...]` (a plugin module, an installed one, or
`path/to/file.py:function`, which is then shipped as a plugin) builds the task
`reward_funcs`. Its prompts come from a file (`pipeline.prompts.path`, held-out ones from
`eval.path`); each row's columns other than the prompt and its id form its `meta` (a column
that some rows lack is None in them, as in a Hugging Face dataset). A function is called in
one of two styles:

* **TRL** (the default), as TRL's GRPOTrainer calls it: once per batch of answers,
  `f(prompts=[...], completions=[...], completion_ids=[...], trainer_state=..., **columns)`,
  one entry per answer in every list and every other column a keyword holding a list. For a
  plain prompt a prompt and a completion are strings; for a chat prompt the prompt is its
  message list and the completion `[{"role": "assistant", "content": text}]`.
  `completion_ids` are the token ids the engine generated, as vLLM returns them (the learned
  critic's revisions, and requests to the critic, carry theirs too);
  `trainer_state.global_step` is the RL step (0-based), or the policy version in a held-out
  evaluation. It returns a list with one float or None per answer; None leaves the function
  out of that answer's sum, as in TRL. A function without `**kwargs` gets only the
  parameters it names; a required parameter that no column of the prompt file supplies is a
  ConfigError when the file is read. `task.score(text, meta)` (one answer, no ids, no step)
  passes neither `completion_ids` nor `trainer_state`, and a function that requires one of
  them says so; a critic plugin scores its requests with `rltf_ray.critics.score_items`.
* **verl**: a function whose parameters include `solution_str` and `ground_truth` (verl's
  `compute_score`), called once per answer as verl's reward manager calls it:
  `f(data_source=..., solution_str=text, ground_truth=..., extra_info=...)`. The ground truth
  is the row's `reward_model["ground_truth"]`, or its `ground_truth` column when it has no
  `reward_model`; `extra_info` is the row's, or {}. It returns a float, or a dict whose
  "score" is the reward.

`async def` functions of either style are awaited. The reward is the weighted sum
(`task.reward_weights`, 1 each by default) of the functions that returned a number; an
answer on which every function returned None scores 0, with a warning. An answer is correct
when the value of one function, `task.correct_from` (by default the first listed), reaches
`task.correct_threshold` (1.0 by default); not the sum, through which a format reward would
make a wrong answer in the right format correct. A function that raises, returns the wrong number of
values or a non-number is an error naming the function and the row. Critiques come from the
configured critic; the task's own is the verdict alone.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import inspect
import logging
import math
import numbers
from dataclasses import dataclass
from typing import Callable

from rltf_ray.errors import ConfigError, StageFailure
from rltf_ray.tasks.base import Score, Task, register_task

VERL_PARAMS = frozenset({"solution_str", "ground_truth"})
# What each style passes besides the row's columns: a parameter of these names is never a column.
CONVENTION = {"trl": frozenset({"prompts", "completions", "completion_ids", "trainer_state"}),
              "verl": frozenset({"data_source", "solution_str", "ground_truth", "extra_info"})}
logger = logging.getLogger(__name__)


class RewardFunctionError(StageFailure):
    """A reward function raised, or returned something that is not a reward, on a row."""


@dataclass(frozen=True)
class TrainerState:
    """TRL's `trainer_state` as a reward function reads it: `global_step` is the RL step,
    0-based as TRL's state starts at 0 (the policy version in a held-out evaluation)."""
    global_step: int


def resolve(ref: str) -> Callable:
    """The function a `module:function` reference names; a clear ConfigError otherwise."""
    if not isinstance(ref, str) or ref.count(":") != 1 or not all(ref.split(":")):
        raise ConfigError(f"task.reward_funcs: expected 'module:function', got {ref!r}")
    mod_name, attr = ref.split(":")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise ConfigError(f"task.reward_funcs: cannot import module {mod_name!r} for {ref!r} ({e}); give "
                          "'path/to/file.py:function', or list the module under `plugins:`") from None
    fn = mod
    for part in attr.split("."):
        fn = getattr(fn, part, None)
        if fn is None:
            raise ConfigError(f"task.reward_funcs: module {mod_name!r} has no {attr!r} (from {ref!r})")
    if not callable(fn):
        raise ConfigError(f"task.reward_funcs: {ref!r} is not callable")
    RewardFunc(ref, fn)  # its style and its parameters are checked here
    return fn


def style(fn: Callable, ref: str) -> str:
    """"verl" or "trl", from the signature; a ConfigError for one that fits neither."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise ConfigError(f"task.reward_funcs: cannot read the signature of {ref!r}") from None
    names = set(params)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    if VERL_PARAMS <= names:
        return "verl"
    if "completions" in names or var_kw:
        return "trl"
    raise ConfigError(f"task.reward_funcs: {ref!r} takes ({', '.join(params)}); a reward function takes "
                      "(prompts, completions, **kwargs) as in TRL, or (data_source, solution_str, "
                      "ground_truth, extra_info=None) as in verl")


def function_name(ref: str) -> str:
    """`accuracy` for `my_rewards:accuracy` (`method` for `mod:Class.method`)."""
    return ref.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


def correct_index(refs: list[str], name: str | None) -> int:
    """Which of `refs` decides correctness: `name` as written in task.reward_funcs or its
    function name; None, the first. A ConfigError naming task.correct_from otherwise."""
    if name is None:
        return 0
    hits = {r for r in refs if name in (r, function_name(r))}
    if len(hits) == 1:
        return refs.index(hits.pop())
    choices = ", ".join(dict.fromkeys(function_name(r) for r in refs))
    if not hits:
        raise ConfigError(f"task.correct_from: {name!r} is not one of task.reward_funcs (choices: "
                          f"{choices}, or a reference as listed: {', '.join(refs)})")
    raise ConfigError(f"task.correct_from: {name!r} names {len(hits)} of task.reward_funcs "
                      f"({', '.join(sorted(hits))}); give the one meant as module:function")


def _run(result):
    """The value of an awaitable, from sync code on any thread (an event loop may be running)."""
    if not inspect.isawaitable(result):
        return result

    async def wait():
        return await result

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # not this thread's running loop
        return pool.submit(asyncio.run, wait()).result()


def _row(meta: dict) -> str:
    return f"the row with prompt {str(meta.get('_prompt'))[:80]!r}"


def verl_truth(meta: dict):
    """The ground truth as verl reads it: `reward_model["ground_truth"]`; the top-level
    `ground_truth` column only for a row without `reward_model`. KeyError when neither."""
    model = meta.get("reward_model")
    if model is not None:
        if not isinstance(model, dict) or "ground_truth" not in model:
            raise KeyError("its reward_model has no 'ground_truth'")
        return model["ground_truth"]
    if "ground_truth" not in meta:
        raise KeyError("it has neither reward_model.ground_truth nor a ground_truth column")
    return meta["ground_truth"]


class RewardFunc:
    def __init__(self, ref: str, fn: Callable | None = None):
        self.ref, self.fn = ref, fn or resolve(ref)
        self.style = style(self.fn, ref)
        params = inspect.signature(self.fn).parameters
        self.accepts = None if any(p.kind is p.VAR_KEYWORD for p in params.values()) else set(params)
        self.required = [n for n, p in params.items() if p.default is p.empty
                         and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        extra = [n for n in self.required if n not in CONVENTION["verl"]]
        if self.style == "verl" and extra:  # verl passes its four arguments and nothing else
            raise ConfigError(f"task.reward_funcs: {ref!r} requires {', '.join(extra)}, which verl's "
                              "compute_score is never given (data_source, solution_str, ground_truth, extra_info)")

    def missing_columns(self, columns: set[str]) -> list[str]:
        """The required parameters that neither the convention nor `columns` supplies."""
        return [n for n in self.required if n not in CONVENTION[self.style] and n not in columns]

    def _call(self, kw: dict, where: str):
        kw = kw if self.accepts is None else {k: v for k, v in kw.items() if k in self.accepts}
        try:
            return _run(self.fn(**kw))
        except Exception as e:
            raise RewardFunctionError(f"reward function {self.ref} on {where} raised {type(e).__name__}: {e}") from e

    def _value(self, value, where: str) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise RewardFunctionError(f"reward function {self.ref} on {where} returned {value!r}; a reward "
                                      "is a finite number or None")
        return float(value)

    def values(self, texts: list[str], metas: list[dict], ids: list | None = None,
               state: TrainerState | None = None) -> list[float | None]:
        """One value (or None) per answer: one call for the batch (TRL), one per answer (verl)."""
        if self.style == "verl":
            return [self._verl(t, m) for t, m in zip(texts, metas)]
        given = {"completion_ids": ids, "trainer_state": state}
        lacking = [k for k in self.required if k in given and given[k] is None]
        if lacking:
            raise RewardFunctionError(f"reward function {self.ref} requires {', '.join(lacking)}, which this "
                                      "call does not have: task.score(text, meta) scores the text alone; "
                                      "task.score_batch(texts, metas, ids, step) passes them, and a critic "
                                      "passes its requests' with rltf_ray.critics.score_items(task, items)")
        prompts = [m.get("_prompt") for m in metas]
        kw = {k: [m.get(k) for m in metas] for k in sorted({k for m in metas for k in m} - {"_prompt"})}
        kw.update(prompts=prompts, completions=[[{"role": "assistant", "content": t}] if isinstance(p, list) else t
                                                for p, t in zip(prompts, texts)])
        kw.update({k: v for k, v in given.items() if v is not None})
        n = len(texts)
        where = _row(metas[0]) if n == 1 else f"a batch of {n} answers (the first is {_row(metas[0])})"
        try:
            out = self._call(kw, where)
        except RewardFunctionError:
            if n > 1:  # which row makes it raise: each alone names its own, if one does
                for i in range(n):
                    self.values([texts[i]], [metas[i]], None if ids is None else [ids[i]], state)
            raise
        if not isinstance(out, (list, tuple)) or len(out) != n:
            got = f"{len(out)} values" if isinstance(out, (list, tuple)) else type(out).__name__
            raise RewardFunctionError(f"reward function {self.ref} on {where} returned {got} for {n} "
                                      f"completion{'s' if n > 1 else ''} (a list of one float or None per "
                                      "completion is expected)")
        return [self._value(v, _row(m)) for v, m in zip(out, metas)]

    def _verl(self, text: str, meta: dict) -> float | None:
        try:
            truth = verl_truth(meta)
        except KeyError as e:
            raise RewardFunctionError(f"reward function {self.ref} on {_row(meta)}: {e.args[0]}") from None
        out = self._call({"data_source": meta.get("data_source"), "solution_str": text, "ground_truth": truth,
                          "extra_info": meta.get("extra_info") or {}}, _row(meta))
        return self._value(out.get("score") if isinstance(out, dict) else out, _row(meta))


@register_task("reward_funcs")
class RewardFuncTask(Task):
    """The task `task.reward_funcs` builds (see the module docstring)."""

    answer_format = None  # the revision turn asks for no format: the functions define it
    meta_keys = ()
    scores_prompt = True
    default_params: dict = {}

    def __init__(self, cfg):
        super().__init__(cfg)
        if not cfg.reward_funcs:
            raise ConfigError("task reward_funcs: list the functions in task.reward_funcs")
        self.funcs = [RewardFunc(ref) for ref in cfg.reward_funcs]
        self.weights = list(cfg.reward_weights or [1.0] * len(self.funcs))
        self.judge = correct_index(list(cfg.reward_funcs), cfg.correct_from)

    def check_columns(self, columns: set[str], key: str) -> None:
        for f in self.funcs:
            missing = f.missing_columns(columns)
            if missing:
                raise ConfigError(f"{key}: reward function {f.ref} requires {', '.join(repr(m) for m in missing)}, "
                                  f"which no column of the file supplies (columns: {', '.join(sorted(columns)) or 'none'})")

    def validate_meta(self, meta: dict) -> str:
        if any(f.style == "verl" for f in self.funcs):
            try:
                verl_truth(meta)
            except KeyError as e:
                return f"a verl compute_score needs a ground truth: {e.args[0]}"
        return ""

    def score_batch(self, texts: list[str], metas: list[dict], ids: list | None = None,
                    step: int | None = None) -> list[Score]:
        if not texts:
            return []
        state = None if step is None else TrainerState(step)
        values = list(zip(*(f.values(texts, metas, ids, state) for f in self.funcs)))
        unscored = [i for i, got in enumerate(values) if all(v is None for v in got)]
        if unscored:  # as TRL: the answer's sum is 0, and the user hears of it
            logger.warning("reward functions %s all returned None for %d of %d answers (the first is %s): "
                           "each scores 0", ", ".join(f.ref for f in self.funcs), len(unscored), len(texts),
                           _row(metas[unscored[0]]))
        out = []
        for got in values:
            reward = sum(w * v for w, v in zip(self.weights, got) if v is not None)
            judged = got[self.judge]
            out.append(Score(reward, judged is not None and judged >= self.cfg.correct_threshold, True))
        return out

    def score(self, text: str, meta: dict) -> Score:
        return self.score_batch([text], [meta])[0]

    def critique_scored(self, text: str, meta: dict, score: Score) -> str:
        return "Your answer is correct." if score.correct else "Your answer is incorrect."

    def critique(self, text: str, meta: dict) -> str:
        return self.critique_scored(text, meta, self.score(text, meta))
