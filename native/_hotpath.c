/* The kv engine's per-event get/put in C: the cache-hit and cached-put fast paths of
 * KeyValueEngine.get/put (engines/kv/engine.py, _bind_hot_path), without a Python frame per call.
 *
 * A HotPath holds the engine's own objects (the two cache generations, the pending map, the key
 * class, the bound reference methods) and does on its fast paths exactly what the reference methods
 * do; every other case calls the reference method it was given, so behaviour lives in one place
 * (engine.py). tests/native/test_differential.py runs both side by side (LOCALSTATE_PURE_PYTHON=1
 * leaves the reference methods installed).
 *
 *   get(key):  key of exactly the key class: young-generation hit -> value; old-generation hit ->
 *              moved to young, value; else missed(key) (the engine's _get_missed). Any other key:
 *              reference_get(key).
 *   cold_reads(backend, inflight, key_kind, min_key, max_key, cache_size, rotate, vdecode): lets get
 *              do _get_missed's backend read itself for a key neither cached nor pending, while
 *              nothing is in flight: the key encoded (key_kind 0: it is its bytes, 1: UTF-8 of a
 *              str, 2: the int serde's 8 bytes), of a size in [min_key, max_key], read with
 *              backend.get, decoded (int values: the int serde's 8 bytes in C; else vdecode), cached
 *              as GenerationalCache.insert caches it (rotate() when full). Anything else (a key that
 *              does not encode, a size out of range, a read or decode error): missed(key).
 *   put(key, value):  key of exactly the key class, in the young generation, and (int values) an
 *              int in [int_min, int_max] or (other values) not None and accepted by vfast: stored
 *              in young and in the pending map (the encoded bytes there when hold_encoded), then
 *              spill() when the pending map holds more than batch keys. Anything else: put_slow.
 *   missing(keys), lookup(keys, miss), put_many(keys, values): the batched operations' per-row passes
 *              (KeyValueEngine._prefetch, get_many, put_many) for keys of exactly the key class: the
 *              keys merge would miss, get_many's cache lookups, a put_many of cached keys.
 *   merge(keys, deltas, op, results):  KeyValueEngine.merge_many's per-row loop for the int serde
 *              (op 0 add, 1 min, 2 max): for each row, a key of exactly the key class in the young
 *              generation holding an exact int or None (known absent: the new value is delta), and an
 *              exact int delta, gets its new value stored in
 *              young and the pending map when it is in the int serde's range (spill() as put does);
 *              any other row calls merge_slow(key, delta) (the engine's per-key read-modify-write).
 *              Returns the list of each row's new value with results, else None. With a fifth
 *              argument stop true (and results false): stops before the first row whose key is of
 *              exactly the key class but not in the young generation, returning its index (the rows
 *              before it applied), so the caller reads the batch's misses at once and resumes.
 *
 * A store with ttl (engines/kv/ttl.py) uses HotPath as it is: its cache holds only live values.
 *
 * murmur2(data): Kafka's murmur2 of bytes (core/partitioner.py's py_murmur2, which
 * tests/native/test_differential.py runs against it): the partition of every key an input reads is
 * checked (core/routing.py), so it runs once per distinct key of every chunk.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
    PyObject_HEAD
    PyObject *young, *old, *dirty;     /* dicts, kept for the engine's lifetime (cleared in place) */
    PyObject *key_class;               /* the key serde's native class */
    PyObject *spill, *reference_get, *missed, *put_slow;
    PyObject *vfast, *slow_value, *errors; /* non-int values: fast encoder, its fallback, its errors */
    PyObject *merge_slow;              /* merge's per-row fallback (None: merge is refused) */
    PyObject *backend, *inflight, *rotate, *vdecode; /* cold_reads (NULL: get's misses all go to missed) */
    Py_ssize_t batch;
    long long int_min, int_max;
    int int_values, hold_encoded;
    Py_ssize_t min_key, max_key, cache_size;
    int key_kind;
} HotPath;

/* The object fields, in one list: what __init__ sets (in this order), tp_traverse visits and
 * tp_clear drops. */
