"""The entries of the timer store: their layout, the key codec of a timer namespace, and the
migration of entries written in the layout before namespaces.

An entry's key (its value is empty) is

    domain (1 byte: b"E" event, b"P" processing) | timestamp (8 bytes, order-preserving)
        | namespace length (1 byte) | namespace (UTF-8) | key (the namespace's key serde's bytes)

so a range scan of a domain returns its timers in timestamp order across namespaces, and ties in
(namespace length, namespace, key) order. The task's own timers (``context.timers.register_*``) are
namespace ``""``: one 0 byte. Before namespaces an entry was ``b"e"/b"p" | timestamp | key``
(:func:`migrate_old_entries` rewrites those into namespace ``""``).
"""

from __future__ import annotations

import json
import json.encoder
import json.scanner
import struct
from itertools import islice, repeat
from operator import itemgetter
from typing import Any, Callable

from localstate.core.codecs import FAST_ERRORS, fast_codec
from localstate.core.serdes import JsonSerde, Serde
from localstate.core.text import a
from localstate.core.time import EVENT_TIME, PROCESSING_TIME, TIMER_STORE
from localstate.errors import ConfigError, InvalidValueError, LocalStateError

__all__ = ["PREFIX", "OLD_PREFIX", "MAX_NAMESPACE", "KeyCodec", "NamespaceTable", "encode_timestamp",
           "decode_timestamp", "split_entry", "namespace_header", "namespace_codec", "migrate_old_entries",
           "MIGRATE_CHUNK", "UNDECODED"]

PREFIX = {EVENT_TIME: b"E", PROCESSING_TIME: b"P"}
"""The first byte of each domain's entries."""
OLD_PREFIX = {EVENT_TIME: b"e", PROCESSING_TIME: b"p"}
"""The first byte of each domain's entries before namespaces (read only by the migration)."""
DOMAIN_BYTE = {domain: prefix[0] for domain, prefix in PREFIX.items()}
MAX_NAMESPACE = 255
"""The longest namespace name, in UTF-8 bytes (its length is one byte of every entry)."""
MIGRATE_CHUNK = 16384
"""Entries of the old layout read, rewritten and deleted per step of the migration."""

NAMESPACE_AT = 9
"""the index of the namespace length byte in an entry"""
SIGN = 1 << 63
ALL = (1 << 64) - 1
_u64 = struct.Struct(">Q")
_f64 = struct.Struct(">d")
pack_u64, unpack_u64, pack_f64, unpack_f64 = _u64.pack, _u64.unpack, _f64.pack, _f64.unpack
pack_head = struct.Struct(">BQB").pack
"""``pack_head(domain byte, timestamp bits, namespace length)``: an entry's first 10 bytes"""

json_str = json.encoder.encode_basestring
"""JsonSerde's text of an exact ``str`` (compact, ``ensure_ascii=False``): the C function its encoder calls"""
_json_text = json.JSONDecoder().decode
_json_scan = json.scanner.make_scanner(json.JSONDecoder())
"""``(value, end)`` of the JSON text at an index of a string: the C scanner, with no Python frame"""
first_item, _second_item = itemgetter(0), itemgetter(1)
_namespace_length = itemgetter(NAMESPACE_AT)
OWN = b"\x00"
"""the header of namespace ``""`` (the task's own timers)"""
UNDECODED = object()
"""a fired key the chunk's decoding left to the per-timer path"""


def encode_timestamp(ts: float) -> bytes:
    """8 bytes whose byte order is the numeric order of ``ts`` (IEEE 754 with the sign bit flipped
    for positives and every bit flipped for negatives)."""
    (bits,) = unpack_u64(pack_f64(ts + 0.0))  # + 0.0: -0.0 and 0.0 are one time
    return pack_u64(bits ^ ALL if bits & SIGN else bits | SIGN)


def decode_timestamp(data: bytes) -> float:
    """The inverse of :func:`encode_timestamp`."""
    (bits,) = unpack_u64(data)
    return unpack_f64(pack_u64(bits & ~SIGN if bits & SIGN else bits ^ ALL))[0]


