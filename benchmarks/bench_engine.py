"""vLLM generation throughput per dtype on this machine (in-process engine).

    .venv/bin/python benchmarks/bench_engine.py [tiny|smollm2 ...]

64 prompts x 64 new tokens (ignore_eos), temperature 1, after a warm-up call."""
from __future__ import annotations

import os
import subprocess
import sys
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")


def one(model: str, dtype: str) -> float:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from rltf_ray.models import resolve_model

    llm = LLM(model=resolve_model(model), dtype=dtype, enforce_eager=True, max_model_len=512, seed=0)
    prompts = [TokensPrompt(prompt_token_ids=[1] + list(range(10, 40 + i))) for i in range(64)]
    llm.generate(prompts[:2], SamplingParams(max_tokens=4), use_tqdm=False)
    t = time.perf_counter()
    outs = llm.generate(prompts, SamplingParams(max_tokens=64, ignore_eos=True, temperature=1.0),
                        use_tqdm=False)
    return sum(len(c.token_ids) for o in outs for c in o.outputs) / (time.perf_counter() - t)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        print(f"RESULT {one(sys.argv[2], sys.argv[3]):.0f}")
        return 0
    models = sys.argv[1:] or ["tiny", "smollm2"]
    flags = open("/proc/cpuinfo").read()
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    print(f"CPU flags: {', '.join(isa)}; cores: {os.cpu_count()}")
    print("| model | dtype | output tok/s |")
    print("| --- | --- | --- |")
    for m in models:
        for dtype in ("bfloat16", "float32"):
            # one engine per process: vLLM does not release a CPU engine cleanly in-process
            out = subprocess.run([sys.executable, __file__, "--one", m, dtype], capture_output=True, text=True)
            tps = [ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("RESULT")]
            print(f"| {m} | {dtype} | {tps[0] if tps else 'failed'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
