"""The calibration split: problems that no evaluation of the test split scores and no run
trains on, on which a room check or a critic's temperature is chosen before scoring."""
import importlib.util
import json
from pathlib import Path

import pytest

from rltf_ray.config import ConfigError, EvalConfig, TaskConfig
from rltf_ray.graph import SourceParams
from rltf_ray.loading import load_config
from rltf_ray.sources import calibration_rows, held_out_rows
from rltf_ray.tasks import get_task

ROOT = Path(__file__).resolve().parent.parent
CONV = TaskConfig(name="convention", extraction="last_number", params={"rule": "concat", "min_digits": 1, "max_digits": 2})


def prompts(rows):
    return [r["prompt"] for r in rows]


def test_convention_calibration_is_disjoint_from_the_scored_and_every_training_problem():
    from rltf_ray.tasks.convention import in_test_split

    task = get_task(CONV)
    scored, cal = task.held_out(64), task.calibration(128, 64)
    assert len(cal) == 128 and len(set(prompts(cal))) == 128
    assert set(prompts(cal)).isdisjoint(prompts(scored))
    # the scored problems are unchanged, and calibration is what comes after them
    assert prompts(task.held_out(64 + 128)) == prompts(scored) + prompts(cal)
    # every calibration pair is a held-out pair, which the training generator never draws
    pairs = [(m["a"], m["b"]) for m in (json.loads(r["meta"]) for r in cal)]
    assert all(in_test_split(a, b) for a, b in pairs)
    train = [json.loads(r["meta"]) for seed in (0, 1, 2) for r in task.rows("train", seed * 100_000, 2000)]
    train += [json.loads(r["meta"]) for r in task.rows("train", 900_000, 1000)]  # the warm starts' problems
    assert not any(in_test_split(m["a"], m["b"]) for m in train)
    assert set(pairs).isdisjoint((m["a"], m["b"]) for m in train)


@pytest.mark.parametrize("name,holdout", [("math", 30), ("writing", 25)])
def test_file_tasks_calibrate_on_their_holdout_rows_after_the_scored_ones(name, holdout):
    task = get_task(TaskConfig(name=name, params={"holdout": holdout}))
    n = holdout - 10
    scored, cal = task.held_out(10), task.calibration(n, 10)
    assert len(cal) == n and set(prompts(cal)).isdisjoint(prompts(scored))
    train = prompts(task.rows("train", 0, task.train_size))
    assert set(prompts(cal)).isdisjoint(train)  # every training row of the file
    with pytest.raises(ConfigError, match=rf"too few for 10 scored \(eval.prompts\) and {n + 1} calibration"):
        task.calibration(n + 1, 10)
    # the shipped holdout (10 rows for math) is all scored at eval.prompts >= 10: nothing is left
    with pytest.raises(ConfigError, match="eval.calibration_path"):
        get_task(TaskConfig(name="math")).calibration(1, 64)


@pytest.mark.parametrize("name", ["knights_knaves", "binary_matrix", "shortest_path"])
def test_puzzle_calibration_comes_from_the_held_out_indices_after_the_scored_ones(name):
    """Training reads dataset indices below TRAIN_SIZE, the test split the rest. (A small
    generator can write one problem at two indices: binary_matrix's 3x3 matrices repeat, so
    its held-out and calibration problems alike can equal a training problem's text.)"""
    pytest.importorskip("reasoning_gym")
    from rltf_ray.tasks.puzzles import TEST_SIZE, TRAIN_SIZE

    task = get_task(TaskConfig(name=name))
    scored, cal = task.held_out(32), task.calibration(32, 32)
    assert len(cal) == 32 and set(prompts(cal)).isdisjoint(prompts(scored))
    index = {r["prompt"]: int(r["prompt_id"].split("-")[1]) for r in cal}
    assert all(0 <= i < TEST_SIZE for i in index.values())
    assert all(json.loads(r["meta"]) == task.make_problem(index[r["prompt"]], "test") for r in cal[:4])
    assert TRAIN_SIZE + TEST_SIZE == len(task.ds)
    # the test split's problem i is the dataset's entry TRAIN_SIZE + i, which training never reads
    entry = task.ds[TRAIN_SIZE + index[cal[0]["prompt"]]]
    assert json.loads(cal[0]["meta"])["question"] == entry["question"]


