"""The long-lived parts of a run: Ray itself, the critic app, the vLLM engines, the step
broker and the Ray Train learner. Each starts once per run (an engine start costs ~25 s, a
trainer start ~25 s), and `stop` ends exactly what `start` started."""
from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid
from pathlib import Path

import yaml

from rltf_ray.config import Config, ConfigError
from rltf_ray.disk import check_disk
from rltf_ray.graph import node_params
from rltf_ray.memory import NodeMemory
from rltf_ray.models import resolve_model
from rltf_ray.precision import precision_of, resolved
from rltf_ray.plugins import worker_runtime_env

LEARNER = "rltf-learner"  # the Ray Train run's name (its checkpoints live under storage_path/LEARNER)
STOP_WAIT_S = 120  # how long stop() and the end of a run wait for the trainer to finish


def log(msg: str) -> None:
    print(f"[rltf] {msg}", flush=True)


# Settings for a Ray started in-process (the test suite's Ray takes them too); an environment
# variable already set wins.
EMBEDDED_RAY_ENV = {
    # On a small, saturated machine Serve's HTTP proxy can take longer than its default 10 s
    # health-check and 5 s readiness timeouts to answer (or to start), and is then killed;
    # give it a minute.
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60",
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
    # The controller reconciles every 0.1 s by default: 4% of a core while a run is idle, and
    # an engine whose two OpenMP threads share two cores with such a load slows by far more
    # than its share (docs/benchmarks.md). Once a second is enough for one critic app, whose
    # autoscaler waits tens of seconds before it scales anyway.
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1.0",
}