static const size_t OBJECTS[] = {
    offsetof(HotPath, young), offsetof(HotPath, old), offsetof(HotPath, dirty), offsetof(HotPath, key_class),
    offsetof(HotPath, spill), offsetof(HotPath, reference_get), offsetof(HotPath, missed),
    offsetof(HotPath, put_slow), offsetof(HotPath, vfast), offsetof(HotPath, slow_value), offsetof(HotPath, errors),
    offsetof(HotPath, merge_slow), offsetof(HotPath, backend), offsetof(HotPath, inflight),
    offsetof(HotPath, rotate), offsetof(HotPath, vdecode)};
#define N_OBJECTS (sizeof(OBJECTS) / sizeof(OBJECTS[0]))
#define N_INIT 12 /* the first N_INIT objects are __init__'s; the others cold_reads' */

static PyObject **object_slot(HotPath *self, size_t i) { return (PyObject **)((char *)self + OBJECTS[i]); }

static int hotpath_traverse(HotPath *self, visitproc visit, void *arg) {
    for (size_t i = 0; i < N_OBJECTS; i++) Py_VISIT(*object_slot(self, i));
    return 0;
}

static int hotpath_clear(HotPath *self) {
    for (size_t i = 0; i < N_OBJECTS; i++) Py_CLEAR(*object_slot(self, i));
    return 0;
}

static void hotpath_dealloc(HotPath *self) {
    PyObject_GC_UnTrack(self);
    hotpath_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int hotpath_init(HotPath *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"young", "old", "dirty", "key_class", "batch", "spill", "reference_get", "missed",
                            "put_slow", "int_values", "int_min", "int_max", "vfast", "slow_value",
                            "errors", "hold_encoded", "merge_slow", NULL};
    PyObject *young, *old, *dirty, *key_class, *spill, *reference_get, *missed, *put_slow, *vfast, *slow_value,
        *errors, *merge_slow = Py_None;
    Py_ssize_t batch;
    int int_values, hold_encoded;
    long long int_min, int_max;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O!O!O!nOOOOpLLOOOp|O:HotPath", names, &PyDict_Type, &young,
                                     &PyDict_Type, &old, &PyDict_Type, &dirty, &PyType_Type, &key_class, &batch,
                                     &spill, &reference_get, &missed, &put_slow, &int_values, &int_min, &int_max,
                                     &vfast, &slow_value, &errors, &hold_encoded, &merge_slow))
        return -1;
    PyObject *held[N_INIT] = {young, old, dirty, key_class, spill, reference_get, missed, put_slow, vfast,
                              slow_value, errors, merge_slow}; /* in OBJECTS' order */
    for (size_t i = 0; i < N_INIT; i++) {
        Py_INCREF(held[i]);
        Py_XSETREF(*object_slot(self, i), held[i]);
    }
    self->batch = batch;
    self->int_values = int_values;
    self->int_min = int_min;
    self->int_max = int_max;
    self->hold_encoded = hold_encoded;
    return 0;
}

/* A HotPath made without __init__ (HotPath.__new__) holds nothing: refuse to run it. */
static int uninitialised(HotPath *self) {
    if (self->young != NULL) return 0;
    PyErr_SetString(PyExc_RuntimeError, "HotPath used before __init__");
    return 1;
}

static PyObject *str_get; /* "get", interned at module init */

/* The stored key of cache key ``key`` (a new reference), or NULL without an exception when it has
 * no fast encoding (the reference encodes it and raises the typed error). */
