"""The task API reference's example (examples/task_api, docs/task-api.md) keeps working."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "task_api" / "test_word_counts.py"


def test_task_api_example_unit_test_passes():
    spec = importlib.util.spec_from_file_location("task_api_example_test", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.test_counts_survive_a_crash()
