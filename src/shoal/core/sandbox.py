"""A Landlock sandbox for the commands an agent runs: writes only where its policy says, no TCP
when the policy says so, and no signal or abstract-socket reach outside its own domain.

Landlock (Linux >= 5.13) confines a process and everything it starts; it needs no privilege,
no namespace and no package, so it is applied straight through ctypes. The ruleset is always
built in the parent (`prepare`: one O_PATH descriptor per writable path). Two ways to hand it
to a child: `Prepared.preexec`, where the child between fork and exec makes only two system
calls (`PR_SET_NO_NEW_PRIVS`, `landlock_restrict_self`) through function objects resolved at
import; and `spawn_confined`/`popen_confined`, which confine a fresh thread and spawn from it
with vfork (Landlock confines the calling thread, and a child inherits it). The second is the
one for agents' commands: a pre-exec hook makes Python fork the whole process instead of
vforking it, which cost ~40 ms a command in a large process against ~1 ms.

Reads are never restricted (the sandbox is about what a command may change). Features follow
the kernel's ABI, best effort: REFER from 2, TRUNCATE from 3, TCP bind/connect from 4 (UDP and
other protocols are never covered), signal and abstract unix socket scopes from 6.

A spawn that offers no pre-exec hook runs `python -m shoal.core.sandbox POLICY_JSON -- ARGV`,
which confines itself and execs ARGV. SHOAL_SANDBOX_PRETEND_ABSENT=1 makes this module behave
as on a kernel without Landlock (for tests of the announced fallback); it never widens.
The policy an agent's lease and mode come to is leasepolicy.py's.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TypeVar

_T = TypeVar("_T")

PRETEND_ABSENT_VAR: Final = "SHOAL_SANDBOX_PRETEND_ABSENT"

# System call numbers: the same on every architecture (the generic table).
_SYS_CREATE_RULESET: Final = 444
_SYS_ADD_RULE: Final = 445
_SYS_RESTRICT_SELF: Final = 446
_CREATE_RULESET_VERSION: Final = 1
_RULE_PATH_BENEATH: Final = 1
_PR_SET_NO_NEW_PRIVS: Final = 38

# Filesystem rights (ABI 1 unless noted).
FS_EXECUTE: Final = 1 << 0
FS_WRITE_FILE: Final = 1 << 1
FS_READ_FILE: Final = 1 << 2
FS_READ_DIR: Final = 1 << 3
FS_REMOVE_DIR: Final = 1 << 4
FS_REMOVE_FILE: Final = 1 << 5
FS_MAKE_CHAR: Final = 1 << 6
FS_MAKE_DIR: Final = 1 << 7
FS_MAKE_REG: Final = 1 << 8
FS_MAKE_SOCK: Final = 1 << 9
FS_MAKE_FIFO: Final = 1 << 10
FS_MAKE_BLOCK: Final = 1 << 11
FS_MAKE_SYM: Final = 1 << 12
FS_REFER: Final = 1 << 13  # ABI 2: rename/link across directories
FS_TRUNCATE: Final = 1 << 14  # ABI 3
FS_IOCTL_DEV: Final = 1 << 15  # ABI 5: ioctl on a device (TIOCSTI into a terminal, say)
NET_BIND_TCP: Final = 1 << 0  # ABI 4
NET_CONNECT_TCP: Final = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET: Final = 1 << 0  # ABI 6
SCOPE_SIGNAL: Final = 1 << 1  # ABI 6

_WRITE_V1: Final = (
    FS_WRITE_FILE
    | FS_REMOVE_DIR
    | FS_REMOVE_FILE
    | FS_MAKE_CHAR
    | FS_MAKE_DIR
    | FS_MAKE_REG
    | FS_MAKE_SOCK
    | FS_MAKE_FIFO
    | FS_MAKE_BLOCK
    | FS_MAKE_SYM
)
# Handled but granted nowhere: a confined command never makes a device node (as root it could
# otherwise make one for the disk beneath every rule and write through it).
_NEVER_GRANTED: Final = FS_MAKE_CHAR | FS_MAKE_BLOCK
# Devices a confined command may still write to (never create, remove or truncate).
# Never writable through a lease, whatever it says (leasepolicy.py), nor granted as a file here.
PROTECTED: Final = (".git", ".shoal")
DEVICES: Final = ("/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/random", "/dev/urandom")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _syscall: Any = _libc.syscall
    _syscall.restype = ctypes.c_long
    _prctl: Any = _libc.prctl
    _prctl.restype = ctypes.c_int
except (OSError, AttributeError):  # (no libc to call: no sandbox)
    _syscall = _prctl = None

# -- capabilities and seccomp: what Landlock does not cover ---------------------------------------

_PR_CAPBSET_DROP: Final = 24
_PR_CAP_AMBIENT: Final = 47
_PR_CAP_AMBIENT_CLEAR_ALL: Final = 4
_PR_SET_SECCOMP: Final = 22
_SECCOMP_MODE_FILTER: Final = 2
_CAP_VERSION_3: Final = 0x20080522
# (architecture seen by seccomp, capset's number, socket's number)
_ARCHES: Final = {"x86_64": (0xC000003E, 126, 41), "aarch64": (0xC00000B7, 91, 198)}
_ARCH = _ARCHES.get(os.uname().machine) if hasattr(os, "uname") else None


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


def _last_cap() -> int:
    try:
        return int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        return 40


_LAST_CAP: Final = _last_cap()
_CAPS_EMPTY = (_CapHeader(_CAP_VERSION_3, 0), (_CapData * 2)())


def _no_unix_sockets_filter() -> _SockFprog | None:
    """A seccomp program refusing `socket(AF_UNIX, ...)` with EACCES, and every system call
    of a foreign architecture (an x32 or i386 call would go round the check). Landlock does
    not govern connecting to a socket file, and a socket of the user's tmux server, D-Bus or
    ssh-agent would run anything outside the box. `socketpair` stays allowed."""
    if _ARCH is None:
        return None
    arch, _, socket_nr = _ARCH
    ld_abs = 0x20  # BPF_LD | BPF_W | BPF_ABS
    jeq, jge, ret = 0x15, 0x35, 0x06  # BPF_JMP | BPF_JEQ / BPF_JGE | BPF_K, BPF_RET | BPF_K
    allow, deny = 0x7FFF0000, 0x00050000 | errno.EACCES  # SECCOMP_RET_ALLOW, RET_ERRNO
    code = [
        (ld_abs, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, arch),
        (ret, 0, 0, deny),
        (ld_abs, 0, 0, 0),  # seccomp_data.nr
        (jge, 0, 1, 0x40000000),  # (x32 calls)
        (ret, 0, 0, deny),
        (jeq, 0, 3, socket_nr),
        (ld_abs, 0, 0, 16),  # seccomp_data.args[0], low half (little-endian)
        (jeq, 0, 1, 1),  # AF_UNIX
        (ret, 0, 0, deny),
        (ret, 0, 0, allow),
    ]
    program = (_SockFilter * len(code))(*(_SockFilter(*c) for c in code))
    prog = _SockFprog(len(code), program)
    prog._keep = program  # (kept alive as long as the program)
    return prog


_UNIX_FILTER = _no_unix_sockets_filter()


def _drop_privileges(unix: bool) -> int:
    """On the calling thread (and so on what it starts): no capability left, root's
    included (a root command would otherwise make device nodes, inject keystrokes with
    TIOCSTI, or chown its way round the rules), and with `unix` False no unix socket to make.
    0, or the errno of the step that failed. Only system calls through objects made at
    import: safe between fork and exec."""
    if _ARCH is not None:
        for cap in range(_LAST_CAP + 1):  # (EPERM without CAP_SETPCAP: there is nothing to drop)
            _prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
        _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
        header, data = _CAPS_EMPTY
        if _syscall(_ARCH[1], ctypes.byref(header), ctypes.byref(data)) != 0:
            return ctypes.get_errno() or errno.EPERM
    if (
        not unix
        and _UNIX_FILTER is not None
        and _prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(_UNIX_FILTER), 0, 0) != 0
    ):
        return ctypes.get_errno() or errno.EPERM
    return 0


class SandboxError(OSError):
    """The sandbox could not be built or applied (the command is not run)."""


_abi_cache: list[int] = []


def abi() -> int:
    """The kernel's Landlock ABI version, 0 when it has none (or is pretended to have none)."""
    if os.environ.get(PRETEND_ABSENT_VAR, "") not in ("", "0"):
        return 0
    if not _abi_cache:
        version = 0
        if _syscall is not None and sys.platform.startswith("linux"):
            got = _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
            version = max(int(got), 0)
        _abi_cache.append(version)
    return _abi_cache[0]


