"""Typed, frozen run configuration loaded from YAML plus `a.b=c` overrides.

Every section is a frozen dataclass; `from_dict` checks keys and types and names the
offending key in its error, so a typo never silently falls back to a default.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any



from rltf_ray.errors import ConfigError  # noqa: E402,F401  (re-exported: rltf_ray.config.ConfigError)
from rltf_ray.loss_config import LossConfig  # noqa: E402,F401  (re-exported: a section of Config)
from rltf_ray.binac_config import DEFAULT_CRITIC_PROMPT, BinacConfig  # noqa: E402,F401  (re-exported)


@dataclass(frozen=True)
class ModelConfig:
    # "tiny" and "smollm2" name the folders built by `make models`; anything else is an HF
    # folder path or hub id.
    path: str = "tiny"
    # The run's precision: the engines sample in it and, unless trainer.bf16 says otherwise,
    # the learner computes in it (rltf_ray/precision.py). "auto": bfloat16 on GPU or on CPUs
    # with native bf16 (AMX/AVX512-BF16), else float32 -- on an AVX2-only CPU bf16 generation
    # measured 4.6x slower than fp32.
    dtype: str = "auto"
    # "float32": the LM head's logits in fp32 on both sides (vLLM's head_dtype in every engine,
    # the learner's head when it computes in bf16); null: in the model's dtype.
    head_dtype: str | None = "float32"

    def __post_init__(self):
        from rltf_ray.precision import check_head_dtype

        check_head_dtype(self.head_dtype)


def task_name(task: dict) -> str | None:
    """The task a config's `task` section runs: reward functions make the default task theirs."""
    name = task.get("name")
    return "reward_funcs" if task.get("reward_funcs") and name in (None, "arithmetic") else name


@dataclass(frozen=True)
class TaskConfig:
    name: str = "arithmetic"  # a built-in task, one a plugin registers, or rg:<reasoning-gym dataset>
    seed: int = 0  # the problem generator's seed: which problem each index (and split) is
    # "tag" needs <answer>..</answer>; "last_number" takes the last integer in the text.
    extraction: str = "tag"
    format_weight: float = 0.1  # subtracted from the reward of an answer not in the format
    # The task's own settings (its default_params; an unknown key is an error).
    params: dict = field(default_factory=dict)
    # Reward functions as TRL or verl write them, 'module:function' or 'file.py:function'
    # (rltf_ray/tasks/rewards.py): they replace a task's scoring, and task.name becomes
    # reward_funcs. Prompts then come from a file.
    reward_funcs: list = field(default_factory=list)
    reward_weights: list | None = None  # one weight per reward function; None = 1 each
    # reward_funcs: the function whose value alone decides correctness (accuracy, and which
    # answers get critiqued), by its name or as listed in reward_funcs; None = the first listed.
    # Not the weighted sum: a format reward would make a wrong answer in the format correct.
    correct_from: str | None = None
    # reward_funcs: an answer is correct when correct_from's value reaches this (a None never does).
    correct_threshold: float = 1.0

    def __post_init__(self):
        if not self.reward_funcs:
            for key in ("reward_weights", "correct_from"):
                if getattr(self, key) is not None:
                    raise ConfigError(f"task.{key}: set without task.reward_funcs")
            return
        object.__setattr__(self, "name", task_name({"name": self.name, "reward_funcs": self.reward_funcs}))
        if self.name != "reward_funcs":
            raise ConfigError(f"task.reward_funcs replace the task's own scoring; task.name must be "
                              f"reward_funcs or left unset (got {self.name!r})")
        w = self.reward_weights
        if w is not None and (len(w) != len(self.reward_funcs) or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in w)):
            raise ConfigError(f"task.reward_weights: expected {len(self.reward_funcs)} numbers (one per "
                              f"reward function), got {w!r}")
        if not math.isfinite(self.correct_threshold):
            raise ConfigError("task.correct_threshold: must be a finite number")
        # the functions themselves are resolved where the task is built (loading.build_config
        # checks them before a run starts): the config holds their names only


