"""The learner: one Ray Train `TorchTrainer.fit()` for the whole run, whose workers each
hold a DeepSpeed engine (and, with a learned critic, a second one) and consume whole RL
steps handed over by the `StepBroker` (rltf_ray/broker.py).

Per step: build token examples (objectives.py), split them across workers and
micro-batches, accumulate gradients, take one optimizer step, then rank 0 pushes the new
weights to every engine before the next step's rollouts. Every `run.checkpoint_every` steps
the DeepSpeed state goes into a Ray Train checkpoint, from which a restarted or resumed
run continues.
"""
from __future__ import annotations

import collections
import json
import math
import os
import tempfile
import time

import ray

from rltf_ray import metrics as M
from rltf_ray.config import Config, config_from_dict
from rltf_ray.objectives import (MAX_KEYS, RL_TERMS, SUM_KEYS, TERMS, Example, build_critic_examples,
                                 build_examples, micro_loss, mismatch_sums, sequence_logprobs,
                                 step_normalisers)
from rltf_ray.realtime import make_realtime


def shard_examples(examples: list[Example], rank: int, world: int) -> list[Example]:
    """Longest-first round robin, so every rank gets a similar number of tokens."""
    ordered = sorted(examples, key=lambda e: -len(e.ids))
    return ordered[rank::world]


def global_max(n: int, device) -> int:
    """The largest `n` over all ranks: every rank then runs that many collectives."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([n], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def fill_side_logprobs(mine: list[Example], engine, ref_model, cfg: Config, pad_id: int,
                       device) -> None:
    """No-grad pre-pass: pi(y_k|x_k) for SD importance weights (a forward of the DeepSpeed
    engine, so under ZeRO-3 a collective: padded to the same count on every rank), and the
    frozen reference's log-probs for KL (a plain module, no collective)."""
    mb = cfg.trainer.micro_batch_size
    if cfg.loss.sd_weight != "none":
        sd = [e for e in mine if e.term == "sd"]
        seqs = [(e.x1_ids + e.ids[e.start:], len(e.x1_ids)) for e in sd]
        n = global_max(math.ceil(len(sd) / mb), device)
        lps = sequence_logprobs(engine, seqs, [e.x1_temperature for e in sd], pad_id, mb, n)
        for e, lp in zip(sd, lps):
            e.logp_x1 = lp
    if ref_model is not None:
        rl = [e for e in mine if e.term in RL_TERMS]
        lps = sequence_logprobs(ref_model, [(e.ids, e.start) for e in rl],
                                [e.temperature for e in rl], pad_id, mb)
        for e, lp in zip(rl, lps):
            e.ref_logp = lp


def monitor_sample(examples: list[Example], engine, cfg: Config, pad_id: int, rank: int, world: int,
                   device) -> dict[str, float]:
    """When no RL sequence is trained this step (every advantage 0), score a few of them in a
    no-grad pass so that the trainer-vs-sampler mismatch is still reported every step. A
    forward of the DeepSpeed engine: padded to the same count on every rank."""
    mb = cfg.trainer.micro_batch_size
    mine = shard_examples([e for e in examples if e.term in RL_TERMS], rank, world)[:mb]
    n = global_max(1 if mine else 0, device)
    lps = sequence_logprobs(engine, [(e.ids, e.start) for e in mine], [e.temperature for e in mine],
                            pad_id, mb, n)
    return mismatch_sums(mine, lps)


class NonFiniteLoss(RuntimeError):
    pass


