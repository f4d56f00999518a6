"""Every loss on small hand-computed tensors."""
import math

import pytest
import torch

from rltf_ray import losses as L


def test_token_logprobs_matches_hand_softmax():
    logits = torch.tensor([[[0.0, math.log(3.0)], [math.log(4.0), 0.0], [0.0, 0.0]]])
    ids = torch.tensor([[0, 1, 0]])
    # position 0 predicts token 1: p = 3/4 ; position 1 predicts token 0: p = 4/5
    got = L.token_logprobs(logits, ids)
    assert torch.allclose(got, torch.tensor([[math.log(0.75), math.log(0.8)]]), atol=1e-6)


def test_group_advantages_mean_and_std():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    g = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert L.group_advantages(r, g).tolist() == [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
    std = L.group_advantages(r, g, std_norm=True)
    # unbiased std of [1,0,0,1] is sqrt(1/3); 0.5 / sqrt(1/3) = 0.8660
    assert std[0].item() == pytest.approx(0.5 / math.sqrt(1 / 3), rel=1e-5)
    assert std[4:].abs().max().item() == 0.0


def test_grpo_on_policy_is_reinforce_with_token_mean():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.7]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -0.5])
    loss = L.grpo_loss(logp, logp.detach(), adv, mask)
    assert loss.item() == pytest.approx(-(1 * 2 - 0.5 * 1) / 3)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1 / 3, -1 / 3], [0.5 / 3, 0.0]]))


@pytest.mark.parametrize("ratio,adv,expected", [(1.5, 1.0, -1.2), (1.5, -1.0, 1.5),
                                                (0.5, 1.0, -0.5), (0.5, -1.0, 0.8)])
def test_grpo_ppo_clip(ratio, adv, expected):
    logp = torch.tensor([[math.log(ratio)]])
    loss = L.grpo_loss(logp, torch.zeros(1, 1), torch.tensor([adv]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_sd_loss_value_and_tau_mask():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -6.0]])
    adv = torch.tensor([1.0, 2.0])
    mask = torch.ones(2, 2)
    assert L.sd_loss(logp, adv, mask).item() == pytest.approx((1 + 2 + 1 + 12) / 4)
    # tau=-5 drops the -6 token: (1 + 2 + 1) / 3
    assert L.sd_loss(logp, adv, mask, tau=-5.0).item() == pytest.approx(4 / 3)
    _, keep = L.sd_token_loss(logp, adv, -5.0)
    assert keep.tolist() == [[1.0, 1.0], [1.0, 0.0]]


def test_sd_first_turn_baseline_survives_all_correct_revisions():
    r0 = torch.tensor([1.0, 0.0, 0.0, 0.0])
    r1 = torch.ones(4)
    g = torch.zeros(4, dtype=torch.long)
    a_first = L.sd_advantages(r1, r0, g)
    assert a_first.tolist() == [0.75, 0.75, 0.75, 0.75]
    logp = torch.full((4, 3), -1.0, requires_grad=True)
    L.sd_loss(logp, a_first, torch.ones(4, 3)).backward()
    assert logp.grad.abs().sum().item() > 0
    # the second-turn baseline (mean r1) would give exactly zero gradient here
    a_second = L.group_advantages(r1, g)
    logp2 = torch.full((4, 3), -1.0, requires_grad=True)
    L.sd_loss(logp2, a_second, torch.ones(4, 3)).backward()
    assert logp2.grad.abs().sum().item() == 0.0


def test_fm_loss_is_mean_negative_logprob():
    logp = torch.tensor([[-1.0, -3.0, -9.0]])
    assert L.fm_loss(logp, torch.tensor([[1.0, 1.0, 0.0]])).item() == pytest.approx(2.0)


def test_token_sum_shares_add_up_to_the_token_mean():
    vals = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    whole = L.masked_mean(vals, mask)
    parts = L.token_sum(vals[:1], mask[:1], 4.0) + L.token_sum(vals[1:], mask[1:], 4.0)
    assert parts.item() == pytest.approx(whole.item()) == pytest.approx((1 + 3 + 4 + 6) / 4)


def test_rltf_loss_combination_and_empty_mask():
    assert L.rltf_loss(torch.tensor(1.0), torch.tensor(2.0), torch.tensor(3.0), 0.1, 0.5).item() == \
        pytest.approx(1 + 0.2 + 1.5)
    assert L.masked_mean(torch.ones(2, 2), torch.zeros(2, 2)).item() == 0.0
