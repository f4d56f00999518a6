"""The paper's objectives: exact values, equivalences and the first-turn-baseline property."""
import math

import pytest
import torch

from rltf_ray import losses as L
from rltf_ray.config import Config, ConfigError, LossConfig, RunConfig, load_config
from rltf_ray.objectives import Example, build_examples, micro_loss, sequence_logprobs, step_normalisers


def test_discounted_returns():
    g = L.discounted_returns(torch.tensor([[1.0, 0.5], [0.0, 1.0]]), 0.1)
    assert torch.allclose(g, torch.tensor([[1.05, 0.5], [0.1, 1.0]]))
    assert torch.equal(L.discounted_returns(torch.tensor([[0.3, 1.0, 2.0]]), 0.0),
                       torch.tensor([[0.3, 1.0, 2.0]]))


def test_importance_weights_sequence_and_token():
    lx0 = torch.tensor([[-1.0, -2.0]])
    lx1 = torch.tensor([[-1.1, -2.2]])
    mask = torch.ones(1, 2)
    assert torch.allclose(L.importance_weights(lx0, lx1, mask, "token"), torch.exp(torch.tensor([[0.1, 0.2]])))
    assert torch.allclose(L.importance_weights(lx0, lx1, mask, "sequence"), torch.full((1, 2), math.exp(0.3)))


def test_sd_weighted_variants_exact():
    lx0, lx1, m = torch.tensor([[-1.0]]), torch.tensor([[-1.5]]), torch.ones(1, 1)
    w = math.exp(0.5)
    pos, neg = torch.tensor([1.0]), torch.tensor([-1.0])
    assert L.sd_is_token_loss(lx0, lx1, pos, m).item() == pytest.approx(-w)
    assert L.sd_clip_token_loss(lx0, lx1, pos, m).item() == pytest.approx(-1.2)
    assert L.sd_clip_token_loss(lx0, lx1, neg, m).item() == pytest.approx(w)
    assert L.sd_cispo_token_loss(lx0, lx1, pos, m).item() == pytest.approx(1.2 * 1.0 * -(-1.0) * -1 * -1)


@pytest.mark.parametrize("fn", [L.sd_is_token_loss, L.sd_clip_token_loss, L.sd_cispo_token_loss])
@pytest.mark.parametrize("level", ["sequence", "token"])
def test_weighted_sd_gradient_equals_plain_sd_when_contexts_agree(fn, level):
    base = torch.tensor([[-0.5, -1.5, -0.2], [-2.0, -0.1, -0.3]])
    adv, mask = torch.tensor([0.7, -0.4]), torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    a = base.clone().requires_grad_(True)
    L.masked_mean(fn(a, base, adv, mask, level), mask).backward()
    b = base.clone().requires_grad_(True)
    L.sd_loss(b, adv, mask).backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-6)


def test_kl_k3_and_normalisers():
    assert L.kl_k3(torch.tensor([-1.0]), torch.tensor([-1.0])).item() == 0.0
    assert L.kl_k3(torch.tensor([-1.0]), torch.tensor([-2.0])).item() == pytest.approx(math.exp(-1))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert L.normaliser(mask, "token_mean") == 3.0
    assert L.normaliser(mask, "seq_mean_token_sum") == 2.0
    assert L.normaliser(mask, "constant", 10.0) == 20.0
    vals = torch.tensor([[1.0, 3.0, 9.0], [2.0, 9.0, 9.0], [9.0, 9.0, 9.0]])
    assert L.aggregate(vals, mask, "seq_mean_token_sum").item() == pytest.approx((1 + 3 + 2) / 2)


def test_advantage_normalisation_modes():
    adv = torch.tensor([1.0, -1.0, 2.0, -2.0])
    g = torch.tensor([0, 0, 1, 1])
    assert torch.equal(L.normalize_advantages(adv, g, "none"), adv)
    grp = L.normalize_advantages(adv, g, "group")  # each group's unbiased std is sqrt(2), 2*sqrt(2)
    assert torch.allclose(grp, torch.tensor([1, -1, 1, -1]) / math.sqrt(2), atol=1e-5)
    bat = L.normalize_advantages(adv, g, "batch")
    assert torch.allclose(bat, adv / adv.std(), atol=1e-5)
    with pytest.raises(ValueError):
        L.normalize_advantages(adv, g, "bogus")


