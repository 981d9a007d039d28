"""The entry codec: CRC-sealed msgpack values, ordered keys, the wire form."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpeer.statemachine.entry import (
    Entry,
    EntryKind,
    decode_entry,
    decode_key,
    encode_entry,
    encode_key,
    entry_digest,
    entry_from_wire,
    entry_to_wire,
    pack_payload,
    unpack_payload,
)
from dpeer.statemachine.errors import CorruptEntry

scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=20),
                    st.binary(max_size=20), st.floats(allow_nan=False))
values = st.recursive(scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                      max_leaves=12)
payloads = st.dictionaries(st.text(max_size=10), values, max_size=5)
entries = st.builds(Entry, st.integers(1, 2**64 - 1), st.integers(0, 2**64 - 1),
                    st.sampled_from(list(EntryKind)), payloads)


@settings(max_examples=200, deadline=None)
@given(entries)
def test_value_round_trip(e: Entry) -> None:
    assert decode_entry(e.index, encode_entry(e)) == e


@settings(max_examples=300, deadline=None)
@given(entries, st.data())
def test_any_flipped_byte_is_detected(e: Entry, data: st.DataObject) -> None:
    value = bytearray(encode_entry(e))
    pos = data.draw(st.integers(0, len(value) - 1))
    value[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptEntry):
        decode_entry(e.index, bytes(value))


@settings(max_examples=100, deadline=None)
@given(entries, st.data())
def test_truncated_value_is_detected(e: Entry, data: st.DataObject) -> None:
    value = encode_entry(e)
    cut = data.draw(st.integers(0, len(value) - 1))
    with pytest.raises(CorruptEntry):
        decode_entry(e.index, value[:cut])


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1))
def test_keys_sort_like_indices(a: int, b: int) -> None:
    assert (encode_key(a) < encode_key(b)) == (a < b)
    assert decode_key(encode_key(a)) == a


@settings(max_examples=100, deadline=None)
@given(entries)
def test_wire_round_trip(e: Entry) -> None:
    index, term, kind, payload = entry_to_wire(e)
    assert isinstance(payload, bytes) and kind == e.kind.value
    assert entry_from_wire(index, term, kind, payload) == e
    assert unpack_payload(pack_payload(e.payload)) == e.payload


@pytest.mark.parametrize("args", [
    (1, 1, "no_such_kind", pack_payload({})),
    (1, 1, "noop", b"\xc1"),
    (1, 1, "noop", pack_payload({}) + b"x"),
    (0, 1, "noop", pack_payload({})),
    (1, -1, "noop", pack_payload({})),
    (1, True, "noop", pack_payload({})),
])
def test_bad_wire_fields_are_refused(args: tuple) -> None:
    with pytest.raises(CorruptEntry):
        entry_from_wire(*args)


def test_non_dict_payload_bytes_refused() -> None:
    with pytest.raises(CorruptEntry, match="dict"):
        unpack_payload(pack_payload({}).replace(b"\x80", b"\x90"))


def test_encode_refuses_bad_fields() -> None:
    with pytest.raises(ValueError):
        encode_entry(Entry(0, 1, EntryKind.NOOP, {}))
    with pytest.raises(ValueError):
        encode_entry(Entry(1, 1, EntryKind.NOOP, {1: 2}))  # type: ignore[dict-item]
    with pytest.raises(ValueError):
        encode_key(-1)


def test_decode_names_the_index() -> None:
    value = bytearray(encode_entry(Entry(42, 3, EntryKind.NOOP, {})))
    value[-1] ^= 1
    with pytest.raises(CorruptEntry, match="entry 42: CRC mismatch"):
        decode_entry(42, bytes(value))


def test_a_crc_trailer_rewritten_in_another_int_form_is_detected() -> None:
    """Found by the property above: uint32 0xce -> int32 0xd2 keeps the number and the data."""
    e = Entry(1, 90021, EntryKind.VIEW, {"\x86Î": None, "\U000f4c8b": [-129, -43598, b"", 0.0]})
    value = bytearray(encode_entry(e))
    assert value[-5] == 0xCE
    value[-5] = 0xD2
    with pytest.raises(CorruptEntry, match="CRC mismatch"):
        decode_entry(1, bytes(value))


def test_the_digest_covers_position_and_content_and_ignores_map_order() -> None:
    a = Entry(3, 2, EntryKind.VIEW, {"generation": 1, "members": ["a"], "store_host": "h:1"})
    same = Entry(3, 2, EntryKind.VIEW, {"store_host": "h:1", "members": ["a"], "generation": 1})
    assert entry_digest(a) == entry_digest(same) and len(entry_digest(a)) == 64
    others = [Entry(4, 2, a.kind, a.payload), Entry(3, 3, a.kind, a.payload),
              Entry(3, 2, a.kind, {**a.payload, "generation": 2})]
    assert len({entry_digest(e) for e in [a, *others]}) == 4