def after(encoded: bytes) -> bytes:
    """The smallest 8-byte string greater than ``encoded``: the exclusive end of a scan up to it."""
    return pack_u64(min(unpack_u64(encoded)[0] + 1, ALL))


def decode_timestamps(entries: list[bytes]) -> tuple[float, ...]:
    """:func:`decode_timestamp` of each entry's timestamp, in three C calls and one comprehension."""
    count = len(entries)
    bits = struct.unpack(f">{count}Q", b"".join([entry[1:9] for entry in entries]))
    flipped = [b & ~SIGN if b & SIGN else b ^ ALL for b in bits]
    return struct.unpack(f">{count}d", struct.pack(f">{count}Q", *flipped))


def split_entry(entry: bytes) -> tuple[str, float, str, bytes]:
    """``(domain, timestamp, namespace, key bytes)`` of an entry (namespace ``""``: the task's own
    timers, keys in ``[time] timer_key_serde``; another namespace's keys are in its own serde)."""
    cut = NAMESPACE_AT + 1 + entry[NAMESPACE_AT]
    domain = EVENT_TIME if entry[:1] == PREFIX[EVENT_TIME] else PROCESSING_TIME
    return domain, decode_timestamp(entry[1:9]), entry[NAMESPACE_AT + 1:cut].decode("utf-8", "replace"), entry[cut:]


def json_decode(data: bytes) -> Any:
    return _json_text(data.decode("utf-8"))


def json_decode_many(texts: list[bytes]) -> list[Any]:
    """The json keys of a chunk, decoded by C-level maps (no frame per key); raises (ValueError,
    StopIteration) unless each text is exactly one JSON value."""
    strings = list(map(bytes.decode, texts))
    scanned = list(map(_json_scan, strings, repeat(0)))
    # a StopIteration inside map() ends it early: a short list is a text that is no JSON value
    if len(scanned) != len(strings) or list(map(_second_item, scanned)) != list(map(len, strings)):
        raise ValueError("not one JSON value per key")
    return list(map(first_item, scanned))


def namespace_header(name: Any, partition: int) -> bytes:
    """The bytes of namespace ``name`` in an entry (its length byte, then its UTF-8); a ConfigError
    for a name that cannot be one (not a str, empty, a NUL, longer than :data:`MAX_NAMESPACE` bytes
    or not encodable)."""
    problem = None
    if not isinstance(name, str):
        problem = f"is {a(type(name).__name__)}, not a str"
    elif not name:
        problem = "is empty (the task's own timers are the namespace without a name)"
    elif "\x00" in name:
        problem = "contains a NUL character"
    else:
        try:
            encoded = name.encode("utf-8")
        except UnicodeEncodeError as exc:
            problem = f"is not valid UTF-8 text ({exc.reason})"
        else:
            if len(encoded) > MAX_NAMESPACE:
                problem = f"is {len(encoded)} bytes long in UTF-8, more than {MAX_NAMESPACE}"
            else:
                return bytes([len(encoded)]) + encoded
    raise ConfigError.at("job.task", f"partition {partition}: timer namespace name {name!r:.300} {problem}",
                         hint=f"name a timer namespace with a non-empty str of at most {MAX_NAMESPACE} UTF-8 "
                              "bytes and no NUL, such as 'sessions'")


