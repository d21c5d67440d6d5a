"""Handing a rank's sampler to another process without copying the graph, and batches back without pickling.

**Out** (once, when a rank's own sampler processes start, over pipes it made): the sampler, the features and the batch transform are pickled
with cloudpickle (closures travel by value), except every tensor that lies in a memory-mapped file (the
prepared graph, a partition's arrays): it travels as *where it lies* (file, byte offset, dtype, shape,
strides) and the other process maps the same file range. A node's processes so read one copy of the graph
in the page cache, whatever their number. Other tensors (a degree vector, a cache's rows) travel by value.

**Back** (every batch): a batch's tensors are written into a shared-memory slot the rank handed over once
(:func:`pack`); only a small description (offsets, dtypes, shapes, and the batch's plain values) crosses a
pipe, and the rank views the tensors in place (:func:`unpack`).

**To sampler servers** nothing of this is pickled: a rank writes what its servers cannot know from the run's config
and the graph they open (:class:`SamplerState`: typed fields and raw arrays) into the run folder, and each server
builds the rank's sampler itself (:class:`hpcgnn.stores.recipes.ServerRecipes`).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import io
import json
import logging
import math
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import cloudpickle
import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data, HeteroData

from hpcgnn import paths, trust
from hpcgnn.errors import ConfigError

log = logging.getLogger(__name__)

ALIGN = 64  # bytes: every tensor in a slot starts on a cache line (and any dtype's alignment)
LARGE = 16 * 2**20  # a tensor this large copied into the recipe is logged (it is in every sampler process)


def _file_mappings() -> list[tuple[int, int, int, str]]:
    """This process's mappings of regular files: (start, end, file offset, path), from /proc/self/maps."""
    out = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) < 6:
                    continue
                path = fields[5].strip()
                if not path.startswith("/") or path.startswith(("/dev/", "/proc/")) or path.endswith("(deleted)"):
                    continue
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                out.append((lo, hi, int(fields[2], 16), path))
    except OSError:  # not Linux: everything travels by value
        pass
    return out


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _Pickler(cloudpickle.Pickler):
    def __init__(self, file):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.maps = _file_mappings()
        self.copied = 0  # bytes of large tensors pickled by value

    def persistent_id(self, obj):
        if not isinstance(obj, Tensor) or obj.device.type != "cpu" or obj.layout != torch.strided:
            return None
        storage = obj.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        if nbytes == 0:
            return None
        for lo, hi, offset, path in self.maps:
            if lo <= ptr and ptr + nbytes <= hi:
                return ("mapped", path, offset + ptr - lo, nbytes, _dtype_name(obj.dtype), tuple(obj.shape),
                        tuple(obj.stride()), obj.storage_offset())
        if nbytes >= LARGE:
            self.copied += nbytes
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file):
        super().__init__(file)
        self.maps: dict[tuple[str, int, int], Tensor] = {}

    def persistent_load(self, pid):
        kind, path, offset, nbytes, dtype, shape, stride, storage_offset = pid
        if kind != "mapped":
            raise pickle.UnpicklingError(f"unknown persistent id {kind!r}")
        key = (path, offset, nbytes)
        if key not in self.maps:  # copy-on-write, like the rank's own mapping: nothing is ever written
            array = np.memmap(path, dtype=np.uint8, mode="c", offset=offset, shape=(nbytes,))
            self.maps[key] = torch.from_numpy(array)
        base = self.maps[key].view(getattr(torch, dtype))
        return base.as_strided(shape, stride, storage_offset)


@dataclass(frozen=True)
class Recipe:
    """What a sampler process or a sampler server needs to make a rank's training batches: sent once to a rank's own
    sampler processes, pickled by :func:`dumps` (the graph's memory-mapped tensors by reference); built by a
    sampler server from the rank's :class:`SamplerState`."""

    features: object  # where a batch's feature rows come from (a tensor, a typed graph's, a partitioned rank's)
    sampler: object  # the rank's training sampler (hpcgnn.sampling's protocol: sample(seeds, generator))
    transform: Callable | None = None  # the model's per-batch transform (GCNNorm), or None
    stats: object = None  # a partitioned graph's exchange counters (CommStats), the producer's counts added there