def reduce_metrics(sums: dict[str, float], cfg: Config, lambda_sd: float) -> dict:
    """Sum the workers' loss shares (each already divided by the step-global normaliser)
    and turn the token sums into the step's metrics."""
    import torch
    import torch.distributed as dist

    dev = "cuda" if dist.get_backend() == "nccl" else "cpu"
    vec = torch.tensor([sums.get(k, 0.0) for k in SUM_KEYS], dtype=torch.float64, device=dev)
    dist.all_reduce(vec)
    top = torch.tensor([sums.get(k, 0.0) for k in MAX_KEYS], dtype=torch.float64, device=dev)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    v = {**dict(zip(SUM_KEYS, vec.cpu().tolist())), **dict(zip(MAX_KEYS, top.cpu().tolist()))}
    L = cfg.loss
    m = {k: v[k] for k in SUM_KEYS if k.startswith("loss_")}
    m["loss_grpo"] = m["loss_rl0"]  # the issue-2 name for the turn-0 RL term
    m["loss"] = (m["loss_rl0"] + m["loss_rl1"] + lambda_sd * m["loss_sd"] + L.lambda_fm * m["loss_fm"]
                 + L.lambda_sft * m["loss_sft"])
    n_rl, n_sd, n_mm = v["rl_tokens"], v["sd_tokens"], v["mismatch_tokens"]
    per_rl = (lambda x: x / n_rl) if n_rl else (lambda x: None)  # null: no RL token trained
    per_mm = (lambda x: x / n_mm) if n_mm else (lambda x: None)
    m.update({"lambda_sd": lambda_sd, "kl_mean": per_rl(v["kl_sum"]), "rl_tokens_trained": n_rl,
              # trainer vs sampler on the sampled tokens (verl/OpenRLHF's mismatch monitor);
              # from the trained RL tokens, or a no-grad sample when none was trained
              "logprob_abs_diff_mean": per_mm(v["logprob_abs_diff_sum"]),
              "logprob_abs_diff_max": v["logprob_abs_diff_max"] if n_mm else None,
              "sampler_trainer_kl": per_mm(v["mismatch_kl_sum"]), "mismatch_tokens": n_mm,
              "ratio_outside_clip_fraction": per_rl(v["clipped_tokens"]),
              "tis_truncated_fraction": per_rl(v["tis_truncated_tokens"]),
              "sd_tokens_trained": n_sd, "train_tokens": v["train_tokens"],
              "sd_masked_fraction": v["sd_tokens_masked"] / (n_sd + v["sd_tokens_masked"])
              if n_sd + v["sd_tokens_masked"] else 0.0})
    if L.sd_weight != "none":  # null when every SD sequence had zero advantage (none forwarded)
        mean = v["is_w_sum"] / n_sd if n_sd else None
        m.update({"is_weight_mean": mean, "is_weight_max": v["is_w_max"] if n_sd else None,
                  "is_weight_var": max(v["is_w_sq_sum"] / n_sd - mean ** 2, 0.0) if n_sd else None})
    return m


def optimize(engine, ref_model, examples: list[Example], cfg: Config, pad_id: int, step: int,
             rank: int, world: int) -> dict:
    """One optimizer step of `engine` on `examples` (a collective on every rank): shard them,
    fill the no-grad side log-probs, accumulate micro-batch gradients, check the loss, step.
    A non-finite loss raises NonFiniteLoss on every rank before the optimizer step, so the
    weights and the version never advance on a broken step."""
    norms = step_normalisers(examples, cfg)
    # zero-advantage RL/SD sequences add nothing but still count in the normalisers
    trained = [e for e in examples if e.term in ("fm", "sft") or e.adv != 0.0]
    mine = shard_examples(trained, rank, world)
    # gloo (CPU) and NCCL (GPU) both reduce tensors on the worker's own device
    dev = next(engine.module.parameters()).device
    t0 = time.perf_counter()
    fill_side_logprobs(mine, engine, ref_model, cfg, pad_id, dev)
    t1 = time.perf_counter()
    mb = cfg.trainer.micro_batch_size
    n_micro = max(global_max(math.ceil(len(mine) / mb), dev), 1)
    lambda_sd = cfg.loss.lambda_sd_at(step)
    sums: dict[str, float] = {}
    for i in range(n_micro):
        batch = mine[i * mb:(i + 1) * mb]
        engine.set_gradient_accumulation_boundary(i == n_micro - 1)
        if batch:
            loss, parts = micro_loss(engine, batch, norms, cfg, pad_id, lambda_sd)
            for k, v in parts.items():
                sums[k] = max(sums.get(k, 0.0), v) if k in MAX_KEYS else sums.get(k, 0.0) + v
        else:  # keeps this rank in step with the others' gradient reductions
            import torch

            dummy = torch.tensor([[pad_id, pad_id]], device=dev)
            loss = engine(input_ids=dummy).logits.sum() * 0.0
        # DeepSpeed averages gradients over ranks; scale back to a sum of shares.
        engine.backward(loss * world, scale_wrt_gas=False)
    if global_max(int(any(e.term in RL_TERMS for e in mine)), dev) == 0:
        sums.update(monitor_sample(examples, engine, cfg, pad_id, rank, world, dev))
    t2 = time.perf_counter()
    metrics = reduce_metrics(sums, cfg, lambda_sd)
    if not math.isfinite(metrics["loss"]):
        raise NonFiniteLoss(f"step {step}: the loss is {metrics['loss']} "
                            f"({ {k: v for k, v in metrics.items() if k.startswith('loss_')} }); "
                            "the optimizer step was not taken")
    t3 = time.perf_counter()
    engine.step()
    # this rank's split of seconds_train (where a learner's time goes: docs/benchmarks.md)
    metrics.update({"seconds_side_logprobs": t1 - t0, "seconds_forward_backward": t2 - t1,
                    "seconds_optimizer": time.perf_counter() - t3})
    return metrics


