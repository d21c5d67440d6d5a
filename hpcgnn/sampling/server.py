"""Sampler servers: processes on other nodes (or local processes) that make trainers' batches and stream them.

A server holds the graph (it prepares it if its node has no copy, then maps it: one copy per node) and
listens on a port derived from the job id (:func:`hpcgnn.env.server_port`). Every trainer connects to every
server and sends its sampler once, as sampler processes get it (:mod:`hpcgnn.sampling.shipping`: the graph's
tensors as file ranges). Each epoch it sends the seeds of the batches a server is to make: batch i of rank r
goes to server (i + r) mod S, and is made with the generator the in-process loader would use, so the batches
and the training are those of ``train.sampler_procs=0``.

Transport: one TCP connection per (trainer, server). A batch is a small pickled header (offsets, shapes,
the batch's plain values) and then its tensors' bytes as they lie in the server's buffer; the trainer reads
them straight into one of its slots (``recv_into``: no pickle, no copy in Python) and views them in place.
A server has at most ``train.prefetch`` batches in flight per trainer: it makes the next one when the trainer
hands a slot back. Sockets and not torch.distributed: the two sides need no common process group (a server's
death must not hang a collective), and a message whose size only the sender knows needs no size exchange.

A server's process starts in :mod:`hpcgnn.rank.server` (a SLURM task, or a local process the launcher spawned).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import pickle
import select
import socket
import struct
import threading
import time
from collections import deque
from pathlib import Path

import torch
from torch import Tensor

import hpcgnn.sampling.messages as m
import hpcgnn.sampling.serving as serving
import hpcgnn.sampling.shipping as shipping
from hpcgnn import process, trust
from hpcgnn.checks import SLOT_BYTES
from hpcgnn.errors import AnotherRankFailed, PortTaken, SamplerFailed
from hpcgnn.failures import record_failure
from hpcgnn.failures import server_failure as failure_record
from hpcgnn.sampling.loader import BatchLoader

log = logging.getLogger(__name__)

_HEAD = struct.Struct("!QQ")  # header bytes, payload bytes


def send(sock: socket.socket, obj, payload: memoryview | None = None) -> None:
    head = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEAD.pack(len(head), 0 if payload is None else len(payload)) + head)
    if payload is not None and len(payload):
        sock.sendall(payload)


def receive(sock: socket.socket, slot=None):
    """The next message, and its payload read into ``slot(nbytes)`` (a uint8 tensor it returns), if any."""
    head = bytearray(_HEAD.size)
    trust.recv_into(sock, memoryview(head))
    n_head, n_payload = _HEAD.unpack(head)
    body = bytearray(n_head)
    trust.recv_into(sock, memoryview(body))
    obj = pickle.loads(body)
    if n_payload:
        buf = slot(n_payload)
        trust.recv_into(sock, memoryview(buf.numpy())[:n_payload])
    return obj


# ---------------------------------------------------------------------- the server


class _Counters:
    """What a server's threads did, together (:class:`hpcgnn.sampling.serving.Counters`)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.batches, self.sample_s, self.wait_s, self.bytes = 0, 0.0, 0.0, 0

    def waited(self, seconds: float) -> None:
        with self.lock:
            self.wait_s += seconds

    def made(self, seconds: float, nbytes: int) -> None:
        with self.lock:
            self.batches += 1
            self.sample_s += seconds
            self.bytes += nbytes

    def as_dict(self) -> dict:
        return {"batches_served": self.batches, "sample_s": round(self.sample_s, 3),
                "wait_s": round(self.wait_s, 3), "bytes_sent": self.bytes}


class _SocketEnd:
    """A server's end of one trainer's connection (:class:`hpcgnn.sampling.serving.End`): a batch is written into
    this thread's buffer and its bytes sent after its message; ``depth`` batches in flight, one more each time
    the trainer frees a slot."""

    def __init__(self, conn: socket.socket, depth: int):
        self.conn, self.credits = conn, depth
        self.buf = torch.empty(SLOT_BYTES, dtype=torch.uint8)

    def recv(self, wait: bool):
        try:
            return receive(self.conn) if wait or select.select([self.conn], [], [], 0)[0] else None
        except (ConnectionError, OSError):
            raise serving.PeerGone from None

    def send(self, msg, payload: memoryview | None = None) -> None:
        try:
            send(self.conn, msg, payload)
        except (ConnectionError, OSError):
            raise serving.PeerGone from None

    def take(self, msg) -> None:
        if isinstance(msg, m.Free):
            self.credits += 1

    def room(self, i: int) -> bool:
        return self.credits > 0

    def place(self, i: int) -> Tensor:
        return self.buf

    def grow(self, i: int, needed: int, handle) -> Tensor:
        self.buf = torch.empty(int(needed * serving.GROWTH), dtype=torch.uint8)
        return self.buf

    def deliver(self, i: int, meta, delta, nbytes: int) -> None:
        self.send(m.Batch(i, meta, delta), memoryview(self.buf.numpy())[:nbytes])
        self.credits -= 1