@dataclass(frozen=True)
class Deferred:
    """A recipe its sampler process builds itself (a sampler server's, for a partitioned graph's trainer): the
    builder (``build(state) -> Recipe``, picklable: the run's config) and the rank's :class:`SamplerState` (as the
    server read it: its own process, over its own pipe). The process builds the rank's sampler as the server would,
    through the same builder: no recipe is pickled."""

    build: Callable
    state: SamplerState

    def __call__(self) -> Recipe:
        return self.build(self.state)


def dumps(obj) -> bytes:
    """``obj`` pickled, its memory-mapped tensors as references to their files."""
    buf = io.BytesIO()
    pickler = _Pickler(buf)
    pickler.dump(obj)
    if pickler.copied:
        log.info("sampler recipe: %.1f MB of tensors copied into every sampler process (not memory-mapped)",
                 pickler.copied / 2**20)
    return buf.getvalue()


def loads(data: bytes):
    """The object :func:`dumps` pickled, its mapped tensors mapped again here."""
    return _Unpickler(io.BytesIO(data)).load()


RECIPES = "recipes"  # in the run folder: what each trainer's servers rebuild its sampler from (rank-<r>.state, 0600)
STATE_MAGIC = b"hpcgnn sampler state 2\n"
# The one list of dtypes a raw array may have where bytes are read back by what a description says (a sampler state's
# arrays, a batch's tensors on the wire): nothing else is ever viewed.
DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64")
STATE_DTYPES = {name: getattr(torch, name) for name in DTYPES}
MAX_HEADER = 1 << 20  # bytes of a state's JSON header: its settings and its arrays' places, never more
MAX_DEPTH = 16  # how deep a state's header nests (its values: flags, numbers, short lists); an array's dimensions
MAX_DIM = 1 << 48  # one dimension of an array, at most