def learn_step(engine, ref_model, rows: list[dict], cfg: Config, tokenizer, pad_id: int, step: int,
               rank: int, world: int) -> dict:
    """The actor's optimizer step on one RL step's rollout rows."""
    t0 = time.perf_counter()
    examples, stats = build_examples(rows, cfg, tokenizer)
    stats["seconds_examples"] = time.perf_counter() - t0
    metrics = optimize(engine, ref_model, examples, cfg, pad_id, step, rank, world)
    return {**metrics, **stats, **{f"examples_{t}": sum(e.term == t for e in examples) for t in TERMS}}


def critic_config(cfg: Config) -> Config:
    """The critic's loss: GRPO with the actor's surrogate, clipping and TIS options, and its
    own learner settings (no SD/FM/SFT terms, no KL: no frozen critic reference is loaded)."""
    import dataclasses

    loss = dataclasses.replace(cfg.loss, turn1_rl=False, lambda_sd=0.0, lambda_fm=0.0, lambda_sft=0.0,
                               kl_coef=0.0, sd_weight="none")
    b = cfg.binac
    trainer = dataclasses.replace(cfg.trainer, lr=b.lr,
                                  zero_stage=cfg.trainer.zero_stage if b.zero_stage is None else b.zero_stage)
    return dataclasses.replace(cfg, loss=loss, trainer=trainer)


