"""Removes the critic app of a run that died without stopping, on a Ray that outlives it.

A run's engines, broker and learner are actors owned by the run's process, so Ray ends them
when that process dies: a killed driver, a Tune trial stopped early, a crashed job. Its Serve
app is not: Serve's controller owns every app, so the critic would stay deployed (and hold
its replicas) until someone deletes it. Each run that deploys a critic on such a Ray gives
the cluster's reaper the app's name and a lease, a tiny actor the run's process owns and so
shares its fate; when a ping of the lease finds it dead, the reaper deletes the app. The
reaper is detached, takes no CPU, and exits when it has nothing left to watch.
"""
from __future__ import annotations

import asyncio
import time

import ray

REAPER = "rltf-critic-reaper"
NAMESPACE = "rltf_ray"
POLL_S = 5.0


@ray.remote(num_cpus=0)
class Lease:
    """Alive exactly as long as the process that created it (Ray's fate sharing)."""

    def ping(self) -> bool:
        return True


@ray.remote(num_cpus=0, max_concurrency=64)
class CriticReaper:
    def __init__(self):
        self.apps: dict[str, object] = {}  # app name -> its run's lease
        self.loop: asyncio.Task | None = None
        self.closing = False

    async def watch(self, app: str, lease) -> bool:
        """Watch `app` until its run's `lease` dies. False when this reaper is already on its
        way out (the caller then starts a fresh one)."""
        if self.closing:
            return False
        self.apps[app] = lease
        if self.loop is None or self.loop.done():
            self.loop = asyncio.get_running_loop().create_task(self._poll())
        return True

    async def forget(self, app: str) -> None:
        """The run stops on its own and deletes its app itself."""
        self.apps.pop(app, None)

    async def watching(self) -> list[str]:
        return sorted(self.apps)

    async def _poll(self) -> None:
        from ray import serve

        while self.apps:
            await asyncio.sleep(POLL_S)
            for app, lease in list(self.apps.items()):
                try:
                    await asyncio.wait_for(lease.ping.remote(), POLL_S * 6)
                except ray.exceptions.ActorDiedError:  # dead for good, with its owner
                    if self.apps.pop(app, None) is not None:
                        print(f"[rltf reaper] the run of critic app '{app}' ended without stopping: deleting it",
                              flush=True)
                        try:
                            serve.delete(app, _blocking=False)
                        except Exception as e:  # Serve itself gone: nothing left to delete
                            print(f"[rltf reaper] could not delete '{app}': {type(e).__name__}: {e}", flush=True)
                except (asyncio.TimeoutError, ray.exceptions.RayActorError):
                    pass  # a busy or briefly unreachable node: a live run keeps its app; asked again
        self.closing = True
        ray.kill(ray.get_runtime_context().current_actor)  # detached: nothing else would end it


def watch(app: str):
    """Have the cluster's reaper delete `app` if this process dies without `release`; returns
    the lease (keep it: it is what the reaper pings)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # on this process's node, so that only this process's end (not another node's) ends it
    lease = Lease.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False)).remote()
    for _ in range(3):  # a reaper that is exiting as this run arrives: start a fresh one
        reaper = CriticReaper.options(name=REAPER, namespace=NAMESPACE, lifetime="detached",
                                      get_if_exists=True).remote()
        try:
            if ray.get(reaper.watch.remote(app, lease)):
                return lease
        except ray.exceptions.RayActorError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"could not start the critic reaper ({NAMESPACE}/{REAPER}) for app '{app}'")


def release(app: str, lease) -> None:
    """The run stops on its own: the reaper forgets `app`, and the lease ends."""
    try:
        reaper = ray.get_actor(REAPER, namespace=NAMESPACE)
        ray.get(reaper.forget.remote(app))
    except (ValueError, ray.exceptions.RayError):  # no reaper (it had exited), or one on its way out
        pass
    ray.kill(lease)
