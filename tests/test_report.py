"""The comparison report: paired differences by seed, rebuilt from run folders alone."""
import json
import math

import pytest

from conftest import undocumented_keys
from rltf_ray.report import finished_runs, paired, write_report


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


def test_a_run_stopped_by_the_dead_critic_guard_is_listed_not_paired(tmp_path):
    from rltf_ray.errors import STOPPED_FILE

    run_dir(tmp_path, "fixed_critic", 0, 0.0, 0.1)
    run_dir(tmp_path, "binac", 0, 0.0, 0.3)
    d = tmp_path / "runs" / "binac_s1"
    d.mkdir()
    (d / STOPPED_FILE).write_text(json.dumps({"stopped_by": "dead_critic", "error": "step 3: 3 critic updates"}))
    assert [(r["preset"], r["seed"]) for r in finished_runs(tmp_path)] == [("binac", 0), ("fixed_critic", 0)]
    write_report(tmp_path, "t", "fixed_critic")
    assert ("Stopped by a guard (not in the tables above):\n- binac_s1: stopped by the dead-critic guard: "
            "step 3: 3 critic updates\n") in (tmp_path / "runs.md").read_text()