class _Relay:
    """A partitioned graph's batches, made by a sampler process of this trainer's
    (:class:`~hpcgnn.sampling.procs.SamplerPool`), which joins the group of every trainer's (on every server) to
    sample across parts; the serve loop relays them (:class:`hpcgnn.sampling.serving.Maker`)."""

    def __init__(self, hello: m.Hello, threads: int, fail_batch: int):
        from hpcgnn.sampling.procs import SamplerPool

        self.pool = SamplerPool(hello.recipe, 1, hello.depth, threads, torch.device("cpu"), rank=hello.rank,
                                group=hello.group, fail_batch=fail_batch)
        self.held = None
        self.pool.start()

    def epoch(self, msg: m.Epoch) -> None:  # its process starts on them at once
        self.pool.begin(msg.batch_seed, msg.jobs)

    def make(self, i: int, seeds: Tensor, batch_seed: int, alloc) -> tuple:
        data, p, slot, delta = self.pool.receive(i)
        self.held = (p, slot)
        return data, delta

    def done(self) -> None:
        self.pool.release(*self.held, None)

    def close(self) -> None:
        self.pool.close()


def _serve_trainer(conn: socket.socket, counters: _Counters, threads: int, fail_batch: int) -> bool:
    """One trainer's connection: its sampler, then its batches, ``depth`` in flight, until it stops (True: it
    is done; False: it left without saying so, and may come back after a requeue).

    A whole graph's batches are made here, in this thread, by the trainer's own sampler, even where trainers send
    the same recipe: a sampler's scratch (its id maps) holds one batch at a time, and this thread samples while the
    others do. The graph's file-backed tensors are mapped again, not copied: the node's one copy in the page cache
    serves them all. A partitioned graph's are relayed (:class:`_Relay`)."""
    try:
        hello = receive(conn)
    except (ConnectionError, OSError):
        return False  # it left before saying what it wants (a requeued trainer comes back)
    if not isinstance(hello, m.Hello):
        raise RuntimeError(f"a trainer began with {type(hello).__name__}, not Hello")

    def start() -> serving.Maker:
        return _Relay(hello, threads, fail_batch) if hello.group else serving.Sampling(hello.recipe, fail_batch)

    return serving.serve(_SocketEnd(conn, hello.depth), start, counters)


def trainers_of(server: int, servers: int, world_size: int, partitioned: bool) -> int:
    """How many trainers connect to server ``server``: all of them, or (a partitioned graph) those whose rank
    it serves (rank mod servers)."""
    return len([r for r in range(world_size) if not partitioned or r % servers == server])


MAX_HANDSHAKES = 64  # connections a server authenticates at once; more are closed unread


def run_server(index: int, port: int, trainers: int, threads: int, run_dir: str, key: bytes, prepare=None,
               host: str = "", fail_batch: int = -1, idle_s: float = 1800.0, announce: Path | None = None) -> None:
    """Serve trainers on ``host:port`` until ``trainers`` of them have said they are done (a trainer that is
    requeued connects again), then return; ``prepare()`` (the dataset) runs meanwhile, and trainers wait for it.
    ``announce``: a file to write ``host:port`` into (two jobs meeting through the run folder). Gives up after
    ``idle_s`` without a trainer.

    Every connection must first pass the run's handshake (:func:`hpcgnn.trust.accept`, with ``key``, the run's
    secret): one that does not is logged with its address and closed, unread, and the server serves on. A port
    another process holds is :class:`~hpcgnn.errors.PortTaken` (one line). A failure is recorded in the run's
    failure records (the trainers and the launcher read it), then raised."""
    try:
        torch.set_num_threads(threads)
        process.keep_freed_memory()
        _Server(index, port, trainers, threads, run_dir, key, host, fail_batch).run(prepare, idle_s, announce)
    except Exception as exc:
        record_failure(Path(run_dir), None, exc, server=index)
        raise


