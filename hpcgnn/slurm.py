"""What hpcgnn asks SLURM's commands, and how it reads their answers: sinfo and sacct.

- :func:`partitions`: the partitions, their node groups (nodes, CPUs, memory, GPUs) and time
  limits, from one ``sinfo`` format; used by ``hpcgnn.submit.cluster init`` and by the submit-time
  capacity check.
- :func:`job_states`: the state of jobs and job-array members from ``sacct`` (``squeue`` when
  accounting cannot answer): array rows ``123_4`` and still-pending ranges ``123_[0-3%2]``,
  step rows (``123.batch``, ``123_4.0``) left out, states such as ``CANCELLED by 0`` cut to
  their name, and a failing ``sacct`` reported as no answer rather than as finished jobs.

Parsers take text, so tests feed them recorded output as well as the live dev cluster's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

SINFO_FORMAT = "%P|%D|%c|%m|%G|%l|%N"

# States after which a job does not run again by itself (sacct's and squeue's long names).
FINAL_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
                          "PREEMPTED", "BOOT_FAIL", "DEADLINE", "REVOKED"})


# ------------------------------------------------------------------------------------------ sinfo


@dataclass(frozen=True)
class NodeGroup:
    """Nodes of a partition that sinfo reports alike."""

    nodes: int
    cpus: int  # per node
    mem_mb: int  # per node (1 when RealMemory is not configured)
    gpus: int  # per node, from gres


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    default: bool
    groups: tuple[NodeGroup, ...]
    time_min: int | None  # partition limit; None = infinite
    nodelist: str

    @property
    def nodes(self) -> int:
        return sum(g.nodes for g in self.groups)

    @property
    def cpus(self) -> int:
        """CPUs of the smallest node group."""
        return min(g.cpus for g in self.groups)

    @property
    def mem_mb(self) -> int:
        return min(g.mem_mb for g in self.groups)

    @property
    def gpus(self) -> int:
        return min(g.gpus for g in self.groups)


def parse_gpus(gres: str) -> int:
    """GPUs per node from a gres string: ``gpu:4``, ``gpu:a100:8(S:0-1)``, ``gpu:a100:4,shard:8``."""
    total = 0
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def parse_time_min(limit: str) -> int | None:
    """Minutes of a SLURM time limit: ``infinite``, ``MM``, ``HH:MM:SS``, ``D-HH:MM:SS``."""
    if limit in ("infinite", "UNLIMITED", "n/a", ""):
        return None
    days, _, rest = limit.rpartition("-")
    fields = [int(x) for x in rest.split(":")]
    if len(fields) == 1:  # minutes
        h, m, s = 0, fields[0], 0
    elif len(fields) == 2:  # MM:SS
        h, m, s = 0, fields[0], fields[1]
    else:
        h, m, s = fields[-3:]
    return (int(days) if days else 0) * 1440 + h * 60 + m + (1 if s else 0)


def _count(text: str) -> int:
    return int(text.rstrip("+"))


def parse_sinfo(text: str) -> list[PartitionInfo]:
    """Partitions from ``sinfo -h -o SINFO_FORMAT`` (one line per node group), in sinfo's order."""
    rows: dict[str, list[list[str]]] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 7:
            rows.setdefault(fields[0], []).append(fields)
    out = []
    for raw, group_rows in rows.items():
        groups = tuple(NodeGroup(nodes=_count(r[1]), cpus=_count(r[2]), mem_mb=_count(r[3]), gpus=parse_gpus(r[4]))
                       for r in group_rows)
        out.append(PartitionInfo(name=raw.rstrip("*"), default=raw.endswith("*"), groups=groups,
                                 time_min=parse_time_min(group_rows[0][5]),
                                 nodelist=",".join(r[6] for r in group_rows)))
    return out


def query_sinfo(timeout: float = 30) -> str | None:
    """``sinfo``'s answer in :data:`SINFO_FORMAT`, or None where sinfo is missing or fails."""
    if shutil.which("sinfo") is None:
        return None
    return run_command(["sinfo", "-h", "-o", SINFO_FORMAT], timeout)


def partitions(sinfo: str | None = None) -> list[PartitionInfo] | None:
    """The cluster's partitions (from ``sinfo``, or from its recorded text); None when unknown."""
    text = query_sinfo() if sinfo is None else sinfo
    return None if text is None else parse_sinfo(text)


def pick_partition(parts: list[PartitionInfo], name: str | None) -> PartitionInfo | None:
    """The partition called ``name``, or the default one (sbatch's choice) when ``name`` is None."""
    if name is None:
        return next((p for p in parts if p.default), parts[0] if parts else None)
    return next((p for p in parts if p.name == name), None)


# ------------------------------------------------------------------------------------------ sacct


