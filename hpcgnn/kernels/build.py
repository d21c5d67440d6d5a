"""Finding, building and checking the C sampling kernels' library (the ``*.c`` files beside this one, and
``kernels.h``) before anything calls it.

Where the library comes from, in order:

1. **the package**: ``pip install`` builds the sources into ``hpcgnn/kernels/_kernels*.so`` (``setup.py``:
   a plain C extension, no torch headers), so a compute node needs no compiler;
2. **the cache**: where the package has none (a build without a compiler, a source changed since), the C
   compiler builds it on first use into ``$HPCGNN_NATIVE_CACHE`` (default ``$XDG_CACHE_HOME/hpcgnn/native``),
   keyed by the source, the compiler, its flags and what it targets (its predefined macros: a wrapper such as
   Cray's ``cc`` adds ``-march`` from the loaded module), so every rank of a node, and every later run,
   loads the same library; a node without a compiler loads one built there from this source for a CPU it has;
3. else none: sampling runs on torch ops (the same batches, slower), with one warning saying why and how to mend it.

A library is used only once it proves it is the one this source makes (:func:`load`): a whole ELF file (a
truncated one would kill the process with SIGBUS when a missing page is touched), every symbol of
:data:`SIGNATURES`, the source hash it was built from (``hpcgnn_source_hash``), and a tiny self-test against
the torch ops (a row gather, a hop). One that fails is never called: it is rebuilt (the cache's) or skipped,
with one warning naming the file. A cache folder others may write is refused (they could plant a library
there). A library is published into the cache by a hard link of a whole file, never by replacing one: another
process, on this node or another one sharing the folder, may have the existing file mapped.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import importlib.machinery
import json
import logging
import os
import platform
import shlex
import shutil
import stat
import struct
import subprocess
import tempfile
from pathlib import Path

import torch

import hpcgnn.kernels.sources as sources
from hpcgnn import env, paths

log = logging.getLogger(__name__)
PACKAGED = "_kernels"  # the module name setup.py builds the library under, beside this file
FLAGS = ("-O3", "-std=gnu11", "-shared", "-fPIC", "-pthread")  # portable: no -march=native (a cache on a shared home)

_CTYPES = {"int64": ctypes.c_int64, "int": ctypes.c_int, "ptr": ctypes.c_void_p, "void": None, "str": ctypes.c_char_p}
# name: (result, arguments), read from the sources' own definitions (declared once, there: sources.signatures)
SIGNATURES = {name: (_CTYPES[result], tuple(_CTYPES[a] for a in args))
              for name, (result, args) in sources.signatures().items()}
# What a compiler's predefined macros say it targets beyond x86-64's baseline, as /proc/cpuinfo names the feature: a
# library built for a feature this CPU lacks dies of SIGILL, so it is not loaded here.
ISA_MACROS = {"__SSE3__": "pni", "__SSSE3__": "ssse3", "__SSE4_1__": "sse4_1", "__SSE4_2__": "sse4_2",
              "__POPCNT__": "popcnt", "__AVX__": "avx", "__AVX2__": "avx2", "__FMA__": "fma", "__F16C__": "f16c",
              "__BMI__": "bmi1", "__BMI2__": "bmi2", "__LZCNT__": "abm", "__MOVBE__": "movbe",
              "__AVX512F__": "avx512f", "__AVX512BW__": "avx512bw", "__AVX512DQ__": "avx512dq",
              "__AVX512VL__": "avx512vl", "__AVX512CD__": "avx512cd", "__AVX512BF16__": "avx512_bf16",
              "__AMX_TILE__": "amx_tile", "__ARM_FEATURE_SVE": "sve"}


class NativeUnavailable(RuntimeError):
    """The C kernels could not be built here (the reason says why; ``cache``: the cache folder is the cause, and
    moving it the fix)."""

    def __init__(self, message: str, cache: bool = False):
        super().__init__(message)
        self.cache = cache


class Rejected(RuntimeError):
    """A library that is not the one this source makes (the reason says how it differs)."""


@functools.lru_cache(maxsize=1)
def source_hash() -> str:
    """What ``hpcgnn_source_hash()`` returns in a library built from these sources (:mod:`.sources`)."""
    return sources.source_hash()


# ---------------------------------------------------------------------- checking a library


def check_file(path: Path) -> None:
    """Refuse a file that is not a whole shared object (the ELF header, and every segment the loader maps and every
    section header inside the file: a truncated library maps pages past its end, SIGBUS when they are touched), or
    that is not the one its builder recorded (its SHA-256, beside it), or that users other than its owner (you, or
    root) may replace. All before it is loaded: loading a library runs its constructors."""
    try:
        with open(path, "rb") as f:
            data = f.read()
            st = os.fstat(f.fileno())
        folder = os.stat(path.parent)
    except OSError as exc:
        raise Rejected(f"unreadable ({exc.strerror})") from None
    for what, s in (("it", st), ("its folder", folder)):
        why = paths.fault(s)
        if why is not None:  # (another user's; or group or others may write it)
            raise Rejected(f"{what} {why}")
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2:  # (64-bit ELF only)
        raise Rejected(f"not a 64-bit ELF shared object ({len(data)} bytes)")
    order = "<" if data[5] == 1 else ">"
    phoff, shoff = struct.unpack_from(order + "QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from(order + "HHHH", data, 0x36)
    if phoff + phnum * phentsize > len(data) or shoff + shnum * shentsize > len(data):
        raise Rejected(f"truncated: its headers reach past its {len(data)} bytes")
    for k in range(phnum):
        kind, _, offset, _, _, filesz = struct.unpack_from(order + "IIQQQQ", data, phoff + k * phentsize)
        if kind == 1 and offset + filesz > len(data):  # PT_LOAD
            raise Rejected(f"truncated: a segment ends at byte {offset + filesz} of {len(data)}")
    try:
        recorded = sources.recorded_path(path).read_text().strip()
    except OSError:
        raise Rejected(f"no SHA-256 recorded beside it ({sources.recorded_path(path).name}: it was not built by "
                       "hpcgnn's builder)") from None
    if hashlib.sha256(data).hexdigest() != recorded:
        raise Rejected("its SHA-256 is not the one recorded when it was built (replaced or changed since)")


def load(path: Path) -> ctypes.CDLL:
    """The library at ``path``, once it has proven it is this source's (:class:`Rejected` otherwise)."""
    check_file(path)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise Rejected(f"the loader refused it ({exc})") from None
    try:
        missing = [name for name in SIGNATURES if not hasattr(lib, name)]
        if missing:
            raise Rejected(f"it lacks {', '.join(missing)} (built from another source)")
        for name, (res, args) in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        built_from, want = (lib.hpcgnn_source_hash() or b"").decode(errors="replace"), source_hash()
        if built_from != want:
            raise Rejected(f"built from source {built_from}, not this one ({want})")
        self_test(lib)
    except Rejected:
        # Unloaded, so that a library built again at this path is loaded, not this one (the loader knows a
        # library by its path).
        import _ctypes

        _ctypes.dlclose(lib._handle)
        raise
    return lib


