"""A run's name in the trackers and the `run` tag of its Ray metrics: unique per output folder,
the same when the run resumes in that folder (rltf_ray/tracking.py)."""
from pathlib import Path
from types import SimpleNamespace

from rltf_ray.tracking import Tracker, run_tag

OFF = SimpleNamespace(tensorboard=False, mlflow=None, wandb_project=None)


def test_runs_whose_folders_share_a_last_part_get_different_names(tmp_path, monkeypatch):
    a, b = run_tag(tmp_path / "a" / "seed0"), run_tag(tmp_path / "b" / "seed0")
    assert a != b and a.startswith("seed0-") and b.startswith("seed0-") and len(a) == len("seed0-") + 6
    # a resumed run (the same folder, named from anywhere) keeps its name
    monkeypatch.chdir(tmp_path.parent)
    assert run_tag(Path(tmp_path.name) / "a" / "seed0") == a
    assert run_tag(tmp_path / "a" / "x" / ".." / "seed0") == a
    assert Tracker(OFF, tmp_path / "a" / "seed0").name == a


def test_every_ray_metric_of_the_driver_carries_the_run_tag(tmp_path, monkeypatch):
    import ray.util.metrics as metrics

    made = []

    class Metric:
        def __init__(self, name, description="", tag_keys=()):
            self.name, self.tag_keys, self.tags, self.values = name, tag_keys, {}, []
            made.append(self)

        def set_default_tags(self, tags):
            self.tags = tags

        def set(self, value, tags=None):
            self.values.append((value, {**self.tags, **(tags or {})}))

        inc = set

    monkeypatch.setattr(metrics, "Gauge", Metric)
    monkeypatch.setattr(metrics, "Counter", Metric)
    t = Tracker(OFF, tmp_path / "seed0", stages=("first_turn",))
    t.log({"step": 0, "rows": 8, "seconds_rollout": 1.5, "loss": 0.25}, 0)
    assert made and all("run" in m.tag_keys and m.tags == {"run": t.name} for m in made)
    values = [v for m in made for v in m.values]
    assert values and all(tags["run"] == t.name for _, tags in values)
    assert (8.0, {"run": t.name, "stage": "first_turn"}) in values
    assert (1.5, {"run": t.name, "phase": "rollout"}) in values