static PyObject *cold_key(HotPath *self, PyObject *key) {
    if (self->key_kind == 0) return PyBytes_CheckExact(key) ? Py_NewRef(key) : NULL;
    if (self->key_kind == 1) {
        PyObject *kb = PyUnicode_CheckExact(key) ? PyUnicode_AsUTF8String(key) : NULL;
        if (kb == NULL) PyErr_Clear(); /* e.g. a lone surrogate */
        return kb;
    }
    if (!PyLong_CheckExact(key)) return NULL;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(key, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    if (overflow) return NULL;
    uint64_t u = (uint64_t)v ^ ((uint64_t)1 << 63); /* the serde's v + 2**63, big endian */
    unsigned char packed[8];
    for (int i = 7; i >= 0; i--, u >>= 8) packed[i] = (unsigned char)u;
    return PyBytes_FromStringAndSize((const char *)packed, 8);
}

/* The object of stored value ``vb`` (a new reference), or NULL without an exception when the fast
 * decoders refuse it (the reference decodes it and raises the typed error). */
static PyObject *cold_value(HotPath *self, PyObject *vb) {
    if (self->int_values) {
        if (!PyBytes_CheckExact(vb) || PyBytes_GET_SIZE(vb) != 8) return NULL;
        const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(vb);
        uint64_t u = 0;
        for (int i = 0; i < 8; i++) u = (u << 8) | b[i];
        return PyLong_FromLongLong((long long)(u ^ ((uint64_t)1 << 63)));
    }
    PyObject *value = PyObject_CallOneArg(self->vdecode, vb);
    if (value == NULL && PyErr_ExceptionMatches(self->errors)) PyErr_Clear();
    return value;
}

/* _get_missed for a key in neither cache generation (see cold_reads). */
static PyObject *cold_read(HotPath *self, PyObject *key) {
    if (PyDict_GET_SIZE(self->inflight) != 0) return PyObject_CallOneArg(self->missed, key);
    int pending = PyDict_Contains(self->dirty, key);
    if (pending < 0) return NULL;
    if (pending) return PyObject_CallOneArg(self->missed, key);
    PyObject *kb = cold_key(self, key);
    if (kb == NULL) return PyErr_Occurred() ? NULL : PyObject_CallOneArg(self->missed, key);
    if (PyBytes_GET_SIZE(kb) < self->min_key || PyBytes_GET_SIZE(kb) > self->max_key) {
        Py_DECREF(kb);
        return PyObject_CallOneArg(self->missed, key);
    }
    PyObject *vb = PyObject_CallMethodOneArg(self->backend, str_get, kb);
    Py_DECREF(kb);
    if (vb == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
        PyErr_Clear(); /* the reference reads again and raises the typed error */
        return PyObject_CallOneArg(self->missed, key);
    }
    PyObject *value = vb == Py_None ? Py_NewRef(Py_None) : cold_value(self, vb);
    Py_DECREF(vb);
    if (value == NULL) return PyErr_Occurred() ? NULL : PyObject_CallOneArg(self->missed, key);
    if (self->cache_size > 0) { /* GenerationalCache.insert of a key not in the old generation */
        int cached = PyDict_Contains(self->young, key);
        if (cached < 0) {
            Py_DECREF(value);
            return NULL;
        }
        if (!cached && PyDict_GET_SIZE(self->young) + PyDict_GET_SIZE(self->old) >= self->cache_size) {
            PyObject *done = PyObject_CallNoArgs(self->rotate);
            if (done == NULL) {
                Py_DECREF(value);
                return NULL;
            }
            Py_DECREF(done);
        }
        if (PyDict_SetItem(self->young, key, value) < 0) {
            Py_DECREF(value);
            return NULL;
        }
    }
    return value;
}

static PyObject *hotpath_cold_reads(HotPath *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"backend", "inflight", "key_kind", "min_key", "max_key", "cache_size", "rotate",
                            "vdecode", NULL};
    PyObject *backend, *inflight, *rotate, *vdecode;
    int key_kind;
    Py_ssize_t min_key, max_key, cache_size;
    if (uninitialised(self)) return NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!innnOO:cold_reads", names, &backend, &PyDict_Type,
                                     &inflight, &key_kind, &min_key, &max_key, &cache_size, &rotate, &vdecode))
        return NULL;
    if (key_kind < 0 || key_kind > 2) {
        PyErr_SetString(PyExc_ValueError, "cold_reads: key_kind is 0 (bytes), 1 (str) or 2 (int)");
        return NULL;
    }
    Py_XSETREF(self->backend, Py_NewRef(backend));
    Py_XSETREF(self->inflight, Py_NewRef(inflight));
    Py_XSETREF(self->rotate, Py_NewRef(rotate));
    Py_XSETREF(self->vdecode, Py_NewRef(vdecode));
    self->key_kind = key_kind;
    self->min_key = min_key;
    self->max_key = max_key;
    self->cache_size = cache_size;
    Py_RETURN_NONE;
}

