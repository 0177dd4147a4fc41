/* A Python map-style dataset (__len__, __getitem__ returning an array or a tuple of arrays of
 * fixed shape) as a stoke_dataset of kind MAP.
 *
 * The loader's worker threads call get(): it takes the GIL for __getitem__ and for reading the
 * arrays' buffers, and drops it for the copy into the batch slots.  An exception raised by
 * __getitem__ is kept (with its traceback) keyed by the sample index, and the Loader re-raises
 * it when the failing sample's error reaches the consumer.
 *
 * One call at a time per dataset: `call_lock` is held around each get() (the __getitem__ call,
 * the conversion, the copy and the release of the items), so a dataset that reseeds a global
 * RNG per item (torchvision's FakeData) or reuses an output buffer delivers exactly ds[i] with
 * any number of workers.  Python code runs one thread at a time anyway (the GIL); what the lock
 * costs is the overlap of GIL-free work inside __getitem__ (I/O, NumPy, torch ops) and of the
 * copies.  A no-op worker_init keeps the loader from calling get() in the consumer's thread as
 * well ("assist", dataset.h), so num_workers threads call __getitem__ (the caller's with 0).
 *
 * Exit: stoke_pyds_stop_all() (from the package's atexit hook, before the interpreter
 * finalizes) waits for the get() calls in progress and makes every later one fail without
 * touching Python: a worker thread that took the GIL, or freed a torch tensor, during
 * finalization would be ended by pthread_exit, unwinding through libtorch (std::terminate). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stoke_py.h"

/* The most items a sample tuple has (the loader itself has no limit). */
#define PYDS_MAX_FIELDS 64

struct stoke_pyds {
    PyObject *obj;             /* the dataset */
    PyObject *errors;          /* {index: exception} (GIL) */
    PyObject *asarray;         /* numpy.asarray, or NULL: for items without the buffer protocol */
    pthread_mutex_t call_lock; /* held around each get() (see above) */
    uint64_t len;
    int nfields;
    int is_tuple;
    stoke_field fields[PYDS_MAX_FIELDS];
    int64_t shapes[PYDS_MAX_FIELDS][STOKE_PY_MAX_DIMS];
};

/* Exit (see above): `stopped` set once, `inflight` the get() calls past their check of it. */
static atomic_int stopped;
static atomic_int inflight;

/* The stoke dtype of a buffer format ("<f", "B", "=q", "4s"...); -1 for big-endian data. */
static int dtype_of_format(const char *fmt, Py_ssize_t itemsize)
{
    if (!fmt)
        return STOKE_DTYPE_U8;
    if (*fmt == '>' || *fmt == '!')
        return -1;
    if (*fmt == '@' || *fmt == '=' || *fmt == '<')
        fmt++;
    int sgn = 0;
    switch (fmt[0]) {
    case '?': return fmt[1] ? STOKE_DTYPE_RAW : STOKE_DTYPE_BOOL;
    case 'e': return STOKE_DTYPE_F16;
    case 'f': return STOKE_DTYPE_F32;
    case 'd': return STOKE_DTYPE_F64;
    case 'Z':
        return fmt[1] == 'f' ? STOKE_DTYPE_C64 : fmt[1] == 'd' ? STOKE_DTYPE_C128 : STOKE_DTYPE_RAW;
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q': sgn = 1; break;
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q': sgn = 0; break;
    default: return STOKE_DTYPE_RAW;
    }
    if (fmt[1])
        return STOKE_DTYPE_RAW;
    switch (itemsize) {
    case 1: return sgn ? STOKE_DTYPE_I8 : STOKE_DTYPE_U8;
    case 2: return sgn ? STOKE_DTYPE_I16 : STOKE_DTYPE_U16;
    case 4: return sgn ? STOKE_DTYPE_I32 : STOKE_DTYPE_U32;
    case 8: return sgn ? STOKE_DTYPE_I64 : STOKE_DTYPE_U64;
    default: return STOKE_DTYPE_RAW;
    }
}

#define UNSUPPORTED_WHY                                                                            \
    "a field is an array, a tensor, a number or a tuple of them; dict, str and None samples "      \
    "and fields are not supported yet"

