"""The one path rule: whose files hpcgnn reads from and writes into, checked from a root, component by component.

A cluster's file systems are shared. A folder or file that another user can write is input, not configuration:
hpcgnn reads code (PyG's processed pickles, configs that Hydra composes, model classes) and results (labels,
checkpoints, prepared graphs) from run folders, sweep folders and data roots, and it writes predictions, logs and
metrics into them. So, as ssh checks ``~/.ssh``, every path hpcgnn uses under such a **root** is reached through
components that only you (or root) can have put there:

- the root itself (:func:`check_root`): owned by you or root, and neither group nor others may write it;
- everything below it (:func:`check_tree`, :func:`check_under`), each component seen without following links
  (``lstat``): owned by you or root; neither group nor others may write it; a symbolic link only where you made it
  (its target is then checked as a root of its own); a plain file or a folder, never a FIFO, a socket or a device.

A root you said you trust (``dataset.trust_root=true`` for a lab's shared data root, ``trust=true`` for a
colleague's run folder) is not checked: :func:`trust_root` records it for this process, and the writers below skip
their own guards under it.

Once a tree passes, nobody but you (and root) can add to it, so what hpcgnn later reads or writes there is yours:
the check is made where a command or a rank starts, before anything is read. The writers guard themselves too
(:func:`guard_parent`, :func:`open_nofollow`, and :func:`hpcgnn.io.atomic_open`, the one atomic writer): a file is
opened without following a link, and a link planted where a file is to be written is refused, not written through.

docs/security.md's table lists each root, what is read or written there, and the check that guards it.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import stat
from pathlib import Path

from hpcgnn.errors import NotTrusted

_TRUSTED: set[Path] = set()  # roots this process was told to trust (trust_root)


def trust_root(root: str | Path) -> None:
    """Trust ``root`` and everything below it in this process: a lab's shared root that the user vouched for."""
    _TRUSTED.add(Path(os.path.abspath(Path(root).expanduser())))


def trusted(path: str | Path) -> bool:
    p = Path(os.path.abspath(Path(path).expanduser()))
    return any(p == r or r in p.parents for r in _TRUSTED)


