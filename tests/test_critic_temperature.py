"""The critic's sampling temperature, per run and per evaluation: a frozen critic may sample
greedily, a trained one is scored at any temperature, and `rltf-ray eval` scores a given
actor checkpoint with a given critic checkpoint as one system."""
import asyncio
import dataclasses
import hashlib
import json
from types import SimpleNamespace

import pytest

from rltf_ray.config import BinacConfig, ConfigError
from rltf_ray.loading import load_config

CFG = "pipelines/configs/expansion.yaml"


def test_the_temperature_is_a_per_run_key_and_greedy_only_where_the_critic_does_not_train():
    frozen = load_config(CFG, ["binac.temperature=0"], preset="fixed_critic")
    assert frozen.binac.temperature == 0 and frozen.binac.critic_steps == 0
    assert load_config(CFG, ["binac.temperature=0.5"], preset="binac").binac.temperature == 0.5
    with pytest.raises(ConfigError, match="binac.temperature=0 .greedy. with a critic that trains"):
        load_config(CFG, ["binac.temperature=0"], preset="binac")
    with pytest.raises(ConfigError, match="binac.temperature"):
        load_config(CFG, ["binac.temperature=-0.1"], preset="fixed_critic")
    # the evaluation's temperature is separate: a critic trained at 1.0 is scored greedily
    cfg = load_config(CFG, ["eval.critic_temperature=0"], preset="binac")
    assert (cfg.binac.temperature, cfg.eval.critic_temperature) == (1.0, 0.0)
    with pytest.raises(ConfigError, match="eval.critic_temperature"):
        load_config(CFG, ["eval.critic_temperature=-1"], preset="binac")
    with pytest.raises(ConfigError, match="does not sample"):  # the task's critic has no temperature
        load_config(CFG, ["eval.critic_temperature=0.5"], preset="rltf_sd")


class FakeEngine:
    """A critic engine: records each generate call; every sample is 'c<temperature>'."""

    def __init__(self):
        self.calls = []
        self.generate = SimpleNamespace(remote=self._generate)

    def _generate(self, prompts, n, temperature, top_p, max_tokens):
        self.calls.append((len(prompts), n, temperature))

        async def result():
            text = f"c{temperature}\nYour previous attempt was incorrect."
            one = SimpleNamespace(text=text, token_ids=[1, 2], logprobs=[-0.1, -0.2])
            return {"outputs": [[one] * n for _ in prompts], "version": 0}

        return result()


def test_the_learned_critic_samples_each_item_at_its_temperature():
    from rltf_ray.critics.base import per_item  # noqa: F401  (the module the critic uses)
    from rltf_ray.critics.learned import LearnedCritic

    class Probe(LearnedCritic):
        def _prompt(self, item):
            return [1, 2, 3]

    critic = object.__new__(Probe)
    engine = FakeEngine()
    critic.engines, critic.model_path, critic.max_model_len = [engine], "unused", 1024
    critic.b = BinacConfig(temperature=1.0, critiques_per_attempt=4)
    item = {"prompt": "2 ⊕ 3?", "response": "5", "meta": {"answer": 23}, "verdict": False}
    got = asyncio.run(critic.judge([item, {**item, "samples": 1, "temperature": 0.0},
                                    {**item, "samples": 1, "temperature": 0.5}, {**item, "samples": 1},
                                    {**item, "samples": 1, "temperature": -1}]))
    assert sorted(engine.calls) == [(1, 1, 0.0), (1, 1, 0.5), (1, 1, 1.0), (1, 4, 1.0)]
    assert [g["critique"].split("\n")[0] for g in got[:4]] == ["c1.0", "c0.0", "c0.5", "c1.0"]
    assert len(got[0]["critic_critiques"]) == 4
    assert "'temperature' must be a number >= 0" in str(got[4])


