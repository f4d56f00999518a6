"""Every objective preset runs one RL step end to end on the tiny model (one Ray for all)."""
import json

import pytest
import ray

from rltf_ray.config import PRESET_DIR, load_config
from rltf_ray.runner import Pipeline

pytestmark = pytest.mark.integration
PRESETS = sorted(f.stem for f in PRESET_DIR.glob("*.yaml"))


@pytest.fixture(scope="module")
def shared_ray():
    ray.init(num_cpus=8, include_dashboard=False)
    yield
    from ray import serve

    serve.shutdown()
    ray.shutdown()


def test_there_are_ten_presets():
    assert len(PRESETS) == 10 and "rltf_sd" in PRESETS


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_runs_one_step(preset, shared_ray, tmp_path, tiny_path):
    cfg = load_config("pipelines/configs/tiny.yaml",
                      [f"run.output_dir={tmp_path}", "run.steps=1", "run.eval_before_after=false",
                       "run.serve_http_port=8140", "loss.kl_coef=0.01" if preset == "grpo_multi" else "loss.gamma=0.1"],
                      preset=preset)
    summary = Pipeline(cfg).run()
    assert summary["engine_versions"] == [1]
    m = json.loads((tmp_path / "metrics.jsonl").read_text())
    L = cfg.loss
    assert m["policy_version"] == 1 and m["loss"] == m["loss"]  # finite, not NaN
    assert (m["examples_rl1"] > 0) == (L.turn1_rl and cfg.run.turns >= 2)
    assert (m["examples_sd"] > 0) == (L.lambda_sd > 0)
    assert (m["examples_fm"] > 0) == (L.lambda_fm > 0)
    if cfg.run.turns == 1:
        assert m["revised_rows"] == 0 and m["examples_rl1"] == 0
    if L.sd_weight != "none":  # values are null when no SD token had a non-zero advantage
        assert {"is_weight_mean", "is_weight_max", "is_weight_var"} <= set(m)
        assert (m["is_weight_mean"] is None) == (m["sd_tokens_trained"] == 0)
    if L.kl_coef > 0:
        assert m["kl_mean"] >= 0.0
    for key in ("revision_gain", "zero_adv_group_fraction", "sd_masked_fraction", "loss_sd", "loss_rl1"):
        assert key in m


def test_three_turns_run_two_critique_rounds(shared_ray, tmp_path, tiny_path):
    cfg = load_config("pipelines/configs/tiny.yaml",
                      [f"run.output_dir={tmp_path}", "run.steps=1", "run.eval_before_after=false",
                       "run.serve_http_port=8142", "run.turns=3", "loss.lambda_sd=0.1"], preset="grpo_multi")
    Pipeline(cfg).run()
    m = json.loads((tmp_path / "metrics.jsonl").read_text())
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


@pytest.mark.parametrize("task", ["knights_knaves", "binary_matrix", "shortest_path"])
def test_puzzle_task_runs_one_step(task, shared_ray, tmp_path, tiny_path):
    cfg = load_config("pipelines/configs/tiny.yaml",
                      [f"run.output_dir={tmp_path}", "run.steps=1", "run.eval_before_after=false",
                       "run.serve_http_port=8141", f"task.name={task}", "task.params={level: easy}",
                       "engine.max_model_len=2048", "pipeline.prompts.prompts_per_step=2"])
    Pipeline(cfg).run()
    m = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert m["rows"] == 8 and m["policy_version"] == 1 and m["critique_failed"] == 0
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "rollouts" / "step_0.parquet").to_pylist()
    assert all(r["critique"] for r in rows if r["revised"])  # the puzzle's programmatic critic ran
