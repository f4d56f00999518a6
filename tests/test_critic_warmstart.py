"""The critic's warm start (`pipelines/warmstart.py --critic`) on the tiny model: the actor's
wrong answers from a real vLLM engine, SFT on the task's programmatic critiques with the
verdict line, and the verdict-line rate measured before and after on later problems."""
import json
import sys
from pathlib import Path

import pytest

from rltf_ray.critics.judges import VERDICT_LINES, parse_verdict
from rltf_ray.config import BinacConfig, TaskConfig
from rltf_ray.tasks import get_task
from rltf_ray.warmstart import critic_demos

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "pipelines"))


def test_critic_demos_are_the_critics_conversation_and_a_critique_ending_with_the_verdict_line():
    task = get_task(TaskConfig(name="arithmetic"))
    row = next(iter(task.rows("train", 0, 1)))
    meta = json.loads(row["meta"])
    wrong = f"<answer>{int(meta['answer']) + 1}</answer>"
    (conv, target), = critic_demos(task, BinacConfig(), [(row, wrong, meta)])
    assert [m["role"] for m in conv] == ["system", "user"] and conv[0]["content"] == BinacConfig().prompt
    assert row["prompt"] in conv[1]["content"] and wrong in conv[1]["content"]
    assert "it is incorrect" in conv[1]["content"]  # a verdict-aware critic is told the verdict
    assert target == f"{task.critique(wrong, meta)}\n{VERDICT_LINES[1]}" and parse_verdict(target) is False
    blind, = critic_demos(task, BinacConfig(verdict_aware=False), [(row, wrong, meta)])
    assert "A verifier checked" not in blind[0][1]["content"]


def test_an_informative_share_mixes_the_tasks_critique_with_vague_ones():
    from rltf_ray.warmstart import VAGUE_CRITIQUES

    task = get_task(TaskConfig(name="convention"))
    rows = list(task.rows("train", 0, 200))
    attempts = [(r, "<answer>1</answer>", json.loads(r["meta"])) for r in rows]
    b = BinacConfig()

    def informative(pairs):
        return [t == f"{task.critique(a, m)}\n{VERDICT_LINES[1]}" for (_, t), (_, a, m) in zip(pairs, attempts)]

    assert all(informative(critic_demos(task, b, attempts)))  # the default: every target informative
    vague = critic_demos(task, b, attempts, informative_share=0.0)
    assert {t.rsplit("\n", 1)[0] for _, t in vague} == set(VAGUE_CRITIQUES)  # all six, drawn at random
    assert all(t.endswith(VERDICT_LINES[1]) for _, t in vague)
    assert not any("⊕" in t or "digits" in t for _, t in vague)  # a vague critique says nothing of the rule
    mixed = critic_demos(task, b, attempts, informative_share=0.4, seed=3)
    share = sum(informative(mixed)) / len(mixed)
    assert 0.3 < share < 0.5 and mixed == critic_demos(task, b, attempts, informative_share=0.4, seed=3)
    assert [c for c, _ in mixed] == [c for c, _ in vague]  # the critic's side of each pair is the same
    with pytest.raises(ValueError, match="informative_share"):
        critic_demos(task, b, attempts, informative_share=1.5)


@pytest.mark.integration
def test_the_critic_warm_start_teaches_the_verdict_line(tmp_path, tiny_path):
    import warmstart

    out = tmp_path / "critic"
    rc = warmstart.main(["--critic", "--config", "pipelines/configs/tiny.yaml", "--out", str(out),
                         "--critic-demos", "48", "--probe", "8", "--epochs", "12", "--lr", "3e-3",
                         "--batch-size", "8", "binac.max_tokens=96", "binac.temperature=0.3",
                         "binac.critiques_per_attempt=2"])
    assert rc == 0
    got = json.loads((out / "warmstart.json").read_text())
    assert got["critic_demos"] == 48 and got["probe_attempts"] == 8 and got["finite"]
    assert got["before"]["critiques"] == got["after"]["critiques"] == 16  # 8 attempts x K = 2
    assert got["loss_last_epoch"] < got["loss_first_epoch"]
    assert got["before"]["verdict_line_rate"] < 0.5 <= got["after"]["verdict_line_rate"]
    assert (out / "model.safetensors").is_file()
