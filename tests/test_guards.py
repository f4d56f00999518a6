"""The guards against runs that train on nothing and say nothing: the critique-failure bound
over every request, the learned critic's dead updates and identical critiques, the
sampler-mismatch warning, and their config errors."""
import pytest

from rltf_ray.config import ConfigError
from rltf_ray.graph import CritiqueParams
from rltf_ray.loading import load_config
from rltf_ray.metrics import dead_critic_update, identical_pair_fraction, mismatch_warning
from rltf_ray.critic_examples import build_critic_examples
from rltf_ray.stages.critique import CriticFailure, check_critique_failures

TINY = "pipelines/configs/tiny.yaml"


def test_every_critic_request_counts_toward_the_failure_bound():
    p = CritiqueParams(max_failed_fraction=0.25)
    # 4 critiques asked: 2 revised, 1 of a correct answer (a learned critic's), 1 whose revision
    # overflowed (not revised); 1 of them failed. Only revised rows counted before: 1 of 3.
    rows = [dict(critique_asked=True, critique_failed=False, revised=True),
            dict(critique_asked=True, critique_failed=False, revised=True),
            dict(critique_asked=True, critique_failed=False, revised=False),
            dict(critique_asked=True, critique_failed=True, critique_error="TimeoutError: x", revised=False),
            dict(critique_asked=False, critique_failed=False, revised=False)]
    check_critique_failures(rows, p, 1, 0)  # 1 of 4 = 0.25: not above the bound
    rows[2]["critique_failed"] = True
    rows[2]["critique_error"] = "ValueError: y"
    with pytest.raises(CriticFailure, match=r"2 of 4 requests .* first error: ValueError: y"):
        check_critique_failures(rows, p, 1, 3)


def test_a_dead_judge_stops_a_single_turn_run():
    """A task without a verifier in a single-turn run: every first answer's verdict is a request."""
    rows = [dict(critique_asked=True, critique_failed=True, critique_error="ConnectionError: judge down")
            for _ in range(4)]
    with pytest.raises(CriticFailure, match="4 of 4 requests.*ConnectionError: judge down"):
        check_critique_failures(rows, CritiqueParams(), 1, 0)


def test_failed_verdicts_on_revisions_count_too():
    rows = [dict(critique_asked=True, reward_asked=True, reward_failed=True) for _ in range(2)]
    with pytest.raises(CriticFailure, match="2 of 4 requests.*a verdict on a revision"):
        check_critique_failures(rows, CritiqueParams(max_failed_fraction=0.2), 1, 0)


def test_identical_pairs():
    assert identical_pair_fraction([[[1, 2], [1, 2]], [[1], [3]]]) == 0.5
    assert identical_pair_fraction([[[1, 2], [1, 2], [1, 2]]]) == 1.0  # 3 pairs, all alike
    assert identical_pair_fraction([[[1]]]) is None


def critic_row(rewards_of_revisions, critiques):
    k = len(critiques)
    return dict(reward_first=0.0, correct_first=False, critic_critiques=["c"] * k,
                critic_revision_rewards=rewards_of_revisions, critic_verdicts=[False] * k,
                critic_format_ok=[True] * k, critic_prompt_ids=[1, 2], critic_critique_ids=critiques,
                critic_critique_logprobs=[[-1.0] * len(c) for c in critiques])


def test_zero_advantage_fraction_of_a_critic_update():
    cfg = load_config(TINY, preset="binac")
    rows = [critic_row([1.0, 0.0], [[5], [6]]), critic_row([1.0, 1.0], [[5], [6]]),
            critic_row([0.0, 0.0], [[7], [7]])]
    ex, stats = build_critic_examples(rows, cfg)
    assert stats["critic_zero_advantage_fraction"] == pytest.approx(2 / 3) and stats["critic_groups"] == 3
    assert [e.adv for e in ex[:2]] == [0.5, -0.5]
    _, stats = build_critic_examples([], cfg)
    assert stats["critic_zero_advantage_fraction"] is None


