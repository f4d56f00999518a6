"""rltf_ray against its floors, on the same prompts, in one run (`make bench-compare`).

    .venv/bin/python benchmarks/bench_compare.py [--model smollm2] [--steps 4] [--prompts 8] [--n 4] [--tokens 128]

1. raw vLLM: one in-process `LLM.generate` of a step's prompts (no Ray) -> generated tokens/s;
2. a hand-written loop: that vLLM in process, the task's verifier, GRPO advantages, a plain
   torch AdamW step on the non-zero-advantage sequences, then an in-place `reload_weights`
   -> seconds per step, split, and trained tokens/s (the learner floor);
3. rltf_ray `grpo_single` on the same prompts and sizes (demo config) -> the same figures
   from metrics.jsonl; and the weight sync of the tiny model, for the slope against size;
4. TRL's GRPOTrainer (pinned in the `bench` extra; `make bench-compare` installs it) on the
   same prompts, CPU, fp32, HF generate -> seconds per step.
The first step of each loop is a warm-up and is not counted. Prints a table of figures and
ratios; record it in docs/benchmarks.md with the machine it ran on.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def step_rows(steps: int, prompts: int) -> list[list[dict]]:
    """Each step's prompt rows (prompt text, meta), exactly as rltf_ray's source stage yields them."""
    from rltf_ray.config import load_config
    from rltf_ray.graph import node_params
    from rltf_ray.sources import PromptSource
    from rltf_ray.tasks import get_task

    cfg = load_config(ROOT / "pipelines/configs/demo.yaml", [f"pipeline.prompts.prompts_per_step={prompts}"])
    src = PromptSource(get_task(cfg.task), node_params(cfg.node("source")), steps, cfg.run.seed)
    return [src.rows_for_step(s) for s in range(steps)]


def step_prompts(model: str, steps: int, prompts: int) -> list[list[list[int]]]:
    """The token-id prompts of each step, exactly as rltf_ray's generate stage builds them."""
    from rltf_ray.chat import encode, first_turn_messages, load_tokenizer
    from rltf_ray.models import resolve_model

    tok = load_tokenizer(resolve_model(model))
    return [[(encode(tok, first_turn_messages(r["prompt"])), r["meta"]) for r in rows]
            for rows in step_rows(steps, prompts)]


def arithmetic():
    from rltf_ray.config import TaskConfig
    from rltf_ray.tasks import get_task

    return get_task(TaskConfig(name="arithmetic", extraction="last_number", format_weight=0.0,
                               params={"min_digits": 1, "max_digits": 2, "ops": ["+"]}))


def trl_loop(model: str, steps: int, prompts: int, n: int, tokens: int, out: str) -> None:
    """TRL's GRPOTrainer on CPU (fp32, HF generate), one optimizer step per step's prompts x n
    samples, the same prompts in the same order (runs in its own process)."""
    import json as _json

    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rltf_ray.chat import first_turn_messages
    from rltf_ray.models import resolve_model

    task = arithmetic()
    rows = [r for step in step_rows(steps, prompts) for r in step]
    data = Dataset.from_list([{"prompt": first_turn_messages(r["prompt"]), "meta": r["meta"]} for r in rows])

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
    trainer = GRPOTrainer(model=resolve_model(model), reward_funcs=reward, args=args, train_dataset=data,
                          callbacks=[Clock()])
    t0 = time.perf_counter()
    trainer.train()
    starts = [t0] + ends[:-1]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    Path(out).write_text(json.dumps({"steps": [{"step": i, "seconds_step": e - b}
                                               for i, (b, e) in enumerate(zip(starts, ends))],
                                     "peak_rss_gb": peak}))


def floor_loop(model: str, steps: int, prompts: int, n: int, tokens: int, out: str) -> None:
    """The hand-written loop (runs in its own process: vLLM in process, then torch)."""
    import json as _json

    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="2",
                      VLLM_CPU_OMP_THREADS_BIND=f"0-{(os.cpu_count() or 1) - 1}")
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from rltf_ray import losses
    from rltf_ray.models import resolve_dtype, resolve_model

    path = resolve_model(model)
    task = arithmetic()
    llm = LLM(model=path, dtype=resolve_dtype("auto", False), enforce_eager=True, max_model_len=1024, seed=0)
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    opt = torch.optim.AdamW(policy.parameters(), lr=5e-6)
    sp = SamplingParams(n=n, temperature=1.0, max_tokens=tokens)
    rows = []
    for step, batch in enumerate(step_prompts(model, steps, prompts)):
        t0 = time.perf_counter()
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _ in batch], sp, use_tqdm=False)
        t_gen = time.perf_counter() - t0
        gen_tokens = sum(len(c.token_ids) for o in outs for c in o.outputs)
        seqs, advs = [], []
        for (p, meta), o in zip(batch, outs):
            r = torch.tensor([task.score(c.text, _json.loads(meta)).reward for c in o.outputs])
            for c, a in zip(o.outputs, (r - r.mean()).tolist()):
                if a != 0.0:  # as rltf_ray: zero-advantage sequences are not forwarded
                    seqs.append((list(p) + list(c.token_ids), len(p)))
                    advs.append(a)
        t1 = time.perf_counter()
        trained = 0
        total = sum(len(s) - st for s, st in seqs)
        opt.zero_grad()
        for k in range(0, len(seqs), 8):
            chunk, adv = seqs[k:k + 8], torch.tensor(advs[k:k + 8])
            width = max(len(s) for s, _ in chunk)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            mask = torch.zeros(len(chunk), width - 1)
            for i, (s, st) in enumerate(chunk):
                ids[i, :len(s)] = torch.tensor(s)
                mask[i, st - 1:len(s) - 1] = 1
            logp = losses.token_logprobs(policy(input_ids=ids).logits, ids)
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
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    Path(out).write_text(json.dumps({"steps": rows, "peak_rss_gb": peak}))


