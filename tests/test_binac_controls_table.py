"""The registered Bi-NAC controls' decision rules (docs/scripts/binac_controls_table.py) on
hand-made records: the temperature chosen on the calibration split, the primary at the chosen
temperatures, the split of the gain between critic and actor, and stopped runs."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def table():
    spec = importlib.util.spec_from_file_location("binac_controls_table",
                                                  ROOT / "docs" / "scripts" / "binac_controls_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(root, name, system=None, stopped_evals=None):
    d = root / "runs" / name
    d.mkdir(parents=True)
    if stopped_evals is None:
        (d / "summary.json").write_text(json.dumps({"after": {"greedy_accuracy": 0.0, "feedback_accuracy_1": system}}))
        (d / "metrics.jsonl").write_text(json.dumps({"step": 0, "samples_seen": 32, "first_turn_accuracy": 0.0}) + "\n")
    else:
        (d / "stopped.json").write_text(json.dumps({"stopped_by": "dead_critic", "error": "x"}))
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "samples_seen": 32, **({"eval": e} if e else {})})
                                                 + "\n" for s, e in enumerate(stopped_evals)))


def evaluation(root, split, actor, critic, tag, seed, system):
    d = root / "evals" / split
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{actor}__{critic}__{tag}_s{seed}.json").write_text(json.dumps({"feedback_accuracy_1": system}))


def test_temperatures_are_chosen_on_calibration_and_the_gain_is_split_exactly(tmp_path, capsys):
    t = table()
    # calibration: the frozen critic is best greedy (0.50 mean), the trained one at 0.5 (0.80)
    for s in range(3):
        for tag, v in (("t0", 0.50), ("t05", 0.40), ("t1", 0.30)):
            evaluation(tmp_path, "calibration", f"fixed_critic.{tag}", "frozen", tag, s, v + 0.01 * s)
        for tag, v in (("t0", 0.70), ("t05", 0.80), ("t1", 0.75)):
            evaluation(tmp_path, "calibration", "binac", "trained", tag, s, v)
        # held-out: each run's own after-evaluation at its own temperature
        for tag, v in (("t0", 0.40), ("t05", 0.35), ("t1", 0.30)):
            run(tmp_path, f"fixed_critic.{tag}_s{s}", v)
        run(tmp_path, f"binac_s{s}", 0.78)
        evaluation(tmp_path, "test", "binac", "trained", "t0", s, 0.70)
        evaluation(tmp_path, "test", "binac", "trained", "t05", s, 0.80 + 0.02 * s)
        # the cross-evaluations at the chosen temperatures (frozen t0, trained t05)
        evaluation(tmp_path, "test", "binac", "frozen", "t0", s, 0.45)            # trained actor, frozen critic
        evaluation(tmp_path, "test", "fixed_critic.t0", "trained", "t05", s, 0.70 + 0.05 * s)  # the reverse
    runs, evals = t.load_runs(tmp_path), t.load_evals(tmp_path)
    assert t.choices(runs, evals) == (0.0, 0.5)
    assert t.main([str(tmp_path), "--choice"]) == 0 and capsys.readouterr().out == "0.0 0.5\n"
    gain = t.split_gain(runs, evals, 0.0, 0.5)
    # per seed: bb = 0.80 + 0.02 s, ff = 0.40, bf = 0.45, fb = 0.70 + 0.05 s
    assert [gain["primary"]["per_seed"][s] for s in range(3)] == pytest.approx([0.40, 0.42, 0.44])
    critic = [((0.70 + 0.05 * s - 0.40) + (0.80 + 0.02 * s - 0.45)) / 2 for s in range(3)]
    actor = [((0.45 - 0.40) + (0.80 + 0.02 * s - 0.70 - 0.05 * s)) / 2 for s in range(3)]
    assert [gain["critic"]["per_seed"][s] for s in range(3)] == pytest.approx(critic)
    assert [gain["actor"]["per_seed"][s] for s in range(3)] == pytest.approx(actor)
    assert [c + a for c, a in zip(critic, actor)] == pytest.approx([0.40, 0.42, 0.44])  # the shares add up
    assert gain["primary"]["shown"] == "yes" and gain["critic"]["shown"] == "yes"
    assert gain["actor"]["shown"] == "no"  # +0.060 on average: below +0.10
    t.main([str(tmp_path)])
    out = capsys.readouterr().out
    assert "| primary | `binac` at t05 − `fixed_critic` at t0 (system) | 3 | +0.420 | 0.012 |" in out
    assert "| secondary (sharpening) | `binac` − `fixed_critic`, both at t1 | 3 | +0.480 |" in out


def test_a_tie_goes_to_the_higher_temperature_and_a_missing_seed_decides_nothing():
    t = table()
    assert t.choose({0.0: [0.5, 0.5, 0.5], 0.5: [0.4, 0.6, 0.5], 1.0: [0.2, 0.2, 0.2]}) == 0.5
    assert t.choose({0.0: [0.5, 0.5, None], 0.5: [0.1, 0.1, 0.1], 1.0: [0.1, 0.1, 0.1]}) is None
    row = t.test_row({0: 0.3, 1: 0.3, 2: None})
    assert row["shown"] == "not decided (1 of 3 seeds unmeasured)"


def test_a_stopped_binac_run_counts_at_its_last_evaluation_and_leaves_its_cross_pairs_unmeasured(tmp_path):
    t = table()
    run(tmp_path, "binac_s1", stopped_evals=[None, {"greedy_accuracy": 0.0, "feedback_accuracy_1": 0.25}, None])
    run(tmp_path, "fixed_critic.t0_s1", 0.40)
    evaluation(tmp_path, "test", "fixed_critic.t0", "trained", "t05", 1, 0.9)  # cannot exist; ignored
    runs, evals = t.load_runs(tmp_path), t.load_evals(tmp_path)
    for temp in (0.0, 0.5, 1.0):  # its own pair, at every temperature: its endpoint
        assert t.score(runs, evals, "test", "binac", "trained", temp, 1) == 0.25
        assert t.score(runs, evals, "calibration", "binac", "trained", temp, 1) == 0.25
    assert t.score(runs, evals, "test", "binac", "frozen", 0.0, 1) is None
    assert t.score(runs, evals, "test", "fixed_critic.t0", "trained", 0.5, 1) is None
    gain = t.split_gain(runs, evals, 0.0, 0.5)
    assert gain["primary"]["per_seed"][1] == pytest.approx(0.25 - 0.40)
    assert gain["critic"]["per_seed"][1] is None
