"""The critic registry and contract, shared by the built-in critics, user plugins and the Serve
deployment that wraps any of them (`rltf_ray.critics.deployment`). It imports none of them.

The contract. A class registered with `@register_critic("name")` is built in every Serve
replica as `Cls(task, **critic_params)` -- `task` the built `rltf_ray.tasks.Task`,
`critic_params` the critique node's param of that name -- and implements

    def judge(self, items: list[dict]) -> list[dict]        # or `async def judge(...)`

Each item is {"prompt": str, "response": str, "meta": dict}, plus, where the caller knows them,
"verdict" (the verifier's verdict), "response_ids" (the answer's token ids as the engine
generated them) and "global_step" (the RL step, or the policy version in an evaluation). Each result is {"reward": float, "correct": bool,
"critique": str}, optionally "format_ok" (bool, default True); other keys reach the caller
as they are. A result may instead be an Exception: that item alone fails. A synchronous
judge runs in a worker thread, one call at a time; an async one on the replica's event loop.

Optional class hooks (defaults in `Critic`; a registered class need not subclass it), where
`params` is the node's `rltf_ray.graph.CritiqueParams` and `context` what the pipeline knows
at start-up (the learned critic's engines): `prepare(params, context)` runs in the driver
and returns the context the replicas get,
`from_params(task, params, context)` builds the critic in a replica, `replica_options(params)`
adds Ray actor options, `min_batch_wait_s` floors the batch wait, and `uses_critic_params =
False` refuses critic_params for a critic configured by the node's typed params instead.
"""
from __future__ import annotations

import inspect
import json
import math
import numbers

from rltf_ray.errors import ConfigError
from rltf_ray.plugins import load_env_plugins

_REGISTRY: dict[str, type] = {}
RESULT_KEYS = ("reward", "correct", "critique")
REQUEST_SHAPE = ("critic request must be {'prompt': str, 'response': str, 'meta': object "
                 "(or a JSON object string)}")


class CriticItemError(ValueError):
    """One request the critic could not judge (malformed, its scoring raised, or its result
    broke the contract); reported to that request's caller only."""