def test_the_cause_of_a_dead_critic_update():
    assert dead_critic_update({"critic_trained": False}) is None
    assert dead_critic_update({"critic_trained": True, "critic_zero_advantage_fraction": 0.5}) is None
    same = dead_critic_update({"critic_trained": True, "critic_zero_advantage_fraction": 1.0,
                               "critic_identical_pair_fraction": 1.0})
    assert "identical (100% of pairs)" in same and "binac.temperature" in same
    flat = dead_critic_update({"critic_trained": True, "critic_zero_advantage_fraction": 1.0,
                               "critic_identical_pair_fraction": 0.1})
    assert "saturated" in flat
    # nothing to critique (every first answer right) is the actor's success, not a dead critic
    assert dead_critic_update({"critic_trained": True, "critic_unscored_groups": 0}) is None
    assert "every critiqued attempt (3) had a critique or a revision that failed" in dead_critic_update(
        {"critic_trained": True, "critic_unscored_groups": 3})
    assert "too long for the critic's context" in dead_critic_update(
        {"critic_trained": True, "critic_unscored_groups": 0, "critic_context_overflow": 4})


def test_an_actor_that_answers_every_batch_right_does_not_stop_the_run():
    from types import SimpleNamespace

    from rltf_ray.steps import StepRunner

    runner = SimpleNamespace(cfg=load_config(TINY, ["binac.max_dead_updates=1"], preset="binac"))
    _, stats = build_critic_examples([dict(reward_first=1.0, correct_first=True, critic_critiques=[])],
                                     runner.cfg)
    for step in range(3):  # no attempt critiqued: no groups, nothing failed
        StepRunner.check_critic_update(runner, {"step": step, "critic_trained": True, **stats})


@pytest.mark.parametrize("reward,k", [(-0.9, 3), (-0.1, 8), (-0.9, 6)])
def test_equal_critique_rewards_are_a_dead_group_whatever_float_rounding_leaves(reward, k):
    """K critiques whose revisions all score `reward`: their mean differs from each by float
    rounding (for -0.9 x 3 the deviations are ~6e-8), which is no signal."""
    cfg = load_config(TINY, ["binac.format_penalty=null"], preset="binac")
    rows = [critic_row([reward] * k, [[5 + i] for i in range(k)])]
    ex, stats = build_critic_examples(rows, cfg)
    assert stats["critic_zero_advantage_fraction"] == 1.0
    assert all(e.adv == 0.0 for e in ex)


def test_bad_guard_settings_are_refused():
    with pytest.raises(ConfigError, match=r"binac.critiques_per_attempt=1 with binac.critic_steps=1"):
        load_config(TINY, ["binac.critiques_per_attempt=1", "binac.critic_steps=1"], preset="binac")
    with pytest.raises(ConfigError, match="binac.max_dead_updates: must be >= 1"):
        load_config(TINY, ["binac.max_dead_updates=0"], preset="binac")
    assert load_config(TINY, preset="fixed_critic").binac.critiques_per_attempt == 1  # frozen: allowed


def test_the_mismatch_warning_names_the_cause_and_the_fix():
    m = {"step": 2, "sampler_kl_k3": 0.004, "logprob_abs_diff_mean": 0.08, "logprob_abs_diff_max": 1.2,
         "rollout_correction": "tis_token"}
    text = mismatch_warning(m, 1e-3, "bfloat16", "float32")
    assert text.startswith("WARNING step 3") and "4.00e-03" in text
    assert "samples in bfloat16 while the learner computes in float32" in text and "trainer.bf16 unset" in text
    assert "different kernels" in mismatch_warning(m, 1e-3, "float32", "float32")
    assert mismatch_warning(m, 1e-2, "bfloat16", "float32") is None
    assert mismatch_warning({"step": 0, "sampler_kl_k3": None}, 1e-3, "bfloat16", "float32") is None
    # the learned critic's own mismatch is read too
    critic = mismatch_warning({"step": 0, "sampler_kl_k3": 1e-4, "critic_sampler_kl_k3": 0.18,
                               "critic_logprob_abs_diff_mean": 0.2}, 1e-3, "bfloat16", "bfloat16")
    assert "the critic's sampler and trainer disagree: critic_sampler_kl_k3 1.80e-01" in critic


