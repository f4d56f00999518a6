"""Tasks, critics and reward functions defined in a script or a notebook (`__main__`), shipped
to Ray workers by value, as Ray ships a remote function defined there.

A worker imports a task, a critic or a reward function by its module's name, and `__main__`
on a worker is the worker itself: the definition is not there. So such a definition is
serialized with cloudpickle (what Ray uses: the code, its closure and the globals it reads)
into a small generated module, `rltf_main_<hash>.py`, which registers or exposes it again when
imported. That module is added to the run's plugins and travels like any plugin file: in
the job's runtime_env, to every node, and its path is in the run's saved config, so a resumed
run imports it again (its classes, marked `_rltf_shipped`, are not shipped a second time). The
file's name is a hash of its content: files are never overwritten, only added.
"""
from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from pathlib import Path

SHIPPED = Path(os.environ.get("RLTF_RAY_SHIPPED", Path.home() / ".cache" / "rltf_ray" / "shipped"))


def ship_by_value(tasks: dict | None = None, critics: dict | None = None, functions: dict | None = None) -> Path:
    """The generated module's path. `tasks` and `critics`: {registered name: class}, registered
    again on import; `functions`: {attribute: function}, the module's attributes (a reward
    function's reference is then `rltf_main_<hash>:<attribute>`)."""
    from ray import cloudpickle  # the copy Ray ships its own functions with

    payload = {"tasks": tasks or {}, "critics": critics or {}, "functions": functions or {}}
    blob = base64.b64encode(cloudpickle.dumps(payload)).decode()
    digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
    text = ('"""Definitions from a script or notebook (__main__), shipped by value by rltf_ray.shipping."""\n'
            "import base64\n\nfrom ray import cloudpickle\n\nfrom rltf_ray.critics import register_critic\n"
            "from rltf_ray.tasks import register_task\n\n"
            f'_DEFS = cloudpickle.loads(base64.b64decode("{blob}"))\n'
            'for _name, _cls in _DEFS["tasks"].items():\n    _cls._rltf_shipped = True\n    register_task(_name)(_cls)\n'
            'for _name, _cls in _DEFS["critics"].items():\n    _cls._rltf_shipped = True\n'
            '    register_critic(_name)(_cls)\n'
            'globals().update(_DEFS["functions"])\n')
    SHIPPED.mkdir(parents=True, exist_ok=True)
    path = SHIPPED / f"rltf_main_{digest}.py"
    if not path.is_file():  # written whole under a temporary name, then renamed: never half a file
        fd, tmp = tempfile.mkstemp(dir=SHIPPED, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    return path


def function_name(fn) -> str:
    """A module attribute name for `fn` (a lambda or a nested function has none of its own)."""
    name = getattr(fn, "__name__", "") or "fn"
    return name if name.isidentifier() else "fn"