def test_ask_critic_sends_the_temperature_with_each_item(monkeypatch):
    from rltf_ray.graph import CritiqueParams
    from rltf_ray.stages import critique

    sent = []
    monkeypatch.setattr(critique.serve, "get_app_handle", lambda name: name)
    monkeypatch.setattr(critique, "request_critiques",
                        lambda handle, items, p: (sent.extend(items) or [{}] * len(items), [""] * len(items)))
    rows = [{"prompt": "q", "meta": "{}", "correct_first": False}] * 2
    critique.ask_critic(CritiqueParams(), rows, ["a", "b"], [0, 1], samples=1, temperature=0.0)
    assert [(i["samples"], i["temperature"], i["verdict"]) for i in sent] == [(1, 0.0, False)] * 2
    sent.clear()
    critique.ask_critic(CritiqueParams(), rows, ["a", "b"], [1])
    assert "temperature" not in sent[0] and "samples" not in sent[0]


@pytest.mark.parametrize("override,want", [([], None), (["eval.critic_temperature=0.5"], 0.5)])
def test_the_evaluations_critique_asks_at_eval_critic_temperature(monkeypatch, override, want):
    from rltf_ray.graph import node_params
    from rltf_ray.stages import critique
    from rltf_ray.steps import StepRunner
    from rltf_ray.tasks import get_task

    asked = {}

    def fake_ask(p, rows, texts, which, samples=None, ids=None, step=None, temperature=None):
        asked.update(samples=samples, temperature=temperature, which=list(which))
        return {i: ({"critique": "try concat"}, "") for i in which}

    monkeypatch.setattr(critique, "ask_critic", fake_ask)
    cfg = load_config(CFG, override, preset="fixed_critic")
    runner = object.__new__(StepRunner)
    runner.cfg, runner.task, runner.engines, runner.model_path = cfg, get_task(cfg.task), [], "unused"
    runner.critic_params = node_params(cfg.node("critique"))
    ev = runner.evaluator()
    answer = SimpleNamespace(text="5", token_ids=[7])
    got = ev.critique([{"prompt": "2 ⊕ 3?", "meta": "{}"}], [answer], [0], 3)
    assert got == {0: ("try concat", "")}
    assert asked == {"samples": 1, "temperature": want, "which": [0]}


def test_eval_scores_a_given_actor_with_a_given_critic_at_a_given_temperature(monkeypatch, tmp_path, capsys):
    """`rltf-ray eval --preset fixed_critic --model A --critic C --critic-temperature 0 --split
    calibration`: the config the evaluation runs, and the pair's hashes in its output."""
    import rltf_ray.runner
    from rltf_ray.cli import eval_main

    actor, critic = tmp_path / "actor", tmp_path / "critic"
    for d, data in ((actor, b"A"), (critic, b"C")):
        d.mkdir()
        (d / "model.safetensors").write_bytes(data)
    seen = {}

    def fake_evaluate_only(cfg):
        seen["cfg"] = cfg
        return SimpleNamespace(model_path=str(actor), critic_model=str(critic)), {"greedy_accuracy": 0.0,
                                                                                  "greedy_accuracy_se": 0.0,
                                                                                  "problems": 128}

    monkeypatch.setattr(rltf_ray.runner, "evaluate_only", fake_evaluate_only)
    out = tmp_path / "eval.json"
    assert eval_main(["--config", CFG, "--preset", "fixed_critic", "--model", str(actor), "--critic", str(critic),
                      "--critic-temperature", "0", "--split", "calibration", "--feedback-rounds", "1",
                      "--output", str(out)]) == 0
    cfg = seen["cfg"]
    assert (cfg.model.path, cfg.binac.critic_model) == (str(actor), str(critic))
    assert (cfg.eval.critic_temperature, cfg.eval.split, cfg.eval.feedback_rounds) == (0.0, "calibration", 1)
    assert cfg.node("critique").params["critic"] == "learned" and cfg.binac.critic_steps == 0
    got = json.loads(out.read_text())
    sha = {role: {"model.safetensors": hashlib.sha256(b).hexdigest()} for role, b in (("actor", b"A"), ("critic", b"C"))}
    assert (got["critic_temperature"], got["weights_sha256"]) == (0.0, sha)
    # without --critic-temperature the critic samples at its run's temperature
    assert eval_main(["--config", CFG, "--preset", "fixed_critic", "binac.temperature=0.5", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["critic_temperature"] == 0.5 and seen["cfg"].eval.split == "test"
    assert dataclasses.asdict(seen["cfg"].eval)["critic_temperature"] is None
