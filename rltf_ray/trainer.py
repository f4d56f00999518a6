"""The learner: one Ray Train `TorchTrainer.fit()` for the whole run, whose workers each
hold a DeepSpeed engine and consume whole RL steps handed over by the `StepBroker`.

Per step: build token examples (GRPO on (x0,y0), SD on (x0,y1), FM on (f_fm(x0,y0),c0)),
split them across workers and micro-batches, accumulate gradients, take one optimizer step,
then rank 0 pushes the new weights to every engine before the next step's rollouts.
"""
from __future__ import annotations

import asyncio
import math
import os
import time

import ray

from rltf_ray.config import Config, config_from_dict
from rltf_ray.objectives import (TERMS, Example, build_examples, micro_loss, sequence_logprobs,
                                 step_normalisers)

@ray.remote(num_cpus=0)
class StepBroker:
    """Hand-off between the driver (producer of rollouts) and the trainer workers."""

    def __init__(self):
        self.steps: dict[int, list] = {}
        self.results: dict[int, dict] = {}
        self.events: dict[tuple[str, int], asyncio.Event] = {}

    def _event(self, kind: str, step: int) -> asyncio.Event:
        return self.events.setdefault((kind, step), asyncio.Event())

    async def put_step(self, step: int, rows_ref: list) -> None:
        self.steps[step] = rows_ref
        for old in [s for s in self.steps if s < step]:  # every worker has fetched those
            del self.steps[old]
        self._event("step", step).set()

    async def get_step(self, step: int) -> list | None:
        await self._event("step", step).wait()
        return self.steps[step]

    async def put_result(self, step: int, metrics: dict) -> None:
        self.results[step] = metrics
        self._event("result", step).set()

    async def get_result(self, step: int, timeout_s: float) -> dict | None:
        try:
            await asyncio.wait_for(self._event("result", step).wait(), timeout_s)
        except asyncio.TimeoutError:
            return None
        return self.results.pop(step)


def shard_examples(examples: list[Example], rank: int, world: int) -> list[Example]:
    """Longest-first round robin, so every rank gets a similar number of tokens."""
    ordered = sorted(examples, key=lambda e: -len(e.ids))
    return ordered[rank::world]


def fill_side_logprobs(mine: list[Example], engine, ref_model, cfg: Config, pad_id: int) -> None:
    """No-grad pre-pass: pi(y1|x1) for SD importance weights, reference log-probs for KL."""
    mb = cfg.trainer.micro_batch_size
    if cfg.loss.sd_weight != "none":
        sd = [e for e in mine if e.term == "sd"]
        seqs = [(e.x1_ids + e.ids[e.start:], len(e.x1_ids)) for e in sd]
        for e, lp in zip(sd, sequence_logprobs(engine, seqs, pad_id, mb)):
            e.logp_x1 = lp
    if ref_model is not None:
        rl = [e for e in mine if e.term in ("rl0", "rl1")]
        for e, lp in zip(rl, sequence_logprobs(ref_model, [(e.ids, e.start) for e in rl], pad_id, mb)):
            e.ref_logp = lp


def reduce_metrics(sums: dict[str, float], cfg: Config, lambda_sd: float) -> dict:
    """Sum the workers' loss shares (each already divided by the step-global normaliser)."""
    import torch
    import torch.distributed as dist

    keys = [f"loss_{t}" for t in TERMS] + ["kl_sum", "rl_tokens", "sd_tokens_masked", "is_w_sum",
                                           "is_w_sq_sum", "sd_tokens"]
    dev = "cuda" if dist.get_backend() == "nccl" else "cpu"
    vec = torch.tensor([sums.get(k, 0.0) for k in keys], dtype=torch.float64, device=dev)
    dist.all_reduce(vec)
    w_max = torch.tensor([sums.get("is_w_max", 0.0)], device=dev)
    dist.all_reduce(w_max, op=dist.ReduceOp.MAX)
    v = dict(zip(keys, vec.cpu().tolist()))
    L = cfg.loss
    m = {k: v[k] for k in keys if k.startswith("loss_")}
    m["loss_grpo"] = m["loss_rl0"]  # the issue-2 name for the turn-0 RL term
    m["loss"] = (m["loss_rl0"] + m["loss_rl1"] + lambda_sd * m["loss_sd"] + L.lambda_fm * m["loss_fm"]
                 + L.lambda_sft * m["loss_sft"])
    n_sd = v["sd_tokens"]
    m["lambda_sd"] = lambda_sd
    m["sd_masked_fraction"] = v["sd_tokens_masked"] / n_sd if n_sd else 0.0
    m["kl_mean"] = v["kl_sum"] / v["rl_tokens"] if v["rl_tokens"] else 0.0
    m["sd_tokens_trained"] = n_sd
    if L.sd_weight != "none":  # null when every SD sequence had zero advantage (none forwarded)
        mean = v["is_w_sum"] / n_sd if n_sd else None
        m.update({"is_weight_mean": mean, "is_weight_max": float(w_max) if n_sd else None,
                  "is_weight_var": max(v["is_w_sq_sum"] / n_sd - mean ** 2, 0.0) if n_sd else None})
    return m