class KeyCodec:
    """A timer namespace's keys on the timer paths: the serde's fast encode and decode (a chunk of
    json keys decoded by C-level maps), and a typed error for a key the serde cannot encode."""

    __slots__ = ("serde", "encode", "decode", "decode_many", "json_keys", "_serde_name", "_hint", "_partition")

    def __init__(self, serde: Serde, serde_name: str, hint: str, partition: int) -> None:
        self.serde = serde
        self.encode, self.decode = fast_codec(serde)
        self.json_keys = type(serde) is JsonSerde
        """keys are JsonSerde's: an exact ``str`` is encoded inline by the caller (no frame)"""
        if self.json_keys:
            # The store holds only keys this service encoded: the serde's checks of foreign data
            # (what its serialize would refuse) cannot fail, and cost as much as the decoding.
            self.decode = json_decode
            self.decode_many: Callable[[list[bytes]], list[Any]] = json_decode_many
        else:
            decode = self.decode
            self.decode_many = lambda texts: list(map(decode, texts))
        self._serde_name, self._hint, self._partition = serde_name, hint, partition

    def slow_key(self, key: Any) -> bytes:
        """``key`` encoded by the serde itself after the fast path refused it (a typed error if it cannot)."""
        try:
            return self.serde.serialize(key)
        except Exception as exc:  # noqa: BLE001 - every serde failure is reported the same way
            raise InvalidValueError(f"cannot encode the timer key {key!r:.300} with serde {self._serde_name!r}: "
                                    f"{exc}", store=TIMER_STORE, partition=self._partition, hint=self._hint) from exc

    def decode_slow(self, data: bytes) -> Any:
        """A stored key, by the fast decoder or else the serde itself."""
        try:
            return self.decode(data)
        except FAST_ERRORS:
            return self.serde.deserialize(data)


def namespace_codec(job: Any, partition: int, name: str, spec: Any) -> KeyCodec:
    """The key codec of timer namespace ``name`` from its ``key_serde`` as the task gave it: a serde
    name (the job's registry resolves it) or a :class:`Serde`; a ConfigError for anything else."""
    if isinstance(spec, Serde):
        serde, serde_name = spec, getattr(spec, "name", type(spec).__name__)
    elif isinstance(spec, str):
        try:
            serde = job.registry.serde(spec, allow_pickle=job.allow_pickle)
        except LocalStateError as exc:
            raise ConfigError.at("job.task", f"partition {partition}: the key serde {spec!r} of timer namespace "
                                 f"{name!r}: {exc.message}", hint=exc.hint) from None
        serde_name = spec
    else:
        raise ConfigError.at("job.task", f"partition {partition}: the key_serde of timer namespace {name!r} is "
                             f"{a(type(spec).__name__)}", hint="pass a serde name such as 'json' or 'string', or a Serde")
    return KeyCodec(serde, serde_name, f"register keys serde {serde_name!r} encodes in timer namespace {name!r}, "
                    "or open it with another key_serde", partition)


def migrate_old_entries(store: Any) -> int:
    """Rewrite every entry of ``store`` still in the layout before namespaces into namespace ``""``
    and delete it, :data:`MIGRATE_CHUNK` entries a step, through the store's own ``put_many`` and
    ``delete_all``: the rewrite commits with the partition's next commit (a crash before it leaves
    the old entries, and the next open migrates them again). Crash-safe at any point, spills
    included: each step writes the new entries before it deletes the old ones, so whatever part a
    spill (and a checkpoint) covers holds every timer in one layout or both, never neither, and the
    rewrite of an entry is always the same entry (migrating it twice keeps one). Returns how many
    entries moved."""
    moved = 0
    for domain, old in OLD_PREFIX.items():
        new, start, end = PREFIX[domain], old, bytes([old[0] + 1])
        while True:
            with store.range(start, end) as entries:
                chunk = list(map(first_item, islice(entries, MIGRATE_CHUNK)))
            if not chunk:
                break
            # old: prefix | timestamp (8) | key  ->  new: prefix | timestamp | 0 (namespace "") | key
            store.put_many([new + entry[1:9] + b"\x00" + entry[9:] for entry in chunk], [b""] * len(chunk))
            store.delete_all(chunk)
            moved += len(chunk)
            start = chunk[-1] + b"\x00"
    return moved