def critic_learn_step(engine, rows: list[dict], cfg: Config, pad_id: int, step: int, rank: int,
                      world: int) -> dict:
    """The learned critic's optimizer step: GRPO over the K critiques of each attempt."""
    examples, stats = build_critic_examples(rows, cfg)
    m = optimize(engine, None, examples, critic_config(cfg), pad_id, step, rank, world)
    keep = ("loss", "logprob_abs_diff_mean", "sampler_trainer_kl", "rl_tokens_trained")
    return {**{f"critic_{k}" if k != "loss" else "loss_critic": m[k] for k in keep}, **stats}


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
        "bf16": {"enabled": t.bf16},
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
    """The trainable model: the HF model, or it wrapped with LoRA adapters (only they train)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
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

        from rltf_ray.weight_sync import make_weight_sync

        model = build_model(model_path, cfg)
        # fused: one kernel over each tensor (CPU and CUDA); on this 2-core CPU the default
        # per-op AdamW took 0.40 s a step for 67 M weights, the fused one 0.09 s (benchmarks.md)
        optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.trainer.lr,
                                  weight_decay=cfg.trainer.weight_decay, fused=True)
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=optim, config=deepspeed_config(cfg),
                                               dist_init_required=False)
        self.zero_stage, self.rank, self.version = cfg.trainer.zero_stage, rank, 0
        self.sync = make_weight_sync(cfg.trainer.weight_sync, getattr(torch, engine_dtype), keep)
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


def train_loop(config: dict) -> None:
    """Runs on every Ray Train worker for the whole run: the actor's learner and, with a
    learned critic (Bi-NAC), the critic's, each stepping on the schedule `binac` sets."""
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM

    from rltf_ray.chat import load_tokenizer

    cfg = config_from_dict(config["cfg"])
    model_path = config["model_path"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    if cfg.trainer.realtime:  # before torch starts its OpenMP pool, which inherits the policy
        make_realtime("trainer")
    torch.manual_seed(cfg.run.seed + rank)
    torch.set_num_threads(cfg.trainer.cpu_threads_per_worker)
    # The shm comm op would JIT-compile for ~60 s on first use; gloo is enough on CPU.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    tokenizer = load_tokenizer(model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    broker_name = config["broker_name"]
    actor = Learner(model_path, cfg, config["engines"], config["engine_dtype"], rank, (broker_name, "actor"))
    critic = None
    if config.get("critic_engines") and cfg.binac.critic_steps > 0:
        critic = Learner(config["critic_model_path"], critic_config(cfg), config["critic_engines"],
                         config["engine_dtype"], rank, (broker_name, "critic"))
        critic_tok = load_tokenizer(config["critic_model_path"])
    binac = cfg.binac if config.get("critic_engines") else None
    broker = ray.get_actor(broker_name)
    ckpt_dir = os.path.join(config["output_dir"], "checkpoints")
    ref_model = None
    if cfg.loss.kl_coef > 0:  # only then is the frozen reference loaded at all
        ref_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        ref_model.to(next(actor.engine.module.parameters()).device)
    start, recent = 0, []
    ckpt = ray.train.get_checkpoint()  # after a worker crash, or a resumed run
    if ckpt is not None:
        start, recent = load_train_state(ckpt, actor, critic, rank)
        actor.push(bump=False)  # the engines serve the restored weights before any rollout
        if critic is not None:
            critic.push(bump=False)
    if rank == 0:
        ray.get(broker.set_start.remote(start, recent))
    # The driver writes a step's metrics row after the step's checkpoint; with k steps in
    # flight (run.max_staleness) the last k + 1 rows a checkpoint covers may not be written
    # yet, so the checkpoint carries them.
    recent = collections.deque(recent, maxlen=cfg.run.max_staleness + 1)
    for step in range(start, cfg.run.steps):
        got = ray.get(broker.get_step.remote(step))
        if got is None:  # the driver stopped the run before this step (an error, or stop())
            break
        rows = ray.get(got[0])
        metrics: dict = {"step": step, "seconds_train": 0.0, "seconds_sync": 0.0, "seconds_checkpoint": 0.0}
        states = {}
        t0 = time.perf_counter()
        if binac is None or binac.actor_trains(step):
            metrics.update(learn_step(actor.engine, ref_model, rows, cfg, tokenizer, pad_id, step, rank, world))
            t1 = time.perf_counter()
            states["actor"] = actor.push()
            metrics["seconds_sync"] += time.perf_counter() - t1
        if critic is not None and binac.critic_trains(step):
            metrics.update(critic_learn_step(critic.engine, rows, cfg, pad_id, step, rank, world))
            t1 = time.perf_counter()
            states["critic"] = critic.push()
            metrics["seconds_sync"] += time.perf_counter() - t1
        metrics["seconds_train"] = time.perf_counter() - t0 - metrics["seconds_sync"]
        metrics["train_tokens_per_s"] = metrics.get("train_tokens", 0) / max(metrics["seconds_train"], 1e-9)
        metrics.update({"policy_version": actor.version, "actor_trained": "loss" in metrics,
                        "learner_peak_rss_gb": M.peak_rss_gb()})  # rank 0's worker
        if binac is not None:
            metrics.update({"critic_version": critic.version if critic else 0,
                            "critic_trained": "loss_critic" in metrics})
        recent.append(dict(metrics))
        last = step == cfg.run.steps - 1
        every = cfg.run.checkpoint_every
        if last or (every and (step + 1) % every == 0):
            t1 = time.perf_counter()
            path = os.path.join(ckpt_dir, f"step_{step + 1}")
            state = states.get("actor") or full_state_dict(actor.engine, actor.zero_stage)
            cstate = None
            if critic is not None:
                cstate = states.get("critic") or full_state_dict(critic.engine, critic.zero_stage)
            if rank == 0:  # HF folders that vLLM and pipelines/eval.py load
                actor.save(path, state, tokenizer)
                if cstate is not None:
                    critic.save(os.path.join(path, "critic"), cstate, critic_tok)
            states.clear()
            with tempfile.TemporaryDirectory() as tmp:
                save_train_state(tmp, step + 1, actor, critic, rank, list(recent))
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))
            if rank == 0:
                # The controller registers a report when it next polls the workers; a worker
                # that died before that would restart from an older checkpoint. Wait until this
                # one is committed before releasing its steps and declaring the step done.
                ray.train.get_all_reported_checkpoints(
                    consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED, timeout_s=600)
                ray.get(broker.release.remote(step + 1))
            metrics["seconds_checkpoint"] = time.perf_counter() - t1  # in the step: it is not overlapped
        else:
            # Metrics reach the driver through the broker; Ray Train hears only of checkpoints.
            # (Its result queue holds one report, which its controller drains at each 2 s
            # health check, so a report every step held any step shorter than that to 2 s.)
            states.clear()
        if rank == 0:
            ray.get(broker.put_result.remote(step, metrics))
    if rank == 0:
        actor.sync.close()
        if critic is not None:
            critic.sync.close()