def self_test(lib: ctypes.CDLL) -> None:
    """A row gather (plain and widened from bfloat16), a hop that draws nothing and one that draws, against the
    torch ops (the drawing hop from the same counter stream as the torch twin's)."""
    src = torch.arange(40, dtype=torch.float32).view(10, 4).add_(0.5)
    index = torch.tensor([3, 1, 7, 7, 0, 9])
    out, scratch = torch.full((6, 4), -1.0), torch.empty(1, dtype=torch.long)
    bad = lib.hpcgnn_gather_rows(src.data_ptr(), 10, 16, index.data_ptr(), 6, out.data_ptr(), None, 1,
                                 scratch.data_ptr(), 1, None)
    if bad < 0 or not torch.equal(out, src.index_select(0, index)):
        raise Rejected("its row gather does not copy the rows torch copies (self-test)")
    half = src.bfloat16()
    out.fill_(-1.0)
    bad = lib.hpcgnn_gather_rows_wide(half.data_ptr(), 10, 4, 0, index.data_ptr(), 6, out.data_ptr(), None, 1,
                                      scratch.data_ptr(), 1, None)
    if bad < 0 or not torch.equal(out, half.index_select(0, index).float()):
        raise Rejected("its widening row gather does not give torch's float32 rows (self-test)")
    rowptr, col = torch.tensor([0, 2, 3, 5, 5]), torch.tensor([1, 2, 0, 0, 1])
    nodes = torch.tensor([0, 2, 1, 3])
    slot, big = torch.empty(2, dtype=torch.long), torch.empty(2, dtype=torch.long)
    slots = lib.hpcgnn_hop_plan(rowptr.data_ptr(), 4, nodes.data_ptr(), 4, 5, 1, slot.data_ptr(), big.data_ptr(), 1)
    if slots != 5 or int(big[1]) != 0:
        raise Rejected(f"its hop plan counts {slots} slots for 5 neighbours (self-test)")
    row, nbr = torch.full((5,), -1), torch.full((5,), -1)
    lib.hpcgnn_hop_fill(rowptr.data_ptr(), col.data_ptr(), 0, nodes.data_ptr(), 4, 5, 1, slot.data_ptr(),
                        big.data_ptr(), 0, 0, 10, row.data_ptr(), nbr.data_ptr(), None, 1)
    if row.tolist() != [10, 10, 11, 11, 12] or nbr.tolist() != [1, 2, 0, 1, 0]:
        raise Rejected("its hop does not take the neighbours torch takes (self-test)")
    _drawing_hop_test(lib)


