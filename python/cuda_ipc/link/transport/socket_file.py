"""The file of a listening socket, made without following anything another user planted (as
src/link/transport/socket-file.ts).

bind() creates the file with the mode the umask leaves, so the mode other uids need (0666) takes a
chmod after it, and a chmod by name can be sent elsewhere: someone who can write to the directory
swaps the new name for a symlink between the two calls, and chmod follows it. fchmod() of the
socket before bind() would set the mode in one step on Linux, but the umask still applies (022
takes away the write bit connect() needs) and changing the umask is process-wide. So the socket is
bound inside a new private directory (mkdtemp: 0700 and ours), given its mode there, and only then
published under its name with link(), which creates the name in one step and never follows or
replaces what is already there (EEXIST). Every lookup goes through directory fds.
"""
from __future__ import annotations

import errno
import os
import socket
import stat
import tempfile

from ...errors import IpcError
from .socket_path import MY_UID

#: (st_dev, st_ino) of the socket file a listener made: close() removes that one only.
FileIdentity = tuple[int, int]


def someone_listens(path: str) -> bool:
    """True when something accepts connections at ``path`` (a live listener, not a stale file)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    probe.setblocking(False)
    try:
        probe.connect(path)
        return True
    except BlockingIOError:
        return True  # backlog full: alive
    except OSError:
        return False
    finally:
        probe.close()


def _describe(name: str, dir_fd: int) -> str:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return "there"
    kind = ("socket" if stat.S_ISSOCK(st.st_mode) else "symbolic link" if stat.S_ISLNK(st.st_mode)
            else "directory" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "special file")
    return f"a {kind} of uid {st.st_uid}"


def bind_socket_file(sock: socket.socket, path: str, name: str, mode: int) -> FileIdentity:
    """Binds ``sock`` and publishes it at ``path`` with ``mode`` (see the module notes). A live listener
    there is ERR_ADDRESS_IN_USE; a stale socket of this user is replaced; anything else at the name
    (another user's file, a symlink) is ERR_ADDRESS_IN_USE naming its owner."""
    directory, base = os.path.split(path)
    target = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    private_fd = -1
    private_name = ""
    verified = False
    try:
        private_name = os.path.basename(tempfile.mkdtemp(prefix=f".{base}.", dir=f"/proc/self/fd/{target}"))
        try:
            private_fd = os.open(private_name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=target)
        except OSError as e:
            # Renamed away (ENOENT) or swapped for a symlink (ELOOP) or a file (ENOTDIR) meanwhile.
            if e.errno not in (errno.ELOOP, errno.ENOTDIR, errno.ENOENT):
                raise
        st = os.fstat(private_fd) if private_fd >= 0 else None
        if st is None or st.st_uid != MY_UID or st.st_mode & 0o077:
            raise IpcError("ERR_SOCKET_DIR_UNSAFE", f"the directory {directory} changed under listen('{name}'): its new private folder "
                           f"{private_name} was replaced; do not listen in a directory where others may rename entries")
        verified = True
        sock.bind(f"/proc/self/fd/{private_fd}/s")
        os.chmod("s", mode, dir_fd=private_fd)
        st = os.stat("s", dir_fd=private_fd, follow_symlinks=False)
        _publish(private_fd, target, base, path, name)
        return (st.st_dev, st.st_ino)
    finally:
        if verified:
            try:
                os.unlink("s", dir_fd=private_fd)
            except OSError:
                pass  # never bound
            try:
                mine = os.fstat(private_fd)
                there = os.stat(private_name, dir_fd=target, follow_symlinks=False)
                if (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
                    os.rmdir(private_name, dir_fd=target)
            except OSError:
                pass  # renamed away by someone else: empty, and theirs to remove
        if private_fd >= 0:
            os.close(private_fd)
        os.close(target)


def _publish(private_fd: int, target: int, base: str, path: str, name: str) -> None:
    for attempt in range(2):
        try:
            os.link("s", base, src_dir_fd=private_fd, dst_dir_fd=target, follow_symlinks=False)
            return
        except FileExistsError:
            pass
        if attempt > 0:
            break
        if someone_listens(path):
            raise IpcError("ERR_ADDRESS_IN_USE", f"another process is already listening on '{name}' ({path}); pick another name or close that listener")
        try:
            st = os.stat(base, dir_fd=target, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != MY_UID:
            raise IpcError("ERR_ADDRESS_IN_USE", f"the name '{name}' is taken: {path} is {_describe(base, target)}, not a socket this user left; "
                           "remove it or pick another name (in a directory other users may write to, any of them can take a name first)")
        # A socket of this user that nobody listens on, left by a listener that died.
        try:
            os.unlink(base, dir_fd=target)
        except OSError:
            pass  # gone already, or swapped for something unlink cannot remove: the next link() says
    raise IpcError("ERR_ADDRESS_IN_USE", f"another process took '{name}' ({path}) at the same time")


def remove_if_same(path: str, identity: FileIdentity) -> None:
    """Removes ``path`` only if it is still the file ``identity`` names."""
    try:
        st = os.lstat(path)
        if (st.st_dev, st.st_ino) == identity:
            os.unlink(path)
    except OSError:
        pass
