"""The long-lived parts of a run, started once each (an engine start costs ~25 s, a trainer
start ~25 s) and ended by `stop` exactly as `start` started them: Ray (ray_start.py), the
critic app (critic_app.py), the vLLM engines, the step broker and the Ray Train learner
(learner_run.py)."""
from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from pathlib import Path

import yaml

from rltf_ray.config import Config
from rltf_ray.console import log
from rltf_ray.critic_app import CriticApp, critic_app_name
from rltf_ray.disk import check_disk
from rltf_ray.graph import node_params
from rltf_ray.learner_run import STOP_WAIT_S, prepare_resume, torch_trainer
from rltf_ray.memory import NodeMemory
from rltf_ray.models import resolve_model
from rltf_ray.precision import precision_of, resolved
from rltf_ray.plugins import worker_runtime_env
from rltf_ray.ray_start import init_ray


def note_single_worker_zero(cfg: Config) -> None:
    """ZeRO partitions over the training workers: with one, stages 1-2 save nothing and keep a
    second fp32 copy of the weights and DeepSpeed's gradient buckets (1.4 GB less at stage 0
    for a SmolLM2 actor and critic, docs/benchmarks.md). Said, not changed: stage 0 gives
    the same updates up to float rounding, not bit for bit."""
    t, critic = cfg.trainer, cfg.binac.zero_stage
    stages = {t.zero_stage} | ({critic} if critic is not None else set())
    if t.num_workers == 1 and stages & {1, 2}:
        log(f"note: ZeRO stage {max(stages & {1, 2})} with one training worker partitions nothing and "
            "keeps an extra fp32 copy of the weights; trainer.zero_stage=0 needs less memory")


