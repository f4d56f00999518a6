"""User code that registers tasks and critics, loaded everywhere a task or critic is resolved.

A plugin is a module named by import name (`my_pkg.tasks`) or by the path of a `.py` file
(`./my_task.py`). The driver imports it before the config is validated; every Ray process
that rebuilds a task or a critic by name (Serve replicas, Ray Data workers, Train workers)
imports it too, because `worker_runtime_env` ships it:

* a `.py` file is copied into a package folder of the same name and sent through Ray's
  `py_modules`, so a file that exists only on the submitting machine is importable on every
  node of a cluster (the driver imports it under that same module name, so that pickled
  classes resolve to it on both sides); the modules beside it that it imports when it loads
  (`from my_helpers import ...`: a file or a package folder next to it) ship with it;
* a module by name is shipped the same way when it lives outside site-packages (a local
  package folder); an installed package is expected to be installed on the workers;
* the env var RLTF_RAY_PLUGINS lists the module names, and the registries import them on
  first use in each process (`load_env_plugins`); a worker imports the shipped copy even
  where the file also exists, so every process runs the code as it was when the run started.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from rltf_ray.errors import ConfigError

ENV = "RLTF_RAY_PLUGINS"
_loaded: dict[str, str] = {}  # spec -> module name
_helpers: dict[str, list[str]] = {}  # a plugin file -> the modules beside it that it imported
_digests: dict[str, str] = {}  # a plugin file or helper -> the content this process imported


class PluginError(ConfigError):
    """A plugin that cannot be found or fails while it is imported."""


def is_path(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec


def module_name(spec: str) -> str:
    """The import name a plugin has in every process: a file's stem, or the name itself."""
    if is_path(spec):
        stem = Path(spec).stem
        if not stem.isidentifier():
            raise PluginError(f"plugin {spec!r}: the file name must be a Python identifier to be "
                              f"importable on Ray workers (got {stem!r})")
        return stem
    return spec


def _import_file(path: Path, name: str):
    existing = sys.modules.get(name)
    if existing is not None:
        if Path(getattr(existing, "__file__", "") or "").resolve() == path.resolve():
            return existing
        raise PluginError(f"plugin {str(path)!r}: a module named {name!r} is already imported from "
                          f"{getattr(existing, '__file__', None)}; rename the file")
    if name in sys.stdlib_module_names:
        raise PluginError(f"plugin {str(path)!r}: its name {name!r} is a standard-library module's, which "
                          "it would hide in every process that loads it; rename the file")
    found = importlib.util.find_spec(name)
    if found is not None and found.origin and Path(found.origin).resolve() != path.resolve():
        raise PluginError(f"plugin {str(path)!r}: its name {name!r} is already taken by {found.origin}, "
                          "which it would hide on the workers; rename the file")
    # As `python path` would: modules beside the plugin import by their names (its helpers).
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.append(folder)
    before = set(sys.modules)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before exec: classes defined in it pickle by this name
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    _helpers[str(path.resolve())] = _local_modules(set(sys.modules) - before - {name}, Path(folder))
    for f in [path.resolve(), *(Path(h) for h in _helpers[str(path.resolve())] if Path(h).is_file())]:
        _digests[str(f)] = _digest(f)
    return module


def _local_modules(names: set[str], folder: Path) -> list[str]:
    """The files or package folders, inside `folder`, of the modules in `names` (the plugin's
    helpers, imported with it): what must ship beside it for its imports to work on a worker."""
    out = set()
    for n in names:
        origin = getattr(sys.modules.get(n), "__file__", None)
        if not origin or _installed(Path(origin)):
            continue
        top = n.split(".")[0]
        for candidate in (folder / top, folder / f"{top}.py"):
            if candidate.exists() and Path(origin).resolve().is_relative_to(candidate.resolve()):
                out.add(str(candidate))
    return sorted(out)


