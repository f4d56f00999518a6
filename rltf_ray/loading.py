"""Loading a Config: YAML, presets, `a.b=c` overrides and plugins, then the graph's
validation. Kept apart from rltf_ray/config.py (the typed dataclasses alone) so that the
config does not need the graph, and the graph can import the config."""
from __future__ import annotations

import copy
import dataclasses
import os
import typing
from pathlib import Path
from typing import Any

import yaml

from rltf_ray.config import DEFAULT_PIPELINE, Config, _build, task_name
from rltf_ray.errors import ConfigError
from rltf_ray.graph import expand_rounds, validate
from rltf_ray.plugins import is_path, load_plugins, module_name


def _parse_scalar(text: str) -> Any:
    return yaml.safe_load(text) if text != "" else ""


def apply_override(data: dict, override: str) -> None:
    """Apply `a.b.c=value` to a nested dict; `pipeline.<node>.<param>=v` sets node params."""
    if "=" not in override:
        raise ConfigError(f"override '{override}': expected key=value")
    key, _, raw = override.partition("=")
    parts = key.strip().split(".")
    value = _parse_scalar(raw)
    if parts[0] == "pipeline":
        if len(parts) != 3:
            raise ConfigError(f"override '{override}': use pipeline.<node>.<param>=value")
        nodes = data.setdefault("pipeline", [dataclasses.asdict(n) for n in DEFAULT_PIPELINE])
        match = [n for n in nodes if n.get("name") == parts[1]]
        if not match:
            raise ConfigError(f"override '{override}': no pipeline node named '{parts[1]}'")
        match[0].setdefault("params", {})[parts[2]] = value
        return
    cur = data
    for p in parts[:-1]:
        nxt = cur.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override '{override}': '{p}' is not a section")
        cur = nxt
    cur[parts[-1]] = value


PRESET_DIR = Path(__file__).resolve().parent / "presets"  # shipped in the wheel


def preset_file(preset: str) -> Path:
    """A preset by name (rltf_ray/presets/NAME.yaml) or the path of a YAML file of one's own."""
    if preset.endswith((".yaml", ".yml")):
        p = Path(preset)
        if not p.is_file():
            raise ConfigError(f"preset file not found: {p}")
        return p
    p = PRESET_DIR / f"{preset}.yaml"
    if not p.is_file():
        raise ConfigError(f"unknown preset '{preset}' (known: {', '.join(preset_names())}, or a .yaml path)")
    return p


def preset_names() -> list[str]:
    return sorted(f.stem for f in PRESET_DIR.glob("*.yaml"))


def preset_description(name: str) -> str:
    return str((yaml.safe_load(preset_file(name).read_text()) or {}).get("description", ""))


def _merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _lookup(data: dict, dotted: str):
    for part in dotted.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


CONFIG_DIR = Path(__file__).parent / "configs"  # the shipped configs (pipelines/configs in a checkout)


def config_names() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def config_file(path: str | os.PathLike) -> Path:
    """A config file's path, or a shipped config by name (`demo`: rltf_ray/configs/demo.yaml)."""
    p = Path(path)
    if p.is_file():
        return p
    if p.suffix not in (".yaml", ".yml") and os.sep not in str(path) and (CONFIG_DIR / f"{path}.yaml").is_file():
        return CONFIG_DIR / f"{path}.yaml"
    raise ConfigError(f"config file not found: {p} (or a shipped config by name: {', '.join(config_names())})")


