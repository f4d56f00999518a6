"""Reward functions as TRL and verl users already have them, with no `Task` subclass.

`task.reward_funcs: [module:function, ...]` (a plugin module, an installed one, or
`path/to/file.py:function`, which is then shipped as a plugin) builds the task
`reward_funcs`. Its prompts come from a file (`pipeline.prompts.path`, held-out ones from
`eval.path`); each row's columns other than the prompt and its id form its `meta`. A function
is called once per scored answer, in one of two styles:

* **TRL** (the default): `f(prompts=[p], completions=[c], **columns)`, every other column
  passed as a keyword argument holding a one-element list. Shapes as in TRL: `p` and `c` are
  strings for a plain prompt; for a chat prompt `p` is its message list and `c` is
  `[{"role": "assistant", "content": text}]`. It returns a list of one float or None; None
  leaves the function out of that answer's sum, as in TRL. A function without `**kwargs`
  gets only the columns it names.
* **verl**: a function whose parameters include `solution_str` and `ground_truth` (verl's
  `compute_score`): `f(data_source=..., solution_str=text, ground_truth=..., extra_info=...)`,
  the ground truth from the row's `reward_model.ground_truth` (verl's parquet rows) or its
  `ground_truth` column. It returns a float, or a dict whose "score" is the reward.

`async def` functions of either style are awaited. The reward is the weighted sum
(`task.reward_weights`, 1 each by default) of the functions that returned a number; an
answer counts as correct when that sum reaches `task.correct_threshold` (1.0 by default).
Critiques come from the configured critic; the task's own is the verdict alone.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import inspect
import math
import numbers
from typing import Callable

from rltf_ray.errors import ConfigError
from rltf_ray.tasks.base import Score, Task, register_task

VERL_PARAMS = frozenset({"solution_str", "ground_truth"})


class RewardFunctionError(RuntimeError):
    """A reward function raised, or returned something that is not a reward, on a row."""


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
    style(fn, ref)
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


class RewardFunc:
    def __init__(self, ref: str, fn: Callable | None = None):
        self.ref, self.fn = ref, fn or resolve(ref)
        self.style = style(self.fn, ref)
        params = inspect.signature(self.fn).parameters
        self.accepts = None if any(p.kind is p.VAR_KEYWORD for p in params.values()) else set(params)

    def _kwargs(self, text: str, meta: dict) -> dict:
        columns = {k: v for k, v in meta.items() if k != "_prompt"}
        if self.style == "verl":
            truth = (meta.get("reward_model") or {}).get("ground_truth") if isinstance(
                meta.get("reward_model"), dict) else None
            kw = {"data_source": meta.get("data_source"), "solution_str": text,
                  "ground_truth": meta.get("ground_truth", truth), "extra_info": meta.get("extra_info")}
        else:
            prompt = meta.get("_prompt")
            chat = isinstance(prompt, list)
            kw = {**{k: [v] for k, v in columns.items()}, "prompts": [prompt],
                  "completions": [[{"role": "assistant", "content": text}] if chat else text]}
        return kw if self.accepts is None else {k: v for k, v in kw.items() if k in self.accepts}

    def __call__(self, text: str, meta: dict) -> float | None:
        where = f"reward function {self.ref} on the row with prompt {str(meta.get('_prompt'))[:80]!r}"
        try:
            out = _run(self.fn(**self._kwargs(text, meta)))
        except Exception as e:
            raise RewardFunctionError(f"{where} raised {type(e).__name__}: {e}") from e
        if self.style == "verl":
            value = out.get("score") if isinstance(out, dict) else out
        else:
            if not isinstance(out, (list, tuple)) or len(out) != 1:
                got = f"{len(out)} values" if isinstance(out, (list, tuple)) else type(out).__name__
                raise RewardFunctionError(f"{where} returned {got} for 1 completion (a list of one "
                                          "float or None is expected)")
            value = out[0]
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise RewardFunctionError(f"{where} returned {value!r}; a reward is a finite number or None")
        return float(value)


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

    def score(self, text: str, meta: dict) -> Score:
        values = [f(text, meta) for f in self.funcs]
        if all(v is None for v in values):
            raise RewardFunctionError(f"every reward function returned None for the row with prompt "
                                      f"{str(meta.get('_prompt'))[:80]!r}: none of them scores it")
        reward = sum(w * v for w, v in zip(self.weights, values) if v is not None)
        return Score(reward, reward >= self.cfg.correct_threshold, True)

    def critique(self, text: str, meta: dict) -> str:
        return "Your answer is correct." if self.score(text, meta).correct else "Your answer is incorrect."
