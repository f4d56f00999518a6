"""Which precision the engines sample in and the learner computes in, resolved once per run.

RL's ratio compares the sampler's log-prob of a token with the learner's. An fp32 learner
scoring a bf16 engine's samples scores another model (the bf16-rounded weights): on the
capability-expansion task GRPO then passed 0.5 held-out on 0 of 10 seeds against 4 of 10
at matched float32 (docs/results.md). So by default the learner follows the engine
(`model.dtype`), and a pairing that differs is only run when asked for, with a warning.

`model.head_dtype: float32` computes the LM head's logits in fp32 on both sides (vLLM's
`head_dtype` override in the engines, `fp32_head` in the learner); on one side only it
widens the gap (docs/benchmarks.md, "Sampler-learner precision").
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from rltf_ray.errors import ConfigError

DTYPES = ("auto", "bfloat16", "float16", "float32")
HEAD_DTYPES = (None, "float32")


def cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_dtype(dtype: str, use_gpu: bool) -> str:
    """`model.dtype` as the dtype the engines run in."""
    if dtype not in DTYPES:
        raise ConfigError(f"model.dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype != "auto":
        return dtype
    return "bfloat16" if use_gpu or cpu_has_native_bf16() else "float32"


def check_head_dtype(head_dtype) -> None:
    if head_dtype not in HEAD_DTYPES:
        raise ConfigError(f"model.head_dtype: expected float32 or null (the model's dtype), got {head_dtype!r}")


def engine_kwargs(dtype: str, head_dtype: str | None) -> dict:
    """vLLM `LLM(...)` arguments for an engine in `dtype` with its LM head in `head_dtype`."""
    kwargs = {"dtype": dtype}
    if head_dtype == "float32" and dtype != "float32":
        kwargs["hf_overrides"] = {"head_dtype": "float32"}
    return kwargs


@dataclass(frozen=True)
class Precision:
    engine: str  # the vLLM engines' dtype
    learner: str  # the learner's compute dtype: bfloat16 (fp32 master weights) or float32
    head: str | None  # "float32": the LM head in fp32 on both sides; None: the model's dtype

    @property
    def matched(self) -> bool:
        return self.engine == self.learner

    @property
    def learner_head_fp32(self) -> bool:
        """The learner upcasts its head only when it computes in bf16 (fp32 already is)."""
        return self.head == "float32" and self.learner != "float32"

    def engine_kwargs(self) -> dict:
        return engine_kwargs(self.engine, self.head)

    def record(self) -> dict:
        return {"engine_dtype": self.engine, "learner_dtype": self.learner, "head_dtype": self.head or "model"}

    def mismatch_warning(self, model_dtype: str, bf16_setting) -> str | None:
        """The start-of-run warning for an engine and a learner at different precisions."""
        if self.matched:
            return None
        if bf16_setting is None:  # float16 engines: no learner mode matches them
            return (f"WARNING: the engines sample in {self.engine} (model.dtype={model_dtype}), and the learner "
                    f"has no {self.engine} mode, so it computes in {self.learner}: the sampler and the learner "
                    "score different models. Use model.dtype=bfloat16 or float32 for RL.")
        return (f"WARNING: the engines sample in {self.engine} (model.dtype={model_dtype}) while the learner "
                f"computes in {self.learner} (trainer.bf16={str(bf16_setting).lower()}). The learner then "
                "scores another model's samples: on this library's capability-expansion task the sampler "
                "and the learner disagreed by sampler_kl_k3 ~9e-2 per token against ~1e-3 matched, and "
                "GRPO passed 0.5 held-out on 0 of 10 seeds against 4 of 10 at matched float32 "
                "(docs/results.md). Leave trainer.bf16 unset to follow model.dtype.")


def resolve_precision(model_dtype: str, bf16, head_dtype, use_gpu: bool) -> Precision:
    """`model.dtype`, `trainer.bf16` (None: follow the engine) and `model.head_dtype` as the
    run's precisions. float16 engines have no matching learner mode: the learner stays fp32."""
    engine = resolve_dtype(model_dtype, use_gpu)
    check_head_dtype(head_dtype)
    if bf16 is None:
        bf16 = engine == "bfloat16"
    return Precision(engine, "bfloat16" if bf16 else "float32", head_dtype)


def fp32_head(model) -> None:
    """Compute `model`'s LM-head logits in fp32 from its (bf16) weight, as vLLM's
    `head_dtype: float32` does in the engine. The weight stays the parameter DeepSpeed owns
    (a tied embedding's lookup is untouched, and a weight sync sends the same tensor); only
    the head's matmul runs in fp32, so no fp32 copy can go stale."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings()
    if head is None:
        raise ConfigError("model.head_dtype=float32: this model has no output embeddings to compute in fp32")
    if getattr(head, "bias", None) is not None:
        raise ConfigError("model.head_dtype=float32: an LM head with a bias is not supported; set model.head_dtype=null")
    linear = fp32_linear()
    head.forward = lambda hidden: linear.apply(hidden, head.weight)


@functools.cache
def fp32_linear():
    import torch

    class Fp32Linear(torch.autograd.Function):
        """hidden @ weight.T in fp32 from bf16 operands. Autograd would keep the fp32 copy of
        the (vocabulary x hidden) weight from forward to backward; this saves the bf16
        operands and casts again in backward, so the copy lives for one matmul (vLLM's CUDA
        path avoids it with an fp32-output matmul)."""

        @staticmethod
        def forward(ctx, hidden, weight):
            ctx.save_for_backward(hidden, weight)
            return torch.nn.functional.linear(hidden.float(), weight.float())

        @staticmethod
        def backward(ctx, grad):
            hidden, weight = ctx.saved_tensors
            g_hidden = g_weight = None
            if ctx.needs_input_grad[0]:
                g_hidden = (grad @ weight.float()).to(hidden.dtype)
            if ctx.needs_input_grad[1]:
                g_weight = (grad.reshape(-1, grad.shape[-1]).T @ hidden.reshape(-1, hidden.shape[-1]).float()
                            ).to(weight.dtype)
            return g_hidden, g_weight

    return Fp32Linear


def precision_of(cfg) -> Precision:
    """The resolved precision of a run's `Config` (engines on GPU when weights sync over NCCL)."""
    return resolve_precision(cfg.model.dtype, cfg.trainer.bf16, cfg.model.head_dtype,
                             cfg.trainer.weight_sync == "nccl")


def resolved(cfg):
    """`cfg` with trainer.bf16 set to what the learner will compute in (driver side, once:
    every worker then reads the same value whatever its own CPU)."""
    import dataclasses

    bf16 = precision_of(cfg).learner == "bfloat16"
    return dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, bf16=bf16))
