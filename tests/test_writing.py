"""The judge-scored `writing` task: its prompts and errors (pure), and one RL step end to end
with the vLLM judge giving every reward, first turn and revisions alike."""
import json
import math

import pytest

from rltf_ray.config import ConfigError, TaskConfig
from rltf_ray.loading import load_config
from rltf_ray.tasks import get_task
from rltf_ray.tasks.writing import NoVerifierError

JUDGED = ["task.name=writing", "task.params={}", "pipeline.critic.critic=llm_judge"]


def test_writing_prompts_are_shipped_split_and_deterministic():
    task = get_task(TaskConfig(name="writing"))
    train = list(task.rows("train", 0, 25))
    test = list(task.rows("test", 0, 5))
    assert len({r["prompt"] for r in train}) == 25 and len({r["prompt"] for r in test}) == 5
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert train == list(get_task(TaskConfig(name="writing")).rows("train", 0, 25))
    meta = json.loads(train[0]["meta"])
    assert meta["rubric"] and meta["pass_score"] == 8 and "<answer>" in train[0]["prompt"]
    assert task.extract("<answer> A poem. </answer>") == ("A poem.", True)


def test_writing_without_a_judge_is_a_clear_error(tmp_path):
    with pytest.raises(NoVerifierError, match="no verifier"):
        get_task(TaskConfig(name="writing")).score("text", {})
    with pytest.raises(ConfigError, match="use critic llm_judge or openai"):
        load_config("pipelines/configs/tiny.yaml", JUDGED[:2])
    bad = tmp_path / "w.jsonl"
    bad.write_text('{"prompt": "Write.", "rubric": ""}\n')
    with pytest.raises(ConfigError, match="w.jsonl:1: need non-empty strings"):
        get_task(TaskConfig(name="writing", params={"path": str(bad)}))
    with pytest.raises(ConfigError, match="pass_score"):
        get_task(TaskConfig(name="writing", params={"pass_score": 11}))


@pytest.mark.integration
def test_writing_runs_one_step_with_judge_rewards(tmp_path, tiny_path):
    import pyarrow.parquet as pq
    import ray
    from ray import serve

    from rltf_ray.runner import Pipeline
    from rltf_ray.critics.judges import parse_score

    cfg = load_config("pipelines/configs/tiny.yaml",
                      JUDGED + [f"run.output_dir={tmp_path}", "run.steps=1", "run.serve_http_port=8143",
                                f"pipeline.critic.judge_model={tiny_path}",
                                "pipeline.critic.judge_max_tokens=16", "eval.prompts=5",
                                "pipeline.prompts.prompts_per_step=2", "engine.max_model_len=1024"])
    ray.init(num_cpus=8, include_dashboard=False)
    pipe = Pipeline(cfg)
    try:
        pipe.start()
        summary = pipe.train()
        stats = serve.get_app_handle(pipe.critic_params.app_name).stats.remote().result()
    finally:
        pipe.stop()
        serve.shutdown()
        ray.shutdown()
    rows = pq.read_table(tmp_path / "rollouts" / "step_0.parquet").to_pylist()
    revised = [r for r in rows if r["revised"]]
    # the judge scored every first attempt and every revision, plus the 5 + 5 eval answers
    assert stats["requests"] == len(rows) + len(revised) + 10
    scale = {(n - 1) / 9 for n in range(1, 11)}
    assert all(r["reward_first"] in scale for r in rows)
    assert all(r["reward_second"] in scale and parse_score(r["critique"]) for r in revised)
    # a passing first attempt ends its episode; every other one was critiqued and revised
    assert all(r["revised"] == (r["reward_first"] < 7 / 9) for r in rows)
    m = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert m["unscored_rows"] == 0 and m["policy_version"] == 1 and math.isfinite(m["loss"])
    assert summary["before"]["problems"] == 5 and summary["before"]["greedy_unscored"] == 0
