"""The learner: one Ray Train `TorchTrainer.fit()` for the whole run, whose workers each
hold a DeepSpeed engine (and, with a learned critic, a second one) and consume whole RL
steps handed over by the `StepBroker` (rltf_ray/broker.py).

Per step: build token examples (examples.py), split them across workers and
micro-batches, accumulate gradients, take one optimizer step, then rank 0 pushes the new
weights to every engine before the next step's rollouts. Every `run.checkpoint_every` steps
the DeepSpeed state goes into a Ray Train checkpoint, from which a restarted or resumed
run continues.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import os
import tempfile
import time

import ray

from rltf_ray.config import Config
from rltf_ray.loading import config_from_dict
from rltf_ray.critic_examples import build_critic_examples
from rltf_ray.examples import RL_TERMS, TERMS, Example, build_examples, step_normalisers, trained_examples
from rltf_ray.forward import sequence_logprobs
from rltf_ray.mismatch import mismatch_sums
from rltf_ray.objectives import MAX_KEYS, SUM_KEYS, micro_loss
from rltf_ray.learner import Learner, build_model, full_state_dict, load_train_state, lr_at, save_train_state
from rltf_ray.memory import peak_rss_gb
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
                       device, old: bool = False) -> None:
    """No-grad pre-pass before the step's first optimizer step, over every example this rank
    trains in the step: pi_old(y_k|x_k) for SD importance weights and, with `old` (several
    optimizer steps), pi_old of the RL tokens, the centre of the trust region (forwards of
    the DeepSpeed engine, so under ZeRO-3 collectives: padded to the same count on every
    rank); and the frozen reference's log-probs for KL (a plain module, no collective)."""
    mb = cfg.trainer.micro_batch_size
    if cfg.loss.sd_weight != "none":
        sd = [e for e in mine if e.term == "sd"]
        seqs = [(e.x1_ids + e.ids[e.start:], len(e.x1_ids)) for e in sd]
        n = global_max(math.ceil(len(sd) / mb), device)
        lps = sequence_logprobs(engine, seqs, [e.x1_temperature for e in sd], pad_id, mb, n)
        for e, lp in zip(sd, lps):
            e.logp_x1 = lp
    rl = [e for e in mine if e.term in RL_TERMS]
    if old:
        n = global_max(math.ceil(len(rl) / mb), device)
        lps = sequence_logprobs(engine, [(e.ids, e.start) for e in rl], [e.temperature for e in rl], pad_id, mb, n)
        for e, lp in zip(rl, lps):
            e.old_logp = lp
    if ref_model is not None:
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
    m["loss_grpo"] = m["loss_rl0"]  # the name the GRPO baseline reports the turn-0 RL term under
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
              # the k3 estimate of KL(sampler || trainer) per sampled token; its warning: runner.py
              "sampler_kl_k3": per_mm(v["mismatch_kl_sum"]),
              # the policy's move within the step, k3 of pi_old vs pi_theta per RL token (0 with
              # one optimizer step), and the share of RL tokens whose surrogate rho left the clip
              "policy_drift_kl_k3": per_rl(v["drift_kl_sum"]),
              "ratio_outside_clip_fraction": per_rl(v["clipped_tokens"]),
              # RL tokens whose correction weight was truncated (tis_*) or dropped (mis_*)
              "correction_truncated_fraction": per_rl(v["corrected_tokens"])
              if L.rollout_correction.startswith("tis_") else None,
              "correction_masked_fraction": per_rl(v["corrected_tokens"])
              if L.rollout_correction.startswith("mis_") else None,
              "sd_tokens_trained": n_sd, "train_tokens": v["train_tokens"],
              "sd_masked_fraction": v["sd_tokens_masked"] / (n_sd + v["sd_tokens_masked"])
              if n_sd + v["sd_tokens_masked"] else 0.0})
    if L.sd_weight != "none":  # null when every SD sequence had zero advantage (none forwarded)
        mean = v["is_w_sum"] / n_sd if n_sd else None
        m.update({"is_weight_mean": mean, "is_weight_max": v["is_w_max"] if n_sd else None,
                  "is_weight_var": max(v["is_w_sq_sum"] / n_sd - mean ** 2, 0.0) if n_sd else None})
    return m


