"""The bytes between a trainer and a sampler server: each message in a fixed, typed format, and every frame
authenticated under the connection's own keys (:class:`hpcgnn.trust.Session`). Nothing here is unpickled.

A frame, either way::

    head     kind (u8), body bytes (u32), payload bytes (u64)           13 bytes
    tag      HMAC-SHA256(key, "head" | seq | head)                      32 bytes: checked before anything is read
                                                                                  or allocated by the sizes
    body     the message's fields as JSON (plain values; tensors' places tagged, never code)
    payload  raw bytes: an epoch's seeds, a batch's tensors (read straight into a slot)
    tag      Poly1305(HMAC-SHA256(key, "frame" | seq), head | body | payload)     16 bytes

Body and payload are the one codec a sampler state's file uses too (:mod:`hpcgnn.sampling.shipping`): a JSON
header read with its nesting bounded (``read_json``), each array after it described by a ``Ref`` (offset, dtype of
the one list, shape) and read back only through ``Ref.read``.

``key`` is the direction's key of this connection (derived from both handshake nonces, the server's index and
port and the trainer's rank), and ``seq`` counts the direction's frames from 0 and is never sent: a frame
replayed, reordered, reflected, taken from another connection or altered fails its tag. A failed tag is
:class:`Forged`: the reader drops the connection (a stream that lost a frame cannot be resynchronised).

Why Poly1305 for the frame: a batch is hundreds of MB. HMAC-SHA256 reads 1.3 GB/s here (with SHA-NI), which
cost a local server more than half its batches/s; OpenSSL's Poly1305 reads about 5 GB/s. Poly1305 is a one-time
authenticator: each frame's key is its own, HMAC-SHA256 of the direction's key and the frame's number (as
ChaCha20-Poly1305 takes each message's Poly1305 key from its stream). A payload is tagged :data:`CHUNK` bytes at
a time as it is sent or read, so that the two ends' tagging overlaps instead of adding up (a reader still acts on
nothing before the whole frame's tag checks out: a batch's bytes are only viewed once :meth:`Channel.receive`
returns).

Sampler processes that a rank spawned itself, over pipes it made, keep pickling the same messages
(:mod:`hpcgnn.sampling.procs`): no one else can write to those pipes.
"""

from __future__ import annotations

import hmac
import json
import socket
import struct
from collections.abc import Callable
from dataclasses import fields

import numpy as np
import torch
from cryptography.hazmat.primitives.poly1305 import Poly1305

import hpcgnn.sampling.messages as m
from hpcgnn.sampling.distributed import CommStats
from hpcgnn.sampling.shipping import Ref, arrays_in, arrays_out, read_json
from hpcgnn.trust import Session

_HEAD = struct.Struct("!BIQ")  # kind, body bytes, payload bytes
_SEQ = struct.Struct("!Q")
HEAD_TAG = 32  # HMAC-SHA256
TAG = 16  # Poly1305
CHUNK = 4 * 2**20  # a payload's bytes are sent, received and tagged this many at a time
MAX_BODY = 64 * 2**20  # a body larger than this is refused (an epoch's seeds travel in the payload)
MAX_PAYLOAD = 2**40  # ... a payload larger than this


class Forged(ValueError):
    """A frame whose tag does not verify (a relay, a replay, an injection) or whose fields are not the
    message's: the connection is dropped."""


def recv_into(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock`` (ConnectionError when the peer closes first)."""
    while len(view):
        n = sock.recv_into(view)
        if n == 0:
            raise ConnectionError("the peer closed the connection")
        view = view[n:]


# ---------------------------------------------------------------------- values inside a body


def _encode(v):
    """A batch's description (shipping.pack's) as JSON: containers and tensor places tagged, plain values as
    they are; anything else is refused here, on the sending side."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, Ref):
        return {"r": v.to_json()}
    if isinstance(v, list):
        return {"l": [_encode(x) for x in v]}
    if isinstance(v, tuple):
        return {"t": [_encode(x) for x in v]}
    if isinstance(v, dict):
        return {"d": [[_encode(k), _encode(x)] for k, x in v.items()]}
    raise TypeError(f"a batch holds a {type(v).__name__}, which the sampler servers' wire does not carry")


def _int(v, what: str, low: int = 0) -> int:
    if type(v) is not int or v < low:
        raise Forged(f"{what} is not an integer >= {low}: {v!r:.40}")
    return v


def _decode(v, depth: int = 0):
    if depth > 32:
        raise Forged("a batch's description nests too deep")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if not isinstance(v, dict) or len(v) != 1:
        raise Forged(f"a batch's description holds {type(v).__name__}")
    (tag, x), = v.items()
    if not isinstance(x, list):
        raise Forged(f"a batch's description holds a {tag!r} that is no list")
    if tag == "r":  # (shipping's one reader of an array's place: its dtype, dimensions and offset checked)
        try:
            return Ref.read(x, None, "a batch's tensor")
        except ValueError as exc:
            raise Forged(str(exc)) from None
    if tag == "l":
        return [_decode(e, depth + 1) for e in x]
    if tag == "t":
        return tuple(_decode(e, depth + 1) for e in x)
    if tag == "d" and all(isinstance(kv, list) and len(kv) == 2 for kv in x):
        return {_key(_decode(k, depth + 1)): _decode(e, depth + 1) for k, e in x}
    raise Forged(f"a batch's description holds an unknown {tag!r}")