/* Whether a buffer format holds Python objects ('O') or text ('w'), anywhere in a struct. */
static int format_unsupported(const char *fmt)
{
    for (; fmt && *fmt; fmt++) {
        if (*fmt == ':') { /* a struct member's name, ":name:" */
            const char *end = strchr(fmt + 1, ':');
            if (!end)
                return 0;
            fmt = end;
        } else if (*fmt == 'O' || *fmt == 'w') {
            return 1;
        }
    }
    return 0;
}

static int type_unsupported(PyObject *o)
{
    return o == Py_None || PyUnicode_Check(o) || PyDict_Check(o) || PyAnySet_Check(o);
}

/* The first unsupported object in `o`: itself, or an element of nested tuples and lists (its
 * "[i][j]" appended to path); NULL if none (GIL). */
static PyObject *find_unsupported(PyObject *o, char *path, size_t cap, int depth)
{
    if (type_unsupported(o))
        return o;
    if (depth >= 8 || !(PyTuple_Check(o) || PyList_Check(o)))
        return NULL;
    size_t len = strlen(path);
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(o) && i < 4096; i++) {
        snprintf(path + len, cap - len, "[%zd]", i);
        PyObject *bad = find_unsupported(PySequence_Fast_GET_ITEM(o, i), path, cap, depth + 1);
        if (bad)
            return bad;
    }
    path[len] = '\0';
    return NULL;
}

/* Sets a TypeError naming sample `index`, field `f` (-1: the sample, not a tuple) and what in
 * `o` is not supported: the dict, str or None found in it, else its type and buffer format. */
static void raise_unsupported(uint64_t index, int f, PyObject *o, const char *fmt)
{
    char path[128];
    if (f < 0)
        snprintf(path, sizeof(path), "sample %llu", (unsigned long long)index);
    else
        snprintf(path, sizeof(path), "sample %llu, field %d", (unsigned long long)index, f);
    PyObject *bad = find_unsupported(o, path, sizeof(path), 0);
    if (bad)
        PyErr_Format(PyExc_TypeError, "stoke: %s: %s is not supported (%s)", path,
                     Py_TYPE(bad)->tp_name, UNSUPPORTED_WHY);
    else
        PyErr_Format(PyExc_TypeError,
                     "stoke: %s: %s of buffer format '%s' (Python objects or text) is not "
                     "supported (%s)",
                     path, Py_TYPE(o)->tp_name, fmt ? fmt : "?", UNSUPPORTED_WHY);
}

/* A C-contiguous view of `item`, field f of sample `index` (f -1: the sample itself), through
 * numpy.asarray if it has no buffer.  0 or -1 (a Python exception set: a TypeError for a dict,
 * str or None, or a buffer of Python objects or text).  *keep receives the object to release
 * after the view. */