def _write_rights(version: int) -> int:
    rights = _WRITE_V1
    if version >= 2:
        rights |= FS_REFER
    if version >= 3:
        rights |= FS_TRUNCATE
    return rights


def _file_rights(version: int) -> int:
    return FS_WRITE_FILE | (FS_TRUNCATE if version >= 3 else 0)


@dataclass(frozen=True)
class Policy:
    """What a confined command may change: `dirs` (everything beneath each), `files` (each
    written in place, never created or removed), TCP when `network`, and with `scoped` no
    signal to, nor abstract unix socket of, a process outside the sandbox."""

    dirs: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    network: bool = True
    scoped: bool = True
    notes: tuple[str, ...] = field(default=(), compare=False)  # what the lease could not map
    unix: bool = False  # may make unix sockets (`[sandbox] unix_sockets = true`)

    def widened(self, dirs: Iterable[str] = (), files: Iterable[str] = ()) -> Policy:
        """The same policy with more writable paths (a task's own side files, say)."""
        return Policy(
            tuple(dict.fromkeys([*self.dirs, *dirs])),
            tuple(dict.fromkeys([*self.files, *files])),
            self.network,
            self.scoped,
            self.notes,
            self.unix,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "dirs": list(self.dirs),
            "files": list(self.files),
            "network": self.network,
            "scoped": self.scoped,
            "unix": self.unix,
        }

    @classmethod
    def from_json(cls, raw: Any) -> Policy:
        """A policy from its JSON form; a ValueError says what is wrong."""
        if not isinstance(raw, dict):
            raise ValueError(f"a sandbox policy is an object, not {raw!r}")
        dirs, files = raw.get("dirs", []), raw.get("files", [])
        for name, value in (("dirs", dirs), ("files", files)):
            if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
                raise ValueError(f"sandbox policy: {name} must be a list of paths")
        network, scoped = raw.get("network", True), raw.get("scoped", True)
        unix = raw.get("unix", False)
        if not all(isinstance(v, bool) for v in (network, scoped, unix)):
            raise ValueError("sandbox policy: network, scoped and unix must be true or false")
        return cls(tuple(dirs), tuple(files), network, scoped, unix=unix)


