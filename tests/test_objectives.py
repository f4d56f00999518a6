"""The trainer's own path -- rollout rows -> `build_examples` -> `collate` -> `loss_terms` --
on hand-computed steps: loss weights, behaviour ratios, temperatures, baselines, NaN rows."""
import math

import pytest
import torch

from rltf_ray import losses
from rltf_ray.config import Config, ConfigError, LossConfig, RunConfig
from rltf_ray.loading import load_config
from rltf_ray.examples import Example, build_examples, step_normalisers, trained_examples
from rltf_ray.forward import collate, sequence_logprobs, trained_logprobs
from rltf_ray.objectives import loss_terms, micro_loss


def cfg(turns: int = 2, **loss) -> Config:
    return Config(loss=LossConfig(**loss), run=RunConfig(turns=turns))


def rows(r0, r1, prompt_id="p"):
    """Two-turn rows of one group: y0 = [3], y1 = [5, 6]; revised where r0 != 1."""
    return [dict(prompt_id=prompt_id, prompt="q", prompt_ids=[1, 2], response_ids=[3], response="a",
                 response_logprobs=[-0.5], revision_prompt_ids=[1, 2, 3, 4], revision_ids=[5, 6],
                 revision_logprobs=[-0.25, -0.75], critique="c", critique_failed=False,
                 revised=a != 1.0, reward_first=a, reward_second=b, correct_second=b == 1.0)
            for a, b in zip(r0, r1)]


def grads_of(examples, c: Config, logp_value=-1.0, behav=None):
    """Gradient of the step loss w.r.t. each trained token's log-prob, via `loss_terms`."""
    b = collate(examples, 0)
    if behav is not None:
        b.behav_logp = torch.full_like(b.mask, behav)
    logp = torch.full(b.mask.shape, logp_value, requires_grad=True)
    total, sums = loss_terms(logp, b, step_normalisers(examples, c), c, c.loss.lambda_sd)
    total.backward()
    return logp.grad, total, sums


# -- 1. the relative weight of the loss terms ---------------------------------------------

@pytest.mark.parametrize("aggregation,ratio", [("shared_token_mean", 0.1), ("token_mean", 0.1 * 720 / 40)])
def test_lambda_is_the_per_token_weight_under_the_shared_normaliser(aggregation, ratio):
    # 24 first answers of 30 tokens beside 2 revisions of 20 tokens, every advantage 1
    ex = [Example([1, 2] + [5] * 30, 2, "rl0", 1.0, behav_logp=[-1.0] * 30) for _ in range(24)]
    ex += [Example([1, 2] + [6] * 20, 2, "sd", 1.0) for _ in range(2)]
    c = cfg(aggregation=aggregation, lambda_sd=0.1, sd_mask_tau=None)
    g, _, _ = grads_of(ex, c)
    rl_tok, sd_tok = g[0, 1].item(), g[24, 1].item()  # position start-1 predicts the first trained token
    assert sd_tok / rl_tok == pytest.approx(ratio, rel=1e-6)
    assert rl_tok == pytest.approx(-1 / 720)  # -A / (24 x 30 RL tokens) either way
    assert torch.all(g[:24, 1:31] == g[0, 1]) and torch.all(g[24:, 1:21] == g[24, 1])


def test_the_presets_use_the_shared_normaliser():
    for preset in ("grpo_single", "grpo_multi", "rltf_sd", "rltf_fm", "rltf_sd_fm", "sft", "sd_is"):
        assert load_config(None, preset=preset).loss.aggregation == "shared_token_mean", preset
    assert Config().loss == load_config(None, preset="rltf_sd").loss  # the defaults are RLTF-SD


# -- 3. the behaviour policy and the clip ---------------------------------------------------