def mini_batches(examples: list[Example], size: int | None, step: int) -> list[list[Example]]:
    """The step's examples in optimizer steps of `size` sequences (all workers together),
    shuffled by the step's seed so that each holds a mix of terms; None: one, in order."""
    if not size or size >= len(examples):
        return [examples]
    import random

    order = list(examples)
    random.Random(step).shuffle(order)  # the same on every rank
    return [order[i:i + size] for i in range(0, len(order), size)]


def optimize(engine, ref_model, examples: list[Example], cfg: Config, pad_id: int, step: int,
             rank: int, world: int) -> dict:
    """The RL step's optimizer steps (`trainer.mini_batch_size`; one by default) at the
    step's learning rate (`lr_at`), every one against the policy the step started from
    (pi_old: `fill_side_logprobs`). The step's metrics: each loss term averaged over the
    optimizer steps, token counts summed, the sampler-vs-trainer gap over all of them."""
    lr = lr_at(step, cfg.trainer, cfg.run.steps)
    for group in engine.optimizer.param_groups:  # DeepSpeed's wrappers share the base optimizer's groups
        group["lr"] = lr
    parts = mini_batches(examples, cfg.trainer.mini_batch_size, step)
    sums: dict[str, float] = {}
    dev = next(engine.module.parameters()).device
    if global_max(int(any(e.term in RL_TERMS for e in trained_examples(examples, cfg))), dev) == 0:
        # no RL token trains this step: score a sample before any update, for the mismatch
        sums.update(monitor_sample(examples, engine, cfg, pad_id, rank, world, dev))
    shards = [shard_examples(trained_examples(part, cfg), rank, world) for part in parts]
    t0 = time.perf_counter()
    fill_side_logprobs([e for mine in shards for e in mine], engine, ref_model, cfg, pad_id, dev,
                       old=len(parts) > 1)
    seconds = {"seconds_side_logprobs": time.perf_counter() - t0, "seconds_forward_backward": 0.0,
               "seconds_optimizer": 0.0}
    for part, mine in zip(parts, shards):
        got, took = optimizer_step(engine, part, mine, cfg, pad_id, step, world)
        for k, v in got.items():
            sums[k] = max(sums.get(k, 0.0), v) if k in MAX_KEYS else sums.get(k, 0.0) + v
        seconds = {k: seconds[k] + took.get(k, 0.0) for k in seconds}
    if len(parts) > 1:
        sums = {k: v / len(parts) if k.startswith("loss_") else v for k, v in sums.items()}
    metrics = reduce_metrics(sums, cfg, cfg.loss.lambda_sd_at(step))
    # this rank's split of seconds_train (where a learner's time goes: docs/benchmarks.md)
    return {**metrics, **seconds, "lr": lr, "optimizer_steps": len(parts)}


def optimizer_step(engine, examples: list[Example], mine: list[Example], cfg: Config, pad_id: int,
                   step: int, world: int) -> tuple[dict, dict]:
    """One optimizer step of `engine` on `examples` (a collective on every rank), of which
    this rank trains `mine` (side log-probs already filled): accumulate micro-batch
    gradients, check the loss, step. A non-finite loss raises NonFiniteLoss on every rank
    before the optimizer step, so the weights and the version never advance on a broken
    step. (This rank's loss shares and token sums, its seconds.)"""
    norms = step_normalisers(examples, cfg)
    # gloo (CPU) and NCCL (GPU) both reduce tensors on the worker's own device
    dev = next(engine.module.parameters()).device
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
    t2 = time.perf_counter()
    metrics = reduce_metrics(sums, cfg, lambda_sd)
    if not math.isfinite(metrics["loss"]):
        raise NonFiniteLoss(f"step {step}: the loss is {metrics['loss']} "
                            f"({ {k: v for k, v in metrics.items() if k.startswith('loss_')} }); "
                            "the optimizer step was not taken")
    t3 = time.perf_counter()
    engine.step()
    return sums, {"seconds_forward_backward": t2 - t1, "seconds_optimizer": time.perf_counter() - t3}


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
    keep = ("loss", "logprob_abs_diff_mean", "logprob_abs_diff_max", "sampler_trainer_kl", "sampler_kl_k3",
            "policy_drift_kl_k3", "rl_tokens_trained")
    return {**{f"critic_{k}" if k != "loss" else "loss_critic": m[k] for k in keep}, **stats}


