"""engine.realtime / trainer.realtime: every thread of the process under SCHED_RR, later
threads inheriting it, and a clear error where the process may not."""
import os
import subprocess
import sys

import pytest

from rltf_ray import realtime

PROBE = """
import os, threading
from rltf_ray.realtime import make_realtime
threading.Thread(target=threading.Event().wait, daemon=True).start()  # a thread from before
moved = make_realtime("engine")
before = [os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")]
later = []
t = threading.Thread(target=lambda: later.append(os.sched_getscheduler(0)))
t.start(); t.join()
print(moved, len(before), sorted(set(before)), later)
"""


def test_every_thread_and_every_later_thread_runs_under_sched_rr(needs_realtime):
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(__file__))).stdout.split(maxsplit=2)
    moved, threads, rest = int(out[0]), int(out[1]), out[2]
    assert moved == threads >= 2
    assert rest.strip() == f"[{os.SCHED_RR}] [{os.SCHED_RR}]"


def test_a_process_without_the_privilege_gets_the_fix_in_the_error(monkeypatch):
    def refuse(*_):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(realtime.os, "sched_setscheduler", refuse)
    with pytest.raises(RuntimeError) as e:
        realtime.make_realtime("trainer")
    msg = str(e.value)
    assert "CAP_SYS_NICE" in msg and "ulimit -r" in msg and "trainer.realtime=false" in msg
