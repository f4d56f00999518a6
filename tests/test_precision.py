"""The run's precision: the learner follows the engines unless asked otherwise, a mismatch
asked for is announced at start, the fp32 LM head computes the logits in fp32 from the
same (tied) weight, and a bad head dtype is refused before anything starts."""
import pytest
import torch

from rltf_ray.config import ConfigError
from rltf_ray.loading import load_config
from rltf_ray.precision import Precision, engine_kwargs, fp32_head, precision_of, resolve_precision

TINY = "pipelines/configs/tiny.yaml"


@pytest.mark.parametrize("dtype,bf16,engine,learner", [
    ("bfloat16", None, "bfloat16", "bfloat16"),  # the learner follows the engines
    ("float32", None, "float32", "float32"),
    ("float16", None, "float16", "float32"),  # no fp16 learner mode: fp32, a mismatch
    ("bfloat16", False, "bfloat16", "float32"),  # asked for: runs, with a warning
    ("float32", True, "float32", "bfloat16"),
])
def test_the_learner_follows_the_engine_unless_told(dtype, bf16, engine, learner):
    p = resolve_precision(dtype, bf16, "float32", use_gpu=False)
    assert (p.engine, p.learner) == (engine, learner)
    assert p.matched == (engine == learner)
    assert resolve_precision("auto", None, None, use_gpu=True) == Precision("bfloat16", "bfloat16", None)


def test_a_mismatch_asked_for_names_both_settings_and_the_matched_one_says_nothing():
    fp16 = resolve_precision("float16", None, "float32", False).mismatch_warning("float16", None)
    assert "the learner has no float16 mode" in fp16 and "model.dtype=bfloat16 or float32" in fp16
    text = resolve_precision("bfloat16", False, "float32", False).mismatch_warning("bfloat16", False)
    assert "engines sample in bfloat16 (model.dtype=bfloat16)" in text
    assert "learner computes in float32 (trainer.bf16=false)" in text and "0 of 10 seeds" in text
    assert resolve_precision("bfloat16", True, "float32", False).mismatch_warning("bfloat16", True) is None


def test_the_shipped_configs_run_at_one_precision():
    for name in ("tiny", "demo", "expansion", "expansion_demo", "arith_warm", "knights_warm", "writing", "gpu"):
        cfg = load_config(f"pipelines/configs/{name}.yaml")
        assert cfg.trainer.bf16 is None and precision_of(cfg).matched, name
        assert cfg.model.head_dtype == "float32", name


def test_a_bad_head_dtype_is_refused_by_key_before_ray_starts():
    with pytest.raises(ConfigError, match="model.head_dtype: expected float32 or null"):
        load_config(TINY, ["model.head_dtype=float16"])
    assert load_config(TINY, ["model.head_dtype=null"]).model.head_dtype is None
    with pytest.raises(ConfigError, match="model.dtype: expected one of"):
        precision_of(load_config(TINY, ["model.dtype=fp8"]))


def test_engine_arguments_carry_the_fp32_head_only_where_it_differs():
    assert engine_kwargs("bfloat16", "float32") == {"dtype": "bfloat16", "hf_overrides": {"head_dtype": "float32"}}
    assert engine_kwargs("float32", "float32") == {"dtype": "float32"}  # already fp32
    assert engine_kwargs("bfloat16", None) == {"dtype": "bfloat16"}
    assert Precision("bfloat16", "bfloat16", "float32").learner_head_fp32
    assert not Precision("float32", "float32", "float32").learner_head_fp32


def test_the_fp32_head_of_a_tied_bf16_model_computes_fp32_logits_from_its_own_weight(tiny_tied_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_tied_path, dtype=torch.bfloat16).eval()
    ids = torch.tensor([[1, 5, 9, 13, 17]])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        fp32_head(model)
        hidden = model.model(input_ids=ids).last_hidden_state
        got = model(input_ids=ids).logits
    assert plain.dtype == torch.bfloat16 and got.dtype == torch.float32
    weight = model.get_input_embeddings().weight
    assert model.lm_head.weight is weight and weight.dtype == torch.bfloat16  # still tied, still bf16
    assert torch.equal(got, torch.nn.functional.linear(hidden.float(), weight.float()))
    assert not torch.equal(got, plain.float())  # the bf16 head rounds its logits: the setting matters
    # the embedding lookup is unchanged, and a new weight is the head's at once (no fp32 copy)
    with torch.no_grad():
        weight.mul_(2.0)
        hidden = model.model(input_ids=ids).last_hidden_state
        assert torch.equal(model(input_ids=ids).logits, torch.nn.functional.linear(hidden.float(), weight.float()))


def test_a_run_that_asks_for_a_mismatch_prints_the_warning_when_it_is_built(capsys):
    """Built (`Pipeline(cfg)`, what run.py and `RLTFConfig.build()` do first), before Ray starts."""
    from rltf_ray.runner import Pipeline

    p = Pipeline(load_config(TINY, ["model.dtype=bfloat16", "trainer.bf16=false"]))
    assert "WARNING: the engines sample in bfloat16 (model.dtype=bfloat16) while the learner computes " \
           "in float32 (trainer.bf16=false)" in capsys.readouterr().out
    assert p.cfg.trainer.bf16 is False and p.precision.engine == "bfloat16"
    matched = Pipeline(load_config(TINY, ["model.dtype=float32"]))
    assert "WARNING" not in capsys.readouterr().out and matched.cfg.trainer.bf16 is False


def test_the_fp32_heads_gradients_are_autograds_own_without_keeping_an_fp32_weight():
    """Fp32Linear against autograd through `linear(h.float(), W.float())`: the same logits
    and the same bf16 gradients, bit for bit; what it saves for backward is the bf16 pair."""
    from rltf_ray.precision import fp32_linear

    torch.manual_seed(0)
    h = torch.randn(2, 3, 16, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(40, 16, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(2, 3, 40)
    ref = torch.nn.functional.linear(h.float(), w.float())
    ref.backward(g)
    want = (h.grad.clone(), w.grad.clone())
    h.grad = w.grad = None
    got = fp32_linear().apply(h, w)
    assert got.dtype == torch.float32 and torch.equal(got, ref.detach())
    assert [t.dtype for t in got.grad_fn.saved_tensors] == [torch.bfloat16, torch.bfloat16]
    got.backward(g)
    assert h.grad.dtype == w.grad.dtype == torch.bfloat16
    assert torch.equal(h.grad, want[0]) and torch.equal(w.grad, want[1])