class _Server:
    """One sampler server's listener, its connections' threads, and the status file ``hpcgnn status`` reads."""

    def __init__(self, index: int, port: int, trainers: int, threads: int, run_dir: str, key: bytes, host: str,
                 fail_batch: int):
        self.index, self.port, self.trainers, self.threads = index, port, trainers, threads
        self.key, self.fail_batch = key, fail_batch
        self.name = f"sampler server {index} on {socket.gethostname()}:{port}"
        try:
            self.listener = socket.create_server((host, port), reuse_port=False,
                                                 backlog=max(trainers, 8) + MAX_HANDSHAKES)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise PortTaken(f"{self.name} cannot listen: port {port} of {host or 'this node'} is taken by another "
                            "process (another user's or another job's). HINT: start the run again (a new job id moves "
                            "the port), or move the ports with dist.port_min and dist.port_max") from None
        self.status = Path(run_dir) / "metrics" / f"sampler-server-{index}.json"
        self.status.parent.mkdir(parents=True, exist_ok=True)
        self.counters = _Counters()
        self.errors: list[BaseException] = []
        self.done = 0  # trainers that said they are done
        self.prepared = threading.Event()
        self.handshakes = threading.BoundedSemaphore(MAX_HANDSHAKES)

    def write_status(self) -> None:
        tmp = self.status.with_suffix(".tmp")
        tmp.write_text(json.dumps({"server": self.index, "host": socket.gethostname(), "port": self.port,
                                   "pid": os.getpid(), "time": time.time(), **self.counters.as_dict()}))
        tmp.replace(self.status)

    def run(self, prepare, idle_s: float, announce: Path | None) -> None:
        if announce is not None:
            announce.parent.mkdir(parents=True, exist_ok=True)
            tmp = announce.with_suffix(".tmp")
            tmp.write_text(f"{socket.gethostname()}:{self.port}")
            tmp.replace(announce)
        stop = threading.Event()

        def keep_writing() -> None:  # what `python -m hpcgnn status RUN_DIR` shows while the run goes on
            while not stop.wait(2.0):
                self.write_status()

        with self.listener:
            self.write_status()
            threading.Thread(target=keep_writing, daemon=True).start()
            threading.Thread(target=self._get_ready, args=(prepare,), daemon=True).start()
            log.info("%s: listening for %d trainer(s), %d thread(s)", self.name, self.trainers, self.threads)
            self._accept(idle_s)
        stop.set()
        self.write_status()
        log.info("%s: served %s", self.name, self.counters.as_dict())
        if self.errors:
            raise self.errors[0]

    def _get_ready(self, prepare) -> None:
        try:
            if prepare is not None:
                prepare()
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            self.prepared.set()

    def _accept(self, idle_s: float) -> None:
        """Connections, each in a thread of its own, until every trainer is done or a connection failed."""
        active: list[threading.Thread] = []
        self.listener.settimeout(1.0)
        idle_since = time.monotonic()
        while self.done < self.trainers and not self.errors:
            try:
                conn, addr = self.listener.accept()
            except TimeoutError:
                active = [t for t in active if t.is_alive()]
                if active or not self.prepared.is_set():
                    idle_since = time.monotonic()
                elif time.monotonic() - idle_since > idle_s:
                    raise SamplerFailed(f"{self.name}: no trainer for {idle_s:.0f} s (dist.init_timeout_s); "
                                        "giving up") from None
                continue
            peer = f"{addr[0]}:{addr[1]}"
            if not self.handshakes.acquire(blocking=False):
                log.warning("%s: refused a connection from %s unread: %d others are in their handshake", self.name,
                            peer, MAX_HANDSHAKES)
                conn.close()
                continue
            conn.settimeout(None)
            t = threading.Thread(target=self._serve, args=(conn, peer), daemon=True)
            t.start()
            active.append(t)
        for t in active:
            t.join()

    def _serve(self, conn: socket.socket, peer: str) -> None:
        """One connection: the run's handshake, then (once the dataset is ready) the trainer's batches."""
        try:
            try:
                trust.accept(conn, self.key)
            except trust.PeerRefused as why:
                log.warning("%s: refused a connection from %s: %s", self.name, peer, why)
                return
            finally:
                self.handshakes.release()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.prepared.wait()  # (trainers that connect meanwhile wait here, authenticated)
            if self.errors:
                return
            if _serve_trainer(conn, self.counters, self.threads, self.fail_batch):
                with self.counters.lock:
                    self.done += 1
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            conn.close()


# ---------------------------------------------------------------------- the trainer's side


