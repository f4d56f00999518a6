"""Removes the critic app of a run that died without stopping, on a Ray that outlives it.

A run's engines, broker and learner are actors owned by the run's process, so Ray ends them
when that process dies: a killed driver, a Tune trial stopped early, a crashed job. Its Serve
app is not: Serve's controller owns every app, so the critic would stay deployed (and hold
its replicas) until someone deletes it. Each run that deploys a critic on such a Ray, and each
run that attaches to one a run deployed, gives the cluster's reaper a lease on the app: a tiny
actor the run's process owns and so shares its fate. The lease, not the app's name, is what
the reaper keeps: an app goes when the last lease that holds it is gone, so a run that stops
or dies never takes away an app another run (or a later run under the same name) still uses.

A lease found dead is read for its cause. Only "its owner died" or "its node died" (the lease
runs on its driver's node, so the driver went too) mean the run ended; a lease killed for
good by anything else, or one whose cause cannot be read, leaves the app deployed, with a
warning that names it. Ray restarts a lease that its memory monitor or a crash ended while
the run lives (`max_restarts=-1`), and a ping during that restart is not a death.

The reaper is detached, takes no CPU, and exits when it has nothing left to watch.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import ray

REAPER = "rltf-critic-reaper"
NAMESPACE = "rltf_ray"
POLL_S = 5.0
# The causes of a lease's death that mean its run ended (ActorDiedErrorContext.Reason).
RUN_ENDED = frozenset({"OWNER_DIED", "NODE_DIED"})
# Ray's own words for each cause, the last line of a dead actor's ActorDiedError (gcs_server,
# Ray 2.60), read when the state API cannot answer (it needs the dashboard).
DEATH_MESSAGES = {
    "OWNER_DIED": "The actor is dead because its owner has died.",
    "NODE_DIED": "The actor died because its node has died.",
    "RAY_KILL": "The actor is dead because it was killed by `ray.kill`.",
    "WORKER_DIED": "The actor is dead because its worker process has died.",
}


class Holds:
    """Which leases hold which app: the reaper's bookkeeping, without Ray. Every method is one
    step with no await inside, so the reaper actor runs each atomically."""

    def __init__(self):
        self.leases: dict[str, dict[str, object]] = {}  # app -> {lease id: lease handle}
        self.pinned: set[str] = set()  # a lease of theirs died of an unknown cause: never deleted here
        self.deleting: set[str] = set()  # the reaper is deleting them

    def __bool__(self) -> bool:
        return bool(self.leases)

    def apps(self) -> list[str]:
        return sorted(self.leases)

    def deploy(self, app: str, lease_id: str, lease=None) -> bool:
        """A run deploys `app` and holds it. False while the reaper still deletes an app of that
        name (the name is then not free yet)."""
        if app in self.deleting:
            return False
        self.leases.setdefault(app, {})[lease_id] = lease
        return True

    def attach(self, app: str, lease_id: str, lease=None) -> str:
        """A run attaches to `app`: 'held' (it now holds it too), 'unmanaged' (no run deployed
        it, or its runs have all gone: someone else owns it and rltf_ray never deletes it) or
        'deleting'."""
        if app in self.deleting:
            return "deleting"
        if app not in self.leases:
            return "unmanaged"
        self.leases[app][lease_id] = lease
        return "held"

    def release(self, app: str, lease_id: str) -> str:
        """A run stops on its own: 'last' (it held `app` and nothing holds it now: the caller
        deletes it), 'others' (another run's lease, or a pin, still holds it) or 'unheld' (it
        held nothing here: the reaper forgot it, or never knew it)."""
        leases = self.leases.get(app, {})
        mine = lease_id in leases
        leases.pop(lease_id, None)
        if leases:
            return "others"
        pinned = self._forget(app)
        if mine and not pinned:  # the caller deletes it: until `deleted`, no run attaches to it
            self.deleting.add(app)
        return "others" if pinned else "last" if mine else "unheld"

    def dead(self, app: str, lease_id: str, run_ended: bool) -> str:
        """A lease found dead for good, by a ping of a snapshot taken earlier: it removes only
        itself, and only if it still holds `app`. 'gone' (it no longer did: nothing to do),
        'held' (other leases still hold the app), 'delete' (the reaper deletes the app now) or
        'kept' (its last lease is gone but a death of unknown cause pinned it)."""
        leases = self.leases.get(app, {})
        if lease_id not in leases:
            return "gone"
        del leases[lease_id]
        if not run_ended:
            self.pinned.add(app)
        if leases:
            return "held"
        if self._forget(app):
            return "kept"
        self.deleting.add(app)
        return "delete"

    def deleted(self, app: str) -> None:
        self.deleting.discard(app)

    def snapshot(self) -> list[tuple[str, str, object]]:
        return [(app, lid, lease) for app, held in self.leases.items() for lid, lease in held.items()]

    def _forget(self, app: str) -> bool:
        """`app` has no lease left: drop it; True if it was pinned."""
        self.leases.pop(app, None)
        pinned = app in self.pinned
        self.pinned.discard(app)
        return pinned


def reason_from_message(message: str) -> str:
    """The cause of an actor's death from its ActorDiedError's text; UNKNOWN if none matches."""
    return next((r for r, text in DEATH_MESSAGES.items() if text in message), "UNKNOWN")


def death_cause(actor_id: str, message: str, address: str | None = None) -> str:
    """Why an actor died (ActorDiedErrorContext.Reason, e.g. OWNER_DIED): from Ray's state API
    where it answers (it needs the dashboard, which `ray start` and rltf_ray's own Ray run),
    else from the death's message. Blocking: call it off the event loop."""
    try:
        from ray.util.state import get_actor

        state = get_actor(actor_id, address=address, timeout=10)
        context = ((state.death_cause or {}) if state is not None else {}).get("actor_died_error_context")
        if context and context.get("reason"):
            return context["reason"]
    except Exception:  # no dashboard, or it is busy: the message says the same in words
        pass
    return reason_from_message(message)


def serve_delete(app: str) -> None:
    from ray import serve

    serve.delete(app)  # blocks until the app is gone: the reaper runs it in a thread


@ray.remote(num_cpus=0, max_restarts=-1)
class Lease:
    """Alive exactly as long as the process that created it (Ray's fate sharing); restarted if
    it alone dies (the memory monitor, a crash) while that process lives."""

    def ident(self) -> str:
        return ray.get_runtime_context().get_actor_id()

    def ping(self) -> bool:
        return True


# Serve's delete waits with ray.get, which the reaper calls from a thread of its own, away
# from its event loop: Ray's warning against a blocking get inside an async actor (the one Ray
# Train silences for its own controller) would read as a failure
@ray.remote(num_cpus=0, max_concurrency=64, runtime_env={"env_vars": {"RAY_WARN_BLOCKING_GET_INSIDE_ASYNC": "0"}})
class CriticReaper:
    def __init__(self, delete=serve_delete, poll_s: float = POLL_S):
        """`delete(app)` removes an app (Serve's, unless a test gives another)."""
        self.holds = Holds()
        self.delete, self.poll_s = delete, poll_s
        self.address = ray.get_runtime_context().gcs_address
        self.loop: asyncio.Task | None = None
        self.closing = False
        self.notes: list[str] = []  # what it printed, newest last (`said`)

    def _say(self, msg: str) -> None:
        print(f"[rltf reaper] {msg}", flush=True)
        self.notes = [*self.notes[-99:], msg]

    async def hold(self, app: str, lease_id: str, lease, deployed: bool) -> str:
        """Register a run's lease on `app` (`deployed`: the run deploys it, else it attaches):
        'held', 'unmanaged', 'deleting', or 'exiting' (this reaper is on its way out; the
        caller starts a fresh one)."""
        if self.closing:
            return "exiting"
        if deployed:
            answer = "held" if self.holds.deploy(app, lease_id, lease) else "deleting"
        else:
            answer = self.holds.attach(app, lease_id, lease)
        if answer == "held" and (self.loop is None or self.loop.done()):
            self.loop = asyncio.get_running_loop().create_task(self._poll())
        return answer

    async def release(self, app: str, lease_id: str) -> str:
        return self.holds.release(app, lease_id)

    async def deleted(self, app: str) -> None:
        """A run that released `app` last has deleted it: the name is free again."""
        self.holds.deleted(app)

    async def watching(self) -> list[str]:
        return self.holds.apps()

    async def said(self) -> list[str]:
        return self.notes

    async def _poll(self) -> None:
        while self.holds:
            await asyncio.sleep(self.poll_s)
            await asyncio.gather(*(self._check(*held) for held in self.holds.snapshot()))
        self.closing = True
        ray.kill(ray.get_runtime_context().current_actor)  # detached: nothing else would end it

    async def _check(self, app: str, lease_id: str, lease) -> None:
        try:
            await asyncio.wait_for(lease.ping.remote(), self.poll_s * 6)
            return
        except ray.exceptions.ActorDiedError as e:  # dead for good
            cause = await asyncio.to_thread(death_cause, lease_id, str(e), self.address)
        except Exception:  # restarting (ActorUnavailableError), a busy node, a timeout: asked again
            return
        run_ended = cause in RUN_ENDED
        verdict = self.holds.dead(app, lease_id, run_ended)  # the lease may have been released meanwhile
        if verdict == "gone":
            return
        if not run_ended:
            self._say(f"WARNING: a lease on critic app '{app}' ended ({cause}), not with its run's process: "
                      f"the app stays deployed; delete it with `serve.delete('{app}')` once no run uses it")
        if verdict != "delete":
            return
        self._say(f"every run of critic app '{app}' ended without stopping ({cause}): deleting it")
        try:
            await asyncio.to_thread(self.delete, app)
        except Exception as e:  # Serve itself gone: nothing left to delete
            self._say(f"could not delete '{app}': {type(e).__name__}: {e}")
        finally:
            self.holds.deleted(app)


@dataclass(frozen=True)
class Held:
    """A run's lease on an app: the actor, and its id (what the reaper knows it by)."""
    lease: object
    id: str


def _take() -> Held:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # on this process's node, so that only this process's end (not another node's) ends it
    lease = Lease.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        ray.get_runtime_context().get_node_id(), soft=False)).remote()
    return Held(lease, ray.get(lease.ident.remote()))


