"""Will the run's checkpoints fit on disk? Checked before anything starts, because a full disk
is otherwise found at the first checkpoint, after the engines, the learner and the first
steps have run (and a run that resumes needs the space again)."""
from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

from rltf_ray.config import Config, ConfigError

# Bytes per parameter, measured on SmolLM2-135M with bf16 ZeRO-2: the DeepSpeed state (fp32
# master weights, two AdamW moments, the bf16 module) is 2.1 GB, 15.6 bytes a parameter; the HF
# folder for vLLM is saved in fp32. Under LoRA only the module's weights are large.
DS_BYTES_PER_PARAM = 16
DS_BYTES_PER_PARAM_LORA = 2
HF_BYTES_PER_PARAM = 4


def param_count(model_path: str) -> int:
    """Parameters of an HF folder, from its safetensors headers (no weights are read); a Hub id
    or a folder without safetensors counts as 0, since its size cannot be known here."""
    files = sorted(Path(model_path).glob("*.safetensors")) if Path(model_path).is_dir() else []
    if not files:
        return 0
    from safetensors import safe_open

    n = 0
    for f in files:
        with safe_open(str(f), "np") as st:
            n += sum(math.prod(st.get_slice(k).get_shape()) for k in st.keys())
    return n


def checkpoint_bytes(cfg: Config, params: int) -> tuple[int, int]:
    """(one DeepSpeed state, one HF folder) in bytes for a model of `params` parameters."""
    ds = DS_BYTES_PER_PARAM_LORA if cfg.trainer.lora else DS_BYTES_PER_PARAM
    return params * ds, params * HF_BYTES_PER_PARAM


def needed_bytes(cfg: Config, params: int, storage: str, out: Path) -> dict[Path, int]:
    """Bytes the run's checkpoints will hold at their peak, per existing folder whose filesystem
    receives them: every HF folder (they are kept), and keep_checkpoints + 1 DeepSpeed states
    (a new one is persisted before the oldest is deleted) unless storage is remote."""
    run = cfg.run
    ds, hf = checkpoint_bytes(cfg, params)
    every = run.checkpoint_every
    n_hf = run.steps // every + (run.steps % every != 0) if every else 1  # and at the last step
    need = {existing_parent(out): n_hf * hf}
    if "://" not in storage:
        where = existing_parent(Path(storage))
        need[where] = need.get(where, 0) + (run.keep_checkpoints + 1) * ds
    by_device: dict[int, tuple[Path, int]] = {}
    for path, n in need.items():  # two folders on one filesystem share its free space
        dev = os.stat(path).st_dev
        first, total = by_device.get(dev, (path, 0))
        by_device[dev] = (first, total + n)
    return dict(by_device.values())


def existing_parent(path: Path) -> Path:
    path = path.resolve()
    while not path.exists():
        path = path.parent
    return path


def check_disk(cfg: Config, model_paths: list[str], storage: str, out: Path) -> None:
    """ConfigError, before anything starts, when the checkpoints cannot fit (run.check_disk)."""
    if not cfg.run.check_disk:
        return
    params = sum(param_count(p) for p in model_paths)
    for where, need in needed_bytes(cfg, params, storage, out).items():
        free = shutil.disk_usage(where).free
        if need > free:
            raise ConfigError(
                f"{where} has {free / 1e9:.1f} GB free, but this run's checkpoints need about "
                f"{need / 1e9:.1f} GB there ({params / 1e6:.0f}M parameters: HF folders in checkpoints/ "
                f"and up to run.keep_checkpoints + 1 = {cfg.run.keep_checkpoints + 1} DeepSpeed states in "
                f"{storage}). Free space, raise run.checkpoint_every or lower run.keep_checkpoints, put "
                "run.storage_path or run.output_dir on a larger volume, or set run.check_disk=false")