def test_arithmetic_calibration_is_disjoint_from_the_scored_problems():
    """(Arithmetic's test split draws from the same operands as training: its held-out and
    calibration problems alike can repeat a training problem.)"""
    task = get_task(TaskConfig(params={"min_digits": 2, "max_digits": 4}))
    cal = task.calibration(128, 64)
    assert len(cal) == 128 and set(prompts(cal)).isdisjoint(prompts(task.held_out(64)))


def test_calibration_rows_follow_the_eval_config(tmp_path):
    task, source = get_task(CONV), SourceParams(system_prompt="Be brief.")
    E = EvalConfig(prompts=64, calibration_prompts=32)
    rows = calibration_rows(task, E, source)
    assert prompts(rows) == prompts(task.calibration(32, 64))
    assert json.loads(rows[0]["messages"])[0] == {"role": "system", "content": "Be brief."}
    assert set(prompts(rows)).isdisjoint(prompts(held_out_rows(task, E, source)))

    def write(name, texts):
        path = tmp_path / name
        path.write_text("".join(json.dumps({"prompt_id": f"{name}-{i}", "prompt": t, "answer": "1"}) + "\n"
                                for i, t in enumerate(texts)))
        return str(path)

    math_task = get_task(TaskConfig(name="math"))
    scored = write("scored.jsonl", [f"What is {i} - {i - 1}?" for i in range(1, 6)])
    own = write("cal.jsonl", [f"What is {i} - {i - 1}?" for i in range(10, 14)])
    # scored problems from a file: calibration problems need a file of their own
    with pytest.raises(ConfigError, match="set eval.calibration_path"):
        calibration_rows(math_task, EvalConfig(path=scored), SourceParams())
    got = calibration_rows(math_task, EvalConfig(path=scored, calibration_path=own, calibration_prompts=3),
                           SourceParams())
    assert prompts(got) == [f"What is {i} - {i - 1}?" for i in range(10, 13)]
    overlap = write("overlap.jsonl", ["What is 12 - 11?", "What is 3 - 2?"])
    with pytest.raises(ConfigError, match="1 of its rows are also a scored problem"):
        calibration_rows(math_task, EvalConfig(path=scored, calibration_path=overlap), SourceParams())
    with pytest.raises(ConfigError, match="1 of its rows are also a training prompt"):
        calibration_rows(math_task, EvalConfig(path=scored, calibration_path=own), SourceParams(),
                         train_prompts={"What is 11 - 10?"})


def test_eval_config_keys_and_backward_compatibility():
    cfg = load_config("pipelines/configs/expansion.yaml")
    assert (cfg.eval.split, cfg.eval.calibration_prompts, cfg.eval.calibration_path) == ("test", 128, None)
    assert cfg.eval.critic_temperature is None and cfg.eval.prompts == 64
    with pytest.raises(ConfigError, match="eval.split"):
        load_config(None, ["eval.split=train"])
    with pytest.raises(ConfigError, match="eval.calibration_prompts"):
        load_config(None, ["eval.calibration_prompts=0"])


def load_room_script():
    spec = importlib.util.spec_from_file_location("binac_room", ROOT / "docs" / "scripts" / "binac_room.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_room_check_measures_on_calibration_problems(monkeypatch):
    """binac_room.main, up to the first engine: the problems it measures on are the
    calibration split's (--problems of them), none of the 64 that the evaluation scores."""
    import rltf_ray.models
    import rltf_ray.ray_start

    room = load_room_script()
    seen = {}

    def spy(cfg, task):
        seen["rows"] = room_problems(cfg, task)
        return seen["rows"]

    class Before(Exception):
        pass

    def no_ray(cfg):
        raise Before

    room_problems = room.room_problems
    monkeypatch.setattr(room, "room_problems", spy)
    monkeypatch.setattr(rltf_ray.ray_start, "init_ray", no_ray)
    monkeypatch.setattr(rltf_ray.models, "resolve_model", lambda path, key="model.path": path)
    with pytest.raises(Before):
        room.main(["--critic", "outputs/exp/some_critic", "--out", "/dev/null", "--problems", "96"])
    task = get_task(load_config("pipelines/configs/expansion.yaml").task)
    assert prompts(seen["rows"]) == prompts(task.calibration(96, 64))
    assert set(prompts(seen["rows"])).isdisjoint(prompts(task.held_out(64)))
