"""Runs that share a cluster stay apart: each deploys its critic under a name of its own and
never replaces (or, when it stops, deletes) another run's."""
import pytest

from rltf_ray.graph import CritiqueParams
from rltf_ray.critic_app import critic_app_name
from conftest import critic_plugin  # noqa: E402


def test_each_run_deploys_its_critic_under_a_name_of_its_own():
    assert critic_app_name(CritiqueParams(), "ab12cd", {"rltf_critic_ff00aa"}) == "rltf_critic_ab12cd"
    assert critic_app_name(CritiqueParams(app_name="mine"), "ab12cd", set()) == "mine"
    with pytest.raises(RuntimeError, match="'mine' is already running on this cluster"):
        critic_app_name(CritiqueParams(app_name="mine"), "ab12cd", {"mine"})  # would replace it
    assert critic_app_name(CritiqueParams(attach=True), "ab12cd", {"rltf_critic"}) == "rltf_critic"
    with pytest.raises(RuntimeError, match="attach=true but no Serve app named 'judge' is running"):
        critic_app_name(CritiqueParams(attach=True, app_name="judge"), "ab12cd", {"rltf_critic"})


@pytest.mark.integration
@pytest.mark.slow  # `make test` runs the two concurrent training runs below; this adds stop()'s scope
def test_two_runs_on_one_ray_keep_their_own_critics(tmp_path):
    """Two runs started on one Ray: each deploys its own critic app; the first one's stop
    deletes only its own, and the second's critic still answers."""
    import ray
    from ray import serve

    from rltf_ray.loading import load_config
    from rltf_ray.runner import Pipeline
    from rltf_ray.stages.critique import ask_critic

    ray.init(num_cpus=4, include_dashboard=False)
    runs = [Pipeline(load_config("pipelines/configs/tiny.yaml", [f"run.output_dir={tmp_path / str(i)}",
                                                                  "run.serve_http_port=8177"]))
            for i in range(2)]
    try:
        for r in runs:
            r.start(train=False)
        a, b = (r.critic_params.app_name for r in runs)
        assert a != b and {a, b} <= set(serve.status().applications)
        runs[0].stop()
        assert a not in serve.status().applications and b in serve.status().applications
        row = {"prompt": "What is 2 + 3?", "meta": {"a": 2, "b": 3, "op": "+", "answer": 5}}
        [(res, err)] = ask_critic(runs[1].critic_params, [row], ["<answer>6</answer>"], [0]).values()
        assert res is not None and res["correct"] is False, err
    finally:
        runs[1].stop()
        serve.shutdown()
        ray.shutdown()


@pytest.mark.integration
def test_a_workers_own_runtime_env_keeps_the_jobs(tmp_path):
    """A job's runtime_env (env vars such as API keys, py_modules, pip) must survive in the
    Serve replicas and the Ray Data / Train workers that set a runtime_env of their own: Ray
    replaces a parent's py_modules by the child's, and Serve adds only the job's working_dir
    to a deployment that sets one."""
    import ray

    from rltf_ray.config import TaskConfig
    from rltf_ray.plugins import worker_runtime_env
    from rltf_ray.stages.critique import build_critic_app

    lib = tmp_path / "job_lib"
    lib.mkdir()
    (lib / "__init__.py").write_text("X = 1\n")
    plugin = tmp_path / "iso_plugin.py"
    plugin.write_text("Y = 2\n")
    ray.init(num_cpus=1, include_dashboard=False,
             runtime_env={"env_vars": {"JOB_API_KEY": "k"}, "py_modules": [str(lib)]})
    try:
        job_modules = list(ray.get_runtime_context().runtime_env["py_modules"])  # uploaded: gcs:// URIs
        env = worker_runtime_env([str(plugin)])
        assert env["env_vars"] == {"JOB_API_KEY": "k", "RLTF_RAY_PLUGINS": "iso_plugin"}
        assert env["py_modules"][:1] == job_modules and len(env["py_modules"]) == 2
        replica = build_critic_app(TaskConfig(), CritiqueParams(), plugins=[str(plugin)])._bound_deployment
        assert replica.ray_actor_options["runtime_env"]["env_vars"]["JOB_API_KEY"] == "k"
        assert job_modules[0] in replica.ray_actor_options["runtime_env"]["py_modules"]

        @ray.remote(runtime_env=env)
        def on_worker():
            import os

            import iso_plugin
            import job_lib

            return os.environ["JOB_API_KEY"], job_lib.X + iso_plugin.Y

        assert ray.get(on_worker.remote()) == ("k", 3)
    finally:
        ray.shutdown()


