"""Multi-node placement on a simulated cluster (`ray.cluster_utils.Cluster`): each role's
custom resource lives on its own node, so engines, the critic replica and the training
workers land on different nodes; with two engines a step's rows are split between them and
both receive every weight update."""
import json

import pytest

from rltf_ray.loading import load_config

pytestmark = pytest.mark.integration


@pytest.mark.slow  # ~4-8 min on 2 cores: `make test-all`
def test_roles_on_their_own_nodes_and_two_engines_share_the_rows(tmp_path, tiny_path):
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.state import list_actors

    from rltf_ray.runner import Pipeline

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": True,
                                                           "dashboard_host": "127.0.0.1", "dashboard_port": 8292})
    nodes = {"engine_a": cluster.add_node(num_cpus=2, resources={"engine_node": 1}),
             "engine_b": cluster.add_node(num_cpus=2, resources={"engine_node": 1}),
             "critic": cluster.add_node(num_cpus=1, resources={"critic_node": 1}),
             "trainer": cluster.add_node(num_cpus=2, resources={"trainer_node": 2})}
    ray.init(address=cluster.address)
    try:
        cfg = load_config("pipelines/configs/tiny.yaml",
                          [f"run.output_dir={tmp_path}", "run.steps=2", "run.eval_before_after=false",
                           "run.serve_http_port=8191", "engine.num_engines=2", "engine.resources={engine_node: 1}",
                           "pipeline.critic.resources={critic_node: 1}", "trainer.resources={trainer_node: 1}"])
        pipe = Pipeline(cfg)
        pipe.start()
        try:
            summary = pipe.train()
            # dead ones too: the Ray Train workers exit when train() returns
            actors = list_actors(address=cluster.address, detail=True, limit=1000)
        finally:
            pipe.stop()
        node_of = {}
        for a in actors:
            if (a.name or "").startswith("rltf/engine-"):
                node_of.setdefault("engines", set()).add(a.node_id)
            elif "ProgrammaticCritic" in (a.class_name or ""):
                node_of.setdefault("critic", set()).add(a.node_id)
            elif "TrainWorker" in (a.class_name or ""):
                node_of.setdefault("trainer", set()).add(a.node_id)
        want = {k: n.node_id for k, n in nodes.items()}
        assert node_of["engines"] == {want["engine_a"], want["engine_b"]}
        assert node_of["critic"] == {want["critic"]} and node_of["trainer"] == {want["trainer"]}
        assert summary["engine_versions"] == [2, 2]  # both engines got every weight update
        for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
            per = json.loads(line)["rows_per_engine"]
            assert set(per) == {"0", "1"} and per["0"] == per["1"]  # 4 prompts x 4 samples, halved
    finally:
        ray.shutdown()
        cluster.shutdown()
