"""Where a run's step metrics go besides metrics.jsonl.

* TensorBoard event files under <output_dir>/tensorboard (on by default; `tensorboard
  --logdir outputs/`), written with tensorboardX.
* MLflow (`run.mlflow: <tracking URI>`) and Weights & Biases (`run.wandb_project: NAME`),
  through their own packages, only when configured: nothing is sent anywhere otherwise.
* Ray's metrics (`ray.util.metrics` gauges, tagged with the run name, `run_tag`), which the Ray
  dashboard and its Prometheus endpoint show (`ray_rltf_*`).
"""
from __future__ import annotations

import hashlib
import math
import re
from pathlib import Path

# step-row key -> Ray gauge name (Prometheus rules: [a-zA-Z_:][a-zA-Z0-9_:]*)
GAUGES = {
    "step": "rltf_step", "policy_version": "rltf_policy_version",
    "reward_first_mean": "rltf_reward_first_mean", "reward_second_mean": "rltf_reward_second_mean",
    "first_turn_accuracy": "rltf_first_turn_accuracy", "second_turn_accuracy": "rltf_second_turn_accuracy",
    "revision_gain": "rltf_revision_gain", "generate_tokens_per_s": "rltf_generate_tokens_per_s",
    "critique_failed": "rltf_critique_failed", "loss": "rltf_loss", "critic_version": "rltf_critic_version",
    "critic_reward_mean": "rltf_critic_reward_mean", "logprob_abs_diff_mean": "rltf_logprob_abs_diff_mean",
    "engine_version_lag": "rltf_engine_version_lag", "rows": "rltf_rows_per_step",
    "train_tokens_per_s": "rltf_train_tokens_per_s", "learner_peak_rss_gb": "rltf_learner_peak_rss_gb",
    "engine_peak_rss_gb": "rltf_engine_peak_rss_gb", "sampler_kl_k3": "rltf_sampler_kl_k3",
    "critic_zero_advantage_fraction": "rltf_critic_zero_advantage_fraction",
}
PHASES = ("rollout", "train", "sync", "step")


def run_tag(out: Path) -> str:
    """A run's name in MLflow's and W&B's run lists and the `run` tag of its Ray metrics: the
    output folder's last part, and a short hash of its whole absolute path, so
    that `a/seed0` and `b/seed0` (or every Tune trial's `.../rltf`) stay apart, while a run
    resumed in its folder keeps its name."""
    path = str(Path(out).resolve())
    return f"{Path(path).name}-{hashlib.sha1(path.encode()).hexdigest()[:6]}"


def _numbers(row: dict, prefix: str = "") -> dict[str, float]:
    """The finite numeric values of a (nested) metrics row, flattened with '/'."""
    out = {}
    for k, v in row.items():
        if isinstance(v, dict):
            out.update(_numbers(v, f"{prefix}{k}/"))
        elif isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            out[prefix + k] = float(v)
    return out


class Tracker:
    def __init__(self, run_cfg, out: Path, run_name: str | None = None, stages: tuple[str, ...] = ()):
        """`stages`: the pipeline nodes every rollout row passes (their finished rows are counted)."""
        self.name = run_name or run_tag(out)
        self.stages = stages
        self.writers = []
        if run_cfg.tensorboard:
            from tensorboardX import SummaryWriter

            self.tb = SummaryWriter(str(out / "tensorboard"))
            self.writers.append(lambda vals, step: [self.tb.add_scalar(k, v, step) for k, v in vals.items()])
        if run_cfg.mlflow:
            try:
                import mlflow
            except ImportError as e:
                raise RuntimeError("run.mlflow is set but MLflow is not installed: pip install mlflow") from e
            mlflow.set_tracking_uri(run_cfg.mlflow)
            mlflow.start_run(run_name=self.name)
            self.writers.append(lambda vals, step: mlflow.log_metrics(
                {re.sub(r"[^\w\-. /]", "_", k): v for k, v in vals.items()}, step=step))
        if run_cfg.wandb_project:
            try:
                import wandb
            except ImportError as e:
                raise RuntimeError("run.wandb_project is set but wandb is not installed: pip install wandb") from e
            self.wandb = wandb.init(project=run_cfg.wandb_project, name=self.name)
            self.writers.append(lambda vals, step: self.wandb.log(vals, step=step))
        self.gauges = {}
        self.phase = None

    def _ray_gauges(self) -> None:
        from ray.util.metrics import Counter, Gauge

        tags = {"run": self.name}
        for key, name in GAUGES.items():
            g = Gauge(name, f"rltf_ray: {key} of the latest RL step", tag_keys=("run",))
            g.set_default_tags(tags)
            self.gauges[key] = g
        self.phase = Gauge("rltf_step_seconds", "rltf_ray: seconds of the latest RL step by phase",
                           tag_keys=("run", "phase"))
        self.phase.set_default_tags(tags)
        # counted here, in the long-lived driver, rather than in the Ray Data workers that run
        # the stages, whose series end with them (rltf_ray.stages._RowMetrics)
        self.stage_rows = Counter("rltf_stage_rows", "rltf_ray: rows a pipeline stage has finished",
                                  tag_keys=("run", "stage"))
        self.stage_rows.set_default_tags(tags)

    def log(self, row: dict, step: int) -> None:
        vals = _numbers(row)
        for write in self.writers:
            write(vals, step)
        try:
            if not self.gauges:
                self._ray_gauges()
        except Exception:  # no Ray metrics agent (e.g. outside a running Ray): files still written
            return
        for key, g in self.gauges.items():
            if key in vals:
                g.set(vals[key])
        for p in PHASES:
            if f"seconds_{p}" in vals:
                self.phase.set(vals[f"seconds_{p}"], tags={"phase": p})
        if vals.get("rows"):  # every row of the step passed every stage (a Counter takes only > 0)
            for stage in self.stages:
                self.stage_rows.inc(vals["rows"], tags={"stage": stage})

    def close(self) -> None:
        if hasattr(self, "tb"):
            self.tb.close()
        if hasattr(self, "wandb"):
            self.wandb.finish()
