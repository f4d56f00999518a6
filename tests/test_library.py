"""rltf_ray as a library: plugins, the public names, the Python API, presets in the wheel."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

import rltf_ray
from rltf_ray.errors import ConfigError
from rltf_ray.loading import load_config
from rltf_ray.plugins import ENV, PluginError, load_plugin, worker_runtime_env

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "pipelines" / "configs" / "tiny.yaml")

PLUGIN = textwrap.dedent('''
    import os

    import rltf_ray


    @rltf_ray.register_task("echo_sum")
    class EchoSum(rltf_ray.Task):
        meta_keys = ("a", "b", "answer")

        def make_problem(self, index, split):
            a, b = index % 7, (index * 3 + (split == "test")) % 5
            return {"a": a, "b": b, "answer": a + b}

        def prompt_text(self, meta):
            return f"Add {meta['a']} and {meta['b']}. Answer as <answer>n</answer>."

        def check(self, answer, meta):
            return answer.strip() == str(meta["answer"])


    @rltf_ray.register_critic("where_am_i")
    class WhereAmI:
        """Says where it runs: the file its class was imported from, in the Serve replica."""

        def __init__(self, task, prefix="from"):
            self.task, self.prefix = task, prefix

        async def judge(self, items):
            out = []
            for it in items:
                s = self.task.score(it["response"], it["meta"])
                out.append({"reward": s.reward, "correct": s.correct,
                            "critique": f"{self.prefix} {__file__} pid {os.getpid()}"})
            return out
''')


def write_plugin(folder: Path, name: str = "my_rltf_plugin", text: str = PLUGIN) -> Path:
    path = folder / f"{name}.py"
    path.write_text(text)
    return path


# -- plugins, unit ------------------------------------------------------------------------
def test_plugin_file_registers_its_task_and_ships_as_a_package(tmp_path):
    path = write_plugin(tmp_path, "plug_ship")
    cfg = load_config(TINY, ["task.name=echo_sum", "task.extraction=tag"], plugins=[str(path)])
    assert cfg.plugins == [str(path.resolve())]
    task = rltf_ray.tasks.get_task(cfg.task) if hasattr(rltf_ray, "tasks") else None
    from rltf_ray.tasks import get_task

    task = get_task(cfg.task)
    assert type(task).__module__ == "plug_ship" and task.score("<answer>7</answer>", {"a": 3, "b": 4, "answer": 7}).correct
    env = worker_runtime_env(cfg.plugins)
    assert env["env_vars"] == {ENV: "plug_ship"}
    (shipped,) = env["py_modules"]
    # the copy is a package of the plugin's name, so `import plug_ship` works on a worker
    assert Path(shipped).name == "plug_ship" and (Path(shipped) / "__init__.py").read_text() == PLUGIN


def helped_plugin(folder: Path, tag: str) -> Path:
    """A plugin file that imports a module and a package kept beside it, as users keep helpers;
    `tag` keeps the module names of one test apart from another's in the same process."""
    (folder / f"helped_util{tag}.py").write_text("def double(x):\n    return 2 * x\n")
    (folder / f"helped_pkg{tag}").mkdir()
    (folder / f"helped_pkg{tag}" / "__init__.py").write_text("OFFSET = 5\n")
    path = folder / f"plug_helped{tag}.py"
    path.write_text(f"from helped_util{tag} import double\nfrom helped_pkg{tag} import OFFSET\n\n\n"
                    "def value():\n    return double(20) + OFFSET\n")
    return path


