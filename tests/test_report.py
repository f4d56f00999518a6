"""The comparison report: paired differences by seed, rebuilt from run folders alone."""
import json
import math

import pytest

from conftest import undocumented_keys
from rltf_ray.report import finished_runs, guard_stopped_runs, paired, stopped_endpoint, verdict, write_report


def run_dir(root, preset, seed, before, after, steps=2):
    d = root / "runs" / f"{preset}_s{seed}"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"before": {"greedy_accuracy": before, "problems": 64},
                                                "after": {"greedy_accuracy": after, "problems": 64}}))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "samples_seen": 32 * (s + 1),
                                                         "first_turn_accuracy": 0.0, "seconds_step": 60.0})
                                             + "\n" for s in range(steps)))
    return d


def test_paired_differences_by_seed(tmp_path):
    after = {("grpo_single", 0): 0.10, ("grpo_single", 1): 0.20, ("grpo_single", 2): 0.00,
             ("rltf_sd", 0): 0.40, ("rltf_sd", 1): 0.40, ("rltf_sd", 2): 0.40, ("rltf_fm", 1): 0.25}
    for (p, s), a in after.items():
        run_dir(tmp_path, p, s, 0.0, a)
    run_dir(tmp_path, "rltf_sd", 3, 0.0, 0.9).joinpath("summary.json").unlink()  # unfinished: left out
    runs = finished_runs(tmp_path)
    assert [(r["preset"], r["seed"]) for r in runs][:3] == [("grpo_single", 0), ("rltf_sd", 0), ("grpo_single", 1)]
    sd, fm = paired(runs, "grpo_single")
    assert (sd["preset"], sd["seeds"]) == ("rltf_sd", [0, 1, 2])
    assert sd["diffs"] == pytest.approx([0.3, 0.2, 0.4])
    # mean 0.3; sample sd 0.1; SE 0.1 / sqrt(3); t = 0.3 / (0.1 / sqrt(3)) = 3 sqrt(3)
    assert sd["mean"] == pytest.approx(0.3) and sd["se"] == pytest.approx(0.1 / math.sqrt(3))
    assert sd["t"] == pytest.approx(3 * math.sqrt(3))
    assert (fm["preset"], fm["seeds"], fm["diffs"]) == ("rltf_fm", [1], pytest.approx([0.05]))
    text = write_report(tmp_path, "t", "grpo_single")
    assert ("| rltf_sd | grpo_single | 3 | +0.300 | 0.058 | 5.20 | s0: +0.300, s1: +0.200, s2: +0.400 | yes |"
            in text)
    assert "| rltf_fm | grpo_single | 1 | +0.050 | - | - | s1: +0.050 | no |" in text  # one seed: no SE, no t
    assert math.isnan(fm["se"]) and math.isnan(fm["t"])
    lines = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert [undocumented_keys(json.loads(x), "runs.jsonl") for x in lines] == [[]] * 7  # docs/metrics.md
    assert len(lines) == 7 and (tmp_path / "curves.png").stat().st_size > 0


def test_variants_pair_with_their_own_baseline_and_records_carry_provenance(tmp_path):
    """compare.py --variant V names run folders <preset>.V_s<seed>."""
    after = {("grpo_single.tis", 0): 0.1, ("rltf_sd.tis", 0): 0.5, ("grpo_single.tis", 1): 0.2,
             ("rltf_sd.tis", 1): 0.4, ("grpo_single.fp32", 0): 0.6, ("rltf_sd.fp32", 0): 0.7,
             ("grpo_single.fp32", 1): 0.5, ("rltf_sd.fp32", 1): 0.8}
    for (p, s), a in after.items():
        d = run_dir(tmp_path, p, s, 0.0, a)
        summary = json.loads((d / "summary.json").read_text())
        summary["provenance"] = {"commit": "abc", "engine_dtype": "float32" if "fp32" in p else "bfloat16",
                                 "learner_dtype": "float32", "lr": 1e-5, "loss": {"rollout_correction": "tis_token"}}
        (d / "summary.json").write_text(json.dumps(summary))
    runs = finished_runs(tmp_path)
    by = {(r["preset"], r["seed"]): r for r in runs}
    assert by[("rltf_sd.fp32", 1)]["variant"] == "fp32" and by[("rltf_sd.tis", 0)]["engine_dtype"] == "bfloat16"
    assert by[("grpo_single.tis", 0)]["commit"] == "abc" and by[("grpo_single.tis", 0)]["lr"] == 1e-5
    rows = {r["preset"]: r for r in paired(runs, "grpo_single")}
    assert set(rows) == {"rltf_sd.tis", "rltf_sd.fp32"}
    assert rows["rltf_sd.tis"]["baseline"] == "grpo_single.tis" and rows["rltf_sd.tis"]["diffs"] == pytest.approx([0.4, 0.2])
    assert rows["rltf_sd.fp32"]["baseline"] == "grpo_single.fp32" and rows["rltf_sd.fp32"]["diffs"] == pytest.approx([0.1, 0.3])
    assert "| rltf_sd.fp32 | grpo_single.fp32 | 2 | +0.200 |" in write_report(tmp_path, "t", "grpo_single")


