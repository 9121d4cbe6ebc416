"""Declarative, typed plugin options. A plugin declares ``options = {"name": Option(...)}``;
:func:`validate_options` checks a raw TOML table against it and reports every problem with its
config path (for example ``stores.counts.cache_size``)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from localstate.errors import ConfigError, ConfigProblem

__all__ = ["Option", "validate_options", "parse_size", "parse_duration", "did_you_mean"]

_MISSING = object()


def did_you_mean(name: str, choices: Sequence[str]) -> str:
    """Return ' (did you mean X?)' when a close match exists, else ''."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
               "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30}


def parse_size(value: Any) -> int:
    """Parse a byte size: an int, or a string like '64MB' / '512 KiB'. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError("expected a size, got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("size must not be negative")
        return value
    if isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(digits):]
        if digits and unit in _SIZE_UNITS:
            return int(float(digits) * _SIZE_UNITS[unit])
    raise ValueError(f"expected a size such as 1048576 or '64MB', got {value!r}")


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> float:
    """Parse a duration in seconds: a number, or a string like '250ms', '10s', '5m', '1h'."""
    if isinstance(value, bool):
        raise ValueError("expected a duration, got a boolean")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError("duration must not be negative")
        return float(value)
    if isinstance(value, str):
        text = value.strip().lower()
        for unit in sorted(_DURATION_UNITS, key=len, reverse=True):
            if text.endswith(unit):
                number = text[: -len(unit)].strip()
                try:
                    return float(number) * _DURATION_UNITS[unit]
                except ValueError:
                    break
    raise ValueError(f"expected a duration such as 10, '250ms', '10s' or '5m', got {value!r}")


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

    @property
    def required(self) -> bool:
        return self.default is _MISSING

    def check(self, value: Any) -> Any:
        """Return the validated value or raise ValueError saying why it is wrong."""
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        if isinstance(value, bool) and bool not in types:
            raise ValueError(f"expected {_type_names(types)}, got a boolean")
        if not isinstance(value, types):
            if float in types and isinstance(value, int):
                value = float(value)
            else:
                raise ValueError(f"expected {_type_names(types)}, got {type(value).__name__} {value!r}")
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


def validate_options(spec: Mapping[str, Option], raw: Mapping[str, Any], path: str) -> dict[str, Any]:
    """Validate ``raw`` against ``spec``. Unknown, missing and ill-typed options are all reported
    in one ConfigError, each at ``<path>.<option>``. Defaults fill absent options."""
    problems: list[ConfigProblem] = []
    result: dict[str, Any] = {}
    for name, value in raw.items():
        if name not in spec:
            problems.append(ConfigProblem(f"{path}.{name}", "unknown option" + did_you_mean(name, list(spec))
                                          + (f"; known options: {', '.join(sorted(spec))}" if spec else "")))
            continue
        try:
            result[name] = spec[name].check(value)
        except ValueError as exc:
            problems.append(ConfigProblem(f"{path}.{name}", str(exc)))
    for name, option in spec.items():
        if name in raw:
            continue
        if option.required:
            problems.append(ConfigProblem(f"{path}.{name}", "required option is missing"))
        else:
            result[name] = option.default
    if problems:
        raise ConfigError(problems)
    return result