@dataclass(frozen=True)
class JobState:
    state: str  # COMPLETED, RUNNING, ... ; UNKNOWN when no source could tell
    exit_code: str = ""  # sacct's "code:signal", e.g. "0:0"; "" when unknown

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


def expand_array_ids(job_id: str) -> list[str]:
    """``123_[0-3,7%2]`` -> ``123_0 ... 123_3, 123_7`` (the ``%`` limit dropped); other ids unchanged."""
    m = re.fullmatch(r"(\d+)_\[([^\]]*)\]", job_id)
    if not m:
        return [job_id]
    base, body = m.group(1), m.group(2).split("%")[0]
    ids = []
    for item in body.split(","):
        lo, sep, hi = item.partition("-")
        step = 1
        if ":" in hi:  # 0-15:4
            hi, step_text = hi.split(":")
            step = int(step_text)
        ids.extend(f"{base}_{i}" for i in range(int(lo), int(hi if sep else lo) + 1, step))
    return ids


def _state_name(text: str) -> str:
    """``CANCELLED by 0`` -> ``CANCELLED``; ``CANCELLED+`` -> ``CANCELLED``; empty -> ``UNKNOWN``."""
    word = text.strip().split(" ")[0].rstrip("+") if text.strip() else ""
    return word.upper() or "UNKNOWN"


def parse_sacct(text: str) -> dict[str, JobState]:
    """States from ``sacct -n -P -o JobID,State,ExitCode``: one entry per job or array member.

    Step rows (``123.batch``, ``123_4.0``, ``123.extern``) are left out: a job's own row carries
    its state. A pending array range (``123_[0-3]``) gives each of its members that state.
    A member's own row wins over a range that still lists it (sacct shows both for a while).
    When a job has several rows (requeued jobs listed with ``--duplicates``), the last one wins.
    """
    states: dict[str, JobState] = {}
    pending: dict[str, JobState] = {}  # from range rows: a member's own row, where there is one, wins
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 2 or not fields[0]:
            continue
        job_id = fields[0].strip()
        if "." in job_id:
            continue
        state = JobState(_state_name(fields[1]), fields[2].strip() if len(fields) > 2 else "")
        members = expand_array_ids(job_id)
        if members == [job_id]:
            states[job_id] = state
        else:  # sacct keeps listing 123_[1-3%1] as PENDING while 123_1 already runs
            pending.update(dict.fromkeys(members, state))
    return {**pending, **states}


def parse_squeue(text: str) -> dict[str, JobState]:
    """States from ``squeue -h -o %i|%T`` (jobs still known to the controller)."""
    states: dict[str, JobState] = {}
    for line in text.splitlines():
        jid, _, state = line.strip().partition("|")
        if jid:
            for member in expand_array_ids(jid):
                states[member] = JobState(_state_name(state))
    return states


def ended_state(job_id: str, run: Callable[[list[str]], str | None] | None = None) -> str | None:
    """The final state of job ``job_id`` (its raw id, as SLURM_JOB_ID gives it) when accounting says it
    ended, else None: still queued or running (a requeued job too), unknown to sacct, or no sacct here.
    ``run``: how a command is run (default: :func:`run_command` with a 10 s limit)."""
    run = run or (lambda args: run_command(args, timeout=10))
    text = run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobIDRaw,State"])
    for line in (text or "").splitlines():
        raw, _, state = line.strip().partition("|")
        if raw == job_id:
            name = _state_name(state)
            return name if name in FINAL_STATES else None
    return None


def run_command(args: list[str], timeout: float = 60) -> str | None:
    """A SLURM command's stdout, or None when it is missing, times out or exits non-zero."""
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def job_states(job_ids: list[str], run: Callable[[list[str]], str | None] = run_command) -> dict[str, JobState]:
    """State of each SLURM job id (array members as ``ID_i``).

    sacct first; for ids it does not know (accounting lagging or disabled, or sacct failing),
    squeue; ids neither knows are ``UNKNOWN``. Array members are also found through their
    array's base id, since a pending array is one row until its members start. ``run``:
    how a command is run (its stdout, or None when it failed).
    """
    ids = [j for j in job_ids if j]
    if not ids:
        return {}
    asked = sorted({j.split("_")[0] for j in ids})
    found: dict[str, JobState] = {}
    text = run(["sacct", "-n", "-P", "-X", "-j", ",".join(asked), "-o", "JobID,State,ExitCode"])
    if text is not None:
        found.update(parse_sacct(text))
    missing = [j for j in ids if j not in found]
    if missing:
        text = run(["squeue", "-h", "-j", ",".join(sorted({j.split("_")[0] for j in missing})), "-o", "%i|%T"])
        if text is not None:
            found.update({k: v for k, v in parse_squeue(text).items() if k not in found})
    return {j: found.get(j, JobState("UNKNOWN")) for j in ids}
