"""`ray job submit` and `serve deploy` against a head node started by the test on 127.0.0.1."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from conftest import critic_plugin, head_node, stop_head  # noqa: E402

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
GCS_PORT, DASHBOARD_PORT = 6391, 8276


# says what of the job's runtime_env reached its Serve replica
JOB_CRITIC = critic_plugin("job_env_critic", "f\"job var {os.environ.get('RLTF_JOB_VAR')} lib {job_lib_mod.VALUE}\"",
                           imports="import os\n\nimport job_lib_mod")


def test_ray_job_submit_runs_the_pipeline(tmp_path):
    """A job with a runtime_env of its own (py_modules, env vars) and a plugin critic: the
    plugin does not clash with the job's py_modules, and its Serve replica keeps the job's."""
    env = head_node(GCS_PORT, DASHBOARD_PORT)
    ray_cli = str(BIN / "ray")
    lib = tmp_path / "job_lib_mod"
    lib.mkdir()
    (lib / "__init__.py").write_text("VALUE = 41\n")
    (tmp_path / "job_critic.py").write_text(JOB_CRITIC)
    try:
        runtime_env = {"excludes": [".venv", ".git", "outputs", "*.parquet", "*.safetensors"],
                       "py_modules": [str(lib)], "env_vars": {"RLTF_JOB_VAR": "seen"}}
        for _ in range(6):
            job = subprocess.run(
                [ray_cli, "job", "submit", "--address", "http://127.0.0.1:8276", "--working-dir", str(ROOT),
                 "--runtime-env-json", json.dumps(runtime_env), "--",
                 "python", "pipelines/run.py", "--config", "pipelines/configs/tiny.yaml",
                 "--output-dir", str(tmp_path / "job"), "--plugin", str(tmp_path / "job_critic.py"),
                 "run.steps=1", "run.eval_before_after=false", "run.serve_http_port=8125",
                 "pipeline.critic.critic=job_env_critic"],
                env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
            # `ray start` returns before the head's job agent answers: on a loaded machine a
            # submit right away is refused, and nothing ran; ask again
            if "No available agent to submit job" not in job.stdout + job.stderr:
                break
            time.sleep(10)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert "step 1/1" in job.stdout and "succeeded" in job.stdout
        lines = (tmp_path / "job" / "metrics.jsonl").read_text().splitlines()
        assert json.loads(lines[0])["policy_version"] == 1
        assert (tmp_path / "job" / "checkpoints" / "step_1" / "model.safetensors").is_file()
        import pyarrow.parquet as pq

        critiques = {r["critique"] for r in pq.read_table(tmp_path / "job" / "rollouts" / "step_0.parquet").to_pylist()
                     if r["critique"]}
        assert critiques == {"job var seen lib 41"}, critiques
    finally:
        stop_head(GCS_PORT)


def test_serve_deploy_config_serves_the_critic_over_http():
    env = head_node(GCS_PORT, DASHBOARD_PORT, PYTHONPATH=str(ROOT))  # the config's import path must be importable
    try:
        dep = subprocess.run([str(BIN / "serve"), "deploy", "serve/critic.yaml", "-a", "http://127.0.0.1:8276"],
                             env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert dep.returncode == 0, dep.stdout + dep.stderr
        meta = {"a": 40, "b": 2, "op": "+", "answer": 42}
        deadline, reply = time.time() + 180, None
        while time.time() < deadline:
            try:
                reply = requests.post("http://127.0.0.1:8000/rltf_critic", timeout=10,
                                      json={"response": "<answer>41</answer>", "meta": meta})
                if reply.status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(2)
        assert reply is not None and reply.status_code == 200, reply and reply.text
        body = reply.json()
        assert body["correct"] is False and body["reward"] == 0.0 and "too low" in body["critique"]
        status = subprocess.run([str(BIN / "serve"), "status", "-a", "http://127.0.0.1:8276"], env=env,
                                capture_output=True, text=True, timeout=60)
        assert "rltf_critic" in status.stdout and "RUNNING" in status.stdout
    finally:
        stop_head(GCS_PORT)


def test_an_in_process_rays_workers_read_actor_state_from_it_when_a_ray_start_cluster_comes_up():
    """Ray Train's placement-group cleaner asks the state API (`ray.util.state.get_actor`, no
    address) once a second whether a run's learner controller lives. After `ray start` on the
    machine, that call in a worker of a run's in-process Ray used to ask the new cluster, find
    no such actor, and the cleaner removed the live learner. The run's own actor is found."""
    import ray

    from rltf_ray.loading import load_config
    from rltf_ray.ray_start import init_ray

    @ray.remote(num_cpus=0)
    class Alive:
        def ident(self):
            return ray.get_runtime_context().get_actor_id()

    @ray.remote(num_cpus=0)
    def state_of(actor_id: str):
        from ray.util.state import get_actor

        got = get_actor(actor_id, timeout=30)
        return got.state if got is not None else None

    assert init_ray(load_config("pipelines/configs/tiny.yaml", ["run.local_num_cpus=2"]))
    try:
        actor = Alive.remote()
        head_node(GCS_PORT, DASHBOARD_PORT)  # now the machine's "current" cluster
        assert ray.get(state_of.remote(ray.get(actor.ident.remote()))) == "ALIVE"
    finally:
        ray.shutdown()
        stop_head(GCS_PORT)