def test_rl_ratio_is_against_the_sampler_and_the_clip_acts():
    ex = [Example([1, 2, 7, 8], 2, "rl0", 1.0, behav_logp=[-2.5, -2.5])]
    rho = math.exp(0.5)  # trainer -2.0 vs sampler -2.5
    bare = dict(rollout_correction="none", lambda_sd=0.0)
    g, total, sums = grads_of(ex, cfg(policy_loss="importance_sampling", **bare), -2.0)
    assert total.item() == pytest.approx(-rho) and g[0, 1].item() == pytest.approx(-rho / 2)
    g, total, sums = grads_of(ex, cfg(policy_loss="ppo_clip", **bare), -2.0)
    assert total.item() == pytest.approx(-1.2)  # clipped at 1 + eps ...
    assert g.abs().sum().item() == 0.0  # ... so no gradient pushes further
    assert sums["clipped_tokens"] == 2 and sums["rl_tokens"] == 2 and sums["corrected_tokens"] == 0
    assert sums["logprob_abs_diff_sum"] == pytest.approx(1.0) and sums["logprob_abs_diff_max"] == pytest.approx(0.5)
    assert sums["mismatch_kl_sum"] == pytest.approx(2 * (rho - 1 - 0.5))  # k3 of KL(sampler||trainer)
    g, _, sums = grads_of(ex, cfg(policy_loss="ppo_clip", rollout_cap=1.2, lambda_sd=0.0), -2.0)
    assert g[0, 1].item() == pytest.approx(-1.2 / 2)  # TIS: truncated weight, ratio 1 vs pi_prox
    assert sums["corrected_tokens"] == 2


def test_the_default_correction_bounds_the_weight_of_a_large_mismatch():
    """The default (tis_token, cap 2): a 2-nat gap that the bare ratio would weigh e^2 = 7.4."""
    assert LossConfig().rollout_correction == "tis_token" and LossConfig().rollout_cap == 2.0
    ex = [Example([1, 2, 7, 8], 2, "rl0", 1.0, behav_logp=[-4.0, -2.5])]  # w = e^2 and e^0.5
    g, total, sums = grads_of(ex, cfg(lambda_sd=0.0), -2.0)
    assert g[0, 1].item() == pytest.approx(-2.0 / 2) and g[0, 2].item() == pytest.approx(-math.exp(0.5) / 2)
    assert sums["corrected_tokens"] == 1
    g, _, sums = grads_of(ex, cfg(lambda_sd=0.0, rollout_correction="mis_sequence"), -2.0)
    assert g.abs().sum().item() == 0.0 and sums["corrected_tokens"] == 2  # w_seq = e^2.5: dropped


@pytest.mark.parametrize("correction", ["none", "tis_token", "tis_sequence", "mis_token", "mis_sequence"])
def test_a_token_that_drifted_beyond_the_clip_within_the_step_gets_no_gradient(correction):
    """A later mini-batch: the policy moved 1 nat above pi_old (the step's start, where the
    sampler drew it: mu = pi_old) on a token with A = 1. rho = e > 1 + eps under every
    correction, so ppo_clip stops it. (Before pi_old was kept for the whole step, rho was
    taken against the trainer's own detached log-prob, 1 in every mini-batch: the gradient
    was -w = -2 under tis_token.)"""
    ex = [Example([1, 2, 7], 2, "rl0", 1.0, behav_logp=[-3.0], old_logp=[-3.0])]
    c = cfg(policy_loss="ppo_clip", clip_eps=0.2, rollout_correction=correction, lambda_sd=0.0)
    g, total, sums = grads_of(ex, c, -2.0)
    assert g.abs().sum().item() == 0.0
    assert total.item() == pytest.approx(-1.2)  # -min(e * 1, 1.2 * 1)
    assert sums["clipped_tokens"] == 1 and sums["drift_kl_sum"] == pytest.approx(math.e - 1 - 1)
    # the sampler-trainer mismatch is pi_old against the sampler: none here, whatever the drift
    assert sums["mismatch_kl_sum"] == 0.0 and sums["logprob_abs_diff_sum"] == 0.0
    # within the clip the gradient flows: 0.1 nat of drift, rho = e^0.1
    g, _, _ = grads_of(ex, c, -2.9)
    assert g[0, 1].item() == pytest.approx(-math.exp(0.1))


def test_the_correction_weight_is_pi_old_over_the_sampler_and_rho_is_pi_theta_over_pi_old():
    """pi_old 0.5 nat above the sampler (w = e^0.5), the policy 0.1 nat above pi_old:
    importance_sampling gives -w * rho * A per token with rho = e^0.1."""
    ex = [Example([1, 2, 7], 2, "rl0", 2.0, behav_logp=[-3.5], old_logp=[-3.0])]
    g, total, sums = grads_of(ex, cfg(rollout_correction="tis_token", lambda_sd=0.0), -2.9)
    assert total.item() == pytest.approx(-math.exp(0.5) * math.exp(0.1) * 2.0)
    assert g[0, 1].item() == pytest.approx(-math.exp(0.5) * math.exp(0.1) * 2.0)
    assert sums["logprob_abs_diff_sum"] == pytest.approx(0.5)  # |log pi_old - log mu|
    assert sums["mismatch_kl_sum"] == pytest.approx(math.exp(0.5) - 1 - 0.5)


