/* Sorting a bulk load's keys in C (localstate.native._sorting): core/backend.py's sorted_items (a dict's items in key order) and
 * backend.coalesce_sorted (changelog columns coalesced, last value per key, into sorted columns); and the
 * kv engine's flush, pending_items (engines/kv/engine.py, KeyValueEngine._pending_items: the pending map's
 * cache keys and held values encoded and put in stored-key order in one pass, no Python step per record).
 *
 * sorted(run.items(), key=itemgetter(0)) costs about 0.7-0.9 s for 1M keys in CPython (each of the
 * ~20M comparisons goes through bytes' rich comparison). Here: a stable radix sort on 8 bytes of each
 * key, those after the bytes all keys share ("key-000..."), then a memcmp sort of each run of keys that
 * tie on them, with the position in the input as the last tie-break. The order is bytes order (memcmp,
 * then the shorter key first), exactly Python's; equal keys stay in input order, so the last of them is
 * the latest record. The GIL is held throughout (sort_items is therefore safe as a static).
 *
 * Framed runs (a file changelog's records still in the bytes read, as spans): coalesce_sorted makes
 * objects only for the records it keeps, in key order. A restore that decoded every record first made
 * them in log order, and the key-order bulk write after the sort then missed the cache on nearly every
 * object (SstFileWriter's calls 0.74-0.90 s for 1M keys so, 0.35-0.46 s on objects made in key order).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The sort key of one item: 8 bytes of it (big endian, zero padded) and where the item is. */
typedef struct {
    uint64_t prefix;
    Py_ssize_t index;
} Slot;

typedef struct {
    const char *data;
    Py_ssize_t len;
    PyObject *key, *value; /* borrowed from the caller's dict or lists; NULL for a framed record */
    const char *value_data; /* a framed record's value bytes (value_len < 0: a tombstone) */
    Py_ssize_t value_len;
} Item;

/* Records still framed in a bytes buffer, as _framing.decode_frames describes them: four native int64
 * per record (key start, key length, value start, value length or -1 for a tombstone). */
#define SPAN_FIELDS 4

/* Whether run i of coalesce_sorted is framed: keys[i] a tuple, values[i] None. */
static int is_framed(PyObject *keys, PyObject *values) {
    return PyTuple_Check(keys) && values == Py_None;
}

/* The spans of a framed run (buffer, spans), with ``check`` each checked to lie inside the buffer
 * (without it only the run's shape: for a run checked before, bytes being immutable); their count, or
 * -1 with ValueError/TypeError set. */
static Py_ssize_t framed_run(PyObject *run, const char **buffer, const int64_t **spans, int check) {
    PyObject *data, *packed;
    if (!PyTuple_Check(run) || PyTuple_GET_SIZE(run) != 2 || !PyBytes_CheckExact(data = PyTuple_GET_ITEM(run, 0)) ||
        !PyBytes_CheckExact(packed = PyTuple_GET_ITEM(run, 1))) {
        PyErr_SetString(PyExc_TypeError, "a framed run is a tuple (buffer: bytes, spans: bytes)");
        return -1;
    }
    Py_ssize_t size = PyBytes_GET_SIZE(data), bytes = PyBytes_GET_SIZE(packed);
    if (bytes % (Py_ssize_t)(SPAN_FIELDS * sizeof(int64_t)) != 0) {
        PyErr_SetString(PyExc_ValueError, "spans: not a whole number of records");
        return -1;
    }
    Py_ssize_t n = bytes / (Py_ssize_t)(SPAN_FIELDS * sizeof(int64_t));
    const int64_t *span = (const int64_t *)PyBytes_AS_STRING(packed);
    for (Py_ssize_t i = 0; check && i < n; i++, span += SPAN_FIELDS) {
        if (span[0] < 0 || span[1] < 0 || span[0] > size - span[1] || span[3] < -1 ||
            (span[3] >= 0 && (span[2] < 0 || span[2] > size - span[3]))) {
            PyErr_Format(PyExc_ValueError, "spans: record %zd lies outside its buffer", i);
            return -1;
        }
    }
    *buffer = PyBytes_AS_STRING(data);
    *spans = (const int64_t *)PyBytes_AS_STRING(packed);
    return n;
}