class Critic:
    """Optional base class of a critic: the construction hooks, with their defaults."""

    # False: built from the node's typed params (judge_model, base_url, ...); critic_params refused.
    uses_critic_params = True
    # An engine-backed critic waits at least this long to fill a batch.
    min_batch_wait_s = 0.0

    @classmethod
    def prepare(cls, params, context: dict) -> dict:
        """Driver side, before deploying: the context every replica's `from_params` gets
        (resolve paths and fail early here, where the config was written)."""
        return context

    @classmethod
    def replica_options(cls, params) -> dict:
        """Ray actor options the replica needs besides the node's resources."""
        return {}

    @classmethod
    def from_params(cls, task, params, context: dict):
        return cls(task, **params.critic_params)

    def judge(self, items: list[dict]) -> list[dict]:
        """Every critic overrides this (register_critic refuses a class that does not)."""
        raise TypeError(f"{type(self).__name__} does not implement judge(items)")


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def register_critic(name: str):
    """Class decorator: `@register_critic("my_critic")` makes `critic: my_critic` build it. In
    a plugin module (config `plugins:`), it registers in every Ray process that loads the plugin."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_critic: a non-empty name is required, got {name!r}")

    def deco(cls):
        if (not isinstance(cls, type) or not callable(getattr(cls, "judge", None))
                or cls.judge is Critic.judge):
            raise TypeError(f"register_critic({name!r}): {cls!r} is not a class with a judge(items) method")
        old = _REGISTRY.get(name)
        # the same class again (a plugin imported twice by the same name) is not a clash
        if old is not None and qualname(old) != qualname(cls):
            raise ValueError(f"register_critic({name!r}): already registered by {qualname(old)}")
        _REGISTRY[name] = cls
        return cls
    return deco


def critic_names() -> list[str]:
    load_env_plugins()
    return sorted(_REGISTRY)


def get_critic(name: str) -> type:
    """The class registered as `name`; ConfigError listing the known names if none is."""
    if name not in _REGISTRY:
        load_env_plugins()  # a Ray worker imports the driver's plugins on first use
    if name not in _REGISTRY:
        raise ConfigError(f"critic: unknown critic {name!r} (known: {', '.join(critic_names())}; "
                          "a plugin module adds one with @rltf_ray.critics.register_critic)")
    return _REGISTRY[name]


def describe(name: str, cls: type) -> str:
    return f"'{name}' ({qualname(cls)})"


def _default_factory(cls: type) -> bool:
    hook = getattr(cls, "from_params", None)
    return hook is None or getattr(hook, "__func__", None) is Critic.from_params.__func__


def check_critic_params(name: str, cls: type, critic_params: dict) -> None:
    """Refuse, before anything starts, critic_params the critic would reject or ignore."""
    if not critic_params:
        return
    if not getattr(cls, "uses_critic_params", True):
        raise ConfigError(f"critic_params: critic {name!r} takes none (it is configured by the "
                          f"critique node's own params); got {sorted(critic_params)}")
    if _default_factory(cls):
        try:
            inspect.signature(cls).bind(None, **critic_params)
        except TypeError as e:
            raise ConfigError(f"critic_params {sorted(critic_params)} do not fit critic "
                              f"{describe(name, cls)}: {e}") from None


def build_critic(cls: type, task, params, context: dict):
    hook = getattr(cls, "from_params", None)
    return hook(task, params, context) if hook else cls(task, **params.critic_params)


def prepare(cls: type, params, context: dict) -> dict:
    hook = getattr(cls, "prepare", None)
    return hook(params, context) if hook else context


def replica_options(cls: type, params) -> dict:
    hook = getattr(cls, "replica_options", None)
    return hook(params) if hook else {}


# -- what crosses the contract --------------------------------------------------------------
def critic_item(item) -> dict:
    """A request as a critic sees it (meta parsed to a dict, prompt defaulting to ""), other
    keys such as "verdict" kept; ValueError with REQUEST_SHAPE if it is malformed."""
    if (not isinstance(item, dict) or not isinstance(item.get("response"), str) or "meta" not in item
            or not isinstance(item.get("prompt", ""), str)):
        raise ValueError(REQUEST_SHAPE)
    meta = item["meta"]
    if isinstance(meta, str):
        try:
            meta = json.loads(meta)
        except json.JSONDecodeError:
            raise ValueError(f"{REQUEST_SHAPE}; meta is a string that is not JSON") from None
    if not isinstance(meta, dict):
        raise ValueError(REQUEST_SHAPE)
    ids = item.get("response_ids", [])
    if not isinstance(ids, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in ids):
        raise ValueError("critic request: 'response_ids', when given, must be a list of token ids (ints)")
    step = item.get("global_step", 0)
    if not isinstance(step, int) or isinstance(step, bool):
        raise ValueError(f"critic request: 'global_step', when given, must be an int, got {step!r}")
    return {**item, "prompt": item.get("prompt", ""), "meta": meta}


def per_item(fn, items: list) -> list:
    """`fn(item)` for each item; an item that raises gets its error in place of a result, so
    one bad item never fails the other requests of its batch."""
    out: list = []
    for x in items:
        try:
            out.append(fn(x))
        except Exception as e:
            out.append(CriticItemError(f"{type(e).__name__}: {e}"[:500]))
    return out


def _as_bool(v, key: str, owner: str) -> bool:
    if isinstance(v, bool):
        return v
    import numpy as np  # a numpy verdict is common in user code; only then is numpy needed

    if isinstance(v, np.bool_):
        return bool(v)
    raise CriticItemError(f"critic {owner}: result '{key}' must be a bool, got {type(v).__name__} {v!r}"[:500])


def check_result(owner: str, res) -> dict:
    """The result with `reward` a float, `correct` and `format_ok` bools; CriticItemError
    naming the critic if it breaks the contract (a default would hide a broken critic)."""
    if not isinstance(res, dict):
        raise CriticItemError(f"critic {owner}: a result must be a dict with {', '.join(RESULT_KEYS)}; "
                              f"got {type(res).__name__}")
    missing = [k for k in RESULT_KEYS if k not in res]
    if missing:
        raise CriticItemError(f"critic {owner}: result lacks {', '.join(repr(k) for k in missing)} "
                              f"(has {sorted(res)})"[:500])
    reward = res["reward"]
    if (isinstance(reward, bool) or not isinstance(reward, numbers.Real)
            or not math.isfinite(float(reward))):
        raise CriticItemError(f"critic {owner}: result 'reward' must be a finite number, got "
                              f"{type(reward).__name__} {reward!r}"[:500])
    if not isinstance(res["critique"], str):
        raise CriticItemError(f"critic {owner}: result 'critique' must be a str, got "
                              f"{type(res['critique']).__name__}")
    return {**res, "reward": float(reward), "correct": _as_bool(res["correct"], "correct", owner),
            "format_ok": _as_bool(res.get("format_ok", True), "format_ok", owner)}


def check_results(owner: str, items: list, results) -> list:
    """One checked result or CriticItemError per item (an exception the critic put in place
    of a result becomes that item's error)."""
    if not isinstance(results, (list, tuple)) or len(results) != len(items):
        got = f"{len(results)} results" if isinstance(results, (list, tuple)) else f"a {type(results).__name__}"
        msg = f"critic {owner}: judge() returned {got} for {len(items)} items (one result per item expected)"
        return [CriticItemError(msg) for _ in items]
    out: list = []
    for res in results:
        if isinstance(res, CriticItemError):
            out.append(res)
            continue
        if isinstance(res, BaseException):  # an error the critic put in an item's place
            out.append(CriticItemError(f"critic {owner}: {type(res).__name__}: {res}"[:500]))
            continue
        try:
            out.append(check_result(owner, res))
        except CriticItemError as e:
            out.append(e)
    return out
