"""`ray job submit` and `serve deploy` against a head node started by the test on 127.0.0.1."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def head_node(**extra_env) -> dict:
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", RAY_AUTH_MODE="disabled", **extra_env)
    env.pop("RAY_ADDRESS", None)
    subprocess.run([str(BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", "--port=6391",
                    "--dashboard-host=127.0.0.1", "--dashboard-port=8276", "--num-cpus=8",
                    "--disable-usage-stats"], check=True, env=env, capture_output=True, timeout=180)
    return env


def test_ray_job_submit_runs_the_pipeline(tmp_path):
    env = head_node()
    ray_cli = str(BIN / "ray")
    try:
        runtime_env = {"excludes": [".venv", ".git", "outputs", "*.parquet", "*.safetensors"]}
        job = subprocess.run(
            [ray_cli, "job", "submit", "--address", "http://127.0.0.1:8276", "--working-dir", str(ROOT),
             "--runtime-env-json", json.dumps(runtime_env), "--",
             "python", "pipelines/run.py", "--config", "pipelines/configs/tiny.yaml",
             "--output-dir", str(tmp_path / "job"), "run.steps=1", "run.eval_before_after=false",
             "run.serve_http_port=8125"],
            env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert "step 1/1" in job.stdout and "succeeded" in job.stdout
        lines = (tmp_path / "job" / "metrics.jsonl").read_text().splitlines()
        assert json.loads(lines[0])["policy_version"] == 1
        assert (tmp_path / "job" / "checkpoints" / "step_1" / "model.safetensors").is_file()
    finally:
        subprocess.run([ray_cli, "stop", "--force"], env=env, capture_output=True, timeout=120)


def test_serve_deploy_config_serves_the_critic_over_http():
    env = head_node(PYTHONPATH=str(ROOT))  # the config's import path must be importable
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
        subprocess.run([str(BIN / "ray"), "stop", "--force"], env=env, capture_output=True, timeout=120)
