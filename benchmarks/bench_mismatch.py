"""What the engine's precision buys in speed, and what each rollout correction does with the
sampler-trainer mismatch it leaves (docs/benchmarks.md, "Sampler-trainer mismatch").

    .venv/bin/python benchmarks/bench_mismatch.py --config pipelines/configs/expansion.yaml \\
        [--prompts 64] [--dtypes bfloat16,float32] [key=value ...]

For each engine dtype, in a process of its own (vLLM does not release a CPU engine cleanly): an
in-process vLLM engine samples the first turns of `--prompts` training prompts (the config's
`n`, temperature and max_tokens; processed log-probs, as the pipeline's engines), timed; then
an fp32 HF model (the learner's precision, `trainer.bf16: false`) scores the same tokens at
the same temperature. Printed per dtype: output tokens/s, sampler_kl_k3, mean and max
|log-prob difference|, and for the bare ratio and every loss.rollout_correction mode the
share of tokens truncated or masked and the largest weight that reaches the gradient."""
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

MODES = ("none", "tis_token", "tis_sequence", "mis_token", "mis_sequence")


def sample_and_score(config: str, overrides: list[str], dtype: str, prompts: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from rltf_ray import losses
    from rltf_ray.chat import encode, first_turn_messages, load_tokenizer
    from rltf_ray.graph import node_params
    from rltf_ray.loading import load_config
    from rltf_ray.models import resolve_model
    from rltf_ray.sources import PromptSource
    from rltf_ray.stages.engine import cpu_kv_cache_bytes
    from rltf_ray.tasks import get_task

    cfg = load_config(config, overrides)
    gen = node_params(cfg.node("generate"))
    model = resolve_model(cfg.model.path)
    tok = load_tokenizer(model)
    src = node_params(cfg.node("source"))
    steps = max(1, -(-prompts // src.prompts_per_step))
    source = PromptSource(get_task(cfg.task), src, steps=steps, seed=cfg.run.seed)
    rows = [r for s in range(steps) for r in source.rows_for_step(s)][:prompts]
    ids = [encode(tok, first_turn_messages(r["prompt"])) for r in rows]
    llm = LLM(model=model, dtype=dtype, enforce_eager=True, max_model_len=cfg.engine.max_model_len, seed=0,
              logprobs_mode="processed_logprobs", kv_cache_memory_bytes=cpu_kv_cache_bytes(1.0))
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
    learner = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    width = max(len(x) + len(y) for x, y, _ in seqs)
    logp, behav, mask = (torch.zeros(len(seqs), width) for _ in range(3))
    with torch.no_grad():
        for i, (x, y, lps) in enumerate(seqs):
            full = torch.tensor([x + y])
            lp = losses.token_logprobs(learner(input_ids=full).logits, full, gen.temperature)[0, len(x) - 1:]
            logp[i, :len(y)], behav[i, :len(y)], mask[i, :len(y)] = lp, torch.tensor(lps), 1.0
    d = (logp - behav)[mask > 0]
    out = {"dtype": dtype, "samples": len(seqs), "tokens": int(mask.sum()),
           "tokens_per_s": float(mask.sum()) / seconds,
           "sampler_kl_k3": float((torch.exp(d) - 1 - d).mean()),
           "abs_diff_mean": float(d.abs().mean()), "abs_diff_max": float(d.abs().max()), "modes": {}}
    for mode in MODES:
        if mode == "none":
            w, hit = torch.exp(logp - behav) * mask, torch.zeros_like(mask)
        else:
            w, hit = losses.rollout_weights(logp, behav, mask, mode, cfg.loss.rollout_cap,
                                            (cfg.loss.rollout_mask_low, cfg.loss.rollout_mask_high))
        out["modes"][mode] = {"corrected_fraction": float(hit.sum() / mask.sum()),
                              "weight_max": float(w[mask > 0].max()),
                              "weight_mean": float(w[mask > 0].mean())}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args(argv)
    if a.one:
        print("RESULT " + json.dumps(sample_and_score(a.config, a.overrides, a.one, a.prompts)), flush=True)
        return 0
    flags = open("/proc/cpuinfo").read()
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    print(f"CPU flags: {', '.join(isa)}; cores: {os.cpu_count()}; config {a.config} {' '.join(a.overrides)}")
    results = []
    for dtype in a.dtypes.split(","):
        p = subprocess.run([sys.executable, __file__, "--config", a.config, "--prompts", str(a.prompts),
                            "--one", dtype, *a.overrides], capture_output=True, text=True)
        got = [ln[7:] for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if not got:
            print(f"{dtype}: failed (exit {p.returncode})\n{p.stderr[-3000:]}")
            return 1
        results.append(json.loads(got[0]))
    print("| engine dtype | samples | tokens | output tok/s | sampler_kl_k3 | mean abs diff | max abs diff |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        print(f"| {r['dtype']} | {r['samples']} | {r['tokens']} | {r['tokens_per_s']:.0f} | "
              f"{r['sampler_kl_k3']:.2e} | {r['abs_diff_mean']:.4f} | {r['abs_diff_max']:.3f} |")
    print("\n| engine dtype | correction | tokens truncated or masked | weight mean | weight max |")
    print("| --- | --- | --- | --- | --- |")
    for r in results:
        for mode, m in r["modes"].items():
            print(f"| {r['dtype']} | {mode} | {m['corrected_fraction']:.4f} | {m['weight_mean']:.3f} | "
                  f"{m['weight_max']:.3g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