class NamespaceTable:
    """The timer namespaces of one partition, by header: which one an entry belongs to, who fires it
    and how its key decodes. A namespace is any object with ``name``, ``header``, ``codec`` and
    ``on_fire`` (the task's own, ``own``, fires through the callback the firing passes)."""

    def __init__(self, partition: int) -> None:
        self._partition = partition
        self._by_header: dict[bytes, Any] = {}
        self.own: Any = None
        self.own_fires = False
        """the task defines ``on_timer``: its own timers have somewhere to go"""

    def get(self, header: bytes) -> Any:
        return self._by_header.get(header)

    def add(self, namespace: Any, *, own: bool = False, fires: bool = True) -> None:
        self._by_header[namespace.header] = namespace
        if own:
            self.own, self.own_fires = namespace, fires

    def handler(self, entry: bytes, own_fire: Callable[..., None]) -> Callable[..., None]:
        """Who fires ``entry``: the task's ``own_fire`` or its namespace's ``on_fire``; a ConfigError
        if nothing would (a namespace not opened since the partition opened, or own timers and no
        ``on_timer``)."""
        namespace = self._by_header.get(entry[NAMESPACE_AT:NAMESPACE_AT + 1 + entry[NAMESPACE_AT]])
        if namespace is None or (namespace is self.own and not self.own_fires):
            raise self._no_handler(entry, namespace)
        return own_fire if namespace is self.own else namespace.on_fire

    def chunk(self, scanned: list[bytes], own_fire: Callable[..., None]) -> tuple[list[Any], list[Any]]:
        """``(handlers, keys)`` of a chunk of due entries: the :meth:`handler` and the decoded key of
        each (:data:`UNDECODED`: the chunk's bulk decoding refused one; each then decodes as it fires).
        A chunk of one namespace (checked by C-level maps) is decoded in bulk; a chunk of several
        namespaces key by key as each fires. Raises before returning if any entry has no handler."""
        if not scanned:
            return [], []
        first, count = scanned[0], len(scanned)
        cut = NAMESPACE_AT + 1 + first[NAMESPACE_AT]
        if cut == NAMESPACE_AT + 1:  # the task's own first: all own if no entry has a namespace length
            one = not any(map(_namespace_length, scanned))
        else:
            one = len(set(map(itemgetter(slice(NAMESPACE_AT, cut)), scanned))) == 1
        if one:  # one namespace: the common chunk
            handler = self.handler(first, own_fire)
            try:
                keys = self._by_header[first[NAMESPACE_AT:cut]].codec.decode_many([entry[cut:] for entry in scanned])
            except (*FAST_ERRORS, StopIteration):
                keys = [UNDECODED] * count  # one refused: each decoded as it fires
            return [handler] * count, keys
        return [self.handler(entry, own_fire) for entry in scanned], [UNDECODED] * count

    def decode(self, entry: bytes) -> Any:
        """The key of ``entry`` (of a namespace :meth:`handler` found)."""
        cut = NAMESPACE_AT + 1 + entry[NAMESPACE_AT]
        return self._by_header[entry[NAMESPACE_AT:cut]].codec.decode_slow(entry[cut:])

    def _no_handler(self, entry: bytes, namespace: Any) -> ConfigError:
        domain, timestamp, name, _key = split_entry(entry)
        if namespace is not None:  # the task's own timer, and no on_timer
            try:
                key = repr(self.decode(entry))
            except Exception:  # noqa: BLE001 - the message names the key when it can
                key = f"(undecodable: {entry[NAMESPACE_AT + 1:]!r:.100})"
            return ConfigError.at("job.task", f"partition {self._partition}: the task's {domain}-time timer for key "
                                  f"{key:.300} at {timestamp!r} is due, but the task does not define on_timer() (a "
                                  "timer registered through context.timers, or by a WindowedAggregation before timer "
                                  "namespaces, fires through it)",
                                  hint="define on_timer(self, key, timestamp, collector, coordinator) in the task; "
                                       "for the timers of a WindowedAggregation from before timer namespaces, "
                                       "forward to its on_timer(key, timestamp, collector)")
        return ConfigError.at("job.task", f"partition {self._partition}: {a(domain)}-time timer of timer namespace "
                              f"{name!r} at {timestamp!r} is due, but the task has not opened that namespace "
                              "(context.timers.namespace(name, on_fire)) since the partition opened",
                              hint="open every timer namespace the stored timers use in the task's init() (a "
                                   "WindowedAggregation opens 'windows:<store>' when it is constructed); to drop "
                                   "a namespace's timers, open it with an on_fire that does nothing")
