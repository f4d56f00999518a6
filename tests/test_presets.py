"""Every objective preset runs one RL step end to end on the tiny model (one Ray for all)."""
import hashlib
import json
from pathlib import Path
import math
import time

import pytest

from rltf_ray.loading import PRESET_DIR, load_config
from rltf_ray.runner import Pipeline
from conftest import engine_logprobs  # noqa: E402

pytestmark = pytest.mark.integration
PRESETS = sorted(f.stem for f in PRESET_DIR.glob("*.yaml"))
# One end-to-end step per distinct code path (each costs about a minute of start-up); the
# formulas of every preset are pinned in tests/test_objectives.py. rltf_sd and rltf_fm are
# covered by rltf_sd_fm, sd_clip/sd_cispo by sd_is's pre-pass (under ZeRO-3 below),
# sd_second_turn by its baseline tests, the Bi-NAC presets by tests/test_binac.py and test_bilevel.py.
# grpo_multi (with the KL term) runs in the three-turn test and sft in the puzzle test, each
# checked by check_step too, to save a pipeline start-up apiece.
# fixed_critic (the learned critic's engines, frozen) is `make test-all`: tests/test_binac.py runs them
ONE_STEP = ["grpo_single", "rltf_sd_fm", pytest.param("fixed_critic", marks=pytest.mark.slow)]


def test_the_paper_presets_and_the_binac_presets_exist():
    assert {"grpo_single", "grpo_multi", "rltf_sd", "rltf_fm", "rltf_sd_fm", "sd_second_turn", "sft",
            "sd_is", "sd_clip", "sd_cispo", "binac", "binac_no_bilevel", "binac_sd", "fixed_critic"} == set(PRESETS)


def one_step(tmp_path, port, *overrides, preset=None):
    cfg = load_config("pipelines/configs/tiny.yaml",
                      [f"run.output_dir={tmp_path}", "run.steps=1", "run.eval_before_after=false",
                       f"run.serve_http_port={port}", *overrides], preset=preset)
    summary = Pipeline(cfg).run()
    return cfg, summary, json.loads((tmp_path / "metrics.jsonl").read_text())


@pytest.mark.parametrize("preset", ONE_STEP)
def test_preset_runs_one_step(preset, shared_ray, tmp_path, tiny_path):
    cfg, summary, m = one_step(tmp_path, 8140, preset=preset)
    check_step(cfg, summary, m)
    # the run records the weights it started from (a warm start rebuilt elsewhere can differ)
    tiny = {"model.safetensors": hashlib.sha256(Path(tiny_path, "model.safetensors").read_bytes()).hexdigest()}
    assert summary["weights_sha256"] == ({"actor": tiny, "critic": tiny} if preset == "fixed_critic"
                                         else {"actor": tiny})


def check_step(cfg, summary, m):
    """What every preset's step must show, whatever its loss terms."""
    assert summary["engine_versions"] == [1] and m["policy_version"] == 1
    L = cfg.loss
    assert all(math.isfinite(m[k]) for k in ("loss", "loss_rl0", "loss_rl1", "loss_sd", "loss_fm", "loss_sft"))
    assert (m["examples_rl1"] > 0) == (L.turn1_rl and cfg.run.turns >= 2)
    assert (m["examples_sd"] > 0) == (L.lambda_sd > 0)
    assert (m["examples_fm"] > 0) == (L.lambda_fm > 0)
    assert m["examples_sft"] == 0  # the random tiny model never gets a revision right
    for term, lam in (("sd", L.lambda_sd), ("fm", L.lambda_fm)):
        if lam == 0:
            assert m[f"loss_{term}"] == 0.0
    if cfg.run.turns == 1:
        assert m["revised_rows"] == 0 and m["examples_rl1"] == 0
    else:  # early termination: exactly the wrong first answers were critiqued and revised, but
        # those whose learned critic's prompt left no room for its critique (never sent, counted)
        skipped = m.get("critic_context_overflow") or 0
        assert m["revised_rows"] == round(m["rows"] * (1 - m["first_turn_accuracy"])) - skipped
    # the step's accuracies and zero-advantage groups, recomputed from its rollout rows
    import pyarrow.parquet as pq

    rows = pq.read_table(Path(cfg.run.output_dir) / "rollouts" / "step_0.parquet").to_pylist()
    last = f"correct_second_{cfg.run.rounds}" if cfg.run.rounds > 1 else "correct_second"
    assert m["first_turn_accuracy"] == pytest.approx(sum(r["correct_first"] for r in rows) / len(rows))
    assert m["second_turn_accuracy"] == pytest.approx(sum(r[last] for r in rows) / len(rows))
    groups: dict = {}
    for r in rows:  # the first turn's return: r0, plus gamma * r1 when the revision turn trains too;
        # under the paper's actor objective (first_turn_return: final) the episode's last reward
        if L.first_turn_return == "final":
            g0 = r["reward_second"] if r.get("revised") else r["reward_first"]
        else:
            g0 = r["reward_first"] + (L.gamma * r["reward_second"] if L.turn1_rl and r.get("revised") else 0.0)
        groups.setdefault(r["prompt_id"], []).append(g0)
    flat = sum(len(set(g)) == 1 for g in groups.values()) / len(groups)
    assert m["zero_adv_group_fraction"] == pytest.approx(flat)
    if L.sd_weight != "none":  # values are null when no SD token had a non-zero advantage
        assert (m["is_weight_mean"] is None) == (m["sd_tokens_trained"] == 0)
        if m["is_weight_mean"] is not None:
            assert 0 < m["is_weight_mean"] <= m["is_weight_max"] and m["is_weight_var"] >= 0
    if L.kl_coef > 0:  # null when no RL token was trained (every advantage 0 with the random model)
        assert (m["kl_mean"] is None) == (m["rl_tokens_trained"] == 0)
        assert m["kl_mean"] is None or m["kl_mean"] >= 0.0
    assert m["logprob_abs_diff_mean"] < 0.05 and m["logprob_abs_diff_max"] >= m["logprob_abs_diff_mean"]


