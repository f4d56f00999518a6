"""The comparison report: paired differences by seed, rebuilt from run folders alone."""
import json
import math

import pytest

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
    assert "| rltf_sd | 3 | +0.300 | 0.058 | 5.20 | s0: +0.300, s1: +0.200, s2: +0.400 | yes |" in text
    assert "| rltf_fm | 1 | +0.050 | - | - | s1: +0.050 | no |" in text  # one seed: no SE, no t
    assert math.isnan(fm["se"]) and math.isnan(fm["t"])
    lines = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 7 and (tmp_path / "curves.png").stat().st_size > 0


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
