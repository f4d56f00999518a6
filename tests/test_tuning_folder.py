"""A Tune trial's run writes in the trial's own folder of Tune's storage, found through the
StorageContext Tune hands every Trainable's constructor (rltf_ray/tuning.py)."""
from pathlib import Path

import pytest

import rltf_ray
from rltf_ray.tuning import trial_folder

TINY = "pipelines/configs/tiny.yaml"


def test_outside_a_local_storage_a_trial_writes_in_its_working_directory(tmp_path):
    assert trial_folder(None, str(tmp_path)) == tmp_path


@pytest.mark.integration
def test_a_trial_finds_its_folder_in_tunes_storage(tmp_path):
    import ray
    from ray import tune

    class Folder(rltf_ray.tune_trainable(rltf_ray.RLTFConfig.from_yaml(TINY))):
        """The trainable's own constructor and folder, without starting a run."""

        def setup(self, config):
            self.folder = str(trial_folder(self.tune_storage, self.logdir))

        def step(self):
            return {"folder": self.folder, "done": True}

        def cleanup(self):
            pass

    ray.init(num_cpus=1, include_dashboard=False)
    try:
        [result] = tune.Tuner(Folder, run_config=tune.RunConfig(storage_path=str(tmp_path), name="f")).fit()
    finally:
        ray.shutdown()
    assert result.metrics["folder"] == result.path and Path(result.path).parent == tmp_path / "f"
