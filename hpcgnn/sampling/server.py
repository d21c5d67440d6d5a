"""Sampler servers: processes on other nodes (or local processes) that make trainers' batches and stream them.

A server holds the graph (it prepares it if its node has no copy, then maps it: one copy per node) and
listens on a port derived from the job id (:func:`hpcgnn.nodes.server_port`). Every trainer connects to every
server and names its sampler once: the server builds it as the trainer did, from the run's config, the graph it
opens, and what it cannot know from them (:class:`hpcgnn.sampling.shipping.SamplerState`, which the trainer wrote
into the run folder). Each epoch it sends the seeds of the batches a server is to make: batch i of rank r goes to
server (i + r) mod S, and is made with the generator the in-process loader would use, so the batches and the
training are those of ``train.sampler_procs=0``.

Transport: one TCP connection per (trainer, server), authenticated both ways by the run's secret and bound to
this server and that trainer (:mod:`hpcgnn.trust`); every frame after that carries its own tag under the
connection's keys (:mod:`hpcgnn.sampling.wire`: a typed format, nothing unpickled). A batch is its description
(offsets, shapes, the batch's plain values) and then its tensors' bytes as they lie in the server's buffer; the
trainer reads them straight into one of its slots (``recv_into``: no copy in Python) and views them in place.
The sampler does not travel: the server builds it; the trainer writes its state into the run folder and sends its
hash.
A server has at most ``train.prefetch`` batches in flight per trainer: it makes the next one when the trainer
hands a slot back, into the second of its two buffers while the first one's bytes go out (:class:`_SocketEnd`).
Sockets and not torch.distributed: the two sides need no common process group (a server's death must not hang a
collective), and a message whose size only the sender knows needs no size exchange.

A server's process starts in :mod:`hpcgnn.rank.server` (a SLURM task, or a local process the launcher spawned).
The trainer's side is :mod:`hpcgnn.sampling.client`; a partitioned graph's batches are relayed
(:mod:`hpcgnn.sampling.relay`); the frames are :mod:`hpcgnn.sampling.wire`'s.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import queue
import select
import selectors
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

import hpcgnn.sampling.messages as m
import hpcgnn.sampling.serving as serving
import hpcgnn.sampling.shipping as shipping
import hpcgnn.sampling.wire as wire
from hpcgnn import io, process, trust
from hpcgnn.checks import SLOT_BYTES
from hpcgnn.errors import PortTaken, SamplerFailed
from hpcgnn.failures import record_failure
from hpcgnn.sampling.relay import Relay

log = logging.getLogger(__name__)

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
    """A server's end of one trainer's connection (:class:`hpcgnn.sampling.serving.End`): ``depth`` batches in
    flight, one more each time the trainer frees a slot. A frame that fails its tag drops the connection, with one
    line.

    Batches are made into two buffers in turn, and a thread of this end's own tags and sends each: while batch i's
    bytes go out (tagged under the GIL), batch i + 1 is sampled (outside it) into the other buffer. Every frame
    goes out through that thread, in the order it was handed over; a relayed batch's bytes (which lie in its
    sampler process's slot) are sent before :meth:`deliver` returns."""

    def __init__(self, channel: wire.Channel, depth: int, name: str):
        self.channel, self.credits, self.name = channel, depth, name
        self.bufs = [torch.empty(SLOT_BYTES, dtype=torch.uint8) for _ in range(2)]  # (pages touched as used)
        self.idle = [threading.Event() for _ in self.bufs]  # set: that buffer's bytes are sent
        for e in self.idle:
            e.set()
        self.turn = 0  # the buffer the next batch is made into
        self.out: queue.Queue = queue.Queue()  # (message, payload, event set once it is sent); None: stop
        self.failed: BaseException | None = None  # why the sending thread stopped
        self.sender = threading.Thread(target=self._send_all, name=f"{name} sender", daemon=True)
        self.sender.start()

    def _send_all(self) -> None:
        while (job := self.out.get()) is not None:
            frame, sent = job
            try:
                if self.failed is None:
                    self.channel.send_encoded(*frame)
            except BaseException as exc:  # (the peer went: the serve loop hears it at its next call)
                self.failed = exc
            finally:
                sent.set()

    def _check(self) -> None:
        if isinstance(self.failed, (ConnectionError, OSError)):
            raise serving.PeerGone from None
        if self.failed is not None:  # (a fault of the sending side's own: raised where the serve loop reports it)
            raise RuntimeError(f"sending to the trainer failed: {self.failed!r}") from self.failed

    def _handover(self, msg, payload: memoryview | None, sent: threading.Event) -> None:
        frame = wire.encoded(msg, payload)  # (here: what the wire does not carry fails the serve loop, reported)
        self._check()
        sent.clear()
        self.out.put((frame, sent))

    def recv(self, wait: bool):
        self._check()
        conn = self.channel.sock
        try:
            return self.channel.receive() if wait or select.select([conn], [], [], 0)[0] else None
        except wire.Forged as why:
            log.warning("%s: dropped the connection of rank %d: %s (a relay, a replay or an injection)", self.name,
                        self.channel.session.rank, why)
            raise serving.PeerGone from None
        except (ConnectionError, OSError):
            raise serving.PeerGone from None

    def send(self, msg) -> None:
        self._handover(msg, None, threading.Event())

    def take(self, msg) -> None:
        if isinstance(msg, m.Free):
            self.credits += 1

    def room(self, i: int) -> bool:
        return self.credits > 0

    def place(self, i: int) -> Tensor:
        while not self.idle[self.turn].wait(1.0):  # (its bytes still going out)
            self._check()
        self._check()
        return self.bufs[self.turn]

    def grow(self, i: int, needed: int, handle) -> Tensor:
        self.bufs[self.turn] = torch.empty(int(needed * serving.GROWTH), dtype=torch.uint8)
        return self.bufs[self.turn]

    def deliver(self, i: int, meta, delta, nbytes: int, payload: memoryview | None = None) -> None:
        msg = m.Batch(i, meta, delta)
        if payload is not None:  # relayed: sent before its bytes' slot goes back to the sampler process
            sent = threading.Event()
            self._handover(msg, payload, sent)
            sent.wait()
            self._check()
        else:
            self._handover(msg, memoryview(self.bufs[self.turn].numpy())[:nbytes], self.idle[self.turn])
            self.turn = 1 - self.turn
        self.credits -= 1

    def close(self, flush: bool) -> None:
        """Stop the sending thread: after what it was handed (``flush``: a failure to report), or at once (the
        trainer said stop, or went: the socket is shut, which ends a send under way)."""
        if not flush:
            with contextlib.suppress(OSError):
                self.channel.sock.shutdown(socket.SHUT_RDWR)
        self.out.put(None)
        self.sender.join(timeout=None if not flush else 30.0)