def _drawing_hop_test(lib: ctypes.CDLL) -> None:
    """Rows of 40 neighbours, 5 drawn each (Floyd's draws from the hop's key): the C hop against its torch twin."""
    from hpcgnn import rng
    from hpcgnn.kernels import twins

    rows, degree, fanout = 64, 40, 5
    rowptr = torch.arange(0, (rows + 1) * degree, degree)
    col = torch.randperm(rows * degree, generator=torch.Generator().manual_seed(3)) % rows
    nodes = torch.arange(rows).flip(0).contiguous()
    want_row, want_nbr, want_eid = twins.sample_neighbors(rowptr, col, nodes, fanout, torch.Generator().manual_seed(11),
                                                          eid=True)
    slot, big = torch.empty(2, dtype=torch.long), torch.empty(2, dtype=torch.long)
    slots = lib.hpcgnn_hop_plan(rowptr.data_ptr(), rows, nodes.data_ptr(), rows, fanout, 1, slot.data_ptr(),
                                big.data_ptr(), 1)
    key = int(rng.draw_key(torch.Generator().manual_seed(11), rowptr.device))
    row, nbr, eid = (torch.full((max(slots, 0),), -1) for _ in range(3))
    if slots == want_row.numel():
        lib.hpcgnn_hop_fill(rowptr.data_ptr(), col.data_ptr(), 0, nodes.data_ptr(), rows, fanout, 1, slot.data_ptr(),
                            big.data_ptr(), key, int(big[1]), 0, row.data_ptr(), nbr.data_ptr(), eid.data_ptr(), 1)
    if not (torch.equal(row, want_row) and torch.equal(nbr, want_nbr) and torch.equal(eid, want_eid)):
        raise Rejected("its hop does not draw the neighbours (and edges) the torch twin draws from the same key "
                       "(self-test)")


# ---------------------------------------------------------------------- where the library comes from


