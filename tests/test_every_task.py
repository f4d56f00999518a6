"""Every built-in task with a verifier goes through a whole rollout on the tiny model: its
first-turn prompt, its critique, its own revision template (math's holds `\\boxed{...}`) and
its reward, through the run's real stages (vLLM, the Serve critic, Ray Data), and the
learner's examples are built from the result. The judge-scored `writing` task trains a step
in tests/test_writing.py; the learner itself is task-agnostic (tests/test_integration.py)."""
import math

import pytest

from rltf_ray.chat import load_tokenizer
from rltf_ray.examples import build_examples
from rltf_ray.loading import load_config
from rltf_ray.runner import Pipeline

pytestmark = pytest.mark.integration

# arithmetic trains in every integration module, knights_knaves (with sft) in test_presets.py
TASKS = ["math", "convention", "binary_matrix", "shortest_path"]


@pytest.mark.parametrize("name", TASKS)
def test_a_task_runs_through_its_revision(shared_ray, tmp_path, name):
    cfg = load_config("pipelines/configs/tiny.yaml",
                      [f"task.name={name}", "task.params={}", "run.steps=1", "run.eval_before_after=false",
                       f"run.output_dir={tmp_path}", "pipeline.first_turn.n=2", "pipeline.first_turn.max_tokens=16",
                       "pipeline.revision.max_tokens=16", "engine.max_model_len=1024"])
    pipe = Pipeline(cfg)
    pipe.start(train=False)
    try:
        rows = pipe.rollout(0).to_pylist()
    finally:
        pipe.stop()
    assert len(rows) == 4 * 2
    assert all(math.isfinite(r["reward_first"]) and math.isfinite(r["reward_second"]) for r in rows)
    wrong = [r for r in rows if not r["correct_first"]]
    assert wrong, "the random tiny model got every answer right"
    revised = [r for r in wrong if r["revised"]]
    assert revised and not any(r["critique_failed"] for r in rows)  # every wrong answer critiqued
    tok = load_tokenizer(pipe.model_path)
    template = pipe.task.revision_template
    for r in revised:
        x1 = tok.decode(r["revision_prompt_ids"])
        assert r["critique"] and r["critique"][:20] in x1  # the critique reached x1
        # the task's own template, filled: its fixed text is in x1, no '{...}' field left
        fixed = template.split("{")[0].strip()[:30]
        assert fixed in x1 and "{critique}" not in x1
        assert r["revision_ids"]
    # the learner's examples: each trains on an answer this rollout sampled, after its prompt
    examples, _ = build_examples(rows, cfg, tok)
    terms = [e.term for e in examples]  # one RL0 per answer; per revision one SD (and RL1)
    assert cfg.loss.lambda_sd > 0 and terms.count("rl0") == len(rows) and terms.count("sd") == len(revised)
    assert terms.count("rl1") == (len(revised) if cfg.loss.turn1_rl else 0)
    sampled = {tuple(r["response_ids"]) for r in rows} | {tuple(r["revision_ids"]) for r in revised}
    prompts = {tuple(r["prompt_ids"]) for r in rows} | {tuple(r["revision_prompt_ids"]) for r in revised}
    for e in examples:
        assert tuple(e.ids[e.start:]) in sampled and tuple(e.ids[:e.start]) in prompts