@pytest.mark.integration
def test_stop_ends_everything_the_run_started_on_a_ray_that_outlives_it(tmp_path):
    """On a joined Ray (a notebook's, a cluster's) stop() leaves nothing of the run behind:
    engines, the step broker (which holds the last step's rows and weights), the critic app."""
    import ray
    from ray import serve

    from rltf_ray.loading import load_config
    from rltf_ray.runner import Pipeline

    ray.init(num_cpus=4, include_dashboard=False)
    try:
        p = Pipeline(load_config("pipelines/configs/tiny.yaml", [f"run.output_dir={tmp_path}", "run.steps=1",
                                                                  "trainer.num_workers=1", "run.serve_http_port=8178"]))
        p.start()
        names = [p.broker_name, f"rltf/engine-{p.run_id}-0"]
        assert all(ray.get_actor(n) for n in names) and p.critic_params.app_name in serve.status().applications
        p.stop()
        for n in names:
            with pytest.raises(ValueError):
                ray.get_actor(n)
        assert p.critic_params.app_name not in serve.status().applications
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.mark.integration
def test_a_run_that_dies_without_stopping_loses_its_critic_app(tmp_path):
    """The case Tune's early stop and a killed job make: the process that started the run
    dies, Ray ends the actors it owned, and the reaper deletes the critic app that Serve's
    controller owns; the other run's app stays."""
    import time

    import ray
    from ray import serve

    from rltf_ray import reaper
    from rltf_ray.loading import load_config
    from rltf_ray.runner import Pipeline

    @ray.remote(num_cpus=0)
    class Owner:  # stands for a Tune trial, or a job's driver
        def start(self, out: str) -> str:
            self.p = Pipeline(load_config("pipelines/configs/tiny.yaml", [f"run.output_dir={out}",
                                                                          "run.serve_http_port=8179"]))
            self.p.start(train=False)  # the critic app and the engines
            return self.p.critic_params.app_name

    ray.init(num_cpus=4, include_dashboard=False)
    try:
        owners = [Owner.remote() for _ in range(2)]
        doomed, kept = ray.get([o.start.remote(str(tmp_path / str(i))) for i, o in enumerate(owners)])
        watcher = ray.get_actor(reaper.REAPER, namespace=reaper.NAMESPACE)
        assert ray.get(watcher.watching.remote()) == sorted([doomed, kept])
        ray.kill(owners[0])  # no stop(): the run's process is gone
        deadline = time.time() + 60
        while doomed in serve.status().applications and time.time() < deadline:
            time.sleep(1)
        assert doomed not in serve.status().applications and kept in serve.status().applications
        assert ray.get(watcher.watching.remote()) == [kept]
        ray.get(owners[1].__ray_call__.remote(lambda self: self.p.stop()))
        assert kept not in serve.status().applications
        deadline = time.time() + 30  # nothing left to watch: the reaper goes too
        while time.time() < deadline and reaper.REAPER in [a.get("name") for a in ray.util.list_named_actors(True)]:
            time.sleep(1)
        assert reaper.REAPER not in [a.get("name") for a in ray.util.list_named_actors(True)]
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.mark.integration
def test_two_concurrent_training_runs_each_get_only_their_own_plugin_critics_critiques(tmp_path):
    """Two runs training at the same time on one Ray, each with a plugin critic of its own:
    every critique a run trained on came from its own critic, and both finish."""
    import json
    import threading

    import pyarrow.parquet as pq
    import ray

    from rltf_ray.loading import load_config
    from rltf_ray.runner import Pipeline

    runs, results = [], {}
    for name in ("critic_one", "critic_two"):
        (tmp_path / f"{name}.py").write_text(critic_plugin(name, f"'from {name}'"))
        cfg = load_config("pipelines/configs/tiny.yaml",
                          [f"run.output_dir={tmp_path / name}", "run.steps=1", "run.eval_before_after=false",
                           "trainer.num_workers=1", f"pipeline.critic.critic={name}", "run.serve_http_port=8178"],
                          plugins=[str(tmp_path / f"{name}.py")])
        runs.append((name, cfg))
    ray.init(address="local", num_cpus=8, include_dashboard=False)

    def train(name, cfg):
        p = Pipeline(cfg)
        try:
            p.start()
            results[name] = p.train()
        except BaseException as e:  # reported below, with the other run's outcome
            results[name] = e
        finally:
            p.stop()

    try:
        threads = [threading.Thread(target=train, args=run) for run in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=900)
    finally:
        ray.shutdown()
    assert all(isinstance(results.get(name), dict) for name, _ in runs), results
    for name, _ in runs:
        rows = pq.read_table(tmp_path / name / "rollouts" / "step_0.parquet").to_pylist()
        critiques = {r["critique"] for r in rows if r["revised"]}
        assert critiques == {f"from {name}"}, (name, critiques)
        assert json.loads((tmp_path / name / "summary.json").read_text())["engine_versions"] == [1]
