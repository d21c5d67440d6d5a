"""What every process hpcgnn starts does to itself first: a rank, a sampler process, a sampler server.

- :func:`start_context`: how they are started: forked from a fork server that imported their modules once;
- :func:`die_with_parent`: the kernel signals this process when the one that started it dies, however it dies
  (no orphan holding the graph, the cores or a port after a killed launcher or rank);
- :func:`ignore_signals`: signals that are another process's to act on (a terminal's Ctrl-C reaches the whole
  process group; SLURM's preemption signal is the trainers');
- :func:`keep_freed_memory`: the malloc policy of processes that make batches;
- :func:`set_threads`: torch's threads, once MKL's vector math has started on this thread alone;
- :func:`end_quickly`: and last, before it exits, spares the interpreter's final garbage collections;
- logging: :func:`hpcgnn.logs.setup_logging`, one line format for every kind of process.

Torch-free, standard library only (:func:`set_threads` imports torch when called): the launcher's own children
start here before they import anything heavy.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # prctl(2)


def start_context(*preload: str):
    """The multiprocessing context that starts hpcgnn's processes: a fork server (a fresh interpreter, started
    once by this process) that imported ``preload`` and forks each process from there, so that torch and PyG are
    imported once for all of them (about 4 s of CPU each, which two ranks on a laptop or a CI runner pay at once).
    Never a fork of the caller: a process that has run torch's OpenMP cannot fork safely (libgomp); the fork
    server has only imported. It listens on a Unix socket in a folder only this user can open; Python before
    3.10.9 put that socket in Linux's abstract namespace, which any user of the machine can reach and have the
    server unpickle what they send (CVE-2022-42919): spawn there, and where the platform has no fork server."""
    import multiprocessing

    if sys.version_info < (3, 10, 9) or "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["hpcgnn.preload", *preload])  # (first: the server ends with this process)
    return ctx


def die_with_parent(signum: int = signal.SIGKILL, parent: int | None = None) -> None:
    """Linux: send this process ``signum`` when its parent dies (its parent: the process that started it, or the
    fork server that one started, which ends with it: :func:`start_context`). ``parent``: the pid of the process
    that started it, to close the race of a parent that died before the request was in place (then ``signum``
    now). Elsewhere nothing: the parent's own shutdown has to end its children."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if parent is not None and parent not in (os.getppid(), _parent_of(os.getppid())):
        os.kill(os.getpid(), signum)


def _parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (Linux's /proc), None if it has gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])  # (the name in parentheses may hold spaces)
    except (OSError, IndexError, ValueError):
        return None


def end_quickly() -> None:
    """Called as a process that imported torch and PyG is about to exit (its files, sockets and process group
    closed): the garbage collector's passes at interpreter exit walk every object of their module graphs (torch's
    dynamo, sympy: about a second a process here, 0.15 s without); frozen, those objects are skipped. Exit
    handlers (atexit: logging's flush) still run; what the process made itself was closed by then."""
    import gc

    gc.freeze()


def exit_now(code: int) -> None:
    """Leave at once with ``code``, logs and output flushed, as a process whose work is done and closed (a sampler
    server whose trainers have gone): no interpreter shutdown, whose C++ static destructors can meet a thread of a
    library still running and abort the process (seen once in a CI run: "terminate called without an active
    exception", signal 6, after a local server had served every batch)."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def ignore_signals(*signums: int) -> None:
    for signum in signums:
        signal.signal(signum, signal.SIG_IGN)


def keep_freed_memory() -> bool:
    """Let glibc's malloc reuse freed memory instead of handing it back to the kernel.

    Every batch allocates hundreds of MB (features of ~400k nodes, sampler temporaries).
    glibc serves blocks above 32 MB with a fresh mmap and unmaps them on free, so each
    batch page-faults its buffers in again, zeroed by the kernel: that costs more than
    the gather itself (85 ms vs 19 ms for 350k rows of 128 floats here). With mmap off
    and trimming effectively off, freed blocks are reused, at the price of the process
    keeping its high-water mark; what jemalloc or tcmalloc would do, without a dependency.
    Returns whether it took effect (glibc only).
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        m_trim_threshold, m_mmap_max, m_arena_max = -1, -4, -8
        # One arena: blocks freed by the training thread serve the prefetch thread's next batch
        # (a thread's own arena could not grow past 64 MB without mmap). mallopt takes a C int: the
        # largest is 2**31 - 1 (2**40 was cut to its low 32 bits, 0: a trim at every free, 48k page
        # faults and 25 ms more per batch of 380k rows of 128 floats here).
        return all(libc.mallopt(opt, value) for opt, value in
                   ((m_mmap_max, 0), (m_trim_threshold, 2**31 - 1), (m_arena_max, 1)))
    return False


# Torch's element-wise float ops that go through MKL's vector math (ATen's vml.h: vsSqrt, vdExp, ...).
_VECTOR_MATH = ("sqrt", "rsqrt", "exp", "expm1", "log", "log10", "log1p", "log2", "sin", "cos", "tan", "tanh",
                "sinh", "cosh", "asin", "acos", "atan", "erf", "erfc", "erfinv", "lgamma", "abs", "ceil", "floor",
                "trunc", "reciprocal", "sigmoid")


def set_threads(threads: int) -> None:
    """``torch.set_num_threads(threads)``, after each of MKL's vector math functions has run once on this thread
    alone.

    Why: the first call of an MKL vector function in a process, split between two threads at once (ATen cuts
    those ops into chunks of 2048 elements: a 128 x 32 weight's ``sqrt`` is two), could leave the second
    thread's chunk computed at about 12 bits of accuracy. Seen in Adam's first step (``exp_avg_sq.sqrt()``): the
    rows of one weight that the second thread computes moved by an update off by up to 2.7e-4 of itself, in 3
    of 40 fresh ranks with a sampler server, and outside hpcgnn in 1 of 60 processes whose first ``sqrt`` of
    4096 floats ran on two threads beside a busy process. Run once here, on one thread, none of them is ever
    first on two."""
    import torch

    torch.set_num_threads(1)
    for dtype in (torch.float32, torch.float64):
        x = torch.full((16,), 0.5, dtype=dtype)
        for name in _VECTOR_MATH:
            getattr(torch, name)(x)
    torch.set_num_threads(threads)