class Prepared:
    """A ruleset built in the parent, ready for a child to restrict itself with (`preexec`).
    Close it once the child is started (its descriptor is close-on-exec either way)."""

    def __init__(self, fd: int, unix: bool = False) -> None:
        self.fd = fd
        self.unix = unix

    def preexec(self) -> None:
        """Between fork and exec: confine this process for good (system calls only)."""
        if (
            _prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
            or _syscall(_SYS_RESTRICT_SELF, self.fd, 0)
            or _drop_privileges(self.unix)
        ):
            os._exit(126)  # (a command that cannot be confined never runs)

    def restrict(self) -> None:
        """Confine the calling thread (and what it starts) for good; SandboxError if not."""
        if _prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise SandboxError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if _syscall(_SYS_RESTRICT_SELF, self.fd, 0) != 0:
            err = ctypes.get_errno()
            raise SandboxError(err, f"landlock_restrict_self: {os.strerror(err)}")
        failed = _drop_privileges(self.unix)
        if failed:
            raise SandboxError(failed, f"dropping capabilities: {os.strerror(failed)}")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Prepared:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _add_path(ruleset: int, path: str, rights: int, *, file: bool = False) -> bool:
    """One path-beneath rule; False when the path is not there (it is left out). The last
    component is never followed (a symlink swapped in since the policy was made grants
    nothing), and a file whose real path lies in a `.git` or `.shoal` directory is left out
    (a leased `cfg -> .git/config`)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        real = Path(os.readlink(f"/proc/self/fd/{fd}")) if os.path.isdir("/proc/self/fd") else None
        if real is not None and (".git" in real.parts or (file and PROTECTED[1] in real.parts)):
            return False
        rule = _PathBeneath(rights, fd)
        if _syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0) != 0:
            err = ctypes.get_errno()
            if err == errno.EINVAL and rights != _file_rights(abi()):  # (a file given as dir)
                rule = _PathBeneath(rights & _file_rights(abi()), fd)
                if _syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.byref(rule), 0):
                    raise SandboxError(ctypes.get_errno(), f"landlock rule for {path}")
            else:
                raise SandboxError(err, f"landlock rule for {path}: {os.strerror(err)}")
    finally:
        os.close(fd)
    return True


def prepare(policy: Policy) -> Prepared:
    """Build `policy`'s ruleset (SandboxError when the kernel has no Landlock or refuses)."""
    version = abi()
    if version < 1:
        raise SandboxError(errno.ENOSYS, "this kernel offers no Landlock sandbox")
    handled = _write_rights(version) | (FS_IOCTL_DEV if version >= 5 else 0)
    attr = _RulesetAttr(handled, 0, 0)
    size = 8
    if version >= 4 and not policy.network:
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP  # (no rule: none allowed)
        size = 16
    if version >= 6 and policy.scoped:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        size = 24
    fd = int(_syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0))
    if fd < 0:
        err = ctypes.get_errno()
        raise SandboxError(err, f"landlock_create_ruleset: {os.strerror(err)}")
    try:
        for path in policy.dirs:
            _add_path(fd, path, _write_rights(version) & ~_NEVER_GRANTED)
        for path in policy.files:
            _add_path(fd, path, _file_rights(version), file=True)
        for path in DEVICES:
            _add_path(fd, path, _file_rights(version) | (FS_IOCTL_DEV if version >= 5 else 0))
    except BaseException:
        os.close(fd)
        raise
    return Prepared(fd, policy.unix)