def test_kl_penalty_against_the_reference_enters_the_rl_terms():
    ex = [Example([1, 2, 7], 2, "rl0", 0.0, behav_logp=[-1.0], ref_logp=[-2.0])]  # A = 0: KL only
    g, total, sums = grads_of(ex, cfg(kl_coef=0.5, lambda_sd=0.0), -1.0)
    k3 = math.exp(-1.0) - (-1.0) - 1  # exp(ref - logp) - (ref - logp) - 1
    assert total.item() == pytest.approx(0.5 * k3) and sums["kl_sum"] == pytest.approx(k3)
    assert g[0, 1].item() == pytest.approx(0.5 * (1 - math.exp(-1.0)))  # d k3 / d logp


@pytest.mark.parametrize("adv_norm", ["none", "group"])
def test_a_group_of_equal_rewards_has_exactly_zero_advantage(adv_norm):
    """8 rewards of -0.1 average to -0.1 + 7.45e-9 in float32; group normalisation used to
    blow that up to ~0.0074 for every member. Beside a group with signal, the flat group
    counts as dead (fraction 0.5) and none of its sequences trains."""
    c = cfg(adv_norm=adv_norm, lambda_sd=0.0)
    flat = rows([-0.1] * 8, [-0.1] * 8, "flat")
    live = rows([1.0, 0.0] * 4, [1.0] * 8, "live")
    ex, stats = build_examples(flat + live, c, None)
    rl0 = [e for e in ex if e.term == "rl0"]
    assert [e.adv for e in rl0[:8]] == [0.0] * 8 and all(e.adv != 0.0 for e in rl0[8:])
    assert stats["zero_adv_group_fraction"] == 0.5
    assert not any(e in trained_examples(ex, c) for e in ex[:16])  # the flat group's rl0 and rl1


def test_three_equal_rewards_of_minus_0_9_are_a_dead_group_and_sd_sees_no_signal():
    c = cfg(lambda_sd=0.1)
    ex, stats = build_examples(rows([-0.9] * 3, [-0.9] * 3), c, None)
    assert stats["zero_adv_group_fraction"] == 1.0
    assert all(e.adv == 0.0 for e in ex)  # rl0, rl1 and sd (r1 - mean r0 = 0 exactly)
    assert trained_examples(ex, c) == []


def test_the_kl_penalty_covers_zero_advantage_rl_sequences():
    ex = [Example([1, 2, 7], 2, "rl0", 0.0, behav_logp=[-1.0], ref_logp=[-2.0]),
          Example([1, 2, 8], 2, "rl0", 1.0, behav_logp=[-1.0], ref_logp=[-2.0]),
          Example([1, 2, 9], 2, "sd", 0.0)]
    assert trained_examples(ex, cfg(kl_coef=0.5)) == ex[:2]  # every RL token carries the KL term
    assert trained_examples(ex, cfg()) == ex[1:2]  # without KL a zero advantage adds nothing


# -- 2. temperatures and behaviour log-probs reach the examples ----------------------------

def test_examples_carry_their_sampling_temperature_and_sampler_logprobs(tiny_tokenizer):
    c = load_config("pipelines/configs/tiny.yaml", ["pipeline.first_turn.temperature=0.7",
                                                    "pipeline.revision.temperature=0.9",
                                                    "loss.lambda_fm=0.1"])
    ex, _ = build_examples(rows([0.0, 1.0], [1.0, 1.0]), c, tiny_tokenizer)
    by = {t: [e for e in ex if e.term == t] for t in ("rl0", "rl1", "sd", "fm")}
    assert [e.temperature for e in by["rl0"]] == [0.7, 0.7] and by["rl0"][0].behav_logp == [-0.5]
    assert [(e.temperature, e.behav_logp) for e in by["rl1"]] == [(0.9, [-0.25, -0.75])]
    assert [(e.temperature, e.x1_temperature, e.behav_logp) for e in by["sd"]] == [(0.7, 0.9, None)]
    assert [e.temperature for e in by["fm"]] == [1.0]
    bad = rows([0.0], [1.0])
    bad[0]["revision_logprobs"] = [-0.25]  # one value for two tokens
    with pytest.raises(ValueError, match="revision_logprobs.*1 values for 2 tokens"):
        build_examples(bad, c, tiny_tokenizer)


