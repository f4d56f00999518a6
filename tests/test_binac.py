"""Bi-NAC: the learned critic's rewards and advantages by hand, its schedule, its learner with
a real DeepSpeed engine pushing into a real critic vLLM engine, and a 2-step `binac` run."""
import hashlib
import json
import math
from pathlib import Path

import pytest
import torch

from rltf_ray.config import BinacConfig, Config, ConfigError, LossConfig
from rltf_ray.loading import load_config
from rltf_ray.critic_examples import build_critic_examples, critic_rewards
from conftest import engine_logprobs, undocumented_keys  # noqa: E402


@pytest.mark.parametrize("reward,bonus,expected", [
    ("improvement", 0.0, [1.0 - 0.2, 0.5 - 0.2, -1.0]),   # mean_m r1 - r0; no verdict line: -1
    ("outcome", 0.0, [1.0, 0.5, -1.0]),                   # mean_m r1
    ("improvement", 0.3, [0.8 + 0.3, 0.3, -1.0]),         # + beta when the verdict agrees
])
def test_critic_rewards_exact(reward, bonus, expected):
    b = BinacConfig(critic_reward=reward, verdict_bonus=bonus)
    # K = 3 critiques x M = 2 revisions; the attempt was wrong (r0 = 0.2, verdict false)
    got = critic_rewards(0.2, False, [1.0, 1.0, 0.0, 1.0, 1.0, 1.0], [False, True, None], [True, True, False], b)
    assert got == pytest.approx(expected)


def test_without_a_format_requirement_a_critique_lacking_the_verdict_line_earns_its_improvement():
    b = BinacConfig(format_penalty=None, verdict_bonus=0.3)
    got = critic_rewards(0.2, False, [1.0, 1.0, 0.0, 1.0, 1.0, 1.0], [False, True, None], [True, True, False], b)
    assert got == pytest.approx([0.8 + 0.3, 0.3, 1.0 - 0.2])  # no bonus: it states no verdict


def critic_row(rev_rewards, verdicts=(False, False), fmt=(True, True)):
    return {"prompt_id": "p", "reward_first": 0.0, "correct_first": False, "critic_prompt_ids": [1, 2, 3],
            "critic_critiques": ["a", "b"], "critic_critique_ids": [[7, 8], [9]],
            "critic_critique_logprobs": [[-1.0, -2.0], [-0.5]], "critic_verdicts": list(verdicts),
            "critic_format_ok": list(fmt), "critic_revision_rewards": rev_rewards}


def test_critic_examples_are_grpo_over_the_k_critiques_of_one_attempt():
    cfg = Config(binac=BinacConfig(temperature=0.9))
    ex, stats = build_critic_examples([critic_row([1.0, 0.0]), critic_row([0.0, 0.0]),
                                       {"prompt_id": "q", "critic_critiques": []}], cfg)
    assert stats["examples_critic"] == 4
    assert [e.adv for e in ex] == pytest.approx([0.5, -0.5, 0.0, 0.0])  # centred within each attempt
    assert ex[0].ids == [1, 2, 3, 7, 8] and ex[0].start == 3 and ex[1].ids == [1, 2, 3, 9]
    assert ex[0].behav_logp == [-1.0, -2.0] and ex[0].temperature == 0.9 and ex[0].term == "rl0"
    fmt = build_critic_examples([critic_row([1.0, 1.0], fmt=(True, False))], cfg)[0]
    assert [e.adv for e in fmt] == pytest.approx([1.0, -1.0])  # reward 1 vs the -1 format penalty


def test_schedule_steps_at_the_expected_rl_steps():
    b = BinacConfig(actor_steps=2, critic_steps=1)
    assert [s for s in range(8) if b.actor_trains(s)] == list(range(8))
    assert [s for s in range(8) if b.critic_trains(s)] == [1, 3, 5, 7]
    one = BinacConfig(actor_steps=1, critic_steps=1)  # 1:1 = simultaneous
    assert all(one.actor_trains(s) and one.critic_trains(s) for s in range(4))
    lead = BinacConfig(actor_steps=1, critic_steps=3)  # the critic leads: 3 critic steps per actor step
    assert [s for s in range(6) if lead.actor_trains(s)] == [0, 3]
    assert [s for s in range(6) if lead.critic_trains(s)] == list(range(6))
    assert not any(BinacConfig(critic_steps=0).critic_trains(s) for s in range(10))
    assert [s for s in range(10) if BinacConfig().critic_trains(s)] == [4, 9]  # the 1:5 default


def test_learned_critic_config_errors():
    with pytest.raises(ConfigError, match="binac.critic_reward"):
        load_config(None, ["binac.critic_reward=vibes"])
    with pytest.raises(ConfigError, match="two-turn episodes"):
        load_config("pipelines/configs/tiny.yaml", ["run.turns=3"], preset="binac")
    with pytest.raises(ConfigError, match="has no verifier"):
        load_config("pipelines/configs/writing.yaml", ["pipeline.critic.critic=learned"])


