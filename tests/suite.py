"""Run the test suite with one Python process per integration module (`make test`).

Each integration module starts and stops its own local Ray, Serve, vLLM engines and
DeepSpeed workers. Run in one pytest process, twenty such sessions piled up in one driver
and CI saw that driver die of SIGSEGV between two modules, 112 tests in, all passed. A user
runs one pipeline per process, so the suite does the same: the pure-logic tests share one
process, each integration module gets its own. A module whose process dies of a signal is
run once more and the summary says so; a failing test is never rerun.

    python tests/suite.py [pytest args]      e.g. -m "not slow"
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def split_marker(args: list[str]) -> tuple[str, list[str]]:
    """(the -m expression or "", the other args)."""
    rest, expr, it = [], "", iter(args)
    for a in it:
        if a == "-m":
            expr = next(it, "")
        elif a.startswith("-m="):
            expr = a[3:]
        else:
            rest.append(a)
    return expr, rest


def integration_modules() -> list[Path]:
    return [p for p in sorted(TESTS.glob("test_*.py")) if "mark.integration" in p.read_text()]


def run(label: str, args: list[str]) -> tuple[int, float]:
    print(f"\n=== {label} ===", flush=True)
    t0 = time.time()
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    rc = subprocess.call([sys.executable, "-m", "pytest", *args], cwd=TESTS.parent, env=env)
    return rc, time.time() - t0


def describe(rc: int) -> str:
    if rc < 0:
        return f"died of {signal.Signals(-rc).name}"
    return {0: "passed", 5: "no tests selected"}.get(rc, f"failed (pytest exit {rc})")


def main(argv: list[str]) -> int:
    expr, rest = split_marker(argv)
    both = lambda extra: f"({expr}) and {extra}" if expr else extra  # noqa: E731
    jobs = [("unit tests", ["-m", both("not integration"), *rest, "tests"])]
    jobs += [(p.name, ["-m", both("integration"), *rest, str(p.relative_to(TESTS.parent))])
             for p in integration_modules()]
    rows, t0 = [], time.time()
    for label, args in jobs:
        rc, secs = run(label, args)
        note = ""
        if rc < 0:  # a crash of the process, not a test failure: once more, and say so
            first = describe(rc)
            rc, more = run(f"{label} (rerun after the process {first})", args)
            secs += more
            note = f"; first run {first}, rerun {describe(rc)}"
        rows.append((label, rc, secs, describe(rc) + note))
    print(f"\n{'module':<32} {'seconds':>8}  result")
    for label, rc, secs, text in rows:
        print(f"{label:<32} {secs:>8.0f}  {text}")
    bad = [r for r in rows if r[1] not in (0, 5)]
    print(f"{len(rows) - len(bad)}/{len(rows)} processes passed in {time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
