"""The Ray Train run behind a pipeline's learner: its trainer state on disk (resumed or
cleared) and the TorchTrainer that runs `trainer.train_loop` on it."""
from __future__ import annotations

import shutil
from pathlib import Path

from rltf_ray.config import Config, ConfigError
from rltf_ray.console import log

LEARNER = "rltf-learner"  # the Ray Train run's name (its checkpoints live under storage_path/LEARNER)
STOP_WAIT_S = 120  # how long stop() and the end of a run wait for the trainer to finish


def prepare_resume(cfg: Config, storage: str) -> None:
    """A fresh run clears a previous run's trainer state in a local storage path (else Ray
    Train would resume it silently); `resume: must` needs a checkpoint to resume from."""
    run = cfg.run
    local = "://" not in storage
    learner = Path(storage) / LEARNER
    has_ckpt = local and any(learner.glob("checkpoint_*"))
    if run.resume == "must" and local and not has_ckpt:
        raise ConfigError(f"run.resume=must: no checkpoint under {learner} (checkpoints are written every "
                          "run.checkpoint_every steps, at the end of a run, and by save())")
    if run.resume == "never" and local and learner.exists():
        log(f"a fresh run: clearing the previous trainer state in {learner}")
        shutil.rmtree(learner)


def torch_trainer(cfg: Config, loop_config: dict, storage: str, runtime_env: dict, use_gpu: bool):
    """The learner's TorchTrainer: `cfg.trainer.num_workers` workers, restarted from the last
    checkpoint up to `run.max_failures` times, each given `loop_config`."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from rltf_ray.trainer import train_loop

    run, t = cfg.run, cfg.trainer
    return TorchTrainer(
        train_loop,
        train_loop_config={"cfg": cfg.to_dict(), **loop_config},
        scaling_config=ScalingConfig(num_workers=t.num_workers, use_gpu=use_gpu,
                                     resources_per_worker={"CPU": 1, **t.resources}),
        run_config=RunConfig(name=LEARNER, storage_path=storage, worker_runtime_env=runtime_env or None,
                             failure_config=FailureConfig(max_failures=run.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=run.keep_checkpoints)))