def test_the_critics_fix_rate_is_pooled_over_each_half_of_the_run(tmp_path):
    from rltf_ray.report import fix_rate_halves

    steps = [{"critic_fix_rate": 0.5, "critic_fix_revisions": 2}, {"critic_fix_rate": 0.0, "critic_fix_revisions": 6},
             {"critic_fix_rate": None, "critic_fix_revisions": 0}, {"critic_fix_rate": 0.75, "critic_fix_revisions": 4}]
    assert fix_rate_halves(steps) == pytest.approx([1 / 8, 0.75])  # (1 + 0) / 8; 3 / 4
    assert fix_rate_halves([{"step": 0}, {"step": 1}]) is None  # no learned critic
    d = run_dir(tmp_path, "binac", 0, 0.0, 0.5, steps=4)
    (d / "metrics.jsonl").write_text("".join(json.dumps({**m, "step": s, "samples_seen": 32 * (s + 1),
                                                         "first_turn_accuracy": 0.0, "seconds_step": 1.0}) + "\n"
                                             for s, m in enumerate(steps)))
    text = write_report(tmp_path, "t")
    assert "critic fix rate, 1st half | 2nd half | 2nd - 1st" in text
    assert "| 0.125 (1 seed) | 0.750 (1 seed) | 0.625 (1 seed) |" in text


def test_runs_table_and_the_paired_curve_from_in_run_evaluations(tmp_path):
    from rltf_ray.report import paired_curve

    # (preset, seed): held-out greedy accuracy after step 1 and after step 2 (the last step)
    evals = {("grpo_single", 0): (0.1, 0.5), ("grpo_single", 1): (0.2, 0.6),
             ("rltf_sd", 0): (0.6, 0.75), ("rltf_sd", 1): (0.4, 0.6)}
    for (p, s), (mid, end) in evals.items():
        d = run_dir(tmp_path, p, s, 0.0, end)
        (d / "summary.json").write_text(json.dumps({
            "before": {"greedy_accuracy": 0.0, "feedback_accuracy_1": 0.5, "problems": 64},
            "after": {"greedy_accuracy": end, "feedback_accuracy_1": 0.9, "problems": 64},
            **({"weights_sha256": {"actor": {"model.safetensors": "7c4144c2" + "0" * 56},
                                   "critic": {"model.safetensors": "a0942659" + "1" * 56}}} if s == 1 else {})}))
        (d / "metrics.jsonl").write_text("".join(json.dumps(
            {"step": k, "samples_seen": 32 * (k + 1), "first_turn_accuracy": 0.0, "seconds_step": 30.0 + 60 * k,
             "seconds_rollout": 10.0, "seconds_train": 15.0 + 60 * k, "seconds_sync": 1.0,
             "eval": {"greedy_accuracy": acc}}) + "\n" for k, acc in enumerate((mid, end))))
    runs = finished_runs(tmp_path)
    # before, step 1, step 2; the after-evaluation is the step-2 point, not a fourth one
    assert [p["samples_seen"] for p in runs[0]["curve"]] == [0, 32, 64]
    text = write_report(tmp_path, "t", "grpo_single")
    assert "| run | before (p0 / p1) | 32 samples | after (p1) | minutes in steps |" in text
    # 30 + 90 s of steps = 2.0 minutes; a step's mean: 60 s (10 rollout, 45 learner, 1 sync)
    assert "| rltf_sd s0 | 0.000 / 0.500 | 0.600 | 0.750 (0.900) | 2.0 | 60.0 (10.0, 45.0, 1.0) | not recorded |" in text
    # the weights each run started from, by their hashes' first 8 hex digits
    assert "| 2.0 | 60.0 (10.0, 45.0, 1.0) | actor 7c4144c2 / critic a0942659 |" in text
    curve = {(c["preset"], c["samples_seen"]): c for c in paired_curve(runs, "grpo_single")}
    # seed differences at 32 samples: +0.5 and +0.2 (mean 0.35, SE 0.15); at 64: +0.25 and 0.0
    assert curve[("rltf_sd", 32)]["mean"] == pytest.approx(0.35)
    assert curve[("rltf_sd", 32)]["se"] == pytest.approx(0.15)
    assert curve[("rltf_sd", 64)]["mean"] == pytest.approx(0.125)
    assert "| rltf_sd | +0.000 (0.000) | +0.350 (0.150) | +0.125 (0.125) |" in text