def test_sd_is_under_zero3_with_two_workers(shared_ray, tmp_path, tiny_path):
    """The importance-weight pre-pass forwards a rank-dependent number of SD sequences; under
    ZeRO-3 every forward is a collective, so unequal counts would hang. 3 prompts x 4 samples
    over 2 ranks gives each rank a different share. Several optimizer steps add the pi_old
    pre-pass over the RL tokens, and bf16 with the fp32 head puts that head under ZeRO-3's
    partitioned parameters."""
    cfg, summary, m = one_step(tmp_path, 8143, "trainer.zero_stage=3", "pipeline.prompts.prompts_per_step=3",
                               "trainer.mini_batch_size=9", "model.dtype=bfloat16", preset="sd_is")
    assert cfg.trainer.num_workers == 2 and summary["engine_versions"] == [1]
    assert math.isfinite(m["loss"]) and m["examples_sd"] > 0 and m["optimizer_steps"] >= 2
    prov = summary["provenance"]
    assert (prov["engine_dtype"], prov["learner_dtype"], prov["head_dtype"]) == ("bfloat16", "bfloat16", "float32")


def test_a_failing_critic_stops_the_run_with_its_error(shared_ray, tmp_path, tiny_path):
    """Every critique request fails (nothing listens on the port): the run must stop with
    the critic's error instead of silently training single-turn GRPO."""

    from rltf_ray.stages.critique import CriticFailure

    from rltf_ray.ray_start import free_port

    port = free_port()  # nothing listens there
    with pytest.raises(CriticFailure, match=r"step 0: \d+ of \d+ requests to the critic .* failed.*first error"):
        one_step(tmp_path, 8144, "pipeline.critic.critic=openai", f"pipeline.critic.base_url=http://127.0.0.1:{port}/v1",
                 "pipeline.critic.model=m", "pipeline.critic.retries=0", "pipeline.critic.timeout_s=5")
    assert not (tmp_path / "checkpoints" / "step_1").exists()
    # stop() ended the trainer that was waiting for step 0: no training worker outlives the run
    # on this shared Ray (Ray reaps an exited actor's process within seconds)
    deadline = time.time() + 60
    while ray_worker_threads("TrainWorker") and time.time() < deadline:
        time.sleep(1)
    assert not ray_worker_threads("TrainWorker")


def test_three_turns_run_two_critique_rounds(shared_ray, tmp_path, tiny_path):
    cfg, summary, m = one_step(tmp_path, 8142, "run.turns=3", "loss.lambda_sd=0.1", "loss.kl_coef=0.01",
                               preset="grpo_multi")  # the reference's KL path too
    check_step(cfg, summary, m)
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "rollouts" / "step_0.parquet").to_pylist()
    second = [r for r in rows if r["revised_2"]]
    assert m["revised_rows_2"] == len(second) and "turn_2_accuracy" in m and "final_accuracy" in m
    # round 2 only continues episodes whose first revision was wrong, and it revises y1
    assert all(r["revised"] and not r["correct_second"] and r["critique_2"] for r in second)
    assert all(r["revision_prompt_ids_2"][:len(r["revision_prompt_ids"])] == r["revision_prompt_ids"]
               for r in second)  # x2 extends x1 with y1 and c1
    assert m["examples_rl1"] == m["revised_rows"] + m["revised_rows_2"]
    assert m["examples_sd"] == m["revised_rows"] + m["revised_rows_2"]


