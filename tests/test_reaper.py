"""The critic reaper keeps, per app, the leases of the runs that hold it: an app goes when its
last lease is gone, and only when that lease died with its run (rltf_ray/reaper.py)."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import deletion_log, record_delete  # noqa: E402
from rltf_ray.reaper import DEATH_MESSAGES, Holds, reason_from_message


def test_a_stale_snapshot_never_deletes_the_app_a_later_run_deployed_under_the_same_name():
    holds = Holds()
    assert holds.deploy("X", "leaseA")
    snapshot = holds.snapshot()  # the reaper pings these while the runs go on
    assert holds.release("X", "leaseA") == "last"  # run A stops and deletes X itself
    # until A says it is deleted, no run attaches to X or deploys a new X
    assert holds.attach("X", "guest") == "deleting" and not holds.deploy("X", "leaseB")
    holds.deleted("X")
    assert holds.deploy("X", "leaseB")  # run B deploys X again
    [(app, lease_id, _)] = snapshot
    assert holds.dead(app, lease_id, run_ended=True) == "gone"  # A's dead lease, from the old snapshot
    assert holds.apps() == ["X"] and holds.snapshot() == [("X", "leaseB", None)]
    assert holds.dead("X", "leaseB", run_ended=True) == "delete"


def test_an_attached_run_keeps_the_app_after_its_owner_stops_and_the_last_holder_deletes_it():
    holds = Holds()
    holds.deploy("X", "owner")
    assert holds.attach("X", "guest") == "held"
    assert holds.release("X", "owner") == "others"  # the owner's stop leaves X to the guest
    assert holds.apps() == ["X"]
    assert holds.release("X", "guest") == "last"  # the guest's stop deletes it
    assert holds.apps() == [] and not holds
    # the same, with the guest's process dying instead of stopping
    holds.deploy("Y", "owner")
    holds.attach("Y", "guest")
    holds.release("Y", "owner")
    assert holds.dead("Y", "guest", run_ended=True) == "delete" and "Y" in holds.deleting
    # while the reaper deletes Y, nobody deploys or attaches to that name; afterwards they may
    assert not holds.deploy("Y", "next") and holds.attach("Y", "next") == "deleting"
    holds.deleted("Y")
    assert holds.deploy("Y", "next")


def test_an_owner_that_dies_leaves_the_app_to_its_attached_run():
    holds = Holds()
    holds.deploy("X", "owner")
    holds.attach("X", "guest")
    assert holds.dead("X", "owner", run_ended=True) == "held"
    assert holds.release("X", "owner") == "others"  # a late stop of the dead owner changes nothing
    assert holds.release("X", "guest") == "last"


def test_an_app_no_run_deployed_is_never_held_nor_deleted():
    holds = Holds()
    assert holds.attach("theirs", "guest") == "unmanaged"  # `serve deploy` by someone else
    assert holds.release("theirs", "guest") == "unheld" and not holds


def test_a_lease_that_died_of_an_unknown_cause_pins_its_app():
    holds = Holds()
    holds.deploy("X", "owner")
    holds.attach("X", "guest")
    assert holds.dead("X", "owner", run_ended=False) == "held"  # e.g. ray.kill by someone else
    assert holds.release("X", "guest") == "others"  # not "last": the owner may live; X stays
    assert not holds  # nothing left to watch: forgotten, never deleted by the reaper
    holds.deploy("Z", "owner")
    assert holds.dead("Z", "owner", run_ended=False) == "kept" and not holds
    assert holds.release("Z", "owner") == "unheld"  # the live owner's own stop deletes it


def test_the_death_messages_name_each_cause():
    # the last line of an ActorDiedError, as Ray 2.60 words it (pinned on real Ray below)
    assert reason_from_message("The actor died unexpectedly before finishing this task.\n\tclass_name: Lease\n"
                               "The actor is dead because its owner has died. Owner Id: 02000000ff Owner "
                               "worker exit type: SYSTEM_ERROR") == "OWNER_DIED"
    assert reason_from_message("The actor died because its node has died. Node Id: ab") == "NODE_DIED"
    assert reason_from_message("... killed by `ray.kill`.") == "UNKNOWN"
    assert reason_from_message(DEATH_MESSAGES["RAY_KILL"]) == "RAY_KILL"
    assert reason_from_message("") == "UNKNOWN"


@pytest.mark.parametrize("deployed, lease, held, deletes", [
    (True, None, None, True),  # a Ray of the run's own: no reaper, the app is the run's alone
    (True, "lease", "last", True), (True, "lease", "unheld", True), (True, "lease", "others", False),
    (False, "lease", "last", True), (False, "lease", "others", False), (False, "lease", "unheld", False),
    (False, None, None, False),  # attached to an app no run deployed
])
def test_a_runs_stop_deletes_its_critic_app_only_when_no_other_run_holds_it(monkeypatch, deployed, lease,
                                                                           held, deletes):
    from types import SimpleNamespace

    from ray import serve

    from rltf_ray import reaper
    from rltf_ray.critic_app import CriticApp

    app = CriticApp(SimpleNamespace(app_name="X"), own_ray=lease is None)
    app.deployed, app.lease = deployed, lease
    released, deleted = [], []
    monkeypatch.setattr(reaper, "release", lambda app, lease: released.append((app, lease)) or held)
    monkeypatch.setattr(serve, "delete", deleted.append)
    app.close()
    assert released == ([("X", lease)] if lease else []) and deleted == (["X"] if deletes else [])
    assert app.lease is None and not app.deployed
    app.close()  # a second close does nothing more
    assert len(deleted) == deletes


# -- on real Ray: leases, their deaths and the reaper's answers --------------------------
DRIVER = """
import sys
import ray
from rltf_ray import reaper
ray.init(address=sys.argv[1], log_to_driver=False)
held = {}
print("ready", flush=True)
for line in sys.stdin:
    cmd, app = line.split()
    if cmd == "release":
        print(reaper.release(app, held.pop(app)), flush=True)
        continue
    held[app] = reaper.watch(app) if cmd == "watch" else reaper.attach(app)
    print("held" if held[app] else "none", flush=True)