class _Link:
    """A trainer's connection to one server, and the slots its batches land in."""

    def __init__(self, index: int, host: str, port: int, sock: socket.socket, depth: int, pin: bool):
        self.index, self.host, self.port, self.sock, self.pin = index, host, port, sock, pin
        self.slots = [_slot(SLOT_BYTES, pin) for _ in range(depth)]
        self.free = deque(range(depth))

    @property
    def name(self) -> str:
        return f"sampler server {self.index} at {self.host}:{self.port}"


def _slot(nbytes: int, pin: bool) -> Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)


class RemotePool:
    """A trainer's sampler servers: :class:`~hpcgnn.sampling.procs.SamplerPool`'s interface over sockets."""

    def __init__(self, recipe: shipping.Recipe, servers: list[tuple[str, int]], depth: int, device: torch.device, *,
                 rank: int, key: bytes, run_dir: str | Path, timeout_s: float = 120.0, connect_s: float = 1800.0,
                 group: dict | None = None):
        self.recipe, self.depth, self.group = recipe, max(1, depth), group
        self.key, self.run_dir = key, Path(run_dir)  # the run's secret (hpcgnn.trust); where servers record failures
        # a partitioned graph: one server makes all of this rank's batches, in the rank's group of samplers
        self.servers = [servers[rank % len(servers)]] if group else servers
        self.first = rank % len(servers) if group else 0  # the index of self.servers[0] among all servers
        self.device, self.rank, self.timeout_s, self.connect_s = device, rank, timeout_s, connect_s
        self.links: list[_Link] = []
        self.stats = recipe.stats

    def start(self) -> None:
        if self.links:
            return
        recipe = shipping.dumps(self.recipe)
        t0 = time.perf_counter()
        for k, (host, port) in enumerate(self.servers, start=self.first):
            sock = _connect(host, port, k, self.connect_s, self.key, self.run_dir)
            sock.settimeout(self.connect_s)  # a server may still be preparing the dataset
            send(sock, m.Hello(self.rank, recipe, self.depth, self.group))
            self.links.append(_Link(k, host, port, sock, self.depth, self.device.type == "cuda"))
        for link in self.links:
            self._next(link, "start")
            link.sock.settimeout(self.timeout_s)
        log.info("rank %d: %d sampler server(s) ready (%s) in %.1f s", self.rank, len(self.links),
                 ", ".join(f"{h}:{p}" for h, p in self.servers), time.perf_counter() - t0)

    def epoch(self, loader: BatchLoader) -> serving.ProducedLoader:
        """``loader``'s batches (the same seeds, generators and order), made by the servers."""
        return serving.ProducedLoader(self, loader)

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
            send(link.sock, msg)
        except OSError as exc:
            raise self._lost(link, "sending to it", exc) from None  # (its death is seen here first, often)

    def _next(self, link: _Link, i, slot=None):
        try:
            msg = receive(link.sock, slot)
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
                    send(link.sock, m.Stop())
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


def _connect(host: str, port: int, k: int, within_s: float, key: bytes, run_dir: Path) -> socket.socket:
    """Connect to server ``k``, retrying while it starts (it may still be preparing the dataset), and prove to each
    other that both know the run's secret (:func:`hpcgnn.trust.connect`: a process of another user or job on
    the port is :class:`~hpcgnn.errors.Untrusted`). A server that recorded a failure (it could not listen)
    ends the wait at once."""
    name = f"sampler server {k} at {host}:{port}"
    deadline = time.monotonic() + within_s
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=10)
            break
        except OSError as exc:
            if failure_record(run_dir, k) is not None:
                raise AnotherRankFailed(f"{name} failed (its record in {run_dir / 'failures'} says why)") from None
            if time.monotonic() > deadline:
                raise SamplerFailed(f"{name} could not be reached in {within_s:.0f} s ({exc}). HINT: its log says "
                                    "whether it started") from None
            time.sleep(0.5)
    try:
        trust.connect(sock, key, name)
    except BaseException:
        sock.close()
        raise
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def bind_address(own: str, peers: list[str] = (), resolve=socket.gethostbyname) -> str:
    """The address a server listens on: the one its trainers reach it by (``own``, its node's name as they know
    it). Where that name resolves to loopback here (a Debian hosts file maps the host's own name to 127.0.1.1),
    the trainers reach the node by another address, unless they resolve their own names to loopback too (one
    machine: the dev cluster): then every interface (""), which the handshake guards as any other. A name that
    does not resolve: every interface."""
    try:
        addr = resolve(own)
    except OSError:
        return ""
    if not addr.startswith("127."):
        return addr
    try:
        local = all(resolve(p) == addr for p in peers)
    except OSError:
        local = False
    return addr if peers and local else ""
