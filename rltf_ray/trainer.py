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
from dataclasses import dataclass

import ray

from rltf_ray.config import Config, config_from_dict

BROKER_NAME = "rltf_step_broker"


@ray.remote(num_cpus=0)
class StepBroker:
    """Hand-off between the driver (producer of rollouts) and the trainer workers."""

    def __init__(self):
        self.steps: dict[int, list] = {}
        self.results: dict[int, dict] = {}
        self.events: dict[tuple[str, int], asyncio.Event] = {}
        self.error: str | None = None

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


@dataclass
class Example:
    ids: list[int]
    start: int  # index of the first trained token in `ids`
    term: str  # "grpo" | "sd" | "fm"
    adv: float


def build_examples(rows: list[dict], cfg: Config, tokenizer) -> tuple[list[Example], dict]:
    """Turn a step's rollout rows into token examples for each loss term."""
    import torch

    from rltf_ray import losses
    from rltf_ray.chat import encode, fm_messages

    groups = {pid: i for i, pid in enumerate(dict.fromkeys(r["prompt_id"] for r in rows))}
    gid = torch.tensor([groups[r["prompt_id"]] for r in rows])
    r0 = torch.tensor([float(r["reward_first"]) for r in rows])
    r1 = torch.tensor([float(r["reward_second"]) for r in rows])
    a0 = losses.group_advantages(r0, gid, std_norm=cfg.loss.adv_std_norm)
    a_sd = losses.sd_advantages(r1, r0, gid)
    out: list[Example] = []
    for i, r in enumerate(rows):
        x0 = list(r["prompt_ids"])
        out.append(Example(x0 + list(r["response_ids"]), len(x0), "grpo", float(a0[i])))
        if cfg.loss.lambda_sd > 0 and r["revision_ids"] is not None and len(r["revision_ids"]):
            out.append(Example(x0 + list(r["revision_ids"]), len(x0), "sd", float(a_sd[i])))
        if cfg.loss.lambda_fm > 0 and not r.get("critique_failed") and r["critique"]:
            fm = encode(tokenizer, fm_messages(r["prompt"], r["response"]))
            c = tokenizer(r["critique"], add_special_tokens=False)["input_ids"]
            out.append(Example(fm + list(c) + [tokenizer.eos_token_id], len(fm), "fm", 1.0))
    stats = {"adv_abs_mean_grpo": float(a0.abs().mean()), "adv_abs_mean_sd": float(a_sd.abs().mean()),
             "zero_adv_group_fraction": _zero_adv_fraction(a0, gid)}
    return out, stats


def _zero_adv_fraction(adv, gid) -> float:
    import torch

    n = int(gid.max()) + 1 if gid.numel() else 0
    if n == 0:
        return 0.0
    nonzero = torch.zeros(n).index_add_(0, gid, (adv != 0).float())
    return float((nonzero == 0).float().mean())


def _pad(batch: list[Example], pad_id: int):
    import torch

    width = max(len(e.ids) for e in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width - 1))
    for i, e in enumerate(batch):
        ids[i, :len(e.ids)] = torch.tensor(e.ids)
        attn[i, :len(e.ids)] = 1
        mask[i, e.start - 1:len(e.ids) - 1] = 1.0  # position t predicts token t+1
    adv = torch.tensor([e.adv for e in batch])
    return ids, attn, mask, adv


def micro_loss(model, batch: list[Example], counts: dict[str, float], cfg: Config, pad_id: int):
    """Loss of one micro-batch as its share of the step's token means; also the sums for
    metrics. Zero-advantage GRPO/SD sequences were dropped earlier but kept in `counts`."""
    import torch

    from rltf_ray import losses

    ids, attn, mask, adv = _pad(batch, pad_id)
    logits = model(input_ids=ids, attention_mask=attn).logits
    logp = losses.token_logprobs(logits, ids)
    term = torch.tensor([{"grpo": 0, "sd": 1, "fm": 2}[e.term] for e in batch]).unsqueeze(-1)
    m_grpo, m_sd, m_fm = ((term == k).float() * mask for k in range(3))
    grpo_tok = losses.grpo_token_loss(logp, logp.detach(), adv, cfg.loss.clip_eps)
    sd_tok, keep = losses.sd_token_loss(logp, adv, cfg.loss.sd_mask_tau)
    fm_tok = losses.fm_token_loss(logp)
    l_grpo = losses.token_sum(grpo_tok, m_grpo, counts["grpo"])
    l_sd = losses.token_sum(sd_tok, m_sd * keep, counts["sd"])
    l_fm = losses.token_sum(fm_tok, m_fm, counts["fm"])
    total = losses.rltf_loss(l_grpo, l_sd, l_fm, cfg.loss.lambda_sd, cfg.loss.lambda_fm)
    sd_masked = float(((1 - keep) * m_sd).sum())
    return total, {"loss_grpo": l_grpo.item(), "loss_sd": l_sd.item(), "loss_fm": l_fm.item(),
                   "sd_tokens_masked": sd_masked}


