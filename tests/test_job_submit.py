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


def test_an_in_process_run_beside_a_ray_start_cluster_finishes(tmp_path):
    """Another cluster on the machine (`ray start`, the one a bare state-API call would find):
    a run on a Ray of its own keeps its learner. Ray Train's placement-group cleaner used to
    ask that other cluster whether this run's controller lived, and removed the live learner
    within seconds of its start."""
    env = head_node(GCS_PORT, DASHBOARD_PORT)
    try:
        run = subprocess.run([sys.executable, "-m", "rltf_ray.cli", "run", "--config", "pipelines/configs/tiny.yaml",
                              f"run.output_dir={tmp_path / 'beside'}", "run.steps=3", "run.eval_before_after=false",
                              "run.serve_http_port=8126"],
                             env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        assert "local Ray started in-process" in run.stdout
        steps = [json.loads(x)["step"] for x in (tmp_path / "beside" / "metrics.jsonl").read_text().splitlines()]
        assert steps == [0, 1, 2]
    finally:
        stop_head(GCS_PORT)
