"""Who may talk to a run's processes: the run's secret, and the handshake every connection starts with.

A cluster is shared: every user can reach every node's ports and read every job id from ``squeue``, so
a port derived from the job id is known to all, and any of them can connect to it, or bind it first.
hpcgnn's own listeners (the sampler servers, :mod:`hpcgnn.sampling.server`) therefore act on nothing a
peer sends before the peer has proven, in both directions, that it knows the **run's secret**:

- the secret is 32 random bytes (:func:`secrets.token_bytes`), made once per run folder where the run
  starts, in ``<run_dir>/.secret`` with mode 0600 (only its owner reads it: see :func:`run_secret`);
  every process of the run (the launcher, the ranks, the servers) reads it there, on the run folder's
  file system that the job's nodes share anyway; a secret file that others can read, or that another
  user owns, is refused;
- every connection begins with a challenge-response in both directions (:class:`Accepting` and
  :func:`accept` on the listening side, :func:`connect` on the other): the listener sends a magic string, a
  fresh random nonce, its index and its port; the connecting side checks those are the server it dialled and
  answers with its own nonce, its rank and HMAC-SHA256(secret, "trainer->server" | index | port | rank | both
  nonces); the listener checks it (in constant time) and proves itself with HMAC-SHA256(secret,
  "server->trainer" | the same). Fixed-size fields only, within one deadline: nothing is unpickled, decoded or
  allocated by size before both proofs are checked. A replayed answer fails (the nonces are new each time),
  and so does a reflected one (the two directions hash different labels).

The handshake binds the server's index and port and the trainer's rank into both proofs, and derives the
connection's own frame keys from both nonces (:class:`Session`): every frame after it is tagged
(:mod:`hpcgnn.sampling.wire`), so a relay to another of the run's servers, a replay or an injection fails.
What this does not do: encrypt (the batches can be read by whoever reads the network); torch's rendezvous
store and gloo's connections are PyTorch's and are not authenticated (docs/security.md says what hpcgnn does
about them).

This module also says whose files hpcgnn trusts (:func:`run_folder`; files: :mod:`hpcgnn.paths`): a
folder or file another user owns or may write is refused, as ssh refuses a writable ``~/.ssh``.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import os
import secrets
import socket
import stat
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from hpcgnn import paths
from hpcgnn.errors import ConfigError, Untrusted

SECRET_FILE = ".secret"  # in the run folder, mode 0600
ANNOUNCED = "servers"  # in the run folder: where sampler servers of a separate job write host:port (servers/<k>)


def announced(run_dir: str | Path) -> Path:
    """Where servers of a separate job write ``host:port`` (``servers/<k>``), for the trainers to read (and then
    prove themselves to, as anyone can write a port there that the run's secret does not answer)."""
    return Path(run_dir) / ANNOUNCED


def secret_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / SECRET_FILE


def run_secret(run_dir: str | Path, wait_s: float = 10.0) -> bytes:
    """The run's secret: read from ``<run_dir>/.secret``, or made there now (mode 0600) by whichever process of
    the run comes first (an exclusive create: processes starting at once all end with the same secret).

    Refused (:class:`~hpcgnn.errors.ConfigError`, exit 2): a secret file another user owns, or that others may
    read or write (its mode), or that is not a plain file."""
    path = secret_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            os.write(fd, secrets.token_hex(32).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
    deadline = time.monotonic() + wait_s
    while True:
        text = _read_private(path)
        if len(text) == 64 or time.monotonic() > deadline:  # (another process may be writing it this moment)
            break
        time.sleep(0.05)
    try:
        return bytes.fromhex(text)
    except ValueError:
        pass
    raise ConfigError(f"the run's secret {path} is not 64 hex digits (a half-written or foreign file). HINT: remove "
                      "it (a new one is made; the run's servers and trainers must then all restart), or use a new "
                      "run folder")


def _read_private(path: Path) -> str:
    """A file's text, refused unless it is this user's, a plain file, and private to them."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)  # (a FIFO: refused below, not waited on)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"the run's secret {path} is a symbolic link, which hpcgnn does not follow. HINT: "
                              "another user may have planted it: remove it (a new secret is made, mode 0600), and use "
                              "a run folder only you can write") from None
        raise ConfigError(f"cannot read the run's secret {path} ({exc.strerror}). HINT: it must be a plain file of "
                          "yours, mode 0600; remove it to have a new one made") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"the run's secret {path} is {paths.kind_of(st.st_mode)}, not a plain file (owner uid "
                              f"{st.st_uid}). HINT: another user may have planted it: remove it, and use a run folder "
                              "only you can write")
        if st.st_uid != os.getuid():
            raise ConfigError(f"the run's secret {path} belongs to another user (uid {st.st_uid}). HINT: another user "
                              "may have planted it: use a run folder only you can write")
        if st.st_mode & 0o077:
            raise ConfigError(f"the run's secret {path} can be read or written by others (mode "
                              f"{stat.S_IMODE(st.st_mode):04o}). HINT: remove it and use a run folder only you can "
                              "write (a new secret is made, mode 0600)")
        return f.read(128).decode(errors="replace").strip()


# ---------------------------------------------------------------------- what another user may have written


def private_umask() -> None:
    """Files and folders this process makes are writable by their owner alone (a umask of 002, common where
    users have a group of their own, would make run folders that :func:`run_folder` refuses)."""
    os.umask(os.umask(0o022) | 0o022)


def run_folder(run_dir: str | Path, hint: str = "use a run folder of your own (hydra.run.dir=...)",
               what: str = "the run folder") -> None:
    """Refuse a run or sweep folder (``what`` says which) any part of which, at any depth, another user owns, may
    write, or planted a link in (:func:`hpcgnn.paths.check_tree`): its config is replayed, its checkpoints loaded,
    and what hpcgnn writes there must not go where another user points."""
    paths.check_tree(run_dir, what, hint)


def write_own_file(path: str | Path, data: bytes) -> None:
    """``data`` into ``path`` whole or not at all, readable by this user alone (mode 0600)."""
    from hpcgnn.io import atomic_open

    with atomic_open(Path(path), "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(data)


# ---------------------------------------------------------------------- the handshake

MAGIC = b"hpcgnn-auth/2\n"
NONCE = 32  # bytes, each side's
DIGEST = 32  # bytes of HMAC-SHA256
_GREETING = struct.Struct(f"!{len(MAGIC)}s{NONCE}sII")  # magic, the server's nonce, its index, its port
_ANSWER = struct.Struct(f"!{NONCE}sI{DIGEST}s")  # the trainer's nonce, its rank, its proof
HANDSHAKE_S = 5.0  # the whole exchange, either side: one deadline, not one per read
REFUSAL = bytes(DIGEST)  # what a listener sends instead of its proof to a peer whose proof failed
BUSY = b"\xff" * DIGEST  # ... to a peer it drops unanswered (too many handshakes at once, or too slow): try again


class PeerRefused(Exception):
    """A peer that did not prove it knows the run's secret (the listener drops it and serves on)."""


class Closed(ConnectionError):
    """The listener dropped the handshake unanswered (:data:`BUSY`): it is busy or flooded (too many handshakes
    at once), or ending; the connecting side tries again."""


@dataclass(frozen=True)
class Session:
    """What both ends of one authenticated connection agreed on: who is at each end (bound into both proofs) and
    the connection's own frame keys (derived from both nonces: a frame of another connection never verifies)."""

    index: int  # the server's index among the run's servers
    port: int  # the port it listens on
    rank: int  # the trainer's rank
    to_server: bytes  # the key of frames trainer -> server
    to_trainer: bytes  # ... server -> trainer


def _binding(index: int, port: int, rank: int, server_nonce: bytes, trainer_nonce: bytes) -> bytes:
    return struct.pack("!III", index, port, rank) + server_nonce + trainer_nonce


def _mac(key: bytes, label: bytes, binding: bytes) -> bytes:
    return hmac.new(key, b"hpcgnn " + label + b"\0" + binding, "sha256").digest()


def _session(key: bytes, index: int, port: int, rank: int, binding: bytes) -> Session:
    base = _mac(key, b"session", binding)
    return Session(index, port, rank, _mac(base, b"trainer->server", b""), _mac(base, b"server->trainer", b""))


class Accepting:
    """The listening side of one handshake as a small state machine, so that one thread can drive many at once
    (the server's accept loop: no connection in its handshake ever holds up another, or the accept).

    ``greeting()`` is sent first; ``answer(bytes)`` takes the connecting side's fixed-size answer (:data:`need`
    bytes) and returns (the proof to send back, the :class:`Session`), or raises :class:`PeerRefused`. Nothing the
    peer sends is decoded beyond fixed-size fields, and nothing is allocated by a size it names."""

    need = _ANSWER.size

    def __init__(self, key: bytes, index: int, port: int):
        self.key, self.index, self.port = key, index, port
        self.nonce = secrets.token_bytes(NONCE)

    def greeting(self) -> bytes:
        return _GREETING.pack(MAGIC, self.nonce, self.index, self.port)

    def answer(self, data: bytes) -> tuple[bytes, Session]:
        theirs, rank, proof = _ANSWER.unpack(data)
        binding = _binding(self.index, self.port, rank, self.nonce, theirs)
        if not hmac.compare_digest(proof, _mac(self.key, b"trainer->server", binding)):
            raise PeerRefused("it does not know the run's secret, or proved it to another server (a relay)")
        return _mac(self.key, b"server->trainer", binding), _session(self.key, self.index, self.port, rank, binding)


class _Deadline:
    """One deadline for a whole exchange: each read or write may take what is left of it."""

    def __init__(self, sock: socket.socket, seconds: float):
        self.sock, self.seconds, self.end = sock, seconds, time.monotonic() + seconds

    def __enter__(self) -> _Deadline:
        self.before = self.sock.gettimeout()
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(OSError):
            self.sock.settimeout(self.before)

    def read(self, n: int) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        while len(view):
            left = self.end - time.monotonic()
            if left <= 0:
                raise TimeoutError("timed out")
            self.sock.settimeout(left)
            got = self.sock.recv_into(view)
            if got == 0:
                raise ConnectionError("the peer closed the connection")
            view = view[got:]
        return bytes(buf)

    def send(self, data: bytes) -> None:
        self.sock.settimeout(max(self.end - time.monotonic(), 0.001))
        self.sock.sendall(data)


def accept(sock: socket.socket, key: bytes, index: int, port: int, timeout_s: float | None = None) -> Session:
    """The listening side's handshake on a blocking socket (:class:`Accepting` driven to its end within one
    deadline, default :data:`HANDSHAKE_S`); raises :class:`PeerRefused` unless the peer proved it knows ``key``
    and meant server ``index`` on ``port``."""
    state = Accepting(key, index, port)
    try:
        with _Deadline(sock, timeout_s or HANDSHAKE_S) as d:
            d.send(state.greeting())
            try:
                proof, session = state.answer(d.read(state.need))
            except PeerRefused:
                d.send(REFUSAL)
                raise
            d.send(proof)
            return session
    except OSError as exc:  # (ConnectionError and TimeoutError among them)
        raise PeerRefused(f"the handshake broke off ({exc})") from None


def connect(sock: socket.socket, key: bytes, name: str, index: int, port: int, rank: int,
            timeout_s: float | None = None) -> Session:
    """The connecting side's handshake with server ``index`` listening on ``port`` (``name``, e.g. "sampler
    server 0 at n2:24017"), as ``rank``, all within ``timeout_s`` (default :data:`HANDSHAKE_S`).

    Raises :class:`~hpcgnn.errors.Untrusted` when the other side is not that server of this run (it cannot
    answer the challenge: another user's or another job's process holds the port, or relays to another of the
    run's servers), and :class:`Closed` when the listener closed the connection unanswered (busy, flooded)."""
    timeout_s = timeout_s or HANDSHAKE_S
    host = sock.getpeername()[0]
    cause = (f"the process listening on port {port} of {host} is not this run's (another user's or another "
             "job's process may hold the port, or relay it to another of the run's servers; or the run's .secret "
             "changed). HINT: start the run again (a new job id moves the port); if it recurs, tell your cluster's "
             "administrators")
    answered = False
    try:
        with _Deadline(sock, timeout_s) as d:
            if d.read(len(MAGIC)) != MAGIC:  # (checked first: another service's greeting may be shorter)
                raise Untrusted(f"{name} did not greet as a sampler server: {cause}")
            _, theirs, their_index, their_port = _GREETING.unpack(MAGIC + d.read(_GREETING.size - len(MAGIC)))
            if (their_index, their_port) != (index, port):
                raise Untrusted(f"{name} greeted as sampler server {their_index} on port {their_port}: {cause}")
            mine = secrets.token_bytes(NONCE)
            binding = _binding(index, port, rank, theirs, mine)
            d.send(_ANSWER.pack(mine, rank, _mac(key, b"trainer->server", binding)))
            answered = True
            proof = d.read(DIGEST)
    except TimeoutError:
        raise Untrusted(f"{name} did not complete the run's handshake within {timeout_s:.0f} s: {cause}") from None
    except ConnectionResetError as exc:
        if answered:  # (a listener that drops a handshake whose answer it had not read yet resets it: busy)
            raise Closed(f"{name} reset the connection during the handshake ({exc})") from None
        raise Untrusted(f"{name} broke off the run's handshake ({exc}): {cause}") from None
    except OSError as exc:
        raise Untrusted(f"{name} broke off the run's handshake ({exc}): {cause}") from None
    if proof == BUSY:
        raise Closed(f"{name} dropped the handshake unanswered")
    if proof == REFUSAL:
        raise Untrusted(f"{name} failed the run's handshake: it refused this rank's proof: {cause}")
    if not hmac.compare_digest(proof, _mac(key, b"server->trainer", binding)):
        raise Untrusted(f"{name} failed the run's handshake: {cause}")
    return _session(key, index, port, rank, binding)