def packaged() -> Path | None:
    """The library ``pip install`` built beside this file, if any."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = sources.HERE / (PACKAGED + suffix)
        if path.is_file():
            return path
    return None


def cache_folder(environ=None) -> Path:
    """``$HPCGNN_NATIVE_CACHE``, default ``$XDG_CACHE_HOME/hpcgnn/native``."""
    moved = env.read("native_cache", environ)
    return Path(moved).expanduser() if moved else env.cache_home(environ) / "hpcgnn" / "native"


def private_folder(folder: Path) -> Path:
    """``folder``, made (mode 0700) if missing; refused (:class:`NativeUnavailable`) where another user owns it or
    others may write it: they could put a library of theirs where this process would load it."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.stat()
    except OSError as exc:
        raise NativeUnavailable(f"the cache folder {folder} cannot be made ({exc.strerror}). HINT: set "
                                "HPCGNN_NATIVE_CACHE to a folder of your own", cache=True) from None
    if not stat.S_ISDIR(st.st_mode):
        raise NativeUnavailable(f"the cache folder {folder} is not a folder. HINT: set HPCGNN_NATIVE_CACHE to a "
                                "folder of your own", cache=True)
    if st.st_uid != os.getuid():
        raise NativeUnavailable(f"the cache folder {folder} is refused: it belongs to another user (uid {st.st_uid}), "
                                "who could plant a library there. HINT: set HPCGNN_NATIVE_CACHE to a folder of your "
                                "own", cache=True)
    if st.st_mode & 0o022:
        raise NativeUnavailable(f"the cache folder {folder} is refused: others may write it (mode "
                                f"{stat.S_IMODE(st.st_mode):04o}), and so plant a library there. HINT: chmod go-w "
                                f"{folder}, or set HPCGNN_NATIVE_CACHE to a folder of your own", cache=True)
    return folder