def test_the_gain_line_pairs_by_problem_and_says_where_it_stands():
    from rltf_ray.metrics import gain_line

    before = {"greedy_accuracy": 0.25, "greedy_accuracy_se": 0.25, "greedy_correct": [0, 0, 1, 0]}
    after = {"greedy_accuracy": 0.75, "greedy_accuracy_se": 0.25, "greedy_correct": [1, 1, 1, 0]}
    # differences 1, 1, 0, 0: mean 0.5, sample sd 0.5774, SE 0.2887
    assert gain_line(before, after) == ("held-out greedy first try: 0.250 before, 0.750 after training: "
                                        "+0.500 (SE 0.289, paired by problem; within 2 SE)")
    unpaired = gain_line({**before, "greedy_correct": None}, {**after, "greedy_accuracy": 1.0})
    assert unpaired.endswith("+0.750 (SE 0.354, unpaired; more than 2 SE)")


def stopped_dir(root, preset, seed, evals=(), error="step 3: 3 critic updates"):
    """A run folder as the dead-critic guard leaves it: stopped.json and the metrics rows it
    wrote, `evals` being the held-out evaluations on the way ({step: eval}), no summary.json."""
    from rltf_ray.errors import STOPPED_FILE

    d = root / "runs" / f"{preset}_s{seed}"
    d.mkdir(parents=True)
    (d / STOPPED_FILE).write_text(json.dumps({"stopped_by": "dead_critic", "error": error}))
    evals = dict(evals)
    (d / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "samples_seen": 32 * (s + 1), **({"eval": evals[s]} if s in evals else {})}) + "\n"
        for s in range(max(evals, default=1) + 1)))
    return d


def test_a_run_stopped_by_the_dead_critic_guard_is_listed_and_counted_against_its_preset(tmp_path):
    """The survivor bias: three seeds where binac beats fixed_critic by +0.5 on the two that
    finished; seed 1's binac was stopped after one evaluation (0.05). Left out, the verdict
    would rest on the survivors; counted at its last evaluation, the difference on seed 1 is
    0.05 - 0.40 and the test is not shown."""
    for s, base in enumerate((0.10, 0.40, 0.20)):
        run_dir(tmp_path, "fixed_critic", s, 0.0, base)
    run_dir(tmp_path, "binac", 0, 0.0, 0.60)
    run_dir(tmp_path, "binac", 2, 0.0, 0.70)
    stopped_dir(tmp_path, "binac", 1, {1: {"greedy_accuracy": 0.30}, 3: {"greedy_accuracy": 0.05}})
    assert [(r["preset"], r["seed"]) for r in finished_runs(tmp_path)] == [
        ("binac", 0), ("fixed_critic", 0), ("fixed_critic", 1), ("binac", 2), ("fixed_critic", 2)]
    halted = guard_stopped_runs(tmp_path)
    assert [(r["preset"], r["seed"], r["steps"]) for r in halted] == [("binac", 1, 4)]
    assert stopped_endpoint(halted[0]) == 0.05  # the last evaluation, not the best one
    (row,) = paired(finished_runs(tmp_path), "fixed_critic", stopped=halted)
    assert row["seeds"] == [0, 1, 2] and row["stopped_seeds"] == [1] and row["baseline_stopped_seeds"] == []
    assert row["diffs"] == pytest.approx([0.5, -0.35, 0.5])
    assert row["mean"] == pytest.approx(0.65 / 3)
    # without the stopped run the two survivors give +0.5 with SE 0: "shown"
    (survivors,) = paired(finished_runs(tmp_path), "fixed_critic")
    assert survivors["seeds"] == [0, 2] and verdict(survivors) == "yes"
    assert verdict(row) == "no (1 of 3 runs stopped by a guard, counted)"
    write_report(tmp_path, "t", "fixed_critic")
    md = (tmp_path / "paired.md").read_text()
    assert "| binac | fixed_critic | 3 | +0.217 |" in md
    assert "s0: +0.500, s1: -0.350 (stopped), s2: +0.500 | no (1 of 3 runs stopped by a guard, counted) |" in md
    assert "counts against its preset, never as absent" in md
    assert ("Stopped by a guard (not in the table above; paired.md counts each against its preset):\n"
            "- binac_s1: stopped by the dead-critic guard: step 3: 3 critic updates\n") in (tmp_path / "runs.md").read_text()