# -- 4. one unscored revision must not wipe out a step ----------------------------------

def test_a_nan_revision_reward_leaves_its_row_out_of_every_term_and_statistic(tiny_tokenizer):
    data = rows([0.0, 0.0, 1.0], [1.0, float("nan"), 1.0])
    ex, stats = build_examples(data, cfg(lambda_fm=0.1), tiny_tokenizer)
    assert stats["unscored_rows"] == 1
    assert all(math.isfinite(e.adv) for e in ex)
    # the NaN row is gone from the group: G0 = [0 + 0.1, 1] centred on 0.55, r0 baseline 0.5
    assert [e.adv for e in ex if e.term == "rl0"] == pytest.approx([-0.45, 0.45])
    assert [e.adv for e in ex if e.term == "sd"] == pytest.approx([0.5])
    assert len([e for e in ex if e.term == "fm"]) == 1
    c = cfg(lambda_fm=0.1)
    _, total, _ = grads_of([e for e in ex if e.term != "fm"], c, -1.0, behav=-1.0)
    assert math.isfinite(total.item())


# -- 7. tau-masked tokens are out of the SD importance weight; 8. weights with x1 != x0 -----

def test_sd_importance_weight_with_x1_different_and_tau_masked_tokens_excluded():
    e = Example([1, 2, 7, 8, 9], 2, "sd", 1.0, logp_x1=[-1.5, -0.2, -0.1])
    c = cfg(sd_weight="is", sd_weight_level="sequence", sd_mask_tau=-5.0, lambda_sd=0.1,
            aggregation="token_mean")
    b = collate([e], 0)
    logp = torch.tensor([[0.0, -1.0, -1.0, -6.0]], requires_grad=True)  # the last token is masked
    total, sums = loss_terms(logp, b, step_normalisers([e], c), c, 0.1)
    w = math.exp((-1.0 + 1.5) + (-1.0 + 0.2))  # the two kept tokens only (with the third: e^-6.2)
    assert sums["is_w_sum"] / sums["sd_tokens"] == pytest.approx(w)
    assert sums["sd_tokens"] == 2 and sums["sd_tokens_masked"] == 1
    e2 = Example([1, 2, 7, 8], 2, "sd", 1.0, logp_x1=[-1.5, -3.0])
    b2 = collate([e2], 0)
    lp2 = torch.tensor([[0.0, -1.0, -1.0]], requires_grad=True)
    total, sums = loss_terms(lp2, b2, step_normalisers([e2], c), c, 0.1)
    w2 = math.exp(0.5 + 2.0)
    assert sums["is_w_max"] == pytest.approx(w2)
    total.backward()  # -lambda * A * w_seq * dlog pi / 2 tokens
    assert lp2.grad[0, 1:].tolist() == pytest.approx([-0.1 * w2 / 2] * 2)


