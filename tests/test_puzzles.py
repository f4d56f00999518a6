"""The paper's puzzle tasks: determinism, verifiers and critiques that never leak the answer."""
import json

import pytest

from rltf_ray.config import ConfigError, TaskConfig
from rltf_ray.tasks import get_task

PUZZLES = ["knights_knaves", "binary_matrix", "shortest_path"]


def flip_first(meta):
    md = meta["metadata"]
    t = md.get("knight_knave_terms") or {"knight": "knight", "knave": "knave"}
    sol = [not md["solution"][0]] + md["solution"][1:]
    return ", ".join(f"{n} is a {t['knight'] if s else t['knave']}" for n, s in zip(md["names"], sol))


def task(name, **params):
    return get_task(TaskConfig(name=name, params=params))


@pytest.mark.parametrize("name", PUZZLES)
def test_deterministic_per_seed_and_heldout_split(name):
    a = [r["prompt"] for r in task(name).rows("train", 0, 5)]
    assert a == [r["prompt"] for r in task(name).rows("train", 0, 5)]
    assert a != [r["prompt"] for r in get_task(TaskConfig(name=name, seed=3)).rows("train", 0, 5)]
    assert set(a).isdisjoint(r["prompt"] for r in task(name).rows("test", 0, 5))


@pytest.mark.parametrize("name", PUZZLES)
def test_verifier_accepts_truth_rejects_perturbation_and_critique_hides_it(name):
    t = task(name)
    for r in t.rows("train", 0, 25):
        meta = json.loads(r["meta"])
        truth = meta["answer"]
        assert t.score(f"<answer>{truth}</answer>", meta).correct
        wrong = {"knights_knaves": lambda: flip_first(meta),
                 "binary_matrix": lambda: truth[:-1] + ("9" if truth[-1] != "9" else "8"),
                 "shortest_path": lambda: "infeasible" if truth != "infeasible" else "up"}[name]()
        assert not t.score(f"<answer>{wrong}</answer>", meta).correct
        c = t.critique(f"<answer>{wrong}</answer>", meta)
        assert c.startswith("Your answer is incorrect. ") and len(c) > 40
        if len(truth) > 2:
            assert truth not in c


def test_specific_critiques():
    kk = task("knights_knaves")
    meta = json.loads(next(kk.rows("train", 0, 1))["meta"])
    names = meta["metadata"]["names"]
    c = kk.critique(f"<answer>{flip_first(meta)}</answer>", meta)
    assert "inconsistent" in c and any(n in c for n in names)
    assert "does not say whether" in kk.critique(f"<answer>{names[0]} is a nobody</answer>", meta)

    bm = task("binary_matrix")
    meta = {"metadata": {"solution": [[0, 1], [1, 2]], "matrix": [[0, 1], [1, 1]]}, "answer": "0 1\n1 2"}
    assert bm.explain("0 1\n1 3", meta) == ("1 cell is wrong, in row 2. Recompute the distance to the "
                                              "nearest 0 for those cells.")
    assert "wrong shape" in bm.explain("0 1 1", meta)

    sp = task("shortest_path")
    grid = [["*", "O", "O"], ["X", "X", "O"], ["#", "O", "O"]]
    meta = {"metadata": {"matrix": grid}, "answer": "right right down down left left"}
    assert "step 1 moves into a blocked cell" in sp.explain("down", meta)
    assert "step 1 leaves the grid" in sp.explain("up", meta)
    assert "does not end at the destination" in sp.explain("right", meta)
    assert "does exist" in sp.explain("infeasible", meta)
    assert "2 steps longer" in sp.explain("right right down down left left right left", meta)


def test_rg_any_dataset_and_levels():
    t = get_task(TaskConfig(name="rg:basic_arithmetic"))
    meta = json.loads(next(t.rows("train", 0, 1))["meta"])
    assert t.score(f"<answer>{meta['answer']}</answer>", meta).correct
    easy = task("knights_knaves", level="easy")
    assert len(json.loads(next(easy.rows("train", 0, 1))["meta"])["metadata"]["names"]) == 2
    with pytest.raises(ConfigError, match="level"):
        task("binary_matrix", level="hard")
    with pytest.raises(ConfigError, match="rejected"):
        task("binary_matrix", bogus=1)
