"""Held-out evaluation and the experiment runner: pass@k and standard errors by hand, the
comparison table from hand-made runs, then `pipelines/eval.py` and `pipelines/compare.py`
for real on the tiny model."""
import json
import math
import sys
from pathlib import Path

import pytest

from rltf_ray.evaluation import mean_se, pass_at_k
from rltf_ray.report import write_table

ROOT = Path(__file__).resolve().parent.parent


def test_pass_at_k_on_hand_made_outcomes():
    assert pass_at_k(8, 2, 1) == pytest.approx(2 / 8)
    assert pass_at_k(8, 2, 4) == pytest.approx(1 - 15 / 70)  # 1 - C(6,4)/C(8,4)
    assert pass_at_k(8, 2, 8) == 1.0 and pass_at_k(8, 0, 4) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(8, 7, 2) == 1.0  # fewer wrong samples than k: some draw is right


def test_mean_and_standard_error():
    m, se = mean_se([1.0, 0.0, 1.0, 0.0])
    assert m == 0.5 and se == pytest.approx(math.sqrt((4 * 0.25 / 3) / 4))
    assert mean_se([0.3]) == (0.3, 0.0) and mean_se([]) == (0.0, 0.0)


def run(preset, seed, before, after, gain=0.1):
    return {"preset": preset, "seed": seed, "before": {"greedy_accuracy": before, "problems": 16},
            "after": {"greedy_accuracy": after, "pass@4": after + 0.1, "problems": 16}, "curve": [],
            "revision_gain": gain, "generate_tokens": 1000, "seconds": 120.0}


def test_comparison_table_is_mean_and_standard_error_over_seeds(tmp_path):
    runs = [run("grpo_single", 0, 0.2, 0.3), run("grpo_single", 1, 0.2, 0.5),
            run("rltf_sd", 0, 0.2, 0.6), run("rltf_sd", 1, 0.2, 0.6), run("rltf_fm", 0, 0.2, 0.5)]
    text = write_table(runs, tmp_path / "t.md", "t")
    rows = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "0.400 ± 0.100" in rows["grpo_single"]  # after: mean of 0.3, 0.5; se = 0.1414/sqrt(2)
    assert "0.200 ± 0.100" in rows["grpo_single"]  # change
    assert "0.600 ± 0.000" in rows["rltf_sd"] and "0.700 ± 0.000" in rows["rltf_sd"]  # pass@4
    assert "0.500 (1 seed)" in rows["rltf_fm"] and "±" not in rows["rltf_fm"]  # no SE from one seed
    assert "16 distinct held-out problems" in text and (tmp_path / "t.md").read_text() == text


def answers(*texts):
    """Answers as the engine returns them (the evaluator keeps their token ids for scoring)."""
    from rltf_ray.stages.engine import GenOut

    return [GenOut(t, [len(t)], [0.0], "stop") for t in texts]


def _feedback_evaluator(fail: set, max_failed_fraction: float):
    """An Evaluator whose verifier, critic and reviser are plain functions: text "right" is
    correct; the critic fails for the rows in `fail`; the k-th revision of a row is "right"
    when k reaches the row's number of needed revisions (row index - 1)."""
    from rltf_ray.evaluation import Evaluator

    asked: list[list[int]] = []
    ev = Evaluator(engines=[], model_path="", task=None,
                   score=lambda rows, got, version: [(float(a.text == "right"), a.text == "right", True) for a in got],
                   critique=lambda rows, got, which, version: asked.append(list(which)) or {
                       i: (None, "TimeoutError: 60 s") if i in fail else (f"hint {i}", "") for i in which},
                   temperature=0.0, max_tokens=8, revision_template="{critique}",
                   max_failed_fraction=max_failed_fraction)

    def revise(rows, exchanges, which):
        return dict(zip(which, answers(*("right" if len(exchanges[i]) >= i - 1 else "wrong" for i in which))))
    ev._revise = revise
    return ev, asked


def test_a_failed_critique_counts_as_not_fixed_over_the_same_problems_as_the_first_try():
    # rows: 0 right at once; 1 and 2 fixed by one critique; 3 fixed by two; 4's critique fails
    rows = [{"prompt": str(i), "meta": {}} for i in range(5)]
    first = answers("right", "wrong", "wrong", "wrong", "wrong")
    ev, asked = _feedback_evaluator({4}, 0.3)
    out = ev._feedback(rows, first, 2)
    assert asked == [[1, 2, 3, 4], [3]]  # a failed problem is not asked again
    assert out["feedback_problems_1"] == out["feedback_problems_2"] == 5
    assert out["feedback_accuracy_1"] == 0.6 and out["feedback_accuracy_2"] == 0.8  # row 4 stays wrong
    assert out["feedback_critique_failed"] == 1 and out["feedback_critique_error"] == "TimeoutError: 60 s"
    assert "feedback_unmeasured" not in out


def test_a_critic_that_fixes_nothing_with_one_failure_scores_the_first_try():
    """5 of 10 right, a critic that fixes nothing, 1 failed request: 0.5 (leaving the failed
    problem out would give 5/9 = 0.556)."""
    rows = [{"prompt": str(i), "meta": {}} for i in range(10)]
    ev, asked = _feedback_evaluator({9}, 0.3)
    ev._revise = lambda rows, exchanges, which: dict(zip(which, answers(*["wrong"] * len(which))))
    out = ev._feedback(rows, answers(*["right"] * 5 + ["wrong"] * 5), 1)
    assert asked == [[5, 6, 7, 8, 9]]
    assert out["feedback_accuracy_1"] == 0.5 and out["feedback_problems_1"] == 10
    assert out["feedback_critique_failed"] == 1


