"""Runs a validated Config: the step loop, with its evaluations, metrics rows and resume
bookkeeping, over the services (rltf_ray/services.py) and one step's work
(rltf_ray/steps.py). `Pipeline.run` is the whole run; `begin`, `train_step` and `end` are the
same run one step at a time (the Python API's `train()`)."""
from __future__ import annotations

import collections
import json
import time

import pyarrow.parquet as pq

from rltf_ray import metrics as M
from rltf_ray.provenance import provenance
from rltf_ray.config import Config, ConfigError
from rltf_ray.graph import node_params, validate
from rltf_ray.models import weights_sha256
from rltf_ray.console import log
from rltf_ray.learner_run import STOP_WAIT_S
from rltf_ray.services import Services
from rltf_ray.sources import PromptSource, calibration_rows, held_out_rows
from rltf_ray.steps import STAGE_KINDS, StepRunner, no_held_out
from rltf_ray.tasks import get_task


def read_rows(path) -> list[dict]:
    """A metrics.jsonl's rows; a line cut short by a killed driver is dropped (resume rebuilds
    or reports the step it held)."""
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


class Pipeline(Services, StepRunner):
    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.order = validate(cfg)
        self.task = get_task(cfg.task)
        source = node_params(cfg.node("source"))
        self.source = PromptSource(self.task, source, cfg.run.steps, cfg.run.seed, self._prompt_fits(),
                                   key=f"pipeline.{cfg.node('source').name}.path")
        self.final_eval: dict | None = None  # the last step's evaluation, when it is the "after" one
        # a held-out file is validated whole before anything starts; an evaluation of the
        # calibration split (eval.split) scores those problems instead
        self.held_out = (held_out_rows(self.task, cfg.eval, source) if cfg.eval.split == "test" else
                         calibration_rows(self.task, cfg.eval, source,
                                          {r["prompt"] for r in self.source.file_rows or []}))
        if self.held_out is None and (cfg.run.eval_before_after or cfg.run.eval_every):
            raise no_held_out(self.task.name)
        self.next_step: int | None = None  # set by begin()

    def _prompt_fits(self):
        """A check that a file prompt, as the first turn's x0, leaves room for max_tokens."""
        from rltf_ray.chat import encode, first_turn_messages, load_tokenizer

        if not node_params(self.cfg.node("source")).path:
            return None
        tok = load_tokenizer(self.model_path)
        max_tokens, limit = node_params(self.cfg.node("generate")).max_tokens, self.cfg.engine.max_model_len

        def fits(row: dict) -> str:
            n = len(encode(tok, first_turn_messages(row)))
            return "" if n + max_tokens <= limit else (
                f"the prompt is {n} tokens; with max_tokens={max_tokens} it exceeds engine.max_model_len={limit}")

        return fits

    def _summary_so_far(self, start: int) -> dict:
        """A fresh run evaluates first; a resumed one keeps its metrics rows before `start`
        (new ones append) and its first evaluation."""
        import ray

        mpath, before = self.out / "metrics.jsonl", self.out / "eval_before.json"
        if not start:
            mpath.write_text("")
            if not self.cfg.run.eval_before_after:
                return {}
            summary = {"before": self.evaluate()}
            before.write_text(json.dumps(summary["before"]))
            log("before training: " + M.eval_line(summary["before"]))
            return summary
        log(f"resuming at step {start + 1} (policy version "
            f"{ray.get(self.engines[0].ready.remote())}, restored from the last checkpoint)")
        rows = {r["step"]: r for r in read_rows(mpath) if r["step"] < start}
        for train in ray.get(self.broker.restored_metrics.remote()):
            s = train["step"]
            rollouts = self.out / "rollouts" / f"step_{s}.parquet"
            if s not in rows and rollouts.exists():  # killed after the checkpoint, before the row
                rows[s] = {**self.metrics_row(pq.read_table(rollouts), train), "recovered": True}
                log(f"step {s + 1}'s metrics row, lost with the previous driver, rebuilt from the "
                    "checkpoint and rollouts/ (no timings of the driver's part)")
        lost = sorted(set(range(start)) - set(rows))
        if lost:
            log(f"WARNING: the metrics rows of steps {[s + 1 for s in lost]} are lost (trained, "
                "checkpointed, but neither in metrics.jsonl nor in the checkpoint)")
        mpath.write_text("".join(json.dumps(rows[s]) + "\n" for s in sorted(rows)))
        return {"before": json.loads(before.read_text())} if before.exists() else {}

    # -- the run, one step at a time ------------------------------------------------------
    def begin(self) -> None:
        """After start(): wait for the learner's first step (0, or the one after a restored
        checkpoint) and evaluate before training."""
        from rltf_ray.tracking import Tracker

        # the code that runs is the code imported at start-up, whatever the checkout holds later
        self.provenance = provenance(self.cfg, self.precision)
        self.next_step = self.first_step = self.wait_start()
        # steps whose state this run has checkpointed (a restored run starts from one)
        self.checkpointed = {self.first_step} if self.first_step else set()
        self.summary = self._summary_so_far(self.next_step)
        stages = tuple(n.name for n in self.order if n.kind in STAGE_KINDS)
        self.tracker, self.t_start = Tracker(self.cfg.run, self.out, stages=stages), time.perf_counter()

    def record(self, row: dict) -> None:
        run = self.cfg.run
        if row.get("seconds_checkpoint"):  # the learner checkpointed after this step
            self.checkpointed.add(row["step"] + 1)
        with (self.out / "metrics.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        self.tracker.log(row, row["step"])
        done = row["step"] + 1 - self.first_step
        eta = (time.perf_counter() - self.t_start) / done * (run.steps - row["step"] - 1)
        log(M.step_line(row, run.steps) + f" | eta {int(eta // 60)}m{int(eta % 60):02d}s")

    @property
    def finished(self) -> bool:
        return self.next_step is not None and self.next_step >= self.cfg.run.steps

    def train_step(self) -> dict:
        """One RL step, start to finish (rollouts, learner, weight sync, metrics row)."""
        if self.next_step is None:
            raise RuntimeError("train_step() before begin()")
        if self.finished:
            raise RuntimeError(f"all run.steps={self.cfg.run.steps} steps are trained; build with a "
                               "larger run.steps to train further")
        row = self.finish(self.launch(self.next_step))
        self.record(row)
        self.next_step += 1
        return row

    def save(self) -> str:
        """A checkpoint of the state after the steps trained so far; a run resumed from the
        output dir (`restore`, `--resume`) continues from it. Returns the output dir."""
        steps_done = self.next_step
        if steps_done is None:
            raise RuntimeError("save() before the first step: nothing is trained yet")
        # Checkpointed by this run already, or not at all: a step_N folder that an earlier run
        # left in the same output dir holds that run's weights, not these.
        if steps_done not in self.checkpointed:
            self.checkpoint_now(steps_done)
            self.checkpointed.add(steps_done)
        log(f"checkpoint after step {steps_done}: {self.out / 'checkpoints' / f'step_{steps_done}'}")
        return str(self.out)

    def end(self) -> dict:
        """After the last step: wait for the learner, evaluate after training, write summary.json."""
        import ray

        self.tracker.close()
        self.fit_thread.join(timeout=STOP_WAIT_S)
        if self.fit_error is not None:
            raise RuntimeError(f"the trainer failed at the end of the run: {self.fit_error!r}")
        summary = self.summary
        if self.cfg.run.eval_before_after and "before" in summary:
            summary["after"] = self.final_eval or self.evaluate()
            log("after training: " + M.eval_line(summary["after"]))
            log(M.gain_line(summary["before"], summary["after"]))
        summary["engine_versions"] = ray.get([e.ready.remote() for e in self.engines])
        if self.critic_engines:
            summary["critic_engine_versions"] = ray.get([e.ready.remote() for e in self.critic_engines])
        # how the run went for the learner (restarts from a checkpoint) and the critic app
        # (batching: requests per batch of the replica that answered)
        summary["trainer"] = ray.get(self.broker.stats.remote())
        if self.critic_app.deployed and self.critic_params.max_replicas is None and self.critic_params.num_replicas == 1:
            from ray import serve

            summary["critic_app"] = serve.get_app_handle(self.critic_params.app_name).stats.remote().result()
        summary["node_memory_peak_gb"] = self.node_memory.peak  # every process on the driver's node
        summary["weights_sha256"] = {"actor": weights_sha256(self.model_path)}
        if self.critic_model:
            summary["weights_sha256"]["critic"] = weights_sha256(self.critic_model)
        summary["final_weights"] = final_weights(self.out, self.cfg.run.steps, self.critic_model,
                                                 self.cfg.binac.critic_steps > 0)
        summary["output_dir"] = str(self.out)
        summary["provenance"] = self.provenance
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    # -- the whole run ---------------------------------------------------------------------
    def train(self) -> dict:
        """Evaluate, run every RL step (from the trainer's start step), evaluate again; the
        resources must be started. With run.max_staleness = k, step s's rollouts are generated
        once step s - k - 1 is trained, so the engines are at most k versions behind."""
        run = self.cfg.run
        self.begin()
        pending: collections.deque = collections.deque()
        for step in range(self.next_step, run.steps):
            # a step that evaluates is finished before the next launch, so that its
            # evaluation sees exactly that step's policy
            while pending and (pending[0]["step"] < step - run.max_staleness
                               or self.evaluates_at(pending[0]["step"])):
                self.record(self.finish(pending.popleft()))
            pending.append(self.launch(step))
        while pending:
            self.record(self.finish(pending.popleft()))
        self.next_step = run.steps
        return self.end()

    def run(self) -> dict:
        self.start()
        try:
            return self.train()
        finally:
            self.stop()


def run(cfg: Config) -> dict:
    return Pipeline(cfg).run()


def final_weights(out, steps: int, critic_model: str | None, critic_trains: bool) -> dict:
    """Where a finished run's final weights are, with the SHA-256 of each weight file (None
    where the folder is missing): the actor's last checkpoint (checkpoints/step_<steps>), and
    the critic's beside it (critic/) when the critic trains, else the critic it started from,
    which never changed. The weights stay on disk, out of git; summary.json keeps the hashes,
    so that a later evaluation of a checkpoint pair can be checked against the run."""
    from pathlib import Path

    last = Path(out) / "checkpoints" / f"step_{steps}"
    got = {"actor": {"path": str(last), "sha256": weights_sha256(str(last))}}
    if critic_model:
        path = last / "critic" if critic_trains else Path(critic_model)
        got["critic"] = {"path": str(path), "sha256": weights_sha256(str(path))}
    return got


def evaluate_only(cfg: Config) -> tuple[Pipeline, dict]:
    """A held-out evaluation of `cfg`'s model with its critic, no learner (`rltf-ray eval`,
    `rltf-ray check`); the stopped pipeline (its resolved model and critic) and the result."""
    pipe = Pipeline(cfg)
    if pipe.held_out is None:  # before any engine starts
        raise no_held_out(pipe.task.name)
    pipe.start(train=False)
    try:
        return pipe, pipe.evaluate()
    finally:
        pipe.stop()
