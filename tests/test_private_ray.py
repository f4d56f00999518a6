"""The Ray internals rltf_ray still leans on, each for want of a public API, and the Ray
behaviour that keeps it needed. A Ray upgrade that moves one fails here, by name, rather than
deep inside a run."""
import inspect

import pytest


def test_the_py_modules_upload_helper_is_where_plugins_uploaded_expects_it():
    """rltf_ray.plugins._uploaded: Ray's own upload of a job's local py_modules."""
    try:
        import ray._private.worker as worker
        from ray._private.node import Node
        from ray._private.runtime_env.py_modules import upload_py_modules_if_needed
    except ImportError as e:
        pytest.fail(f"rltf_ray.plugins._uploaded: Ray moved its private py_modules upload ({e}); find "
                    "its new home, or a public way to ship local folders to an actor")
    params = inspect.signature(upload_py_modules_if_needed).parameters
    assert {"runtime_env", "scratch_dir", "include_gitignore"} <= set(params), (
        f"rltf_ray.plugins._uploaded: upload_py_modules_if_needed now takes {list(params)}")
    assert hasattr(worker.global_worker, "node") and hasattr(Node, "get_runtime_env_dir_path"), (
        "rltf_ray.plugins._uploaded: a worker's node no longer names its runtime_env scratch folder")


def test_an_actor_still_refuses_local_folders_in_its_runtime_env(tmp_path):
    """Why rltf_ray.plugins._uploaded exists at all: when this fails, Ray ships a local folder
    per actor, and the private call can go."""
    import ray

    def f():
        return 1

    for env in ({"py_modules": [str(tmp_path)]}, {"working_dir": str(tmp_path)}):
        with pytest.raises(ValueError, match="only supported at the job level"):
            ray.remote(f).options(runtime_env=env)


def test_ray_init_still_takes_a_metrics_export_port():
    """rltf_ray.ray_start.init_ray passes run.metrics_export_port as ray.init's hidden option."""
    import ray

    assert "_metrics_export_port" in inspect.getsource(inspect.unwrap(ray.init)), (
        "ray.init no longer takes _metrics_export_port: run.metrics_export_port needs another way in")
