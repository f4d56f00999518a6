"""Runs a validated Config: starts Ray (or joins a cluster), the critic app, the engines and
the trainer once, then executes the pipeline graph as one Ray Data run per RL step."""
from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from rltf_ray import metrics as M
from rltf_ray.config import Config, ConfigError
from rltf_ray.disk import check_disk
from rltf_ray.graph import node_params, node_round, validate
from rltf_ray.models import resolve_dtype, resolve_model
from rltf_ray.sources import PromptSource
from rltf_ray.tasks import get_task


LEARNER = "rltf-learner"  # the Ray Train run's name (its checkpoints live under storage_path/LEARNER)
STOP_WAIT_S = 120  # how long stop() and the end of a run wait for the trainer to finish
STAGE_KINDS = ("generate", "critique", "revise", "reward")  # the nodes `rollout` runs as Ray Data stages


def _log(msg: str) -> None:
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
    # than its share (docs/benchmarks.md, session 11). Once a second is enough for one critic
    # app, whose autoscaler waits tens of seconds before it scales anyway.
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1.0",
}


def apply_embedded_ray_env() -> None:
    """Put EMBEDDED_RAY_ENV (and no token auth) into this process's environment, for a Ray it
    is about to start; a variable already set wins. Ray's processes inherit it."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    for k, v in EMBEDDED_RAY_ENV.items():
        os.environ.setdefault(k, v)


def init_ray(cfg: Config) -> bool:
    """Join RAY_ADDRESS / an existing runtime, or start Ray in-process. True if we started it."""
    import ray

    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=True)
        return False
    apply_embedded_ray_env()
    # Logical CPUs: engines and trainer workers each hold one; they take turns on the cores.
    n = cfg.run.local_num_cpus or max(8, os.cpu_count() or 1)
    # glibc gives each thread its own malloc arena; PyTorch's varying-size CPU buffers in
    # Ray's many-threaded workers then fragment memory badly. Two arenas keep RSS flat.
    extra = {"_metrics_export_port": cfg.run.metrics_export_port} if cfg.run.metrics_export_port else {}
    ctx = ray.init(num_cpus=n, include_dashboard=True, dashboard_host="127.0.0.1",
                   runtime_env={"env_vars": {"MALLOC_ARENA_MAX": "2"}}, **extra)
    _log(f"local Ray started in-process; dashboard at http://{ctx.dashboard_url}")
    return True


def read_rows(path: Path) -> list[dict]:
    """A metrics.jsonl's rows; a line cut short by a killed driver is dropped (resume rebuilds
    or reports the step it held)."""
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class Pipeline:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.order = validate(cfg)
        self.model_path = resolve_model(cfg.model.path)
        learned = node_params(cfg.node("critique")).critic == "learned"
        self.critic_model = resolve_model(cfg.binac.critic_model or cfg.model.path) if learned else None
        self.task = get_task(cfg.task)
        self.source = PromptSource(self.task, node_params(cfg.node("source")), cfg.run.steps, cfg.run.seed,
                                   self._prompt_fits())
        self.out = Path(cfg.run.output_dir).resolve()
        self.use_gpu = cfg.trainer.weight_sync == "nccl"
        self.dtype = resolve_dtype(cfg.model.dtype, self.use_gpu)
        self.final_eval: dict | None = None  # the last step's evaluation, when it is the "after" one

    def _prompt_fits(self):
        """A check that a file prompt, as the first turn's x0, leaves room for max_tokens."""
        from rltf_ray.chat import encode, first_turn_messages, load_tokenizer

        if not node_params(self.cfg.node("source")).path:
            return None
        tok = load_tokenizer(self.model_path)
        max_tokens, limit = node_params(self.cfg.node("generate")).max_tokens, self.cfg.engine.max_model_len

        def fits(prompt: str) -> str:
            n = len(encode(tok, first_turn_messages(prompt)))
            return "" if n + max_tokens <= limit else (
                f"the prompt is {n} tokens; with max_tokens={max_tokens} it exceeds engine.max_model_len={limit}")

        return fits

    # -- resources --------------------------------------------------------------------
    def start(self, train: bool = True) -> None:
        """Start the critic app and the engines, and (unless `train` is false, as for
        evaluation alone) the step broker and the learner."""
        from ray import serve

        from rltf_ray.stages.critique import build_critic_app
        from rltf_ray.stages.engine import start_engines
        from rltf_ray.broker import StepBroker

        if train:
            check_disk(self.cfg, self._trained_models(), self.storage, self.out)
            (self.out / "rollouts").mkdir(parents=True, exist_ok=True)
            self.source.write_bad_rows(self.out)
            if self.source.bad_rows:
                _log(f"skipped {len(self.source.bad_rows)} bad prompt row(s): {self.out / 'bad_rows.jsonl'}")
            (self.out / "checkpoints").mkdir(parents=True, exist_ok=True)
            (self.out / "config.yaml").write_text(yaml.safe_dump(self.cfg.to_dict(), sort_keys=False))
        self.started_ray = init_ray(self.cfg)
        self.run_id = uuid.uuid4().hex[:6]  # keeps actor names unique when runs share a cluster
        self.broker_name = f"rltf/broker-{self.run_id}"  # created below; restarted engines ask it
        crit = node_params(self.cfg.node("critique"))
        self.critic_params = crit
        self.critic_engines: list = []
        learned = None
        if crit.critic == "learned":  # Bi-NAC: the critic's own engines, behind the Serve app
            import dataclasses

            from rltf_ray.stages.engine import start_engines

            b = self.cfg.binac
            name = f"rltf/critic-engine-{self.run_id}"
            t = time.perf_counter()
            ecfg = dataclasses.replace(self.cfg.engine, num_engines=b.num_engines, resources=crit.resources)
            self.critic_engines = start_engines(self.critic_model, ecfg, self.dtype, self.cfg.run.seed + 1000,
                                                self.use_gpu, name=name,
                                                restore_from=(self.broker_name, "critic") if train else None)
            learned = {"engine_names": [f"{name}-{i}" for i in range(b.num_engines)],
                       "model_path": self.critic_model, "binac": dataclasses.asdict(b)}
            _log(f"learned critic: {b.num_engines} vLLM engine(s) on {self.critic_model} "
                 f"({time.perf_counter() - t:.1f}s)")
        t = time.perf_counter()
        if crit.attach:
            if crit.app_name not in serve.status().applications:
                raise RuntimeError(f"critique node: attach=true but no Serve app named "
                                   f"'{crit.app_name}' is running")
            self.deployed_critic = False
        else:
            serve.start(http_options={"host": "127.0.0.1", "port": self.cfg.run.serve_http_port})
            serve.run(build_critic_app(self.cfg.task, crit, learned), name=crit.app_name,
                      route_prefix=f"/{crit.app_name}")
            self.deployed_critic = True
        _log(f"critic app '{crit.app_name}' ready ({time.perf_counter() - t:.1f}s)")
        t = time.perf_counter()
        self.engines = start_engines(self.model_path, self.cfg.engine, self.dtype,
                                     self.cfg.run.seed, self.use_gpu, name=f"rltf/engine-{self.run_id}",
                                     restore_from=(self.broker_name, "actor") if train else None)
        _log(f"{len(self.engines)} vLLM engine(s) ready, dtype {self.dtype} ({time.perf_counter() - t:.1f}s)")
        if not train:
            return
        self._prepare_resume()
        self.broker = StepBroker.options(name=self.broker_name).remote()
        self.fit_error: BaseException | None = None
        self.fit_thread = threading.Thread(target=self._fit, daemon=True)
        self.fit_thread.start()

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
                              "run.checkpoint_every steps and at the end of a run)")
        if run.resume == "never" and local and learner.exists():
            _log(f"a fresh run: clearing the previous trainer state in {learner}")
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

        fit = getattr(self, "fit_thread", None)
        if fit is not None and fit.is_alive():
            self.broker.close.remote()
            fit.join(timeout=STOP_WAIT_S)
            if fit.is_alive():
                _log(f"the trainer did not stop within {STOP_WAIT_S} s of the end of the run; its "
                     "workers stay until Ray Train gives up on them or Ray shuts down")
        for e in getattr(self, "engines", []) + getattr(self, "critic_engines", []):
            ray.kill(e)
        if getattr(self, "deployed_critic", False):
            serve.delete(self.critic_params.app_name)
        if getattr(self, "started_ray", False):
            serve.shutdown()
            ray.shutdown()

    # -- one step ---------------------------------------------------------------------
    def rollout(self, step: int) -> pa.Table:
        import ray

        from rltf_ray.stages import arrow_stage
        from rltf_ray.stages.critique import make_critique, make_reward
        from rltf_ray.stages.rollout import make_generate, make_revise

        rows = self.source.rows_for_step(step)
        critic = self.critic_params  # every round calls the same critic app
        ds = ray.data.from_items(rows)
        for node in (n for n in self.order if n.kind in STAGE_KINDS):
            p = node_params(node)
            fn = {"generate": lambda: make_generate(self.engines, self.model_path, p, node.name,
                                                  self.cfg.engine.max_model_len),
                  "critique": lambda: make_critique(self.cfg.task, p, self.cfg.run.turns,
                                                    self.cfg.binac.critique_correct),
                  "revise": lambda: make_revise(self.engines, self.model_path, p, node.name,
                                              self.cfg.engine.max_model_len,
                                              self.cfg.binac.revisions_per_critique),
                  "reward": lambda: make_reward(self.cfg.task, p, critic)}[node.kind]
            ds = ds.map_batches(arrow_stage(node.kind, node.name, fn(), node_round(node)),
                                batch_size=p.batch_size,
                                batch_format="pyarrow", num_cpus=0.1)
        table = pa.concat_tables(ray.get(list(ds.to_arrow_refs())))
        expected = len(rows) * node_params(self.cfg.node("generate")).n
        if table.num_rows != expected:
            raise RuntimeError(f"step {step}: {table.num_rows} rollout rows reached the trainer, "
                               f"expected {expected}; rows were lost in the pipeline")
        return table

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

    def evaluator(self):
        from rltf_ray.evaluation import Evaluator
        from rltf_ray.stages.critique import ask_critic, score_texts

        critic = self.critic_params
        gen = node_params(self.cfg.node("generate"))

        def score(rows: list[dict], texts: list[str]) -> list[tuple]:
            got = score_texts(self.task, critic, rows, texts, list(range(len(rows))))
            return [got[i][0] for i in range(len(rows))]

        def critique(rows: list[dict], texts: list[str], which: list[int]) -> dict:
            # only wrong answers are critiqued (the evaluator's oracle), as in training, where a
            # verdict-aware learned critic is told the verifier's verdict
            told = [{**r, "correct_first": False} for r in rows]
            return {i: (res["critique"] if res else None)
                    for i, (res, _) in ask_critic(critic, told, texts, which).items()}

        E = self.cfg.eval
        return Evaluator(self.engines, self.model_path, self.task, score, critique,
                         gen.temperature if E.temperature is None else E.temperature, gen.max_tokens,
                         node_params(self.cfg.node("revise")).template, E.critique_max_tokens)

    def evaluate(self, full: bool = True) -> dict:
        """Held-out evaluation with every measure `eval` asks for (`full`), or only the
        greedy first-turn accuracy (the cheap in-training curve)."""
        E = self.cfg.eval
        rows = self.task.held_out(E.prompts)
        out = self.evaluator().run(rows, E.pass_k if full else [], E.samples,
                                   E.feedback_rounds if full else 0, E.self_feedback_rounds if full else 0,
                                   greedy=E.greedy or not full)
        return {**out, "requested": E.prompts}

    def _begin(self, start: int) -> dict:
        """The summary so far: a fresh run evaluates first; a resumed one keeps its metrics
        rows before `start` (new ones append) and its first evaluation."""
        import ray

        mpath, before = self.out / "metrics.jsonl", self.out / "eval_before.json"
        if not start:
            mpath.write_text("")
            if not self.cfg.run.eval_before_after:
                return {}
            summary = {"before": self.evaluate()}
            before.write_text(json.dumps(summary["before"]))
            _log("before training: " + M.eval_line(summary["before"]))
            return summary
        _log(f"resuming at step {start + 1} (policy version "
             f"{ray.get(self.engines[0].ready.remote())}, restored from the last checkpoint)")
        rows = {r["step"]: r for r in read_rows(mpath) if r["step"] < start}
        for train in ray.get(self.broker.restored_metrics.remote()):
            s = train["step"]
            rollouts = self.out / "rollouts" / f"step_{s}.parquet"
            if s not in rows and rollouts.exists():  # killed after the checkpoint, before the row
                rows[s] = {**self.metrics_row(pq.read_table(rollouts), train), "recovered": True}
                _log(f"step {s + 1}'s metrics row, lost with the previous driver, rebuilt from the "
                     "checkpoint and rollouts/ (no timings of the driver's part)")
        lost = sorted(set(range(start)) - set(rows))
        if lost:
            _log(f"WARNING: the metrics rows of steps {[s + 1 for s in lost]} are lost (trained, "
                 "checkpointed, but neither in metrics.jsonl nor in the checkpoint)")
        mpath.write_text("".join(json.dumps(rows[s]) + "\n" for s in sorted(rows)))
        return {"before": json.loads(before.read_text())} if before.exists() else {}

    def launch(self, step: int) -> dict:
        """Generate a step's rollouts and hand them to the learner, which may still be training
        an earlier step (run.max_staleness)."""
        import ray

        from rltf_ray.stages.critique import check_critique_failures

        run = self.cfg.run
        t0 = time.perf_counter()
        table = self.rollout(step)
        t_roll = time.perf_counter() - t0
        pq.write_table(table, self.out / "rollouts" / f"step_{step}.parquet")
        if run.turns > 1:
            check_critique_failures(table.to_pylist(), self.critic_params, run.rounds, step)
        ray.get(self.broker.put_step.remote(step, [ray.put(table.to_pylist())]))
        return {"step": step, "table": table, "t0": t0, "seconds_rollout": t_roll}

    def evaluates_at(self, step: int) -> bool:
        every = self.cfg.run.eval_every
        return bool(every) and (step + 1) % every == 0

    def metrics_row(self, table: pa.Table, train: dict) -> dict:
        """A step's metrics row from its rollouts and the trainer's metrics of it."""
        learned = self.critic_params.critic == "learned"
        row = {**M.rollout_metrics(table, self.cfg.run, self.cfg.binac if learned else None), **train,
               "samples_seen": (train["step"] + 1) * table.num_rows, "bad_prompt_rows": len(self.source.bad_rows),
               "prompt_ids": list(dict.fromkeys(table.column("prompt_id").to_pylist()))}
        row["engine_version_lag"] = (row["policy_version"] - int(row.get("actor_trained", True))
                                     - row["policy_version_rollout"])  # 0: strictly on-policy
        return row

    def finish(self, launched: dict) -> dict:
        """Wait until the learner has trained a launched step; the step's metrics row, with a
        held-out evaluation every `run.eval_every`."""
        import ray

        run, step, table = self.cfg.run, launched["step"], launched["table"]
        row = {**self.metrics_row(table, self.wait_result(step)), "seconds_rollout": launched["seconds_rollout"],
               "seconds_step": time.perf_counter() - launched["t0"], "finished_at": time.time(),
               "engine_peak_rss_gb": max(ray.get([e.peak_rss_gb.remote() for e in self.engines]))}
        if self.evaluates_at(step):
            # the engines already hold the step's weights; at the last step this evaluation
            # is the "after" one, so it runs every measure and is not repeated
            final = step + 1 == run.steps and run.eval_before_after
            t1 = time.perf_counter()
            row["eval"] = self.evaluate(full=final or self.cfg.eval.during_training == "all")
            row["seconds_eval"] = time.perf_counter() - t1
            self.final_eval = row["eval"] if final else None
            _log(f"eval after step {step + 1}: " + M.eval_line(row["eval"]))
        return row

    def train(self) -> dict:
        """Evaluate, run every RL step (from the trainer's start step), evaluate again; the
        resources must be started. With run.max_staleness = k, step s's rollouts are generated
        once step s - k - 1 is trained, so the engines are at most k versions behind."""
        import collections

        import ray

        from rltf_ray.tracking import Tracker

        run = self.cfg.run
        start = self.wait_start()
        summary = self._begin(start)
        stages = tuple(n.name for n in self.order if n.kind in STAGE_KINDS)
        tracker, t_start = Tracker(run, self.out, stages=stages), time.perf_counter()
        pending: collections.deque = collections.deque()

        def record(row: dict) -> None:
            with (self.out / "metrics.jsonl").open("a") as f:
                f.write(json.dumps(row) + "\n")
            tracker.log(row, row["step"])
            done = row["step"] + 1 - start
            eta = (time.perf_counter() - t_start) / done * (run.steps - row["step"] - 1)
            _log(M.step_line(row, run.steps) + f" | eta {int(eta // 60)}m{int(eta % 60):02d}s")

        for step in range(start, run.steps):
            # a step that evaluates is finished before the next launch, so that its
            # evaluation sees exactly that step's policy
            while pending and (pending[0]["step"] < step - run.max_staleness
                               or self.evaluates_at(pending[0]["step"])):
                record(self.finish(pending.popleft()))
            pending.append(self.launch(step))
        while pending:
            record(self.finish(pending.popleft()))
        tracker.close()
        self.fit_thread.join(timeout=STOP_WAIT_S)
        if self.fit_error is not None:
            raise RuntimeError(f"the trainer failed at the end of the run: {self.fit_error!r}")
        if run.eval_before_after and "before" in summary:
            summary["after"] = self.final_eval or self.evaluate()
            _log("after training: " + M.eval_line(summary["after"]))
        summary["engine_versions"] = ray.get([e.ready.remote() for e in self.engines])
        if self.critic_engines:
            summary["critic_engine_versions"] = ray.get([e.ready.remote() for e in self.critic_engines])
        summary["output_dir"] = str(self.out)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def run(self) -> dict:
        self.start()
        try:
            return self.train()
        finally:
            self.stop()


def run(cfg: Config) -> dict:
    return Pipeline(cfg).run()
