"""The Python API, in RLlib's shape: a config builder, `build()`, then `train()` per step.

    import rltf_ray

    config = (rltf_ray.RLTFConfig.from_yaml("pipelines/configs/tiny.yaml")
              .preset("rltf_sd")
              .training(lr=1e-5)
              .run(steps=4, output_dir="outputs/mine")
              .plugins("my_task.py"))
    with config.build() as algo:
        for _ in range(4):
            print(algo.train()["reward_first_mean"])
        algo.evaluate()
        path = algo.save()

Every setter mirrors a section of the YAML config and checks its keys at once; `build()`
validates the whole config (the same checks as `pipelines/run.py`) before anything starts.
"""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import yaml

from rltf_ray import config as C
from rltf_ray.errors import ConfigError
from rltf_ray.loading import apply_overrides, config_from_data, read_config_file

SECTIONS = {"model": C.ModelConfig, "task": C.TaskConfig, "engine": C.EngineConfig, "loss": C.LossConfig,
            "trainer": C.TrainerConfig, "run": C.RunConfig, "eval": C.EvalConfig, "binac": C.BinacConfig}


class RLTFConfig:
    """A mutable builder over the YAML config's data; each setter returns the builder."""

    def __init__(self, data: dict | None = None):
        self._data: dict = copy.deepcopy(data or {})
        self._overrides: list[str] = []

    @classmethod
    def from_yaml(cls, path: str | Path) -> "RLTFConfig":
        return cls(read_config_file(path))

    @classmethod
    def from_dict(cls, data: dict) -> "RLTFConfig":
        return cls(data)

    def to_dict(self) -> dict:
        """The builder's settings as a YAML file would hold them, `.node()` and `.override()`
        ones included (not the resolved config): `from_dict(to_dict())` builds the same run."""
        return apply_overrides(self._data, self._overrides)

    def copy(self) -> "RLTFConfig":
        new = RLTFConfig(self._data)
        new._overrides = list(self._overrides)
        return new

    def _section(self, name: str, values: dict) -> "RLTFConfig":
        known = {f.name for f in dataclasses.fields(SECTIONS[name])}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"{name}: unknown key '{unknown[0]}' (known: {', '.join(sorted(known))})")
        self._data.setdefault(name, {}).update(copy.deepcopy(values))
        return self

    def model(self, **values) -> "RLTFConfig":
        return self._section("model", values)

    def task(self, name: str | None = None, **values) -> "RLTFConfig":
        """Another task starts from its own params: the config's were its task's.
        `reward_funcs` (and `correct_from`) may hold functions: a module's is named by its
        module, which ships as a plugin; one defined in the script or notebook ships by value."""
        if "reward_funcs" in values:
            values["reward_funcs"] = [f if isinstance(f, str) else self._reward_ref(f) for f in values["reward_funcs"]]
        if callable(values.get("correct_from")):
            values["correct_from"] = self._reward_ref(values["correct_from"])
        current = self._data.get("task") or {}
        after = {**current, **values, **({"name": name} if name else {})}
        if C.task_name(after) != C.task_name(current) and "params" not in values:
            values["params"] = {}
        return self._section("task", {**({"name": name} if name else {}), **values})

    def _reward_ref(self, fn) -> str:
        """A reward function's reference. One importable by name (a module's) ships its module as
        a plugin; one defined in the script or notebook (`__main__`), a lambda or a nested
        function ships by value (rltf_ray.shipping), as Ray ships such a function."""
        if not callable(fn):
            raise ConfigError(f"task.reward_funcs: {fn!r} is neither a function nor 'module:function'")
        module = getattr(fn, "__module__", None)
        qual = getattr(fn, "__qualname__", "")
        if not module or module == "__main__" or "<" in qual or "." in qual:
            from rltf_ray.shipping import function_name, ship_by_value

            name = function_name(fn)
            return f"{ship_by_value(functions={name: fn})}:{name}"
        if module not in self._data.get("plugins", []) and not module.startswith("rltf_ray."):
            self.plugins(module)
        return f"{module}:{qual}"

    def engine(self, **values) -> "RLTFConfig":
        return self._section("engine", values)

    def loss(self, **values) -> "RLTFConfig":
        return self._section("loss", values)

    def training(self, **values) -> "RLTFConfig":
        """The learner's settings (the `trainer:` section): lr, zero_stage, lora, ..."""
        return self._section("trainer", values)

    def run(self, **values) -> "RLTFConfig":
        return self._section("run", values)

    def evaluation(self, **values) -> "RLTFConfig":
        """The held-out evaluation's settings (the `eval:` section)."""
        return self._section("eval", values)

    def binac(self, **values) -> "RLTFConfig":
        return self._section("binac", values)

    def preset(self, name: str) -> "RLTFConfig":
        """An objective preset by name (see `rltf_ray.preset_names()`) or a YAML path."""
        self._data["preset"] = name
        return self

    def plugins(self, *specs: str) -> "RLTFConfig":
        """Modules (import names or .py paths) that register your tasks and critics."""
        self._data["plugins"] = [*self._data.get("plugins", []), *specs]
        return self

    def node(self, name: str, **params) -> "RLTFConfig":
        """Parameters of one pipeline node, e.g. `.node("critic", critic="my_critic")`."""
        self._overrides += [f"pipeline.{name}.{k}={yaml.safe_dump(v, default_flow_style=True).strip()}"
                            for k, v in params.items()]
        return self

    def pipeline(self, nodes: list[dict]) -> "RLTFConfig":
        """The whole pipeline graph, as the YAML's `pipeline:` list of nodes."""
        self._data["pipeline"] = copy.deepcopy(nodes)
        return self

    def override(self, *assignments: str) -> "RLTFConfig":
        """`section.key=value` overrides, exactly as on the command line."""
        self._overrides += list(assignments)
        return self

    def resolve(self) -> C.Config:
        """The validated, frozen Config (presets applied, graph checked); starts nothing."""
        return config_from_data(self._data, self._overrides)

    def build(self) -> "RLTF":
        return RLTF(self.resolve())


