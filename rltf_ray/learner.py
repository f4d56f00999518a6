"""One trainable model on a training worker: its DeepSpeed engine (with LoRA adapters if
set), its full weights for the engines and for checkpoints, its weight sync, and the resume
state that goes into a Ray Train checkpoint."""
from __future__ import annotations

import json
import math
import os

from rltf_ray.config import Config, TrainerConfig
from rltf_ray.precision import fp32_head, precision_of


def lr_at(step: int, t: TrainerConfig, total_steps: int) -> float:
    """The learning rate of RL step `step` (0-based) of `total_steps`: a linear warmup over
    `lr_warmup_steps` (step s at lr * (s+1)/(warmup+1)), then `lr_schedule` from lr down
    towards lr * min_lr_ratio, reached at `total_steps` (constant: lr throughout)."""
    if step < t.lr_warmup_steps:
        return t.lr * (step + 1) / (t.lr_warmup_steps + 1)
    if t.lr_schedule == "constant":
        return t.lr
    progress = min((step - t.lr_warmup_steps) / max(total_steps - t.lr_warmup_steps, 1), 1.0)
    shape = 1.0 - progress if t.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return t.lr * (t.min_lr_ratio + (1.0 - t.min_lr_ratio) * shape)


def deepspeed_config(cfg: Config) -> dict:
    t = cfg.trainer
    return {
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": t.grad_clip,
        # DeepSpeed's default buckets hold 5e8 elements (2 GB each in fp32): far more than a
        # small model needs, and enough to run a 24 GB node out of memory with 2 workers.
        "zero_optimization": {"stage": t.zero_stage, "reduce_bucket_size": 50_000_000,
                              "allgather_bucket_size": 50_000_000,
                              "stage3_prefetch_bucket_size": 50_000_000,
                              "stage3_param_persistence_threshold": 100_000},
        "bf16": {"enabled": precision_of(cfg).learner == "bfloat16"},
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }


def full_state_dict(engine, zero_stage: int) -> dict:
    """Full weights on every rank (ZeRO-3 shards gathered; a collective on all ranks); a
    LoRA model's adapters merged in."""
    if zero_stage == 3:
        import deepspeed

        params = list(engine.module.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    return merged_state_dict(engine.module)


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_model(model_path: str, cfg: Config):
    """The trainable model: the HF model, or it wrapped with LoRA adapters (only they train).
    Loaded in the learner's precision (`rltf_ray.precision`): bf16, as DeepSpeed's bf16 mode
    would cast it anyway, keeping fp32 master weights in the optimizer (loading it so halves
    the load's peak memory), else fp32; with its LM head computed in fp32 under
    `model.head_dtype: float32`."""
    import torch
    from transformers import AutoModelForCausalLM

    p = precision_of(cfg)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, p.learner))
    if p.learner_head_fp32:
        fp32_head(model)
    if cfg.trainer.gradient_checkpointing:  # recompute activations in backward: memory for time
        model.config.use_cache = False
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # HF's layers checkpoint only in training mode, and from_pretrained returns the model in
        # eval mode; dropout stays off, as in the sampler
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
            if isinstance(getattr(m, "attention_dropout", None), float):  # functional, in the attention call
                m.attention_dropout = 0.0
        if hasattr(model.config, "attention_dropout"):
            model.config.attention_dropout = 0.0
        model.train()
    lora = cfg.trainer.lora
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(
            r=lora["rank"], lora_alpha=lora.get("alpha", lora["rank"]), lora_dropout=lora.get("dropout", 0.0),
            target_modules=lora.get("target_modules", LORA_TARGETS), bias="none"))
    return model


def merged_state_dict(module) -> dict:
    """Full weights under the base model's names: for a LoRA model, base + scale * B @ A,
    computed beside the weights (the base is never modified, so nothing drifts)."""
    if not hasattr(module, "get_base_model"):
        return {k: v.detach() for k, v in module.state_dict().items()}
    from peft.tuners.lora import LoraLayer

    base = module.get_base_model()
    out = {k.replace(".base_layer", ""): v.detach().clone() for k, v in base.state_dict().items()
           if "lora_" not in k}
    for name, layer in base.named_modules():
        if isinstance(layer, LoraLayer):
            for adapter in layer.active_adapters:
                out[f"{name}.weight"] += layer.get_delta_weight(adapter).detach()
    return out


