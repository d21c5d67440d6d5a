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
- every connection begins with a challenge-response in both directions (:func:`accept` on the
  listening side, :func:`connect` on the other): the listener sends a magic string and a fresh random
  nonce; the connecting side answers with its own nonce and HMAC-SHA256(secret, "trainer" | both
  nonces); the listener checks it (in constant time) and proves itself with HMAC-SHA256(secret,
  "server" | both nonces). Fixed-size fields only: nothing is unpickled, decoded or allocated by size
  before both proofs are checked. A replayed answer fails (the nonces are new each time), and so does
  a reflected one (the two roles hash different labels).

What this does not do: the bytes after the handshake are neither encrypted nor signed (a peer able to
inject into an established TCP stream on a cluster's network already has root on a node); torch's
rendezvous store and gloo's connections are PyTorch's and are not authenticated (docs/security.md says
what hpcgnn does about them).
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import socket
import stat
import time
from pathlib import Path

from hpcgnn.errors import ConfigError, Untrusted

SECRET_FILE = ".secret"  # in the run folder, mode 0600
ANNOUNCED = "servers"  # in the run folder: where sampler servers of a separate job write host:port (servers/<k>)


def announced(run_dir: str | Path) -> Path:
    """Where servers of a separate job write ``host:port`` (``servers/<k>``), for the trainers to read (and then
    prove themselves to, as anyone can write a port there that the run's secret does not answer)."""
    return Path(run_dir) / ANNOUNCED
MAGIC = b"hpcgnn-auth/1\n"
NONCE = 32  # bytes, each side's
DIGEST = 32  # bytes of HMAC-SHA256
HANDSHAKE_S = 20.0  # how long either side waits for the other's part of the handshake


class PeerRefused(Exception):
    """A peer that did not prove it knows the run's secret (the listener drops it and serves on)."""


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
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise ConfigError(f"cannot read the run's secret {path} ({exc.strerror}). HINT: it must be a plain file of "
                          "yours, mode 0600; remove it to have a new one made") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise ConfigError(f"the run's secret {path} is not a plain file of yours (owner uid {st.st_uid}). HINT: "
                              "another user may have planted it: use a run folder only you can write")
        if st.st_mode & 0o077:
            raise ConfigError(f"the run's secret {path} can be read or written by others (mode "
                              f"{stat.S_IMODE(st.st_mode):04o}). HINT: remove it and use a run folder only you can "
                              "write (a new secret is made, mode 0600)")
        return f.read(128).decode(errors="replace").strip()


def _proof(key: bytes, role: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(key, role + first + second, "sha256").digest()


def recv_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock`` (ConnectionError when the peer closes first)."""
    while len(view):
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("the peer closed the connection")
        view = view[n:]


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_into(sock, memoryview(buf))
    return bytes(buf)


def accept(sock: socket.socket, key: bytes, timeout_s: float | None = None) -> None:
    """The listening side's handshake on a new connection; raises :class:`PeerRefused` unless the peer proved it
    knows ``key`` (and then has proven this side does too), within ``timeout_s`` (default :data:`HANDSHAKE_S`).
    The socket's timeout is left as it was."""
    before = sock.gettimeout()
    sock.settimeout(timeout_s or HANDSHAKE_S)
    try:
        mine = secrets.token_bytes(NONCE)
        sock.sendall(MAGIC + mine)
        answer = _read_exactly(sock, NONCE + DIGEST)
        theirs, proof = answer[:NONCE], answer[NONCE:]
        if not hmac.compare_digest(proof, _proof(key, b"trainer", mine, theirs)):
            raise PeerRefused("it does not know the run's secret")
        sock.sendall(_proof(key, b"server", theirs, mine))
    except OSError as exc:  # (ConnectionError and TimeoutError among them)
        raise PeerRefused(f"the handshake broke off ({exc})") from None
    finally:
        with contextlib.suppress(OSError):
            sock.settimeout(before)


def connect(sock: socket.socket, key: bytes, name: str, timeout_s: float | None = None) -> None:
    """The connecting side's handshake with ``name`` (e.g. "sampler server 0 at n2:24017"); raises
    :class:`~hpcgnn.errors.Untrusted` when the other side is not the run's own process (it cannot answer the
    challenge: another user's, or another run's, holds the port), within ``timeout_s`` (default
    :data:`HANDSHAKE_S`)."""
    timeout_s = timeout_s or HANDSHAKE_S
    before = sock.gettimeout()
    sock.settimeout(timeout_s)
    host, port = sock.getpeername()[:2]
    cause = (f"the process listening on port {port} of {host} is not this run's (another user's or another "
             "job's process may hold the port, or the run's .secret changed). HINT: start the run again (a new job "
             "id moves the port); if it recurs, tell your cluster's administrators")
    try:
        greeting = _read_exactly(sock, len(MAGIC) + NONCE)
        if greeting[: len(MAGIC)] != MAGIC:
            raise Untrusted(f"{name} did not greet as a sampler server: {cause}")
        theirs, mine = greeting[len(MAGIC):], secrets.token_bytes(NONCE)
        sock.sendall(mine + _proof(key, b"trainer", theirs, mine))
        proof = _read_exactly(sock, DIGEST)
    except TimeoutError:
        raise Untrusted(f"{name} did not complete the run's handshake within {timeout_s:.0f} s: {cause}") from None
    except OSError as exc:
        raise Untrusted(f"{name} broke off the run's handshake ({exc}): {cause}") from None
    if not hmac.compare_digest(proof, _proof(key, b"server", mine, theirs)):
        raise Untrusted(f"{name} failed the run's handshake: {cause}")
    sock.settimeout(before)