static PyObject *hotpath_get(HotPath *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (uninitialised(self)) return NULL;
    if (nargs != 1 || kwnames != NULL) /* keywords, wrong arity: the reference reports it */
        return PyObject_Vectorcall(self->reference_get, args, (size_t)nargs, kwnames);
    PyObject *key = args[0];
    if ((PyObject *)Py_TYPE(key) != self->key_class) return PyObject_CallOneArg(self->reference_get, key);
    PyObject *value = PyDict_GetItemWithError(self->young, key);
    if (value != NULL) return Py_NewRef(value);
    if (PyErr_Occurred()) return NULL;
    value = PyDict_GetItemWithError(self->old, key);
    if (value != NULL) { /* old.pop(key); young[key] = value */
        Py_INCREF(value);
        if (PyDict_DelItem(self->old, key) < 0 || PyDict_SetItem(self->young, key, value) < 0) {
            Py_DECREF(value);
            return NULL;
        }
        return value;
    }
    if (PyErr_Occurred()) return NULL;
    if (self->backend != NULL) return cold_read(self, key);
    return PyObject_CallOneArg(self->missed, key);
}

/* The value's entry for the pending map, or NULL with an exception set. */
static PyObject *pending_entry(HotPath *self, PyObject *key, PyObject *value) {
    if (self->int_values) return Py_NewRef(value);
    PyObject *encoded = PyObject_CallOneArg(self->vfast, value);
    if (encoded == NULL) {
        if (!PyErr_ExceptionMatches(self->errors)) return NULL;
        PyErr_Clear();
        encoded = PyObject_CallFunctionObjArgs(self->slow_value, key, value, NULL);
        if (encoded == NULL) return NULL;
    }
    if (self->hold_encoded) return encoded;
    Py_DECREF(encoded);
    return Py_NewRef(value);
}

static int int_in_range(HotPath *self, PyObject *value) {
    if (!PyLong_CheckExact(value)) return 0;
    int overflow;
    long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return !overflow && self->int_min <= v && v <= self->int_max;
}

/* The fast path of put for a key in the young generation: young[key] = value, dirty[key] = its
 * pending entry, spill() past batch keys. */
static PyObject *put_cached(HotPath *self, PyObject *key, PyObject *value) {
    PyObject *entry = pending_entry(self, key, value);
    if (entry == NULL) return NULL;
    int rc = PyDict_SetItem(self->young, key, value);
    if (rc == 0) rc = PyDict_SetItem(self->dirty, key, entry);
    Py_DECREF(entry);
    if (rc < 0) return NULL;
    if (PyDict_GET_SIZE(self->dirty) > self->batch) {
        PyObject *done = PyObject_CallNoArgs(self->spill);
        if (done == NULL) return NULL;
        Py_DECREF(done);
    }
    Py_RETURN_NONE;
}

/* Whether put(key, value) takes the fast path: 1 yes, 0 no, -1 error. */
static int put_is_fast(HotPath *self, PyObject *key, PyObject *value) {
    int fast = (PyObject *)Py_TYPE(key) == self->key_class &&
               (self->int_values ? int_in_range(self, value) : value != Py_None);
    if (fast) fast = PyDict_Contains(self->young, key);
    return fast;
}

static PyObject *hotpath_put(HotPath *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (uninitialised(self)) return NULL;
    if (nargs != 2 || kwnames != NULL)
        return PyObject_Vectorcall(self->put_slow, args, (size_t)nargs, kwnames);
    PyObject *key = args[0], *value = args[1];
    int fast = put_is_fast(self, key, value);
    if (fast < 0) return NULL;
    if (!fast) return PyObject_Vectorcall(self->put_slow, args, 2, NULL);
    return put_cached(self, key, value);
}

