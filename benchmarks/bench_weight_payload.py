"""What the object-store weight sync pays to serialise the weights, torch tensors against the
numpy payload it sends (`weight_sync.object_store.pack`).

    .venv/bin/python benchmarks/bench_weight_payload.py [--model smollm2] [--repeats 3]

Loads the model's real state dict, then times pickle protocol 5 (what Ray uses) both ways:
the bytes that go in band (copied through the pickle stream) and out of band (written once
into the object store), dumps and loads. Ray's own copy into shared memory is the same for
both and is left out."""
from __future__ import annotations

import argparse
import pickle
import sys
import time

import torch


def timed(obj, repeats: int) -> tuple[float, float, int, int]:
    """(dump s, load s, in-band bytes, out-of-band bytes), best of `repeats`."""
    best_d = best_l = float("inf")
    for _ in range(repeats):
        bufs: list = []
        t0 = time.perf_counter()
        stream = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
        t1 = time.perf_counter()
        pickle.loads(stream, buffers=bufs)
        best_d, best_l = min(best_d, t1 - t0), min(best_l, time.perf_counter() - t1)
    return best_d, best_l, len(stream), sum(b.raw().nbytes for b in bufs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    from transformers import AutoModelForCausalLM

    from rltf_ray.models import resolve_model
    from rltf_ray.weight_sync.object_store import pack

    model = AutoModelForCausalLM.from_pretrained(resolve_model(a.model), dtype=torch.float32)
    named = [(k, v.detach().clone()) for k, v in model.state_dict().items()]
    print(f"{a.model}: {len(named)} tensors, {sum(v.numel() for _, v in named) * 4 / 1e9:.2f} GB fp32")
    print("| payload | dump s | load s | in band MB | out of band MB |")
    print("| --- | --- | --- | --- | --- |")
    for label, obj in (("torch tensors (the old payload)", named),
                       ("numpy arrays (`pack`)", pack(named, torch.float32))):
        d, l, inb, oob = timed(obj, a.repeats)
        print(f"| {label} | {d:.3f} | {l:.3f} | {inb / 1e6:.1f} | {oob / 1e6:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