def learn_step(engine, ref_model, rows: list[dict], cfg: Config, tokenizer, pad_id: int, step: int,
               rank: int, world: int) -> dict:
    """One optimizer step on one RL step's rollout rows (a collective on every rank): build
    the examples, shard them, accumulate micro-batch gradients, step; returns the metrics."""
    import torch
    import torch.distributed as dist

    examples, stats = build_examples(rows, cfg, tokenizer)
    norms = step_normalisers(examples, cfg)
    # zero-advantage RL/SD sequences add nothing but still count in the normalisers
    trained = [e for e in examples if e.term in ("fm", "sft") or e.adv != 0.0]
    mine = shard_examples(trained, rank, world)
    fill_side_logprobs(mine, engine, ref_model, cfg, pad_id)
    mb = cfg.trainer.micro_batch_size
    # gloo (CPU) and NCCL (GPU) both reduce tensors on the worker's own device
    dev = next(engine.module.parameters()).device
    n_micro = torch.tensor([math.ceil(len(mine) / mb)], device=dev)
    dist.all_reduce(n_micro, op=dist.ReduceOp.MAX)  # every rank must run the same collectives
    n_micro = max(int(n_micro), 1)
    lambda_sd = cfg.loss.lambda_sd_at(step)
    sums: dict[str, float] = {}
    for i in range(n_micro):
        batch = mine[i * mb:(i + 1) * mb]
        engine.set_gradient_accumulation_boundary(i == n_micro - 1)
        if batch:
            loss, parts = micro_loss(engine, batch, norms, cfg, pad_id, lambda_sd)
            for k, v in parts.items():
                sums[k] = max(sums.get(k, 0.0), v) if k == "is_w_max" else sums.get(k, 0.0) + v
        else:  # keeps this rank in step with the others' gradient reductions
            dummy = torch.tensor([[pad_id, pad_id]], device=dev)
            loss = engine(input_ids=dummy).logits.sum() * 0.0
        # DeepSpeed averages gradients over ranks; scale back to a sum of shares.
        engine.backward(loss * world, scale_wrt_gas=False)
    engine.step()
    return {**reduce_metrics(sums, cfg, lambda_sd), **stats,
            **{f"examples_{t}": sum(e.term == t for e in examples) for t in TERMS}}


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
    """Full weights on every rank (ZeRO-3 shards gathered; a collective on all ranks)."""
    if zero_stage == 3:
        import deepspeed

        params = list(engine.module.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    return {k: v.detach() for k, v in engine.module.state_dict().items()}


def train_loop(config: dict) -> None:
    """Runs on every Ray Train worker for the whole run."""
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM

    from rltf_ray.chat import load_tokenizer
    from rltf_ray.weight_sync import make_weight_sync

    cfg = config_from_dict(config["cfg"])
    model_path, engines = config["model_path"], config["engines"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    torch.manual_seed(cfg.run.seed + rank)
    torch.set_num_threads(cfg.trainer.cpu_threads_per_worker)
    # The shm comm op would JIT-compile for ~60 s on first use; gloo is enough on CPU.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    tokenizer = load_tokenizer(model_path)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.trainer.lr,
                              weight_decay=cfg.trainer.weight_decay)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optim, config=deepspeed_config(cfg),
                                      dist_init_required=False)
    sync = make_weight_sync(cfg.trainer.weight_sync, getattr(torch, config["engine_dtype"]))
    if rank == 0:
        sync.connect(engines)
    broker = ray.get_actor(config["broker_name"])
    ckpt_dir = os.path.join(config["output_dir"], "checkpoints")
    ref_model = None
    if cfg.loss.kl_coef > 0:  # only then is the frozen reference loaded at all
        ref_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        ref_model.to(next(engine.module.parameters()).device)
    for step in range(cfg.run.steps):
        got = ray.get(broker.get_step.remote(step))
        rows = ray.get(got[0])
        t0 = time.perf_counter()
        metrics = learn_step(engine, ref_model, rows, cfg, tokenizer, pad_id, step, rank, world)
        seconds_train = time.perf_counter() - t0
        version = step + 1
        t1 = time.perf_counter()
        state = full_state_dict(engine, cfg.trainer.zero_stage)
        if rank == 0:
            sync.push(state.items(), version)
        seconds_sync = time.perf_counter() - t1
        last = step == cfg.run.steps - 1
        every = cfg.run.checkpoint_every
        if rank == 0 and (last or (every and version % every == 0)):
            path = os.path.join(ckpt_dir, f"step_{version}")
            engine.module.save_pretrained(path, state_dict=state)
            tokenizer.save_pretrained(path)
        del state
        metrics.update({"step": step, "policy_version": version, "seconds_train": seconds_train,
                        "seconds_sync": seconds_sync})
        ray.train.report(metrics)
        if rank == 0:
            ray.get(broker.put_result.remote(step, metrics))
    if rank == 0:
        sync.close()