/* How many records ahead the framed copy prefetches: enough to cover a cache miss. */
#define PREFETCH_AHEAD 32

/* For qsort of a run of slots with equal prefixes: the rest of the keys, the length, the position. */
static const Item *sort_items;
static Py_ssize_t sort_skip; /* bytes every key shares, plus the 8 of the prefix */

/* Bytes order of two keys whose first ``skip`` bytes are known to be equal. */
static int compare_keys(const Item *x, const Item *y, Py_ssize_t skip) {
    Py_ssize_t shorter = x->len < y->len ? x->len : y->len;
    int c = shorter > skip ? memcmp(x->data + skip, y->data + skip, (size_t)(shorter - skip)) : 0;
    if (c != 0) return c;
    return x->len < y->len ? -1 : (x->len > y->len ? 1 : 0);
}

static int compare_rest(const void *a, const void *b) {
    Py_ssize_t i = ((const Slot *)a)->index, j = ((const Slot *)b)->index;
    int c = compare_keys(&sort_items[i], &sort_items[j], sort_skip);
    if (c != 0) return c;
    return i < j ? -1 : (i > j ? 1 : 0);
}

/* LSD radix sort of the slots by prefix, one pass per byte (passes where every slot has the same
 * byte are skipped); stable, so equal prefixes keep input order until their run is sorted. */
static int radix_sort(Slot *slots, Py_ssize_t n) {
    Slot *scratch = PyMem_Malloc(sizeof(Slot) * (size_t)(n ? n : 1));
    if (scratch == NULL) return -1;
    Slot *from = slots, *to = scratch;
    for (int shift = 0; shift < 64; shift += 8) {
        Py_ssize_t counts[256] = {0};
        for (Py_ssize_t i = 0; i < n; i++) counts[(from[i].prefix >> shift) & 0xFF]++;
        if (n == 0 || counts[(from[0].prefix >> shift) & 0xFF] == n) continue;
        Py_ssize_t total = 0;
        for (int b = 0; b < 256; b++) {
            Py_ssize_t c = counts[b];
            counts[b] = total;
            total += c;
        }
        for (Py_ssize_t i = 0; i < n; i++) to[counts[(from[i].prefix >> shift) & 0xFF]++] = from[i];
        Slot *t = from;
        from = to;
        to = t;
    }
    if (from != slots) memcpy(slots, from, sizeof(Slot) * (size_t)n);
    PyMem_Free(scratch);
    return 0;
}

/* Sets items[i].data/len from its key, or raises TypeError for a key that is not exactly bytes. */
static int set_key(Item *item, PyObject *key, const char *caller) {
    if (!PyBytes_CheckExact(key)) {
        PyErr_Format(PyExc_TypeError, "%s: a key is %.80s, not bytes", caller, Py_TYPE(key)->tp_name);
        return -1;
    }
    item->data = PyBytes_AS_STRING(key);
    item->len = PyBytes_GET_SIZE(key);
    item->key = key;
    return 0;
}