def _serve_trainer(channel: wire.Channel, counters: _Counters, threads: int, fail_batch: int, run_dir: str,
                   name: str, build: Callable[[shipping.SamplerState], shipping.Recipe]) -> bool:
    """One trainer's connection: its sampler, then its batches, ``depth`` in flight, until it stops (True: it
    is done; False: it left without saying so, and may come back after a requeue).

    The sampler is built here (``build``: from the run's config and the graph the server opens) as the trainer
    built its own, from the state the trainer wrote into the run folder, the one whose hash it sent (never anything
    the socket brought, and nothing unpickled). A whole graph's batches are made here, in this thread, by the trainer's own sampler, even
    where trainers send the same recipe: a sampler's scratch (its id maps) holds one batch at a time, and this
    thread samples while the others do. The graph's file-backed tensors are mapped again, not copied: the node's
    one copy in the page cache serves them all. A partitioned graph's are relayed (:class:`hpcgnn.sampling.relay.Relay`)."""
    end = _SocketEnd(channel, 1, name)
    flush = False  # (True: a failure is reported to the trainer, sent before the connection closes)
    try:
        try:
            hello = end.recv(wait=True)
        except serving.PeerGone:
            return False  # it left before saying what it wants (a requeued trainer comes back)
        if not isinstance(hello, m.Hello) or hello.rank != channel.session.rank:
            log.warning("%s: dropped the connection of rank %d: it began with %s", name, channel.session.rank,
                        type(hello).__name__ if not isinstance(hello, m.Hello) else f"a hello of rank {hello.rank}")
            return False
        end.credits = hello.depth

        def start() -> serving.Maker:
            state = shipping.fetch(run_dir, hello.rank, hello.recipe)
            if hello.group:  # (its sampler process builds it, through the same builder)
                return Relay(hello, shipping.Deferred(build, state), threads, fail_batch)
            return serving.Sampling(build(state), fail_batch)

        flush = True
        done = serving.serve(end, start, counters)
        flush = False
        return done
    finally:
        end.close(flush)


