"""Reading the TOML files localstate is configured with (job files, plugin policies): every failure
is a :class:`~localstate.errors.ConfigError` naming the file, never a traceback, and no file can
make the reader hang (a FIFO), exhaust memory (a huge file) or spin (tomllib is quadratic in the
number of dotted parts of one key)."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from localstate.errors import ConfigError

__all__ = ["read_toml_file", "MAX_KEY_DEPTH"]

MAX_KEY_DEPTH = 32
"""Most dotted parts a key or table header may have: no configuration needs more, and tomllib's time
grows with the square of it (one 64 KiB line of dotted keys took 48 s)."""


def _too_deep(text: str) -> bool:
    """True if a line's key (or table header) has more than :data:`MAX_KEY_DEPTH` dotted parts.
    Counting every dot before the first ``=`` can only overestimate, never let a deep key through."""
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped and not stripped.startswith("#") and stripped.partition("=")[0].count(".") > MAX_KEY_DEPTH:
            return True
    return False


def _read_text(path: Path, what: str, max_bytes: int | None, hint: str | None) -> str:
    """The file's text, or ConfigError for anything but a readable regular UTF-8 file of sane size."""
    def fail(message: str, default_hint: str) -> ConfigError:
        return ConfigError.at("", f"{what} {path} {message}", source=str(path), hint=hint or default_hint)

    if "\0" in str(path):
        raise fail("has a NUL character in its path", "fix the path")
    try:
        # O_NONBLOCK: a FIFO planted under the file's name must not hang the open.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if os.path.islink(path):
            raise fail(f"is a dangling symlink (to {os.readlink(path)})", "fix or remove the symlink") from None
        raise fail("does not exist", "check the path") from None
    except PermissionError as exc:
        raise fail(f"cannot be read: {exc.strerror}", "make it readable by the user running localstate") from None
    except OSError as exc:
        raise fail(f"cannot be opened: {exc.strerror}", "check the file's path and permissions") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise fail("is a directory, not a regular file" if stat.S_ISDIR(mode) else "is not a regular file",
                   "pass the path of a TOML file")
    with os.fdopen(fd, "rb") as handle:
        try:
            raw = handle.read() if max_bytes is None else handle.read(max_bytes + 1)
        except OSError as exc:
            raise fail(f"cannot be read: {exc.strerror}", "check the file and its disk") from None
    if max_bytes is not None and len(raw) > max_bytes:
        raise fail(f"is larger than {max_bytes // 1024} KiB", "a configuration file is a few lines: check the path")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(f"is not valid UTF-8 (byte {exc.start})", "save it as UTF-8") from None


def read_toml_file(path: str | os.PathLike[str], what: str = "job config", *, max_bytes: int | None = None,
                   hint: str | None = None) -> dict[str, Any]:
    """Parse the TOML file at ``path`` (``what`` names it in messages; ``hint``, if given, replaces
    the default what-to-do of every error). Missing, a dangling symlink, not a regular file, unreadable,
    larger than ``max_bytes``, not UTF-8, bad TOML, nesting or dotted keys too deep for the parser:
    each is a ConfigError naming the file."""
    path = Path(path)
    text = _read_text(path, what, max_bytes, hint)
    try:
        if _too_deep(text):
            raise RecursionError(f"a key with more than {MAX_KEY_DEPTH} dotted parts")
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError.at("", f"cannot parse {what} {path}: {exc}", source=str(path),
                             hint=hint or "fix the TOML syntax at the reported line") from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise ConfigError.at("", f"cannot parse {what} {path}: nested too deeply or too large "
                                 f"({type(exc).__name__}: {exc})"[:300], source=str(path),
                             hint=hint or "flatten the deeply nested arrays/tables; a configuration needs "
                                          "only a few levels") from None
