"""The one way stabexp replaces a file: write a temp file beside it, fsync it, rename it over the
target, fsync the folder. A kill or a full disk at any moment leaves the old file or the new
one, never half of one; a failed write removes its temp file, and a full disk is said as such
(torch.save's own message for it is "unexpected pos"). The temp name carries the process id,
so processes that write the same file at once (the jobs of a sweep learning one tokenizer) never
write into each other's temp file, and the last rename wins whole; the temp files a killed
process leaves are removed by the next holder of the folder (`remove_partials`)."""

from __future__ import annotations

import errno
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator


def fsync_dir(folder: Path) -> None:
    """Make a rename inside `folder` durable (POSIX: the directory entry is data of its own)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_folder(folder: Path) -> None:
    """fsync_dir where the file system can: some network and FUSE mounts cannot fsync a folder
    (the rename is in place all the same)."""
    try:
        fsync_dir(folder)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise


def temp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.part")


def remove_partials(folder: Path, name: str = "*") -> None:
    """Remove the temp files of `name` (every file: "*") that processes killed mid-write left in
    `folder`; only for a folder no live process writes besides the caller (a run folder, under
    its lock)."""
    for partial in Path(folder).glob(f".{name}.*.part"):
        if not partial.name.endswith(f".{os.getpid()}.part"):
            partial.unlink(missing_ok=True)


def _full_disk(err: BaseException, folder: Path) -> bool:
    """Whether a failed write ran out of space: an ENOSPC / EDQUOT anywhere in the error's
    chain, or (torch.save says only "unexpected pos") no space left on the folder's disk."""
    seen = err
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        return shutil.disk_usage(folder).free < 1 << 20
    except OSError:
        return False


@contextmanager
def replacing(path: Path) -> Iterator[BinaryIO]:
    """A binary file to write `path`'s new contents into: renamed over `path` when the block
    ends normally, removed (with `path` left as it was) when the block raises."""
    path = Path(path)
    partial = temp_name(path)
    try:
        with open(partial, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)
        sync_folder(path.parent)
    except Exception as err:
        partial.unlink(missing_ok=True)
        if _full_disk(err, path.parent):
            raise OSError(errno.ENOSPC, f"No space left on device: {path} was not written (the previous "
                                        "one, if any, is kept)") from err
        raise
    finally:
        partial.unlink(missing_ok=True)


def write_atomic(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Call write(file) on a temp file beside `path`, then rename it over `path`."""
    with replacing(path) as f:
        write(f)
