/* The changelog record framing in C: the per-record loops of encode_into, walk, split_point (where a
 * flush cuts a run at a segment's end) and the restore decoders (decode_columns, decode_records,
 * decode_frames) of localstate.changelog.framing, which cost 0.5-0.8 us a record in CPython.
 *
 * The record format is defined in changelog/framing.py (its module docstring); the functions here
 * produce and accept exactly that, and behave exactly as the Python versions there (py_encode_into,
 * py_walk, py_split_point, py_decode_columns, py_decode), which stay the reference (tests/native/test_differential.py
 * runs both on the same input and compares). Integers are written and read byte by byte, little
 * endian, so the code does not depend on the host's byte order.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <zlib.h>

#define HEADER_SIZE 28 /* crc u32, offset u64, ts_ms i64, klen u32, vlen i32 */
#define TOMBSTONE (-1)
#define MAX_KEY 0xFFFFFFFFULL
#define MAX_VALUE 0x7FFFFFFFLL

static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t get_u64(const unsigned char *p) {
    return (uint64_t)get_u32(p) | ((uint64_t)get_u32(p + 4) << 32);
}

/* crc32 over a length that may exceed zlib's uInt. */
static uint32_t crc_of(const unsigned char *p, Py_ssize_t n) {
    uLong crc = crc32(0L, Z_NULL, 0);
    while (n > 0) {
        uInt chunk = n > (Py_ssize_t)0x40000000 ? 0x40000000u : (uInt)n;
        crc = crc32(crc, p, chunk);
        p += chunk;
        n -= chunk;
    }
    return (uint32_t)crc;
}

/* One record's key and value while the batch is framed: bytes are read in place (the list of
 * records keeps them alive, and they are immutable); other bytes-like objects through a buffer. */
typedef struct {
    const char *key, *value; /* value NULL: a tombstone */
    Py_ssize_t key_len, value_len;
    Py_buffer key_view, value_view;
    char key_viewed, value_viewed;
} Parts;

static void release_parts(Parts *parts, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; i++) {
        if (parts[i].key_viewed) PyBuffer_Release(&parts[i].key_view);
        if (parts[i].value_viewed) PyBuffer_Release(&parts[i].value_view);
    }
}

