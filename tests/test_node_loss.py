"""A run's node is lost: its critic app goes, another run's stays. Two Ray nodes on this
machine (ray.cluster_utils); the run is an actor on the second node, which takes its lease
with the library's own `reaper.watch`, as a driver on that node would. The second node's
processes are then SIGKILLed."""
import os
import time
from pathlib import Path

import pytest

from conftest import deletion_log, record_delete  # noqa: E402

pytestmark = pytest.mark.integration


def until(check, timeout: float = 120, every: float = 1.0):
    deadline = time.time() + timeout
    while not check() and time.time() < deadline:
        time.sleep(every)
    return check()


def test_a_run_on_a_lost_node_loses_its_app_and_no_other(tmp_path):
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from rltf_ray import reaper
    from rltf_ray.reaper import NAMESPACE, REAPER, CriticReaper

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": True,
                                                             "dashboard_host": "127.0.0.1",
                                                             "dashboard_port": 8291})
    try:
        lost = cluster.add_node(num_cpus=1, resources={"lost": 1})
        tests = str(Path(__file__).parent)
        ray.init(address=cluster.address, runtime_env={"env_vars": {
            "PYTHONPATH": f"{tests}:{os.environ.get('PYTHONPATH', '')}"}})
        head = ray.get_runtime_context().get_node_id()
        on_head = NodeAffinitySchedulingStrategy(head, soft=False)

        @ray.remote(num_cpus=0, resources={"lost": 1})
        class Run:
            """A run whose process lives on the node that is lost."""
            def deploy(self, app: str) -> str:
                from rltf_ray import reaper as r

                self.held = r.watch(app)
                return ray.get_runtime_context().get_node_id()

        log = deletion_log(scheduling_strategy=on_head)
        r = CriticReaper.options(name=REAPER, namespace=NAMESPACE, lifetime="detached",
                                 scheduling_strategy=on_head).remote(delete=record_delete, poll_s=0.5)
        survivor = reaper.watch("S")  # a run on the head node, which lives on
        run = Run.remote()
        assert ray.get(run.deploy.remote("N")) == lost.node_id  # its lease sits on its own node
        assert ray.get(r.watching.remote()) == ["N", "S"]

        cluster.remove_node(lost, allow_graceful=False)
        assert until(lambda: ray.get(log.get.remote()) == ["N"]), ray.get(r.said.remote())
        said = ray.get(r.said.remote())
        assert any("'N'" in s and ("NODE_DIED" in s or "OWNER_DIED" in s) and "deleting it" in s for s in said), said
        time.sleep(3)  # several more polls: the live run's app is never touched
        assert ray.get(r.watching.remote()) == ["S"] and ray.get(log.get.remote()) == ["N"]
        assert reaper.release("S", survivor) == "last"
    finally:
        ray.shutdown()
        cluster.shutdown()
