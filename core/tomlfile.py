"""Reading the TOML files localstate is configured with (job files, plugin policies): every failure
is a :class:`~localstate.errors.ConfigError` naming the file, never a traceback."""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from localstate.errors import ConfigError

__all__ = ["read_toml_file"]


def read_toml_file(path: str | os.PathLike[str], what: str = "job config") -> dict[str, Any]:
    """Parse the TOML file at ``path`` (``what`` names it in messages). Missing, not a regular file
    (a FIFO would block the read), unreadable, not UTF-8, bad TOML, nesting too deep for the parser:
    each is a ConfigError naming the file with a hint."""
    path = Path(path)
    try:
        if "\0" in str(path):
            raise ValueError("the path contains a NUL character")
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError.at("", f"{what} {path} is not a regular file", source=str(path),
                                 hint="pass the path of a TOML file")
        with open(path, "rb") as handle:  # a regular file: reading cannot block
            text = handle.read().decode("utf-8")
    except FileNotFoundError as exc:
        raise ConfigError.at("", f"{what} {path} does not exist", source=str(path), hint="check the path") from exc
    except (OSError, ValueError) as exc:  # incl. UnicodeDecodeError
        raise ConfigError.at("", f"cannot read {what} {path}: {exc}", source=str(path),
                             hint="check the file's path, permissions and encoding (UTF-8)") from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError.at("", f"cannot parse {what} {path}: {exc}", source=str(path),
                             hint="fix the TOML syntax at the reported line") from exc
    except (RecursionError, MemoryError, ValueError) as exc:
        raise ConfigError.at("", f"cannot parse {what} {path}: nesting too deep or document too large "
                                 f"({type(exc).__name__})", source=str(path),
                             hint="flatten the deeply nested arrays/tables; a configuration needs only a few "
                                  "levels") from exc
