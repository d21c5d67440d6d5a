"""The errors a user can meet, and what each exit code of the ``hpcgnn`` commands means.

Every error that the user must fix (a config value, the data, the allocation, a partition
or checkpoint artifact) is a :class:`UserError`: the commands print it as
``hpcgnn: <kind>: <message>`` and exit with :data:`EXIT_USER_ERROR`, and its message names
the fix (often after ``HINT:``), with no traceback (``HYDRA_FULL_ERROR=1`` adds it), also when a
rank met it: the launcher's last line is then the rank's. Anything else is a bug or a failure of
the machine and keeps its traceback.

Exit codes of ``python -m hpcgnn`` (and of ``hpcgnn``):

    0  done (or submitted, with ``launch.wait=false``)
    1  the run failed: a rank raised, the job was cancelled or killed
    2  a user error, caught before anything ran or on the compute node before the first step
    3  preempted outside submitit: the checkpoint is saved; the same command resumes
    4  diverged: the loss or a gradient became NaN or infinite (``train.nonfinite=stop``)
  130  Ctrl-C: a submitted job goes on (only the waiting stopped; its processes ignore the terminal's
       Ctrl-C, also under submitit's local executor); a local run stops its ranks; a prepare or partition
       removes its temporary files
  143  stopped by SIGTERM (a local run stops its ranks first)
  255  a task of a submitit job that was requeued (or gave up requeuing): submitit's own exit
"""

from __future__ import annotations

EXIT_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_PREEMPTED = 3
EXIT_DIVERGED = 4
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_REQUEUED = -1  # what submitit's requeue handler exits with (status 255)


class UserError(Exception):
    """Something the user must change; the message says what. Exit code 2."""

    kind = "error"  # printed before the message: "hpcgnn: <kind>: ..."
    exit_code = EXIT_USER_ERROR


class ConfigError(UserError, ValueError):
    """A config key or value, or a combination of them."""

    kind = "config error"


class AllocationError(UserError):
    """What the launcher (srun, torchrun, submitit) started does not match the config."""

    kind = "allocation error"


class DatasetError(UserError):
    """The dataset is missing, unreadable or malformed; the message names the file or the command."""

    kind = "dataset error"


class PartitionError(UserError):
    """The partition artifact is missing, stale, corrupt, or does not fit the job."""

    kind = "partition error"


class CheckpointError(UserError):
    """A checkpoint that cannot continue this job (another dataset, K, world size or model)."""

    kind = "checkpoint error"


class MissingExtra(UserError):
    """An optional extra a setting needs is not installed (optuna for ``hpcgnn tune``, a tracker)."""

    kind = "missing extra"


class RunFolderBusy(UserError):
    """Another job is running in the run folder (its lock, :mod:`hpcgnn.runlock`); the message names it."""

    kind = "run folder in use"


class Untrusted(UserError):
    """A peer failed the run's authentication (:mod:`hpcgnn.trust`): another user's or another job's process
    holds a port of the run. Not the user's doing, but nothing to debug either: one line naming the port and
    the likely cause, exit code 1."""

    kind = "security"
    exit_code = EXIT_FAILED


class NotTrusted(UserError):
    """A file or folder hpcgnn would load code or data from that another user owns or may write (ssh's rule for
    ``~/.ssh``): a run folder, a model file, a data root, a lock. The message names it and the fix: make it
    private, or say you trust it (``trust=true``, ``dataset.trust_root=true``). Exit code 2."""

    kind = "not trusted"


class PortTaken(UserError):
    """A port the run must listen on is held by another process; one line naming it, exit code 1."""

    kind = "port taken"
    exit_code = EXIT_FAILED


class Flooded(UserError):
    """A sampler server closed a trainer's connections during the handshake, again and again: it is busy or
    flooded with connections (another user's, possibly). One line, exit code 1."""

    kind = "busy or flooded"
    exit_code = EXIT_FAILED


class PredictError(UserError):
    """``hpcgnn predict`` asked of a folder that is not a run, of a run without that model, of another graph."""

    kind = "predict error"


class AnotherRankFailed(RuntimeError):
    """This rank stops because another one failed first (its error is that one's echo): never the cause
    reported, whichever rank's record is written first."""


class SamplerFailed(RuntimeError):
    """A sampler process (``train.sampler_procs``) raised or died; the message names it (process k of rank r,
    its pid) and its exception, or the signal that killed it. Exit code 1."""


class Diverged(UserError):
    """The loss or a gradient became NaN or infinite; the message names the step, the rank and the likely cause."""

    kind = "diverged"
    exit_code = EXIT_DIVERGED


def describe(exc: UserError) -> str:
    """The one line (or paragraph) a command prints for a user error."""
    return f"hpcgnn: {exc.kind}: {exc}"


def report(exc: UserError, with_traceback: bool = False) -> int:
    """Print a user error as every command does (its traceback first only when asked: ``HYDRA_FULL_ERROR=1``,
    :func:`hpcgnn.env.full_error`); returns the exit code to leave with."""
    import sys
    import traceback

    if with_traceback:
        traceback.print_exception(exc, file=sys.stderr)
    print(describe(exc), file=sys.stderr, flush=True)
    return exc.exit_code


def first_words(text: str, limit: int = 200) -> str:
    """A library's message as one line a person reads: its first line, cut at a word (never mid-word) within
    ``limit`` characters, with "..." where it was cut."""
    line = (str(text).strip().splitlines() or [""])[0].strip()
    if len(line) <= limit:
        return line
    cut = line[:limit].rsplit(" ", 1)[0].rstrip(" ,;:")
    return f"{cut} ..."
