"""Every per-token loss in `rltf_ray.losses` on small hand-computed tensors. These are the
functions `objectives.loss_terms` (the trainer's path) calls; tests/test_objectives.py
checks the wiring."""
import math

import pytest
import torch

from rltf_ray import losses as L


def test_token_logprobs_matches_hand_softmax_at_each_rows_temperature():
    logits = torch.tensor([[[0.0, math.log(3.0)], [math.log(4.0), 0.0], [0.0, 0.0]]])
    ids = torch.tensor([[0, 1, 0]])
    # position 0 predicts token 1: p = 3/4 ; position 1 predicts token 0: p = 4/5
    assert torch.allclose(L.token_logprobs(logits, ids), torch.tensor([[math.log(0.75), math.log(0.8)]]))
    # at T = 0.5 the logits double: p = 9/10 and 16/17
    want = torch.tensor([[math.log(0.9), math.log(16 / 17)]])
    assert torch.allclose(L.token_logprobs(logits, ids, 0.5), want, atol=1e-6)
    two = L.token_logprobs(logits.repeat(2, 1, 1), ids.repeat(2, 1), torch.tensor([1.0, 0.5]))
    assert torch.allclose(two[1], want[0], atol=1e-6) and torch.allclose(two[0], L.token_logprobs(logits, ids)[0])


def test_importance_sampling_ratio_is_against_the_sampler():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    behav = torch.tensor([[-1.5, -2.0]])  # the sampler gave the first token less mass
    adv = torch.tensor([2.0])
    tok = L.policy_token_loss(logp, behav, adv, "importance_sampling")
    rho = torch.tensor([[math.exp(0.5), 1.0]])
    assert torch.allclose(tok, -2.0 * rho)
    tok.sum().backward()
    assert torch.allclose(logp.grad, -2.0 * rho)  # d(-rho A)/dlogp = -rho A


@pytest.mark.parametrize("log_rho,adv,value,grad", [
    (math.log(1.5), 1.0, -1.2, 0.0),     # A > 0, rho above 1 + eps: clipped, no gradient
    (math.log(1.5), -1.0, 1.5, 1.5),     # A < 0: the unclipped (larger) loss is kept
    (math.log(0.5), 1.0, -0.5, -0.5),    # A > 0, rho below 1 - eps: unclipped is the min
    (math.log(0.5), -1.0, 0.8, 0.0),     # A < 0, rho below 1 - eps: clipped
])
def test_ppo_clip_acts_on_a_perturbed_sampler_logprob(log_rho, adv, value, grad):
    logp = torch.tensor([[-2.0]], requires_grad=True)
    behav = torch.tensor([[-2.0 - log_rho]])
    tok = L.policy_token_loss(logp, behav, torch.tensor([adv]), "ppo_clip", clip_eps=0.2)
    assert tok.item() == pytest.approx(value, rel=1e-6)
    tok.sum().backward()
    assert logp.grad.item() == pytest.approx(grad, abs=1e-6)


# Two rows: log-ratios trainer - sampler d = [2.0, 0.2, -0.5] (w = e^2, e^0.2, e^-0.5; sequence
# sum 1.7), and [0.1, -0.1] with a padded third token (sequence sum 0, w = 1).
RW_LOGP = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
RW_BEHAV = torch.tensor([[-3.0, -1.2, -0.5], [-1.1, -0.9, -9.0]])
RW_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
E2, E02, EM05 = math.exp(2.0), math.exp(0.2), math.exp(-0.5)


@pytest.mark.parametrize("mode,band,weights,hit", [
    ("tis_token", (0.5, 2.0), [[2.0, E02, EM05], [math.exp(0.1), math.exp(-0.1), 0.0]],
     [[1, 0, 0], [0, 0, 0]]),
    ("tis_sequence", (0.5, 2.0), [[2.0, 2.0, 2.0], [1.0, 1.0, 0.0]], [[1, 1, 1], [0, 0, 0]]),
    ("mis_token", (0.5, 2.0), [[0.0, E02, EM05], [math.exp(0.1), math.exp(-0.1), 0.0]],
     [[1, 0, 0], [0, 0, 0]]),
    ("mis_token", (0.7, 2.0), [[0.0, E02, 0.0], [math.exp(0.1), math.exp(-0.1), 0.0]],
     [[1, 0, 1], [0, 0, 0]]),
    ("mis_sequence", (0.5, 2.0), [[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]], [[1, 1, 1], [0, 0, 0]]),
])
def test_rollout_weights_by_hand(mode, band, weights, hit):
    w, h = L.rollout_weights(RW_LOGP, RW_BEHAV, RW_MASK, mode, cap=2.0, band=band)
    assert torch.allclose(w, torch.tensor(weights), atol=1e-6)
    assert h.tolist() == hit