@dataclass(frozen=True)
class Ref:
    """A raw array's place among a payload's bytes: the one description of an array that travels as raw bytes (a
    sampler state's arrays in its file, a batch's tensors in a slot and on the wire), written as JSON
    ``[offset, dtype, shape]`` (:meth:`to_json`) and read back only through :meth:`read`, which checks it."""

    offset: int
    dtype: str  # one of DTYPES
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Its bytes (Python's integers: a product past 2**63 does not wrap)."""
        return math.prod(self.shape) * STATE_DTYPES[self.dtype].itemsize

    def to_json(self) -> list:
        return [self.offset, self.dtype, list(self.shape)]

    @classmethod
    def read(cls, x, size: int | None, what: str) -> Ref:
        """The place JSON ``x`` describes; ValueError naming ``what`` where it is not one: a dtype of
        :data:`DTYPES`, at most :data:`MAX_DEPTH` dimensions each below 2**48, an offset >= 0 and (``size``: the
        payload's bytes, where known) its bytes inside the payload."""
        ok = (isinstance(x, list) and len(x) == 3 and type(x[0]) is int and x[0] >= 0 and isinstance(x[1], str)
              and x[1] in STATE_DTYPES and isinstance(x[2], list) and len(x[2]) <= MAX_DEPTH
              and all(type(d) is int and 0 <= d < MAX_DIM for d in x[2]))
        ref = cls(x[0], x[1], tuple(x[2])) if ok else None
        if ref is None or (size is not None and ref.offset + ref.nbytes > size):
            raise cls.refused(what)
        return ref

    @staticmethod
    def refused(what: str) -> ValueError:
        return ValueError(f"{what} is not described by a dtype of {sorted(STATE_DTYPES)}, a shape of dimensions "
                          "below 2**48, and a place inside its payload")

    def take(self, payload: memoryview) -> Tensor:
        """The array, copied out of ``payload`` (a file's bytes: its own memory, aligned)."""
        dtype = STATE_DTYPES[self.dtype]
        if self.nbytes == 0:
            return torch.empty(self.shape, dtype=dtype)
        raw = bytearray(payload[self.offset: self.offset + self.nbytes])
        return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(self.shape)

    def view(self, slot: Tensor) -> Tensor:
        """The array where it lies in ``slot`` (uint8; aligned places: :class:`SlotWriter`'s), valid until the slot is
        written again."""
        if self.offset + self.nbytes > slot.numel():
            raise ValueError(f"a batch's tensor of {self.nbytes} bytes at {self.offset} lies past its slot's "
                             f"{slot.numel()}")
        return _view(slot, self.offset, STATE_DTYPES[self.dtype], self.shape)


@dataclass(frozen=True)
class SamplerState:
    """What a rank's sampler servers need, besides the run's config and the graph they open, to build the rank's
    training sampler as the rank built it (:class:`hpcgnn.stores.recipes.ServerRecipes`): where the rank stands (``rank``
    of ``world_size``), the kind of graph (``kind``), the settings it decided (``values``: numbers, strings, flags)
    and the arrays it computed at run time (``arrays``: a hot-node cache's ids and rows, saint_rw's inclusion,
    Cluster-GCN's clusters). Written as typed fields and raw bytes (:meth:`encode`): nothing in it is code, and
    nothing is unpickled where it is read."""

    kind: str
    rank: int
    world_size: int
    values: dict = field(default_factory=dict)
    arrays: dict = field(default_factory=dict)  # name -> Tensor

    def encode(self) -> bytes:
        """The magic line, the header's length (8 bytes, little-endian), the header (JSON: the fields, and each
        array's place, a :class:`Ref`), then the arrays' bytes."""
        places, chunks = arrays_out(self.arrays)
        header = json.dumps({"kind": self.kind, "rank": self.rank, "world_size": self.world_size,
                             "values": self.values, "arrays": places}, allow_nan=False).encode()
        return b"".join([STATE_MAGIC, len(header).to_bytes(8, "little"), header, *chunks])

    @classmethod
    def decode(cls, data: bytes) -> SamplerState:
        """The state :meth:`encode` wrote; ValueError with a sentence, and nothing else, where the bytes are not one:
        the header's size, its JSON's nesting, each field's type, each dtype from a fixed list, each dimension and
        each array's size (in Python's integers: nothing wraps) inside the payload, all checked before use."""
        if not isinstance(data, (bytes, bytearray, memoryview)) or not bytes(data[:len(STATE_MAGIC)]) == STATE_MAGIC:
            raise ValueError("not a sampler state (its first line differs)")
        at = len(STATE_MAGIC)
        size = int.from_bytes(data[at: at + 8], "little")
        if len(data) < at + 8 or size > MAX_HEADER or at + 8 + size > len(data):
            raise ValueError(f"a sampler state's header of {size} bytes does not fit its {len(data)} bytes")
        head = read_json(bytes(data[at + 8: at + 8 + size]), "a sampler state's header")
        payload = memoryview(data)[at + 8 + size:]
        if not (isinstance(head, dict) and isinstance(head.get("kind"), str) and type(head.get("rank")) is int
                and type(head.get("world_size")) is int and isinstance(head.get("values"), dict)
                and isinstance(head.get("arrays"), dict)):
            raise ValueError("a sampler state's header lacks its kind, rank, world size, values or arrays")
        return cls(head["kind"], head["rank"], head["world_size"], head["values"],
                   arrays_in(head["arrays"], payload, "a sampler state's array"))


# ---------------------------------------------------------------- one codec: a JSON header, raw arrays after it
# A sampler state's file and a message on the sampler servers' wire (an epoch's seeds, a batch's tensors) alike:
# the header read by read_json (its nesting bounded), each array described by a Ref and read back by Ref.read.


def arrays_out(arrays: dict) -> tuple[dict[str, list], list[memoryview]]:
    """Named tensors as (each one's place, a :class:`Ref` in JSON; the payload's chunks, in order: each tensor's
    bytes where they lie, not copied)."""
    places, chunks, offset = {}, [], 0
    for name, t in arrays.items():
        t = t.detach().cpu().contiguous()
        raw = memoryview(t.reshape(-1).view(torch.uint8).numpy()) if t.numel() else memoryview(b"")
        places[name] = Ref(offset, _dtype_name(t.dtype), tuple(t.shape)).to_json()
        chunks.append(raw)
        offset += raw.nbytes
    return places, chunks


def arrays_in(places, payload: memoryview, what: str, dtypes: tuple[str, ...] = DTYPES) -> dict:
    """The named tensors :func:`arrays_out` described, copied out of ``payload``; ValueError naming ``what`` where
    ``places`` is not a mapping of places inside it, each of one of ``dtypes``."""
    if not isinstance(places, dict):
        raise ValueError(f"{what}s are not named")
    out = {}
    for name, p in places.items():
        said = f"{what} {str(name)[:40]!r}"
        ref = Ref.read(p, len(payload), said)
        if ref.dtype not in dtypes:
            raise ValueError(f"{said} is of dtype {ref.dtype}, not {' or '.join(dtypes)}")
        try:
            out[name] = ref.take(payload)
        except (RuntimeError, OverflowError):  # (an empty shape whose strides torch cannot hold: [2**47] * 3 + [0])
            raise Ref.refused(said) from None
    return out


def read_json(raw: bytes, what: str):
    """``raw`` as JSON, refused (ValueError) where it is not, or nests deeper than :data:`MAX_DEPTH` (checked on the
    text first: Python's parser would recurse until RecursionError)."""
    depth = deepest = 0
    quoted = escaped = False
    for c in raw:
        if quoted:
            if escaped:
                escaped = False
            elif c == 0x5C:
                escaped = True
            elif c == 0x22:
                quoted = False
        elif c == 0x22:
            quoted = True
        elif c in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
        elif c in (0x5D, 0x7D):
            depth -= 1
    if deepest > MAX_DEPTH:
        raise ValueError(f"{what} nests {deepest} levels deep (at most {MAX_DEPTH})")
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{what} is not JSON ({str(exc)[:80]})") from None


def state_path(run_dir: str | Path, rank: int) -> Path:
    return Path(run_dir) / RECIPES / f"rank-{int(rank)}.state"


def publish(run_dir: str | Path, rank: int, state: SamplerState) -> str:
    """A trainer's sampler state for its sampler servers, put where they read it: the run folder, which the run's
    nodes share and only its owner can write (:func:`hpcgnn.paths.make_dirs`). Returns its SHA-256, which the
    trainer sends in its authenticated hello: a server reads only this file, and only when it is the one the
    trainer meant."""
    folder = state_path(run_dir, rank).parent
    paths.make_dirs(folder, mode=0o700)
    data = state.encode()
    trust.write_own_file(state_path(run_dir, rank), data)
    return hashlib.sha256(data).hexdigest()


def fetch(run_dir: str | Path, rank: int, sha256: str) -> SamplerState:
    """Rank ``rank``'s sampler state as it published it (:func:`publish`); refused when the file is not the user's
    own, is not the one whose hash the trainer sent, or is another rank's."""
    path = state_path(run_dir, rank)
    trust.run_folder(run_dir)  # (its recipes/ among its folders)
    data = paths.read_own(path, "the sampler state")
    if not hmac.compare_digest(hashlib.sha256(data).hexdigest(), sha256):
        raise ConfigError(f"the sampler state {path} is not the one rank {rank} published (its SHA-256 differs). "
                          "HINT: two runs share this run folder, or it was changed: start the run again")
    state = SamplerState.decode(data)
    if state.rank != rank:
        raise ConfigError(f"the sampler state {path} is rank {state.rank}'s, not rank {rank}'s. HINT: start the run "
                          "again")
    return state


# ---------------------------------------------------------------------- batches through a shared slot


def _walk(obj, fn):
    """``obj`` with every tensor (in dicts, lists, tuples) replaced by ``fn(tensor)``."""
    if isinstance(obj, (Tensor, Ref)):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _walk(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v, fn) for v in obj]
    if type(obj) is tuple:
        return tuple(_walk(v, fn) for v in obj)
    return obj


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _view(slot: Tensor, offset: int, dtype: torch.dtype, shape) -> Tensor:
    nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
    return slot[offset: offset + nbytes].view(dtype).view(shape)


