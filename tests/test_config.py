import json
import subprocess
import sys
from pathlib import Path

import pytest

from rltf_ray.config import TaskConfig, ConfigError
from rltf_ray.loading import load_config
from rltf_ray.graph import draw

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
    ("engine.block_size=24", r"engine.block_size: expected a multiple of 16"),
    ("engine.nice=-5", r"engine.nice: expected 0..19"),
    ("engine.kv_cache_gib=0", r"engine.kv_cache_gib: must be > 0, got 0"),
])
def test_bad_overrides_name_the_key(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(TINY, [override])


def test_a_preset_refuses_an_override_that_would_make_it_another_method():
    # fixed_critic is the frozen-critic baseline: a shared binac.critic_steps=1 would train it
    with pytest.raises(ConfigError, match=r"preset 'fixed_critic' fixes binac.critic_steps = 0.*sets 1"):
        load_config(TINY, ["binac.critic_steps=1"], preset="fixed_critic")
    cfg = load_config(TINY, ["binac.actor_steps=1"], preset="fixed_critic")  # 1:1 schedule, still frozen
    assert cfg.binac.critic_steps == 0 and not any(cfg.binac.critic_trains(s) for s in range(4))
    assert load_config(TINY, ["binac.critic_steps=1"], preset="binac").binac.critic_steps == 1


def test_asynchronous_overlap_needs_its_correction_and_an_actor_only_run():
    with pytest.raises(ConfigError, match=r"run.max_staleness: must be >= 0"):
        load_config(TINY, ["run.max_staleness=-1"])
    with pytest.raises(ConfigError, match=r"set loss.rollout_correction \(tis_token"):
        load_config(TINY, ["run.max_staleness=1", "loss.rollout_correction=none"])
    with pytest.raises(ConfigError, match=r"not supported with critic 'learned'"):
        load_config(TINY, ["run.max_staleness=1"], preset="binac")
    cfg = load_config(TINY, ["run.max_staleness=2"])
    assert cfg.run.max_staleness == 2 and load_config(TINY).run.max_staleness == 0


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
    # the fix an error names is one that parses: this graph's critique node is 'crit'
    with pytest.raises(ConfigError, match=r"set pipeline\.crit\.critic=learned\)"):
        load_config(write(tmp_path, GRAPH), ["binac.bilevel_lambda=1"])
    assert load_config(write(tmp_path, GRAPH), ["binac.bilevel_lambda=1", "pipeline.crit.critic=learned"])


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
    one = subprocess.run(run + ["--dry-run", "--preset", "binac", "binac.critiques_per_attempt=1",
                                "binac.critic_steps=1"], capture_output=True, text=True, timeout=120)
    assert one.returncode == 2 and "binac.critiques_per_attempt=1 with binac.critic_steps=1" in one.stderr


def test_every_bad_prompt_row_is_reported_with_line_id_and_reason(tmp_path):
    from rltf_ray.graph import SourceParams
    from rltf_ray.sources import PromptSource
    from rltf_ray.tasks import get_task

    task = get_task(TaskConfig())
    ok = {"a": 1, "b": 1, "op": "+", "answer": 2}
    rows = [{"prompt_id": "a", "prompt": "What is 1 + 1?", "meta": ok},           # 1 good
            None,                                                                 # 2: bad UTF-8
            "not json",                                                           # 3
            [1, 2],                                                               # 4
            {"prompt_id": "c", "prompt": "", "meta": ok},                         # 5
            {"prompt_id": "d", "prompt": "q"},                                    # 6
            {"prompt_id": "e", "prompt": "q", "meta": {"a": 1}},                  # 7
            {"prompt_id": "f", "prompt": "q", "meta": {**ok, "answer": "three"}}, # 8
            {"prompt_id": None, "prompt": "q", "meta": ok},                       # 9
            {"prompt_id": "a", "prompt": "again", "meta": ok},                    # 10
            {"prompt_id": "g", "prompt": "x " * 400, "meta": ok},                 # 11
            {"prompt_id": "h", "prompt": "What is 2 + 2?", "meta": ok}]           # 12 good
    raw = [b'{"prompt_id": "b", "prompt": "caf\xff"}' if r is None else
           (r if isinstance(r, str) else json.dumps(r)).encode() for r in rows]
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\n".join(raw) + b"\n")
    fits = lambda r: "the prompt is too long" if len(r["prompt"]) > 300 else ""  # noqa: E731
    with pytest.raises(ConfigError) as err:
        PromptSource(task, SourceParams(path=str(path), prompts_per_step=1), 1, fits=fits)
    msg = str(err.value)
    assert "10 bad row(s)" in msg and "on_bad_row=skip" in msg
    for line, reason in [(2, "not valid UTF-8"), (3, "not valid JSON"), (4, "must be a JSON object"),
                         (5, "non-string 'prompt'"), (6, "missing 'a', 'b', 'op', 'answer'"), (7, "missing 'b', 'op', 'answer'"),
                         (8, "does not verify as correct"), (9, "null or empty 'prompt_id'"),
                         (10, "duplicate prompt_id 'a' (first on line 1)"), (11, "too long")]:
        assert f"p.jsonl:{line} " in msg and reason in msg, (line, reason, msg)
    src = PromptSource(task, SourceParams(path=str(path), prompts_per_step=1, on_bad_row="skip"), 1, fits=fits)
    assert [r["prompt_id"] for r in src.file_rows] == ["a", "h"] and len(src.bad_rows) == 10
    src.write_bad_rows(tmp_path)
    written = [json.loads(x) for x in (tmp_path / "bad_rows.jsonl").read_text().splitlines()]
    assert [b["line"] for b in written] == list(range(2, 12)) and all(b["raw"] for b in written)
    with pytest.raises(ConfigError, match="not found"):
        PromptSource(task, SourceParams(path=str(tmp_path / "missing.jsonl")), 1)


def test_a_relative_model_folder_resolves_to_an_absolute_path(tmp_path, monkeypatch):
    from rltf_ray.models import resolve_model

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("m") == str(tmp_path / "m") and resolve_model("./m") == str(tmp_path / "m")
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_model("./missing")



def test_a_hub_id_must_be_cached_or_reachable_before_anything_starts(tmp_path, monkeypatch):
    from huggingface_hub import constants

    from rltf_ray.models import resolve_model

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match=r"model.path 'org/absent': not in the local Hugging Face cache .*"
                                          r"HF_HUB_OFFLINE is set.*point model.path at a local model folder"):
        resolve_model("org/absent")
    # in the cache (the layout huggingface_hub writes): loadable offline, passed through as an id
    snap = tmp_path / "hub" / "models--org--cached" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (tmp_path / "hub" / "models--org--cached" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--cached" / "refs" / "main").write_text("abc123")
    assert resolve_model("org/cached") == "org/cached"
    # no network here and no offline flag: the hub cannot be reached, said as such
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens: unreachable anywhere
    with pytest.raises(ConfigError, match=r"judge_model 'org/absent'.*the hub cannot be reached.*HF_HUB_OFFLINE=1"):
        resolve_model("org/absent", "judge_model")


def test_top_p_below_one_is_refused_where_the_ratio_trains():
    base = "pipelines/configs/tiny.yaml"
    with pytest.raises(ConfigError, match=r"node 'first_turn': top_p=0.9 on samples the RL ratio trains"):
        load_config(base, ["pipeline.first_turn.top_p=0.9"])
    with pytest.raises(ConfigError, match=r"node 'revision': top_p=0.9"):
        load_config(base, ["pipeline.revision.top_p=0.9"])  # rltf_sd trains the revision turn (turn1_rl)
    # SD alone takes no ratio on the revision: a nucleus there is allowed
    assert load_config(base, ["pipeline.revision.top_p=0.9", "loss.turn1_rl=false"]).node("revise").params["top_p"] == 0.9


@pytest.mark.parametrize("overrides, said", [
    (["trainer.num_workers=1", "trainer.zero_stage=2"], True),
    (["trainer.num_workers=1", "trainer.zero_stage=0", "binac.zero_stage=1"], True),
    (["trainer.num_workers=1", "trainer.zero_stage=0"], False),
    (["trainer.num_workers=2", "trainer.zero_stage=2"], False),
])
def test_a_single_worker_under_zero_partitioning_is_told_it_saves_nothing(overrides, said, capsys):
    from rltf_ray.services import note_single_worker_zero

    note_single_worker_zero(load_config("pipelines/configs/tiny.yaml", overrides))
    out = capsys.readouterr().out
    assert ("partitions nothing" in out and "trainer.zero_stage=0" in out) == said, out
