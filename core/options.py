"""Declarative, typed plugin options. A plugin declares ``options = {"name": Option(...)}``;
:func:`validate_options` checks a raw TOML table against it and reports every problem with its
config path (for example ``stores.counts.cache_size``)."""

from __future__ import annotations

import difflib
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from localstate.errors import ConfigError, ConfigProblem

__all__ = ["Option", "Removed", "live_options", "validate_options", "parse_size", "parse_duration", "did_you_mean",
           "suggest_option", "parse_path",
           "MAX_SIZE", "MAX_DURATION"]

_MISSING = object()


def did_you_mean(name: str, choices: Sequence[str]) -> str:
    """Return ' (did you mean X?)' when a close match exists, else ''."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def suggest_option(name: str, spec: Mapping[str, "Option | Removed"]) -> str:
    """' (did you mean X?)' for an unknown option ``name`` of ``spec``, or ''. A word an option lists
    in ``Option.synonyms`` first (a heap's ``size`` is its ``capacity``), then the closest spelling,
    where the plugin's own options win over the ones every engine shares (``Option.shared``: the
    backend's) unless a shared one is clearly closer: a heap's ``size`` never suggests LMDB's
    ``map_size``, and ``blockcache`` still finds ``block_cache_size``."""
    key = name.strip().lower()
    spec = live_options(spec)  # a removed option is never suggested
    own = [option for option, declared in spec.items() if not declared.shared]
    shared = [option for option, declared in spec.items() if declared.shared]
    for names in (own, shared):
        for option in names:
            if key in spec[option].synonyms:
                return f" (did you mean {option!r}?)"

    def best(names: list[str]) -> tuple[float, str | None]:
        scored = [(difflib.SequenceMatcher(None, key, option).ratio(), option) for option in names]
        return max(scored, default=(0.0, None))

    (own_score, own_best), (shared_score, shared_best) = best(own), best(shared)
    if own_best is not None and own_score >= 0.5 and own_score + 0.15 >= shared_score:
        return f" (did you mean {own_best!r}?)"
    if shared_best is not None and shared_score >= 0.6:
        return f" (did you mean {shared_best!r}?)"
    return ""


_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
               "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
               "tib": 1 << 40}

MAX_SIZE = 16 << 40
"""Largest byte size any option accepts (16 TiB): anything larger is a typo, and Python floats
such as ``1e999`` would otherwise overflow when converted."""

MAX_DURATION = 1e10
"""Longest duration any option accepts, in seconds (about 317 years): ``10 ** 9`` is the customary
"never" (``commit_interval`` in tests and :mod:`localstate.testing.driver`); anything larger is a
typo, and ``1e999`` would be infinite."""


def _bounded(number: float, what: str, maximum: float, shown: Any) -> float:
    """``number`` if it is finite and within ``0..maximum``, else ValueError naming ``shown``."""
    if math.isnan(number) or math.isinf(number):
        raise ValueError(f"{what} must be a finite number, got {shown!r}")
    if number < 0:
        raise ValueError(f"{what} must not be negative, got {shown!r}")
    if number > maximum:
        raise ValueError(f"{what} must be at most {maximum:g}{' bytes' if what == 'size' else ' seconds'}, "
                         f"got {shown!r}")
    return number


def parse_size(value: Any) -> int:
    """Parse a byte size: an int, or a string like '64MB' / '512 KiB' / '1.5GB'. The result is an
    int from 0 to :data:`MAX_SIZE`. Raises ValueError (never OverflowError) on anything else."""
    if isinstance(value, bool):
        raise ValueError("expected a size, got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"size must not be negative, got {value!r}")
        if value > MAX_SIZE:
            raise ValueError(f"size must be at most {MAX_SIZE} bytes, got {value!r}")
        return value
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(digits):]
        if digits and unit in _SIZE_UNITS:
            try:
                number = float(digits)
            except ValueError:
                number = None
            if number is not None:
                return int(_bounded(number * _SIZE_UNITS[unit], "size", MAX_SIZE, value))
    raise ValueError(f"expected a size such as 1048576 or '64MB', got {value!r}")


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> float:
    """Parse a duration in seconds: a number, or a string like '250ms', '10s', '5m', '1h'. The
    result is finite, from 0 to :data:`MAX_DURATION`. Raises ValueError (never OverflowError)."""
    if isinstance(value, bool):
        raise ValueError("expected a duration, got a boolean")
    if isinstance(value, int) and not -MAX_DURATION <= value <= MAX_DURATION:
        # An int beyond float range would make float() raise OverflowError.
        raise ValueError(f"duration must be from 0 to {MAX_DURATION:g} seconds, got {value!r}")
    if isinstance(value, (int, float)):
        return _bounded(float(value), "duration", MAX_DURATION, value)
    if isinstance(value, str):
        text = value.strip().lower()
        for unit in sorted(_DURATION_UNITS, key=len, reverse=True):
            if text.endswith(unit):
                number = text[: -len(unit)].strip()
                try:
                    seconds = float(number) * _DURATION_UNITS[unit]
                except ValueError:
                    break
                return _bounded(seconds, "duration", MAX_DURATION, value)
    raise ValueError(f"expected a duration such as 10, '250ms', '10s' or '5m', got {value!r}")


_PATH_MAX, _NAME_MAX = 4096, 255
_INT64 = 1 << 63


def parse_path(value: Any) -> str:
    """Check a configured file-system path: a non-empty string without NUL or other control
    characters, encodable for the file system, within PATH_MAX/NAME_MAX. Returns it unchanged;
    raises ValueError saying what is wrong (so the error lands at the config key, not in open())."""
    if not isinstance(value, str):
        raise ValueError(f"expected a path (a string), got {type(value).__name__} {value!r}")
    if not value.strip():
        raise ValueError("must be a non-empty path")
    bad = sorted({ch for ch in value if ord(ch) < 0x20 or ord(ch) == 0x7F})
    if bad:
        raise ValueError(f"path contains unusable control character(s) {', '.join(map(repr, bad))}: {value!r}")
    try:
        encoded = os.fsencode(value)
    except UnicodeError as exc:
        raise ValueError(f"path cannot be encoded for the file system ({exc.reason}): {value!r}") from None
    if len(encoded) >= _PATH_MAX or any(len(part) > _NAME_MAX for part in encoded.split(b"/")):
        raise ValueError(f"path is too long (max {_PATH_MAX} bytes, {_NAME_MAX} per component): {value[:80]!r}...")
    return value


@dataclass(frozen=True)
class Option:
    """One declared option.

    ``type`` is the accepted Python type(s) after TOML parsing (bool is never accepted as int);
    ``parse`` converts or checks the value and raises ValueError with a readable reason;
    ``choices`` restricts the value; ``minimum``/``maximum`` bound numbers.
    """

    type: type | tuple[type, ...]
    default: Any = _MISSING
    doc: str = ""
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    parse: Callable[[Any], Any] | None = None
    synonyms: tuple[str, ...] = ()
    """other words a user may write for this option: never accepted, only suggested for them"""
    shared: bool = False
    """an option every engine shares (the storage backend's), suggested after the engine's own"""

    @property
    def required(self) -> bool:
        return self.default is _MISSING

    def check(self, value: Any) -> Any:
        """Return the validated value or raise ValueError saying why it is wrong."""
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        if isinstance(value, bool) and bool not in types:
            raise ValueError(f"expected {_type_names(types)}, got a boolean")
        if isinstance(value, int) and not isinstance(value, bool) and not -_INT64 <= value < _INT64:
            # TOML integers are 64-bit; larger ones overflow float() and the C libraries options reach.
            raise ValueError(f"must fit in 64 bits, got {value!r}")
        if not isinstance(value, types):
            if float in types and isinstance(value, int):
                value = float(value)
            else:
                raise ValueError(f"expected {_type_names(types)}, got {type(value).__name__} {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {value!r}")
        if self.parse is not None:
            value = self.parse(value)
        if self.choices is not None and value not in self.choices:
            raise ValueError(f"must be one of {', '.join(map(repr, self.choices))}, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise ValueError(f"must be >= {self.minimum}, got {value!r}")
        if self.maximum is not None and value > self.maximum:
            raise ValueError(f"must be <= {self.maximum}, got {value!r}")
        return value


def _type_names(types: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "a boolean",
             dict: "a table", list: "a list"}
    return " or ".join(names.get(t, t.__name__) for t in types)


@dataclass(frozen=True)
class Removed:
    """An option of an earlier version, declared in an options table beside the live ones: giving it
    is a problem that says what to write instead (``instead``: the advice, or a function of the value
    given that returns it), rather than "unknown option"."""

    instead: str | Callable[[Any], str]

    def advice(self, value: Any) -> str:
        return self.instead if isinstance(self.instead, str) else self.instead(value)


def live_options(spec: Mapping[str, "Option | Removed"]) -> dict[str, Option]:
    """The options of ``spec`` that exist (the :class:`Removed` ones left out)."""
    return {name: option for name, option in spec.items() if isinstance(option, Option)}


def validate_options(spec: Mapping[str, "Option | Removed"], raw: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Validate ``raw`` against ``spec``. Unknown, removed, missing and ill-typed options are all
    reported in one ConfigError, each at ``<path>.<option>``. Defaults fill absent options."""
    problems: list[ConfigProblem] = []
    result: dict[str, Any] = {}
    live = live_options(spec)
    for name, value in raw.items():
        declared = spec.get(name)
        if isinstance(declared, Removed):
            problems.append(ConfigProblem(f"{path}.{name}", f"option {name!r} was removed; {declared.advice(value)}"))
            continue
        if declared is None:
            problems.append(ConfigProblem(f"{path}.{name}", "unknown option" + suggest_option(name, live)
                                          + (f"; known options: {', '.join(sorted(live))}" if live else "")))
            continue
        try:
            result[name] = declared.check(value)
        except ValueError as exc:
            problems.append(ConfigProblem(f"{path}.{name}", str(exc)))
    for name, option in live.items():
        if name in raw:
            continue
        if option.required:
            problems.append(ConfigProblem(f"{path}.{name}", "required option is missing"))
        else:
            result[name] = option.default
    if problems:
        raise ConfigError(problems)
    return result
