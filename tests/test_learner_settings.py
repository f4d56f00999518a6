"""The learner's settings for a user's GPU, checked on CPU: the learning-rate schedule, mini-
batches (several optimizer steps per RL step), gradient checkpointing, bf16 weights."""
import math

import pytest
import torch

from rltf_ray.config import ConfigError, TrainerConfig
from rltf_ray.learner import lr_at
from rltf_ray.loading import load_config
from rltf_ray.trainer import mini_batches

TINY = "pipelines/configs/tiny.yaml"


def test_warmup_then_each_schedule_by_hand():
    t = TrainerConfig(lr=1.0, lr_warmup_steps=3, lr_schedule="linear", min_lr_ratio=0.2)
    # warmup: (s+1)/(3+1); then linear from 1 to 0.2 over the 7 steps 3..9 (reached at step 10)
    got = [lr_at(s, t, 10) for s in range(11)]
    want = [0.25, 0.5, 0.75] + [0.2 + 0.8 * (1 - k / 7) for k in range(7)] + [0.2]
    assert got == pytest.approx(want, abs=1e-12)
    cos = TrainerConfig(lr=2.0, lr_schedule="cosine")
    assert [lr_at(s, cos, 4) for s in range(4)] == pytest.approx(
        [2.0, 2.0 * 0.5 * (1 + math.cos(math.pi / 4)), 1.0, 2.0 * 0.5 * (1 + math.cos(3 * math.pi / 4))])
    assert [lr_at(s, TrainerConfig(lr=3e-6), 5) for s in range(5)] == [3e-6] * 5  # the default: constant


@pytest.mark.parametrize("override, said", [
    ("trainer.lr_schedule=step", "expected constant, linear or cosine"),
    ("trainer.min_lr_ratio=1.5", "min_lr_ratio in"),
    ("trainer.mini_batch_size=0", "mini_batch_size must be >= 1"),
])
def test_bad_learner_settings_are_named(override, said):
    with pytest.raises(ConfigError, match=said):
        load_config(TINY, [override])


def test_mini_batches_split_a_step_the_same_on_every_rank():
    ex = list(range(10))
    assert mini_batches(ex, None, 3) == [ex] and mini_batches(ex, 10, 3) == [ex]
    parts = mini_batches(ex, 4, 3)
    assert [len(p) for p in parts] == [4, 4, 2] and sorted(sum(parts, [])) == ex
    assert parts == mini_batches(ex, 4, 3) and parts != mini_batches(ex, 4, 4)  # seeded by the step
    assert sum(parts, []) != ex  # shuffled: each optimizer step a mix of the step's terms


def test_bf16_weights_and_gradient_checkpointing_in_the_learners_model(tiny_path, tmp_path):
    from rltf_ray.learner import build_model

    cfg = load_config(TINY, ["trainer.bf16=false"])
    fp32 = build_model(tiny_path, cfg)
    bf16 = build_model(tiny_path, load_config(TINY, ["trainer.bf16=true"]))
    assert {p.dtype for p in fp32.parameters()} == {torch.float32}
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    # loaded as DeepSpeed's bf16 mode would cast the fp32 weights: round to nearest
    for (name, a), (_, b) in zip(fp32.named_parameters(), bf16.named_parameters()):
        assert torch.equal(a.detach().to(torch.bfloat16), b.detach()), name
    ckpt = build_model(tiny_path, load_config(TINY, ["trainer.bf16=false", "trainer.gradient_checkpointing=true"]))
    assert ckpt.is_gradient_checkpointing and not fp32.is_gradient_checkpointing
    # in training mode for checkpointing, with no dropout anywhere, even in a model whose
    # config asks for attention dropout: modules, the attention call, the config
    import json
    import shutil

    drop = tmp_path / "tiny_dropout"
    shutil.copytree(tiny_path, drop)
    conf = json.loads((drop / "config.json").read_text())
    (drop / "config.json").write_text(json.dumps({**conf, "attention_dropout": 0.1}))
    dropped = build_model(str(drop), load_config(TINY, ["trainer.bf16=false", "trainer.gradient_checkpointing=true"]))
    attn = [m for m in dropped.modules() if hasattr(m, "attention_dropout")]
    assert dropped.training and dropped.config.attention_dropout == 0.0 and attn
    assert all(m.attention_dropout == 0.0 for m in attn)
    assert all(m.p == 0.0 for m in dropped.modules() if isinstance(m, torch.nn.Dropout))
    ids = torch.tensor([[1, 5, 9, 13, 2, 7, 11, 3]])
    grads, saved = [], []
    for model in (fp32, ckpt):  # as build_model returns them: no train() of the test's own
        n = [0]

        def count(t):
            n[0] += 1
            return t

        model.zero_grad()
        with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
        saved.append(n[0])
    # checkpointing keeps few activations for backward (89 against 15 here); it kept them all
    # while the model stayed in eval mode, where HF's layers skip checkpointing
    assert ckpt.training and saved[1] < saved[0] / 3, saved
    for name in grads[0]:  # the same gradients, with activations recomputed in the backward pass
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-5), name
