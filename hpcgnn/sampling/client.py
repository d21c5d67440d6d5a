"""A trainer's side of its sampler servers: connecting (the run's handshake, bound to each server and this rank;
tried again where a server is busy), its slots, and the pool (:class:`RemotePool`) the rank's walk drives.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import deque
from pathlib import Path

import torch
from torch import Tensor

import hpcgnn.sampling.messages as m
import hpcgnn.sampling.serving as serving
import hpcgnn.sampling.shipping as shipping
import hpcgnn.sampling.wire as wire
from hpcgnn import trust
from hpcgnn.checks import SLOT_BYTES
from hpcgnn.errors import AnotherRankFailed, Flooded, SamplerFailed, Untrusted
from hpcgnn.failures import server_failure as failure_record
from hpcgnn.sampling.loader import EpochPlan

log = logging.getLogger(__name__)

class _Link:
    """A trainer's connection to one server, and the slots its batches land in."""

    def __init__(self, index: int, host: str, port: int, channel: wire.Channel, depth: int, pin: bool):
        self.index, self.host, self.port, self.channel, self.pin = index, host, port, channel, pin
        self.sock = channel.sock
        self.slots = [_slot(SLOT_BYTES, pin) for _ in range(depth)]
        self.free = deque(range(depth))

    @property
    def name(self) -> str:
        return f"sampler server {self.index} at {self.host}:{self.port}"


def _slot(nbytes: int, pin: bool) -> Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)


class RemotePool:
    """A trainer's sampler servers: :class:`~hpcgnn.sampling.procs.SamplerPool`'s interface over sockets."""

    def __init__(self, state: shipping.SamplerState, servers: list[tuple[str, int]], depth: int,
                 device: torch.device, *, rank: int, key: bytes, run_dir: str | Path, stats=None,
                 timeout_s: float = 120.0, connect_s: float = 1800.0, group: dict | None = None):
        # what the servers build this rank's sampler from (with the run's config and the graph they open)
        self.state, self.depth, self.group = state, max(1, depth), group
        self.key, self.run_dir = key, Path(run_dir)  # the run's secret (hpcgnn.trust); where servers record failures
        # a partitioned graph: one server makes all of this rank's batches, in the rank's group of samplers
        self.servers = [servers[rank % len(servers)]] if group else servers
        self.first = rank % len(servers) if group else 0  # the index of self.servers[0] among all servers
        self.device, self.rank, self.timeout_s, self.connect_s = device, rank, timeout_s, connect_s
        self.links: list[_Link] = []
        self.stats = stats  # a partitioned graph's exchange counters (CommStats): each batch's counts added there

    def start(self) -> None:
        if self.links:
            return
        recipe = shipping.publish(self.run_dir, self.rank, self.state)  # (its hash travels)
        t0 = time.perf_counter()
        for k, (host, port) in enumerate(self.servers, start=self.first):
            channel = _connect(host, port, k, self.connect_s, self.key, self.run_dir, self.rank)
            channel.sock.settimeout(self.connect_s)  # a server may still be preparing the dataset
            link = _Link(k, host, port, channel, self.depth, self.device.type == "cuda")
            self._send(link, m.Hello(self.rank, recipe, self.depth, self.group))
            self.links.append(link)
        for link in self.links:
            self._next(link, "start")
            link.sock.settimeout(self.timeout_s)
        log.info("rank %d: %d sampler server(s) ready (%s) in %.1f s", self.rank, len(self.links),
                 ", ".join(f"{h}:{p}" for h, p in self.servers), time.perf_counter() - t0)

    def epoch(self, plan: EpochPlan) -> serving.ProducedLoader:
        """The plan's batches (its seeds, generators and order), made by the servers."""
        return serving.ProducedLoader(self, plan)

    def _link_of(self, i: int) -> _Link:
        return self.links[(i + self.rank) % len(self.links)]

    def begin(self, batch_seed: int, jobs: list) -> None:
        """An epoch's batches to make, (index, seeds as a numpy array) in index order, each to the server its index
        says."""
        mine: dict[int, list] = {link.index: [] for link in self.links}  # (by index among all servers)
        for i, seeds in jobs:
            mine[self._link_of(i).index].append((i, seeds))
        for link in self.links:
            self._send(link, m.Epoch(batch_seed, mine[link.index]))

    def _send(self, link: _Link, msg) -> None:
        try:
            link.channel.send(msg)
        except OSError as exc:
            raise self._lost(link, "sending to it", exc) from None  # (its death is seen here first, often)

    def _next(self, link: _Link, i, slot=None):
        try:
            msg = link.channel.receive(slot)
        except wire.Forged as why:
            raise Untrusted(f"{link.name} sent rank {self.rank} a frame that failed its check ({why}): another "
                            "process relays or injects into the connection. HINT: start the run again; if it recurs, "
                            "tell your cluster's administrators") from None
        except (OSError, ConnectionError, EOFError) as exc:
            raise self._lost(link, "waiting for its start" if i == "start" else f"waiting for batch {i}", exc) from None
        if isinstance(msg, m.Failed):
            what = f"making batch {msg.index}" if msg.index >= 0 else "building the sampler"
            raise SamplerFailed(f"{link.name} failed {what} of rank {self.rank}: {msg.line}\nits traceback:\n"
                                f"{msg.trace}")
        return msg

    def _lost(self, link: _Link, doing: str, exc: BaseException) -> SamplerFailed:
        how = "did not answer in time" if isinstance(exc, TimeoutError) else f"closed the connection ({exc})"
        return SamplerFailed(f"{link.name} {how} while rank {self.rank} was {doing}. HINT: its log says why "
                             "(the submitit folder's *_server_* files; SIGKILL: the node's memory)")

    def receive(self, i: int):
        link = self._link_of(i)
        s = link.free.popleft()

        def slot(nbytes: int) -> Tensor:
            if link.slots[s].numel() < nbytes:
                link.slots[s] = _slot(int(nbytes * serving.GROWTH), link.pin)
            return link.slots[s]

        batch = self._next(link, i, slot)
        return serving.arrived(batch, i, link.name, self.stats, link.slots[s]), link, s, batch.delta

    def release(self, link: _Link, s: int, done) -> None:
        if done is not None:
            done.synchronize()
        link.free.append(s)
        self._send(link, m.Free(s))

    def close(self, done: bool = False) -> None:
        """Close the connections; ``done``: the run has finished, the servers may leave (otherwise they wait for
        this trainer to come back, after a requeue)."""
        for link in self.links:
            if done:
                try:
                    link.channel.send(m.Stop())
                except OSError:
                    pass
            link.sock.close()
        self.links = []


