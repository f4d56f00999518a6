"""How a model does on the arithmetic task before any training (chooses demo settings).

    .venv/bin/python benchmarks/bench_task_accuracy.py [model=smollm2] [--prompts 64]

First-turn accuracy on `--prompts` (64) held-out prompts with last-number extraction, for two
difficulties and three temperatures (greedy; 0.7 and 1.0 with 4 samples each). The engine is
built as the demo config's would be: its precision (model.dtype, model.head_dtype), context,
KV cache and seed. `tiny --prompts 4` is the smallest case (a smoke test, in seconds)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="smollm2")
    ap.add_argument("--prompts", type=int, default=64, help="held-out prompts per difficulty")
    a = ap.parse_args()

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from rltf_ray.chat import encode, first_turn_messages, load_tokenizer
    from rltf_ray.config import TaskConfig
    from rltf_ray.loading import load_config
    from rltf_ray.models import resolve_model
    from rltf_ray.precision import engine_kwargs, resolve_dtype
    from rltf_ray.stages.engine import cpu_kv_cache_bytes
    from rltf_ray.tasks import get_task

    cfg = load_config(ROOT / "pipelines/configs/demo.yaml", [f"model.path={a.model}"])
    path = resolve_model(cfg.model.path)
    llm = LLM(model=path, enforce_eager=cfg.engine.enforce_eager, max_model_len=cfg.engine.max_model_len,
              seed=cfg.run.seed, kv_cache_memory_bytes=cpu_kv_cache_bytes(cfg.engine.kv_cache_gib),
              **engine_kwargs(resolve_dtype(cfg.model.dtype, False), cfg.model.head_dtype))
    tok = load_tokenizer(path)
    print("| digits | temperature | samples | accuracy | tag format | truncated | tok/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for max_digits in (1, 2):
        task = get_task(TaskConfig(params={"min_digits": 1, "max_digits": max_digits, "ops": ["+"]},
                                   extraction="last_number"))
        rows = list(task.rows("test", 0, a.prompts))
        prompts = [TokensPrompt(prompt_token_ids=encode(tok, first_turn_messages(r))) for r in rows]
        for temp, n in ((0.0, 1), (0.7, 4), (1.0, 4)):
            t = time.perf_counter()
            outs = llm.generate(prompts, SamplingParams(n=n, temperature=temp, max_tokens=64), use_tqdm=False)
            dt = time.perf_counter() - t
            comp = [(c, r) for o, r in zip(outs, rows) for c in o.outputs]
            sc = [task.score(c.text, json.loads(r["meta"])) for c, r in comp]
            ntok = sum(len(c.token_ids) for c, _ in comp)
            trunc = sum(c.finish_reason == "length" for c, _ in comp) / len(comp)
            print(f"| 1-{max_digits} | {temp} | {n} | {sum(s.correct for s in sc) / len(sc):.3f} | "
                  f"{sum(s.format_ok for s in sc) / len(sc):.3f} | {trunc:.2f} | {ntok / dt:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