def restrict_self(policy: Policy) -> None:
    """Confine this very process (and what it starts) to `policy`, for good."""
    with prepare(policy) as ready:
        ready.restrict()


def spawn_confined(policy: Policy, spawn: Callable[[], _T]) -> _T:
    """Call `spawn` (a posix_spawn) on a fresh thread that confines itself first: Landlock
    confines the calling thread only, and a child inherits its spawner's confinement, so the
    child is confined while the spawn stays vfork-fast and the rest of this process free. The
    thread ends right after (a confined thread is never reused)."""
    import threading

    outcome: list[Any] = []

    def run() -> None:
        try:
            with prepare(policy) as ready:
                ready.restrict()
            outcome.append((True, spawn()))
        except BaseException as exc:  # (handed to the caller's thread)
            outcome.append((False, exc))

    thread = threading.Thread(target=run, name="shoal-sandboxed-spawn", daemon=True)
    thread.start()
    thread.join()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]


def popen_confined(policy: Policy, argv: Sequence[str], **options: Any) -> Any:
    """`subprocess.Popen(argv, **options)` confined to `policy` (see `spawn_confined`; with no
    pre-exec hook Python spawns it with vfork, which stays cheap in a large process)."""
    import subprocess

    return spawn_confined(policy, lambda: subprocess.Popen(argv, **options))


def wrapper_argv(policy: Policy, argv: Sequence[str]) -> list[str]:
    """An argv that runs `argv` confined to `policy`, for spawns without a pre-exec hook."""
    # -P: the working directory (a project's, perhaps with a `shoal/` of its own) is not put on
    # sys.path, so what is imported before the confinement is shoal's own code.
    return [
        sys.executable, "-P", "-m", "shoal.core.sandbox", json.dumps(policy.to_json()), "--", *argv
    ]  # fmt: skip


# -- the exec wrapper ------------------------------------------------------------------------------


def main(args: Sequence[str]) -> int:
    """`python -m shoal.core.sandbox POLICY_JSON -- ARGV...`: confine, then exec ARGV. Without
    Landlock ARGV runs unconfined (whoever started this has said so); a policy that cannot be
    applied runs nothing (exit 126)."""
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m shoal.core.sandbox POLICY_JSON -- ARGV...", file=sys.stderr)
        return 2
    try:
        policy = Policy.from_json(json.loads(args[0]))
    except ValueError as exc:
        print(f"shoal sandbox: bad policy: {exc}", file=sys.stderr)
        return 2
    if abi() >= 1:
        try:
            restrict_self(policy)
        except OSError as exc:
            print(f"shoal sandbox: cannot confine {args[2]!r}: {exc}", file=sys.stderr)
            return 126
    try:
        os.execvp(args[2], list(args[2:]))
    except OSError as exc:
        print(f"shoal sandbox: cannot run {args[2]!r}: {exc.strerror}", file=sys.stderr)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
