"""The trainer and the sampler agree on log-probs: with the same weights, the trainer's
per-token log pi_T (logits / T, as `objectives.micro_loss` computes it) of a vLLM sample
equals the log-prob vLLM returned for it, at T = 0.7 and at T = 1. This is what makes the
sampler's log-probs a valid behaviour policy for the RL ratio."""
import pytest
import ray
import torch

from rltf_ray.chat import encode, first_turn_messages
from rltf_ray.config import EngineConfig
from rltf_ray.losses import token_logprobs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def engine(tiny_path):
    from rltf_ray.stages.engine import start_engines

    ray.init(num_cpus=4, include_dashboard=False)
    yield start_engines(tiny_path, EngineConfig(max_model_len=512), "float32", 0)[0]
    ray.shutdown()


def diffs(model, prompt, sample, temperature) -> torch.Tensor:
    ids = torch.tensor([prompt + sample.token_ids])
    with torch.no_grad():
        lp = token_logprobs(model(input_ids=ids).logits, ids, temperature)[0, len(prompt) - 1:]
    return (lp - torch.tensor(sample.logprobs)).abs()


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_trainer_logprobs_match_vllm_at_the_sampling_temperature(engine, tiny_path, tiny_tokenizer,
                                                                 temperature):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).eval()
    prompts = [encode(tiny_tokenizer, first_turn_messages({"prompt": q})) for q in ("What is 12 + 7?", "Name a color.")]
    res = ray.get(engine.generate.remote(prompts, n=4, temperature=temperature, top_p=1.0, max_tokens=24))
    same, other = [], []
    for prompt, group in zip(prompts, res["outputs"]):
        for s in group:
            assert len(s.logprobs) == len(s.token_ids) > 0
            same.append(diffs(model, prompt, s, temperature))
            other.append(diffs(model, prompt, s, 1.0 if temperature != 1.0 else 0.7))
    same, other = torch.cat(same), torch.cat(other)
    # fp32 on both sides: agreement to numerical noise
    assert same.mean() < 1e-3 and same.max() < 1e-2, (same.mean(), same.max())
    # scoring at the wrong temperature is visibly off: the check can fail
    assert other.mean() > 20 * max(float(same.mean()), 1e-4), (other.mean(), same.mean())