def train_loop(config: dict) -> None:
    """Runs on every Ray Train worker for the whole run: the actor's learner and, with a
    learned critic (Bi-NAC), the critic's, each stepping on the schedule `binac` sets."""
    import deepspeed
    import torch

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
    broker_name = config["broker_name"]
    actor = Learner(model_path, cfg, config["engines"], config["engine_dtype"], rank, (broker_name, "actor"))
    tokenizer, pad_id = actor.tokenizer, actor.pad_id
    critic = None
    if config.get("critic_engines") and cfg.binac.critic_steps > 0:
        # its own tokenizer and pad id: the critic's vocabulary may differ from the actor's
        critic = Learner(config["critic_model_path"], critic_config(cfg), config["critic_engines"],
                         config["engine_dtype"], rank, (broker_name, "critic"))
    binac = cfg.binac if config.get("critic_engines") else None
    broker = ray.get_actor(broker_name)
    ckpt_dir = os.path.join(config["output_dir"], "checkpoints")
    ref_model = None
    if cfg.loss.kl_coef > 0:  # only then is the frozen reference loaded at all
        # at the learner's precision, so that KL(pi || ref) is 0 at the start of the run
        ref_model = build_model(model_path, dataclasses.replace(cfg, trainer=dataclasses.replace(
            cfg.trainer, lora={}, gradient_checkpointing=False))).eval()
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

    def checkpoint(steps_done: int, metrics: dict, states: dict) -> None:
        """HF folders for vLLM and evaluation, then the resume state through Ray Train,
        committed before the steps it covers are released."""
        path = os.path.join(ckpt_dir, f"step_{steps_done}")
        state = states.get("actor") or full_state_dict(actor.engine, actor.zero_stage)
        cstate = None
        if critic is not None:
            cstate = states.get("critic") or full_state_dict(critic.engine, critic.zero_stage)
        if rank == 0:  # HF folders that vLLM and pipelines/eval.py load
            actor.save(path, state, tokenizer)
            if cstate is not None:
                critic.save(os.path.join(path, "critic"), cstate, critic.tokenizer)
        states.clear()
        with tempfile.TemporaryDirectory() as tmp:
            save_train_state(tmp, steps_done, actor, critic, rank, list(recent))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))
        if rank == 0:
            # The controller registers a report when it next polls the workers; a worker
            # that died before that would restart from an older checkpoint. Wait until this
            # one is committed before releasing its steps and declaring the step done.
            ray.train.get_all_reported_checkpoints(
                consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED, timeout_s=600)
            ray.get(broker.release.remote(steps_done))

    for step in range(start, cfg.run.steps):
        got = ray.get(broker.get_step.remote(step))
        if got == "checkpoint":  # the driver's save() between steps
            checkpoint(step, {"step": step - 1, "saved": True}, {})
            if rank == 0:
                ray.get(broker.put_saved.remote(step))
            got = ray.get(broker.get_step.remote(step, True))
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
            metrics.update(critic_learn_step(critic.engine, rows, cfg, critic.pad_id, step, rank, world))
            t1 = time.perf_counter()
            states["critic"] = critic.push()
            metrics["seconds_sync"] += time.perf_counter() - t1
        metrics["seconds_train"] = time.perf_counter() - t0 - metrics["seconds_sync"]
        metrics["train_tokens_per_s"] = metrics.get("train_tokens", 0) / max(metrics["seconds_train"], 1e-9)
        metrics.update({"policy_version": actor.version, "actor_trained": "loss" in metrics,
                        "learner_peak_rss_gb": peak_rss_gb()})  # rank 0's worker
        if binac is not None:
            metrics.update({"critic_version": critic.version if critic else 0,
                            "critic_trained": "loss_critic" in metrics})
        recent.append(dict(metrics))
        last = step == cfg.run.steps - 1
        every = cfg.run.checkpoint_every
        if last or (every and (step + 1) % every == 0):
            t1 = time.perf_counter()
            checkpoint(step + 1, metrics, states)
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