/* One row of merge: the new value (a new reference), or NULL with an exception set. */
static PyObject *merge_row(HotPath *self, PyObject *key, PyObject *delta, int op) {
    if ((PyObject *)Py_TYPE(key) == self->key_class && self->int_values && PyLong_CheckExact(delta)) {
        PyObject *current = PyDict_GetItemWithError(self->young, key);
        if (current == NULL && PyErr_Occurred()) return NULL;
        if (current != NULL && (PyLong_CheckExact(current) || current == Py_None)) {
            PyObject *value;
            if (current == Py_None) { /* cached as absent: the value becomes delta, whatever the op */
                value = Py_NewRef(delta);
            } else if (op == 0) {
                /* two exact ints: added in C when both fit in 64 bits and so does the sum */
                int overflow_a, overflow_b;
                long long a = PyLong_AsLongLongAndOverflow(current, &overflow_a);
                long long b = PyLong_AsLongLongAndOverflow(delta, &overflow_b);
                long long sum;
                if (!overflow_a && !overflow_b && !__builtin_add_overflow(a, b, &sum))
                    value = PyLong_FromLongLong(sum);
                else
                    value = PyNumber_Add(current, delta);
                if (value == NULL) return NULL;
            } else {
                int less = PyObject_RichCompareBool(delta, current, op == 1 ? Py_LT : Py_GT);
                if (less < 0) return NULL;
                value = Py_NewRef(less ? delta : current);
            }
            if (int_in_range(self, value)) {
                if (PyDict_SetItem(self->young, key, value) < 0 || PyDict_SetItem(self->dirty, key, value) < 0) {
                    Py_DECREF(value);
                    return NULL;
                }
                if (PyDict_GET_SIZE(self->dirty) > self->batch) {
                    PyObject *done = PyObject_CallNoArgs(self->spill);
                    if (done == NULL) {
                        Py_DECREF(value);
                        return NULL;
                    }
                    Py_DECREF(done);
                }
                return value;
            }
            Py_DECREF(value); /* out of range: the reference path raises the typed error */
        }
    }
    return PyObject_CallFunctionObjArgs(self->merge_slow, key, delta, NULL);
}

static PyObject *hotpath_merge(HotPath *self, PyObject *const *args, Py_ssize_t nargs) {
    if (uninitialised(self)) return NULL;
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "merge(keys, deltas, op, results[, stop])");
        return NULL;
    }
    if (self->merge_slow == Py_None) {
        PyErr_SetString(PyExc_RuntimeError, "HotPath.merge without merge_slow");
        return NULL;
    }
    PyObject *keys = args[0], *deltas = args[1];
    if (!PyList_CheckExact(keys) || !PyList_CheckExact(deltas) || PyList_GET_SIZE(keys) != PyList_GET_SIZE(deltas)) {
        PyErr_SetString(PyExc_TypeError, "merge: keys and deltas must be lists of equal length");
        return NULL;
    }
    long op = PyLong_AsLong(args[2]);
    if (op == -1 && PyErr_Occurred()) return NULL;
    int results = PyObject_IsTrue(args[3]);
    if (results < 0) return NULL;
    int stop = nargs == 5 ? PyObject_IsTrue(args[4]) : 0;
    if (stop < 0) return NULL;
    if (stop && results) {
        PyErr_SetString(PyExc_ValueError, "merge: stop with results");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *out = results ? PyList_New(n) : NULL;
    if (results && out == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* the lists may change size under a fallback's feet (user objects' __eq__): index checked */
        if (i >= PyList_GET_SIZE(keys) || i >= PyList_GET_SIZE(deltas)) {
            PyErr_SetString(PyExc_RuntimeError, "merge: keys or deltas changed size");
            Py_XDECREF(out);
            return NULL;
        }
        PyObject *key = Py_NewRef(PyList_GET_ITEM(keys, i)), *delta = Py_NewRef(PyList_GET_ITEM(deltas, i));
        if (stop && (PyObject *)Py_TYPE(key) == self->key_class) {
            int cached = PyDict_Contains(self->young, key);
            if (cached <= 0) {
                Py_DECREF(key);
                Py_DECREF(delta);
                return cached < 0 ? NULL : PyLong_FromSsize_t(i);
            }
        }
        PyObject *value = merge_row(self, key, delta, (int)op);
        Py_DECREF(key);
        Py_DECREF(delta);
        if (value == NULL) {
            Py_XDECREF(out);
            return NULL;
        }
        if (results)
            PyList_SET_ITEM(out, i, value);
        else
            Py_DECREF(value);
    }
    if (results) return out;
    Py_RETURN_NONE;
}