def test_consecutive_dead_critic_updates_stop_the_run():
    from types import SimpleNamespace

    from rltf_ray.errors import DeadCriticError
    from rltf_ray.steps import StepRunner

    runner = SimpleNamespace(cfg=load_config(TINY, ["binac.max_dead_updates=2"], preset="binac"))
    dead = {"step": 0, "critic_trained": True, "critic_zero_advantage_fraction": 1.0,
            "critic_identical_pair_fraction": 1.0}
    StepRunner.check_critic_update(runner, dead)  # 1 of 2: a warning
    StepRunner.check_critic_update(runner, {**dead, "step": 1, "critic_trained": False})  # no update
    assert runner.dead_updates == 1
    StepRunner.check_critic_update(runner, {**dead, "step": 2, "critic_zero_advantage_fraction": 0.5})
    assert runner.dead_updates == 0  # an update that trained on something resets the count
    StepRunner.check_critic_update(runner, {**dead, "step": 3})
    with pytest.raises(DeadCriticError, match=r"step 5: 2 critic updates in a row .* identical \(100% of pairs\)"):
        StepRunner.check_critic_update(runner, {**dead, "step": 4})



def test_the_feedback_gap_verdict():
    from rltf_ray.check import gap_se, verdict

    assert gap_se(0.5, 5) == pytest.approx((0.25 / 4) ** 0.5)  # binary per-problem differences
    assert verdict(0.03, 0.69, 64).startswith("yes: one critique lifts accuracy from 0.030 to 0.690")
    assert verdict(0.30, 0.33, 64).startswith("not yet") and "rltf-ray warmstart --revision-demos" in verdict(0.3, 0.33, 64)
    assert verdict(0.90, 0.99, 64).startswith("little room")


def test_a_run_the_dead_critic_guard_stops_is_recorded_and_a_comparison_goes_on(tmp_path, monkeypatch, capsys):
    """The command line turns the guard's error into stopped.json and exit 3; a comparison
    reports such a run, goes on with the next, and does not run it again on resume."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    import rltf_ray.runner
    from rltf_ray.cli import run_main
    from rltf_ray.errors import DEAD_CRITIC_EXIT, STOPPED_FILE, DeadCriticError

    def dead(cfg):
        raise DeadCriticError("step 4: 3 critic updates in a row had every advantage 0")

    monkeypatch.setattr(rltf_ray.runner, "run", dead)
    out = tmp_path / "run"
    assert run_main(["--config", "tiny", f"run.output_dir={out}"]) == DEAD_CRITIC_EXIT
    assert json.loads((out / STOPPED_FILE).read_text()) == {
        "stopped_by": "dead_critic", "error": "step 4: 3 critic updates in a row had every advantage 0"}

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "pipelines"))
    import compare

    def fake_run(cmd, stdout, stderr, rc=DEAD_CRITIC_EXIT, stopped=True, **kwargs):
        out_dir = Path(next(a for a in cmd if a.startswith("run.output_dir=")).partition("=")[2])
        out_dir.mkdir(parents=True, exist_ok=True)
        if stopped:
            (out_dir / STOPPED_FILE).write_text(json.dumps({"stopped_by": "dead_critic", "error": "why"}))
        return SimpleNamespace(returncode=rc)

    monkeypatch.setattr(subprocess, "run", fake_run)
    argv = ["--config", "tiny", "--presets", "binac", "--seeds", "2", "--name", "c", "--results", str(tmp_path)]
    assert compare.main(argv) == 0  # both seeds stopped: reported, and the comparison finished
    said = capsys.readouterr().out
    assert said.count("STOPPED by the dead-critic guard: why") == 2
    assert "- binac_s1: stopped by the dead-critic guard: why" in said  # the report lists them
    assert compare.main(argv) == 0 and "2 runs, 2 already finished" in capsys.readouterr().out
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: fake_run(*a, **k, rc=1, stopped=False))
    (tmp_path / "c" / "runs" / "binac_s0" / STOPPED_FILE).unlink()
    (tmp_path / "c" / "runs" / "binac_s0.log").write_text("Traceback: a crash\n")
    with pytest.raises(SystemExit, match="binac seed 0 failed \\(exit 1\\)"):  # any other failure stops it
        compare.main(argv)