def _key(k):
    if isinstance(k, (str, int, tuple)) and not isinstance(k, bool):
        return k
    raise Forged(f"a batch's description has a key of {type(k).__name__}")


def _fields(body: dict, kind: str, spec: dict) -> dict:
    """``body``'s fields, each of its declared type (``spec``: name -> type, or a function that checks)."""
    if not isinstance(body, dict) or set(body) != set(spec):
        raise Forged(f"a {kind!r} message has fields {sorted(body) if isinstance(body, dict) else body!r:.80}")
    out = {}
    for name, check in spec.items():
        v = body[name]
        if isinstance(check, type):
            if not (type(v) is check or (check is float and type(v) is int)):
                raise Forged(f"a {kind!r} message's {name} is not {check.__name__}")
        else:
            v = check(v)
        out[name] = v
    return out


def _group(v):
    if v is None:
        return None
    return _fields(v, "hello", {"group_size": int, "master_addr": str, "master_port": int,
                                "init_timeout_s": float, "timeout_s": float})


SEED_DTYPES = ("int32", "int64")  # an epoch's seeds


def _delta(v):
    if v is None:
        return None
    return CommStats(**_fields(v, "batch", {f.name: f.type if isinstance(f.type, type) else
                                            {"int": int, "float": float}[f.type] for f in fields(CommStats)}))


def _meta(v):
    meta = _decode(v)
    if not (isinstance(meta, tuple) and len(meta) == 2 and meta[0] in ("Data", "HeteroData")
            and isinstance(meta[1], dict)):
        raise Forged("a batch's description is not (kind, fields)")
    return meta


# ---------------------------------------------------------------------- the messages: (body, payload) each

_KINDS = {m.Hello: 1, m.Ready: 2, m.Epoch: 3, m.Batch: 4, m.Free: 5, m.Stop: 6, m.Failed: 7}
_BY_CODE = {code: cls for cls, code in _KINDS.items()}
# A field that is not a plain int or str: how its value is written, and how what is read is checked (and made).
_WRITE = {"meta": _encode, "delta": lambda d: None if d is None else {f.name: getattr(d, f.name) for f in fields(d)}}
_READ = {"group": _group, "meta": _meta, "delta": _delta}
_NOT_SENT = {"slot": m.Batch}  # (a sampler process's slot: on a socket, the batch's bytes follow its message)
_PLAIN = {"int": int, "str": str}


def _body_fields(cls) -> dict:
    """The fields of message class ``cls`` in a body, each with its check: declared once, by its dataclass (an
    epoch's seeds are its payload: its own)."""
    return {f.name: _READ.get(f.name) or _PLAIN[f.type] for f in fields(cls) if _NOT_SENT.get(f.name) is not cls}


_BODIES = {cls: _body_fields(cls) for cls in _KINDS if cls is not m.Epoch}


def encoded(msg, payload: memoryview | None = None) -> tuple[int, bytes, memoryview | None]:
    """What :meth:`Channel.send_encoded` sends: the message's kind, its body, and ``payload`` (a batch's bytes) or
    its own (an epoch's seeds). Raises TypeError for what the wire does not carry."""
    body, own = encode(msg)
    return _KINDS[type(msg)], body, own if payload is None else payload


def encode(msg) -> tuple[bytes, memoryview | None]:
    """A message's body and payload (an epoch's seeds; a batch's bytes are the caller's)."""
    payload = None
    if isinstance(msg, m.Epoch):  # (its seeds: one array after the body, described as a sampler state's are)
        dtype = np.dtype(msg.jobs[0][1].dtype if msg.jobs else np.int64)
        seeds = [np.ascontiguousarray(s, dtype=dtype) for _, s in msg.jobs]
        places, chunks = arrays_out({"seeds": torch.from_numpy(np.concatenate(seeds) if seeds else np.empty(0, dtype))})
        body = {"batch_seed": msg.batch_seed, "seeds": places,
                "jobs": [[i, int(s.size)] for (i, _), s in zip(msg.jobs, seeds, strict=True)]}
        payload = chunks[0]
    elif type(msg) in _BODIES:
        body = {name: _WRITE.get(name, lambda v: v)(getattr(msg, name)) for name in _BODIES[type(msg)]}
    else:
        raise TypeError(f"{type(msg).__name__} does not travel to or from a sampler server")
    return json.dumps(body, separators=(",", ":")).encode(), payload


