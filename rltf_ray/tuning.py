"""Ray Tune: a run as a Tune trainable (`rltf_ray.tune_trainable(config)`), with checkpoints
that PBT, trial retries and `Tuner.restore` continue from (docs/guide.md, "Ray Tune").

A class trainable rather than a function one: when Tune stops a trial (an early stop, PBT
pausing it) it calls `cleanup()`, and the run stops its learner, engines and critic app in
order. A function trainable is ended while it still runs, which leaves Ray Train's placement
group to Ray Train's own cleaner and the critic app to the reaper (`rltf_ray/reaper.py`). At
the end of a whole experiment Tune gives each trial's cleanup only about ten seconds before it
kills the actor; what is left then is the reaper's. Keep `reuse_actors` off (the default):
a trial's run cannot be reset in place.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from rltf_ray.api import RLTFConfig
from rltf_ray.report import read_metrics
from rltf_ray.learner_run import LEARNER

# What a checkpoint leaves out of a run's output dir: a resumed run needs its learner state,
# metrics, config and latest weights, not the rollouts it trained on or its TensorBoard events.
NOT_RESTORED = ("rollouts", "tensorboard")


def not_restored(folder: str, names: list[str]) -> list[str]:
    """shutil.copytree's `ignore`: NOT_RESTORED, and every checkpoints/step_N but the newest
    (copying them all would make each checkpoint bigger than the last)."""
    skip = [n for n in names if n in NOT_RESTORED]
    if Path(folder).name == "checkpoints":
        steps = sorted((int(n.split("_")[1]), n) for n in names if n.startswith("step_") and n[5:].isdigit())
        skip += [n for _, n in steps[:-1]]
    return skip


def copy_tree(src: str, dst: str) -> None:
    """A folder from `src` to `dst` (local paths or URIs such as s3://), replacing `dst`."""
    import pyarrow.fs

    fs, path = pyarrow.fs.FileSystem.from_uri(dst) if "://" in dst else (pyarrow.fs.LocalFileSystem(), dst)
    fs.delete_dir_contents(path, missing_dir_ok=True)
    pyarrow.fs.copy_files(src, dst)


class _TrialRun:
    """One trial's run, in an actor of its own outside the trial's placement group: Tune
    puts a trial's children in that group, and Serve's and Ray Train's controllers cannot live
    in one; from here the run asks the cluster for its resources as it does outside Tune."""

    def __init__(self, data: dict, overrides: list[str], restore: str | None = None):
        self.algo = RLTFConfig(data).override(*overrides).build()
        if restore is not None:
            self.algo.restore(restore)

    def train(self) -> tuple[dict, bool]:
        """The next step's metrics row, and whether it was the run's last."""
        row = self.algo.train()
        return row, self.algo._pipe.finished

    def save(self) -> str:
        """The learner's state after the steps so far, committed; returns the output dir."""
        return self.algo.save()

    def stop(self) -> None:
        self.algo.stop()


def tune_metrics(row: dict, prefix: str = "") -> dict:
    """A step's metrics row as Tune takes it: the numbers, nested ones (the held-out
    evaluation of `run.eval_every`) flattened as `eval/greedy_accuracy`, so that trials can be
    compared and chosen on them."""
    out = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(tune_metrics(v, f"{prefix}{k}/"))
        elif isinstance(v, (int, float, bool)):
            out[f"{prefix}{k}"] = v
    return out


def trial_folder(storage, logdir: str) -> Path:
    """Where a trial's run writes: the trial's own folder in Tune's storage when that is a
    local path (what `Result.path` names), else the trial's working directory (`logdir`),
    which Tune copies to storage under `SyncConfig(sync_artifacts=True)`. `storage`: the
    StorageContext Tune hands each Trainable, or None outside Tune."""
    import pyarrow.fs

    if storage is not None and isinstance(storage.storage_filesystem, pyarrow.fs.LocalFileSystem):
        return Path(storage.trial_fs_path)
    return Path(logdir)


def tune_trainable(base: RLTFConfig):
    """A Ray Tune trainable over `base`: each trial's config maps override keys
    (`"trainer.lr"`, `"pipeline.critic.critic"`) to values, runs `run.steps` steps in the
    trial's own folder and reports every step's metrics. Its checkpoints are the run's output
    dir (without rollouts): Tune saves one when `CheckpointConfig(checkpoint_frequency=...)`
    or PBT asks, and a trial restored from one continues after its step, with its own params.

        tuner = tune.Tuner(rltf_ray.tune_trainable(config),
                           param_space={"trainer.lr": tune.grid_search([1e-5, 3e-5])})
    """
    from ray import tune

    data, overrides = base.to_dict(), list(base._overrides)
    base.resolve()  # a bad config fails here, not in every trial

    class RLTFTrainable(tune.Trainable):
        def __init__(self, config: dict | None = None, storage=None):
            # Tune passes each Trainable its trial's storage (a documented argument of
            # Trainable's constructor); kept here, since Trainable exposes it to no method
            self.tune_storage = storage
            super().__init__(config, storage)

        def setup(self, config: dict) -> None:
            self.out = trial_folder(self.tune_storage, self.logdir) / "rltf"
            self.mine = [*overrides, *(f"{k}={yaml.safe_dump(v, default_flow_style=True).strip()}"
                                       for k, v in config.items()),
                         # every trial has its own folder (and, as every run, its own critic app)
                         f"run.output_dir={self.out}"]
            shared = RLTFConfig(data).override(*self.mine).resolve().run.storage_path
            # a learner storage of the trial's own: one shared by trials would resume another's
            self.storage = f"{shared.rstrip('/')}/{self.trial_id}" if shared else None
            if self.storage:
                self.mine.append(f"run.storage_path={self.storage}")
            self.finished = self.trained = False
            self.run = self._start()  # built, not started: that waits for the first step

        def _start(self, restore: str | None = None):
            import ray
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            # on this node, which holds the run's output dir that checkpoints copy; with a
            # strategy of its own it is outside the trial's placement group
            here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
            return ray.remote(num_cpus=0)(_TrialRun).options(scheduling_strategy=here).remote(
                data, self.mine, restore)

        def step(self) -> dict:
            import ray

            if self.finished:  # restored from the checkpoint of a finished run: its last row
                return {**tune_metrics(read_metrics(self.out)[-1]), "done": True}
            row, self.finished = ray.get(self.run.train.remote())
            self.trained = True
            return {**tune_metrics(row), "done": self.finished}

        def save_checkpoint(self, checkpoint_dir: str) -> None:
            import ray

            saved = ray.get(self.run.save.remote()) if self.trained else str(self.out)
            shutil.copytree(saved, checkpoint_dir, dirs_exist_ok=True, ignore=not_restored)
            if self.storage:  # the learner's state lives outside the output dir
                copy_tree(f"{self.storage}/{LEARNER}", f"{checkpoint_dir}/ray_train/{LEARNER}")

        def load_checkpoint(self, checkpoint_dir: str) -> None:
            # Tuner.restore, a retried trial or PBT's exploit: this trial's run continues from
            # that run's state, in its own folder, with its own params
            import ray

            ray.get(self.run.stop.remote())
            ray.kill(self.run)
            shutil.rmtree(self.out, ignore_errors=True)
            shutil.copytree(checkpoint_dir, self.out)
            if self.storage:
                copy_tree(f"{checkpoint_dir}/ray_train/{LEARNER}", f"{self.storage}/{LEARNER}")
            self.finished = (self.out / "summary.json").is_file()
            self.run = self._start(str(self.out))

        def cleanup(self) -> None:
            import ray

            try:
                ray.get(self.run.stop.remote())
            finally:
                ray.kill(self.run)

    return RLTFTrainable