def trainers_of(server: int, servers: int, world_size: int, partitioned: bool) -> int:
    """How many trainers connect to server ``server``: all of them, or (a partitioned graph) those whose rank
    it serves (rank mod servers)."""
    return len([r for r in range(world_size) if not partitioned or r % servers == server])


MAX_PENDING = 256  # connections in their handshake at once; past that the oldest is closed (each holds a descriptor)
ACCEPT_TURN = 64  # connections accepted per turn of the accept loop, between reads of the handshakes' answers


def run_server(index: int, port: int, trainers: int, threads: int, run_dir: str, key: bytes,
               build: Callable[[shipping.SamplerState], shipping.Recipe], prepare=None, host: str = "",
               fail_batch: int = -1, idle_s: float = 1800.0, announce: Path | None = None) -> None:
    """Serve trainers on ``host:port`` until ``trainers`` of them have said they are done (a trainer that is
    requeued connects again), then return; ``prepare()`` (the dataset) runs meanwhile, and trainers wait for it.
    ``build(state)``: a trainer's sampler, from the state it wrote into the run folder
    (:class:`hpcgnn.stores.recipes.ServerRecipes`, given the run's config).
    ``announce``: a file to write ``host:port`` into (two jobs meeting through the run folder). Gives up after
    ``idle_s`` without a trainer.

    Every connection must first pass the run's handshake (:class:`hpcgnn.trust.Accepting`, with ``key``, the
    run's secret, bound to this server's ``index`` and ``port``): one that does not, or not within
    :data:`hpcgnn.trust.HANDSHAKE_S`, is closed unread, logged at most once a second per address, and the
    server serves on. A port another process holds is :class:`~hpcgnn.errors.PortTaken` (one line). A failure
    is recorded in the run's failure records (the trainers and the launcher read it), then raised."""
    try:
        process.set_threads(threads)
        process.keep_freed_memory()
        _Server(index, port, trainers, threads, run_dir, key, host, fail_batch, build).run(prepare, idle_s, announce)
    except Exception as exc:
        record_failure(Path(run_dir), None, exc, server=index)
        raise


