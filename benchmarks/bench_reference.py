"""What the bilevel term's reference actor costs an engine: the same revisions sampled by the
current weights and by the reference (swapped in and back out in place), on one vLLM engine.

    .venv/bin/python benchmarks/bench_reference.py [--model smollm2] [--prompts 64] [--repeats 3]

Prints seconds per call for each; the difference is the two in-place weight reloads.
"""
from __future__ import annotations

import argparse
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    import ray
    import torch
    from safetensors.torch import load_file

    from rltf_ray.config import EngineConfig
    from rltf_ray.models import resolve_model
    from rltf_ray.stages.engine import start_engines
    from rltf_ray.weight_sync.object_store import ObjectStoreSync

    path = resolve_model(a.model)
    ray.init(num_cpus=4, include_dashboard=False)
    try:
        engine = start_engines(path, EngineConfig(max_model_len=512, kv_cache_gib=1), "bfloat16", 0,
                               reference_every=2)[0]
        sync = ObjectStoreSync(torch.bfloat16)
        sync.connect([engine])
        state = load_file(f"{path}/model.safetensors")
        sync.push(state.items(), 1)  # version 1: current and reference (the disk) now differ in source
        prompts = [[1, 2, 3, 4, 5, 6, 7, 8 + i] for i in range(a.prompts)]
        times = {False: [], True: []}
        for _ in range(a.repeats):
            for ref in (False, True):
                t = time.perf_counter()
                ray.get(engine.generate.remote(prompts, n=1, temperature=0.7, top_p=1.0, max_tokens=32,
                                               reference=ref))
                times[ref].append(time.perf_counter() - t)
    finally:
        ray.shutdown()
    cur, ref = (min(times[k]) for k in (False, True))
    print(f"{a.model}, {a.prompts} prompts x 32 tokens: current {cur:.2f} s, reference {ref:.2f} s "
          f"(best of {a.repeats}); the swap in and out: {ref - cur:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