def test_weighted_sd_on_the_real_model_scales_the_plain_gradient_by_the_weight(tiny_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    x0, x1, y = [1, 7], [1, 7, 30, 31, 32], [9, 10, 11]
    e = Example(x0 + y, 2, "sd", 0.6, x1_ids=x1)
    e.logp_x1 = sequence_logprobs(model, [(x1 + y, len(x1))], [1.0], 0, 8)[0]
    grads, sums = {}, {}
    for weight in ("none", "is"):
        c = cfg(sd_weight=weight, sd_mask_tau=None, lambda_fm=0.0)
        model.zero_grad()
        loss, sums[weight] = micro_loss(model, [e], step_normalisers([e], c), c, 0)
        loss.backward()
        grads[weight] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    w = sums["is"]["is_w_max"]
    assert abs(w - 1.0) > 1e-3  # a different context: the weight is not 1
    assert torch.allclose(grads["is"], w * grads["none"], rtol=1e-4, atol=1e-6)


def test_the_vocabulary_projection_runs_only_from_the_first_trained_token(tiny_path):
    """Rows trained from tokens 3 and 5 of 8: the LM head sees positions 2..7 only, and every
    trained log-prob is the full forward's (the loss and its gradient do not change)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    ex = [Example([1, 7, 9, 10, 11, 12, 13, 14], 3, "rl0", 0.5), Example([1, 7, 30, 31, 32, 9, 10], 5, "rl0", 0.5)]
    b = collate(ex, 0)
    seen = []
    hook = model.lm_head.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].shape[1]))
    try:
        part = trained_logprobs(model, b, 3, 0.7)
    finally:
        hook.remove()
    full = losses.token_logprobs(
        model(input_ids=b.ids, attention_mask=b.attn).logits, b.ids, 0.7)
    assert seen == [8 - 3 + 1] and part.shape == full.shape == (2, 7)
    assert (part[:, :2] == 0).all()
    assert torch.allclose(part * b.mask, full * b.mask, atol=1e-5)


# -- 9. baselines as in the reference ------------------------------------------------------

def test_sft_trains_only_on_correct_revised_answers(tiny_tokenizer):
    # row 0: first answer right (one turn) -> no SFT; row 1: revised and right; row 2: revised, wrong
    ex, _ = build_examples(rows([1.0, 0.0, 0.0], [1.0, 1.0, 0.0]), cfg(lambda_sft=0.1), tiny_tokenizer)
    assert [e.ids for e in ex if e.term == "sft"] == [[1, 2, 5, 6]]


def test_first_turn_baseline_is_wired_into_training_examples(tiny_tokenizer):
    data = rows([1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0])
    first = [e.adv for e in build_examples(data, cfg(), tiny_tokenizer)[0] if e.term == "sd"]
    assert first == [0.75] * 3  # r1 - mean r0: fails if the baseline regresses to turn 2
    second = [e.adv for e in build_examples(data, cfg(sd_baseline="second"), tiny_tokenizer)[0]
              if e.term == "sd"]
    assert second == [0.0] * 3  # the collapse: every revision right -> no SD signal


def test_grpo_multi_returns_and_gamma_zero(tiny_tokenizer):
    data = rows([0.5, 0.0], [0.0, 1.0])
    ex = build_examples(data, cfg(gamma=0.1, lambda_sd=0), tiny_tokenizer)[0]
    # G0 = [0.5 + 0, 0 + 0.1]; centred: [0.2, -0.2]; turn 1: r1 centred: [-0.5, 0.5]
    assert [e.adv for e in ex if e.term == "rl0"] == pytest.approx([0.2, -0.2])
    assert [e.adv for e in ex if e.term == "rl1"] == pytest.approx([-0.5, 0.5])
    assert [e.ids for e in ex if e.term == "rl1"] == [[1, 2, 3, 4, 5, 6]] * 2  # (x1, y1)
    ex0 = build_examples(data, cfg(gamma=0.0, lambda_sd=0), tiny_tokenizer)[0]
    assert [e.adv for e in ex0 if e.term == "rl0"] == pytest.approx([0.25, -0.25])  # own reward only


def test_sd_warmup_schedule_and_bad_values():
    c = LossConfig(lambda_sd=0.1, sd_warmup_steps=4)
    assert [c.lambda_sd_at(s) for s in (0, 2, 4, 9)] == pytest.approx([0.0, 0.05, 0.1, 0.1])
    with pytest.raises(ConfigError, match="loss.sd_baseline"):
        load_config(None, ["loss.sd_baseline=third"])
    with pytest.raises(ConfigError, match="loss.policy_loss"):
        load_config(None, ["loss.policy_loss=reinforce"])
    with pytest.raises(ConfigError, match=r"loss.tis_cap: replaced by loss.rollout_correction"):
        load_config(None, ["loss.tis_cap=2.0"])
    for bad, key in [("loss.rollout_correction=tis_word", "loss.rollout_correction: expected one of"),
                     ("loss.rollout_cap=1.0", "loss.rollout_cap: must be > 1"),
                     ("loss.rollout_mask_low=2.0", "need 0 <= low < high"),
                     ("loss.rollout_mask_high=0.4", "need 0 <= low < high"),
                     ("loss.rollout_mask_high=0.9", "the band must contain 1"),
                     ("loss.rollout_mask_low=1.5", "the band must contain 1"),
                     ("loss.sampler_kl_warn=0", "loss.sampler_kl_warn: must be > 0")]:
        with pytest.raises(ConfigError, match=key):
            load_config(None, [bad])
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        load_config(None, preset="nope")
    assert load_config(None, preset="sd_clip").loss.sd_weight == "clip"
    assert load_config(None, ["loss.lambda_fm=0.3"], preset="rltf_sd").loss.lambda_fm == 0.3


# -- K turns ----------------------------------------------------------------------------------

def three_turn_rows():
    """A: wrong, wrong, right (two revisions). B: wrong, right (the episode ends at turn 1)."""
    base = dict(prompt_id="p", prompt="q", prompt_ids=[1, 2], response="y0", reward_first=0.0,
                revised=True, revision_prompt_ids=[1, 2, 3, 9], critique="c0")
    a = dict(base, response_ids=[3], response_logprobs=[-1.0], revision="y1-a", revision_ids=[4],
             revision_logprobs=[-1.0], reward_second=0.0, correct_second=False, revised_2=True,
             revision_prompt_ids_2=[1, 2, 3, 9, 4, 9], revision_ids_2=[5, 6], revision_logprobs_2=[-1.0, -1.0],
             reward_second_2=1.0, correct_second_2=True, critique_2="c1")
    b = dict(base, response_ids=[7], response_logprobs=[-1.0], revision="y1-b", revision_ids=[8],
             revision_logprobs=[-1.0], reward_second=1.0, correct_second=True, revised_2=False,
             revision_prompt_ids_2=[], revision_ids_2=[], reward_second_2=1.0, correct_second_2=True,
             critique_2="")
    return [a, b]


def test_three_turn_returns_sd_and_fm_examples(tiny_tokenizer):
    c = cfg(turns=3, gamma=0.5, lambda_sd=0.1, lambda_fm=0.1, lambda_sft=0.1)
    ex, stats = build_examples(three_turn_rows(), c, tiny_tokenizer)
    by = lambda term: [(e.ids, e.adv) for e in ex if e.term == term]  # noqa: E731
    # R_A = [0, 0, 1], R_B = [0, 1, -]; G0 = [0.25, 0.5] centred on 0.375
    assert by("rl0") == [([1, 2, 3], -0.125), ([1, 2, 7], 0.125)]
    # turn 1: G1 = [0 + 0.5*1, 1] centred on 0.75; turn 2: only A reached it, so A is its own baseline
    assert by("rl1") == [([1, 2, 3, 9, 4], -0.25), ([1, 2, 3, 9, 4, 9, 5, 6], 0.0), ([1, 2, 3, 9, 8], 0.25)]
    assert [e.behav_logp for e in ex if e.term == "rl1"] == [[-1.0], [-1.0, -1.0], [-1.0]]
    # SD trains (x0, y_k) for every revision with the first-turn baseline mean r0 = 0
    assert by("sd") == [([1, 2, 4], 0.0), ([1, 2, 5, 6], 1.0), ([1, 2, 8], 1.0)]
    assert [e.x1_ids for e in ex if e.term == "sd"] == [[1, 2, 3, 9], [1, 2, 3, 9, 4, 9], [1, 2, 3, 9]]
    fm = [e for e in ex if e.term == "fm"]
    assert len(fm) == 3  # c0 of A, c1 of A (given y1), c0 of B
    from rltf_ray.chat import encode, fm_messages

    assert fm[1].ids[:fm[1].start] == encode(tiny_tokenizer, fm_messages("q", "y1-a"))
    assert [e.ids for e in ex if e.term == "sft"] == [[1, 2, 5, 6], [1, 2, 8]]  # final answers
    assert stats["adv_abs_mean_sd"] == pytest.approx(2 / 3)


def test_two_turn_config_ignores_later_rounds_and_nan_rewards_train_nothing(tiny_tokenizer):
    data = three_turn_rows() + [dict(three_turn_rows()[0], prompt_id="q", reward_first=float("nan"))]
    ex, stats = build_examples(data, cfg(gamma=0.5), tiny_tokenizer)
    assert [e.ids for e in ex if e.term == "rl1"] == [[1, 2, 3, 9, 4], [1, 2, 3, 9, 8]]
    assert stats["unscored_rows"] == 1 and len([e for e in ex if e.term == "rl0"]) == 2


def test_turns_expand_the_graph_into_critique_rounds():
    c = load_config("pipelines/configs/tiny.yaml", ["run.turns=4"])
    names = [n.name for n in c.pipeline]
    assert names == ["prompts", "first_turn", "critic", "revision", "score", "critic_2", "revision_2",
                     "score_2", "critic_3", "revision_3", "score_3", "learner"]
    assert c.pipeline[-1].inputs == {"rollouts": "score_3"} and c.pipeline[5].inputs == {"answers": "score"}
    assert load_config("pipelines/configs/tiny.yaml", ["run.turns=2"]).pipeline[-1].inputs == {"rollouts": "score"}
    with pytest.raises(ConfigError, match="run.turns"):
        load_config(None, ["run.turns=0"])