/* Point at one bytes-like object: 0, or -1 with a TypeError set. */
static int take_bytes(PyObject *obj, const char **data, Py_ssize_t *len, Py_buffer *view, char *viewed,
                      const char *what) {
    *viewed = 0;
    if (PyBytes_CheckExact(obj)) {
        *data = PyBytes_AS_STRING(obj);
        *len = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (PyObject_GetBuffer(obj, view, PyBUF_SIMPLE) < 0) {
        PyErr_Format(PyExc_TypeError, "a changelog %s must be bytes, not %.80s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    *viewed = 1;
    *data = view->buf;
    *len = view->len;
    return 0;
}

/* Take one item of the records: a (key, value) pair, key bytes-like, value bytes-like or None.
 * Returns 0, or -1 with an exception set (TypeError, ValueError, OverflowError) and nothing held. */
static int take_parts(PyObject *item, Parts *out) {
    PyObject *key, *value, *seq = NULL;
    if (PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 2) {
        key = PyTuple_GET_ITEM(item, 0);
        value = PyTuple_GET_ITEM(item, 1);
    } else {
        seq = PySequence_Fast(item, "a changelog record must be a (key, value) pair");
        if (seq == NULL) return -1;
        if (PySequence_Fast_GET_SIZE(seq) != 2) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "a changelog record must be a (key, value) pair");
            return -1;
        }
        key = PySequence_Fast_GET_ITEM(seq, 0);
        value = PySequence_Fast_GET_ITEM(seq, 1);
    }
    int rc = -1;
    out->value = NULL;
    out->value_len = 0;
    out->value_viewed = 0;
    if (take_bytes(key, &out->key, &out->key_len, &out->key_view, &out->key_viewed, "key") < 0) goto done;
    if (value != Py_None &&
        take_bytes(value, &out->value, &out->value_len, &out->value_view, &out->value_viewed, "value") < 0) {
        release_parts(out, 1);
        goto done;
    }
    if ((unsigned long long)out->key_len > MAX_KEY || (long long)out->value_len > MAX_VALUE) {
        PyErr_SetString(PyExc_OverflowError, "changelog record too long: keys < 4 GiB, values < 2 GiB");
        release_parts(out, 1);
        goto done;
    }
    rc = 0;
done:
    Py_XDECREF(seq);
    return rc;
}

PyDoc_STRVAR(encode_into_doc,
"encode_into(buf, records, offset, ts_ms) -> next offset\n\n"
"format.encode_into in C: append ``records`` ((key, value) pairs; value None is a tombstone) to the\n"
"bytearray ``buf``, numbered from ``offset``. On a bad record (not bytes, too long, not a pair) the\n"
"records before it stay in ``buf``, whole, and the error (TypeError/ValueError/OverflowError) is raised.");

/* The items of ``records`` as a new list, up to the first item the iteration fails on: then
 * ``*failed`` is 1 and that exception is left set (the items before it are still framed). */
static PyObject *collect(PyObject *records, int *failed) {
    *failed = 0;
    if (PyList_CheckExact(records) || PyTuple_CheckExact(records)) return PySequence_List(records);
    PyObject *iterator = PyObject_GetIter(records);
    if (iterator == NULL) return NULL;
    PyObject *list = PyList_New(0), *item;
    if (list == NULL) {
        Py_DECREF(iterator);
        return NULL;
    }
    while ((item = PyIter_Next(iterator)) != NULL) {
        int rc = PyList_Append(list, item);
        Py_DECREF(item);
        if (rc < 0) {
            Py_DECREF(list);
            Py_DECREF(iterator);
            return NULL;
        }
    }
    Py_DECREF(iterator);
    if (PyErr_Occurred()) *failed = 1;
    return list;
}

static PyObject *encode_into(PyObject *self, PyObject *args) {
    PyObject *buf, *records, *offset_obj;
    long long ts_ms;
    if (!PyArg_ParseTuple(args, "O!OO!L:encode_into", &PyByteArray_Type, &buf, &records, &PyLong_Type,
                          &offset_obj, &ts_ms))
        return NULL;
    unsigned long long offset = PyLong_AsUnsignedLongLong(offset_obj);
    if (offset == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    int iteration_failed;
    PyObject *list = collect(records, &iteration_failed);
    if (list == NULL) return NULL;
    PyObject *failure_type = NULL, *failure_value = NULL, *failure_tb = NULL;
    if (iteration_failed) PyErr_Fetch(&failure_type, &failure_value, &failure_tb);
    Py_ssize_t count = PyList_GET_SIZE(list);
    Parts *parts = PyMem_Malloc(sizeof(Parts) * (size_t)(count ? count : 1));
    if (parts == NULL) {
        Py_DECREF(list);
        Py_XDECREF(failure_type);
        Py_XDECREF(failure_value);
        Py_XDECREF(failure_tb);
        return PyErr_NoMemory();
    }
    /* Pass 1: hold every record's buffers and add up the size, up to the first bad record. */
    Py_ssize_t good = 0, extra = 0;
    for (; good < count; good++) {
        if (offset + (unsigned long long)good < offset) { /* the u64 offset field would wrap */
            PyErr_SetString(PyExc_OverflowError, "changelog offset out of range");
            break;
        }
        if (take_parts(PyList_GET_ITEM(list, good), &parts[good]) < 0) break;
        Py_ssize_t size = HEADER_SIZE + parts[good].key_len + parts[good].value_len;
        if (extra > PY_SSIZE_T_MAX - size) {
            release_parts(parts + good, 1);
            PyErr_NoMemory();
            break;
        }
        extra += size;
    }
    if (good < count) { /* this record's error replaces an iteration error after it */
        Py_XDECREF(failure_type);
        Py_XDECREF(failure_value);
        Py_XDECREF(failure_tb);
        PyErr_Fetch(&failure_type, &failure_value, &failure_tb);
    }
    /* Pass 2: frame the good records after one resize of buf. */
    Py_ssize_t start = PyByteArray_GET_SIZE(buf);
    if (extra && PyByteArray_Resize(buf, start + extra) < 0) {
        release_parts(parts, good);
        PyMem_Free(parts);
        Py_DECREF(list);
        Py_XDECREF(failure_type);
        Py_XDECREF(failure_value);
        Py_XDECREF(failure_tb);
        return NULL;
    }
    unsigned char *out = (unsigned char *)PyByteArray_AS_STRING(buf) + start;
    for (Py_ssize_t i = 0; i < good; i++) {
        Parts *p = &parts[i];
        unsigned char *rec = out;
        put_u64(rec + 4, (uint64_t)offset);
        put_u64(rec + 12, (uint64_t)ts_ms);
        put_u32(rec + 20, (uint32_t)p->key_len);
        put_u32(rec + 24, p->value != NULL ? (uint32_t)p->value_len : (uint32_t)TOMBSTONE);
        memcpy(rec + HEADER_SIZE, p->key, (size_t)p->key_len);
        Py_ssize_t size = HEADER_SIZE + p->key_len;
        if (p->value != NULL) {
            memcpy(rec + size, p->value, (size_t)p->value_len);
            size += p->value_len;
        }
        put_u32(rec, crc_of(rec + 4, size - 4));
        out += size;
        offset++;
    }
    release_parts(parts, good);
    PyMem_Free(parts);
    Py_DECREF(list);
    if (failure_type != NULL) {
        PyErr_Restore(failure_type, failure_value, failure_tb);
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(offset);
}

/* Where a record's value is put, per decoder: two lists, one record object each, or its span. */
typedef struct {
    PyObject *keys, *values;   /* decode_columns */
    PyObject *records;         /* decode_records */
    PyTypeObject *record_type; /* decode_records: ChangelogRecord and its three slot descriptors */
    PyObject *key_slot, *value_slot, *offset_slot;
    int64_t *spans;            /* decode_frames: 4 per record (key start, key length, value start, value
                                * length or -1 for a tombstone), in spans_used of spans_room */
    Py_ssize_t spans_used, spans_room;
} Sink;

/* decode_frames: one record's span appended; 0, or -1 with MemoryError set. */
static int add_span(Sink *sink, Py_ssize_t key, Py_ssize_t klen, Py_ssize_t value, Py_ssize_t vlen) {
    if (sink->spans_used + 4 > sink->spans_room) {
        Py_ssize_t room = sink->spans_room ? 2 * sink->spans_room : 4096;
        int64_t *grown = PyMem_Realloc(sink->spans, sizeof(int64_t) * (size_t)room);
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        sink->spans = grown;
        sink->spans_room = room;
    }
    int64_t *span = sink->spans + sink->spans_used;
    span[0] = key;
    span[1] = klen;
    span[2] = value;
    span[3] = vlen;
    sink->spans_used += 4;
    return 0;
}

static int set_slot(PyObject *slot, PyObject *record, PyObject *value) {
    descrsetfunc set = Py_TYPE(slot)->tp_descr_set;
    if (set == NULL) {
        PyErr_SetString(PyExc_TypeError, "decode_records needs the record class's slot descriptors");
        return -1;
    }
    return set(slot, record, value);
}

/* Add one record to the sink; 0, or -1 with an exception set. */
static int emit(Sink *sink, PyObject *key, PyObject *value, uint64_t off) {
    if (sink->records == NULL) {
        if (PyList_Append(sink->keys, key) < 0) return -1;
        return PyList_Append(sink->values, value);
    }
    PyObject *record = sink->record_type->tp_alloc(sink->record_type, 0);
    if (record == NULL) return -1;
    PyObject *offset = PyLong_FromUnsignedLongLong(off);
    int rc = offset == NULL ? -1 : 0;
    if (rc == 0) rc = set_slot(sink->key_slot, record, key);
    if (rc == 0) rc = set_slot(sink->value_slot, record, value);
    if (rc == 0) rc = set_slot(sink->offset_slot, record, offset);
    if (rc == 0) rc = PyList_Append(sink->records, record);
    Py_XDECREF(offset);
    Py_DECREF(record);
    return rc;
}

/* The loop of the decoders (framing.decode_records, decode_columns and decode_frames): the records from byte *i on
 * that start before limit, are complete, pass their crc and have expected <= offset < stop (no stop
 * when no_stop), stopping before the first that does not. Advances *i and *expected. */
static int decode_loop(const unsigned char *buf, Py_ssize_t n, Py_ssize_t *i, Py_ssize_t limit,
                       unsigned long long *expected, unsigned long long stop, int no_stop, Sink *sink) {
    if (limit > n - HEADER_SIZE + 1) limit = n - HEADER_SIZE + 1; /* never read a partial header */
    Py_ssize_t pos = *i;
    while (pos >= 0 && pos < limit) {
        const unsigned char *rec = buf + pos;
        uint32_t crc = get_u32(rec);
        uint64_t off = get_u64(rec + 4);
        uint32_t klen = get_u32(rec + 20);
        int32_t vlen = (int32_t)get_u32(rec + 24);
        /* as the Python version: a negative length other than -1 frames no value bytes, reads as None */
        Py_ssize_t kend = pos + HEADER_SIZE + (Py_ssize_t)klen;
        Py_ssize_t end = vlen > 0 ? kend + vlen : kend;
        if (end > n || crc_of(rec + 4, end - pos - 4) != crc || !(*expected <= off && (no_stop || off < stop)))
            break;
        if (sink->keys == NULL && sink->records == NULL) { /* decode_frames: no objects */
            if (add_span(sink, pos + HEADER_SIZE, (Py_ssize_t)klen, kend, vlen >= 0 ? end - kend : -1) < 0) return -1;
            *expected = off + 1;
            pos = end;
            continue;
        }
        PyObject *key = PyBytes_FromStringAndSize((const char *)buf + pos + HEADER_SIZE, (Py_ssize_t)klen);
        if (key == NULL) return -1;
        PyObject *value = vlen >= 0 ? PyBytes_FromStringAndSize((const char *)buf + kend, end - kend)
                                    : Py_NewRef(Py_None);
        int rc = value == NULL ? -1 : emit(sink, key, value, off);
        Py_DECREF(key);
        Py_XDECREF(value);
        if (rc < 0) return -1;
        *expected = off + 1;
        pos = end;
    }
    *i = pos;
    return 0;
}

/* ``stop`` as a u64: the readers' _NO_STOP (2**64) and beyond set *no_stop; a negative one is 0. */
static int parse_stop(PyObject *stop_obj, unsigned long long *stop, int *no_stop) {
    *no_stop = 0;
    *stop = PyLong_AsUnsignedLongLong(stop_obj);
    if (!(*stop == (unsigned long long)-1 && PyErr_Occurred())) return 0;
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
    PyErr_Clear();
    PyObject *zero = PyLong_FromLong(0);
    int negative = zero == NULL ? -1 : PyObject_RichCompareBool(stop_obj, zero, Py_LT);
    Py_XDECREF(zero);
    if (negative < 0) return -1;
    *no_stop = !negative;
    *stop = 0;
    return 0;
}

PyDoc_STRVAR(decode_columns_doc,
"decode_columns(buf, i, limit, expected, stop) -> (keys, values, position, expected)\n\n"
"framing.decode_columns in C: decode the records from byte ``i`` on that start before ``limit``,\n"
"are complete, pass their crc and have ``expected <= offset < stop``, into a list of keys and a list of\n"
"values (None for a tombstone); stop before the first record that does not. A ``limit`` past the\n"
"last whole header is taken as that header's position.");

static PyObject *decode_columns(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t i, limit;
    unsigned long long expected, stop;
    PyObject *stop_obj;
    int no_stop;
    if (!PyArg_ParseTuple(args, "y*nnKO!:decode_columns", &view, &i, &limit, &expected, &PyLong_Type, &stop_obj))
        return NULL;
    Sink sink = {PyList_New(0), PyList_New(0), NULL, NULL, NULL, NULL, NULL, NULL, 0, 0};
    if (sink.keys == NULL || sink.values == NULL || parse_stop(stop_obj, &stop, &no_stop) < 0 ||
        decode_loop(view.buf, view.len, &i, limit, &expected, stop, no_stop, &sink) < 0) {
        Py_XDECREF(sink.keys);
        Py_XDECREF(sink.values);
        PyBuffer_Release(&view);
        return NULL;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(NNnK)", sink.keys, sink.values, i, expected);
}

PyDoc_STRVAR(decode_frames_doc,
"decode_frames(buf, i, limit, expected, stop) -> (spans, count, position, expected)\n\n"
"decode_columns without objects: the same records, checked alike, as their spans in ``buf`` (bytes):\n"
"``spans`` packs four native int64 per record (key start, key length, value start, value length or -1\n"
"for a tombstone), ``count`` records. localstate.native._sorting reads them (coalesce_sorted, split_spans).");

static PyObject *decode_frames(PyObject *self, PyObject *args) {
    PyObject *data, *stop_obj;
    Py_ssize_t i, limit;
    unsigned long long expected, stop;
    int no_stop;
    if (!PyArg_ParseTuple(args, "O!nnKO!:decode_frames", &PyBytes_Type, &data, &i, &limit, &expected, &PyLong_Type,
                          &stop_obj))
        return NULL;
    Sink sink = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0};
    PyObject *spans = NULL;
    if (parse_stop(stop_obj, &stop, &no_stop) == 0 &&
        decode_loop((const unsigned char *)PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data), &i, limit, &expected,
                    stop, no_stop, &sink) == 0)
        spans = PyBytes_FromStringAndSize((const char *)sink.spans, (Py_ssize_t)sizeof(int64_t) * sink.spans_used);
    PyMem_Free(sink.spans);
    if (spans == NULL) return NULL;
    return Py_BuildValue("(NnnK)", spans, sink.spans_used / 4, i, expected);
}

PyDoc_STRVAR(decode_records_doc,
"decode_records(buf, i, limit, expected, stop, record_type, key_slot, value_slot, offset_slot)\n"
"    -> (records, position, expected)\n\n"
"framing.decode_records in C: as decode_columns, into one ``record_type`` object per record, made without\n"
"calling its __init__ and filled through its slot descriptors (ChangelogRecord is a frozen slots\n"
"dataclass).");

static PyObject *decode_records(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t i, limit;
    unsigned long long expected, stop;
    PyObject *stop_obj;
    int no_stop;
    Sink sink = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0};
    if (!PyArg_ParseTuple(args, "y*nnKO!O!OOO:decode_records", &view, &i, &limit, &expected, &PyLong_Type,
                          &stop_obj, &PyType_Type, &sink.record_type, &sink.key_slot, &sink.value_slot,
                          &sink.offset_slot))
        return NULL;
    sink.records = PyList_New(0);
    if (sink.records == NULL || parse_stop(stop_obj, &stop, &no_stop) < 0 ||
        decode_loop(view.buf, view.len, &i, limit, &expected, stop, no_stop, &sink) < 0) {
        Py_XDECREF(sink.records);
        PyBuffer_Release(&view);
        return NULL;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(NnK)", sink.records, i, expected);
}

PyDoc_STRVAR(walk_doc,
"walk(buf, pos, expected) -> (valid_end, next_offset, bad_pos or None)\n\n"
"format.walk in C: validate records from byte ``pos`` on; see there.");

static PyObject *walk(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos;
    unsigned long long expected;
    if (!PyArg_ParseTuple(args, "y*nK:walk", &view, &pos, &expected)) return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t n = view.len;
    while (pos >= 0 && pos + HEADER_SIZE <= n) {
        const unsigned char *rec = buf + pos;
        uint64_t off = get_u64(rec + 4);
        uint32_t klen = get_u32(rec + 20);
        int32_t vlen = (int32_t)get_u32(rec + 24);
        Py_ssize_t end = pos + HEADER_SIZE + (Py_ssize_t)klen + (vlen > 0 ? vlen : 0);
        if (end > n || vlen < TOMBSTONE || off < expected || crc_of(rec + 4, end - pos - 4) != get_u32(rec)) {
            PyBuffer_Release(&view);
            return Py_BuildValue("(nKn)", pos, expected, pos);
        }
        expected = off + 1;
        pos = end;
    }
    PyBuffer_Release(&view);
    if (pos < n) return Py_BuildValue("(nKn)", pos, expected, pos);
    return Py_BuildValue("(nKO)", pos, expected, Py_None);
}

PyDoc_STRVAR(split_point_doc,
"split_point(buf, pos, room) -> (position, next_offset)\n\n"
"framing.py_split_point in C: the byte position after the record at which ``room`` bytes from\n"
"``pos`` are reached (or the buffer ends), and the offset after that record.");

static PyObject *split_point(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t pos, room;
    if (!PyArg_ParseTuple(args, "y*nn:split_point", &view, &pos, &room)) return NULL;
    const unsigned char *buf = view.buf;
    Py_ssize_t n = view.len, start = pos;
    uint64_t off = 0;
    if (pos < 0 || pos + HEADER_SIZE > n) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "split_point: no whole record header at pos");
        return NULL;
    }
    for (;;) {
        const unsigned char *rec = buf + pos;
        off = get_u64(rec + 4);
        uint32_t klen = get_u32(rec + 20);
        int32_t vlen = (int32_t)get_u32(rec + 24);
        pos += HEADER_SIZE + (Py_ssize_t)klen + (vlen > 0 ? vlen : 0);
        if (pos - start >= room || pos >= n) break;
        if (pos + HEADER_SIZE > n) { /* a partial header: the Python twin's unpack fails there too */
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "split_point: a partial record header");
            return NULL;
        }
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(nK)", pos, (unsigned long long)off + 1);
}

static PyMethodDef methods[] = {
    {"split_point", split_point, METH_VARARGS, split_point_doc},
    {"encode_into", encode_into, METH_VARARGS, encode_into_doc},
    {"decode_columns", decode_columns, METH_VARARGS, decode_columns_doc},
    {"decode_records", decode_records, METH_VARARGS, decode_records_doc},
    {"decode_frames", decode_frames, METH_VARARGS, decode_frames_doc},
    {"walk", walk, METH_VARARGS, walk_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_framing",
    "The changelog record framing in C (see localstate.changelog.framing; the Python versions are the reference).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__framing(void) { return PyModule_Create(&module); }