def shard_examples(examples: list[Example], rank: int, world: int) -> list[Example]:
    """Longest-first round robin, so every rank gets a similar number of tokens."""
    ordered = sorted(examples, key=lambda e: -len(e.ids))
    return ordered[rank::world]


def deepspeed_config(cfg: Config) -> dict:
    t = cfg.trainer
    return {
        "train_micro_batch_size_per_gpu": t.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": t.grad_clip,
        "zero_optimization": {"stage": t.zero_stage},
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
    import torch.distributed as dist
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
    sync = make_weight_sync(cfg.trainer.weight_sync, torch.bfloat16)
    if rank == 0:
        sync.connect(engines)
    broker = ray.get_actor(config["broker_name"])
    ckpt_dir = os.path.join(config["output_dir"], "checkpoints")
    for step in range(cfg.run.steps):
        got = ray.get(broker.get_step.remote(step))
        rows = ray.get(got[0])
        t0 = time.perf_counter()
        examples, stats = build_examples(rows, cfg, tokenizer)
        counts = {k: float(sum(len(e.ids) - e.start for e in examples if e.term == k))
                  for k in ("grpo", "sd", "fm")}
        trained = [e for e in examples if e.term == "fm" or e.adv != 0.0]
        mine = shard_examples(trained, rank, world)
        n_micro = torch.tensor([math.ceil(len(mine) / cfg.trainer.micro_batch_size)])
        dist.all_reduce(n_micro, op=dist.ReduceOp.MAX)  # every rank must run the same collectives
        n_micro = max(int(n_micro), 1)
        sums = {"loss_grpo": 0.0, "loss_sd": 0.0, "loss_fm": 0.0, "sd_tokens_masked": 0.0}
        mb = cfg.trainer.micro_batch_size
        for i in range(n_micro):
            batch = mine[i * mb:(i + 1) * mb]
            engine.set_gradient_accumulation_boundary(i == n_micro - 1)
            if batch:
                loss, parts = micro_loss(engine, batch, counts, cfg, pad_id)
                for k, v in parts.items():
                    sums[k] += v
            else:  # keeps this rank in step with the others' gradient reductions
                dummy = torch.tensor([[pad_id, pad_id]])
                loss = engine(input_ids=dummy).logits.sum() * 0.0
            # DeepSpeed averages gradients over ranks; scale back to a sum of shares.
            engine.backward(loss * world, scale_wrt_gas=False)
        engine.step()
        reduced = torch.tensor([sums[k] for k in ("loss_grpo", "loss_sd", "loss_fm", "sd_tokens_masked")])
        dist.all_reduce(reduced)
        l_grpo, l_sd, l_fm, masked = reduced.tolist()
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
        metrics = {"step": step, "policy_version": version,
                   "loss": l_grpo + cfg.loss.lambda_sd * l_sd + cfg.loss.lambda_fm * l_fm,
                   "loss_grpo": l_grpo, "loss_sd": l_sd, "loss_fm": l_fm,
                   "sd_masked_fraction": masked / counts["sd"] if counts["sd"] else 0.0,
                   "tokens_grpo": counts["grpo"], "tokens_sd": counts["sd"], "tokens_fm": counts["fm"],
                   "seconds_train": seconds_train, "seconds_sync": seconds_sync, **stats}
        ray.train.report(metrics)
        if rank == 0:
            ray.get(broker.put_result.remote(step, metrics))
    if rank == 0:
        sync.close()
