"""The precision grid: how far the learner's log-probs are from the sampler's for each pairing
of engine and learner precision, what each engine costs in generation speed and each learner
in step time (docs/benchmarks.md, "Sampler-learner precision").

    .venv/bin/python benchmarks/bench_mismatch.py --config pipelines/configs/expansion.yaml \\
        [--prompts 32] [--engines bf16,bf16+head,fp32] [--learners fp32,bf16,bf16+head] [key=value ...]

For each engine precision, in a process of its own (vLLM does not release a CPU engine
cleanly): an in-process vLLM engine samples the first turns of `--prompts` training prompts
(the config's `n`, temperature and max_tokens; processed log-probs, as the pipeline's
engines), timed. Then each learner precision scores the same tokens at the same temperature
with the HF model as `rltf_ray.learner.build_model` loads it (bf16 weights, or fp32; "+head":
the LM head in fp32, `model.head_dtype: float32`), and takes one timed forward and backward
of the policy-gradient loss over them in micro-batches of `--micro-batch` (the optimizer step,
on fp32 master weights either way, is left out). Printed per pair: sampler_kl_k3, mean and
largest |log-prob difference|, the engine's output tokens/s and the learner's seconds."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")

# name -> (dtype, head dtype)
PRECISIONS = {"fp32": ("float32", None), "bf16": ("bfloat16", None), "bf16+head": ("bfloat16", "float32")}


def sample(cfg, engine: str, prompts: int):
    """The engine's samples as (prompt ids, token ids, sampler log-probs), and its tokens/s."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from rltf_ray.chat import encode, first_turn_messages, load_tokenizer
    from rltf_ray.graph import node_params
    from rltf_ray.models import resolve_model
    from rltf_ray.precision import engine_kwargs
    from rltf_ray.sources import PromptSource
    from rltf_ray.stages.engine import cpu_kv_cache_bytes
    from rltf_ray.tasks import get_task

    gen = node_params(cfg.node("generate"))
    model = resolve_model(cfg.model.path)
    tok = load_tokenizer(model)
    src = node_params(cfg.node("source"))
    steps = max(1, -(-prompts // src.prompts_per_step))
    source = PromptSource(get_task(cfg.task), src, steps=steps, seed=cfg.run.seed)
    rows = [r for s in range(steps) for r in source.rows_for_step(s)][:prompts]
    ids = [encode(tok, first_turn_messages(r)) for r in rows]
    llm = LLM(model=model, enforce_eager=True, max_model_len=cfg.engine.max_model_len, seed=0,
              logprobs_mode="processed_logprobs", kv_cache_memory_bytes=cpu_kv_cache_bytes(1.0),
              **engine_kwargs(*PRECISIONS[engine]))
    sp = SamplingParams(n=gen.n, temperature=gen.temperature, top_p=gen.top_p, max_tokens=gen.max_tokens,
                        logprobs=0)
    llm.generate([TokensPrompt(prompt_token_ids=ids[0])], SamplingParams(max_tokens=4), use_tqdm=False)
    t = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=x) for x in ids], sp, use_tqdm=False)
    seconds = time.perf_counter() - t
    # each generated token's logprobs dict holds the sampled token (logprobs=0)
    seqs = [(x, list(c.token_ids), [c.logprobs[j][t].logprob for j, t in enumerate(c.token_ids)])
            for x, o in zip(ids, outs) for c in o.outputs]
    del llm
    return model, gen.temperature, seqs, sum(len(y) for _, y, _ in seqs) / seconds


def score(model_path: str, learner: str, seqs, temperature: float, micro_batch: int) -> dict:
    """The learner's log-probs of the samples against the sampler's, and one timed forward
    and backward over them."""
    import torch

    from rltf_ray.config import Config, ModelConfig, TrainerConfig
    from rltf_ray.learner import build_model
    from rltf_ray.examples import Example
    from rltf_ray.forward import collate, trained_logprobs

    dtype, head = PRECISIONS[learner]
    cfg = Config(model=ModelConfig(path=model_path, dtype=dtype, head_dtype=head),
                 trainer=TrainerConfig(bf16=dtype == "bfloat16"))
    model = build_model(model_path, cfg)
    examples = [Example(x + y, len(x), "rl0", 1.0, temperature, lps) for x, y, lps in seqs]
    diffs, seconds = [], 0.0
    for k in range(0, len(examples), micro_batch):
        chunk = examples[k:k + micro_batch]
        b = collate(chunk, 0)
        t = time.perf_counter()
        logp = trained_logprobs(model, b, min(e.start for e in chunk), b.temperature)
        (-(logp * b.mask).sum()).backward()
        seconds += time.perf_counter() - t
        diffs.append((logp.detach() - b.behav_logp)[b.mask > 0])
    d = torch.cat(diffs).double()
    return {"learner": learner, "tokens": d.numel(), "sampler_kl_k3": float((torch.exp(d) - 1 - d).mean()),
            "abs_diff_mean": float(d.abs().mean()), "abs_diff_max": float(d.abs().max()),
            "learner_seconds": seconds}


def one_engine(config: str, overrides: list[str], engine: str, learners: list[str], prompts: int,
               micro_batch: int) -> list[dict]:
    from rltf_ray.loading import load_config

    cfg = load_config(config, overrides)
    model, temperature, seqs, tps = sample(cfg, engine, prompts)
    return [{"engine": engine, "samples": len(seqs), "tokens_per_s": tps,
             **score(model, learner, seqs, temperature, micro_batch)} for learner in learners]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--engines", default="bf16,bf16+head,fp32")
    ap.add_argument("--learners", default="fp32,bf16,bf16+head")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    learners = a.learners.split(",")
    for name in a.engines.split(",") + learners:
        if name not in PRECISIONS:
            ap.error(f"unknown precision {name!r}; choose from {', '.join(PRECISIONS)}")
    if a.one:
        got = one_engine(a.config, a.overrides, a.one, learners, a.prompts, a.micro_batch)
        print("RESULT " + json.dumps(got), flush=True)
        return 0
    flags = open("/proc/cpuinfo").read()
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    print(f"CPU flags: {', '.join(isa)}; cores: {os.cpu_count()}; config {a.config} {' '.join(a.overrides)}")
    results = []
    for engine in a.engines.split(","):
        p = subprocess.run([sys.executable, __file__, "--config", a.config, "--prompts", str(a.prompts),
                            "--micro-batch", str(a.micro_batch), "--learners", a.learners, "--one", engine,
                            *a.overrides], capture_output=True, text=True)
        got = [ln[7:] for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if not got:
            print(f"engine {engine}: failed (exit {p.returncode})\n{p.stderr[-3000:]}")
            return 1
        results += json.loads(got[0])
    print("| engine | learner | samples | tokens | sampler_kl_k3 | mean abs diff | max abs diff | "
          "engine tok/s | learner fwd+bwd s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['engine']} | {r['learner']} | {r['samples']} | {r['tokens']} | {r['sampler_kl_k3']:.2e} | "
              f"{r['abs_diff_mean']:.4f} | {r['abs_diff_max']:.3f} | {r['tokens_per_s']:.0f} | "
              f"{r['learner_seconds']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