def apply_embedded_ray_env() -> None:
    """Put EMBEDDED_RAY_ENV (and no token auth) into this process's environment, for a Ray it
    is about to start; a variable already set wins. Ray's processes inherit it."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    for k, v in EMBEDDED_RAY_ENV.items():
        os.environ.setdefault(k, v)


def init_ray(cfg: Config) -> bool:
    """Join RAY_ADDRESS / an existing runtime, or start Ray in-process. True if we started it.
    In-process, the job's runtime_env carries the config's plugins to every worker. A joined
    Ray (a submitted job) keeps its job's runtime_env as it is: the plugins then reach each
    worker through the runtime_env it is started with (`Services.runtime_env`, laid over the
    job's), so a job's own py_modules, pip or env vars never clash with them."""
    import ray

    if ray.is_initialized():
        return False
    plugins = worker_runtime_env(cfg.plugins)
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=True)
        return False
    apply_embedded_ray_env()
    # Logical CPUs: engines and trainer workers each hold one; they take turns on the cores.
    n = cfg.run.local_num_cpus or max(8, os.cpu_count() or 1)
    # glibc gives each thread its own malloc arena; PyTorch's varying-size CPU buffers in
    # Ray's many-threaded workers then fragment memory badly. Two arenas keep RSS flat.
    extra = {"_metrics_export_port": cfg.run.metrics_export_port} if cfg.run.metrics_export_port else {}
    env = {**plugins, "env_vars": {"MALLOC_ARENA_MAX": "2", **plugins.get("env_vars", {})}}
    # address "local": a Ray of this run's own even where `ray start` left a cluster on the
    # machine, which a bare ray.init() would join (and then refuse num_cpus)
    # Ray Train's placement-group cleaner asks the state API whether the learner's controller
    # lives; beside a `ray start` cluster it would ask that one and remove a live learner
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dashboard = sock.getsockname()[1]
    env["env_vars"].setdefault("RAY_API_SERVER_ADDRESS", f"http://127.0.0.1:{dashboard}")
    ctx = ray.init(address="local", num_cpus=n, include_dashboard=True, dashboard_host="127.0.0.1",
                   dashboard_port=dashboard, runtime_env=env, **extra)
    log(f"local Ray started in-process; dashboard at http://{ctx.dashboard_url}")
    return True


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


def critic_app_name(crit, run_id: str, running: set[str]) -> str:
    """The Serve app name a run's critic lives under (`CritiqueParams.app_name`): its own
    `rltf_critic_<run id>` unless one is given; a given name must already run with attach and
    must not with a deployment, which would replace another run's critic in place."""
    if crit.attach:
        name = crit.app_name or "rltf_critic"
        if name not in running:
            raise RuntimeError(f"critique node: attach=true but no Serve app named '{name}' is running "
                               f"(running: {', '.join(sorted(running)) or 'none'})")
        return name
    if crit.app_name is None:
        return f"rltf_critic_{run_id}"
    if crit.app_name in running:
        raise RuntimeError(f"critique node: a Serve app named '{crit.app_name}' is already running on this "
                           "cluster (another run's critic?); deploying would replace it. Leave app_name "
                           "unset for a name of this run's own, or set attach=true to share that app")
    return crit.app_name


def start_serve(port: int) -> None:
    """Serve on this cluster: started, or joined when it runs already. Two runs starting at
    the same moment race to create Serve's controller; the loser joins the winner's."""
    from ray import serve

    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
    except ValueError as e:  # ray.exceptions.ActorAlreadyExistsError
        if "SERVE_CONTROLLER_ACTOR" not in str(e):
            raise
        serve.start(http_options={"host": "127.0.0.1", "port": port})


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

        from rltf_ray import reaper
        from rltf_ray.broker import StepBroker
        from rltf_ray.stages.critique import build_critic_app
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
        # the plugins again for each stage, replica and training worker: a Ray joined as it
        # is has no job-level runtime_env of ours
        self.runtime_env = worker_runtime_env(self.cfg.plugins)
        self.run_id = uuid.uuid4().hex[:6]  # keeps actor names unique when runs share a cluster
        self.broker_name = f"rltf/broker-{self.run_id}"  # created below; restarted engines ask it
        crit = node_params(self.cfg.node("critique"))
        crit = dataclasses.replace(crit, app_name=critic_app_name(crit, self.run_id,
                                                                  set(serve.status().applications)))
        self.critic_params = crit  # every stage and evaluation calls this app
        self.critic_engines: list = []
        learned = self._start_critic_engines(crit, train) if crit.critic == "learned" else None
        t = time.perf_counter()
        if crit.attach:
            self.deployed_critic = False
        else:
            start_serve(self.cfg.run.serve_http_port)
            # on a Ray that outlives this process, the app goes with it even if this process
            # dies without stop() (a killed job, a trial's lost node), deploying included:
            # rltf_ray.reaper
            self.critic_lease = None if self.started_ray else reaper.watch(crit.app_name)
            self.deployed_critic = True  # from here on stop() deletes it, deployed or half so
            serve.run(build_critic_app(self.cfg.task, crit, learned, plugins=self.cfg.plugins),
                      name=crit.app_name, route_prefix=f"/{crit.app_name}")
        log(f"critic app '{crit.app_name}' ready ({time.perf_counter() - t:.1f}s)")
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
        self._prepare_resume()
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

    def _prepare_resume(self) -> None:
        """A fresh run clears a previous run's trainer state in a local storage path (else Ray
        Train would resume it silently); `resume: must` needs a checkpoint to resume from."""
        import shutil

        run = self.cfg.run
        local = "://" not in self.storage
        learner = Path(self.storage) / LEARNER
        has_ckpt = local and any(learner.glob("checkpoint_*"))
        if run.resume == "must" and local and not has_ckpt:
            raise ConfigError(f"run.resume=must: no checkpoint under {learner} (checkpoints are written every "
                              "run.checkpoint_every steps, at the end of a run, and by save())")
        if run.resume == "never" and local and learner.exists():
            log(f"a fresh run: clearing the previous trainer state in {learner}")
            shutil.rmtree(learner)

    def _fit(self) -> None:
        from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
        from ray.train.torch import TorchTrainer

        from rltf_ray.trainer import train_loop

        run = self.cfg.run
        try:
            TorchTrainer(
                train_loop,
                train_loop_config={"cfg": self.cfg.to_dict(), "model_path": self.model_path,
                                   "engines": self.engines, "broker_name": self.broker_name,
                                   "critic_engines": self.critic_engines,
                                   "critic_model_path": self.critic_model,
                                   "engine_dtype": self.dtype,
                                   "output_dir": str(self.out)},
                scaling_config=ScalingConfig(num_workers=self.cfg.trainer.num_workers,
                                             use_gpu=self.use_gpu,
                                             resources_per_worker={"CPU": 1, **self.cfg.trainer.resources}),
                run_config=RunConfig(name=LEARNER, storage_path=self.storage,
                                     worker_runtime_env=self.runtime_env or None,
                                     failure_config=FailureConfig(max_failures=run.max_failures),
                                     checkpoint_config=CheckpointConfig(num_to_keep=run.keep_checkpoints)),
            ).fit()
        except BaseException as e:  # surfaced by wait_result with the step it broke
            self.fit_error = e

    def stop(self) -> None:
        """End what start() started. A trainer still waiting for steps (the run failed, or the
        caller stopped it early) is told that none will come and is waited for first, so its
        workers do not outlive the run on a Ray that outlives it (a cluster, a notebook)."""
        import ray
        from ray import serve

        from rltf_ray import reaper

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
        if getattr(self, "deployed_critic", False):
            if getattr(self, "critic_lease", None) is not None:
                reaper.release(self.critic_params.app_name, self.critic_lease)
                self.critic_lease = None
            serve.delete(self.critic_params.app_name)
            self.deployed_critic = False
        if getattr(self, "started_ray", False):
            serve.shutdown()
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
