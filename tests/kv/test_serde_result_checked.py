"""A custom serde whose serialize() returns something other than bytes (None, str) is refused at
put/delete with a typed SerdeError, before anything reaches the changelog (it used to surface at
flush, after a tombstone-looking record was logged)."""

from __future__ import annotations

from typing import Any

import pytest

from localstate.core.serdes import JsonSerde, Serde, StringSerde
from localstate.errors import SerdeError


class NoneSerde(Serde[Any]):
    name = "none-returning"

    def __init__(self, result: Any = None) -> None:
        self.result = result

    def serialize(self, obj: Any) -> bytes:
        return self.result

    def deserialize(self, data: bytes) -> Any:
        return data


@pytest.mark.parametrize("result", [None, "text", 7, ["b"]])
def test_value_serde_returning_non_bytes_fails_at_put(opener, result) -> None:  # noqa: ANN001
    kv = opener(StringSerde(), NoneSerde(result))
    with pytest.raises(SerdeError) as info:
        kv.put("k", {"x": 1})
    assert "returned" in str(info.value) and info.value.context["store"] == "teststore"
    kv.flush()
    assert list(opener.changelog.read(0)) == []  # nothing was logged
    assert kv.get("k") is None


@pytest.mark.parametrize("result", [None, "text"])
def test_key_serde_returning_non_bytes_fails_at_put_and_delete(opener, result) -> None:  # noqa: ANN001
    kv = opener(NoneSerde(result), JsonSerde())
    with pytest.raises(SerdeError):
        kv.put("k", 1)
    with pytest.raises(SerdeError):
        kv.delete("k")
    kv.flush()
    assert list(opener.changelog.read(0)) == []


def test_bytearray_result_is_accepted(opener) -> None:  # noqa: ANN001
    kv = opener(StringSerde(), NoneSerde(bytearray(b"v")))
    kv.put("k", "anything")
    kv.flush()
    assert [(r.key, r.value) for r in opener.changelog.read(0)] == [(b"k", b"v")]