def test_a_stopped_run_without_an_evaluation_counts_0_and_a_stopped_baseline_decides_nothing(tmp_path):
    for s in range(3):
        run_dir(tmp_path, "grpo_single", s, 0.0, 0.10)
    run_dir(tmp_path, "rltf_sd", 0, 0.0, 0.90)
    run_dir(tmp_path, "rltf_sd", 2, 0.0, 0.90)
    stopped_dir(tmp_path, "rltf_sd", 1)  # stopped before any held-out evaluation: 0
    halted = guard_stopped_runs(tmp_path)
    assert stopped_endpoint(halted[0]) == 0.0 and stopped_endpoint(halted[0], "feedback_accuracy_1") == 0.0
    (row,) = paired(finished_runs(tmp_path), "grpo_single", stopped=halted)
    assert row["diffs"] == pytest.approx([0.8, -0.1, 0.8])
    # mean 0.5, SE 0.3, t 1.67: not shown, the stopped run counted
    assert row["se"] == pytest.approx(0.3) and verdict(row).startswith("no (1 of 3 runs stopped")

    # a baseline run that a guard stopped would count *for* the preset: the test is not decided
    base = tmp_path / "b"
    for s in range(3):
        run_dir(base, "binac", s, 0.0, 0.80 + 0.01 * s)
    run_dir(base, "fixed_critic", 0, 0.0, 0.20)
    run_dir(base, "fixed_critic", 1, 0.0, 0.25)
    stopped_dir(base, "fixed_critic", 2, {5: {"greedy_accuracy": 0.22}})
    (row,) = paired(finished_runs(base), "fixed_critic", stopped=guard_stopped_runs(base))
    assert row["baseline_stopped_seeds"] == [2] and row["t"] > 3 and row["mean"] > 0.10
    assert verdict(row) == "no (not decided: 1 of 3 baseline runs stopped by a guard)"
    write_report(base, "t", "fixed_critic")
    assert "s2: +0.600 (baseline stopped)" in (base / "paired.md").read_text()


def test_a_summary_records_where_the_final_weights_are_and_their_hashes(tmp_path):
    """What `Pipeline.end` writes into summary.json: the actor's last checkpoint and the
    trained critic's beside it; a frozen critic's final weights are the ones it started from."""
    import hashlib

    from rltf_ray.runner import final_weights

    last = tmp_path / "run" / "checkpoints" / "step_12"
    (last / "critic").mkdir(parents=True)
    (last / "model.safetensors").write_bytes(b"actor after")
    (last / "critic" / "model.safetensors").write_bytes(b"critic after")
    start = tmp_path / "critic_warm"
    start.mkdir()
    (start / "model.safetensors").write_bytes(b"critic before")
    sha = lambda b: {"model.safetensors": hashlib.sha256(b).hexdigest()}  # noqa: E731
    got = final_weights(tmp_path / "run", 12, str(start), critic_trains=True)
    assert got == {"actor": {"path": str(last), "sha256": sha(b"actor after")},
                   "critic": {"path": str(last / "critic"), "sha256": sha(b"critic after")}}
    frozen = final_weights(tmp_path / "run", 12, str(start), critic_trains=False)
    assert frozen["critic"] == {"path": str(start), "sha256": sha(b"critic before")}
    assert final_weights(tmp_path / "run", 12, None, False) == {"actor": got["actor"]}
    assert final_weights(tmp_path / "run", 6, None, False)["actor"]["sha256"] is None  # no such checkpoint
    run_dir(tmp_path, "binac", 0, 0.0, 0.5)
    summary = tmp_path / "runs" / "binac_s0" / "summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "final_weights": got}))
    assert finished_runs(tmp_path)[0]["final_weights"] == got  # runs.jsonl carries them