class _Refusals:
    """Refused connections, logged at most once a second per address, with how many went unsaid since: those are
    said by the next line from that address, or by :meth:`flush` a second later (and at the server's end), so that
    no count is lost when no later line comes."""

    def __init__(self, name: str, every_s: float = 1.0):
        self.name, self.every_s = name, every_s
        self.last: dict[str, tuple[float, int, str]] = {}  # host -> (when last logged, refused since, the last why)

    def __call__(self, addr: tuple, why: str) -> None:
        now, host = time.monotonic(), addr[0]
        when, unsaid, _ = self.last.get(host, (-1e9, 0, ""))
        if now - when < self.every_s:
            self.last[host] = (when, unsaid + 1, why)
            return
        more = f" (and {unsaid} more from {host} since the last line)" if unsaid else ""
        log.warning("%s: refused a connection from %s:%s: %s%s", self.name, host, addr[1], why, more)
        self.last[host] = (now, 0, why)
        if len(self.last) > 4096:  # (a flood from many addresses: forget the quiet ones)
            self.last = {h: v for h, v in self.last.items() if now - v[0] < self.every_s or v[1]}

    def flush(self, force: bool = False) -> None:
        """Say the counts not yet said whose address has been quiet for a second (``force``: all of them)."""
        now = time.monotonic()
        for host, (when, unsaid, why) in list(self.last.items()):
            if unsaid and (force or now - when >= self.every_s):
                log.warning("%s: refused %d more connection(s) from %s since the last line (the last: %s)", self.name,
                            unsaid, host, why)
                self.last[host] = (now, 0, why)


class _Pending:
    """One connection in its handshake: what it has sent so far, and its deadline."""

    def __init__(self, conn: socket.socket, addr: tuple, state: trust.Accepting):
        self.conn, self.addr, self.state = conn, addr, state
        self.got = bytearray()
        self.deadline = time.monotonic() + trust.HANDSHAKE_S


