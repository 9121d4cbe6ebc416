"""Windows over event time, kept as state and closed by timers (``localstate.windows``).

Tumbling, hopping and session windows (:mod:`~localstate.windows.kinds`), aggregations as
functions kept in the job's stores (:mod:`~localstate.windows.aggregations`), and the operator that
ties them to a task's timers (:class:`WindowedAggregation`). The plain-Python model every test
compares against is :mod:`localstate.windows.reference`. Guide: docs/time/windows.md.
"""

from localstate.windows.aggregations import (Aggregation, Fold, WindowState, count, distinct_count, max_of, min_of,
                                             quantiles, reduce, sum_of, top_n)
from localstate.windows.kinds import Hopping, Session, Tumbling, Window, WindowKind
from localstate.windows.operator import EMIT_MODES, WindowedAggregation, default_shape

__all__ = ["Window", "WindowKind", "Tumbling", "Hopping", "Session", "Aggregation", "Fold", "WindowState", "count",
           "sum_of", "min_of", "max_of", "reduce", "distinct_count", "quantiles", "top_n", "WindowedAggregation",
           "EMIT_MODES", "default_shape"]
