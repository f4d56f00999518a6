"""`ray job submit` against a head node started by the test on 127.0.0.1."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def test_ray_job_submit_runs_the_pipeline(tmp_path):
    env = dict(os.environ, PATH=f"{BIN}:{os.environ['PATH']}", RAY_AUTH_MODE="disabled")
    env.pop("RAY_ADDRESS", None)
    ray_cli = str(BIN / "ray")
    subprocess.run([ray_cli, "start", "--head", "--node-ip-address=127.0.0.1", "--port=6391",
                    "--dashboard-host=127.0.0.1", "--dashboard-port=8276", "--num-cpus=8",
                    "--disable-usage-stats"], check=True, env=env, capture_output=True, timeout=180)
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
