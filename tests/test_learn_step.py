"""The trainer's `learn_step` with a real DeepSpeed engine (ZeRO-2, one gloo rank, no Ray):
an unscored revision does not poison the step, and a non-finite loss stops the step before
the optimizer moves the weights."""
import math

import pytest
import torch

from rltf_ray.config import Config, LossConfig, TrainerConfig


@pytest.fixture(scope="module")
def engine(tiny_path, gloo_world):
    import deepspeed
    from transformers import AutoModelForCausalLM

    from rltf_ray.learner import deepspeed_config

    cfg = Config(trainer=TrainerConfig(zero_stage=2, bf16=False, lr=1e-3, micro_batch_size=4))
    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.trainer.lr)
    eng, *_ = deepspeed.initialize(model=model, optimizer=optim, config=deepspeed_config(cfg),
                                   dist_init_required=False)
    return eng


def rows(r1_second=0.0, behav=-2.0):
    """One group of three: a right first answer, and two wrong ones that were revised."""
    base = dict(prompt_id="p", prompt="What is 1 + 2?", prompt_ids=[1, 5, 9, 13], critique="too low",
                critique_failed=False, revision_prompt_ids=[1, 5, 9, 13, 20, 21, 22])
    return [dict(base, response="a", response_ids=[17, 18], response_logprobs=[behav, behav],
                 reward_first=1.0, revised=False, revision_ids=[], revision_logprobs=[],
                 reward_second=1.0, correct_second=True),
            dict(base, response="b", response_ids=[19], response_logprobs=[behav], reward_first=0.0,
                 revised=True, revision_ids=[23, 24], revision_logprobs=[behav, behav], reward_second=1.0,
                 correct_second=True),
            dict(base, response="c", response_ids=[25, 26], response_logprobs=[behav, behav],
                 reward_first=0.0, revised=True, revision_ids=[27], revision_logprobs=[behav],
                 reward_second=r1_second, correct_second=False)]


def weights(engine) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in engine.module.parameters()])


def test_an_unscored_revision_is_left_out_and_the_step_trains(engine, tiny_tokenizer):
    from rltf_ray.trainer import learn_step

    cfg = Config(loss=LossConfig(lambda_fm=0.1), trainer=TrainerConfig(micro_batch_size=4))
    before = weights(engine)
    m = learn_step(engine, None, rows(r1_second=float("nan")), cfg, tiny_tokenizer, 0, 0, 0, 1)
    assert m["unscored_rows"] == 1 and m["examples_rl0"] == 2 and m["examples_sd"] == 1
    assert all(math.isfinite(m[k]) for k in ("loss", "loss_rl0", "loss_rl1", "loss_sd", "loss_fm"))
    assert not torch.equal(before, weights(engine))  # the optimizer stepped
    # the trainer-vs-sampler monitor: the sampler "said" -2 for every token
    assert m["logprob_abs_diff_mean"] > 0 and m["logprob_abs_diff_max"] >= m["logprob_abs_diff_mean"]
    # rl0 of the two scored rows (2 + 1 tokens); the lone revision is its own turn-1 baseline (A = 0)
    assert m["sampler_trainer_kl"] >= 0 and m["rl_tokens_trained"] == 3


def test_a_non_finite_loss_stops_the_step_before_the_optimizer(engine, tiny_tokenizer):
    from rltf_ray.trainer import NonFiniteLoss, learn_step

    cfg = Config(trainer=TrainerConfig(micro_batch_size=4))
    before = weights(engine)
    with pytest.raises(NonFiniteLoss, match="step 3: the loss is nan"):
        learn_step(engine, None, rows(behav=float("nan")), cfg, tiny_tokenizer, 0, 3, 0, 1)
    assert torch.equal(before, weights(engine))  # no optimizer step on a broken loss
    engine.zero_grad()


def test_the_mismatch_is_reported_when_no_rl_sequence_is_trained(engine, tiny_tokenizer):
    from rltf_ray.trainer import learn_step

    same = rows()
    for r in same:  # every reward equal: all advantages 0, nothing trained
        r.update(reward_first=0.0, reward_second=0.0, revised=True, revision_ids=[30],
                 revision_logprobs=[-2.0])
    m = learn_step(engine, None, same, Config(trainer=TrainerConfig(micro_batch_size=4)), tiny_tokenizer,
                   0, 0, 0, 1)
    assert m["rl_tokens_trained"] == 0 and m["mismatch_tokens"] > 0
    assert m["logprob_abs_diff_mean"] > 0 and m["sampler_trainer_kl"] > 0


def test_lora_trains_only_the_adapters_and_syncs_merged_weights(tiny_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    from rltf_ray.examples import build_examples, step_normalisers
    from rltf_ray.objectives import micro_loss
    from rltf_ray.learner import build_model, merged_state_dict

    cfg = Config(trainer=TrainerConfig(bf16=False, lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}))
    model = build_model(tiny_path, cfg)
    base = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).state_dict()
    merged = merged_state_dict(model)
    assert set(merged) == set(base)  # the engines' names
    assert all(torch.equal(merged[k], base[k]) for k in base)  # B = 0 at init: nothing moved yet
    ex, _ = build_examples(rows(), cfg, tiny_tokenizer)
    loss, _ = micro_loss(model, ex, step_normalisers(ex, cfg), cfg, 0)
    loss.backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    assert with_grad and all("lora_" in n for n in with_grad)  # gradients reach the adapters only
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    opt.step()
    after = merged_state_dict(model)
    moved = {k for k in base if not torch.equal(after[k], base[k])}
    assert moved and all(k.endswith(("q_proj.weight", "v_proj.weight")) for k in moved)


def test_several_optimizer_steps_measure_the_sampler_over_all_of_them_against_pi_old(engine, tiny_tokenizer):
    """trainer.mini_batch_size=2: the step's 7 examples in 4 optimizer steps. The mismatch
    keys cover every RL token of every optimizer step and compare the sampler with pi_old,
    the policy before the step's first update (scored here by hand first); the policy's own
    move within the step is reported apart."""
    from rltf_ray.examples import RL_TERMS, build_examples, trained_examples
    from rltf_ray.forward import sequence_logprobs
    from rltf_ray.trainer import learn_step

    cfg = Config(trainer=TrainerConfig(micro_batch_size=4, mini_batch_size=2))
    examples, _ = build_examples(rows(), cfg, tiny_tokenizer)
    rl = [e for e in trained_examples(examples, cfg) if e.term in RL_TERMS]
    old = sequence_logprobs(engine.module, [(e.ids, e.start) for e in rl], [e.temperature for e in rl], 0, 8)
    gaps = torch.tensor([lp - (-2.0) for lps in old for lp in lps])  # the sampler said -2 for every token
    m = learn_step(engine, None, rows(), cfg, tiny_tokenizer, 0, 0, 0, 1)
    assert m["optimizer_steps"] == 4 and m["rl_tokens_trained"] == len(gaps) == 8
    assert m["mismatch_tokens"] == 8  # every optimizer step's RL tokens, not the first one's
    assert m["logprob_abs_diff_mean"] == pytest.approx(float(gaps.abs().mean()), rel=1e-5)
    assert m["sampler_kl_k3"] == pytest.approx(float((torch.exp(gaps) - 1 - gaps).mean()), rel=1e-4)
    assert m["policy_drift_kl_k3"] > 0  # the later optimizer steps saw a policy that had moved