def test_rollout_weights_survive_an_extreme_mismatch_and_refuse_an_unknown_mode():
    logp, behav, mask = torch.tensor([[0.0, -1.0]]), torch.tensor([[-100.0, -1.0]]), torch.ones(1, 2)
    w, h = L.rollout_weights(logp, behav, mask, "mis_token")
    assert w.tolist() == [[0.0, 1.0]] and h.tolist() == [[1.0, 0.0]]  # dropped, not NaN (inf * 0)
    w, _ = L.rollout_weights(logp, behav, mask, "tis_sequence", cap=2.0)
    assert w.tolist() == [[2.0, 2.0]]
    with pytest.raises(ValueError, match="rollout correction"):
        L.rollout_weights(logp, behav, mask, "tis_word")


def test_a_correction_weight_scales_the_gradient_with_the_ratio_against_the_trainer():
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    behav = torch.tensor([[-3.0, -1.2]])  # rho against the sampler would be e^2 and e^0.2
    w, _ = L.rollout_weights(logp, behav, torch.ones(1, 2), "tis_token", cap=2.0)
    tok = L.policy_token_loss(logp, behav, torch.tensor([1.5]), "importance_sampling", weight=w)
    assert torch.allclose(tok, torch.tensor([[-3.0, -1.5 * E02]]))  # -w * 1 * A
    tok.sum().backward()
    assert torch.allclose(logp.grad, torch.tensor([[-3.0, -1.5 * E02]]))  # -w A dlog pi
    with pytest.raises(ValueError, match="policy loss"):
        L.policy_token_loss(logp, behav, torch.tensor([1.0]), "reinforce")


def test_sd_plain_loss_and_tau_mask():
    logp = torch.tensor([[-1.0, -6.0]], requires_grad=True)
    keep = L.sd_keep_mask(logp, -5.0)
    assert keep.tolist() == [[1.0, 0.0]] and L.sd_keep_mask(logp, None).tolist() == [[1.0, 1.0]]
    tok = L.sd_token_loss(logp, torch.tensor([0.75]))
    assert tok.tolist() == [[0.75, 4.5]]  # -A log pi
    (tok * keep).sum().backward()
    assert logp.grad.tolist() == [[-0.75, 0.0]]


def test_importance_weights_with_x1_different_from_x0():
    lx0 = torch.tensor([[-1.0, -2.0, -7.0]])
    lx1 = torch.tensor([[-1.5, -1.0, -0.1]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])  # the third token is tau-masked: not in the weight
    tok = L.importance_weights(lx0, lx1, mask, "token")
    assert torch.allclose(tok[0, :2], torch.tensor([math.exp(0.5), math.exp(-1.0)]))
    seq = L.importance_weights(lx0, lx1, mask, "sequence")
    assert torch.allclose(seq, torch.full((1, 3), math.exp(0.5 - 1.0)))  # masked token excluded


def test_weighted_sd_variants_exact():
    lx0 = torch.tensor([[-1.0]], requires_grad=True)
    lx1, m = torch.tensor([[-1.5]]), torch.ones(1, 1)
    w = math.exp(0.5)
    pos, neg = torch.tensor([1.0]), torch.tensor([-1.0])
    assert L.sd_token_loss(lx0, pos, "is", lx1, m).item() == pytest.approx(-w)
    assert L.sd_token_loss(lx0, pos, "clip", lx1, m).item() == pytest.approx(-1.2)
    assert L.sd_token_loss(lx0, neg, "clip", lx1, m).item() == pytest.approx(w)
    # cispo: -sg(clip(w)) * A * log pi = -1.2 * 1 * (-1)
    assert L.sd_token_loss(lx0, pos, "cispo", lx1, m).item() == pytest.approx(1.2)
    L.sd_token_loss(lx0, pos, "is", lx1, m).sum().backward()
    assert lx0.grad.item() == pytest.approx(-w)  # -A w dlog pi