def rows(r0, r1):
    return [dict(prompt_id="p", prompt="q", prompt_ids=[1, 2], response_ids=[3], response="a",
                 revision_prompt_ids=[1, 2, 3, 4], revision_ids=[5, 6], critique="c",
                 critique_failed=False, revised=True, reward_first=a, reward_second=b,
                 correct_second=b == 1.0) for a, b in zip(r0, r1)]


def cfg(**loss):
    return Config(loss=LossConfig(**loss))


def test_first_turn_baseline_is_wired_into_training_examples(tiny_tokenizer):
    data = rows([1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0])
    first = [e.adv for e in build_examples(data, cfg(), tiny_tokenizer)[0] if e.term == "sd"]
    assert first == [0.75] * 4  # r1 - mean r0: fails if the baseline regresses to turn 2
    second = [e.adv for e in build_examples(data, cfg(sd_baseline="second"), tiny_tokenizer)[0]
              if e.term == "sd"]
    assert second == [0.0] * 4  # the collapse: every revision right -> no SD signal


def test_grpo_multi_returns_and_gamma_zero(tiny_tokenizer):
    data = rows([1.0, 0.0], [0.0, 1.0])
    ex = build_examples(data, cfg(turn1_rl=True, gamma=0.1, lambda_sd=0, lambda_fm=0), tiny_tokenizer)[0]
    # G0 = [1 + 0, 0 + 0.1]; centred: [0.45, -0.45]; turn 1: r1 centred: [-0.5, 0.5]
    assert [e.adv for e in ex if e.term == "rl0"] == pytest.approx([0.45, -0.45])
    assert [e.adv for e in ex if e.term == "rl1"] == pytest.approx([-0.5, 0.5])
    assert [e.ids for e in ex if e.term == "rl1"] == [[1, 2, 3, 4, 5, 6]] * 2  # (x1, y1)
    ex0 = build_examples(data, cfg(turn1_rl=True, gamma=0.0, lambda_sd=0, lambda_fm=0), tiny_tokenizer)[0]
    assert [e.adv for e in ex0 if e.term == "rl0"] == pytest.approx([0.5, -0.5])  # own reward only


def test_sft_examples_use_correct_final_answers(tiny_tokenizer):
    ex = build_examples(rows([0.0, 0.0], [1.0, 0.0]), cfg(lambda_sft=0.1), tiny_tokenizer)[0]
    assert [e.ids for e in ex if e.term == "sft"] == [[1, 2, 5, 6]]


def test_sd_warmup_schedule_and_bad_values():
    c = LossConfig(lambda_sd=0.1, sd_warmup_steps=4)
    assert [c.lambda_sd_at(s) for s in (0, 2, 4, 9)] == pytest.approx([0.0, 0.05, 0.1, 0.1])
    with pytest.raises(ConfigError, match="loss.sd_baseline"):
        load_config(None, ["loss.sd_baseline=third"])
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        load_config(None, preset="nope")
    assert load_config(None, preset="sd_clip").loss.sd_weight == "clip"
    assert load_config(None, ["loss.lambda_fm=0.3"], preset="rltf_sd").loss.lambda_fm == 0.3


