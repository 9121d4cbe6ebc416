"""What a window aggregation needs of the job's stores, checked against the job's store configs
before any record is processed: by ``localstate validate`` and ``localstate run`` for the windows a
task's source declares (:func:`declared_windows`), and by the operator itself when the task's
``init()`` builds it (for windows the source does not spell out).

A need is generated from declarations, never listed here: the aggregation's engine and kind
(:attr:`Aggregation.engine`, :attr:`Aggregation.kind`), what it puts through the store's serdes
(:meth:`Aggregation.needs`), and what each serde holds (:attr:`Serde.holds`,
:attr:`Serde.keeps_prefixes`)."""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from localstate.core.engine import SerdeUse
from localstate.core.text import a
from localstate.errors import ConfigError, ConfigProblem, LocalStateError
from localstate.windows.aggregations import (Aggregation, count, distinct_count, max_of, min_of, quantiles, reduce,
                                             sum_of, top_n)

__all__ = ["WindowUse", "store_problems", "check_stores", "declared_windows", "SESSION_INDEX"]

SESSION_INDEX = {"key": SerdeUse("keys of the open sessions", (str,)), "value": SerdeUse("open sessions", (list,))}
"""What a session window keeps in its ``index_store`` (a kv store): per key, the list of its open sessions."""


@dataclass(frozen=True)
class WindowUse:
    """One windowed aggregation of a task: its aggregation, kept in ``store``; ``aligned``: tumbling
    or hopping (False: sessions, which also keep ``index_store``); ``where``: the source line, for
    messages."""

    aggregation: Aggregation
    store: str
    aligned: bool
    index_store: str | None = None
    where: str = ""


def store_problems(use: WindowUse, job: Any) -> list[ConfigProblem]:
    """Why the job's stores (``job.stores``, serdes from ``job.registry``) cannot keep ``use``:
    an undeclared store, another engine or kind, a serde that cannot hold what the aggregation puts
    through it. Empty when they can."""
    at = f" ({use.where})" if use.where else ""
    who = f"the {use.aggregation.name or type(use.aggregation).__name__} window aggregation{at}"
    problems = _store_problems(who, use.store, use.aggregation.engine, use.aggregation.kind,
                               use.aggregation.needs(use.aligned), job)
    if not use.aligned:
        index = use.index_store or use.store
        problems += _store_problems(f"{who}, for its open sessions", index, "kv", None, SESSION_INDEX, job)
    return problems


def _store_problems(who: str, name: str, engine: str, kind: str | None, needs: Mapping[str, SerdeUse],
                    job: Any) -> list[ConfigProblem]:
    store = job.stores.get(name)
    if store is None:
        return [ConfigProblem(f"stores.{name}", f"{who} keeps its state in store {name!r}, which the job does not "
                                                f"declare (add a [stores.{name}] table with engine = {engine!r})")]
    if store.engine != engine:
        return [ConfigProblem(f"stores.{name}.engine", f"{who} keeps its state in store {name!r}, which must be "
                                                       f"{a(engine)} store; it is {a(store.engine)} store")]
    if kind is not None and store.options.get("kind") != kind:
        return [ConfigProblem(f"stores.{name}.kind", f"{who} keeps its state in store {name!r}, which must have "
                                                     f"kind = {kind!r}; it has kind = {store.options.get('kind')!r}")]
    problems = []
    for role, need in needs.items():
        serde_name = getattr(store, f"{role}_serde")
        try:
            serde = job.registry.serde(serde_name, allow_pickle=True)
        except LocalStateError:
            continue  # a serde that does not load is reported at the store already
        problem = need.problem(serde)
        if problem is not None:
            fix = ' key_serde = "string"' if role == "key" else f" {a(role + '_serde')} that holds them"
            problems.append(ConfigProblem(f"stores.{name}.{role}_serde",
                                          f"{who} keeps {need.what} in store {name!r}: {problem} (use{fix})"))
    return problems


def check_stores(use: WindowUse, job: Any) -> None:
    """Raise :class:`ConfigError` with :func:`store_problems`, if any."""
    problems = store_problems(use, job)
    if problems:
        raise ConfigError(problems, source=getattr(job, "source", None),
                          hint="give each window aggregation a store of the engine, kind and serdes it needs "
                               "(docs/time/windows.md, \"Aggregations\")")


# -- the windows a task's source declares ------------------------------------------------------------

#: The aggregation functions of :mod:`localstate.windows`, by name, called with placeholder
#: arguments: what an aggregation needs of its store does not depend on them.
_AGGREGATIONS: dict[str, Callable[[], Aggregation]] = {
    "count": count, "sum_of": sum_of, "min_of": min_of, "max_of": max_of, "reduce": lambda: reduce(max),
    "distinct_count": distinct_count, "quantiles": lambda: quantiles([0.5]), "top_n": lambda: top_n(1),
}
_WINDOWS = {"Tumbling": True, "Hopping": True, "Session": False}


def declared_windows(task_class: type) -> list[WindowUse]:
    """The windowed aggregations ``task_class``'s source builds with a literal store name and a
    window and aggregation of :mod:`localstate.windows` written in the call (``WindowedAggregation(
    context, Tumbling("1h"), count(), store="counts", ...)``). Others (built elsewhere, from
    variables) are checked when ``init()`` builds them. Never runs the task's code."""
    try:
        lines, first = inspect.getsourcelines(task_class)
        tree = ast.parse(textwrap.dedent("".join(lines)))
        filename = inspect.getsourcefile(task_class) or "?"
    except (OSError, TypeError, SyntaxError):
        return []
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _called(node.func) == "WindowedAggregation"):
            continue
        window, aggregate = _argument(node, 1, "window"), _argument(node, 2, "aggregate")
        store, index = _argument(node, None, "store"), _argument(node, None, "index_store")
        aligned = _WINDOWS.get(_called(window.func)) if isinstance(window, ast.Call) else None
        make = _AGGREGATIONS.get(_called(aggregate.func)) if isinstance(aggregate, ast.Call) else None
        if aligned is None or make is None or not _literal(store) or (index is not None and not _literal(index)):
            continue
        found.append(WindowUse(make(), store.value, aligned, index.value if index is not None else None,
                               where=f"{Path(filename).name}:{first + node.lineno - 1}"))
    return found


def _called(func: ast.expr) -> str | None:
    """``f`` of ``f(...)`` or ``module.f(...)``."""
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _argument(call: ast.Call, position: int | None, keyword: str) -> ast.expr | None:
    for item in call.keywords:
        if item.arg == keyword:
            return item.value
    return call.args[position] if position is not None and position < len(call.args) else None


def _literal(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)
