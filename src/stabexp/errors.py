"""The user errors every layer can raise: each is printed as one line (exit code 2), never as a
traceback. A module of its own, importing nothing of stabexp, so that data/, train/ and config.py can all
raise them without importing each other."""

import errno

# A file the command must write that this process may not: a read-only disk or mount, no
# permission. The machine's state, said in one line (`cannot_write`), never a traceback.
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def cannot_write(err: OSError):
    """The one line for an OSError that is a file this process may not write, else None."""
    if err.errno not in NOT_WRITABLE:
        return None
    return (f"cannot write {err.filename or 'a file'}: {err.strerror or err}; give a folder this user can write "
            "(STABEXP_OUTPUTS, hydra.run.dir, hydra.sweep.dir, the command's own path)")


class ConfigError(ValueError):
    """A user error in the config: reported as one line, never as a traceback."""


def need(ok: bool, key: str, value, allowed: str) -> None:
    """ConfigError '<key>=<value> is not allowed: <allowed>' unless ok: every config check's line."""
    if not ok:
        raise ConfigError(f"{key}={value} is not allowed: {allowed}")


def install_hint(extra: str) -> str:
    """How to add one of the package's optional extras (pyproject.toml): `make install` keeps a
    checkout's install editable; elsewhere pip takes the extra's own requirements."""
    from importlib.metadata import PackageNotFoundError, requires

    try:
        needs = [r.split(";")[0].replace(" ", "") for r in requires("stabexp") or ()
                 if r.replace(" ", "").endswith(f'extra=="{extra}"')]
    except PackageNotFoundError:
        needs = []
    pip = " ".join(f'"{r}"' for r in needs) or f'-e ".[{extra}]"'
    return f"make install EXTRAS={extra} in a checkout, or pip install {pip}"