static int get_view(stoke_pyds *p, PyObject *item, uint64_t index, int f, Py_buffer *v,
                    PyObject **keep)
{
    *keep = NULL;
    if (type_unsupported(item)) { /* numpy.asarray would make an object or text array */
        raise_unsupported(index, f, item, NULL);
        return -1;
    }
    if (PyObject_GetBuffer(item, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) == 0) {
        *keep = Py_NewRef(item);
    } else if (p->asarray) {
        PyErr_Clear();
        PyObject *arr = PyObject_CallOneArg(p->asarray, item);
        if (!arr || PyObject_GetBuffer(arr, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
            Py_XDECREF(arr);
            char path[128] = "";
            if (find_unsupported(item, path, sizeof(path), 0)) { /* (a, None): ragged */
                PyErr_Clear();
                raise_unsupported(index, f, item, NULL);
            }
            return -1;
        }
        *keep = arr;
    } else {
        return -1;
    }
    if (format_unsupported(v->format)) { /* object arrays hold pointers, text arrays UCS-4 */
        raise_unsupported(index, f, item, v->format);
        PyBuffer_Release(v);
        Py_CLEAR(*keep);
        return -1;
    }
    return 0;
}

/* Describes field f from the view of sample 0. */
static int describe(stoke_field *fd, int64_t *shape, int f, const Py_buffer *v)
{
    memset(fd, 0, sizeof(*fd));
    if (f < 2)
        snprintf(fd->name, sizeof(fd->name), "%s", f ? "label" : "data");
    else
        snprintf(fd->name, sizeof(fd->name), "field%d", f);
    fd->shape = shape;
    fd->dtype = dtype_of_format(v->format, v->itemsize);
    if (fd->dtype < 0 || v->ndim > STOKE_PY_MAX_DIMS) {
        PyErr_Format(PyExc_ValueError, "stoke: dataset field %d: %s", f,
                     fd->dtype < 0 ? "big-endian data is not supported" : "too many dimensions");
        return -1;
    }
    fd->itemsize = (size_t)v->itemsize;
    fd->ndim = v->ndim;
    for (int d = 0; d < v->ndim; d++)
        shape[d] = v->shape ? v->shape[d] : v->len / v->itemsize;
    if (stoke_field_finish(fd) != STOKE_OK) {
        PyErr_Format(PyExc_ValueError, "stoke: dataset field %d: %s", f, stoke_last_error());
        return -1;
    }
    return 0;
}

static int same_layout(const stoke_field *fd, const Py_buffer *v, char *msg, size_t msg_len, int f)
{
    int ok = v->ndim == fd->ndim && (size_t)v->len == fd->bytes &&
             dtype_of_format(v->format, v->itemsize) == fd->dtype;
    for (int d = 0; ok && d < v->ndim; d++)
        ok = v->shape[d] == fd->shape[d];
    if (!ok)
        snprintf(msg, msg_len,
                 "field %d (%s): shape, dtype or size differs from sample 0's "
                 "(%zu bytes, dtype %s); samples must have a fixed shape",
                 f, fd->name, fd->bytes, stoke_dtype_name(fd->dtype));
    return ok;
}

/* The pending exception, its traceback attached (a new reference; NULL if none). */
static PyObject *take_exception(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (v && tb)
        PyException_SetTraceback(v, tb);
    Py_XDECREF(t);
    Py_XDECREF(tb);
    return v;
#endif
}

/* Raises `exc` (steals the reference) with the traceback it carries. */
static void raise_exception(PyObject *exc)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
#endif
}

/* Keeps the pending exception for sample `index` and writes "TypeName: text" into msg. */
static void save_exception(stoke_pyds *p, uint64_t index, char *msg, size_t msg_len)
{
    PyObject *exc = take_exception();
    if (!exc) {
        snprintf(msg, msg_len, "__getitem__ failed");
        return;
    }
    PyObject *text = PyObject_Str(exc);
    const char *t = text ? PyUnicode_AsUTF8(text) : NULL;
    snprintf(msg, msg_len, "%s: %s", Py_TYPE(exc)->tp_name, t ? t : "?");
    Py_XDECREF(text);
    PyErr_Clear();
    PyObject *key = PyLong_FromUnsignedLongLong(index);
    if (!key || PyDict_SetItem(p->errors, key, exc) < 0)
        PyErr_Clear();
    Py_XDECREF(key);
    Py_DECREF(exc);
}

/* Fetches sample `index` into views[] (GIL held).  Returns the number of views, or -1 with msg
 * written. */