def _refused(app: str, held: Held) -> RuntimeError:
    ray.kill(held.lease)
    return RuntimeError(f"critique node: the Serve app '{app}' is being deleted (every run that used it "
                        "ended); start again in a few seconds")


def watch(app: str) -> Held:
    """This run deploys `app`: the cluster's reaper deletes it if this process dies without
    `release` and no other run holds it. Keep the returned lease: it is what the reaper pings."""
    held = _take()
    for _ in range(3):  # a reaper that is exiting as this run arrives: start a fresh one
        reaper = CriticReaper.options(name=REAPER, namespace=NAMESPACE, lifetime="detached",
                                      get_if_exists=True).remote()
        try:
            answer = ray.get(reaper.hold.remote(app, held.id, held.lease, True))
        except ray.exceptions.RayActorError:
            answer = "exiting"
        if answer == "held":
            return held
        if answer == "deleting":
            raise _refused(app, held)
        time.sleep(1.0)
    ray.kill(held.lease)
    raise RuntimeError(f"could not start the critic reaper ({NAMESPACE}/{REAPER}) for app '{app}'")


def attach(app: str) -> Held | None:
    """This run uses `app`, which it did not deploy: a lease of its own on it, so that the
    app stays while this run lives. None when no run deployed `app` (it is someone else's, and
    rltf_ray never deletes it)."""
    try:
        reaper = ray.get_actor(REAPER, namespace=NAMESPACE)
    except ValueError:  # no reaper: no run watches an app on this cluster
        return None
    held = _take()
    try:
        answer = ray.get(reaper.hold.remote(app, held.id, held.lease, False))
    except ray.exceptions.RayActorError:  # on its way out: it watches nothing
        answer = "unmanaged"
    if answer == "held":
        return held
    if answer == "deleting":
        raise _refused(app, held)
    ray.kill(held.lease)
    return None


def release(app: str, held: Held) -> str:
    """The run stops on its own and its lease ends. What `Holds.release` answers: 'last' (the
    caller deletes the app), 'others' (it stays for them) or 'unheld' (no reaper knew it)."""
    try:
        reaper = ray.get_actor(REAPER, namespace=NAMESPACE)
        answer = ray.get(reaper.release.remote(app, held.id))
    except (ValueError, ray.exceptions.RayError):  # no reaper (it had exited), or one on its way out
        answer = "unheld"
    ray.kill(held.lease)
    return answer


def deleted(app: str) -> None:
    """Tell the reaper that `app`, released last by this run, is deleted (see `release`)."""
    try:
        ray.get(ray.get_actor(REAPER, namespace=NAMESPACE).deleted.remote(app))
    except (ValueError, ray.exceptions.RayError):  # no reaper left: nothing remembers the name
        pass