def test_a_plugins_helpers_beside_it_load_and_ship_with_it(tmp_path):
    path = helped_plugin(tmp_path, "_a")
    assert str(tmp_path) not in sys.path  # not started from the plugin's folder
    assert sys.modules[load_plugin(str(path))].value() == 45
    env = worker_runtime_env([str(path)])
    shipped = {Path(d).name: Path(d) for d in env["py_modules"]}
    assert set(shipped) == {"plug_helped_a", "helped_util_a", "helped_pkg_a"}
    assert (shipped["helped_util_a"] / "__init__.py").read_text().startswith("def double")
    assert shipped["helped_pkg_a"] == tmp_path / "helped_pkg_a"  # a package folder ships as it is
    # each user stages copies in a folder of their own (a shared one breaks the second user)
    assert f"rltf_ray_plugins-{os.getuid()}" in str(shipped["plug_helped_a"])


def test_an_edited_plugin_is_imported_again_by_the_next_build(tmp_path):
    """The driver runs what a rebuilt run ships: the plugin file as it is now."""
    (tmp_path / "reload_helper.py").write_text("WORD = 'one'\n")
    path = tmp_path / "plug_reload.py"
    code = ("import rltf_ray\nfrom reload_helper import WORD\n\n\n@rltf_ray.register_task('reload_probe')\n"
            "class Probe(rltf_ray.Task):\n    VERSION = {v}\n\n    def make_problem(self, index, split):\n"
            "        return {{'answer': 1}}\n\n    def prompt_text(self, meta):\n        return WORD\n")
    path.write_text(code.format(v=1))
    from rltf_ray.tasks import task_class

    load_plugin(str(path))
    assert task_class("reload_probe").VERSION == 1
    load_plugin(str(path))  # unchanged: the same module
    assert task_class("reload_probe").VERSION == 1
    path.write_text(code.format(v=2))
    (tmp_path / "reload_helper.py").write_text("WORD = 'two'\n")
    load_plugin(str(path))
    assert task_class("reload_probe").VERSION == 2 and sys.modules["plug_reload"].WORD == "two"


@pytest.mark.parametrize("name,why", [("sched", "its name 'sched' is a standard-library module's"),
                                      ("calendar", "a module named 'calendar' is already imported"),
                                      ("yaml", "a module named 'yaml' is already imported")])
def test_a_plugin_named_like_another_module_is_refused(tmp_path, name, why):
    """A plugin file would hide the module of its name in every process that loads it."""
    path = tmp_path / f"{name}.py"
    path.write_text("X = 1\n")
    with pytest.raises(PluginError, match=why):
        load_plugin(str(path))


def test_plugin_errors_name_the_plugin(tmp_path):
    with pytest.raises(PluginError, match="no module named 'not_a_module_xyz'"):
        load_plugin("not_a_module_xyz")
    bad = tmp_path / "explodes.py"
    bad.write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(ConfigError, match=r"plugin '.*explodes.py' failed to import: RuntimeError: boom at import"):
        load_config(TINY, plugins=[str(bad)])
    with pytest.raises(PluginError, match="must be a Python identifier"):
        load_plugin(str(tmp_path / "my-task.py"))
    # a worker whose shipped module is missing gets the same kind of error, not a silent skip
    with pytest.raises(PluginError, match="no such file, and no module 'gone_plugin'"):
        load_plugin("/nowhere/gone_plugin.py")


def test_unknown_task_says_how_to_add_one():
    with pytest.raises(ConfigError, match=r"unknown task 'nope'.*plugins:"):
        load_config(TINY, ["task.name=nope"])


TASK_IN_MAIN = """
@rltf_ray.register_task("in_main")
class InMain(rltf_ray.Task):
    def make_problem(self, i, split): return {"answer": 1}
    def prompt_text(self, meta): return "?"
    def check(self, a, meta): return True
"""
CRITIC_IN_MAIN = """
@rltf_ray.register_critic("critic_in_main")
class InMain:
    def __init__(self, task): pass
    def judge(self, items): return []
"""