def test_feedback_accuracy_is_not_reported_when_too_many_critiques_failed():
    rows = [{"prompt": str(i), "meta": {}} for i in range(5)]
    ev, _ = _feedback_evaluator({3, 4}, 0.2)  # 2 of the 4 requests fail: 0.5 > 0.2
    out = ev._feedback(rows, answers("right", *["wrong"] * 4), 2)
    assert not any(k.startswith("feedback_accuracy_") for k in out)
    assert out["feedback_critique_failed"] == 2
    assert out["feedback_unmeasured"] == ("2 of 4 critique requests failed (more than max_failed_fraction=0.2); "
                                          "first error: TimeoutError: 60 s")
    from rltf_ray.metrics import eval_line
    assert "feedback accuracy NOT MEASURED: 2 of 4" in eval_line({"problems": 5, **out})


@pytest.mark.integration
def test_eval_cli_measures_everything_on_distinct_problems(tmp_path, tiny_path):
    from rltf_ray.cli import eval_main

    out = tmp_path / "eval.json"
    rc = eval_main(["--config", "pipelines/configs/tiny.yaml", "--prompts", "6", "--pass-k", "1,2",
                        "--samples", "2", "--feedback-rounds", "1", "--self-feedback-rounds", "1",
                        "--output", str(out), "run.serve_http_port=8161",
                        "pipeline.critic.batch_size=4"])  # the critiques go in chunks, as in training
    assert rc == 0
    r = json.loads(out.read_text())
    assert r["problems"] == 6 and r["requested"] == 6 and r["version"] == 0
    # one 0/1 outcome per problem: a multiple of 1/6, with the SE of 6 Bernoulli values
    for k in ("greedy_accuracy", "pass@2", "feedback_accuracy_1", "self_feedback_accuracy_1"):
        p = r[k]
        assert p * 6 == pytest.approx(round(p * 6)) and 0 <= p <= 1, k
        assert r[f"{k}_se"] == pytest.approx(math.sqrt(p * (1 - p) / 5)), k
    assert r["pass@1"] * 12 == pytest.approx(round(r["pass@1"] * 12))  # 0, 1/2 or 1 per problem
    assert r["pass@2"] >= r["pass@1"] and r["feedback_accuracy_1"] >= r["greedy_accuracy"]
    assert r["feedback_critique_failed"] == 0 and r["feedback_problems_1"] == 6 and r["pass_samples"] == 2


@pytest.mark.integration
def test_check_prints_the_feedback_gap_with_its_standard_errors():
    """`rltf-ray check`, the console script `make install` puts beside the interpreter."""
    import os
    import re
    import subprocess

    script = Path(sys.executable).parent / "rltf-ray"
    out = subprocess.run([str(script), "check", "--config", "pipelines/configs/tiny.yaml", "--problems", "6",
                          "run.serve_http_port=8163"], capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "feedback gap on 6 held-out problems" in out.stdout
    p0 = re.search(r"p0  first try \(greedy\)\s+([01]\.\d{3}) ± ([01]\.\d{3})", out.stdout)
    p1 = re.search(r"p1  after one critique\s+([01]\.\d{3}) ± ([01]\.\d{3})", out.stdout)
    assert p0 and p1, out.stdout
    assert float(p1.group(1)) >= float(p0.group(1))  # a right first answer stands
    assert "can this model use these critiques? " in out.stdout


@pytest.mark.integration
@pytest.mark.slow  # ~4-8 min on 2 cores: `make test-all`
def test_compare_runner_equal_prompts_table_picture_and_restart(tmp_path, tiny_path, capsys):
    sys.path.insert(0, str(ROOT / "pipelines"))
    import compare

    argv = ["--config", "pipelines/configs/tiny.yaml", "--presets", "grpo_single,rltf_sd", "--seeds", "2",
            "--name", "t", "--results", str(tmp_path), "run.steps=1", "eval.prompts=4",
            "trainer.num_workers=1", "run.serve_http_port=8162"]
    assert compare.main(argv) == 0
    root = tmp_path / "t"
    assert (root / "table.md").is_file() and (root / "curves.png").stat().st_size > 1000
    runs = [json.loads(x) for x in (root / "runs.jsonl").read_text().splitlines()]
    assert len(runs) == 4
    ids = {(r["preset"], r["seed"]): r["prompt_ids"] for r in runs}
    for seed in (0, 1):  # equal budgets: both presets saw the same prompts in the same order
        assert ids[("grpo_single", seed)] == ids[("rltf_sd", seed)] and ids[("rltf_sd", seed)][0]
    assert ids[("rltf_sd", 0)] != ids[("rltf_sd", 1)]  # another seed, another stream
    table = (root / "table.md").read_text()
    assert "| grpo_single | 2 |" in table and "| rltf_sd | 2 |" in table
    finished = root / "runs" / "rltf_sd_s1"
    assert (finished / "summary.json").is_file() and not (finished / "ray_train").exists()
    capsys.readouterr()
    assert compare.main(argv) == 0  # restart: nothing is run again
    assert "4 runs, 4 already finished" in capsys.readouterr().out