@pytest.mark.parametrize("weight", ["is", "clip", "cispo"])
@pytest.mark.parametrize("level", ["sequence", "token"])
def test_weighted_sd_gradient_equals_plain_sd_when_contexts_agree(weight, level):
    base = torch.tensor([[-0.5, -1.5, -0.2], [-2.0, -0.1, -0.3]])
    adv, mask = torch.tensor([0.7, -0.4]), torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    a = base.clone().requires_grad_(True)
    (L.sd_token_loss(a, adv, weight, base, mask, level) * mask).sum().backward()
    b = base.clone().requires_grad_(True)
    (L.sd_token_loss(b, adv) * mask).sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_discounted_returns_and_group_means():
    g = L.discounted_returns(torch.tensor([[1.0, 0.5], [0.0, 1.0]]), 0.1)
    assert torch.allclose(g, torch.tensor([[1.05, 0.5], [0.1, 1.0]]))
    gid = torch.tensor([0, 0, 1, 1])
    assert L.group_means(torch.tensor([1.0, 0.0, 0.5, 0.5]), gid).tolist() == [0.5, 0.5, 0.5, 0.5]
    sub = L.subset_group_means(torch.tensor([1.0, 0.0, 3.0, 9.0]), gid, torch.tensor([True, False, True, False]))
    assert sub.tolist() == [1.0, 1.0, 3.0, 3.0]


def test_advantage_normalisation_modes():
    adv = torch.tensor([1.0, -1.0, 2.0, -2.0])
    g = torch.tensor([0, 0, 1, 1])
    assert torch.equal(L.normalize_advantages(adv, g, "none"), adv)
    grp = L.normalize_advantages(adv, g, "group")  # each group's unbiased std is sqrt(2), 2*sqrt(2)
    assert torch.allclose(grp, torch.tensor([1, -1, 1, -1]) / math.sqrt(2), atol=1e-5)
    assert torch.allclose(L.normalize_advantages(adv, g, "batch"), adv / adv.std(), atol=1e-5)
    with pytest.raises(ValueError):
        L.normalize_advantages(adv, g, "bogus")


def test_kl_k3_and_token_sum():
    assert L.kl_k3(torch.tensor([-1.0]), torch.tensor([-1.0])).item() == 0.0
    assert L.kl_k3(torch.tensor([-1.0]), torch.tensor([-2.0])).item() == pytest.approx(math.exp(-1))
    vals = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert L.token_sum(vals, mask, 4.0).item() == pytest.approx(8 / 4)
    assert L.token_sum(vals, mask, 0.0).item() == 0.0


def test_kl_outside_the_rl_tokens_is_zero_not_nan():
    # position 1 is not an RL token: ref_logp is 0 there and the policy finds the token very
    # unlikely, so exp(ref - logp) = exp(200) overflows; masked first, it never does
    logp = torch.tensor([-1.0, -200.0], requires_grad=True)
    ref = torch.tensor([-2.0, 0.0])
    mask = torch.tensor([1.0, 0.0])
    kl = L.kl_k3(logp, ref, mask)
    total = L.token_sum(kl, mask, 1.0)
    total.backward()
    assert total.item() == pytest.approx(math.exp(-1))  # exp(-1) - (-1) - 1
    assert torch.isfinite(logp.grad).all() and logp.grad[1].item() == 0.0
    assert torch.isnan(L.token_sum(L.kl_k3(logp.detach(), ref), mask, 1.0))  # what the mask prevents


def test_a_missing_sampler_logprob_raises():
    from types import SimpleNamespace

    from rltf_ray.stages.engine import sampled_logprobs

    lp = lambda v: SimpleNamespace(logprob=v)  # noqa: E731  (vLLM's Logprob: .logprob)
    assert sampled_logprobs([5, 7], [{5: lp(-0.5)}, {7: lp(-1.25), 3: lp(-0.1)}]) == [-0.5, -1.25]
    with pytest.raises(RuntimeError, match="no sampler log-prob for generated token 1 \\(id 7\\)"):
        sampled_logprobs([5, 7], [{5: lp(-0.5)}, {}])
    with pytest.raises(RuntimeError, match="0 sampler log-probs for 2 generated tokens"):
        sampled_logprobs([5, 7], None)