def decode(code: int, body: bytes, payload: memoryview | None):
    """The message of kind ``code`` from its body and payload; :class:`Forged` when they are not its fields."""
    cls = _BY_CODE.get(code)
    if cls is None:
        raise Forged(f"an unknown message kind {code}")
    try:
        b = read_json(body, f"a {cls.kind!r} message's body")
        if cls is not m.Epoch:
            return cls(**_fields(b, cls.kind, _BODIES[cls]))
        f = _fields(b, "epoch", {"batch_seed": int, "seeds": dict, "jobs": list})
        seeds = arrays_in(f["seeds"], payload if payload is not None else memoryview(b""), "an epoch's",
                          SEED_DTYPES).get("seeds")
    except (ValueError, UnicodeDecodeError) as exc:  # (read_json's and Ref.read's refusals: Forged is one too)
        raise Forged(str(exc)) from None
    counts = [(_int(j[0], "a batch index"), _int(j[1], "a seed count")) if isinstance(j, list) and len(j) == 2
              else (_int(None, "a job"), 0) for j in f["jobs"]]
    if seeds is None or seeds.dim() != 1 or sum(n for _, n in counts) != seeds.numel():
        raise Forged("an epoch's seed counts do not add up to its seeds")
    seeds = seeds.numpy()
    ends = np.cumsum([0] + [n for _, n in counts])
    return m.Epoch(f["batch_seed"], [(i, seeds[ends[k]:ends[k + 1]]) for k, (i, _) in enumerate(counts)])


# ---------------------------------------------------------------------- one end of an authenticated connection


def _frame_mac(key: bytes, seq: bytes) -> Poly1305:
    """The frame's own one-time authenticator: Poly1305 under HMAC-SHA256(key, "frame" | seq)."""
    return Poly1305(hmac.new(key, b"frame" + seq, "sha256").digest())


class Channel:
    """One end of an authenticated connection: :meth:`send` and :meth:`receive` whole messages, each frame tagged
    under this direction's key and counter (``server``: which end this is)."""

    def __init__(self, sock: socket.socket, session: Session, server: bool):
        self.sock, self.session = sock, session
        self.send_key = session.to_trainer if server else session.to_server
        self.recv_key = session.to_server if server else session.to_trainer
        self.sent = self.received = 0

    def send(self, msg, payload: memoryview | None = None) -> None:
        """``msg``, with ``payload`` (a batch's bytes) after its own (an epoch's seeds)."""
        self.send_encoded(*encoded(msg, payload))

    def send_encoded(self, kind: int, body: bytes, payload: memoryview | None) -> None:
        """A message :func:`encoded` already (where it is made, so that what it cannot carry is refused there)."""
        nbytes = 0 if payload is None else payload.nbytes
        head = _HEAD.pack(kind, len(body), nbytes)
        seq = _SEQ.pack(self.sent)
        self.sent += 1
        mac = _frame_mac(self.send_key, seq)
        mac.update(head + body)
        self.sock.sendall(head + hmac.new(self.send_key, b"head" + seq + head, "sha256").digest() + body)
        for k in range(0, nbytes, CHUNK):  # tagged a piece at a time as it goes: the reader tags the last piece
            piece = payload[k:k + CHUNK]  # while this end tags the next (both ends' work overlaps)
            mac.update(piece)
            self.sock.sendall(piece)
        self.sock.sendall(mac.finalize())

    def receive(self, slot: Callable[[int], torch.Tensor] | None = None):
        """The next message. A batch's payload is read into ``slot(nbytes)`` (a uint8 tensor it returns), an
        epoch's into memory of its own. Raises :class:`Forged` (drop the connection), ConnectionError, OSError."""
        seq = _SEQ.pack(self.received)
        self.received += 1
        head = self._read(_HEAD.size + HEAD_TAG)
        head, tag = head[:_HEAD.size], head[_HEAD.size:]
        if not hmac.compare_digest(tag, hmac.new(self.recv_key, b"head" + seq + head, "sha256").digest()):
            raise Forged("a frame's head failed its tag")
        code, n_body, n_payload = _HEAD.unpack(head)
        if n_body > MAX_BODY or n_payload > MAX_PAYLOAD:
            raise Forged(f"a frame of {n_body} + {n_payload} bytes")
        body = self._read(n_body)
        mac = _frame_mac(self.recv_key, seq)
        mac.update(head + body)
        payload = None
        if n_payload:
            if code == _KINDS[m.Batch] and slot is not None:
                buf = slot(n_payload)
                payload = memoryview(buf.numpy())[:n_payload]
            else:
                payload = memoryview(bytearray(n_payload))
            for k in range(0, n_payload, CHUNK):
                piece = payload[k:k + CHUNK]
                recv_into(self.sock, piece)
                mac.update(piece)
        if not hmac.compare_digest(self._read(TAG), mac.finalize()):
            raise Forged("a frame failed its tag")
        return decode(code, body, payload)

    def _read(self, n: int) -> bytes:
        buf = bytearray(n)
        recv_into(self.sock, memoryview(buf))
        return bytes(buf)
