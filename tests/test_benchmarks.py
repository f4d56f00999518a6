"""The benchmarks still run against the library: each one's smallest case on the tiny model,
in a process of its own as a user runs it, with the table it prints read back."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
# bench_compare's smallest case: one counted step (the first is a warm-up) of 2 prompts x 2
# samples x 16 tokens
SMALL = ("--model", "tiny", "--steps", "2", "--prompts", "2", "--n", "2", "--tokens", "16")


def bench(script: str, *args: str) -> str:
    """What `benchmarks/<script>` prints; it must exit 0."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", DS_ACCELERATOR="cpu", TOKENIZERS_PARALLELISM="false")
    p = subprocess.run([sys.executable, f"benchmarks/{script}", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=800)
    print(p.stdout[-4000:])  # its tables, in the report of a failing test (or with -rP)
    assert p.returncode == 0, f"{script} exited {p.returncode}\n{p.stderr[-6000:]}"
    return p.stdout


def table(out: str) -> list[list[str]]:
    """The cells of every markdown table row printed (headers included, rules left out)."""
    rows = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("| ") and line.endswith("|") and not line.startswith("| ---"):
            rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_mismatch_grid_a_matched_learner_agrees_with_its_sampler():
    out = bench("bench_mismatch.py", "--config", "pipelines/configs/tiny.yaml", "--prompts", "2",
                "--engines", "fp32", "--learners", "fp32,bf16+head")
    got = {(r[0], r[1]): r[2:] for r in table(out) if r[0] != "engine"}
    assert set(got) == {("fp32", "fp32"), ("fp32", "bf16+head")}
    for samples, tokens, kl, mean_diff, max_diff, tok_s, seconds in got.values():
        assert int(samples) == 2 * 4  # --prompts 2 x tiny.yaml's n
        assert 0 < int(tokens) <= 8 * 24  # tiny.yaml's max_tokens
        assert 0 <= float(mean_diff) <= float(max_diff) and float(tok_s) > 0 and float(seconds) >= 0
    # both learners score the one engine's samples; at the engine's precision the learner agrees
    # to rounding, while bf16 weights (even with an fp32 head) score another model
    assert got["fp32", "fp32"][1] == got["fp32", "bf16+head"][1]
    matched, mismatched = float(got["fp32", "fp32"][2]), float(got["fp32", "bf16+head"][2])
    assert matched < 1e-4 and matched < mismatched


@pytest.mark.slow  # ~1-2 min on 2 cores: `make test-all`
def test_compare_single_turn_step_against_the_hand_written_loop():
    out = bench("bench_compare.py", *SMALL, "--parts", "single")
    got = {r[0]: r[1:] for r in table(out)}
    # rltf_ray | floor | ratio | target, for each measure
    gen = got["rollout stage / raw vLLM, generated tok/s"]
    assert float(gen[0]) > 0 and float(gen[1]) > 0 and float(gen[2]) > 0
    # the tiny model's random answers all score 0: no advantage, so usually neither side trains
    learner = got["learner / plain torch, trained tok/s"]
    assert float(learner[0]) >= 0 and float(learner[1]) >= 0
    sync = got["weight sync share of a step"]
    assert 0 < float(sync[0]) < 1 and 0 < float(sync[1]) < 1 and sync[2] == "-"  # a share, no ratio
    step = got["grpo_single step / hand-written loop, s"]
    assert float(step[0]) > 0 and float(step[1]) > 0
    assert float(step[2]) == pytest.approx(float(step[0]) / float(step[1]), rel=0.02)
    assert step[3] == "<= 1.1"
    # the seconds table: generate | train | sync | whole step | peak RSS, for both sides
    floor, ours = got["hand-written loop, grpo_single"], got["rltf_ray grpo_single"]
    assert all(float(x) >= 0 for x in floor[:4] + ours[:4])
    assert float(floor[3]) >= float(floor[0])  # the loop's step holds its generation
    assert floor[4].endswith("(one process)") and ours[4].startswith("learner ")
    # the note on the sync's slope against model size
    assert "weight sync, rltf_ray: tiny" in out


@pytest.mark.slow  # about 3 minutes on 2 cores: two rltf_ray runs and three floors
def test_compare_two_turn_and_rollout_parts_at_equal_work():
    out = bench("bench_compare.py", *SMALL, "--parts", "two_turn,rollout")
    got = {r[0]: r[1:] for r in table(out)}
    two = got["rltf_sd two-turn step / hand-written loop with a revision turn, equal work (lr 0), s"]
    assert float(two[0]) > 0 and float(two[1]) > 0 and two[3] == "<= 1.15"
    for name in ("rollout stage / raw vLLM, equal work (lr 0), tok/s",
                 "rollout stage / raw vLLM returning log-probs, tok/s",
                 "rltf_ray's engine alone / raw vLLM returning log-probs, tok/s"):
        assert all(float(x) > 0 for x in got[name][:3]), name
    floor, ours = got["hand-written loop, rltf_sd (two turns)"], got["rltf_ray rltf_sd (two turns)"]
    assert all(float(x) >= 0 for x in floor[:4] + ours[:4])
    # at lr 0 with one seed every side samples, and trains, the very same tokens (the one counted step)
    assert "the same generated and trained tokens at 1 of 1 steps" in out
    assert "raw vLLM with log-probs and rltf_ray at 1 of 1 steps" in out


def test_compare_trl_step():
    pytest.importorskip("trl")
    out = bench("bench_compare.py", *SMALL, "--parts", "trl")
    assert "TRL's GRPOTrainer failed" not in out
    got = {r[0]: r[1:] for r in table(out)}
    row = got["TRL GRPOTrainer (HF generate)"]
    assert row[:3] == ["-", "-", "-"] and float(row[3]) >= 0
    assert 0.1 < float(row[4].split()[0]) < 64  # its one process's peak RSS, GB
    # without the single part there is no rltf_ray step to divide by: no ratio row
    assert not any(k.startswith("grpo_single step / TRL") for k in got)


def test_task_accuracy_table():
    out = bench("bench_task_accuracy.py", "tiny", "--prompts", "4")
    got = [r for r in table(out) if r[0] in ("1-1", "1-2")]
    assert [tuple(r[:3]) for r in got] == [(d, t, n) for d in ("1-1", "1-2")
                                           for t, n in (("0.0", "1"), ("0.7", "4"), ("1.0", "4"))]
    for r in got:
        accuracy, tagged, truncated, tok_s = map(float, r[3:])
        assert 0 <= accuracy <= 1 and 0 <= tagged <= 1 and 0 <= truncated <= 1 and tok_s > 0