/* Whether every item of list ``keys`` is of exactly the key class (the keys the fast paths own). */
static int all_of_key_class(HotPath *self, PyObject *keys) {
    Py_ssize_t n = PyList_GET_SIZE(keys);
    for (Py_ssize_t i = 0; i < n; i++)
        if ((PyObject *)Py_TYPE(PyList_GET_ITEM(keys, i)) != self->key_class) return 0;
    return 1;
}

/* missing(keys): the distinct keys of list ``keys`` not in the young generation, in first-seen order,
 * when every key is of exactly the key class; None otherwise (merge hands such keys to merge_slow). */
static PyObject *hotpath_missing(HotPath *self, PyObject *keys) {
    if (uninitialised(self)) return NULL;
    if (!PyList_CheckExact(keys)) {
        PyErr_SetString(PyExc_TypeError, "missing(keys: list)");
        return NULL;
    }
    if (!all_of_key_class(self, keys)) Py_RETURN_NONE;
    PyObject *out = PyList_New(0), *seen = NULL;
    if (out == NULL) return NULL;
    /* exact str/int/bytes keys: lookups run no Python code, so the list cannot change meanwhile */
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(keys); i++) {
        PyObject *key = PyList_GET_ITEM(keys, i);
        int cached = PyDict_Contains(self->young, key);
        if (cached < 0) goto fail;
        if (cached) continue;
        if (seen == NULL && (seen = PySet_New(NULL)) == NULL) goto fail;
        int known = PySet_Contains(seen, key);
        if (known < 0) goto fail;
        if (known) continue;
        if (PySet_Add(seen, key) < 0 || PyList_Append(out, key) < 0) goto fail;
    }
    Py_XDECREF(seen);
    return out;
fail:
    Py_XDECREF(seen);
    Py_DECREF(out);
    return NULL;
}

/* lookup(keys, miss): KeyValueEngine.get_many's cache pass, when every key of list ``keys`` is of
 * exactly the key class: (each key's value in the young generation, or ``miss``; the positions of the
 * misses, or None when there is none). None when a key is of another class (the reference runs). */
static PyObject *hotpath_lookup(HotPath *self, PyObject *const *args, Py_ssize_t nargs) {
    if (uninitialised(self)) return NULL;
    if (nargs != 2 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "lookup(keys: list, miss)");
        return NULL;
    }
    PyObject *keys = args[0], *miss = args[1];
    if (!all_of_key_class(self, keys)) Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(keys);
    PyObject *values = PyList_New(n), *missed = NULL;
    if (values == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = PyDict_GetItemWithError(self->young, PyList_GET_ITEM(keys, i));
        if (value == NULL) {
            if (PyErr_Occurred()) goto fail;
            if (missed == NULL && (missed = PyList_New(0)) == NULL) goto fail;
            PyObject *at = PyLong_FromSsize_t(i);
            if (at == NULL || PyList_Append(missed, at) < 0) {
                Py_XDECREF(at);
                goto fail;
            }
            Py_DECREF(at);
            value = miss;
        }
        PyList_SET_ITEM(values, i, Py_NewRef(value));
    }
    PyObject *result = PyTuple_Pack(2, values, missed != NULL ? missed : Py_None);
    Py_DECREF(values);
    Py_XDECREF(missed);
    return result;
fail:
    Py_DECREF(values);
    Py_XDECREF(missed);
    return NULL;
}