def test_micro_loss_is_and_plain_sd_share_gradients_on_the_real_model(tiny_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    ex = [Example([1, 7, 8, 9, 10], 2, "sd", 0.6, x1_ids=[1, 7]),
          Example([1, 7, 11, 12], 2, "sd", -0.3, x1_ids=[1, 7])]
    # x1 == x0 here, so pi(y1|x1) == pi(y1|x0) and every weight is exactly 1
    for e, lp in zip(ex, sequence_logprobs(model, [(e.x1_ids + e.ids[e.start:], 2) for e in ex], 0, 8)):
        e.logp_x1 = lp
    grads = {}
    for weight in ("none", "is", "clip", "cispo"):
        c = cfg(sd_weight=weight, lambda_fm=0.0)
        model.zero_grad()
        loss, sums = micro_loss(model, ex, step_normalisers(ex, c), c, 0)
        loss.backward()
        grads[weight] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        if weight != "none":
            assert sums["is_w_max"] == pytest.approx(1.0, abs=1e-5)
    for weight in ("is", "clip", "cispo"):
        assert torch.allclose(grads[weight], grads["none"], atol=1e-6), weight


def three_turn_rows():
    """A: wrong, wrong, right (two revisions). B: wrong, right (the episode ends at turn 1)."""
    base = dict(prompt_id="p", prompt="q", prompt_ids=[1, 2], response="y0", reward_first=0.0,
                revised=True, revision_prompt_ids=[1, 2, 3, 9], critique="c0")
    a = dict(base, response_ids=[3], revision="y1-a", revision_ids=[4], reward_second=0.0,
             correct_second=False, revised_2=True, revision_prompt_ids_2=[1, 2, 3, 9, 4, 9],
             revision_ids_2=[5, 6], reward_second_2=1.0, correct_second_2=True, critique_2="c1")
    b = dict(base, response_ids=[7], revision="y1-b", revision_ids=[8], reward_second=1.0,
             correct_second=True, revised_2=False, revision_prompt_ids_2=[], revision_ids_2=[],
             reward_second_2=1.0, correct_second_2=True, critique_2="")
    return [a, b]


def test_three_turn_returns_sd_and_fm_examples(tiny_tokenizer):
    c = Config(loss=LossConfig(turn1_rl=True, gamma=0.5, lambda_sd=0.1, lambda_fm=0.1, lambda_sft=0.1),
               run=RunConfig(turns=3))
    ex, stats = build_examples(three_turn_rows(), c, tiny_tokenizer)
    by = lambda term: [(e.ids, e.adv) for e in ex if e.term == term]  # noqa: E731
    # R_A = [0, 0, 1], R_B = [0, 1, -]; G0 = [0.25, 0.5] centred on 0.375
    assert by("rl0") == [([1, 2, 3], -0.125), ([1, 2, 7], 0.125)]
    # turn 1: G1 = [0 + 0.5*1, 1] centred on 0.75; turn 2: only A reached it, so A is its own baseline
    assert by("rl1") == [([1, 2, 3, 9, 4], -0.25), ([1, 2, 3, 9, 4, 9, 5, 6], 0.0), ([1, 2, 3, 9, 8], 0.25)]
    # SD trains (x0, y_k) for every revision with the first-turn baseline mean r0 = 0
    assert by("sd") == [([1, 2, 4], 0.0), ([1, 2, 5, 6], 1.0), ([1, 2, 8], 1.0)]
    sd_x = [e.x1_ids for e in ex if e.term == "sd"]
    assert sd_x == [[1, 2, 3, 9], [1, 2, 3, 9, 4, 9], [1, 2, 3, 9]]
    fm = [e for e in ex if e.term == "fm"]
    assert len(fm) == 3  # c0 of A, c1 of A (given y1), c0 of B
    from rltf_ray.chat import encode, fm_messages

    assert fm[1].ids[:fm[1].start] == encode(tiny_tokenizer, fm_messages("q", "y1-a"))
    assert [e.ids for e in ex if e.term == "sft"] == [[1, 2, 5, 6], [1, 2, 8]]  # final answers
    assert stats["adv_abs_mean_sd"] == pytest.approx(2 / 3)


def test_two_turn_config_ignores_later_rounds_and_nan_rewards_train_nothing(tiny_tokenizer):
    data = three_turn_rows() + [dict(three_turn_rows()[0], prompt_id="q", reward_first=float("nan"))]
    ex, stats = build_examples(data, Config(loss=LossConfig(turn1_rl=True, gamma=0.5)), tiny_tokenizer)
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