class RLTF:
    """A built run: `train()` runs one RL step. Ray, the engines, the critic app and the
    learner start on the first call that needs them and stay until `stop()`."""

    def __init__(self, cfg: C.Config):
        from rltf_ray.runner import Pipeline

        if cfg.run.max_staleness > 0:
            raise ConfigError(f"run.max_staleness={cfg.run.max_staleness}: RLTF.train() runs one step at a "
                              "time, so rollouts cannot overlap training here; run the config with "
                              "pipelines/run.py, or rltf_ray.runner.run(config.resolve()), for asynchronous rollouts")
        self.config = cfg
        # Built now, started on first use: every check the command line makes before Ray
        # starts (the task and its params, the prompt and held-out files) fails in build().
        self._checked = Pipeline(cfg)
        self._pipe = None
        self._restore_from: str | None = None
        self._stopped = False
        self._broken: str | None = None  # why this RLTF cannot go on (an interrupted step)

    def _pipeline(self, train: bool = True):
        if self._stopped:
            raise RuntimeError("this RLTF was stopped; build() a new one")
        if self._broken:
            raise RuntimeError(self._broken)
        if self._pipe is None:
            from rltf_ray.runner import Pipeline

            cfg = self.config
            if self._restore_from is not None:
                cfg = dataclasses.replace(cfg, run=dataclasses.replace(
                    cfg.run, output_dir=self._restore_from, resume="must"))
            self._pipe = self._checked if self._restore_from is None else Pipeline(cfg)
            self._pipe.start(train=train)
            self._trains = train
            if train:
                self._pipe.begin()
        elif train and not self._trains:
            raise RuntimeError("evaluate() before train() started the engines without a learner; "
                               "build() a new RLTF to train (and evaluate after its first train())")
        return self._pipe

    @property
    def iteration(self) -> int:
        """Steps trained so far (including those restored from a checkpoint)."""
        return 0 if self._pipe is None or self._pipe.next_step is None else self._pipe.next_step

    def train(self) -> dict:
        """One RL step: rollouts, critiques, revisions, the learner's update and the weight
        sync. Returns that step's metrics row (`step` is 0-based). After the last of
        `run.steps`, the run is finished (summary.json, the "after" evaluation)."""
        pipe = self._pipeline()
        step = pipe.next_step
        try:
            row = pipe.train_step()
        except BaseException as e:  # KeyboardInterrupt included
            # The learner may have trained the step while its rollouts and metrics were not
            # recorded: running it again would pair them with another step's.
            self._broken = (f"train() was interrupted in step {step + 1} ({type(e).__name__}); the learner may "
                            "have trained that step without its rollouts and metrics being recorded, so this "
                            "RLTF cannot go on. stop() it, build() a new RLTF and restore() the output dir "
                            f"{pipe.out} to continue from its last checkpoint (run.checkpoint_every)")
            raise
        if pipe.finished:
            pipe.end()
        return row

    def evaluate(self) -> dict:
        """Held-out evaluation of the current policy with every measure `eval` asks for.
        Before the first train() it starts the engines and the critic only (no learner)."""
        return self._pipeline(train=self._pipe is not None and self._trains).evaluate()

    def save(self) -> str:
        """Checkpoint the learner's state after the steps trained so far; returns the run's
        output dir, which `restore()` (or `pipelines/run.py --resume`) continues from."""
        if self._broken:
            raise RuntimeError(self._broken)
        if self._pipe is None or not self._trains:
            raise RuntimeError("save() before the first train(): nothing is trained yet")
        return self._pipe.save()

    def restore(self, output_dir: str) -> None:
        """Continue the run saved in `output_dir` (its checkpoints and metrics): call it on a
        freshly built RLTF, before the first train(); training resumes after the saved step."""
        if self._pipe is not None:
            raise RuntimeError("restore() must come before the first train() or evaluate(); "
                               "build() a new RLTF to restore into")
        if not Path(output_dir).is_dir():
            raise ConfigError(f"restore: no such output dir: {output_dir}")
        self._restore_from = str(Path(output_dir).resolve())

    def stop(self) -> None:
        if self._pipe is not None:
            self._pipe.stop()
        self._stopped = True

    def __enter__(self) -> "RLTF":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
