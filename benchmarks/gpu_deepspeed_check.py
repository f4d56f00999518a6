"""GPU check of the learner's DeepSpeed step on CUDA, without Ray (run on a CUDA machine).

    RLTF_TINY=<tiny model folder> python benchmarks/gpu_deepspeed_check.py

For ZeRO stages 2 and 3 with bf16 and the fp32 LM head (the model as `build_model` makes it)
it takes three-turn rollout rows, runs the trainer's own `learn_step` (example building,
micro-batched gradient accumulation, optimizer step) several times on the same rows, then once
with several optimizer steps (the pi_old pre-pass), and checks that every loss term is finite,
that the FM loss falls, and that `full_state_dict` returns every full-size weight (ZeRO-3
gathers its shards). Its CUDA run predates the fp32 head and the pi_old pass: since those,
it has run on CPU only (2026-12-07), not on a GPU.
It prints one table row per stage. Ray is not needed: if it is missing, the `ray.remote`
decorator that `rltf_ray.trainer` applies at import time is replaced by a no-op here.
"""
from __future__ import annotations

import os
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
try:
    import ray  # noqa: F401
except ImportError:  # a bare GPU box: only the decorator is used at import time
    stub = types.ModuleType("ray")
    stub.remote = lambda *a, **k: (lambda cls: cls)
    sys.modules["ray"] = stub

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from rltf_ray.config import Config, LossConfig, ModelConfig, RunConfig, TrainerConfig  # noqa: E402


def rows() -> list[dict]:
    """Two prompts x two samples; one episode per prompt needs a second revision."""
    out = []
    for p, (a, b) in enumerate([([1, 2, 3], [4, 5]), ([6, 7], [8, 9, 10])]):
        for s in range(2):
            wrong = s == 0
            out.append(dict(prompt_id=f"p{p}", prompt=f"question {p}", prompt_ids=a + [11],
                            response=f"attempt {p}{s}", response_ids=b + [12 + s],
                            response_logprobs=[-1.0] * (len(b) + 1),
                            revision_logprobs=[-1.0, -1.0] if wrong else [],
                            revision_logprobs_2=[-1.0, -1.0] if wrong else [],
                            reward_first=0.0 if wrong else 1.0, revised=wrong, critique="wrong: try again",
                            revision=f"revision {p}", revision_prompt_ids=a + [11, 20, 21],
                            revision_ids=[22, 23 + p] if wrong else [], reward_second=0.0 if wrong else 1.0,
                            correct_second=not wrong, revised_2=wrong,
                            revision_prompt_ids_2=a + [11, 20, 21, 22, 30] if wrong else [],
                            revision_ids_2=[31, 32] if wrong else [], reward_second_2=1.0,
                            correct_second_2=True, critique_2="closer" if wrong else ""))
    return out


def check(stage: int, tiny: str) -> tuple[bool, str]:
    import deepspeed

    from rltf_ray.chat import load_tokenizer
    from rltf_ray.learner import build_model, deepspeed_config, full_state_dict
    from rltf_ray.trainer import learn_step

    # bf16 with the fp32 LM head, as the learner builds it (rltf_ray.learner.build_model)
    cfg = Config(model=ModelConfig(path=tiny, dtype="bfloat16", head_dtype="float32"),
                 loss=LossConfig(turn1_rl=True, lambda_sd=0.1, lambda_fm=1.0, sd_weight="clip"),
                 trainer=TrainerConfig(zero_stage=stage, lr=1e-3, micro_batch_size=3),
                 run=RunConfig(turns=3))
    tok = load_tokenizer(tiny)
    model = build_model(tiny, cfg)
    sizes = {k: v.shape for k, v in model.state_dict().items()}
    optim = torch.optim.AdamW(model.parameters(), lr=cfg.trainer.lr)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optim, config=deepspeed_config(cfg),
                                      dist_init_required=False)
    fm = []
    for step in range(4):
        m = learn_step(engine, None, rows(), cfg, tok, tok.pad_token_id or 0, step, 0, 1)
        fm.append(m["loss_fm"])
        finite = all(v == v for k, v in m.items() if k.startswith("loss"))
    # then a step of several optimizer steps: the pi_old pre-pass under this ZeRO stage
    import dataclasses

    several = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, mini_batch_size=6))
    mb = learn_step(engine, None, rows(), several, tok, tok.pad_token_id or 0, 4, 0, 1)
    finite = finite and all(v == v for k, v in mb.items() if k.startswith("loss")) and mb["optimizer_steps"] >= 2
    state = full_state_dict(engine, stage)
    full = all(state[k].shape == s for k, s in sizes.items())
    ok = finite and fm[-1] < fm[0] and full and m["examples_sd"] == 4
    dev = next(engine.module.parameters()).device
    return ok, (f"| {stage} | {dev} | {fm[0]:.4f} -> {fm[-1]:.4f} | {m['examples_rl1']} | {m['examples_sd']} | "
                f"{m['examples_fm']} | {full} | {ok} |")


def main() -> int:
    tiny = os.environ["RLTF_TINY"]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0) if dev == 'cuda' else 'cpu'}")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29534", RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    dist.init_process_group("nccl" if dev == "cuda" else "gloo", rank=0, world_size=1)
    print("| zero stage | device | fm loss step 1 -> 4 | rl1 ex | sd ex | fm ex | full weights | ok |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    ok = True
    for stage in (2, 3):
        passed, line = check(stage, tiny)
        ok &= passed
        print(line, flush=True)
    dist.destroy_process_group()
    print("GPU DEEPSPEED CHECK", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
