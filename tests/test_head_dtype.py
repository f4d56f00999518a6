"""The fp32 LM head on both sides, through a weight sync (`model.head_dtype: float32`): a bf16
vLLM engine with vLLM's fp32 head and a bf16 learner with `fp32_head` agree on the sampled
tokens; after the learner's changed weights are pushed, the engine's head is the pushed one.
The model ties its head to its input embedding, as SmolLM2 does, and the change is to that
shared weight: a head the engine had cached in fp32 at load would now disagree."""
import copy

import pytest
import ray
import torch

from rltf_ray.chat import encode, first_turn_messages
from rltf_ray.config import Config, EngineConfig, ModelConfig
from rltf_ray.learner import build_model
from rltf_ray.losses import token_logprobs

pytestmark = pytest.mark.integration

QUESTIONS = ("What is 12 + 7?", "Name a color.", "What is 3 * 4?")


def gaps(engine, model, prompts) -> torch.Tensor:
    """|learner log-prob - engine log-prob| of every token the engine samples at T = 1."""
    res = ray.get(engine.generate.remote(prompts, n=4, temperature=1.0, top_p=1.0, max_tokens=16))
    out = []
    for prompt, group in zip(prompts, res["outputs"]):
        for s in group:
            ids = torch.tensor([prompt + s.token_ids])
            with torch.no_grad():
                lp = token_logprobs(model(input_ids=ids).logits, ids, 1.0)[0, len(prompt) - 1:]
            out.append((lp - torch.tensor(s.logprobs)).abs())
    return torch.cat(out)


def test_after_a_weight_sync_the_engines_fp32_head_is_the_synced_tied_weight(tiny_tied_path, tiny_tokenizer):
    from rltf_ray.stages.engine import start_engines
    from rltf_ray.weight_sync.object_store import ObjectStoreSync

    cfg = Config(model=ModelConfig(path=tiny_tied_path, dtype="bfloat16", head_dtype="float32"))
    model = build_model(tiny_tied_path, cfg).eval()  # bf16 weights, fp32 head: the learner
    assert model.lm_head.weight is model.model.embed_tokens.weight
    prompts = [encode(tiny_tokenizer, first_turn_messages({"prompt": q})) for q in QUESTIONS]
    ray.init(num_cpus=4, include_dashboard=False)
    try:
        engine = start_engines(tiny_tied_path, EngineConfig(max_model_len=512), "bfloat16", 0,
                               head_dtype="float32")[0]
        before = gaps(engine, model, prompts)
        old = copy.deepcopy(model)
        with torch.no_grad():  # the shared embedding/head weight moves far
            torch.manual_seed(0)
            model.model.embed_tokens.weight.add_(0.05 * torch.randn_like(model.model.embed_tokens.weight))
        sync = ObjectStoreSync(torch.bfloat16)
        sync.connect([engine])
        sync.push(list(model.state_dict().items()), 1)
        synced, stale = gaps(engine, model, prompts), gaps(engine, old, prompts)
    finally:
        ray.shutdown()
    # bf16 on both sides with fp32 logits: kernel noise only, before and after the sync
    assert before.mean() < 0.01 and synced.mean() < 0.01, (before.mean(), synced.mean())
    # the engine serves the pushed head, not the one it loaded: the old weights are far off
    assert stale.mean() > 20 * max(float(synced.mean()), 1e-4), (stale.mean(), synced.mean())
