"""The supervised warm start (pipelines/warmstart.py): revision demonstrations from the
tiny model's own wrong answers on a real vLLM engine, then SFT on them."""
import json

import pytest
import ray

from rltf_ray.loading import load_config
from rltf_ray.stages.engine import start_engines
from rltf_ray.tasks import get_task
from rltf_ray.warmstart import format_demos, revision_demos, sft

pytestmark = pytest.mark.integration


def test_revision_demos_count_every_wrong_answer_and_the_warm_start_learns(shared_ray, tmp_path, tiny_path):
    cfg = load_config("pipelines/configs/tiny.yaml")
    task = get_task(cfg.task)
    engines = start_engines(tiny_path, cfg.engine, "float32", 0)
    try:
        demos, stats = revision_demos(engines, tiny_path, task, "Feedback: {critique}\nAgain.", 0, 5, 1.0, 8)
    finally:
        ray.kill(engines[0])
    # one batch of 32 problems x 2 samples; every wrong answer is counted, not only the 5 kept
    assert len(demos) == 5 and stats["sampled"] == 64 and stats["wrong"] > 5
    assert stats["first_turn_accuracy"] == pytest.approx(1 - stats["wrong"] / 64)
    solutions = {task.demonstration(json.loads(r["meta"])) for r in task.rows("train", 0, 32)}
    for conv, target in demos:  # [x0, y0 (wrong), c0] -> the correct solution
        assert [m["role"] for m in conv] == ["user", "assistant", "user"]
        assert conv[2]["content"].startswith("Feedback: ") and target in solutions
    pairs = format_demos(task, 100, 3) + demos
    got = sft(tiny_path, pairs, str(tmp_path / "warm"), lr=1e-3, epochs=3, batch_size=4)
    assert got["examples"] == 8 and got["finite"]
    assert got["loss_last_epoch"] < got["loss_first_epoch"]
    assert (tmp_path / "warm" / "model.safetensors").is_file()
    assert (tmp_path / "warm" / "tokenizer.json").is_file() or (tmp_path / "warm" / "tokenizer_config.json").is_file()