def read_config_file(path: str | os.PathLike) -> dict:
    """A config file's plain data (what `config_from_data` takes)."""
    p = config_file(path)
    loaded = yaml.safe_load(p.read_text()) or {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{p}: top level must be a mapping")
    return loaded


def load_config(path: str | os.PathLike | None = None, overrides: typing.Sequence[str] = (),
                preset: str | None = None, plugins: typing.Sequence[str] = ()) -> Config:
    """A Config from a YAML file (or the defaults), a preset, overrides and extra plugins
    (`--plugin`, added to the file's `plugins:`)."""
    data = read_config_file(path) if path is not None else {}
    if plugins:
        data = {**data, "plugins": [*(data.get("plugins") or []), *plugins]}
    return config_from_data(data, overrides, preset)


def config_from_data(data: dict, overrides: typing.Sequence[str] = (), preset: str | None = None) -> Config:
    """A validated Config from a config's plain data (as a YAML file holds it), a preset
    (`preset` wins over the data's own `preset:` key) and `a.b=c` overrides. `data` itself is
    left as it was."""
    data = copy.deepcopy(data)
    file_preset = data.pop("preset", None)  # --preset wins over the config's own
    preset = preset or file_preset
    if preset:
        preset_data = yaml.safe_load(preset_file(preset).read_text()) or {}
        preset_data.pop("description", None)
        node_defaults = preset_data.pop("node_params", {})
        # keys that define the preset (fixed_critic's frozen critic): a config or override
        # that changes one would silently turn the preset into another method
        locked = {k: _lookup(preset_data, k) for k in preset_data.pop("locked", [])}
        data = _merge(preset_data, data)
    else:
        node_defaults, locked = {}, {}
    file_task = task_name(data.get("task") or {})
    for o in overrides:
        apply_override(data, o)
    _task_params_follow_the_task(data, file_task, overrides)
    for key, want in locked.items():
        if _lookup(data, key) != want:
            raise ConfigError(f"preset '{preset}' fixes {key} = {want!r}; the config or an override "
                              f"sets {_lookup(data, key)!r}. Drop that setting or choose another preset")
    if node_defaults:  # a preset's node params fill what the config and overrides left unset
        nodes = data.setdefault("pipeline", [dataclasses.asdict(n) for n in DEFAULT_PIPELINE])
        for n in nodes:
            if isinstance(n, dict) and n.get("kind") in node_defaults:
                n["params"] = {**node_defaults[n["kind"]], **(n.get("params") or {})}
    return build_config(data)


def apply_overrides(data: dict, overrides: typing.Sequence[str]) -> dict:
    """`data` with `overrides` written into it, as `config_from_data` applies them (a copy)."""
    data = copy.deepcopy(data)
    file_task = task_name(data.get("task") or {})
    for o in overrides:
        apply_override(data, o)
    _task_params_follow_the_task(data, file_task, overrides)
    return data


def _task_params_follow_the_task(data: dict, file_task: str | None, overrides: typing.Sequence[str]) -> None:
    """An override that changes the task (task.name, or task.reward_funcs on the default task)
    without giving task.params drops the file's params: they were the file's task's
    (`demo.yaml`'s digits mean nothing to a task of your own)."""
    task = data.get("task")
    if not isinstance(task, dict) or task_name(task) == file_task or "params" not in task:
        return
    if not any(o.split("=", 1)[0].strip() in ("task", "task.params") or o.startswith("task.params.")
               for o in overrides):
        task["params"] = {}


def _absolute_plugins(data: dict) -> None:
    """A plugin given as a relative .py path is made absolute (a resumed run, or a worker's
    config dict, must find it whatever the working directory)."""
    plugins = data.get("plugins")
    if isinstance(plugins, list):
        data["plugins"] = [str(Path(p).resolve()) if isinstance(p, str) and is_path(p) and Path(p).is_file()
                           else p for p in plugins]


def _reward_plugins(data: dict) -> None:
    """A reward function given as 'path/to/file.py:function' ships its file as a plugin and is
    named by the plugin's module ('file:function') from then on, in task.correct_from too."""
    task = data.get("task")
    funcs = task.get("reward_funcs") if isinstance(task, dict) else None
    if not isinstance(funcs, list):
        return
    refs = []
    for ref in funcs:
        path, _, fn = ref.rpartition(":") if isinstance(ref, str) else ("", "", ref)
        if path.endswith(".py"):
            if not Path(path).is_file():
                raise ConfigError(f"task.reward_funcs: file not found: {path} (from {ref!r})")
            if path not in (data.get("plugins") or []):
                data["plugins"] = [*(data.get("plugins") or []), path]
            new = f"{module_name(path)}:{fn}"
            if task.get("correct_from") == ref:
                task = {**task, "correct_from": new}
            ref = new
        refs.append(ref)
    data["task"] = {**task, "reward_funcs": refs}


def build_config(data: dict) -> Config:
    """A validated Config from a plain dict: plugins are imported first (they register the
    tasks and critics that validation looks up), then the graph is expanded and checked."""
    _reward_plugins(data)
    _absolute_plugins(data)
    plugins = data.get("plugins") or []
    if not isinstance(plugins, list):
        raise ConfigError(f"plugins: expected a list of module names or .py paths, got {plugins!r}")
    load_plugins(plugins)
    cfg = expand_rounds(_build(Config, data, ""))
    check_task_name(cfg.task.name)
    check_reward_funcs(cfg.task)
    validate(cfg)
    shipped = ship_main_classes(cfg)
    if shipped:  # the config again, with the generated module among its plugins
        data["plugins"] = [*plugins, shipped]
        load_plugins([shipped])
        cfg = expand_rounds(_build(Config, data, ""))
    return cfg


def ship_main_classes(cfg: Config) -> str | None:
    """A task or critic class defined in the script being run (`__main__`, a notebook) is not
    importable by Ray workers by name: it ships by value (rltf_ray.shipping). The generated
    module's path, or None when there is nothing to ship."""
    from rltf_ray.critics import get_critic
    from rltf_ray.tasks import task_class

    def from_main(cls) -> bool:  # a class shipped already (a resumed run's) stays as it is
        return cls.__module__ == "__main__" and not getattr(cls, "_rltf_shipped", False)

    name, critic = cfg.task.name, cfg.node("critique").params.get("critic", "programmatic")
    tasks = {name: task_class(name)} if not name.startswith("rg:") and from_main(task_class(name)) else {}
    critics = {critic: get_critic(critic)} if from_main(get_critic(critic)) else {}
    if not tasks and not critics:
        return None
    from rltf_ray.shipping import ship_by_value

    return str(ship_by_value(tasks=tasks, critics=critics))


def check_task_name(name: str) -> None:
    """The task must be registered (built in, or by a plugin) where Ray workers can import it."""
    from rltf_ray.tasks import task_class, task_names

    if name.startswith("rg:"):
        return
    cls = task_class(name)
    if cls is None:
        raise ConfigError(f"task.name: unknown task '{name}' (known: {', '.join(task_names())}, or "
                          "rg:<reasoning-gym dataset>). A task of your own: register it with "
                          "@rltf_ray.register_task in a module listed under `plugins:` (or --plugin)")


def check_reward_funcs(task) -> None:
    """task.reward_funcs name importable functions of a reward function's shape, and
    task.correct_from one of them: a missing module or a wrong signature fails here, before
    Ray starts, as building the task would later."""
    from rltf_ray.tasks.rewards import correct_index, resolve

    for ref in task.reward_funcs:
        resolve(ref)
    if task.reward_funcs:
        correct_index(list(task.reward_funcs), task.correct_from)


def config_from_dict(data: dict) -> Config:
    """Rebuild a Config shipped to a worker as a plain dict (already validated); its plugins
    are imported here, as the shipped modules of the same names."""
    load_plugins(data.get("plugins") or [])
    return _build(Config, data, "")