static int fetch(stoke_pyds *p, uint64_t index, Py_buffer *views, PyObject **keep, char *msg,
                 size_t msg_len)
{
    PyObject *key = PyLong_FromUnsignedLongLong(index);
    PyObject *item = key ? PyObject_GetItem(p->obj, key) : NULL;
    Py_XDECREF(key);
    if (!item) {
        save_exception(p, index, msg, msg_len);
        return -1;
    }
    int n = p->is_tuple ? (PyTuple_Check(item) ? (int)PyTuple_GET_SIZE(item) : -1) : 1;
    if (n != p->nfields && type_unsupported(item)) {
        raise_unsupported(index, -1, item, NULL);
        save_exception(p, index, msg, msg_len);
        Py_DECREF(item);
        return -1;
    }
    if (n != p->nfields) {
        snprintf(msg, msg_len, "__getitem__ returned %s, sample 0 had %d field(s)",
                 Py_TYPE(item)->tp_name, p->nfields);
        Py_DECREF(item);
        return -1;
    }
    int got = 0;
    for (; got < n; got++) {
        PyObject *it = p->is_tuple ? PyTuple_GET_ITEM(item, got) : item;
        if (get_view(p, it, index, p->is_tuple ? got : -1, &views[got], &keep[got]) < 0) {
            save_exception(p, index, msg, msg_len);
            break;
        }
        if (!same_layout(&p->fields[got], &views[got], msg, msg_len, got)) {
            PyBuffer_Release(&views[got]);
            Py_DECREF(keep[got]);
            break;
        }
    }
    Py_DECREF(item);
    if (got == n)
        return n;
    for (int i = 0; i < got; i++) {
        PyBuffer_Release(&views[i]);
        Py_DECREF(keep[i]);
    }
    return -1;
}

static int finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

int stoke_pyds_enter(char *msg, size_t msg_len)
{
    atomic_fetch_add(&inflight, 1); /* before the check: stoke_pyds_stop_all waits for it */
    if (atomic_load(&stopped) || finalizing()) {
        atomic_fetch_sub(&inflight, 1);
        snprintf(msg, msg_len, "the Python interpreter is exiting: the dataset is not called");
        return -1;
    }
    return 0;
}

void stoke_pyds_leave(void)
{
    atomic_fetch_sub(&inflight, 1);
}

static int pyds_get(void *user, uint64_t index, void *const dst[], int64_t len[], int worker,
                    char *msg, size_t msg_len)
{
    stoke_pyds *p = user;
    Py_buffer views[PYDS_MAX_FIELDS];
    PyObject *keep[PYDS_MAX_FIELDS];
    (void)worker;
    (void)len;
    pthread_mutex_lock(&p->call_lock);
    if (stoke_pyds_enter(msg, msg_len) != 0) {
        pthread_mutex_unlock(&p->call_lock);
        return STOKE_ECANCELED;
    }
    PyGILState_STATE g = PyGILState_Ensure();
    int n = fetch(p, index, views, keep, msg, msg_len);
    if (n > 0) {
        PyThreadState *ts = PyEval_SaveThread(); /* the copy runs without the GIL */
        for (int f = 0; f < n; f++)
            if (dst[f])
                memcpy(dst[f], views[f].buf, (size_t)views[f].len);
        PyEval_RestoreThread(ts);
        for (int f = 0; f < n; f++) {
            PyBuffer_Release(&views[f]);
            Py_DECREF(keep[f]);
        }
    }
    PyGILState_Release(g);
    stoke_pyds_leave();
    pthread_mutex_unlock(&p->call_lock);
    return n > 0 ? STOKE_OK : STOKE_EDATA;
}

/* Present so that the loader calls get() only from its worker threads (no "assist" in the
 * consumer's thread, dataset.h): num_workers threads run __getitem__, not num_workers + 1. */
static int pyds_worker_init(void *user, int worker, int num_workers)
{
    (void)user;
    (void)worker;
    (void)num_workers;
    return STOKE_OK;
}

void stoke_pyds_stop_all(void)
{
    atomic_store(&stopped, 1);
    Py_BEGIN_ALLOW_THREADS;
    while (atomic_load(&inflight) > 0) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    Py_END_ALLOW_THREADS;
}

static uint64_t pyds_length(void *user)
{
    return ((stoke_pyds *)user)->len;
}

static void pyds_close(void *user)
{
    stoke_pyds *p = user;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(p->obj);
    Py_XDECREF(p->errors);
    Py_XDECREF(p->asarray);
    PyGILState_Release(g);
    pthread_mutex_destroy(&p->call_lock);
    free(p);
}