class _Server:
    """One sampler server's listener, its connections' threads, and the status file ``hpcgnn status`` reads."""

    def __init__(self, index: int, port: int, trainers: int, threads: int, run_dir: str, key: bytes, host: str,
                 fail_batch: int, build: Callable):
        self.index, self.port, self.trainers, self.threads = index, port, trainers, threads
        self.key, self.fail_batch, self.run_dir, self.build = key, fail_batch, run_dir, build
        self.name = f"sampler server {index} on {socket.gethostname()}:{port}"
        try:
            self.listener = socket.create_server((host, port), reuse_port=False, backlog=1024)
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
        self.refused = _Refusals(self.name)

    def write_status(self) -> None:
        io.write_json(self.status, {"server": self.index, "host": socket.gethostname(), "port": self.port,
                                    "pid": os.getpid(), "time": time.time(), **self.counters.as_dict()})

    def run(self, prepare, idle_s: float, announce: Path | None) -> None:
        if announce is not None:
            announce.parent.mkdir(parents=True, exist_ok=True)
            with io.atomic_open(announce) as f:
                f.write(f"{socket.gethostname()}:{self.port}")
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
        """Accept connections and drive every handshake in this one thread, none waiting on another: a peer that
        sends nothing, or a byte every few seconds, holds up no one, and is closed at its deadline. A trainer that
        proved itself is served in a thread of its own. Ends when every trainer is done or a connection failed;
        handshakes still under way then are closed, not waited for."""
        sel = selectors.DefaultSelector()
        self.listener.setblocking(False)
        sel.register(self.listener, selectors.EVENT_READ)
        pending: dict[socket.socket, _Pending] = {}  # (in arrival order)
        serving_: list[threading.Thread] = []
        idle_since = time.monotonic()
        try:
            while self.done < self.trainers and not self.errors:
                ready = [key.fileobj for key, _ in sel.select(timeout=0.25)]
                for conn in ready:  # (handshakes first: an answer that came is read before new arrivals evict it)
                    p = pending.get(conn)  # (None: dropped earlier this turn, its socket closed)
                    if p is not None:
                        self._step(sel, pending, p, serving_)
                if self.listener in ready:
                    self._take_new(sel, pending)
                now = time.monotonic()
                for p in [p for p in pending.values() if now > p.deadline]:
                    self._drop(sel, pending, p, f"no handshake within {trust.HANDSHAKE_S:.0f} s")
                serving_ = [t for t in serving_ if t.is_alive()]
                self.refused.flush()
                if serving_ or pending or not self.prepared.is_set():
                    idle_since = now
                elif now - idle_since > idle_s:
                    raise SamplerFailed(f"{self.name}: no trainer for {idle_s:.0f} s (dist.init_timeout_s); "
                                        "giving up") from None
        finally:
            for p in list(pending.values()):
                self._drop(sel, pending, p, None)
            sel.close()
            self.refused.flush(force=True)
        for t in serving_:  # (the run's own trainers, who said they are done)
            t.join()

    def _take_new(self, sel, pending: dict) -> None:
        """Accept up to :data:`ACCEPT_TURN` connections waiting in the backlog (the rest at the next turn, after the
        handshakes that answered meanwhile are read), greeting each."""
        for _ in range(ACCEPT_TURN):
            try:
                conn, addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # (out of descriptors: the oldest handshakes make room)
                log.warning("%s: cannot accept a connection (%s)", self.name, exc.strerror)
                if pending:
                    self._drop(sel, pending, next(iter(pending.values())), "the server is out of descriptors")
                return
            if len(pending) >= MAX_PENDING:
                self._drop(sel, pending, next(iter(pending.values())), f"{MAX_PENDING} newer connections came")
            conn.setblocking(False)
            p = _Pending(conn, addr, trust.Accepting(self.key, self.index, self.port))
            try:
                conn.send(p.state.greeting())  # (a fresh socket's buffer takes these few bytes whole)
            except OSError:
                conn.close()
                continue
            pending[conn] = p
            sel.register(conn, selectors.EVENT_READ)

    def _step(self, sel, pending: dict, p: _Pending, serving_: list) -> None:
        try:
            chunk = p.conn.recv(p.state.need - len(p.got))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(sel, pending, p, f"the handshake broke off ({exc})")
            return
        if not chunk:
            self._drop(sel, pending, p, "it closed the connection during the handshake")
            return
        p.got += chunk
        if len(p.got) < p.state.need:
            return
        sel.unregister(p.conn)
        del pending[p.conn]
        try:
            proof, session = p.state.answer(bytes(p.got))
        except trust.PeerRefused as why:
            with contextlib.suppress(OSError):
                p.conn.send(trust.REFUSAL)
            p.conn.close()
            self.refused(p.addr, str(why))
            return
        try:
            p.conn.setblocking(True)
            p.conn.settimeout(trust.HANDSHAKE_S)
            p.conn.sendall(proof)
            p.conn.settimeout(None)
        except OSError as exc:
            p.conn.close()
            self.refused(p.addr, f"the handshake broke off ({exc})")
            return
        t = threading.Thread(target=self._serve, args=(p.conn, session, p.addr), daemon=True)
        t.start()
        serving_.append(t)

    def _drop(self, sel, pending: dict, p: _Pending, why: str | None) -> None:
        """Close a connection in its handshake, telling it to try again (:data:`hpcgnn.trust.BUSY`): a trainer
        dropped for room does, an outsider does not matter."""
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(p.conn)
        pending.pop(p.conn, None)
        with contextlib.suppress(OSError):
            p.conn.recv(4096)  # (what it sent unread would make the close a reset, which may cut off the BUSY)
        with contextlib.suppress(OSError):
            p.conn.send(trust.BUSY)
            p.conn.shutdown(socket.SHUT_WR)
        p.conn.close()
        if why is not None:
            self.refused(p.addr, why)

    def _serve(self, conn: socket.socket, session: trust.Session, addr: tuple) -> None:
        """One trainer's connection, authenticated: (once the dataset is ready) its batches."""
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.prepared.wait()  # (trainers that connect meanwhile wait here, authenticated)
            if self.errors:
                return
            channel = wire.Channel(conn, session, server=True)
            if _serve_trainer(channel, self.counters, self.threads, self.fail_batch, self.run_dir,
                              f"{self.name} (from {addr[0]}:{addr[1]})", self.build):
                with self.counters.lock:
                    self.done += 1
        except BaseException as exc:
            self.errors.append(exc)
        finally:
            conn.close()


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