class Compiler:
    """The C compiler (``$CC``, default ``cc``; it may carry flags of its own) and what it says of itself."""

    def __init__(self, spec: str | None = None):
        self.spec = spec or env.read("c_compiler") or "cc"
        command = shlex.split(self.spec)
        path = shutil.which(command[0]) if command else None
        if path is None:
            raise NativeUnavailable(f"no C compiler {self.spec!r} on PATH")
        self.command = [path, *command[1:]]
        self.version = self._ask(["--version"], "").stdout
        # what it targets: a wrapper's -march (Cray's cc) shows only here
        self.macros = self._ask(["-dM", "-E", "-x", "c", "-"], "").stdout

    def _ask(self, args: list[str], stdin: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([*self.command, *args], input=stdin, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise NativeUnavailable(f"{self.spec} {' '.join(args)} failed: {e}") from e

    def isa(self) -> list[str]:
        """The CPU features it compiles for beyond the baseline, as /proc/cpuinfo names them."""
        defined = {line.split()[1] for line in self.macros.splitlines() if line.startswith("#define ")}
        return sorted(flag for macro, flag in ISA_MACROS.items() if macro in defined)

    def key(self) -> str:
        text = "\n".join([source_hash(), self.version, " ".join([*self.command, *FLAGS]), self.macros,
                          platform.machine()])
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _missing_features(isa: list[str]) -> list[str]:
    """Which of these CPU features this CPU lacks (its real ones: /proc/cpuinfo, whatever HPCGNN_CPU_FLAGS says)."""
    have = env.cpu_flags(environ={})
    return [f for f in isa if f not in have] if have else []


def build(cache: Path | None = None, compiler: str | None = None) -> Path:
    """The kernels' library in the cache for this source, compiler and target, built now if it has none yet (or
    only a rejected one). Raises :class:`NativeUnavailable` where it cannot be built here."""
    folder = private_folder(cache or cache_folder())
    cc = Compiler(compiler)
    missing = _missing_features(cc.isa())
    if missing:
        raise NativeUnavailable(f"{cc.spec} compiles for {', '.join(missing)}, which this CPU lacks (a compiler "
                                "wrapper's -march, e.g. a craype-* module of another CPU). HINT: load the module of "
                                "this node's CPU, or set CC")
    lib = folder / f"sampling-{source_hash()}-{cc.key()}.so"
    if lib.exists():
        try:
            check_file(lib)
            return lib
        except Rejected as why:  # (never used: a new one is built and linked in its place)
            log.warning("the C kernels' library %s is damaged (%s): building it again", lib, why)
            with contextlib.suppress(FileNotFoundError):
                lib.unlink()  # (a process that has it mapped keeps its inode)
            with contextlib.suppress(FileNotFoundError):
                sources.recorded_path(lib).unlink()
    try:
        _write_meta(lib.with_suffix(".json"), {"source": source_hash(), "machine": platform.machine(),
                                               "isa": cc.isa(), "compiler": cc.spec})
        fd, tmp = tempfile.mkstemp(prefix=lib.stem, suffix=".so.tmp", dir=folder)
    except OSError as exc:
        raise NativeUnavailable(f"the cache folder {folder} cannot be written ({exc.strerror})", cache=True) from None
    os.close(fd)
    define = f'-DHPCGNN_SOURCE_HASH="{source_hash()}"'
    try:  # built aside, then linked into place whole: ranks building at once each leave a whole library
        flags, files = [*cc.command, *FLAGS, define], [*map(str, sources.SOURCES), "-o", tmp]
        res = subprocess.run([*flags, *files], capture_output=True, text=True, timeout=120)
        if res.returncode:  # an older compiler may not know F16C's intrinsics: without them (float16 rows by torch)
            res = subprocess.run([*flags, "-DHPCGNN_NO_F16C", *files], capture_output=True, text=True, timeout=120)
        if res.returncode:
            raise NativeUnavailable(f"{cc.spec} failed: {res.stderr.strip()[-500:]}")
        os.chmod(tmp, 0o755)
        sources.record_hash(lib, built=tmp)  # (before it is published: a library is never there unrecorded)
        try:
            os.link(tmp, lib)  # never over an existing file (another process may have it mapped)
        except FileExistsError:  # another process published the same library first: theirs stays, with its hash
            sources.record_hash(lib)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NativeUnavailable(f"building the kernels into {folder} failed: {e}") from e
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return lib


def _write_meta(path: Path, meta: dict) -> None:
    """What a cached library was built for (read where no compiler is: which library may load here); the same
    content whoever writes it, so a race leaves it whole."""
    fd, tmp = tempfile.mkstemp(prefix=path.stem, suffix=".json.tmp", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(meta, f)
    os.replace(tmp, path)


def built_here(folder: Path) -> list[Path]:
    """Libraries in ``folder`` built from this source for this machine and a CPU this one is (no compiler needed),
    newest first."""
    out = []
    for meta_path in sorted(folder.glob(f"sampling-{source_hash()}-*.json"), key=lambda p: -p.stat().st_mtime):
        lib = meta_path.with_suffix(".so")
        with contextlib.suppress(OSError, ValueError, KeyError):
            meta = json.loads(meta_path.read_text())
            if lib.is_file() and meta["machine"] == platform.machine() and not _missing_features(meta["isa"]):
                out.append(lib)
    return out


def find() -> ctypes.CDLL | None:
    """The kernels this process calls, or None (torch ops): the package's library, else the cache's (built now
    where a compiler is, else one built before from this source), each checked first (:func:`load`). What did
    not work is logged once as a warning, naming the file or the cause, with the fix."""
    problems: list[str] = []
    cache_problem = False
    lib_path = packaged()
    if lib_path is not None:
        try:
            return load(lib_path)
        except Rejected as why:
            problems.append(f"the installed library {lib_path} is not this source's ({why}): not used")
    try:
        folder = private_folder(cache_folder())
        try:
            path = build(folder)
        except NativeUnavailable as no_cc:
            found = built_here(folder)
            if not found:
                raise
            path = found[0]
            log.info("no C compiler here (%s): using the kernels built from this source in %s", no_cc, path)
        try:
            return _warned(load(path), problems)
        except Rejected as why:
            problems.append(f"{path} is not this source's ({why}): not used")
            with contextlib.suppress(OSError):
                path.unlink()  # the next process builds it again (this one has seen it wrong once)
            path = build(folder)
            return _warned(load(path), problems)
    except (NativeUnavailable, Rejected) as e:
        problems.append(str(e))
        cache_problem = getattr(e, "cache", False)
    fix = ("Set HPCGNN_NATIVE_CACHE to a folder of your own" if cache_problem else
           "Install hpcgnn where a C compiler is (`pip install` builds the kernels into the package), or make one "
           "available (e.g. `module load gcc`, or set CC)")
    log.warning("hpcgnn's C sampling kernels are not available (%s): sampling runs on torch ops, the same batches, "
                "slower. %s, or set HPCGNN_NATIVE=0 to sample on torch ops without this warning.",
                "; ".join(problems), fix)
    return None


def _warned(lib: ctypes.CDLL, problems: list[str]) -> ctypes.CDLL:
    if problems:
        log.warning("hpcgnn's C sampling kernels: %s; using the ones built into the cache instead",
                    "; ".join(problems))
    return lib
