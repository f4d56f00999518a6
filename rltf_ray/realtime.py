"""Real-time CPU scheduling for the processes that compute (`engine.realtime`,
`trainer.realtime`).

On a small CPU node about thirty of Ray's processes (daemons, Serve, Ray Train's and Ray
Data's helpers, idle workers) each wake a few times a second: together a quarter of a core.
vLLM and torch split each operation over one OpenMP thread per core, and the threads meet at
a barrier, so whenever one of them loses its core to such a wake-up the others wait too:
on two cores that background cost generation and training a third of their speed, against
the same work in a plain process (docs/benchmark-log.md, 2026-12-02). Niceness does not
stop a waking task from preempting; a real-time policy does. SCHED_RR at the lowest
real-time priority, and Linux's real-time throttling (by default 5% of every second for
everything else) keeps Ray's daemons alive even while the compute threads never sleep."""
from __future__ import annotations

import os

PRIORITY = 1  # the lowest real-time priority: above every normal task, below the kernel's own


def make_realtime(who: str) -> int:
    """Put every thread of this process under SCHED_RR; threads it starts later inherit the
    policy from their creator (OpenMP's pool, vLLM's thread). Returns how many threads moved.
    Raises a RuntimeError saying what to grant when the process may not do it."""
    if not hasattr(os, "sched_setscheduler"):
        raise RuntimeError(f"{who}.realtime: real-time scheduling needs Linux; set {who}.realtime=false")
    tids = sorted(int(t) for t in os.listdir("/proc/self/task"))
    moved = 0
    for tid in tids:
        try:
            os.sched_setscheduler(tid, os.SCHED_RR, os.sched_param(PRIORITY))
        except ProcessLookupError:  # a thread that ended meanwhile
            continue
        except PermissionError as e:
            raise RuntimeError(
                f"{who}.realtime: this process may not use real-time scheduling ({e}). It needs "
                "CAP_SYS_NICE (root, or a container started with --cap-add SYS_NICE; on "
                "Kubernetes securityContext.capabilities.add: [SYS_NICE]) or an RLIMIT_RTPRIO "
                f"of at least {PRIORITY} (`ulimit -r`); or set {who}.realtime=false") from e
        moved += 1
    return moved