@dataclass(frozen=True)
class EngineConfig:
    num_engines: int = 1  # vLLM engine actors that serve rollouts (each holds the whole model)
    max_model_len: int = 1024  # tokens of prompt + answer an engine accepts (x1 of a revision included)
    kv_cache_gib: float = 1.0  # a CPU engine's KV cache in GiB (0.5: half of one)
    enforce_eager: bool = True  # no CUDA graphs / torch.compile in vLLM (start-up in seconds on CPU)
    # CPU threads for each engine; vLLM binds them to cores ("0-1"). "auto" = all cores.
    cpu_threads_bind: str = "auto"
    # Custom Ray resources each engine requires (e.g. {engine_node: 1}): dedicated nodes.
    resources: dict = field(default_factory=dict)
    # A dead engine actor is restarted this many times; it loads the latest pushed weights
    # before serving, and Ray retries its interrupted calls (CPU object-store sync only).
    max_restarts: int = 2
    # KV-cache block size in tokens; None = vLLM's (128 on CPU, 16 on GPU). The prefix cache
    # shares whole blocks only, so a revision reuses x0 + y0's prefill in steps of this size.
    block_size: int | None = None
    # Unix niceness of the engine processes; None = the Ray's worker niceness (15 by default,
    # below Ray's daemons at 0). At 15 a generating engine's threads wait on the run queue
    # behind Ray's daemons on a small CPU node, but 0 did not measurably shorten a step there
    # (docs/benchmark-log.md, 2026-12-02). 0..19: a lower value needs privileges.
    nice: int | None = None
    # Run the engine's threads under SCHED_RR (rltf_ray/realtime.py): on a small CPU node
    # Ray's own processes otherwise cost generation far more than the CPU they take. Needs
    # CAP_SYS_NICE or `ulimit -r` >= 1 on the engine's node; CPU engines only.
    realtime: bool = False
    # GPU engines (trainer.weight_sync=nccl): the share of each GPU vLLM may take (the rest
    # is left to a learner on the same GPU).
    gpu_memory_utilization: float = 0.5
    tensor_parallel_size: int = 1  # GPUs per engine (vLLM tensor parallelism; GPU engines only)

    def __post_init__(self):
        if not self.kv_cache_gib > 0:
            raise ConfigError(f"engine.kv_cache_gib: must be > 0, got {self.kv_cache_gib}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(f"engine.gpu_memory_utilization: expected a fraction in (0, 1], "
                              f"got {self.gpu_memory_utilization}")
        if self.tensor_parallel_size < 1:
            raise ConfigError(f"engine.tensor_parallel_size: must be >= 1, got {self.tensor_parallel_size}")
        if self.block_size is not None and (self.block_size < 16 or self.block_size % 16):
            raise ConfigError(f"engine.block_size: expected a multiple of 16 (or null), got {self.block_size}")
        if self.nice is not None and not 0 <= self.nice <= 19:
            raise ConfigError(f"engine.nice: expected 0..19 (or null for Ray's default), got {self.nice}")