@pytest.mark.parametrize("code,override,kind,name", [
    (TASK_IN_MAIN, "task.name=in_main", "task", "in_main"),
    (CRITIC_IN_MAIN, "pipeline.critic.critic=critic_in_main", "critic", "critic_in_main"),
])
def test_a_task_or_critic_defined_in_main_ships_by_value(code, override, kind, name, tmp_path):
    """A class defined in the script being run (a notebook) is not importable by name on a Ray
    worker: it travels as a generated plugin module, and a fresh process (a worker's view)
    that imports that module alone has the class registered under its name."""
    env = {**os.environ, "RLTF_RAY_SHIPPED": str(tmp_path)}
    script = (f"import rltf_ray\nfrom rltf_ray.loading import load_config\n{code}\n"
              f"cfg = load_config({TINY!r}, [{override!r}])\nprint('PLUGINS', cfg.plugins[-1])\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=120)
    shipped = out.stdout.split("PLUGINS ")[-1].strip()
    assert out.returncode == 0 and shipped.startswith(str(tmp_path / "rltf_main_")), out.stderr[-2000:]
    # a resumed run (its saved config lists the shipped module) ships nothing a second time
    again = (f"from rltf_ray.loading import load_config\n"
             f"cfg = load_config({TINY!r}, [{override!r}], plugins=[{shipped!r}])\nprint('PLUGINS', cfg.plugins)\n")
    out = subprocess.run([sys.executable, "-c", again], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert out.stdout.split("PLUGINS ")[-1].strip() == repr([shipped]), out.stderr[-2000:]
    worker = ("from rltf_ray.plugins import load_plugin\n"
              f"load_plugin({shipped!r})\n"
              "from rltf_ray.tasks import task_class\nfrom rltf_ray.critics import get_critic\n"
              f"cls = task_class({name!r}) if {kind!r} == 'task' else get_critic({name!r})\n"
              "print('GOT', cls.__qualname__)\n")
    got = subprocess.run([sys.executable, "-c", worker], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=120)
    assert "GOT InMain" in got.stdout, got.stderr[-2000:]


def test_register_task_refuses_a_clash_and_a_non_task():
    with pytest.raises(ValueError, match="already registered"):
        @rltf_ray.register_task("arithmetic")
        class Other(rltf_ray.Task):
            pass
    with pytest.raises(TypeError, match="not a subclass of rltf_ray.Task"):
        rltf_ray.register_task("x_not_a_task")(dict)


# -- the config builder, unit ----------------------------------------------------------------
def test_builder_resolves_to_what_the_command_line_gives():
    built = (rltf_ray.RLTFConfig.from_yaml(TINY).preset("rltf_fm").training(lr=3e-4, num_workers=1)
             .run(steps=3).evaluation(prompts=5).node("first_turn", n=2, temperature=0.5).resolve())
    cli = load_config(TINY, ["trainer.lr=3e-4", "trainer.num_workers=1", "run.steps=3", "eval.prompts=5",
                             "pipeline.first_turn.n=2", "pipeline.first_turn.temperature=0.5"], preset="rltf_fm")
    assert built == cli and built.loss.lambda_fm == 0.1 and built.node("generate").params["n"] == 2


def test_builder_errors_are_specific(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer: unknown key 'lrr' \(known: .*lr"):
        rltf_ray.RLTFConfig().training(lrr=1.0)
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        rltf_ray.RLTFConfig.from_yaml(TINY).preset("nope").resolve()
    mine = tmp_path / "my_preset.yaml"
    mine.write_text("description: mine\nloss: {lambda_sd: 0.25}\n")
    assert rltf_ray.RLTFConfig.from_yaml(TINY).preset(str(mine)).resolve().loss.lambda_sd == 0.25


def test_api_refuses_misuse_before_starting_anything(tmp_path):
    algo = rltf_ray.RLTFConfig.from_yaml(TINY).build()
    with pytest.raises(RuntimeError, match="save\\(\\) before the first train"):
        algo.save()
    with pytest.raises(ConfigError, match="no such output dir"):
        algo.restore(str(tmp_path / "missing"))
    algo.stop()
    with pytest.raises(RuntimeError, match="was stopped"):
        algo.train()


def test_build_runs_the_command_lines_checks_before_ray_starts(tmp_path):
    import ray

    base = rltf_ray.RLTFConfig.from_yaml(TINY)
    with pytest.raises(ConfigError, match="task.params"):
        base.copy().task(params={"no_such_param": 1}).build()
    with pytest.raises(ConfigError, match="no_such_prompts.jsonl"):
        base.copy().node("prompts", path=str(tmp_path / "no_such_prompts.jsonl")).build()
    with pytest.raises(ConfigError, match="trainer.weight_sync: expected 'object_store', 'nccl' or 'gloo'"):
        base.copy().training(weight_sync="carrier_pigeon").build()
    assert not ray.is_initialized()


def test_to_dict_round_trips_every_setter_and_resolve_leaves_the_builder_alone():
    base = (rltf_ray.RLTFConfig.from_yaml(TINY).preset("rltf_fm").training(lr=3e-5)
            .node("first_turn", temperature=0.5).override("loss.lambda_fm=0.2", "run.steps=3"))
    before = base.to_dict()
    resolved = base.resolve()
    assert base.to_dict() == before  # resolving wrote nothing into the builder
    again = rltf_ray.RLTFConfig.from_dict(base.to_dict()).resolve()
    assert again == resolved
    assert again.loss.lambda_fm == 0.2 and again.run.steps == 3 and again.trainer.lr == 3e-5
    assert dict(again.node("generate").params)["temperature"] == 0.5


def test_the_api_refuses_asynchronous_rollouts_it_cannot_run():
    with pytest.raises(ConfigError, match=r"run.max_staleness=1: RLTF.train\(\) runs one step at a time"):
        rltf_ray.RLTFConfig.from_yaml(TINY).run(max_staleness=1).build()


def test_after_an_interrupted_step_the_api_refuses_to_go_on(tmp_path):
    """The state machine of RLTF around a step that did not finish (the pipeline is a stand-in
    whose step is interrupted; what the real pipeline would have recorded is unknown)."""
    class Interrupted:
        next_step, out, finished = 3, tmp_path, False

        def train_step(self):
            raise KeyboardInterrupt

    algo = rltf_ray.RLTFConfig.from_yaml(TINY).build()
    algo._pipe, algo._trains = Interrupted(), True
    with pytest.raises(KeyboardInterrupt):
        algo.train()
    for call in (algo.train, algo.evaluate, algo.save):
        with pytest.raises(RuntimeError, match=rf"interrupted in step 4 \(KeyboardInterrupt\).*restore\(\) the output dir {tmp_path}"):
            call()


def test_save_checkpoints_unless_this_run_already_did(tmp_path):
    from rltf_ray.runner import Pipeline

    pipe = Pipeline(load_config(TINY, [f"run.output_dir={tmp_path}"]))
    (tmp_path / "checkpoints" / "step_2").mkdir(parents=True)  # an earlier run's, in the same dir
    asked = []
    pipe.checkpoint_now = asked.append
    pipe.next_step, pipe.checkpointed = 2, set()
    pipe.save()
    pipe.save()  # once is enough
    assert asked == [2]
    pipe.next_step, pipe.checkpointed = 4, {4}  # the learner checkpointed after step 4 itself
    pipe.save()
    assert asked == [2]


def test_a_tune_checkpoint_is_the_runs_state_without_rollouts_or_older_weights(tmp_path):
    from rltf_ray.tuning import not_restored

    run = tmp_path / "run"
    for f in ["metrics.jsonl", "config.yaml", "rollouts/step_0.parquet", "tensorboard/events",
              "ray_train/rltf-learner/checkpoint_1/state.json", "checkpoints/step_2/model.safetensors",
              "checkpoints/step_10/model.safetensors", "checkpoints/step_10/critic/model.safetensors"]:
        (run / f).parent.mkdir(parents=True, exist_ok=True)
        (run / f).write_text("x")
    shutil.copytree(run, tmp_path / "ckpt", ignore=not_restored)
    got = sorted(str(p.relative_to(tmp_path / "ckpt")) for p in (tmp_path / "ckpt").rglob("*") if p.is_file())
    assert got == ["checkpoints/step_10/critic/model.safetensors", "checkpoints/step_10/model.safetensors",
                   "config.yaml", "metrics.jsonl", "ray_train/rltf-learner/checkpoint_1/state.json"]


def test_tune_reports_the_held_out_results_flattened():
    from rltf_ray.tuning import tune_metrics

    row = {"step": 3, "loss": 0.5, "actor_trained": True, "prompt_ids": ["a"], "sample_texts": "x",
           "eval": {"greedy_accuracy": 0.25, "problems": 64, "sample_texts": ["t"]}, "rows_per_engine": {"0": 32}}
    assert tune_metrics(row) == {"step": 3, "loss": 0.5, "actor_trained": True, "eval/greedy_accuracy": 0.25,
                                 "eval/problems": 64, "rows_per_engine/0": 32}


def test_eval_path_rows_are_validated_whole(tmp_path):
    from rltf_ray.sources import load_eval_rows
    from rltf_ray.tasks import get_task

    task = get_task(load_config(TINY).task)
    f = tmp_path / "held.jsonl"
    f.write_text(json.dumps({"prompt_id": "h1", "prompt": "What is 2 + 2?",
                             "meta": {"a": 2, "b": 2, "op": "+", "answer": 4}}) + "\n"
                 + json.dumps({"prompt_id": "h2", "prompt": "What is 1 + 1?", "meta": {"a": 1, "b": 1}}) + "\n")
    with pytest.raises(ConfigError, match=r"(?s)eval.path: 1 bad row.*held.jsonl:2 \(prompt_id 'h2'\): meta: missing 'op'"):
        load_eval_rows(task, str(f), 10)
    f.write_text(f.read_text().splitlines()[0] + "\n")
    assert [r["prompt_id"] for r in load_eval_rows(task, str(f), 10)] == ["h1"]


# -- the package as pip installs it ----------------------------------------------------------
def test_a_non_editable_install_keeps_presets_and_the_command(tmp_path):
    target = tmp_path / "site"
    # setuptools builds into ./build and never deletes from it: a preset removed from the
    # source would still be installed from an earlier build's copy
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(ROOT)], check=True, timeout=600, capture_output=True)
    presets = sorted(p.stem for p in (target / "rltf_ray" / "presets").glob("*.yaml"))
    assert presets == sorted(rltf_ray.preset_names()) and "rltf_sd" in presets
    (dist,) = target.glob("rltf_ray-*.dist-info")
    assert "rltf-ray = rltf_ray.cli:main" in (dist / "entry_points.txt").read_text()
    # run from elsewhere, with the installed copy first on the path: presets still resolve
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run([sys.executable, "-c", "import rltf_ray.cli as c, sys; print(c.__file__); "
                          "sys.exit(c.main(['--list-presets']))"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(str(target)) and "rltf_sd " in out.stdout and "grpo_single " in out.stdout
    # the built-in tasks' data ships too: the math task builds from the installed copy
    assert sorted(p.name for p in (target / "rltf_ray" / "tasks" / "data").glob("*.jsonl")) == [
        "math_small.jsonl", "writing_prompts.jsonl"]
    out = subprocess.run([sys.executable, "-c", "import rltf_ray.cli as c, sys; sys.exit(c.main(sys.argv[1:]))",
                          "--config", TINY, "task.name=math", "--dry-run"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    # the shipped configs, by name, from a directory with no checkout in it
    assert sorted(p.stem for p in (target / "rltf_ray" / "configs").glob("*.yaml")) == sorted(
        p.stem for p in (ROOT / "pipelines" / "configs").glob("*.yaml"))
    out = subprocess.run([sys.executable, "-c", "import rltf_ray.cli as c, sys; sys.exit(c.main(sys.argv[1:]))",
                          "--config", "demo", "--dry-run"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert out.returncode == 0 and "first_turn [generate]" in out.stdout, out.stderr[-2000:]


# -- the Python API end to end, with a task and a critic from a plugin file ---------------------
def api_config(tmp_path: Path, plugin: Path, held_out: Path | None = None) -> "rltf_ray.RLTFConfig":
    config = (rltf_ray.RLTFConfig.from_yaml(TINY)
              .plugins(str(plugin))
              .task(name="echo_sum", extraction="tag")
              .training(num_workers=1)
              .run(steps=2, output_dir=str(tmp_path / "run"))
              .evaluation(prompts=2)
              .node("critic", critic="where_am_i", critic_params={"prefix": "hello"}))
    if held_out is not None:
        config.evaluation(path=str(held_out))
    return config


@pytest.mark.integration
def test_evaluate_before_train_starts_no_learner(tmp_path):
    algo = (rltf_ray.RLTFConfig.from_yaml(TINY).run(output_dir=str(tmp_path / "run"), serve_http_port=8179)
            .evaluation(prompts=4).build())
    with algo:
        assert algo.evaluate()["problems"] == 4
        assert getattr(algo._pipe, "fit_thread", None) is None and getattr(algo._pipe, "broker", None) is None
        assert not (tmp_path / "run" / "metrics.jsonl").exists()  # nothing of a run was written
        with pytest.raises(RuntimeError, match="evaluate\\(\\) before train\\(\\) started the engines without a learner"):
            algo.train()


@pytest.mark.integration
def test_a_plugins_helpers_reach_a_worker_that_lacks_its_folder(tmp_path):
    """The plugin's folder is deleted before the worker imports it, as on another node: the
    worker has only what was shipped, the plugin and the helpers beside it."""
    import ray

    folder = tmp_path / "user_code"
    folder.mkdir()
    path = helped_plugin(folder, "_w")
    env = worker_runtime_env([str(path)])
    ray.init(num_cpus=1, include_dashboard=False, runtime_env=env)  # uploads the py_modules
    try:
        shutil.rmtree(folder)

        @ray.remote
        def on_worker():
            import plug_helped_w

            return plug_helped_w.value(), plug_helped_w.__file__

        value, where = ray.get(on_worker.remote())
        assert value == 45 and "user_code" not in where
    finally:
        ray.shutdown()


@pytest.mark.integration
def test_api_trains_saves_and_restores_with_a_plugin_task_and_critic(tmp_path):
    import pyarrow.parquet as pq

    (tmp_path / "src").mkdir()
    plugin = write_plugin(tmp_path / "src", "api_plugin")
    held_out = tmp_path / "held_out.jsonl"
    held_out.write_text("".join(json.dumps({"prompt_id": f"h{i}", "prompt": f"Add {i} and 1. Answer as <answer>n</answer>.",
                                            "meta": {"a": i, "b": 1, "answer": i + 1}}) + "\n" for i in range(3)))
    config = api_config(tmp_path, plugin, held_out)
    with config.build() as algo:
        row = algo.train()
        assert row["step"] == 0 and algo.iteration == 1 and "loss" in row and row["policy_version"] == 1
        ev = algo.evaluate()
        # the user's held-out file, not the task's generator: its 3 rows (eval.prompts=2 caps it)
        assert ev["problems"] == 2 and ev["held_out"] == str(held_out)
        saved = algo.save()
    out = Path(saved)
    assert out == (tmp_path / "run").resolve() and (out / "checkpoints" / "step_1" / "config.json").is_file()
    table = pq.read_table(out / "rollouts" / "step_0.parquet").to_pylist()
    from rltf_ray.tasks import get_task

    task = get_task(config.resolve().task)
    critiqued = [r for r in table if r["revised"]]
    assert critiqued, "no row was critiqued"
    for r in critiqued:
        # the plugin critic ran in the Serve replica, imported from the copy Ray shipped there
        # (py_modules), not from the file on this machine
        prefix, where, _, pid = r["critique"].split(" ")
        assert prefix == "hello" and "py_modules" in where and where != str(plugin) and int(pid) != os.getpid()
    for r in table:
        # the Ray Data stages scored with the plugin task: the same reward as here
        meta = json.loads(r["meta"])
        assert r["reward_first"] == task.score(r["response"], meta).reward
        if r["revised"]:
            assert r["reward_second"] == task.score(r["revision"], meta).reward

    again = api_config(tmp_path, plugin).build()
    again.restore(saved)
    with again:
        row = again.train()
        assert row["step"] == 1 and row["policy_version"] == 2  # continued after the saved step
        with pytest.raises(RuntimeError, match="all run.steps=2 steps are trained"):
            again.train()
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1] and json.loads((out / "summary.json").read_text())["engine_versions"] == [2]


@pytest.mark.integration
@pytest.mark.slow
def test_tune_runs_a_two_trial_grid(tmp_path):
    import ray
    from ray import tune

    config = (rltf_ray.RLTFConfig.from_yaml(TINY).training(num_workers=1).run(steps=1)
              .evaluation(prompts=2))
    ray.init(num_cpus=8, include_dashboard=False)
    try:
        tuner = tune.Tuner(rltf_ray.tune_trainable(config),
                           param_space={"trainer.lr": tune.grid_search([1e-3, 0.0])},
                           tune_config=tune.TuneConfig(max_concurrent_trials=1),
                           run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), name="grid"))
        results = tuner.fit()
    finally:
        from ray import serve

        serve.shutdown()
        ray.shutdown()
    assert len(results) == 2 and not results.errors
    import yaml

    by_lr = {r.config["trainer.lr"]: r for r in results}
    assert set(by_lr) == {1e-3, 0.0}
    for lr, r in by_lr.items():
        assert r.metrics["step"] == 0 and r.metrics["policy_version"] == 1
        # each trial trained in its own folder, with its own learning rate
        saved = yaml.safe_load((Path(r.path) / "rltf" / "config.yaml").read_text())
        assert saved["trainer"]["lr"] == lr and (Path(r.path) / "rltf" / "summary.json").is_file()


@pytest.mark.integration
@pytest.mark.slow
def test_tune_checkpoints_let_pbt_continue_a_trial_from_anothers(tmp_path):
    """A trial saves its run's state as a Tune checkpoint when Tune asks, so PBT's exploit
    continues the weaker trial from the stronger one's checkpoint, with a learning rate of its
    own, instead of starting it over; and a paused trial stops its run in order."""
    import ray
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    config = rltf_ray.RLTFConfig.from_yaml(TINY).training(num_workers=1).run(steps=2).evaluation(prompts=2)
    pbt = PopulationBasedTraining(time_attr="training_iteration", perturbation_interval=1, metric="lr",
                                  mode="max", quantile_fraction=0.5, resample_probability=0.0, synch=True,
                                  hyperparam_mutations={"trainer.lr": [1e-3, 1e-4]})
    ray.init(num_cpus=8, include_dashboard=False)
    try:
        results = tune.Tuner(rltf_ray.tune_trainable(config),
                             param_space={"trainer.lr": tune.grid_search([1e-3, 1e-4])},
                             tune_config=tune.TuneConfig(scheduler=pbt, max_concurrent_trials=2),
                             run_config=tune.RunConfig(storage_path=str(tmp_path / "tune"), name="pbt",
                                                       checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True))
                             ).fit()
        from ray import serve

        # the paused trial's run ended, as the finished ones did: no critic app is left
        assert not [a for a in serve.status().applications if a.startswith("rltf_critic")]
    finally:
        from ray import serve

        serve.shutdown()
        ray.shutdown()
    assert len(results) == 2 and not results.errors
    rows = {}
    for r in results:
        lines = (Path(r.path) / "rltf" / "metrics.jsonl").read_text().splitlines()
        rows[r.path] = [json.loads(x) for x in lines]
        assert [m["step"] for m in rows[r.path]] == [0, 1] and r.metrics["policy_version"] == 2
        assert r.checkpoint is not None
        with r.checkpoint.as_directory() as d:  # the run's state, without its rollouts
            assert (Path(d) / "metrics.jsonl").is_file() and (Path(d) / "ray_train").is_dir()
            assert not (Path(d) / "rollouts").exists()
    # the weaker trial (lr 1e-4 at step 0) was continued from the stronger one's checkpoint:
    # both histories now start with the stronger trial's step 0, and neither re-ran a step
    assert [m[0]["lr"] for m in rows.values()] == [pytest.approx(1e-3)] * 2


def test_the_readme_plugin_example():
    """examples/my_plugin.py is the README's quick start: its config resolves, and its task and
    critic do what the README says."""
    import asyncio

    from rltf_ray.critics import get_critic
    from rltf_ray.tasks import get_task

    cfg = load_config(str(ROOT / "pipelines" / "configs" / "demo.yaml"),
                      ["task.name=unit_price", "pipeline.critic.critic=my_reviewer",
                       "pipeline.critic.critic_params={strictness: 2}"],
                      preset="rltf_sd", plugins=[str(ROOT / "examples" / "my_plugin.py")])
    task = get_task(cfg.task)
    meta = task.make_problem(3, "train")
    assert meta == {"total": 48, "count": 12, "answer": 4} and "12 pens cost 48 dollars" in task.prompt_text(meta)
    assert task.make_problem(3, "test") == {"total": 28, "count": 7, "answer": 4}  # held out: other counts
    assert get_task(replace(cfg.task, params={"max_price": 3})).make_problem(5, "train")["answer"] == 3
    with pytest.raises(ConfigError, match="unknown key 'max_prize' for unit_price \\(known: max_price\\)"):
        get_task(replace(cfg.task, params={"max_prize": 3}))
    # the file's task.params were arithmetic's: another task.name starts from its own defaults
    assert cfg.task.params == {} and task.params == {"max_price": 9}
    kept = load_config(str(ROOT / "pipelines" / "configs" / "demo.yaml"),
                       ["task.name=unit_price", "task.params={max_price: 3}"],
                       plugins=[str(ROOT / "examples" / "my_plugin.py")])
    assert kept.task.params == {"max_price": 3}
    api = (rltf_ray.RLTFConfig.from_yaml(str(ROOT / "pipelines" / "configs" / "demo.yaml"))
           .plugins(str(ROOT / "examples" / "my_plugin.py")).task(name="unit_price").resolve())
    assert api.task.params == {}
    plain = type("Plain", (rltf_ray.Task,), {"make_problem": None, "prompt_text": None, "check": None})
    with pytest.raises(ConfigError, match="task.params: task takes no params \\(got max_price\\)"):
        plain(replace(cfg.task, params={"max_price": 3}))  # given, and nothing would read them
    # the README shows this file: the two stay the same
    readme = (ROOT / "README.md").read_text().split("# examples/my_plugin.py\n", 1)[1].split("```", 1)[0]
    assert readme.strip() in (ROOT / "examples" / "my_plugin.py").read_text()
    critic = get_critic("my_reviewer")(task, **cfg.node("critique").params["critic_params"])
    got = asyncio.run(critic.judge([{"prompt": "", "response": "It is 4", "meta": meta},
                                    {"prompt": "", "response": "It is 5", "meta": meta}]))
    assert critic.strictness == 2
    assert [(g["correct"], g["reward"], g["critique"]) for g in got] == [
        (True, 1.0, "Correct."), (False, 0.0, "Divide the total by the count.")]