@pytest.mark.integration
def test_the_critic_learns_and_its_engine_serves_the_checkpoint(tiny_path, tiny_tokenizer, tmp_path,
                                                                gloo_world):
    """A critic step on hand-made rows with varied rewards: a gradient, a new served version,
    the critic engine's log-prob of a fixed critique moves, and equals a fresh engine's on
    the saved critic checkpoint."""
    import ray
    import torch.distributed as dist

    from rltf_ray.config import EngineConfig, TrainerConfig
    from rltf_ray.stages.engine import start_engines
    from rltf_ray.learner import Learner
    from rltf_ray.trainer import critic_config, critic_learn_step

    ray.init(num_cpus=4, include_dashboard=False)
    try:
        engine = start_engines(tiny_path, EngineConfig(max_model_len=512), "float32", 0)[0]
        cfg = Config(trainer=TrainerConfig(bf16=False, micro_batch_size=4),
                     binac=BinacConfig(lr=1e-2, temperature=1.0), loss=LossConfig())
        critic = Learner(tiny_path, critic_config(cfg), [engine], "float32", 0)
        probe = ([1, 5, 9, 13, 17], [21, 25, 29, 33])
        before = engine_logprobs(engine, *probe)
        gen = ray.get(engine.generate.remote([[1, 5, 9, 13]], n=2, temperature=1.0, top_p=1.0, max_tokens=6))
        texts = gen["outputs"][0]
        row = {**critic_row([1.0, 0.0]), "critic_prompt_ids": [1, 5, 9, 13],
               "critic_critique_ids": [list(g.token_ids) for g in texts],
               "critic_critique_logprobs": [list(g.logprobs) for g in texts]}
        m = critic_learn_step(critic.engine, [row], cfg, 0, 0, 0, 1)
        assert m["examples_critic"] == 2 and m["critic_rl_tokens_trained"] > 0 and math.isfinite(m["loss_critic"])
        assert m["critic_logprob_abs_diff_mean"] < 1e-3  # its sampler and its learner agree
        # the critic's mismatch over its step, which the run's warning reads beside the actor's
        assert 0 <= m["critic_sampler_kl_k3"] < 1e-6 and m["critic_policy_drift_kl_k3"] == 0.0
        from rltf_ray.metrics import mismatch_warning

        warn = mismatch_warning({**m, "step": 0, "critic_sampler_kl_k3": m["critic_sampler_kl_k3"] + 2e-3},
                                1e-3, "float32", "float32")
        assert "the critic's sampler and trainer disagree: critic_sampler_kl_k3" in warn
        assert m["critic_zero_advantage_fraction"] == 0.0 and m["critic_groups"] == 1  # rewards 1 and 0
        state = critic.push()
        assert critic.version == 1 and ray.get(engine.ready.remote()) == 1
        after = engine_logprobs(engine, *probe)
        assert max(abs(a - b) for a, b in zip(before, after)) > 1e-3
        critic.save(str(tmp_path / "critic"), state, tiny_tokenizer)
        fresh = start_engines(str(tmp_path / "critic"), EngineConfig(max_model_len=512), "float32", 0)[0]
        again = engine_logprobs(fresh, *probe)
        assert max(abs(a - c) for a, c in zip(after, again)) < 1e-4
    finally:
        ray.shutdown()


@pytest.mark.integration
def test_a_critic_prompt_too_long_for_the_critics_context_is_counted_never_sent(tiny_path):
    """The long attempt's critic prompt cannot fit with max_tokens: it is skipped at once and
    marked (the episode ends, as the actor's context_overflow), while the short one in the
    same batch gets its K critiques from the engine. In that batch an item asking for one
    critique (as the held-out evaluation asks) gets one, and a bad count fails alone."""
    import asyncio
    import dataclasses

    import ray

    from rltf_ray.config import EngineConfig
    from rltf_ray.critics.base import CriticItemError
    from rltf_ray.critics.learned import OVERFLOW, LearnedCritic
    from rltf_ray.stages.engine import start_engines

    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        engines = start_engines(tiny_path, EngineConfig(max_model_len=1024), "float32", 0, name="overflow-critic")
        b = dataclasses.asdict(BinacConfig(max_tokens=16, critiques_per_attempt=2))
        critic = LearnedCritic(None, ["overflow-critic-0"], tiny_path, b, 1024)
        meta = {"answer": 5}
        items = [{"prompt": "2 + 3?", "response": "6", "meta": meta, "verdict": False},
                 {"prompt": "2 + 3?", "response": "6 " * 1200, "meta": meta, "verdict": False},
                 {"prompt": "2 + 3?", "response": "7", "meta": meta, "verdict": False, "samples": 1},
                 {"prompt": "2 + 3?", "response": "7", "meta": meta, "verdict": False, "samples": 0}]
        short, long, one, bad = asyncio.run(critic.judge(items))
        assert len(short["critic_critiques"]) == 2 and OVERFLOW not in short
        assert len(one["critic_critiques"]) == 1 and one["critique"] == one["critic_critiques"][0]
        assert isinstance(bad, CriticItemError) and "'samples' must be a positive int, got 0" in str(bad)
        assert long[OVERFLOW] > 1024 - 16 and long["critique"] == "" and "critic_critiques" not in long
        assert ray.get(engines[0].ready.remote()) == 0
    finally:
        ray.shutdown()