@dataclass(frozen=True)
class TrainerConfig:
    num_workers: int = 2  # Ray Train workers, each a DeepSpeed rank
    zero_stage: int = 2  # DeepSpeed ZeRO stage 0-3 (with one worker, 0 needs the least memory)
    # DeepSpeed's bf16 mode (fp32 master weights) for the learner; false = fp32; null (the
    # default) = follow model.dtype, so that the learner scores the engine's own model. A
    # value that disagrees with the engine's dtype runs, with a warning at start.
    bf16: bool | None = None
    lr: float = 1e-5  # AdamW learning rate (the peak, under a schedule)
    # constant, linear or cosine: from lr after the warmup down to lr * min_lr_ratio at
    # run.steps, set once per RL step (rltf_ray.learner.lr_at)
    lr_schedule: str = "constant"
    lr_warmup_steps: int = 0  # RL steps of linear warmup: step s trains at lr * (s+1)/(warmup+1)
    min_lr_ratio: float = 0.0  # the decayed schedules' floor, as a fraction of lr
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # gradient-norm clip per optimizer step
    # Sequences per forward/backward on one worker; gradients accumulate over micro-batches.
    micro_batch_size: int = 8
    # Sequences per optimizer step, all workers together (verl's ppo_mini_batch_size): an RL
    # step's sequences, shuffled, make ceil(n / mini_batch_size) optimizer steps. None: one.
    mini_batch_size: int | None = None
    # Recompute activations in the backward pass (HF gradient checkpointing): less memory for
    # long sequences, about a third more compute.
    gradient_checkpointing: bool = False
    cpu_threads_per_worker: int = 1  # torch threads per training worker (CPU)
    # How new weights reach the engines: "object_store" (CPU engines, through Ray's object
    # store), "nccl" (GPU: a broadcast from trainer rank 0 into every engine worker; not
    # yet run) or "gloo" (the same broadcast protocol between CPU processes).
    weight_sync: str = "object_store"
    # Custom Ray resources each training worker requires (e.g. {trainer_node: 1}).
    resources: dict = field(default_factory=dict)
    # LoRA through peft: {rank: 32, alpha: 32, target_modules: [q_proj, ...]}; {} = full
    # fine-tune. Only the adapters train; the engines get the merged weights.
    lora: dict = field(default_factory=dict)
    # Run the training workers' threads under SCHED_RR (rltf_ray/realtime.py), as
    # engine.realtime does for the engines; needs CAP_SYS_NICE or `ulimit -r` >= 1.
    realtime: bool = False

    def __post_init__(self):
        if self.lr_schedule not in ("constant", "linear", "cosine"):
            raise ConfigError(f"trainer.lr_schedule: expected constant, linear or cosine, got {self.lr_schedule!r}")
        if self.lr_warmup_steps < 0 or not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError("trainer.lr_warmup_steps must be >= 0 and trainer.min_lr_ratio in [0, 1]")
        if self.micro_batch_size < 1 or (self.mini_batch_size is not None and self.mini_batch_size < 1):
            raise ConfigError(f"trainer.micro_batch_size and mini_batch_size must be >= 1 "
                              f"(got {self.micro_batch_size}, {self.mini_batch_size})")
        if self.weight_sync not in ("object_store", "nccl", "gloo"):
            raise ConfigError(f"trainer.weight_sync: expected 'object_store', 'nccl' or 'gloo', "
                              f"got {self.weight_sync!r}")
        if self.lora:
            unknown = set(self.lora) - {"rank", "alpha", "target_modules", "dropout"}
            if unknown:
                raise ConfigError(f"trainer.lora: unknown key {sorted(unknown)[0]!r} "
                                  "(known: rank, alpha, target_modules, dropout)")
            if not isinstance(self.lora.get("rank"), int) or self.lora["rank"] < 1:
                raise ConfigError("trainer.lora.rank: a positive integer is required")
            if self.zero_stage == 3:
                raise ConfigError("trainer.lora: use zero_stage <= 2 (the adapters are merged into "
                                  "full weights for the engines; ZeRO-3 partitions them)")


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation (rltf_ray/evaluation.py): before and after training, every
    `run.eval_every` steps, and by pipelines/eval.py."""

    prompts: int = 64  # distinct held-out problems (at most the task's test split, or the file's rows)
    # Held-out problems from a file of one's own, read like the training prompts (any row shape
    # pipeline.prompts accepts, with its column mapping and system prompt: docs/data.md);
    # None = the task's own test split.
    path: str | None = None
    greedy: bool = True  # single-turn accuracy at temperature 0
    pass_k: list = field(default_factory=list)  # sampled pass@k, e.g. [1, 4, 8]; [] = off
    samples: int = 8  # samples per problem for pass@k (>= the largest k)
    temperature: float | None = None  # for pass@k; None = the first turn's temperature
    feedback_rounds: int = 0  # the run's critic in the loop: accuracy after each round
    self_feedback_rounds: int = 0  # the model's own FM critique, then a revision
    critique_max_tokens: int = 128  # for self-feedback critiques
    # The measures run every `run.eval_every` steps: "greedy" (cheap) or "all" of the above.
    during_training: str = "greedy"
    # The learned critic's sampling temperature when an evaluation asks it for a critique
    # (0 = greedy); None = binac.temperature, the temperature it samples at in training.
    critic_temperature: float | None = None
    # Calibration problems, which no evaluation scores: choices made before scoring (a room
    # check, a critic's temperature) are made on them. By default the task's test split after
    # its first `prompts` problems (never trained on, never scored).
    calibration_prompts: int = 128
    # Calibration problems from a file of one's own (the prompt-file format); needed when
    # `path` gives the scored problems or the task generates none.
    calibration_path: str | None = None
    # The problems an evaluation scores: "test" (the held-out problems above) or
    # "calibration" (`rltf-ray eval --split calibration`, to choose a setting).
    split: str = "test"

    def __post_init__(self):
        if self.prompts < 1:
            raise ConfigError("eval.prompts: must be >= 1")
        if self.calibration_prompts < 1:
            raise ConfigError("eval.calibration_prompts: must be >= 1")
        if self.split not in ("test", "calibration"):
            raise ConfigError(f"eval.split: expected test or calibration, got {self.split!r}")
        if self.critic_temperature is not None and not self.critic_temperature >= 0:  # also refuses NaN
            raise ConfigError(f"eval.critic_temperature: must be >= 0 (0 = greedy) or None, "
                              f"got {self.critic_temperature}")
        if not isinstance(self.pass_k, list) or not all(isinstance(k, int) and 1 <= k <= self.samples
                                                         for k in self.pass_k):
            raise ConfigError(f"eval.pass_k: a list of ints in 1..eval.samples ({self.samples}), "
                              f"got {self.pass_k!r}")
        if self.feedback_rounds < 0 or self.self_feedback_rounds < 0:
            raise ConfigError("eval.feedback_rounds and eval.self_feedback_rounds: must be >= 0")
        if self.during_training not in ("greedy", "all"):
            raise ConfigError(f"eval.during_training: expected greedy or all, got {self.during_training!r}")


@dataclass(frozen=True)
class RunConfig:
    steps: int = 2  # RL steps: each generates, critiques, revises and trains once
    seed: int = 0  # the run's seed: which prompts each step sees, sampling, initialisation
    output_dir: str = "outputs/run"  # metrics.jsonl, rollouts/, checkpoints/, summary.json go here
    checkpoint_every: int = 0  # a learner checkpoint every this many steps (0 = only after the last)
    eval_before_after: bool = True  # held-out evaluation before the first step and after the last
    # Held-out evaluation every this many steps (0 = off), written into metrics.jsonl.
    eval_every: int = 0
    # Asynchronous overlap: step s+1's rollouts are generated while the learner trains on
    # step s, by engines at most this many policy versions behind (0 = strictly on-policy).
    max_staleness: int = 0
    # Continue a run from its last checkpoint: "never" (a fresh run; a previous run's trainer
    # state in the output dir is cleared), "auto" (resume if there is a checkpoint), "must"
    # (resume, and fail if there is none). `pipelines/run.py --resume DIR` sets "must".
    resume: str = "never"
    # Ray Train restarts crashed training workers from the last checkpoint this many times.
    max_failures: int = 0
    keep_checkpoints: int = 2  # Ray Train checkpoints kept (CheckpointConfig.num_to_keep)
    # Fail before anything starts when the checkpoints will not fit on disk (rltf_ray/disk.py).
    check_disk: bool = True
    # Where Ray Train persists checkpoints: a path or a pyarrow URI (s3://...). On a
    # multi-node cluster it must be storage every node sees. None = <output_dir>/ray_train.
    storage_path: str | None = None
    # Experiment logs besides metrics.jsonl (rltf_ray/tracking.py): TensorBoard event files
    # (default on); MLflow (a tracking URI) and Weights & Biases (a project) only when set.
    tensorboard: bool = True
    # Prometheus port of an embedded Ray's metrics agent (ray_rltf_* gauges); None = Ray's pick.
    metrics_export_port: int | None = None
    mlflow: str | None = None  # an MLflow tracking URI to log to; None = off
    wandb_project: str | None = None  # a Weights & Biases project to log to; None = off
    # Logical CPUs for an embedded (in-process) Ray; None = max(8, os.cpu_count()).
    local_num_cpus: int | None = None
    serve_http_port: int = 8000  # the port of Serve's HTTP proxy (the critic app's routes)
    # Rollout turns: 2 = answer, critique, revision; 1 = single-turn (no critique, no
    # revision); K > 2 repeats critique and revision up to K-1 times while the answer is wrong.
    turns: int = 2

    def __post_init__(self):
        if self.turns < 1:
            raise ConfigError(f"run.turns: must be >= 1, got {self.turns}")
        if self.steps < 1:
            raise ConfigError("run.steps: must be >= 1")
        if self.eval_every < 0:
            raise ConfigError("run.eval_every: must be >= 0")
        if self.max_staleness < 0:
            raise ConfigError(f"run.max_staleness: must be >= 0 (0 = on-policy), got {self.max_staleness}")
        if self.resume not in ("never", "auto", "must"):
            raise ConfigError(f"run.resume: expected never, auto or must, got {self.resume!r}")
        if self.max_failures < 0 or self.keep_checkpoints < 1:
            raise ConfigError("run.max_failures must be >= 0 and run.keep_checkpoints >= 1")

    @property
    def rounds(self) -> int:
        """Critique rounds the graph holds (a single-turn run keeps one, which asks nothing)."""
        return max(self.turns - 1, 1)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    kind: str
    inputs: dict = field(default_factory=dict)
    params: dict = field(default_factory=dict)


DEFAULT_PIPELINE: tuple[NodeSpec, ...] = (
    NodeSpec("prompts", "source"),
    NodeSpec("first_turn", "generate", {"prompts": "prompts"}),
    NodeSpec("critic", "critique", {"answers": "first_turn"}),
    NodeSpec("revision", "revise", {"critiques": "critic"}),
    NodeSpec("score", "reward", {"revisions": "revision"}),
    NodeSpec("learner", "train", {"rollouts": "score"}),
)


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    run: RunConfig = field(default_factory=RunConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    binac: BinacConfig = field(default_factory=BinacConfig)
    pipeline: tuple[NodeSpec, ...] = DEFAULT_PIPELINE
    # Modules of the user's own tasks and critics: import names or paths of .py files,
    # imported by the driver and by every Ray worker that resolves a task or a critic, and
    # shipped to a cluster through Ray's runtime_env (rltf_ray/plugins.py).
    plugins: list = field(default_factory=list)

    def __post_init__(self):
        if not isinstance(self.plugins, list) or not all(isinstance(p, str) and p for p in self.plugins):
            raise ConfigError(f"plugins: expected a list of module names or .py paths, got {self.plugins!r}")

    def node(self, kind: str) -> NodeSpec:
        """The node of `kind` (for critique/revise/reward: the round-1 node)."""
        found = [n for n in self.pipeline if n.kind == kind and n.params.get("round", 1) == 1]
        if len(found) != 1:
            raise ConfigError(f"pipeline: expected exactly one '{kind}' node, found {len(found)}")
        return found[0]

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["pipeline"] = [dataclasses.asdict(n) for n in self.pipeline]
        return d


def _check_type(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_type(value, a, where)
            except ConfigError:
                pass
        raise ConfigError(f"{where}: expected {tp}, got {value!r}")
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # YAML 1.1 reads `1e-5` (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp in (int, float, str, bool):
        if isinstance(value, bool) != (tp is bool) or not isinstance(value, tp):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {type(value).__name__} {value!r}")
        return value
    return value


# Keys that were replaced, and what to write instead.
RENAMED = {"loss.tis_cap": "replaced by loss.rollout_correction (tis_token, tis_sequence, mis_token, "
                           "mis_sequence or none) with loss.rollout_cap; `loss.tis_cap=C` is now "
                           "`loss.rollout_correction=tis_token loss.rollout_cap=C`"}


def _build(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    for key in unknown:
        if f"{where}.{key}" in RENAMED:
            raise ConfigError(f"{where}.{key}: {RENAMED[f'{where}.{key}']}")
    if unknown:
        raise ConfigError(f"{where}: unknown key '{unknown[0]}' (known: {', '.join(sorted(names))})")
    kwargs = {}
    for key, value in data.items():
        tp = hints[key]
        sub = f"{where}.{key}" if where else key
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, sub)
        elif key == "pipeline":
            if not isinstance(value, list) or not value:
                raise ConfigError("pipeline: expected a non-empty list of nodes")
            kwargs[key] = tuple(_build(NodeSpec, n, f"pipeline[{i}]") for i, n in enumerate(value))
        else:
            kwargs[key] = _check_type(value, tp, sub)
    try:
        return cls(**kwargs)
    except ConfigError as e:  # a section's own cross-field check; prefix the section
        raise ConfigError(str(e) if str(e).startswith(where) or not where else f"{where}: {e}") from None
    except TypeError as e:  # a required field (NodeSpec.name/kind) is missing
        raise ConfigError(f"{where or 'config'}: {e}") from None