@pytest.mark.parametrize("task", ["knights_knaves"])  # the other puzzles: tests/test_puzzles.py
def test_puzzle_task_runs_one_step(task, shared_ray, tmp_path, tiny_path):
    cfg, summary, m = one_step(tmp_path, 8141, f"task.name={task}", "task.params={level: easy}",
                               "engine.max_model_len=2048", "pipeline.prompts.prompts_per_step=2", preset="sft")
    check_step(cfg, summary, m)
    assert m["rows"] == 8 and m["policy_version"] == 1 and m["critique_failed"] == 0
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "rollouts" / "step_0.parquet").to_pylist()
    assert all(r["critique"] for r in rows if r["revised"])  # the puzzle's programmatic critic ran


def test_a_revision_prompt_that_outgrows_the_context_ends_its_episode(shared_ray, tmp_path, tiny_path):
    """x1 = [x0, y0, c0] no longer fits 128 tokens with max_tokens 24 (x0 alone does): each
    such episode ends at that turn with context_overflow, counted, and the step trains."""
    _, summary, m = one_step(tmp_path, 8145, "engine.max_model_len=128")
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "rollouts" / "step_0.parquet").to_pylist()
    critiqued = [r for r in rows if r["critique"]]
    assert critiqued and m["context_overflow"] == len(critiqued)
    assert all(r["context_overflow"] and not r["revised"] and not r["revision_ids"] for r in critiqued)
    assert m["revised_rows"] == 0 and m["examples_rl1"] == 0 and math.isfinite(m["loss"])
    assert summary["engine_versions"] == [1]


def test_lora_run_pushes_merged_weights_to_the_engine(shared_ray, tmp_path, tiny_path):
    cfg = load_config("pipelines/configs/tiny.yaml",
                      [f"run.output_dir={tmp_path}", "run.steps=1", "run.eval_before_after=false",
                       "run.serve_http_port=8146", "trainer.lora={rank: 8, alpha: 16}", "trainer.lr=0.05",
                       "pipeline.first_turn.max_tokens=8", "loss.lambda_fm=1.0"])
    pipe = Pipeline(cfg)
    pipe.start()
    try:
        probe = ([1, 5, 9, 13], [17, 21, 25])
        before = engine_logprobs(pipe.engines[0], *probe)
        summary = pipe.train()  # FM on the critiques always trains (no advantage needed)
        after = engine_logprobs(pipe.engines[0], *probe)
    finally:
        pipe.stop()
    m = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert summary["engine_versions"] == [1] and math.isfinite(m["loss"]) and m["examples_fm"] > 0
    assert max(abs(a - b) for a, b in zip(before, after)) > 1e-4  # the merged weights reached vLLM
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "checkpoints" / "step_1" / "model.safetensors"))
    assert not any("lora_" in k or "base_layer" in k for k in saved)  # a plain HF folder for vLLM


def test_async_overlap_keeps_the_staleness_bound_and_evaluates_exact_versions(shared_ray, tmp_path, tiny_path):
    """run.max_staleness=1: step s's rollouts are generated once step s-2 is trained (while
    s-1 may still train), so every row is at most one version behind; a step that evaluates
    is finished before the next launch, so its evaluation sees exactly its own policy. (k = 0,
    the default, is the synchronous loop: tests/test_integration.py checks version == step.)"""
    import pyarrow.parquet as pq

    cfg = load_config("pipelines/configs/tiny.yaml",
                      [f"run.output_dir={tmp_path}", "run.steps=4", "run.eval_before_after=false",
                       "run.serve_http_port=8147", "run.max_staleness=1", "loss.rollout_cap=2.0",
                       "run.eval_every=3", "eval.prompts=4", "trainer.num_workers=1"])
    summary = Pipeline(cfg).run()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2, 3] and summary["engine_versions"] == [4]
    versions = [{r["policy_version"] for r in pq.read_table(tmp_path / "rollouts" / f"step_{s}.parquet")
                 .to_pylist()} for s in range(4)]
    assert versions[0] == {0} and versions[1] <= {0, 1} and versions[2] <= {1, 2}
    assert versions[3] == {3}  # launched after step 2, which evaluates, had trained
    assert [m["engine_version_lag"] for m in lines] == [s - min(v) for s, v in enumerate(versions)]
    assert lines[2]["eval"]["version"] == 3 and "eval" not in lines[1]
    assert all(math.isfinite(m["loss"]) for m in lines)