def mean(rows: list[dict], key: str) -> float:
    return sum(r[key] for r in rows) / max(len(rows), 1)


def run_pipeline(model: str, steps: int, prompts: int, n: int, tokens: int, out: Path) -> list[dict]:
    cmd = [sys.executable, str(ROOT / "pipelines/run.py"), "--config", "pipelines/configs/demo.yaml",
           "--preset", "grpo_single", f"model.path={model}", f"run.steps={steps}", f"run.output_dir={out}",
           "run.eval_before_after=false", f"pipeline.prompts.prompts_per_step={prompts}",
           f"pipeline.first_turn.n={n}", f"pipeline.first_turn.max_tokens={tokens}",
           "pipeline.first_turn.temperature=1.0", "run.tensorboard=false"]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def contender(which: str, a, out: Path) -> dict:
    """The hand-written loop or TRL, in a process of its own (each holds a model and an engine)."""
    subprocess.run([sys.executable, __file__, "--model", a.model, "--steps", str(a.steps), "--prompts",
                    str(a.prompts), "--n", str(a.n), "--tokens", str(a.tokens), "--only", which, str(out)],
                   check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--no-trl", action="store_true", help="skip TRL's GRPOTrainer (the slowest part)")
    ap.add_argument("--only", nargs=2, metavar=("WHICH", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.only:
        {"floor": floor_loop, "trl": trl_loop}[a.only[0]](a.model, a.steps, a.prompts, a.n, a.tokens, a.only[1])
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="rltf_bench_compare_"))
    floor = contender("floor", a, tmp / "floor.json")
    fl = floor["steps"][1:]
    ours = run_pipeline(a.model, a.steps, a.prompts, a.n, a.tokens, tmp / "pipe")[1:]
    tiny = run_pipeline("tiny", a.steps, a.prompts, a.n, a.tokens, tmp / "pipe_tiny")[1:]
    trl = None
    if not a.no_trl:  # last, so that its failure (its traceback is above) loses no other figure
        try:
            trl = contender("trl", a, tmp / "trl.json")
        except subprocess.CalledProcessError as e:
            print(f"TRL's GRPOTrainer failed (exit {e.returncode}); the TRL row is left out of the table")
    raw_tps = sum(r["generate_tokens"] for r in fl) / sum(r["seconds_generate"] for r in fl)
    our_tps = sum(r["generate_tokens"] for r in ours) / sum(r["seconds_rollout"] for r in ours)
    floor_train = sum(r["train_tokens"] for r in fl) / max(sum(r["seconds_train"] for r in fl), 1e-9)
    our_train = sum(r["train_tokens"] for r in ours) / max(sum(r["seconds_train"] for r in ours), 1e-9)
    rows = [
        ("rollout stage / raw vLLM, generated tok/s", our_tps, raw_tps, our_tps / raw_tps, ">= 0.9"),
        ("learner / plain torch, trained tok/s", our_train, floor_train, our_train / floor_train, ">= 0.9"),
        ("weight sync share of a step", mean(ours, "seconds_sync") / mean(ours, "seconds_step"),
         mean(fl, "seconds_sync") / mean(fl, "seconds_step"), None, "<= 3%"),
        ("grpo_single step / hand-written loop, s", mean(ours, "seconds_step"), mean(fl, "seconds_step"),
         mean(ours, "seconds_step") / mean(fl, "seconds_step"), "<= 1.1"),
    ]
    if trl:
        t = mean(trl["steps"][1:], "seconds_step")
        rows.append(("TRL GRPOTrainer step / grpo_single step, s", mean(ours, "seconds_step"), t,
                     t / mean(ours, "seconds_step"), ">= 3"))
    print(f"\n{a.model}: {a.prompts} prompts x {a.n} samples x {a.tokens} new tokens, {a.steps - 1} steps "
          f"after a warm-up, {os.cpu_count()} cores")
    print("| measure | rltf_ray | floor | ratio | target |")
    print("| --- | --- | --- | --- | --- |")
    for name, ours_v, floor_v, ratio, target in rows:
        r = f"{ratio:.2f}" if ratio is not None else "-"
        print(f"| {name} | {ours_v:.3g} | {floor_v:.3g} | {r} | {target} |")
    print("\n| seconds per step | generate/rollout | train | sync | whole step |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| hand-written loop | {mean(fl, 'seconds_generate'):.1f} | {mean(fl, 'seconds_train'):.1f} | "
          f"{mean(fl, 'seconds_sync'):.2f} | {mean(fl, 'seconds_step'):.1f} |")
    print(f"| rltf_ray grpo_single | {mean(ours, 'seconds_rollout'):.1f} | {mean(ours, 'seconds_train'):.1f} | "
          f"{mean(ours, 'seconds_sync'):.2f} | {mean(ours, 'seconds_step'):.1f} |")
    if trl:
        print(f"| TRL GRPOTrainer (HF generate) | - | - | - | {mean(trl['steps'][1:], 'seconds_step'):.1f} |")
    print(f"\nweight sync, rltf_ray: tiny {mean(tiny, 'seconds_sync'):.2f} s, {a.model} "
          f"{mean(ours, 'seconds_sync'):.2f} s; hand-written reload_weights {mean(fl, 'seconds_sync'):.2f} s")
    print(f"peak RSS of the hand-written loop (vLLM + torch in one process): {floor['peak_rss_gb']:.1f} GB")
    if trl:
        print(f"peak RSS of TRL (HF model, generate and train in one process): {trl['peak_rss_gb']:.1f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
