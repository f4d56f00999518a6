"""How a model does on the arithmetic task before any training (chooses demo settings).

    .venv/bin/python benchmarks/bench_task_accuracy.py [model=smollm2]

First-turn accuracy on 64 held-out prompts with last-number extraction, for two
difficulties and three temperatures (greedy; 0.7 and 1.0 with 4 samples each)."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from rltf_ray.chat import encode, first_turn_messages, load_tokenizer
    from rltf_ray.config import TaskConfig
    from rltf_ray.models import resolve_dtype, resolve_model
    from rltf_ray.tasks import get_task

    path = resolve_model(sys.argv[1] if len(sys.argv) > 1 else "smollm2")
    llm = LLM(model=path, dtype=resolve_dtype("auto", False), enforce_eager=True, max_model_len=1024, seed=0)
    tok = load_tokenizer(path)
    print("| digits | temperature | samples | accuracy | tag format | truncated | tok/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for max_digits in (1, 2):
        task = get_task(TaskConfig(params={"min_digits": 1, "max_digits": max_digits, "ops": ["+"]},
                                   extraction="last_number"))
        rows = list(task.rows("test", 0, 64))
        prompts = [TokensPrompt(prompt_token_ids=encode(tok, first_turn_messages(r["prompt"]))) for r in rows]
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