@pytest.mark.integration
@pytest.mark.slow  # ~4-8 min on 2 cores: `make test-all`
def test_binac_runs_two_steps_with_the_bilevel_term_and_a_critic_of_another_vocabulary(tmp_path, tiny_path,
                                                                                      tiny_wide_path, capfd):
    """The paper's preset, 1:1 alternating, the reference refreshed every version; the actor's
    pad id (512) is outside the critic's vocabulary (0..511), so the critic must pad with its own."""
    from rltf_ray.runner import Pipeline

    cfg = load_config("pipelines/configs/tiny.yaml",
                      [f"run.output_dir={tmp_path}", "run.steps=2", "run.eval_before_after=false",
                       f"model.path={tiny_wide_path}", f"binac.critic_model={tiny_path}",
                       "run.serve_http_port=8171", "binac.actor_steps=1", "binac.critic_steps=1",
                       "binac.reference_every=1", "binac.format_penalty=0.0", "run.checkpoint_every=1",
                       "loss.sampler_kl_warn=1e-15"],  # below any rounding: every step warns
                      preset="binac")
    assert cfg.binac.bilevel_lambda == 1.0 and cfg.binac.schedule == "alternate"
    summary = Pipeline(cfg).run()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["policy_version"] for m in lines] == [1, 1]  # alternating: the actor at step 0
    assert [m["critic_version"] for m in lines] == [0, 1]  # the critic at step 1
    assert [m["actor_trained"] for m in lines] == [True, False] and "loss_critic" in lines[1]
    assert summary["critic_engine_versions"] == [1]
    assert [undocumented_keys(m, "metrics.jsonl") for m in lines] == [[], []]  # docs/metrics.md
    assert undocumented_keys(summary, "summary.json") == []
    # step 2 trained only the critic: its mismatch, read by the warning (at steps 1, 3, ...)
    assert lines[1]["critic_sampler_kl_k3"] > 1e-15 and "sampler_kl_k3" not in lines[1]
    assert "the critic's sampler and trainer disagree: critic_sampler_kl_k3" in capfd.readouterr().out
    # the weights each model started from, told apart (the two models differ)
    sha = {name: hashlib.sha256(Path(p, "model.safetensors").read_bytes()).hexdigest()
           for name, p in (("actor", tiny_wide_path), ("critic", tiny_path))}
    assert summary["weights_sha256"] == {k: {"model.safetensors": v} for k, v in sha.items()}
    assert sha["actor"] != sha["critic"]
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "rollouts" / "step_1.parquet").to_pylist()
    critiqued = [r for r in rows if r["critic_critiques"]]
    assert critiqued and len(critiqued) == sum(not r["correct_first"] for r in rows)  # early termination
    for r in critiqued:  # K = 2 critiques, M = 1 revision each by both actors
        assert len(r["critic_critiques"]) == 2 and r["critique"] == r["critic_critiques"][0]
        assert len(r["critic_revisions"]) == 2 == len(r["critic_reference_revisions"])
        assert len(r["critic_reference_rewards"]) == 2 == len(r["critic_revision_correct"])
        assert r["critic_revisions"][0] == r["revision"] and r["critic_version"] == 0
    # the reference is version 1 at step 1 (refreshed every version), the current too: the
    # terms come from the same weights, and the row's metrics are built from them
    assert lines[1]["critic_reward_reference_mean"] is not None and "critic_fix_rate" in lines[1]
    # the degeneracy guards' metrics, from the same rows
    from rltf_ray.metrics import identical_pair_fraction

    assert lines[1]["critic_identical_pair_fraction"] == identical_pair_fraction(
        [r["critic_critique_ids"] for r in critiqued])
    assert lines[1]["critic_groups"] == len(critiqued) and 0.0 <= lines[1]["critic_zero_advantage_fraction"] <= 1.0
    # the critic's reward is what its rows give, and no critic prompt overflowed here
    from rltf_ray.critic_examples import critic_row_rewards

    rewards = [x for r in critiqued for x in critic_row_rewards(r, cfg.binac)]
    assert lines[1]["critic_reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
    assert lines[1]["critic_context_overflow"] == 0
    fmt = [f for r in critiqued for f in r["critic_format_ok"]]
    assert lines[1]["critiques"] == 2 * len(critiqued) and lines[1]["critic_format_ok"] == pytest.approx(
        sum(fmt) / len(fmt))  # the share of critiques with a verdict line, from the rows
    assert (tmp_path / "checkpoints" / "step_2" / "critic" / "config.json").is_file()
