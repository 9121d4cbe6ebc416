"""The stream contract for job inputs and outputs: :class:`InputStream`, :class:`OutputStream`,
:class:`InputRecord`, :class:`StreamSystem` (the plugin a stream system registers under the
``localstate.streams`` entry-point group), :func:`open_input` / :func:`open_output` (resolved through
the job's plugin registry), ``on_error`` policies and the :class:`StreamSink` tasks write through.

The systems themselves live next to what they share code with: ``localstate.streams`` (``jsonl``,
``generator``), ``localstate.changelog.file.streams`` (``file``), ``localstate.changelog.kafka.streams``
(``kafka``)."""

from .base import ON_ERROR, IdentifiedInput, InputRecord, InputStream, OutputStream, PendingTail, RetainedStart, \
    StreamSystem, open_input, open_output

__all__ = ["InputRecord", "InputStream", "OutputStream", "StreamSystem", "open_input", "open_output", "ON_ERROR",
           "StreamSink", "PendingTail", "RetainedStart", "IdentifiedInput"]