def _digest(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()


def _forget_if_edited(spec: str, name: str) -> None:
    """A plugin file (or a helper beside it) edited since this process imported it is
    imported again, so that the driver runs what a rebuilt run ships to the workers."""
    path = Path(spec).resolve()
    files = [path, *(Path(h) for h in _helpers.get(str(path), []) if Path(h).is_file())]
    if all(f.is_file() and _digests.get(str(f)) == _digest(f) for f in files):
        return
    stale = {name} | {Path(h).stem if h.endswith(".py") else Path(h).name for h in _helpers.get(str(path), [])}
    for mod in [m for m in sys.modules if m.split(".")[0] in stale]:
        del sys.modules[mod]
    del _loaded[spec]


def load_plugin(spec: str) -> str:
    """Import one plugin (once per process, again after its file was edited); its module
    name. Errors name the plugin."""
    name = module_name(spec)
    shipped = name in os.environ.get(ENV, "").split(",")  # a Ray worker: the driver's snapshot
    if spec in _loaded and is_path(spec) and not shipped and Path(spec).is_file():
        _forget_if_edited(spec, name)
    if spec in _loaded:
        return _loaded[spec]
    try:
        if is_path(spec) and Path(spec).is_file() and not shipped:
            _import_file(Path(spec), name)
        elif is_path(spec) and name not in sys.modules and importlib.util.find_spec(name) is None:
            # on a worker the file's path does not exist: it was shipped as a package of that name
            raise PluginError(f"plugin {spec!r}: no such file, and no module {name!r} importable in "
                              "this process (was it shipped with rltf_ray.plugins.worker_runtime_env?)")
        else:
            importlib.import_module(name)
    except PluginError:
        raise
    except ModuleNotFoundError as e:
        if e.name and (e.name == name or name.startswith(e.name + ".")):
            raise PluginError(f"plugin {spec!r}: no module named {name!r} (give an import name on "
                              "sys.path or the path of a .py file)") from None
        raise PluginError(f"plugin {spec!r} failed to import: {type(e).__name__}: {e}") from e
    except Exception as e:
        raise PluginError(f"plugin {spec!r} failed to import: {type(e).__name__}: {e}") from e
    _loaded[spec] = name
    return name


def load_plugins(specs: Sequence[str]) -> list[str]:
    return [load_plugin(s) for s in specs]


def load_env_plugins() -> None:
    """Import the plugins that the driver listed in RLTF_RAY_PLUGINS (a Ray worker's view)."""
    for name in filter(None, os.environ.get(ENV, "").split(",")):
        load_plugin(name)


def _installed(path: Path) -> bool:
    return any(part in ("site-packages", "dist-packages") for part in path.parts)


def _package_copy(src: Path, name: str) -> str:
    """`src` copied into a package folder `name` (its `__init__.py`), in this user's own
    staging folder, keyed by the file's content: `import name` finds it on a worker."""
    content = src.read_bytes()  # hashed and written alike, even if the file changes meanwhile
    digest = hashlib.sha1(content).hexdigest()[:12]
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    pkg = Path(tempfile.gettempdir()) / f"rltf_ray_plugins-{user}" / digest / name
    if not (pkg / "__init__.py").is_file():
        pkg.mkdir(parents=True, exist_ok=True)
        # Runs (Tune trials) starting together stage the same file: each writes a copy of its
        # own and renames it into place, so no process ever reads or ships a half-written one.
        # The copy is written beside the package, not in it, which is the folder Ray uploads.
        fd, tmp = tempfile.mkstemp(dir=pkg.parent, prefix=f".{name}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(content)
            os.replace(tmp, pkg / "__init__.py")
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return str(pkg)


def _helper_dirs(spec: str) -> list[str]:
    """The plugin file's helpers (`_helpers`), each as a folder `py_modules` can ship."""
    if not is_path(spec):
        return []
    return [h if Path(h).is_dir() else _package_copy(Path(h), Path(h).stem)
            for h in _helpers.get(str(Path(spec).resolve()), [])]


def _ship_dir(spec: str) -> str | None:
    """A local folder that makes the plugin importable on a worker, or None (installed)."""
    name = module_name(spec)
    if is_path(spec):
        return _package_copy(Path(spec).resolve(), name)
    top = name.split(".")[0]
    found = importlib.util.find_spec(top)
    if found is None or not found.submodule_search_locations:
        origin = Path(found.origin) if found and found.origin else None
        if origin is None or _installed(origin) or origin.suffix != ".py":
            return None
        return _ship_dir(str(origin)) if origin.stem == top else None
    folder = Path(list(found.submodule_search_locations)[0])
    return None if _installed(folder) else str(folder)


def worker_runtime_env(specs: Sequence[str]) -> dict:
    """The runtime_env that makes the plugins importable in a Ray worker ({} without any).

    Before Ray starts it names local folders, for `ray.init` (the job's runtime_env). Once
    Ray runs (a Ray joined as it is: a notebook's, a test's, a Tune trial's), the folders
    are uploaded first: a task's or an actor's own runtime_env takes only URIs."""
    if not specs:
        return {}
    load_plugins(specs)  # fail here, in the driver, with the plugin's own error
    dirs = sorted({d for d in (_ship_dir(s) for s in specs) if d} | {h for s in specs for h in _helper_dirs(s)})
    env: dict = {"env_vars": {ENV: ",".join(module_name(s) for s in specs)}}
    if dirs:
        env["py_modules"] = dirs
        import ray

        if ray.is_initialized():
            env = _uploaded(env)
    return with_job_env(env)


def with_job_env(env: dict) -> dict:
    """`env` on top of the job's own runtime_env, for a task, actor or Serve replica that
    sets one: Ray replaces a parent's field by the child's (py_modules, pip) and Serve gives
    such a replica only the job's working_dir, so without this the job's libraries, env vars
    (API keys) and packages would be lost there. env_vars are merged and py_modules joined;
    `env` wins where both set a field. {} stays {}: such a worker inherits the job's whole."""
    import ray

    if not env or not ray.is_initialized():
        return env
    job = dict(ray.get_runtime_context().runtime_env or {})
    if not job:
        return env
    out = {**job, **env}
    if "env_vars" in job or "env_vars" in env:
        out["env_vars"] = {**(job.get("env_vars") or {}), **(env.get("env_vars") or {})}
    if "py_modules" in job or "py_modules" in env:
        out["py_modules"] = list(dict.fromkeys([*(job.get("py_modules") or []), *(env.get("py_modules") or [])]))
    return out


def _uploaded(env: dict) -> dict:
    """`env` with its local py_modules uploaded to the cluster (gcs:// URIs), the step Ray
    itself takes for a job's runtime_env in `ray.init`.

    Ray's one private call in rltf_ray, on purpose: Ray documents local folders in py_modules
    for a job's runtime_env only, and refuses them in a task's or an actor's ("only supported
    at the job level"), while a run on a Ray that is already up (a Tune trial, a notebook) has
    no job of its own to give them to. tests/test_private_ray.py fails, naming this function,
    when a Ray upgrade moves the helper or starts taking local folders per actor."""
    import ray
    from ray._private.runtime_env.py_modules import upload_py_modules_if_needed

    node = ray._private.worker.global_worker.node
    if node is None:
        raise PluginError("plugins: cannot upload them through a Ray Client connection; pass them in "
                          "the job's runtime_env (ray job submit --working-dir or py_modules)")
    return upload_py_modules_if_needed(dict(env), include_gitignore=False,
                                       scratch_dir=node.get_runtime_env_dir_path())
