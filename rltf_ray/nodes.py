"""The typed parameters of each pipeline node kind (`pipeline.<node>.<param>` in a config).
Every field's comment is its documentation (docs/config.md is generated from them)."""
from __future__ import annotations

from dataclasses import dataclass, field

from rltf_ray.config import ConfigError


def check_round(k: int) -> None:
    if k < 1:
        raise ConfigError(f"round: must be >= 1, got {k}")


@dataclass(frozen=True)
class SourceParams:
    prompts_per_step: int = 8  # distinct prompts per RL step (each sampled n times)
    # Prompt rows: a JSONL or Parquet file, or a local Hugging Face dataset folder
    # (save_to_disk); None = the task's generator. Row shapes: docs/data.md.
    path: str | None = None
    prompt_key: str = "prompt"  # the column holding the prompt: a string, or a list of chat messages
    id_key: str = "prompt_id"  # the column holding a row's id (optional; default row-<line>)
    # The columns that form a row's `meta` (what the task or the reward functions score
    # against): a list of columns, or a mapping {meta key: column} where a column may be a
    # dotted path (reward_model.ground_truth). None: the row's `meta` object if it has one,
    # else every other column (as TRL passes every column to its reward functions).
    meta_keys: list | dict | None = None
    # A system message before every prompt, in training and held-out evaluation; a chat
    # prompt that has its own system message keeps it.
    system_prompt: str | None = None
    batch_size: int = 64  # rows per Ray Data batch
    # A bad row in `path`: "error" lists every bad row and stops before start-up; "skip"
    # writes them to bad_rows.jsonl, counts them, and trains on the rest.
    on_bad_row: str = "error"

    def __post_init__(self):
        if self.on_bad_row not in ("error", "skip"):
            raise ConfigError(f"on_bad_row: expected error or skip, got {self.on_bad_row!r}")
        for key in ("prompt_key", "id_key"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ConfigError(f"{key}: expected a column name, got {getattr(self, key)!r}")
        m = self.meta_keys
        names = list(m.values()) + list(m) if isinstance(m, dict) else m or []
        if m is not None and (not m or not all(isinstance(k, str) and k for k in names)):
            raise ConfigError(f"meta_keys: expected a non-empty list of column names or a mapping "
                              f"{{meta key: column}}, got {m!r}")
        if self.system_prompt is not None and not str(self.system_prompt).strip():
            raise ConfigError("system_prompt: empty; leave it unset for no system message")


@dataclass(frozen=True)
class GenerateParams:
    n: int = 4  # samples per prompt (the group)
    temperature: float = 1.0  # sampling temperature of first answers (also the SD term's)
    top_p: float = 1.0  # nucleus sampling (< 1 is refused where the RL ratio trains on the samples)
    max_tokens: int = 128  # the longest first answer
    batch_size: int = 32  # rows per Ray Data batch sent to an engine


@dataclass(frozen=True)
class CritiqueParams:
    critic: str = "programmatic"  # programmatic, correctness_only, llm_judge, openai, learned, or a plugin's critic
    # The Serve app a run deploys its critic under. None: a name of the run's own,
    # rltf_critic_<run id>, so that runs sharing a cluster never share (or delete) a critic;
    # a name given here must not be running already. With attach: the running app to use
    # (None: rltf_critic, the name serve/critic.yaml deploys).
    app_name: str | None = None
    # Attach to an already running critic app of that name instead of deploying one.
    attach: bool = False
    # A correct first answer ends the episode: no critique request and no revision.
    early_termination: bool = True
    batch_size: int = 32  # rows per Ray Data batch (and per request chunk in evaluation)
    timeout_s: float = 60.0  # seconds a critique request may take before it is retried
    retries: int = 2  # retries of a failed request, with exponential backoff
    backoff_s: float = 0.5  # the first retry's wait; it doubles on each retry
    num_replicas: int = 1  # critic replicas (fixed; see max_replicas for autoscaling)
    # Serve autoscaling: used when max_replicas is set.
    min_replicas: int = 1
    max_replicas: int | None = None  # Serve autoscaling's upper bound; None = a fixed num_replicas
    target_ongoing_requests: float = 16.0  # Serve autoscaling's target requests per replica
    max_batch_size: int = 64  # requests a replica judges in one batch (@serve.batch)
    batch_wait_timeout_s: float = 0.01  # how long a replica waits to fill a batch
    # llm_judge: the judge's own model (any HF folder; "smollm2"/"tiny" = built-in).
    judge_model: str = "smollm2"
    judge_max_tokens: int = 256  # llm_judge: the longest critique the judge may write
    # llm_judge's engine dtype ("auto": bfloat16 on a GPU or a CPU with native bf16, else float32).
    judge_dtype: str = "auto"
    judge_max_model_len: int = 2048  # llm_judge: tokens of judge prompt + critique its engine accepts
    judge_kv_cache_gib: float = 1.0  # llm_judge on CPU: its engine's KV cache in GiB
    judge_num_cpus: float = 1.0  # llm_judge: CPUs each judge replica holds
    # llm_judge: GPUs each replica holds; > 0 runs a CUDA vLLM judge (tensor-parallel over
    # them when a whole number above 1). Written for GPUs, not yet run on one.
    judge_num_gpus: float = 0.0
    judge_gpu_memory_utilization: float = 0.85  # llm_judge on GPU: the share of its GPU(s) vLLM may take
    # openai: an OpenAI-compatible endpoint; the key is read from env var `api_key_env`.
    base_url: str | None = None
    model: str | None = None  # openai: the model name the endpoint serves
    api_key_env: str | None = None  # openai: the env var that holds the API key (never the key itself)
    # A step whose critique requests fail (after retries) above this fraction stops the run
    # with the critic's error: RLTF without critiques would silently be plain GRPO.
    max_failed_fraction: float = 0.2
    # The critic class's own constructor arguments: a plugin critic is built as
    # Cls(task, **critic_params); the built-ins take their settings from the params above.
    critic_params: dict = field(default_factory=dict)
    # llm_judge and openai: their prompt templates, a mapping or the path of a YAML/JSON file
    # of one (keys and placeholders: rltf_ray.critics.judge_prompts); unset keys keep the defaults.
    judge_prompts: dict | str | None = None
    # llm_judge and openai: the column that holds the reference answer the judge grades against,
    # a dotted path for nested ones ("reward_model.ground_truth"); unset, the first the row has
    # of answer, solution (TRL), reward_model.ground_truth (verl), ground_truth.
    reference_key: str | None = None
    # Custom Ray resources each critic replica (and a learned critic's engine) requires, so
    # that a cluster can dedicate nodes to the critic, e.g. {critic_node: 1}.
    resources: dict = field(default_factory=dict)
    round: int = 1  # set by `run.turns` expansion; round k critiques the turn k-1 attempt

    def __post_init__(self):
        check_round(self.round)
        if not 0.0 <= self.max_failed_fraction <= 1.0:
            raise ConfigError(f"max_failed_fraction: must be in [0, 1], got {self.max_failed_fraction}")
        # the registry holds the built-ins and the plugins' critics (the driver imports the
        # plugins before validating; a Ray worker imports them on its first unknown name)
        from rltf_ray.critics import get_critic
        from rltf_ray.critics.base import check_critic_params
        from rltf_ray.critics.judge_prompts import resolve_judge_prompts

        check_critic_params(self.critic, get_critic(self.critic), self.critic_params)
        if self.judge_prompts is not None:
            if self.critic not in ("llm_judge", "openai"):
                raise ConfigError(f"judge_prompts: only the llm_judge and openai critics use them "
                                  f"(critic is {self.critic!r})")
            resolve_judge_prompts(self.judge_prompts)  # a missing file or a bad template fails here
        if self.reference_key is not None and (self.critic not in ("llm_judge", "openai")
                                               or not str(self.reference_key).strip()):
            raise ConfigError(f"reference_key: a non-empty column name, for the llm_judge and openai critics "
                              f"only (critic is {self.critic!r}, reference_key {self.reference_key!r})")
        if self.critic == "openai" and not (self.base_url and self.model):
            raise ConfigError("critic 'openai' needs base_url and model")
        if self.retries < 0 or self.timeout_s <= 0:
            raise ConfigError("retries must be >= 0 and timeout_s > 0")
        if self.judge_dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ConfigError(f"judge_dtype: expected auto, bfloat16, float16 or float32, got {self.judge_dtype!r}")
        if self.judge_max_model_len <= self.judge_max_tokens or self.judge_kv_cache_gib <= 0:
            raise ConfigError(f"judge_max_model_len ({self.judge_max_model_len}) must exceed judge_max_tokens "
                              f"({self.judge_max_tokens}), and judge_kv_cache_gib must be > 0")
        if self.judge_num_cpus < 0 or self.judge_num_gpus < 0 or not 0 < self.judge_gpu_memory_utilization <= 1:
            raise ConfigError("judge_num_cpus and judge_num_gpus must be >= 0 and judge_gpu_memory_utilization "
                              "in (0, 1]")


@dataclass(frozen=True)
class ReviseParams:
    temperature: float = 1.0  # sampling temperature of revisions
    top_p: float = 1.0  # nucleus sampling of revisions
    max_tokens: int = 128  # the longest revision
    # The user turn that carries the critique; {critique} is replaced and every other brace is
    # kept as written (not str.format: no {{ escapes needed). None: the task's own,
    # which asks for its answer format (<answer>...</answer>, or \boxed{} for math).
    template: str | None = None
    batch_size: int = 32  # rows per Ray Data batch sent to an engine
    round: int = 1  # set by run.turns expansion: round k revises after critique k

    def __post_init__(self):
        check_round(self.round)
        if self.template is not None and "{critique}" not in self.template:
            raise ConfigError(f"template: must contain {{critique}}, got {self.template!r}")


@dataclass(frozen=True)
class RewardParams:
    batch_size: int = 64  # rows per Ray Data batch
    round: int = 1  # set by run.turns expansion: round k scores revision k

    def __post_init__(self):
        check_round(self.round)


@dataclass(frozen=True)
class TrainParams:
    pass

