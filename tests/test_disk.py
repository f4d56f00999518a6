"""The disk check a training run makes before anything starts (rltf_ray/disk.py)."""
import shutil
from collections import namedtuple

import pytest

from rltf_ray.config import ConfigError
from rltf_ray.loading import load_config
from rltf_ray.disk import needed_bytes, param_count


def cfg_with(tmp_path, *overrides):
    return load_config("pipelines/configs/tiny.yaml", [f"run.output_dir={tmp_path}", *overrides])


def test_param_count_reads_the_safetensors_headers(tiny_path):
    from transformers import AutoModelForCausalLM

    expected = AutoModelForCausalLM.from_pretrained(tiny_path).num_parameters()  # a tied head once
    assert param_count(tiny_path) == expected > 0
    assert param_count("org/not-a-folder") == 0


def test_needed_bytes_counts_hf_folders_and_deepspeed_states(tmp_path):
    # 8 steps, a checkpoint every 3: HF folders at steps 3, 6 and 8; 2 kept DeepSpeed states + 1 new
    cfg = cfg_with(tmp_path, "run.steps=8", "run.checkpoint_every=3", "run.keep_checkpoints=2")
    assert needed_bytes(cfg, 1000, str(tmp_path / "ray_train"), tmp_path) == {tmp_path: 3 * 4000 + 3 * 16000}
    lora = cfg_with(tmp_path, "run.steps=8", "trainer.lora={rank: 4, alpha: 8}")
    assert needed_bytes(lora, 1000, str(tmp_path / "ray_train"), tmp_path) == {tmp_path: 4000 + 3 * 2000}
    remote = needed_bytes(cfg, 1000, "s3://bucket/runs", tmp_path)  # remote storage: HF folders only
    assert remote == {tmp_path: 3 * 4000}


def test_a_run_whose_checkpoints_cannot_fit_fails_before_ray_starts(tmp_path, tiny_path, monkeypatch):
    import ray

    from rltf_ray.runner import Pipeline

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 10**6, 10**6))  # 1 MB free
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"has 0\.0 GB free, but this run's checkpoints need about .* GB "
                                          r"there .*run\.check_disk=false"):
        Pipeline(cfg_with(out)).start()
    assert not ray.is_initialized() and not out.exists()
    from rltf_ray.disk import check_disk

    check_disk(cfg_with(out, "run.check_disk=false"), [tiny_path], str(out / "ray_train"), out)  # skipped