/* Reads sample 0 to learn the fields. */
static int probe_fields(stoke_pyds *p)
{
    PyObject *zero = PyLong_FromLong(0);
    PyObject *item = zero ? PyObject_GetItem(p->obj, zero) : NULL;
    Py_XDECREF(zero);
    if (!item)
        return -1;
    p->is_tuple = PyTuple_Check(item);
    p->nfields = p->is_tuple ? (int)PyTuple_GET_SIZE(item) : 1;
    if (p->nfields < 1 || p->nfields > PYDS_MAX_FIELDS) {
        PyErr_Format(PyExc_ValueError, "stoke: dataset[0] is a tuple of %d items; 1..%d fields",
                     p->nfields, PYDS_MAX_FIELDS);
        Py_DECREF(item);
        return -1;
    }
    int rc = 0;
    for (int f = 0; rc == 0 && f < p->nfields; f++) {
        Py_buffer v;
        PyObject *keep;
        rc = get_view(p, p->is_tuple ? PyTuple_GET_ITEM(item, f) : item, 0, p->is_tuple ? f : -1,
                      &v, &keep);
        if (rc == 0) {
            rc = describe(&p->fields[f], p->shapes[f], f, &v);
            PyBuffer_Release(&v);
            Py_DECREF(keep);
        }
    }
    Py_DECREF(item);
    return rc;
}

static void fill_dataset(stoke_pyds *p, stoke_dataset *ds)
{
    stoke_dataset_init(ds);
    ds->kind = STOKE_DATASET_MAP;
    snprintf(ds->name, sizeof(ds->name), "python:%s", Py_TYPE(p->obj)->tp_name);
    ds->user = p;
    ds->nfields = p->nfields;
    ds->fields = p->fields;
    ds->length = pyds_length;
    ds->get = pyds_get;
    ds->worker_init = pyds_worker_init;
    ds->close = pyds_close;
}

int stoke_pyds_open(PyObject *obj, stoke_dataset *ds, stoke_pyds **out)
{
    Py_ssize_t len = PyObject_Length(obj);
    if (len < 0)
        return -1;
    if (len == 0) {
        PyErr_SetString(PyExc_ValueError, "stoke: the dataset is empty");
        return -1;
    }
    stoke_pyds *p = calloc(1, sizeof(*p));
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    pthread_mutex_init(&p->call_lock, NULL);
    p->obj = Py_NewRef(obj);
    p->len = (uint64_t)len;
    p->errors = PyDict_New();
    PyObject *np = PyImport_ImportModule("numpy");
    if (np) {
        p->asarray = PyObject_GetAttrString(np, "asarray");
        Py_DECREF(np);
    }
    PyErr_Clear(); /* without numpy, items must have the buffer protocol themselves */
    if (!p->errors || probe_fields(p) < 0) {
        Py_XDECREF(p->obj);
        Py_XDECREF(p->errors);
        Py_XDECREF(p->asarray);
        pthread_mutex_destroy(&p->call_lock);
        free(p);
        return -1;
    }
    fill_dataset(p, ds);
    *out = p;
    return 0;
}

/* The sample index in a loader error ("worker 2: sample 17 of ..."), or -1. */
static long long sample_of(const char *err)
{
    const char *s = err ? strstr(err, "sample ") : NULL;
    unsigned long long v;
    return s && sscanf(s, "sample %llu", &v) == 1 ? (long long)v : -1;
}

int stoke_pyds_reraise(stoke_pyds *p, const char *err)
{
    if (!p || PyDict_GET_SIZE(p->errors) == 0)
        return 0;
    long long idx = sample_of(err);
    PyObject *key = PyLong_FromLongLong(idx);
    PyObject *exc = key ? PyDict_GetItemWithError(p->errors, key) : NULL;
    Py_XDECREF(key);
    if (!exc) {
        PyErr_Clear();
        return 0;
    }
    Py_INCREF(exc);
    PyDict_Clear(p->errors);
    PyObject *r = PyObject_CallMethod(exc, "add_note", "s", err); /* 3.11+: names the sample */
    if (!r)
        PyErr_Clear();
    Py_XDECREF(r);
    raise_exception(exc); /* the original exception, its traceback kept */
    return 1;
}

void stoke_pyds_clear(stoke_pyds *p)
{
    if (p)
        PyDict_Clear(p->errors);
}
