"""`rltf-ray example NAME DIR`: copy a worked example out of the installed package into DIR,
to run as written from there:

    rltf-ray example trl_gsm8k my_run && cd my_run
    python make_data.py && rltf-ray run --config config.yaml

`rltf-ray example` lists them. Each is a folder of plain files (its config, data script,
reward functions, critic) under rltf_ray/example_files, shown in docs/examples.md."""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

FILES = Path(__file__).resolve().parent.parent / "example_files"


def examples() -> dict[str, str]:
    """{name: the first line of its config's comment}."""
    out = {}
    for d in sorted(p for p in FILES.iterdir() if (p / "config.yaml").is_file()):
        first = (d / "config.yaml").read_text().splitlines()[0]
        out[d.name] = first.lstrip("# ").strip()
    return out


def example_main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="rltf-ray example", description="Copy a worked example into a folder.")
    ap.add_argument("name", nargs="?", help="the example (none: list them)")
    ap.add_argument("dir", nargs="?", help="where to put it (default: ./NAME)")
    args = ap.parse_args(argv)
    known = examples()
    if args.name is None:
        for name, what in known.items():
            print(f"{name:12s} {what}")
        return 0
    if args.name not in known:
        print(f"example: no example {args.name!r} (there are: {', '.join(known)})", file=sys.stderr)
        return 2
    dest = Path(args.dir or args.name)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        print(f"example: {dest} exists and is not an empty folder; name a new one", file=sys.stderr)
        return 2
    # symlinks=False: shared helpers are links in the source tree and plain files in the copy
    shutil.copytree(FILES / args.name, dest, dirs_exist_ok=True, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__"))
    print(f"{dest}/: {', '.join(sorted(p.name for p in dest.iterdir()))}\n"
          f"next: cd {dest} && python make_data.py && rltf-ray run --config config.yaml")
    return 0