def announced_servers(folder: Path, count: int, within_s: float) -> list[tuple[str, int]]:
    """The ``count`` servers of a separate job, as they write ``host:port`` into ``folder/<k>`` when they start
    (waiting up to ``within_s`` for them)."""
    deadline = time.monotonic() + within_s
    while True:
        found = [folder / str(k) for k in range(count)]
        if all(p.is_file() for p in found):
            return [(host, int(port)) for host, _, port in (p.read_text().strip().rpartition(":") for p in found)]
        if time.monotonic() > deadline:
            missing = [p.name for p in found if not p.is_file()]
            raise SamplerFailed(f"sampler servers {', '.join(missing)} did not announce themselves in {folder} within "
                                f"{within_s:.0f} s. HINT: check the servers' job (its *_server_* logs)")
        time.sleep(1.0)


RETRY_S = 0.05  # a connection the server closes during the handshake (busy, flooded) is tried again after this,
RETRY_MAX_S = 2.0  # ... doubled each time up to this, until the wait for the server (dist.init_timeout_s) runs out


def _connect(host: str, port: int, k: int, within_s: float, key: bytes, run_dir: Path, rank: int = 0) -> wire.Channel:
    """Connect to server ``k``, retrying while it starts (it may still be preparing the dataset), and prove to each
    other that both know the run's secret, bound to server ``k`` on ``port`` and this ``rank``
    (:func:`hpcgnn.trust.connect`: a process of another user or job on the port, or one that relays it to another
    of the run's servers, is :class:`~hpcgnn.errors.Untrusted`). A connection closed during the handshake (busy,
    flooded: another user may be opening hundreds of connections) is tried again, backing off, for as long as the
    wait for the server lasts (``within_s``), then :class:`~hpcgnn.errors.Flooded`. A server that recorded a failure
    (it could not listen) ends the wait at once."""
    name = f"sampler server {k} at {host}:{port}"
    deadline = time.monotonic() + within_s
    closed, wait = 0, RETRY_S
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=10)
        except OSError as exc:
            if failure_record(run_dir, k) is not None:
                raise AnotherRankFailed(f"{name} failed (its record in {run_dir / 'failures'} says why)") from None
            if time.monotonic() > deadline:
                raise SamplerFailed(f"{name} could not be reached in {within_s:.0f} s ({exc}). HINT: its log says "
                                    "whether it started") from None
            time.sleep(0.5)
            continue
        try:
            session = trust.connect(sock, key, name, k, port, rank)
        except trust.Closed as exc:  # (dropped unanswered: busy, flooded)
            sock.close()
            closed += 1
            if time.monotonic() + wait > deadline:
                raise Flooded(f"{name} closed rank {rank}'s connection during the run's handshake {closed} times in "
                              f"{within_s:.0f} s ({exc}): the server is busy or flooded with connections (possibly "
                              "another user's). HINT: its log names the addresses it refused; start the run again"
                              ) from None
            if closed == 1 or closed % 20 == 0:
                log.warning("%s closed rank %d's connection during the handshake (%s; %d time(s)): trying again "
                            "until dist.init_timeout_s runs out", name, rank, exc, closed)
            time.sleep(wait)
            wait = min(wait * 2, RETRY_MAX_S)
            continue
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return wire.Channel(sock, session, server=False)
