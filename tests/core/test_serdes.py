"""Serdes: round trips and order preservation (property tests), and their errors."""

import pytest
from hypothesis import given, strategies as st

from localstate.core.policy import PluginPolicy
from localstate.core.registry import Registry
from localstate.core.serdes import BytesSerde, IntSerde, JsonSerde, PickleSerde, StringSerde
from localstate.errors import PluginRefusedError, SerdeError

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)))
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(TEXT, children, max_size=4),
                    max_leaves=12)


@given(INT64)
def test_int_round_trip(value):
    assert IntSerde().deserialize(IntSerde().serialize(value)) == value


@given(INT64, INT64)
def test_int_bytes_sort_numerically(a, b):
    serde = IntSerde()
    assert (serde.serialize(a) < serde.serialize(b)) == (a < b)


@given(TEXT, TEXT)
def test_string_round_trip_and_order(a, b):
    serde = StringSerde()
    assert serde.deserialize(serde.serialize(a)) == a
    # UTF-8 byte order equals code point order.
    assert (serde.serialize(a) < serde.serialize(b)) == (a < b)


@given(JSON)
def test_json_round_trip(value):
    serde = JsonSerde()
    assert serde.deserialize(serde.serialize(value)) == value


@given(st.binary())
def test_bytes_round_trip(value):
    assert BytesSerde().deserialize(BytesSerde().serialize(value)) == value


@pytest.mark.parametrize("serde, bad", [(IntSerde(), "7"), (IntSerde(), True), (IntSerde(), 2**63),
                                        (StringSerde(), b"x"), (BytesSerde(), "x"), (JsonSerde(), object()),
                                        (JsonSerde(), float("nan"))])
def test_wrong_type_is_a_serde_error(serde, bad):
    with pytest.raises(SerdeError) as info:
        serde.serialize(bad)
    assert serde.name in str(info.value) and "what to do" in str(info.value)


@pytest.mark.parametrize("serde, data", [(IntSerde(), b"\x00" * 7), (StringSerde(), b"\xff\xfe"),
                                         (JsonSerde(), b"{not json"), (PickleSerde(), b"garbage")])
def test_undecodable_bytes_are_a_serde_error(serde, data):
    with pytest.raises(SerdeError):
        serde.deserialize(data)


def test_pickle_needs_opt_in():
    registry = Registry(PluginPolicy())
    with pytest.raises(PluginRefusedError) as info:
        registry.serde("pickle")
    assert "allow_pickle" in str(info.value)
    assert registry.serde("pickle", allow_pickle=True).deserialize(PickleSerde().serialize({1: 2})) == {1: 2}