def ray_worker_threads(class_part: str) -> dict[int, list[int]]:
    """Live Ray worker processes whose title names `class_part`: pid -> its thread ids."""
    import os

    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            title = open(f"/proc/{pid}/cmdline").read()
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        if title.startswith("ray::") and class_part in title:
            found[int(pid)] = [int(t) for t in tids]
    return found


def realtime_threads(class_part: str, skip: set[int]) -> list[int]:
    """Per such process not in `skip`: how many of its threads run under SCHED_RR."""
    import os

    return [sum(1 for t in tids if sched_policy(t) == os.SCHED_RR)
            for pid, tids in ray_worker_threads(class_part).items() if pid not in skip]


def sched_policy(tid: int) -> int | None:
    import os

    try:
        return os.sched_getscheduler(tid)
    except ProcessLookupError:
        return None


def test_realtime_engine_and_trainer_threads_run_under_sched_rr(needs_realtime, shared_ray, tmp_path,
                                                               tiny_path):
    """engine.realtime and trainer.realtime: the engine's and each training worker's threads
    (vLLM's and torch's compute threads among them) run under SCHED_RR through a real step."""
    cfg = load_config("pipelines/configs/tiny.yaml",
                      [f"run.output_dir={tmp_path}", "run.steps=1", "run.eval_before_after=false",
                       "run.serve_http_port=8147", "pipeline.first_turn.max_tokens=8",
                       "engine.realtime=true", "trainer.realtime=true"])
    pipe = Pipeline(cfg)
    earlier = set(ray_worker_threads("TrainWorker")) | set(ray_worker_threads("PolicyEngine"))
    pipe.start()
    try:
        deadline = time.time() + 180  # the training workers enter train_loop after start()
        trainers = realtime_threads("TrainWorker", earlier)
        while time.time() < deadline and not (len(trainers) == 2 and min(trainers) >= 2):
            time.sleep(1)
            trainers = realtime_threads("TrainWorker", earlier)
        engines = realtime_threads("PolicyEngine", earlier)
        summary = pipe.train()
    finally:
        pipe.stop()
    assert len(trainers) == 2 and min(trainers) >= 2, trainers  # main thread + train_loop's (+ OpenMP)
    assert len(engines) == 1 and engines[0] >= 3, engines  # main, vLLM's thread, its OpenMP partner
    assert summary["engine_versions"] == [1]


COIN_TASK = '''
import rltf_ray


@rltf_ray.register_task("coin_parity")
class CoinParity(rltf_ray.Task):
    """Any text is an answer; half of all texts are right (the parity of their characters),
    so even the random tiny model's revisions are sometimes correct."""
    meta_keys = ("answer",)

    def make_problem(self, index, split):
        return {"answer": index}

    def prompt_text(self, meta):
        return f"Say something about {meta['answer']}."

    def extract(self, text):
        return text, True

    def check(self, answer, meta):
        return sum(map(ord, answer)) % 2 == 0

    def demonstration(self, meta):
        return "ab"
'''


def test_sft_trains_the_correct_revisions_given_x0(shared_ray, tmp_path, tiny_path):
    """The SFT baseline end to end: every correct revision becomes one SFT example, and
    training on it (lambda_sft = 1; the revision turn's RL term off) raises
    log pi(y1 | x0) of those revisions."""
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM

    plugin = tmp_path / "coin_task.py"
    plugin.write_text(COIN_TASK)
    out = tmp_path / "run"
    cfg = load_config("pipelines/configs/tiny.yaml",
                      [f"run.output_dir={out}", "run.steps=1", "run.eval_before_after=false",
                       "run.serve_http_port=8148", "task.name=coin_parity", "task.format_weight=0.0",
                       "trainer.num_workers=1", "loss.lambda_sft=1.0", "loss.turn1_rl=false",
                       "pipeline.first_turn.max_tokens=8", "pipeline.revision.max_tokens=8"],
                      preset="sft", plugins=[str(plugin)])
    Pipeline(cfg).run()
    m = json.loads((out / "metrics.jsonl").read_text())
    rows = pq.read_table(out / "rollouts" / "step_0.parquet").to_pylist()
    right = [r for r in rows if r["revised"] and r["correct_second"]]
    assert right and m["examples_sft"] == len(right)

    def logp(model_dir: str) -> float:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        total = 0.0
        with torch.no_grad():
            for r in right:
                x0, y1 = list(r["prompt_ids"]), list(r["revision_ids"])
                lp = torch.log_softmax(model(torch.tensor([x0 + y1])).logits[0, len(x0) - 1:-1], -1)
                total += float(lp.gather(1, torch.tensor(y1)[:, None]).sum())
        return total / len(right)

    assert logp(str(out / "checkpoints" / "step_1")) > logp(tiny_path) + 0.5
