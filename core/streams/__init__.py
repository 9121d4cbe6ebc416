"""Input and output stream systems for jobs: JSON-lines directories (``jsonl``), file-log streams in
the file changelog format (``file``), Kafka topics (``kafka``), and a deterministic ``generator`` of demo
events."""

from .base import (INPUT_SYSTEMS, ON_ERROR, OUTPUT_SYSTEMS, InputRecord, InputStream, OutputStream, open_input,
                   open_output, register_input, register_output)
from .filelog import FileLogInput, FileLogOutput, truncate_log
from .generator import GeneratorInput
from .jsonl import JsonLinesInput, JsonLinesOutput, read_jsonl, write_jsonl
from .kafka import KafkaInput, KafkaOutput
from .sink import StreamSink

__all__ = ["InputRecord", "InputStream", "OutputStream", "open_input", "open_output", "register_input",
           "register_output", "INPUT_SYSTEMS", "OUTPUT_SYSTEMS", "ON_ERROR", "StreamSink", "JsonLinesInput",
           "JsonLinesOutput", "FileLogInput", "FileLogOutput", "GeneratorInput", "KafkaInput", "KafkaOutput",
           "truncate_log", "write_jsonl", "read_jsonl"]