class SlotWriter:
    """Hands out a slot's bytes front to back (``alloc``), so that a batch's largest tensors are written there
    as they are made; past the end, ordinary memory (the batch is then copied into a larger slot)."""

    def __init__(self, slot: Tensor):
        self.slot, self.used = slot, 0

    def alloc(self, shape, dtype: torch.dtype) -> Tensor:
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
        if self.used + nbytes > self.slot.numel():
            return torch.empty(shape, dtype=dtype)
        out = _view(self.slot, self.used, dtype, shape)
        self.used += _aligned(nbytes)
        return out

    def offset_of(self, t: Tensor) -> int | None:
        """Where ``t`` lies in the slot, if :meth:`alloc` handed it out."""
        start = t.data_ptr() - self.slot.data_ptr()
        inside = t.numel() > 0 and 0 <= start < self.used and t.is_contiguous() and \
            t.untyped_storage().data_ptr() == self.slot.data_ptr()
        return start if inside else None


def pack(data: Data | HeteroData, writer: SlotWriter) -> tuple[tuple | None, int]:
    """Put ``data``'s tensors in ``writer``'s slot (those it handed out stay where they are): (the batch's
    description, bytes used), or (None, bytes needed) when they do not fit."""
    d = data.to_dict()
    tensors: list[Tensor] = []
    _walk(d, tensors.append)
    placed = {id(t) for t in tensors if writer.offset_of(t) is not None}
    needed = writer.used + sum(_aligned(t.numel() * t.element_size()) for t in tensors if id(t) not in placed)
    if needed > writer.slot.numel():
        return None, needed

    def place(t: Tensor) -> Ref:
        if id(t) in placed:
            offset = writer.offset_of(t)
        else:
            offset = writer.used
            writer.alloc(tuple(t.shape), t.dtype).copy_(t)  # fits: counted in ``needed``
        return Ref(offset, _dtype_name(t.dtype), tuple(t.shape))

    return (type(data).__name__, _walk(d, place)), needed


@dataclass(frozen=True)
class Packed:
    """A batch as :func:`pack` left it in ``slot``: its description and its bytes, to pass on as they lie (a
    server relaying its sampler process's batches), not to be unpacked and packed again."""

    meta: tuple
    slot: Tensor

    @functools.cached_property
    def nbytes(self) -> int:
        """Where its last tensor ends in the slot."""
        ends = [0]
        _walk(self.meta[1], lambda ref: ends.append(ref.offset + ref.nbytes))
        return max(ends)

    def view(self) -> memoryview:
        return memoryview(self.slot.numpy())[: self.nbytes]


def unpack(meta: tuple, slot: Tensor) -> Data | HeteroData:
    """The batch :func:`pack` wrote, its tensors viewed in ``slot`` (valid until the slot is written again)."""
    kind, d = meta
    cls = {"Data": Data, "HeteroData": HeteroData}[kind]
    return cls.from_dict(_walk(d, lambda ref: ref.view(slot)))