/* put_many(keys, values): KeyValueEngine.put_many when every key (list ``keys``) is of exactly the key
 * class and in the young generation (checked when it entered the cache) and every value takes put's
 * fast path (an exact int in the int serde's range; else accepted by vfast, encoded here): each row
 * stored in young and the pending map, in order (the last value of a key wins), then spill() when
 * the pending map holds more than batch keys, as the reference does after the whole batch. Returns
 * None; NotImplemented, having changed nothing, for any batch it does not take (the reference then
 * checks, raises or applies it). */
static PyObject *hotpath_put_many(HotPath *self, PyObject *const *args, Py_ssize_t nargs) {
    if (uninitialised(self)) return NULL;
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "put_many(keys: list, values: list)");
        return NULL;
    }
    PyObject *keys = args[0], *values = args[1];
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(values) != n || !all_of_key_class(self, keys)) Py_RETURN_NOTIMPLEMENTED;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *value = PyList_GET_ITEM(values, i);
        if (self->int_values ? !int_in_range(self, value) : value == Py_None) Py_RETURN_NOTIMPLEMENTED;
        int cached = PyDict_Contains(self->young, PyList_GET_ITEM(keys, i)); /* checked again below */
        if (cached < 0) return NULL;
        if (!cached) Py_RETURN_NOTIMPLEMENTED;
    }
    /* The surviving values' encodings (the last value of each key; NULL for the rows before it), held
     * in the pending map; int values are held as they are. Each surviving value is encoded once, as
     * the reference encodes it (a serde's encoder runs once per surviving value). */
    PyObject **entries = NULL;
    if (!self->int_values) {
        PyObject *seen = PySet_New(NULL);
        if (seen == NULL) return NULL;
        if ((entries = PyMem_Calloc((size_t)(n ? n : 1), sizeof(PyObject *))) == NULL) {
            Py_DECREF(seen);
            PyErr_NoMemory();
            return NULL;
        }
        int ok = 1;
        for (Py_ssize_t i = n - 1; ok && i >= 0; i--) {
            if (i >= PyList_GET_SIZE(keys) || i >= PyList_GET_SIZE(values)) { /* an encoder shrank a list */
                ok = 0;
                break;
            }
            PyObject *key = PyList_GET_ITEM(keys, i);
            int later = PySet_Contains(seen, key);
            if (later < 0 || (!later && PySet_Add(seen, key) < 0)) {
                ok = -1;
                break;
            }
            if (later) continue;
            PyObject *value = Py_NewRef(PyList_GET_ITEM(values, i));
            entries[i] = PyObject_CallOneArg(self->vfast, value);
            Py_DECREF(value);
            if (entries[i] == NULL) { /* the reference encodes it again, and raises its own error */
                PyErr_Clear();
                ok = 0;
            }
        }
        Py_DECREF(seen);
        if (ok != 1) {
            for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(entries[i]);
            PyMem_Free(entries);
            if (ok < 0) return NULL;
            Py_RETURN_NOTIMPLEMENTED;
        }
    }
    /* From here on no Python code runs until the spill. A serde's encoder above may have run any code:
     * the keys are checked in the young generation again, so that they are there when stored. */
    int taken = PyList_GET_SIZE(keys) == n && PyList_GET_SIZE(values) == n;
    for (Py_ssize_t i = 0; entries != NULL && taken == 1 && i < n; i++)
        taken = PyDict_Contains(self->young, PyList_GET_ITEM(keys, i));
    int failed = taken < 0;
    for (Py_ssize_t i = 0; taken == 1 && !failed && i < n; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *value = PyList_GET_ITEM(values, i);
        if (PyDict_SetItem(self->young, key, value) < 0) failed = 1;
        else if (entries == NULL ? PyDict_SetItem(self->dirty, key, value) < 0
                                 : entries[i] != NULL && PyDict_SetItem(self->dirty, key, entries[i]) < 0) failed = 1;
    }
    if (entries != NULL) {
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(entries[i]);
        PyMem_Free(entries);
    }
    if (failed) return NULL;
    if (taken != 1) Py_RETURN_NOTIMPLEMENTED;
    if (PyDict_GET_SIZE(self->dirty) > self->batch) {
        PyObject *done = PyObject_CallNoArgs(self->spill);
        if (done == NULL) return NULL;
        Py_DECREF(done);
    }
    Py_RETURN_NONE;
}

