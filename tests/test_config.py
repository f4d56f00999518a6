import json
import subprocess
import sys
from pathlib import Path

import pytest

from rltf_ray.config import ConfigError, load_config
from rltf_ray.graph import draw
from rltf_ray.sources import read_prompt_file

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "pipelines" / "configs" / "tiny.yaml"


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_defaults_and_overrides():
    cfg = load_config(TINY, ["trainer.lr=3e-4", "pipeline.first_turn.n=8", "run.steps=5"])
    assert cfg.trainer.lr == 3e-4 and cfg.run.steps == 5
    assert dict(cfg.node("generate").params)["n"] == 8
    assert cfg.trainer.zero_stage == 2 and cfg.loss.lambda_sd == 0.1 and cfg.loss.lambda_fm == 0.0
    assert cfg.loss.turn1_rl and cfg.loss.sd_mask_tau == -5.0 and cfg.loss.policy_loss == "importance_sampling"


@pytest.mark.parametrize("override,match", [
    ("trainer.lrr=1", "trainer: unknown key 'lrr'"),
    ("trainer.lr=fast", r"trainer.lr: expected float"),
    ("trainer.zero_stage=2.5", r"trainer.zero_stage: expected int"),
    ("run.eval_before_after=3", r"run.eval_before_after: expected bool"),
    ("pipeline.first_turn.nn=3", r"pipeline node 'first_turn' params: unknown key 'nn'"),
    ("pipeline.first_turn.n=many", r"pipeline node 'first_turn' params.n: expected int"),
    ("pipeline.nowhere.n=3", "no pipeline node named 'nowhere'"),
    ("trainer", "expected key=value"),
])
def test_bad_overrides_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(TINY, [override])


GRAPH = """
pipeline:
  - {name: prompts, kind: source}
  - {name: gen, kind: generate, inputs: {p: prompts}}
  - {name: crit, kind: critique, inputs: {a: gen}}
  - {name: rev, kind: revise, inputs: {c: crit}}
  - {name: score, kind: reward, inputs: {r: rev}}
  - {name: learn, kind: train, inputs: {x: score}}
"""


def test_graph_validation_errors(tmp_path):
    load_config(write(tmp_path, GRAPH))
    cases = {
        "unknown kind 'magic'": GRAPH.replace("kind: critique", "kind: magic"),
        "cycle": GRAPH.replace("inputs: {p: prompts}", "inputs: {p: rev}"),
        "pipeline node 'rev': needs column 'critique'": GRAPH.replace("inputs: {c: crit}", "inputs: {c: gen}"),
        "input 'a' names unknown node 'gen2'": GRAPH.replace("inputs: {a: gen}", "inputs: {a: gen2}"),
        "duplicate name": GRAPH.replace("name: rev,", "name: crit,"),
        "'crit' params: unknown key 'judge'": GRAPH.replace("inputs: {a: gen}}", "inputs: {a: gen}, params: {judge: x}}"),
    }
    for match, text in cases.items():
        with pytest.raises(ConfigError, match=match):
            load_config(write(tmp_path, text))


def test_graph_drawings(tmp_path):
    cfg = load_config(TINY)
    for ext, needle in [("svg", "<svg"), ("dot", "digraph"), ("mmd", "flowchart")]:
        draw(cfg, str(tmp_path / f"g.{ext}"))
        text = (tmp_path / f"g.{ext}").read_text()
        assert needle in text and "critic" in text and "revision" in text
    with pytest.raises(ConfigError, match="use a .svg"):
        draw(cfg, str(tmp_path / "g.gif"))


def test_cli_dry_run_and_error_exit():
    run = [sys.executable, str(ROOT / "pipelines" / "run.py"), "--config", str(TINY)]
    ok = subprocess.run(run + ["--dry-run"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "first_turn [generate]" in ok.stdout and "writes: reward_first" in ok.stdout
    bad = subprocess.run(run + ["--dry-run", "trainer.zero_stage=x"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "trainer.zero_stage" in bad.stderr


def test_prompt_file_rows_are_validated(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text(json.dumps({"prompt": "What is 1 + 1?", "meta": {"answer": 2}}) + "\n")
    assert read_prompt_file(str(good))[0]["meta"] == '{"answer": 2}'
    for line, match in [('{"prompt": ""}', ":1: missing or empty 'prompt'"),
                        ('{"prompt": "q"}', ":1: missing 'meta'"),
                        ("not json", ":1: not valid JSON"),
                        ('[1, 2]', "must be an object")]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(line + "\n")
        with pytest.raises(ConfigError, match=match):
            read_prompt_file(str(bad))
    with pytest.raises(ConfigError, match="not found"):
        read_prompt_file(str(tmp_path / "missing.jsonl"))


def test_a_relative_model_folder_resolves_to_an_absolute_path(tmp_path, monkeypatch):
    from rltf_ray.models import resolve_model

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("m") == str(tmp_path / "m") and resolve_model("./m") == str(tmp_path / "m")
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_model("./missing")
