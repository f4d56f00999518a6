"""The one Serve deployment every critic runs behind, built-in or plugin.

It gives any registered critic what a pipeline relies on: `@serve.batch` batching, requests
checked before the critic sees them, per-item errors (one bad item never fails its batch),
each result checked against the contract, the replica's metrics, and HTTP with size and shape
checks. Retries, timeouts and the failure threshold live in the caller
(`rltf_ray.stages.critique`), so they apply to every critic alike.
"""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import time
from typing import Sequence

from ray import serve

from rltf_ray.critics.base import (CriticItemError, build_critic, check_results, critic_item,
                                   describe, get_critic, prepare, replica_options)

# Per-request access logs would print one line per rollout row.
DEPLOYMENT_OPTIONS = dict(ray_actor_options={"num_cpus": 0}, max_ongoing_requests=256,
                          logging_config={"log_level": "WARNING", "enable_access_log": False})
MAX_REQUEST_BYTES = 1_000_000  # an HTTP critic request larger than this is refused (413)


def _serve_metrics() -> dict:
    """Prometheus series of a critic replica (Serve adds the app, deployment and replica
    tags): requests, per-item failures and latency, beside Serve's own request metrics."""
    from ray.serve import metrics

    return {"requests": metrics.Counter("rltf_critic_requests", "rltf_ray: critique requests"),
            "errors": metrics.Counter("rltf_critic_item_errors", "rltf_ray: critique requests that failed"),
            "latency": metrics.Histogram("rltf_critic_latency_ms", "rltf_ray: critique latency (ms)",
                                         boundaries=[1, 5, 20, 100, 500, 2000, 10000, 60000])}


@serve.deployment(**DEPLOYMENT_OPTIONS)
class CriticDeployment:
    """Serves `judge(item)` (one request; requests are batched into the critic's
    `judge(items)`), HTTP POST of one item, and `stats()`: batches and requests seen."""

    def __init__(self, task: dict, critic: str, params, plugins: Sequence[str] = (),
                 context: dict | None = None):
        from rltf_ray.config import TaskConfig, _build
        from rltf_ray.plugins import load_plugins
        from rltf_ray.tasks import get_task

        load_plugins(list(plugins))  # first: the task or the critic may be a plugin's
        self.task = get_task(_build(TaskConfig, task, "task"))
        cls = get_critic(critic)
        self.owner = describe(critic, cls)
        self.critic = build_critic(cls, self.task, params, dict(context or {}))
        self.batches = self.requests = 0
        self._metrics: dict | None = None
        self._batch.set_max_batch_size(params.max_batch_size)
        self._batch.set_batch_wait_timeout_s(max(params.batch_wait_timeout_s,
                                                 getattr(cls, "min_batch_wait_s", 0.0)))

    async def _call(self, items: list[dict]):
        if inspect.iscoroutinefunction(self.critic.judge):
            return await self.critic.judge(items)
        # a synchronous critic must not block the replica's event loop (and its other requests)
        res = await asyncio.to_thread(self.critic.judge, items)
        return await res if inspect.isawaitable(res) else res

    async def _judge(self, items: list[dict]) -> list:
        try:
            return check_results(self.owner, items, await self._call(items))
        except Exception as e:
            if len(items) == 1:
                return [CriticItemError(f"critic {self.owner}: {type(e).__name__}: {e}"[:500])]
        # One item may have raised for all: judge each alone (one at a time, as a synchronous
        # critic may not be thread-safe), so that only the items that raise again fail.
        return [res for item in items for res in await self._judge([item])]

    @serve.batch(max_batch_size=64, batch_wait_timeout_s=0.01)
    async def _batch(self, items: list) -> list:
        self.batches += 1
        self.requests += len(items)
        out: list = []
        for x in items:  # a malformed request never reaches the critic
            try:
                out.append(critic_item(x))
            except ValueError as e:
                out.append(CriticItemError(str(e)))
        good = [i for i, x in enumerate(out) if not isinstance(x, Exception)]
        if good:
            for i, res in zip(good, await self._judge([out[i] for i in good])):
                out[i] = res
        return out

    async def judge(self, item: dict) -> dict:
        if self._metrics is None:
            self._metrics = _serve_metrics()
        start = time.perf_counter()
        try:
            res = await self._batch(item)
        except Exception:
            # a whole batch that fails (replica shutting down) still counts as a request and an error
            self._metrics["errors"].inc()
            raise
        finally:
            self._metrics["requests"].inc()
            self._metrics["latency"].observe(1000 * (time.perf_counter() - start))
        if isinstance(res, CriticItemError):
            self._metrics["errors"].inc()
            raise res
        return res

    async def __call__(self, request):
        from starlette.responses import JSONResponse

        body = await request.body()
        if len(body) > MAX_REQUEST_BYTES:
            return JSONResponse({"error": f"request body is {len(body)} bytes; the limit is "
                                          f"{MAX_REQUEST_BYTES}"}, status_code=413)
        try:
            item = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return JSONResponse({"error": f"request body is not JSON: {e}"}, status_code=400)
        try:
            return await self.judge(item)
        except CriticItemError as e:
            return JSONResponse({"error": str(e)}, status_code=400)

    def stats(self) -> dict:
        return {"batches": self.batches, "requests": self.requests}


def _merge_runtime_env(a: dict, b: dict) -> dict:
    out = {**a, **b}
    if "env_vars" in a and "env_vars" in b:
        out["env_vars"] = {**a["env_vars"], **b["env_vars"]}
    return out


def build_critic_app(task_cfg, p, learned: dict | None = None, plugins: Sequence[str] = ()):
    """The Serve application of critic `p.critic` (a `CritiqueParams`), with replicas or
    autoscaling from the config. The deployment is named after the critic's class (what the
    replica's metrics and actors are tagged with). `learned` (critic 'learned' only):
    {"engine_names", "model_path", "binac"}. `plugins`: the config's plugin modules, imported
    in the replicas and shipped to them through their runtime_env, laid over the job's own
    (`with_job_env`: Serve gives a replica that sets a runtime_env of its own only the job's
    working_dir)."""
    from rltf_ray.plugins import with_job_env, worker_runtime_env

    cls = get_critic(p.critic)
    context = prepare(cls, p, dict(learned or {}))
    opts: dict = {"num_replicas": p.num_replicas}
    if p.max_replicas is not None:
        opts = {"autoscaling_config": {"min_replicas": p.min_replicas, "max_replicas": p.max_replicas,
                                       "target_ongoing_requests": p.target_ongoing_requests}}
    actor = {**DEPLOYMENT_OPTIONS["ray_actor_options"], **replica_options(cls, p), "resources": dict(p.resources)}
    env = with_job_env(_merge_runtime_env(actor.get("runtime_env", {}), worker_runtime_env(list(plugins))))
    if env:
        actor["runtime_env"] = env
    opts["ray_actor_options"] = actor
    return CriticDeployment.options(name=cls.__name__, **opts).bind(
        dataclasses.asdict(task_cfg), p.critic, p, list(plugins), context)