static PyMethodDef hotpath_methods[] = {
    {"get", (PyCFunction)(void (*)(void))hotpath_get, METH_FASTCALL | METH_KEYWORDS,
     "The value of key, or None (KeyValueEngine.get)."},
    {"put", (PyCFunction)(void (*)(void))hotpath_put, METH_FASTCALL | METH_KEYWORDS,
     "Set key to value (KeyValueEngine.put)."},
    {"cold_reads", (PyCFunction)(void (*)(void))hotpath_cold_reads, METH_VARARGS | METH_KEYWORDS,
     "cold_reads(backend, inflight, key_kind, min_key, max_key, cache_size, rotate, vdecode): get reads misses."},
    {"merge", (PyCFunction)(void (*)(void))hotpath_merge, METH_FASTCALL,
     "merge(keys, deltas, op, results[, stop]): KeyValueEngine.merge_many's per-row loop for the int serde."},
    {"missing", (PyCFunction)hotpath_missing, METH_O,
     "missing(keys): the distinct keys not in the young generation (None: a key of another class)."},
    {"lookup", (PyCFunction)(void (*)(void))hotpath_lookup, METH_FASTCALL,
     "lookup(keys, miss): get_many's cache pass: (values, positions of the misses or None), or None."},
    {"put_many", (PyCFunction)(void (*)(void))hotpath_put_many, METH_FASTCALL,
     "put_many(keys, values): KeyValueEngine.put_many for cached keys; NotImplemented for any other batch."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject HotPathType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "localstate.native._hotpath.HotPath",
    .tp_doc = "The kv engine's get/put fast paths in C (see engine.py, KeyValueEngine._bind_hot_path).",
    .tp_basicsize = sizeof(HotPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)hotpath_init,
    .tp_dealloc = (destructor)hotpath_dealloc,
    .tp_traverse = (traverseproc)hotpath_traverse,
    .tp_clear = (inquiry)hotpath_clear,
    .tp_methods = hotpath_methods,
};


/* murmur2(data): Kafka's murmur2 (seed 0x9747b28c) of ``data`` (bytes), as a signed 32-bit int like
 * Java's; anything but bytes raises TypeError. */
static PyObject *murmur2(PyObject *module, PyObject *arg) {
    (void)module;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "murmur2(data: bytes)");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(arg);
    Py_ssize_t length = PyBytes_GET_SIZE(arg);
    const uint32_t m = 0x5BD1E995u;
    uint32_t h = 0x9747B28Cu ^ (uint32_t)length;
    Py_ssize_t tail = length & ~(Py_ssize_t)3;
    for (Py_ssize_t i = 0; i < tail; i += 4) {
        uint32_t k = (uint32_t)data[i] | ((uint32_t)data[i + 1] << 8) | ((uint32_t)data[i + 2] << 16)
                     | ((uint32_t)data[i + 3] << 24);
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (length & 3) {
    case 3: h ^= (uint32_t)data[tail + 2] << 16; /* fall through */
    case 2: h ^= (uint32_t)data[tail + 1] << 8; /* fall through */
    case 1: h ^= (uint32_t)data[tail]; h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return PyLong_FromLong((long)(int32_t)h);
}

static PyMethodDef module_methods[] = {
    {"murmur2", (PyCFunction)murmur2, METH_O, "murmur2(data): Kafka's murmur2 of bytes, a signed 32-bit int."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_hotpath", "The kv engine's get/put fast paths in C (see engine.py).", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__hotpath(void) {
    if (PyType_Ready(&HotPathType) < 0) return NULL;
    if (str_get == NULL && (str_get = PyUnicode_InternFromString("get")) == NULL) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&HotPathType);
    if (PyModule_AddObject(m, "HotPath", (PyObject *)&HotPathType) < 0) {
        Py_DECREF(&HotPathType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
