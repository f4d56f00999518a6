"""A plugin file is staged as a package for Ray's py_modules by writing a copy and renaming it
into place: runs that start together never see, nor ship, a half-written plugin."""
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from rltf_ray.plugins import _package_copy

STAGE = "import sys\nfrom pathlib import Path\nfrom rltf_ray.plugins import _package_copy\n" \
        "for _ in range(5):\n    _package_copy(Path(sys.argv[1]), 'big_plugin')\n"


@pytest.fixture
def staging(tmp_path, monkeypatch):
    """A staging root of the test's own (the plugins' copies go under the temp dir)."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


def big_plugin(folder: Path) -> Path:
    src = folder / "big_plugin.py"
    src.write_text("DATA = '" + "x" * 8_000_000 + "'\n")  # big enough that a copy takes a while
    return src


def test_the_staged_copy_is_the_file_and_leaves_no_temporary_file(tmp_path, staging):
    src = tmp_path / "my_plugin.py"
    src.write_text("X = 1\n")
    pkg = Path(_package_copy(src, "my_plugin"))
    assert (pkg / "__init__.py").read_bytes() == src.read_bytes()
    assert _package_copy(src, "my_plugin") == str(pkg)  # staged once per content
    assert [p.name for p in pkg.parent.iterdir()] == ["my_plugin"]
    assert [p.name for p in pkg.iterdir()] == ["__init__.py"]


def test_concurrent_stagers_never_show_a_truncated_plugin(tmp_path, staging):
    """Threads and processes stage the same file while a reader watches the staged copy: it
    is absent or whole, never partly written."""
    src = big_plugin(tmp_path)
    want = src.read_bytes()
    seen, done = [], threading.Event()

    def read():
        while not done.is_set():
            for f in staging.rglob("__init__.py"):
                try:
                    seen.append(f.read_bytes() == want)
                except FileNotFoundError:
                    pass

    reader = threading.Thread(target=read)
    reader.start()
    env = dict(os.environ, TMPDIR=str(staging))
    procs = [subprocess.Popen([sys.executable, "-c", STAGE, str(src)], env=env) for _ in range(2)]
    threads = [threading.Thread(target=_package_copy, args=(src, "big_plugin")) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    done.set()
    reader.join()
    assert seen and all(seen), f"{seen.count(False)} of {len(seen)} reads saw a partial plugin"
    [staged] = staging.rglob("__init__.py")
    assert staged.read_bytes() == want
    assert not [p for p in staging.rglob("*") if p.name.endswith(".tmp")]