class Learner:
    """One trainable model on this worker: its DeepSpeed engine, and (rank 0) the weight sync
    into the vLLM engines that serve it, with its version (= optimizer steps taken)."""

    def __init__(self, model_path: str, cfg: Config, engines: list, engine_dtype: str, rank: int,
                 keep: tuple[str, str] | None = None):
        import deepspeed
        import torch

        from rltf_ray.chat import load_tokenizer, pad_id
        from rltf_ray.weight_sync.factory import make_weight_sync

        self.tokenizer = load_tokenizer(model_path)
        self.pad_id = pad_id(self.tokenizer)
        model = build_model(model_path, cfg)
        # fused: one kernel over each tensor (CPU and CUDA); on this 2-core CPU the default
        # per-op AdamW took 0.40 s a step for 67 M weights, the fused one 0.09 s (benchmarks.md)
        optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.trainer.lr,
                                  weight_decay=cfg.trainer.weight_decay, fused=True)
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=optim, config=deepspeed_config(cfg),
                                               dist_init_required=False)
        self.zero_stage, self.rank, self.version = cfg.trainer.zero_stage, rank, 0
        self.sync = make_weight_sync(cfg.trainer.weight_sync, getattr(torch, engine_dtype), keep,
                                     cfg.engine.tensor_parallel_size)
        if rank == 0:
            self.sync.connect(engines)

    def push(self, bump: bool = True) -> dict:
        """Gather the full weights (a collective), and from rank 0 push them as a new version
        (or, `bump=False`, as the current one: after a restore)."""
        self.version += int(bump)
        state = full_state_dict(self.engine, self.zero_stage)
        if self.rank == 0:
            self.sync.push(state.items(), self.version)
        return state

    def save(self, path: str, state: dict, tokenizer) -> None:
        """An HF folder of the full (for LoRA: merged) weights, which vLLM loads."""
        module = self.engine.module
        base = module.get_base_model() if hasattr(module, "get_base_model") else module
        base.save_pretrained(path, state_dict=state)
        tokenizer.save_pretrained(path)


def save_train_state(tmp: str, step: int, actor: Learner, critic: Learner | None, rank: int,
                     recent: list[dict]) -> None:
    """Everything a resumed run needs, in this rank's share of a Ray Train checkpoint: the
    DeepSpeed checkpoints (weights and optimizer state) of the actor and the critic, this
    rank's RNG states, and (rank 0) the step, the versions and the `recent` steps' training
    metrics (a driver killed before it wrote their metrics rows gets them back on resume)."""
    import random

    import numpy as np
    import torch

    actor.engine.save_checkpoint(os.path.join(tmp, "actor"), tag="ds")
    if critic is not None:
        critic.engine.save_checkpoint(os.path.join(tmp, "critic"), tag="ds")
    torch.save({"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()},
               os.path.join(tmp, f"rng_rank{rank}.pt"))
    if rank == 0:
        with open(os.path.join(tmp, "state.json"), "w") as f:
            json.dump({"step": step, "policy_version": actor.version,
                       "critic_version": critic.version if critic else 0, "recent_metrics": recent}, f)


def load_train_state(ckpt, actor: Learner, critic: Learner | None, rank: int) -> tuple[int, list[dict]]:
    """Restore from a Ray Train checkpoint: the first step still to train, and the training
    metrics of the steps just before it (`save_train_state`'s `recent`)."""
    import random

    import torch

    with ckpt.as_directory() as d:
        with open(os.path.join(d, "state.json")) as f:
            state = json.load(f)
        actor.engine.load_checkpoint(os.path.join(d, "actor"), tag="ds")
        if critic is not None:
            critic.engine.load_checkpoint(os.path.join(d, "critic"), tag="ds")
        rng_file = os.path.join(d, f"rng_rank{rank}.pt")
        if os.path.exists(rng_file):  # absent if the world size changed
            import numpy as np

            rng = torch.load(rng_file, weights_only=False)
            torch.set_rng_state(rng["torch"])
            np.random.set_state(rng["numpy"])
            random.setstate(rng["python"])
    actor.version = state["policy_version"]
    if critic is not None:
        critic.version = state["critic_version"]
    return int(state["step"]), state.get("recent_metrics", [])