def kind_of(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "not a plain file or folder"


_OTHERS_OWN = contextvars.ContextVar("others_own", default=False)


@contextlib.contextmanager
def others_may_own():
    """Inside, a component another user owns passes, one that others may write still does not: for what you said
    you trust (``trust=true``), a colleague's package is theirs to own, but nobody else's to write."""
    token = _OTHERS_OWN.set(True)
    try:
        yield
    finally:
        _OTHERS_OWN.reset(token)


def fault(st: os.stat_result) -> str | None:
    """Why a component with this (``lstat``) status may have been written by another user, or None. Root's
    components are trusted, as ssh trusts them."""
    if st.st_uid not in (os.getuid(), 0) and not _OTHERS_OWN.get():
        if stat.S_ISLNK(st.st_mode):
            return f"is a symbolic link made by another user (uid {st.st_uid})"
        return f"belongs to another user (uid {st.st_uid})"
    if stat.S_ISLNK(st.st_mode):
        return None  # (yours or root's: its target is checked by the caller)
    if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
        return f"is {kind_of(st.st_mode)}, not a plain file or folder"
    if st.st_mode & 0o022:
        return f"can be written by others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _refuse(what: str, path: Path, why: str, hint: str, mode: int | None = None) -> NotTrusted:
    fix = f"chmod go-w {path} if nobody else wrote it; " if mode is not None and "written by others" in why else ""
    return NotTrusted(f"{what} {path} {why}: another user may have written what hpcgnn would read or write there. "
                      f"HINT: {fix}{hint}")


def check_root(root: str | Path, what: str, hint: str) -> None:
    """Refuse a root folder that another user owns (root excepted) or that others may write. Its own path is
    followed (a root you reach through your own link is yours to choose). A root that does not exist passes; one
    this process trusts passes."""
    root = Path(root).expanduser()
    if not trusted(root):
        _component(root, what, hint, follow=True)


def _component(path: Path, what: str, hint: str, follow: bool = False) -> os.stat_result | None:
    """One component's status (None: it does not exist), refused where it fails the rule (:func:`fault`)."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except FileNotFoundError:
        return None
    why = fault(st)
    if why is not None:
        raise _refuse(what, path, why, hint, st.st_mode)
    return st


def _link_target(path: Path) -> Path:
    return Path(os.path.normpath(path.parent / os.readlink(path)))


def check_under(root: str | Path, path: str | Path, what: str, hint: str) -> None:
    """Refuse ``path`` unless every component from ``root`` (checked as by :func:`check_root`) down to it passes
    the rule; components that do not exist yet pass (hpcgnn makes them, yours). A link of yours on the way is
    followed and its target checked as a root."""
    root, path = Path(root).expanduser(), Path(path).expanduser()
    if trusted(root):
        return
    check_root(root, what, hint)
    rel = Path(os.path.relpath(path, root))
    if rel.parts[:1] == ("..",):
        raise NotTrusted(f"{what} {path} is not inside {root}. HINT: {hint}")
    here = root
    for part in rel.parts if rel != Path(".") else ():
        here = here / part
        st = _component(here, what, hint)
        if st is None:
            return
        if stat.S_ISLNK(st.st_mode):
            target = _link_target(here)
            check_under(target, target, f"{what} (through the link {here})", hint)
            here = target


def check_tree(root: str | Path, what: str, hint: str, only: tuple[str, ...] | None = None) -> None:
    """Refuse a root (:func:`check_root`) any of whose entries below, at any depth, fails the rule: a folder or
    file another user owns or others may write, a link another user made, a FIFO. ``only``: the entries of the root
    to walk (relative paths; each reached through :func:`check_under`); default, all. A link of yours is followed
    and its target walked the same way (once)."""
    root = Path(root).expanduser()
    if trusted(root):
        return
    check_root(root, what, hint)
    seen: set = set()
    starts = [root] if only is None else [root / o for o in only]
    for start in starts:
        if start != root:
            check_under(root, start, what, hint)
            if not os.path.lexists(start):
                continue
            if os.path.islink(start):
                start = Path(os.path.realpath(start))
        _walk(start, what, hint, seen)


def _walk(folder: Path, what: str, hint: str, seen: set) -> None:
    try:
        key = os.stat(folder)
    except FileNotFoundError:
        return
    if (key.st_dev, key.st_ino) in seen or not stat.S_ISDIR(key.st_mode):
        return
    seen.add((key.st_dev, key.st_ino))
    try:
        entries = list(os.scandir(folder))
    except (FileNotFoundError, NotADirectoryError):
        return
    except PermissionError as exc:
        raise NotTrusted(f"{what}: cannot read the folder {folder} ({exc.strerror}). HINT: {hint}") from None
    for entry in entries:
        path = Path(entry.path)
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # (removed meanwhile by one of your own processes: nobody else can remove it)
        why = fault(st)
        if why is not None:
            raise _refuse(what, path, why, hint, st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            target = _link_target(path)
            check_root(target, f"{what} (through the link {path})", hint)
            _walk(target, what, hint, seen)
        elif stat.S_ISDIR(st.st_mode):
            _walk(path, what, hint, seen)


def why_not_yours(root: str | Path) -> str | None:
    """Why ``root``'s tree fails the rule (:func:`check_tree`), or None: it is yours. For commands that only look
    (``status``): they show another user's folder, but mark it and print no command from it to run."""
    try:
        check_tree(root, "the folder", "")
    except NotTrusted as exc:
        return str(exc).split(": another user may", 1)[0]
    return None


# ---------------------------------------------------------------------- the writers' own guards


HINT_WRITE = "write into a folder only you can write, or remove what another user put there"


def guard_parent(folder: Path, what: str = "the folder") -> None:
    """Before writing into ``folder``: refuse it if it is a link another user made, is owned by another user, or
    others may write it (unless it is under a root this process trusts)."""
    if trusted(folder):
        return
    try:
        st = os.lstat(folder)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid not in (os.getuid(), 0):
            raise _refuse(what, folder, f"is a symbolic link made by another user (uid {st.st_uid})", HINT_WRITE)
        st = os.stat(folder)
    why = None if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid in (os.getuid(), 0) \
        else fault(st)
    if why is not None:
        raise _refuse(what, folder, why, HINT_WRITE, st.st_mode)


def refuse_link(path: Path, what: str = "the file") -> None:
    """Refuse to write at ``path`` where a link stands that another user made (nothing is written through it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) and st.st_uid not in (os.getuid(), 0):
        raise _refuse(what, path, f"is a symbolic link made by another user (uid {st.st_uid})", HINT_WRITE)
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode)):
        raise _refuse(what, path, f"is {kind_of(st.st_mode)}, not a plain file", HINT_WRITE)


def make_dirs(folder: str | Path, mode: int = 0o777) -> Path:
    """``folder`` made (with its missing parents, ``mode`` under the umask) only below a folder that passes
    :func:`guard_parent`: nothing is made through a link another user planted, or in a folder others may write."""
    folder = Path(folder)
    existing = folder
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    guard_parent(existing, "the folder")
    folder.mkdir(mode=mode, parents=True, exist_ok=True)
    return folder


def open_nofollow(path: str | Path, flags: int, mode: int = 0o644, what: str = "the file",
                  private: bool = False) -> int:
    """``os.open`` of ``path`` in a guarded folder (:func:`guard_parent`) that follows no link at the last component
    and waits on no FIFO: the one way hpcgnn opens a file it creates, writes, or reads code or state from. Refused
    with one line: a link, anything but a plain file, a file of another user (``private``: a file yours alone, that
    nobody else may write: a secret's neighbours, a lock, a state, overrides that are composed). A missing file, or
    a full disk, is the OSError it is."""
    path = Path(path)
    guard_parent(path.parent, f"the folder of {what}")
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotTrusted(f"{what} {path} is a symbolic link, which hpcgnn does not follow: nothing is read or "
                             "written through it. HINT: another user may have planted it: remove it, or use a folder "
                             "only you can write") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise NotTrusted(f"cannot open {what} {path} ({exc.strerror}). HINT: it must be a plain file of yours; "
                             "another user may have planted it: remove it, or use a folder only you can write") from None
        raise
    st = os.fstat(fd)
    owners = (os.getuid(),) if private else (os.getuid(), 0)
    if not stat.S_ISREG(st.st_mode) or (st.st_uid not in owners or private and st.st_mode & 0o022) \
            and not (not private and trusted(path)):
        os.close(fd)
        kind = "a plain file" if stat.S_ISREG(st.st_mode) else kind_of(st.st_mode)
        raise NotTrusted(f"{what} {path} is {kind} of owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}: "
                         "not a plain file of yours that only you can write. HINT: another user may have planted it: "
                         "remove it, or use a folder only you can write")
    os.set_blocking(fd, True)
    return fd


def read_own(path: str | Path, what: str, limit: int = 1 << 34) -> bytes:
    """A file's bytes, refused unless it is a plain file yours alone to write (:func:`open_nofollow`, ``private``):
    what hpcgnn composes, decodes or acts on (a tune's overrides, a sampler state, a servers' config)."""
    with os.fdopen(open_nofollow(path, os.O_RDONLY, what=what, private=True), "rb") as f:
        return f.read(limit)


def read_text(path: str | Path, limit: int = 1 << 26) -> str:
    """A small file's text, for commands that only look (``status``) and may look at another user's folder: a link
    is not followed, a FIFO not waited on (it would hang the command), anything but a plain file is an OSError, and
    at most ``limit`` bytes are read."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{path} is not a plain file")
        return f.read(limit).decode(errors="replace")


def open_append(path: str | Path, what: str = "the file", binary: bool = False, buffering: int = -1):
    """A file opened to append (made, mode 0644 under the umask, if missing), through :func:`open_nofollow`."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644, what)
    return os.fdopen(fd, "ab" if binary else "a", buffering=buffering)