"""


class Driver:
    """A run's process: another Ray driver that takes and releases leases, then ends."""

    def __init__(self, address: str):
        env = dict(os.environ, PYTHONPATH=f"{Path(__file__).parents[1]}:{os.environ.get('PYTHONPATH', '')}")
        self.p = subprocess.Popen([sys.executable, "-c", DRIVER, address], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, env=env)
        assert self.p.stdout.readline().strip() == "ready"

    def __call__(self, cmd: str, app: str) -> str:
        self.p.stdin.write(f"{cmd} {app}\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def end(self, kill: bool = False) -> None:
        self.p.kill() if kill else self.p.stdin.close()
        self.p.wait(timeout=60)


def until(check, timeout: float = 60, every: float = 0.5):
    deadline = time.time() + timeout
    while not check() and time.time() < deadline:
        time.sleep(every)
    return check()


def ping(lease, timeout: float = 60):
    """The lease's answer once it answers (a restart in progress raises for a while), or the
    ActorDiedError of a lease dead for good."""
    import ray

    deadline = time.time() + timeout
    while True:
        try:
            return ray.get(lease.ping.remote(), timeout=30)
        except ray.exceptions.ActorDiedError as e:
            return e
        except ray.exceptions.RayActorError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


@pytest.fixture(scope="module")
def cluster():
    """A Ray with its dashboard, as `ray start` and rltf_ray's own Ray have: the reaper reads a
    lease's death from the state API there."""
    import ray

    # the test module itself is imported by the reaper's worker (its fake delete below)
    tests = str(Path(__file__).parent)
    ray.init(num_cpus=1, include_dashboard=True, dashboard_host="127.0.0.1",
             runtime_env={"env_vars": {"PYTHONPATH": f"{tests}:{os.environ.get('PYTHONPATH', '')}"}})
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture
def reaper_actor(cluster):
    """The cluster's reaper, polling fast, with a delete that records instead of calling Serve."""
    import ray

    from rltf_ray import reaper
    from rltf_ray.reaper import NAMESPACE, REAPER, CriticReaper

    log = deletion_log()
    r = CriticReaper.options(name=REAPER, namespace=NAMESPACE, lifetime="detached").remote(
        delete=record_delete, poll_s=0.5)
    keep = reaper.watch("~keep")  # with nothing to watch the reaper exits: it stays for the test to ask
    yield r, lambda: ray.get(log.get.remote())
    reaper.release("~keep", keep)
    ray.kill(r)
    ray.kill(log)


@pytest.mark.integration
def test_ray_words_the_causes_the_reaper_reads(cluster):
    """A lease killed for good: Ray's message and the state API's reason, as pinned above."""
    import ray

    from rltf_ray.reaper import Lease, death_cause

    lease = Lease.remote()
    lid = ray.get(lease.ident.remote())
    ray.kill(lease, no_restart=False)  # as the memory monitor would: Ray restarts it
    time.sleep(1)
    assert ping(lease) is True and ray.get(lease.ident.remote()) == lid  # the same actor, restarted
    ray.kill(lease, no_restart=True)
    time.sleep(1)  # ray.kill returns before the actor is dead
    died = ping(lease)
    assert isinstance(died, ray.exceptions.ActorDiedError)
    assert DEATH_MESSAGES["RAY_KILL"] in str(died) and reason_from_message(str(died)) == "RAY_KILL"
    assert death_cause(lid, "", cluster) == "RAY_KILL"  # the state API's reason, without the message
    assert death_cause(lid, str(died), "127.0.0.1:1") == "RAY_KILL"  # no state API there: the message


@pytest.mark.integration
def test_attach_then_the_owner_stops_and_then_the_guest_dies(cluster, reaper_actor):
    import ray

    r, deleted = reaper_actor
    owner, guest = Driver(cluster), Driver(cluster)
    assert owner("watch", "X") == "held" and guest("attach", "X") == "held"
    assert guest("attach", "theirs") == "none"  # no run deployed it: never rltf_ray's to delete
    assert owner("release", "X") == "others"  # the owner's stop must not delete X
    owner.end()
    time.sleep(3)  # several polls
    assert ray.get(r.watching.remote()) == ["X", "~keep"] and deleted() == []
    guest.end(kill=True)  # SIGKILL: its lease dies with it, of its owner's death
    assert until(lambda: deleted() == ["X"])
    said = ray.get(r.said.remote())
    assert any("'X'" in s and "OWNER_DIED" in s and "deleting it" in s for s in said), said


@pytest.mark.integration
def test_a_lease_restarted_while_its_run_lives_keeps_the_app(cluster, reaper_actor):
    import ray

    from rltf_ray import reaper

    r, deleted = reaper_actor
    held = reaper.watch("R")
    ray.kill(held.lease, no_restart=False)  # as Ray's memory monitor would
    time.sleep(3)
    assert ping(held.lease) is True and ray.get(r.watching.remote()) == ["R", "~keep"]
    assert reaper.release("R", held) == "last" and deleted() == []


@pytest.mark.integration
def test_a_lease_killed_for_good_by_someone_else_keeps_the_app_with_a_warning(cluster, reaper_actor):
    import ray

    from rltf_ray import reaper

    r, deleted = reaper_actor
    held = reaper.watch("K")
    ray.kill(held.lease, no_restart=True)  # not the run's end: its driver (this process) lives
    assert until(lambda: ray.get(r.watching.remote()) == ["~keep"])
    said = ray.get(r.said.remote())
    assert any("WARNING" in s and "'K'" in s and "RAY_KILL" in s and "stays deployed" in s for s in said), said
    assert deleted() == []
    assert reaper.release("K", held) == "unheld"  # this run's own stop then deletes its app


@pytest.mark.integration
def test_the_reaper_deletes_the_serve_app_of_a_driver_that_died(cluster):
    """The real path: Serve's app, the reaper's own delete, a driver that exits without stop."""
    from ray import serve

    from rltf_ray.critic_app import start_serve

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    def hello(_):
        return "hi"

    start_serve(8181)
    try:
        serve.run(hello.bind(), name="reaped", route_prefix="/reaped")
        driver = Driver(cluster)
        assert driver("watch", "reaped") == "held"
        driver.end()
        assert until(lambda: "reaped" not in serve.status().applications, timeout=90)
    finally:
        serve.shutdown()
