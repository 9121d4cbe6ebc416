"""Stream systems that share nothing with a changelog: JSON-lines directories (``jsonl``) and the
deterministic ``generator`` of demo events. Both are plugins of the ``localstate.streams`` group;
the contract they implement is :mod:`localstate.core.stream`."""

from .generator import GeneratorStreams
from .jsonl import JsonLinesInput, JsonLinesOutput, JsonLinesStreams, read_jsonl, write_jsonl

__all__ = ["JsonLinesStreams", "JsonLinesInput", "JsonLinesOutput", "GeneratorStreams", "read_jsonl", "write_jsonl"]