/* The order of items[0..n) by key (input position breaking ties), as slots; NULL on no memory. */
static Slot *sort_order(const Item *items, Py_ssize_t n) {
    Slot *slots = PyMem_Malloc(sizeof(Slot) * (size_t)(n ? n : 1));
    if (slots == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    /* the bytes every key shares ("user-000..."): the sort keys start after them */
    Py_ssize_t shared = n ? items[0].len : 0;
    for (Py_ssize_t i = 1; i < n && shared > 0; i++) {
        Py_ssize_t b = 0, most = shared < items[i].len ? shared : items[i].len;
        while (b < most && items[i].data[b] == items[0].data[b]) b++;
        shared = b;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        const Item *item = &items[i];
        uint64_t prefix = 0;
        for (Py_ssize_t b = shared; b < shared + 8; b++)
            prefix = (prefix << 8) | (b < item->len ? (unsigned char)item->data[b] : 0);
        slots[i].prefix = prefix;
        slots[i].index = i;
    }
    if (radix_sort(slots, n) < 0) {
        PyMem_Free(slots);
        PyErr_NoMemory();
        return NULL;
    }
    /* Keys that tie on the zero-padded 8 bytes (one a prefix of the other, longer keys sharing those
     * bytes, or equal keys): the rest of the bytes, the length, then the position decide. */
    sort_items = items;
    sort_skip = shared + 8;
    for (Py_ssize_t start = 0; start < n;) {
        Py_ssize_t stop = start + 1;
        while (stop < n && slots[stop].prefix == slots[start].prefix) stop++;
        if (stop - start > 1) qsort(slots + start, (size_t)(stop - start), sizeof(Slot), compare_rest);
        start = stop;
    }
    sort_items = NULL;
    return slots;
}

PyDoc_STRVAR(sorted_items_doc,
"sorted_items(run: dict[bytes, V]) -> list[tuple[bytes, V]]\n\n"
"The items of ``run`` in key order (bytes order). TypeError if a key is not exactly bytes.");

static PyObject *sorted_items(PyObject *self, PyObject *run) {
    if (!PyDict_CheckExact(run)) {
        PyErr_SetString(PyExc_TypeError, "sorted_items takes a dict");
        return NULL;
    }
    Py_ssize_t n = PyDict_GET_SIZE(run), pos = 0, i = 0;
    Item *items = PyMem_Malloc(sizeof(Item) * (size_t)(n ? n : 1));
    Slot *slots = NULL;
    PyObject *result = NULL;
    if (items == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *key, *value;
    while (PyDict_Next(run, &pos, &key, &value)) {
        if (set_key(&items[i], key, "sorted_items") < 0) goto done;
        items[i++].value = value;
    }
    if ((slots = sort_order(items, n)) == NULL) goto done;
    result = PyList_New(n);
    if (result == NULL) goto done;
    for (i = 0; i < n; i++) {
        const Item *item = &items[slots[i].index];
        PyObject *pair = PyTuple_Pack(2, item->key, item->value);
        if (pair == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, pair);
    }
done:
    PyMem_Free(items);
    PyMem_Free(slots);
    return result;
}

PyDoc_STRVAR(coalesce_sorted_doc,
"coalesce_sorted(keys: list[list[bytes] | tuple[bytes, bytes]], values: list[list[V] | None])\n"
"    -> tuple[list[bytes], list[V], int, int, int, int]\n\n"
"Columns of records in order (record j of run i: keys[i][j] -> values[i][j]) coalesced, the last value\n"
"of each key winning, into a key column in bytes order without duplicates and its value column, with\n"
"the shortest and longest key's length, the bytes of all kept keys and bytes values (0s if empty) and\n"
"how many kept values are None (deletes).\n"
"A run may also be framed: keys[i] a tuple (buffer, spans) of _framing.decode_frames, values[i] None;\n"
"its kept records become new bytes objects (None for a tombstone), made in key order.\n"
"TypeError if a key is not exactly bytes; ValueError if a run's two columns differ in length.");

static PyObject *coalesce_sorted(PyObject *self, PyObject *args) {
    PyObject *key_runs, *value_runs;
    if (!PyArg_ParseTuple(args, "O!O!:coalesce_sorted", &PyList_Type, &key_runs, &PyList_Type, &value_runs))
        return NULL;
    Py_ssize_t runs = PyList_GET_SIZE(key_runs), n = 0;
    if (PyList_GET_SIZE(value_runs) != runs) {
        PyErr_SetString(PyExc_ValueError, "coalesce_sorted: as many value runs as key runs are needed");
        return NULL;
    }
    for (Py_ssize_t r = 0; r < runs; r++) {
        PyObject *keys = PyList_GET_ITEM(key_runs, r), *values = PyList_GET_ITEM(value_runs, r);
        if (is_framed(keys, values)) {
            const char *buffer;
            const int64_t *spans;
            Py_ssize_t count = framed_run(keys, &buffer, &spans, 1);
            if (count < 0) return NULL;
            n += count;
            continue;
        }
        if (!PyList_Check(keys) || !PyList_Check(values)) {
            PyErr_SetString(PyExc_TypeError, "coalesce_sorted: every run is a list, or a framed run with None values");
            return NULL;
        }
        if (PyList_GET_SIZE(keys) != PyList_GET_SIZE(values)) {
            PyErr_Format(PyExc_ValueError, "coalesce_sorted: run %zd has %zd keys and %zd values", r,
                         PyList_GET_SIZE(keys), PyList_GET_SIZE(values));
            return NULL;
        }
        n += PyList_GET_SIZE(keys);
    }
    Item *items = PyMem_Malloc(sizeof(Item) * (size_t)(n ? n : 1));
    Slot *slots = NULL;
    Item *ordered = NULL;
    PyObject *out_keys = NULL, *out_values = NULL, *result = NULL;
    if (items == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t i = 0;
    for (Py_ssize_t r = 0; r < runs; r++) {
        PyObject *keys = PyList_GET_ITEM(key_runs, r), *values = PyList_GET_ITEM(value_runs, r);
        if (is_framed(keys, values)) {
            const char *buffer;
            const int64_t *span;
            Py_ssize_t count = framed_run(keys, &buffer, &span, 0); /* checked in the pass above */
            if (count < 0) goto done;
            for (Py_ssize_t j = 0; j < count; j++, i++, span += SPAN_FIELDS) {
                items[i].data = buffer + span[0];
                items[i].len = (Py_ssize_t)span[1];
                items[i].key = items[i].value = NULL;
                items[i].value_data = span[3] >= 0 ? buffer + span[2] : NULL;
                items[i].value_len = (Py_ssize_t)span[3];
            }
            continue;
        }
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(keys); j++, i++) {
            if (set_key(&items[i], PyList_GET_ITEM(keys, j), "coalesce_sorted") < 0) goto done;
            items[i].value = PyList_GET_ITEM(values, j);
        }
    }
    if ((slots = sort_order(items, n)) == NULL) goto done;
    /* Equal keys are adjacent, latest last: keep a slot when the next one holds another key. */
    Py_ssize_t kept = 0;
    for (i = 0; i < n; i++) {
        if (i + 1 < n && slots[i].prefix == slots[i + 1].prefix &&
            compare_keys(&items[slots[i].index], &items[slots[i + 1].index], 0) == 0)
            continue;
        slots[kept++] = slots[i];
    }
    /* The kept items gathered in key order first, in a loop that does nothing else, so that the misses
     * of reading them from all over the item array overlap; the loop that makes objects then walks
     * them in order and fetches each one's bytes ahead. */
    if ((ordered = PyMem_Malloc(sizeof(Item) * (size_t)(kept ? kept : 1))) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < kept; i++) {
        if (i + PREFETCH_AHEAD < kept) __builtin_prefetch(&items[slots[i + PREFETCH_AHEAD].index]);
        ordered[i] = items[slots[i].index];
    }
    if ((out_keys = PyList_New(kept)) == NULL || (out_values = PyList_New(kept)) == NULL) goto done;
    /* the sizes the backends check and reserve room for, taken here where each item is at hand */
    Py_ssize_t shortest = kept ? PY_SSIZE_T_MAX : 0, longest = 0, nbytes = 0, deletes = 0;
    for (i = 0; i < kept; i++) {
        const Item *item = &ordered[i];
        if (i + PREFETCH_AHEAD < kept) {
            const Item *ahead = &ordered[i + PREFETCH_AHEAD];
            __builtin_prefetch(ahead->key != NULL ? (const void *)ahead->value : (const void *)ahead->data);
            if (ahead->key == NULL && ahead->value_len > 0) {
                __builtin_prefetch(ahead->value_data);
                __builtin_prefetch(ahead->value_data + ahead->value_len - 1);
            }
        }
        if (item->key == NULL) { /* framed: new objects, made in key order, so that the bulk write that
                                  * walks them next reads memory in order (not the log's order) */
            PyObject *key = PyBytes_FromStringAndSize(item->data, item->len);
            if (key == NULL) goto done;
            PyList_SET_ITEM(out_keys, i, key);
            PyObject *value = item->value_len >= 0 ? PyBytes_FromStringAndSize(item->value_data, item->value_len)
                                                   : (deletes++, Py_NewRef(Py_None));
            if (value == NULL) goto done;
            PyList_SET_ITEM(out_values, i, value);
            nbytes += item->len + (item->value_len > 0 ? item->value_len : 0);
        } else {
            PyList_SET_ITEM(out_keys, i, Py_NewRef(item->key));
            PyList_SET_ITEM(out_values, i, Py_NewRef(item->value));
            deletes += item->value == Py_None;
            nbytes += item->len + (PyBytes_Check(item->value) ? PyBytes_GET_SIZE(item->value) : 0);
        }
        if (item->len < shortest) shortest = item->len;
        if (item->len > longest) longest = item->len;
    }
    result = Py_BuildValue("(OOnnnn)", out_keys, out_values, shortest, longest, nbytes, deletes);
done:
    Py_XDECREF(out_keys);
    Py_XDECREF(out_values);
    PyMem_Free(ordered);
    PyMem_Free(items);
    PyMem_Free(slots);
    return result;
}

PyDoc_STRVAR(split_spans_doc,
"split_spans(buffer: bytes, spans: bytes) -> tuple[list[bytes], list[bytes | None]]\n\n"
"A framed run (see coalesce_sorted) as a key column and a value column (None for a tombstone), in\n"
"record order. ValueError if a span lies outside the buffer.");

static PyObject *split_spans(PyObject *self, PyObject *args) {
    const char *buffer;
    const int64_t *span;
    Py_ssize_t count = framed_run(args, &buffer, &span, 1);
    if (count < 0) return NULL;
    PyObject *keys = PyList_New(count), *values = PyList_New(count);
    if (keys == NULL || values == NULL) goto fail;
    for (Py_ssize_t i = 0; i < count; i++, span += SPAN_FIELDS) {
        PyObject *key = PyBytes_FromStringAndSize(buffer + span[0], (Py_ssize_t)span[1]);
        if (key == NULL) goto fail;
        PyList_SET_ITEM(keys, i, key);
        PyObject *value = span[3] >= 0 ? PyBytes_FromStringAndSize(buffer + span[2], (Py_ssize_t)span[3])
                                       : Py_NewRef(Py_None);
        if (value == NULL) goto fail;
        PyList_SET_ITEM(values, i, value);
    }
    return Py_BuildValue("(NN)", keys, values);
fail:
    Py_XDECREF(keys);
    Py_XDECREF(values);
    return NULL;
}

/* pending_items: the kv engine's flush (engines/kv/engine.py, KeyValueEngine._pending_items). */

/* How a pending map's cache keys become stored keys (KeyValueEngine._key_kind). */
enum { KEYS_BYTES = 0, KEYS_STR = 1, KEYS_INT = 2 };

/* The int serde's 8 bytes of exact int ``v``: big endian v + 2**63. */
static void pack_int(unsigned char *out, long long v) {
    unsigned long long biased = (unsigned long long)v ^ 0x8000000000000000ULL;
    for (int j = 0; j < 8; j++) out[j] = (unsigned char)(biased >> (56 - 8 * j));
}

/* Whether ``value`` is an exact int of the int serde's range; its value in *v. Clears an overflow. */
static int exact_int(PyObject *value, long long *v) {
    if (!PyLong_CheckExact(value)) return 0;
    int overflow;
    *v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (*v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return !overflow;
}

/* The stored value of a pending entry (a new reference): ``prefix`` then the int serde's bytes of
 * an int value, or then the held bytes; None for a delete. NULL with an exception set. */
static PyObject *stored_value(PyObject *value, int int_values, const char *prefix, Py_ssize_t width) {
    if (value == Py_None) return Py_NewRef(Py_None);
    if (int_values) {
        long long v;
        exact_int(value, &v); /* checked in the first pass */
        PyObject *out = PyBytes_FromStringAndSize(NULL, width + 8);
        if (out == NULL) return NULL;
        unsigned char *b = (unsigned char *)PyBytes_AS_STRING(out);
        memcpy(b, prefix, (size_t)width);
        pack_int(b + width, v);
        return out;
    }
    if (width == 0) return Py_NewRef(value);
    Py_ssize_t size = PyBytes_GET_SIZE(value);
    PyObject *out = PyBytes_FromStringAndSize(NULL, width + size);
    if (out == NULL) return NULL;
    memcpy(PyBytes_AS_STRING(out), prefix, (size_t)width);
    memcpy(PyBytes_AS_STRING(out) + width, PyBytes_AS_STRING(value), (size_t)size);
    return out;
}

PyDoc_STRVAR(pending_items_doc,
"pending_items(dirty: dict, key_kind: int, int_values: bool, prefix: bytes, with_keys: bool)\n"
"    -> tuple[list | None, list[tuple[bytes, bytes | None]]] | NotImplemented\n\n"
"A kv store's pending changes (cache key -> held value, None: a delete) encoded and in stored-key\n"
"order, in one pass: ``(cache keys or None, [(key, value), ...])``, as KeyValueEngine._pending_items\n"
"gives them. key_kind 0: the cache keys are exactly bytes, their own encoding; 1: exact str, UTF-8;\n"
"2: exact int of the int serde's range, its 8 bytes. int_values: the held values are exact ints of that\n"
"range (packed here), else exactly bytes. ``prefix`` goes before every value (a ttl store's expiry).\n"
"NotImplemented when an entry is not what the kinds promise: the caller's reference code encodes.");

static PyObject *pending_items(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5 || !PyDict_CheckExact(args[0]) || !PyLong_Check(args[1]) || !PyBytes_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "pending_items(dirty: dict, key_kind: int, int_values: bool, prefix: bytes, with_keys: bool)");
        return NULL;
    }
    PyObject *dirty = args[0], *prefix_object = args[3];
    long kind = PyLong_AsLong(args[1]);
    if (kind == -1 && PyErr_Occurred()) return NULL;
    if (kind < KEYS_BYTES || kind > KEYS_INT) {
        PyErr_SetString(PyExc_ValueError, "pending_items: key_kind is 0 (bytes), 1 (str) or 2 (int)");
        return NULL;
    }
    int int_values = PyObject_IsTrue(args[2]), with_keys = PyObject_IsTrue(args[4]);
    if (int_values < 0 || with_keys < 0) return NULL;
    const char *prefix = PyBytes_AS_STRING(prefix_object);
    Py_ssize_t width = PyBytes_GET_SIZE(prefix_object);
    Py_ssize_t n = PyDict_GET_SIZE(dirty), pos = 0, i = 0;
    Item *items = PyMem_Malloc(sizeof(Item) * (size_t)(n ? n : 1));
    unsigned char *packed = kind == KEYS_INT ? PyMem_Malloc(8 * (size_t)(n ? n : 1)) : NULL;
    PyObject **encoded = kind == KEYS_STR ? PyMem_Calloc((size_t)(n ? n : 1), sizeof(PyObject *)) : NULL;
    Slot *slots = NULL;
    PyObject *result = NULL, *pairs = NULL, *keys = NULL;
    int supported = 1;
    if (items == NULL || (kind == KEYS_INT && packed == NULL) || (kind == KEYS_STR && encoded == NULL)) {
        PyErr_NoMemory();
        goto done;
    }
    PyObject *key, *value;
    while (PyDict_Next(dirty, &pos, &key, &value)) {
        Item *item = &items[i];
        item->key = key;
        item->value = value;
        long long v;
        if (value != Py_None && !(int_values ? exact_int(value, &v) : PyBytes_CheckExact(value))) {
            supported = 0;
            break;
        }
        if (kind == KEYS_BYTES) {
            if (!PyBytes_CheckExact(key)) {
                supported = 0;
                break;
            }
            item->data = PyBytes_AS_STRING(key);
            item->len = PyBytes_GET_SIZE(key);
        } else if (kind == KEYS_STR) {
            if (!PyUnicode_CheckExact(key)) {
                supported = 0;
                break;
            }
            if (PyUnicode_IS_ASCII(key)) { /* its characters are its UTF-8 bytes */
                item->data = (const char *)PyUnicode_DATA(key);
                item->len = PyUnicode_GET_LENGTH(key);
            } else { /* encoded now (the stored key), not cached in the str */
                PyObject *bytes = PyUnicode_AsUTF8String(key);
                if (bytes == NULL) { /* a lone surrogate: the reference raises what str.encode raises */
                    PyErr_Clear();
                    supported = 0;
                    break;
                }
                encoded[i] = bytes;
                item->data = PyBytes_AS_STRING(bytes);
                item->len = PyBytes_GET_SIZE(bytes);
            }
        } else {
            if (!exact_int(key, &v)) {
                supported = 0;
                break;
            }
            pack_int(packed + 8 * i, v);
            item->data = (const char *)packed + 8 * i;
            item->len = 8;
        }
        i++;
    }
    if (!supported) {
        result = Py_NewRef(Py_NotImplemented);
        goto done;
    }
    if ((slots = sort_order(items, n)) == NULL) goto done;
    if ((pairs = PyList_New(n)) == NULL || (with_keys && (keys = PyList_New(n)) == NULL)) goto done;
    for (i = 0; i < n; i++) {
        Py_ssize_t at = slots[i].index;
        const Item *item = &items[at];
        PyObject *stored_key;
        if (kind == KEYS_BYTES)
            stored_key = Py_NewRef(item->key);
        else if (kind == KEYS_STR && encoded[at] != NULL)
            stored_key = Py_NewRef(encoded[at]);
        else
            stored_key = PyBytes_FromStringAndSize(item->data, item->len);
        if (stored_key == NULL) goto done;
        PyObject *stored = stored_value(item->value, int_values, prefix, width);
        if (stored == NULL) {
            Py_DECREF(stored_key);
            goto done;
        }
        PyObject *pair = PyTuple_New(2);
        if (pair == NULL) {
            Py_DECREF(stored_key);
            Py_DECREF(stored);
            goto done;
        }
        PyTuple_SET_ITEM(pair, 0, stored_key);
        PyTuple_SET_ITEM(pair, 1, stored);
        PyList_SET_ITEM(pairs, i, pair);
        if (keys != NULL) PyList_SET_ITEM(keys, i, Py_NewRef(item->key));
    }
    result = PyTuple_Pack(2, keys != NULL ? keys : Py_None, pairs);
done:
    Py_XDECREF(pairs);
    Py_XDECREF(keys);
    if (encoded != NULL)
        for (Py_ssize_t j = 0; j < n; j++) Py_XDECREF(encoded[j]);
    PyMem_Free(encoded);
    PyMem_Free(packed);
    PyMem_Free(items);
    PyMem_Free(slots);
    return result;
}

static PyMethodDef methods[] = {
    {"sorted_items", sorted_items, METH_O, sorted_items_doc},
    {"coalesce_sorted", coalesce_sorted, METH_VARARGS, coalesce_sorted_doc},
    {"split_spans", split_spans, METH_VARARGS, split_spans_doc},
    {"pending_items", (PyCFunction)(void (*)(void))pending_items, METH_FASTCALL, pending_items_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sorting",
    "Sorting a bulk load's keys in C (see backend.sorted_items and backend.coalesce_sorted).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sorting(void) { return PyModule_Create(&module); }