class Services:
    """Starts and stops a run's Ray resources; the driver's view of the learner."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.model_path = resolve_model(cfg.model.path)
        learned = node_params(cfg.node("critique")).critic == "learned"
        critic_key = "binac.critic_model" if cfg.binac.critic_model else "model.path"
        self.critic_model = resolve_model(cfg.binac.critic_model or cfg.model.path, critic_key) if learned else None
        self.out = Path(cfg.run.output_dir).resolve()
        self.use_gpu = cfg.trainer.weight_sync == "nccl"
        # the learner follows the engines unless trainer.bf16 says otherwise (precision.py)
        self.precision = precision_of(cfg)
        self.dtype = self.precision.engine
        self.cfg = resolved(cfg)
        warning = self.precision.mismatch_warning(cfg.model.dtype, cfg.trainer.bf16)
        if warning:  # asked for explicitly (trainer.bf16 set against the engine's dtype)
            log(warning)

    def start(self, train: bool = True) -> None:
        """Start the critic app and the engines, and (unless `train` is false, as for
        evaluation alone) the step broker and the learner."""
        from ray import serve

        from rltf_ray.broker import StepBroker
        from rltf_ray.stages.engine import start_engines

        if train:
            check_disk(self.cfg, self._trained_models(), self.storage, self.out)
            (self.out / "rollouts").mkdir(parents=True, exist_ok=True)
            self.source.write_bad_rows(self.out)
            if self.source.bad_rows:
                log(f"skipped {len(self.source.bad_rows)} bad prompt row(s): {self.out / 'bad_rows.jsonl'}")
            (self.out / "checkpoints").mkdir(parents=True, exist_ok=True)
            (self.out / "config.yaml").write_text(yaml.safe_dump(self.cfg.to_dict(), sort_keys=False))
            note_single_worker_zero(self.cfg)
        self.node_memory = NodeMemory().start()
        self.started_ray = init_ray(self.cfg)
        if self.started_ray:
            # a Ray started here is empty; what Serve finds is a client cached by an earlier
            # in-process Ray (a notebook's previous run), whose job id a fresh cluster repeats.
            # serve.shutdown() drops it (after a few seconds' health check) and stops nothing
            serve.shutdown()
        # the plugins again for each stage, replica and training worker: a Ray joined as it
        # is has no job-level runtime_env of ours
        self.runtime_env = worker_runtime_env(self.cfg.plugins)
        self.run_id = uuid.uuid4().hex[:6]  # keeps actor names unique when runs share a cluster
        self.broker_name = f"rltf/broker-{self.run_id}"  # created below; restarted engines ask it
        crit = node_params(self.cfg.node("critique"))
        crit = dataclasses.replace(crit, app_name=critic_app_name(crit, self.run_id,
                                                                  set(serve.status().applications)))
        self.critic_params = crit  # every stage and evaluation calls this app
        self.critic_app = CriticApp(crit, own_ray=self.started_ray)
        self.critic_engines: list = []
        learned = self._start_critic_engines(crit, train) if crit.critic == "learned" else None
        self.critic_app.open(self.cfg.task, learned, self.cfg.plugins, self.cfg.run.serve_http_port)
        t = time.perf_counter()
        b = self.cfg.binac
        bilevel = train and crit.critic == "learned" and b.bilevel_lambda > 0
        self.engines = start_engines(self.model_path, self.cfg.engine, self.dtype,
                                     self.cfg.run.seed, self.cfg.trainer.weight_sync,
                                     name=f"rltf/engine-{self.run_id}",
                                     restore_from=(self.broker_name, "actor") if train else None,
                                     reference_every=b.reference_every if bilevel else 0,
                                     head_dtype=self.precision.head)
        log(f"{len(self.engines)} vLLM engine(s) ready, dtype {self.dtype}, head "
            f"{self.precision.head or self.dtype} ({time.perf_counter() - t:.1f}s)")
        if not train:
            return
        prepare_resume(self.cfg, self.storage)
        self.broker = StepBroker.options(name=self.broker_name).remote()
        self.fit_error: BaseException | None = None
        self.fit_thread = threading.Thread(target=self._fit, daemon=True)
        self.fit_thread.start()

    def _start_critic_engines(self, crit, train: bool) -> dict:
        """Bi-NAC: the critic's own engines, which the Serve app calls."""
        import dataclasses

        from rltf_ray.stages.engine import start_engines

        b = self.cfg.binac
        name = f"rltf/critic-engine-{self.run_id}"
        t = time.perf_counter()
        ecfg = dataclasses.replace(self.cfg.engine, num_engines=b.num_engines, resources=crit.resources)
        self.critic_engines = start_engines(self.critic_model, ecfg, self.dtype, self.cfg.run.seed + 1000,
                                            self.cfg.trainer.weight_sync, name=name,
                                            restore_from=(self.broker_name, "critic") if train else None,
                                            head_dtype=self.precision.head)
        log(f"learned critic: {b.num_engines} vLLM engine(s) on {self.critic_model} "
            f"({time.perf_counter() - t:.1f}s)")
        return {"engine_names": [f"{name}-{i}" for i in range(b.num_engines)],
                "model_path": self.critic_model, "binac": dataclasses.asdict(b),
                "max_model_len": ecfg.max_model_len}

    def _trained_models(self) -> list[str]:
        """The models whose checkpoints this run writes: the actor, and a critic that trains."""
        trains = self.critic_model is not None and self.cfg.binac.critic_steps > 0
        return [self.model_path] + ([self.critic_model] if trains else [])

    @property
    def storage(self) -> str:
        return self.cfg.run.storage_path or str(self.out / "ray_train")

    def _fit(self) -> None:
        loop = {"model_path": self.model_path, "engines": self.engines, "broker_name": self.broker_name,
                "critic_engines": self.critic_engines, "critic_model_path": self.critic_model,
                "engine_dtype": self.dtype, "output_dir": str(self.out)}
        try:
            torch_trainer(self.cfg, loop, self.storage, self.runtime_env, self.use_gpu).fit()
        except BaseException as e:  # surfaced by wait_result with the step it broke
            self.fit_error = e

    def stop(self) -> None:
        """End what start() started. A trainer still waiting for steps (the run failed, or the
        caller stopped it early) is told that none will come and is waited for first, so its
        workers do not outlive the run on a Ray that outlives it (a cluster, a notebook)."""
        import ray

        fit = getattr(self, "fit_thread", None)
        if fit is not None and fit.is_alive():
            self.broker.close.remote()
            fit.join(timeout=STOP_WAIT_S)
            if fit.is_alive():
                log(f"the trainer did not stop within {STOP_WAIT_S} s of the end of the run; its "
                    "workers stay until Ray Train gives up on them or Ray shuts down")
        if getattr(self, "node_memory", None) is not None:
            self.node_memory.stop()
        for e in getattr(self, "engines", []) + getattr(self, "critic_engines", []):
            ray.kill(e)
        self.engines, self.critic_engines = [], []
        if getattr(self, "broker", None) is not None and not (fit is not None and fit.is_alive()):
            ray.kill(self.broker)  # it holds the last step's rows and weights in the object store
            self.broker = None
        if getattr(self, "critic_app", None) is not None:
            self.critic_app.close()
        if getattr(self, "started_ray", False):
            # Ray's shutdown alone, not Serve's first: serve.shutdown() ray.kills the controller
            # while its proxy and this process's handle still long-poll it, and every such call
            # ends as a `(raylet) ... killed by ray.kill` line after a clean run. The cached
            # Serve client it leaves is dropped by the next in-process start() above
            ray.shutdown()
            self.started_ray = False

    # -- the learner, seen from the driver ---------------------------------------------
    def _wait(self, call, what: str):
        """Poll the broker, and fail with the trainer's own error if it has stopped."""
        import ray

        while True:
            res = ray.get(call())
            if res is not None:
                return res
            if not self.fit_thread.is_alive():
                raise RuntimeError(f"the trainer stopped before {what}: {self.fit_error!r}") from self.fit_error

    def wait_result(self, step: int) -> dict:
        return self._wait(lambda: self.broker.get_result.remote(step, 5.0), f"finishing step {step}")

    def wait_start(self) -> int:
        """The first step to run: 0, or the step after the checkpoint the trainer restored
        (it has pushed the restored weights into the engines by then)."""
        return self._wait(lambda: self.broker.get_start.remote(5.0), "starting")

    def checkpoint_now(self, steps_done: int) -> None:
        """Ask the learner for a checkpoint of its state after `steps_done` steps, and wait
        until Ray Train has committed it (a resume then starts at step `steps_done`)."""
        import ray

        ray.get(self.broker.request_checkpoint.remote(steps_done))
        self._wait(lambda: self.broker.get_saved.remote(steps_done, 5.0), f"checkpointing step {steps_done}")
