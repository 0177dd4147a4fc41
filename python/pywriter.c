/* A batch writer: the stoke_dataset behind stoke.DataLoader over a Python dataset (stoke/_dropin.py).
 *
 * The C loader sees a dataset whose "sample" i is batch i of the epoch and whose one field is a
 * block of `blob_bytes` bytes (batch size 1): the writer's Python `fill(i, worker, view)` fetches
 * the batch's samples, collates them and writes the tensors and a small pickle of the structure
 * straight into the block, a slot of the loader's pinned batch memory.  With worker processes
 * the loader's forked children call it, so __getitem__, collate_fn and worker_init_fn run in
 * parallel, each in its own interpreter, and the batch data crosses no pipe: the block is in the
 * shared pinned mapping.  ITERABLE writers (`nbatches` < 0) call `next_fill(worker, view)`
 * instead: each worker's own iterator.
 *
 * Every Python callable answers None/an int for success and a str for a failure (the message of
 * the loader's error); exceptions are the Python layer's to keep (it puts them where the
 * consumer's process finds them).  The fork hooks take the GIL around the fork and run
 * PyOS_BeforeFork / AfterFork_Parent / AfterFork_Child, as os.fork() does, and then the
 * writer's `fork_child(worker)` in the new process (worker -1: the zygote). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke_py.h"

struct stoke_pywriter {
    PyObject *obj;       /* the writer: fill, next_fill, set_epoch, worker_init, fork_child */
    int64_t nbatches;    /* MAP: batches per epoch; < 0: ITERABLE */
    size_t blob_bytes;   /* one batch's block */
    stoke_field field;   /* "batch": u8 [blob_bytes] */
    int64_t shape[1];
    PyGILState_STATE fork_gil; /* taken by fork_prepare, released after the fork on both sides */
    int froze;                 /* fork_prepare froze the GC's objects: fork_parent thaws them */
};

/* The result of a writer call: -1 (a str: its text in msg), or the int it returned (None: 0).
 * A raised exception (a bug of the Python layer, which catches the dataset's) is a failure
 * too, its text in msg.  GIL held; steals r. */
static long long result_of(PyObject *r, const char *what, char *msg, size_t msg_len)
{
    long long v = 0;
    if (!r) {
        PyObject *t, *e, *tb;
        PyErr_Fetch(&t, &e, &tb);
        PyObject *s = e ? PyObject_Str(e) : NULL;
        snprintf(msg, msg_len, "%s raised %s: %s", what,
                 t ? ((PyTypeObject *)t)->tp_name : "?", s ? PyUnicode_AsUTF8(s) : "?");
        Py_XDECREF(s);
        Py_XDECREF(t);
        Py_XDECREF(e);
        Py_XDECREF(tb);
        PyErr_Clear();
        return -1;
    }
    if (PyUnicode_Check(r)) {
        const char *s = PyUnicode_AsUTF8(r);
        snprintf(msg, msg_len, "%s", s ? s : "?");
        v = -1;
    } else if (PyLong_Check(r)) {
        v = PyLong_AsLongLong(r);
    } else if (PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2) { /* next_fill: (bytes, index) */
        v = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 0));
    }
    PyErr_Clear();
    Py_DECREF(r);
    return v;
}

/* view: a writable memoryview of the block, released after the call (a view the Python code
 * kept would otherwise outlive the slot). */
static PyObject *block_view(stoke_pywriter *w, void *dst)
{
    return PyMemoryView_FromMemory(dst, (Py_ssize_t)w->blob_bytes, PyBUF_WRITE);
}

static void block_release(PyObject *view)
{
    if (!view)
        return;
    PyObject *r = PyObject_CallMethod(view, "release", NULL);
    if (!r)
        PyErr_Clear(); /* still exported: the object keeps it; the memory stays the loader's */
    Py_XDECREF(r);
    Py_DECREF(view);
}

static int pyw_get(void *user, uint64_t index, void *const dst[], int64_t len[], int worker,
                   char *msg, size_t msg_len)
{
    stoke_pywriter *w = user;
    (void)len;
    if (stoke_pyds_enter(msg, msg_len) != 0)
        return STOKE_ECANCELED;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *view = block_view(w, dst[0]);
    PyObject *r = view ? PyObject_CallMethod(w->obj, "fill", "KiO", (unsigned long long)index,
                                             worker, view)
                       : NULL;
    long long v = result_of(r, "fill", msg, msg_len);
    block_release(view);
    PyGILState_Release(g);
    stoke_pyds_leave();
    return v < 0 ? STOKE_EDATA : STOKE_OK;
}

static int pyw_next(void *user, int worker, int num_workers, void *const dst[], int64_t len[],
                    uint64_t *index, char *msg, size_t msg_len)
{
    stoke_pywriter *w = user;
    (void)len;
    (void)num_workers;
    if (stoke_pyds_enter(msg, msg_len) != 0)
        return STOKE_ECANCELED;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *view = block_view(w, dst[0]);
    PyObject *r = view ? PyObject_CallMethod(w->obj, "next_fill", "iO", worker, view) : NULL;
    if (r && PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2)
        *index = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(r, 1));
    PyErr_Clear();
    long long v = result_of(r, "next_fill", msg, msg_len);
    block_release(view);
    PyGILState_Release(g);
    stoke_pyds_leave();
    return v < 0 ? STOKE_EDATA : v == 0 ? STOKE_EEND : STOKE_OK;
}

/* A call of a hook that answers None or an error string. */
static int call_hook(stoke_pywriter *w, const char *name, const char *fmt, long long a, long long b)
{
    char msg[512];
    if (stoke_pyds_enter(msg, sizeof(msg)) != 0)
        return STOKE_ECANCELED;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallMethod(w->obj, name, fmt, a, b);
    long long v = result_of(r, name, msg, sizeof(msg));
    PyGILState_Release(g);
    stoke_pyds_leave();
    return v < 0 ? STOKE_EINVAL : STOKE_OK;
}

static int pyw_worker_init(void *user, int worker, int num_workers)
{
    return call_hook(user, "worker_init", "LL", worker, num_workers);
}

static int pyw_set_epoch(void *user, uint64_t epoch)
{
    return call_hook(user, "set_epoch", "LL", (long long)epoch, 0);
}

/* gc.<name>(): its int result (get_freeze_count), 0 for None, -1 on failure (cleared). */
static long gc_call(const char *name)
{
    PyObject *gc = PyImport_ImportModule("gc");
    PyObject *r = gc ? PyObject_CallMethod(gc, name, NULL) : NULL;
    long v = r == NULL ? -1 : PyLong_Check(r) ? PyLong_AsLong(r) : 0;
    Py_XDECREF(r);
    Py_XDECREF(gc);
    PyErr_Clear();
    return v;
}

/* The objects the GC tracks are frozen across the fork (gc.freeze(), then gc.unfreeze() in the
 * parent: its GC tracks them all again, in the oldest generation), so a child's collections
 * never walk them: a walk writes every tracked object's GC header, which copies the parent's
 * pages into the child (copy-on-write).  A child keeps them frozen (cycles among what it
 * inherited are not collected there); a program that froze objects itself is left as it is. */
static void pyw_fork_prepare(void *user)
{
    stoke_pywriter *w = user;
    w->fork_gil = PyGILState_Ensure();
    w->froze = gc_call("get_freeze_count") == 0 && gc_call("freeze") == 0;
    PyOS_BeforeFork();
}

static void pyw_fork_parent(void *user)
{
    stoke_pywriter *w = user;
    PyOS_AfterFork_Parent();
    if (w->froze)
        gc_call("unfreeze");
    w->froze = 0;
    PyGILState_Release(w->fork_gil);
}

static void pyw_fork_child(void *user, int worker)
{
    stoke_pywriter *w = user;
    PyOS_AfterFork_Child();
    w->froze = 0; /* (what the parent froze stays frozen here) */
    PyObject *r = PyObject_CallMethod(w->obj, "fork_child", "i", worker);
    if (!r)
        PyErr_Print();
    Py_XDECREF(r);
    PyGILState_Release(w->fork_gil);
}

static uint64_t pyw_length(void *user)
{
    return (uint64_t)((stoke_pywriter *)user)->nbatches;
}

static void pyw_close(void *user)
{
    stoke_pywriter *w = user;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(w->obj);
    PyGILState_Release(g);
    free(w);
}

/* _stoke._pad_rows(dst, offset, width, row_bytes, ptrs, lens, pad): the built-in padding's
 * copy (stoke/_dropin.py _Collator.pad_leaf).  Sample i's first min(lens[i], width) rows of
 * row_bytes bytes, read at address ptrs[i] (a contiguous CPU tensor's data_ptr(), which the
 * caller holds and has checked: dtype, shape after the first dimension, contiguity), go to
 * dst[offset + i * width * row_bytes ...]; the rest of its width is the pad pattern (one element,
 * repeated).  The destination is bounds-checked; the sources are the caller's to vouch for. */
PyObject *stoke_py_pad_rows(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer dst, pad;
    Py_ssize_t off, width, row;
    PyObject *ptrs, *lens;
    if (!PyArg_ParseTuple(args, "w*nnnOOy*:_pad_rows", &dst, &off, &width, &row, &ptrs, &lens,
                          &pad))
        return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = PyList_Check(ptrs) && PyList_Check(lens) ? PyList_GET_SIZE(ptrs) : -1;
    if (n < 0 || PyList_GET_SIZE(lens) != n || off < 0 || width < 0 || row < 0 ||
        pad.len < 1 || row % pad.len != 0 ||
        (width && row && n > (dst.len - off) / width / row) || off > dst.len) {
        PyErr_SetString(PyExc_ValueError, "stoke: _pad_rows: bad arguments");
        goto out;
    }
    char *d = (char *)dst.buf + off;
    for (Py_ssize_t i = 0; i < n; i++, d += width * row) {
        const char *src = PyLong_AsVoidPtr(PyList_GET_ITEM(ptrs, i));
        Py_ssize_t len = PyLong_AsSsize_t(PyList_GET_ITEM(lens, i));
        if (PyErr_Occurred())
            goto out;
        Py_ssize_t keep = len < 0 ? 0 : len < width ? len : width;
        if (keep)
            memcpy(d, src, (size_t)(keep * row));
        char *p = d + keep * row, *end = d + width * row;
        if (pad.len == 1 || !memcmp(pad.buf, (const char *)pad.buf + 1, (size_t)pad.len - 1))
            memset(p, *(const char *)pad.buf, (size_t)(end - p)); /* every byte alike: 0, -1 */
        else
            for (; p < end; p += pad.len)
                memcpy(p, pad.buf, (size_t)pad.len);
    }
    res = Py_NewRef(Py_None);
out:
    PyBuffer_Release(&dst);
    PyBuffer_Release(&pad);
    return res;
}

int stoke_pywriter_open(PyObject *obj, stoke_dataset *ds)
{
    long long nbatches = 0, blob = 0;
    PyObject *n = PyObject_GetAttrString(obj, "nbatches");
    PyObject *b = n ? PyObject_GetAttrString(obj, "blob_bytes") : NULL;
    if (b) {
        nbatches = PyLong_AsLongLong(n);
        blob = PyLong_AsLongLong(b);
    }
    Py_XDECREF(n);
    Py_XDECREF(b);
    if (PyErr_Occurred())
        return -1;
    if (blob < 64 || nbatches == 0) {
        PyErr_Format(PyExc_ValueError, "stoke: writer: blob_bytes %lld, nbatches %lld", blob,
                     nbatches);
        return -1;
    }
    stoke_pywriter *w = calloc(1, sizeof(*w));
    if (!w) {
        PyErr_NoMemory();
        return -1;
    }
    w->obj = Py_NewRef(obj);
    w->nbatches = nbatches;
    w->blob_bytes = (size_t)blob;
    w->shape[0] = blob;
    snprintf(w->field.name, sizeof(w->field.name), "batch");
    w->field.dtype = STOKE_DTYPE_U8;
    w->field.ndim = 1;
    w->field.shape = w->shape;
    if (stoke_field_finish(&w->field) != STOKE_OK) {
        PyErr_Format(PyExc_ValueError, "stoke: writer: %s", stoke_last_error());
        pyw_close(w);
        return -1;
    }
    PyObject *name = PyObject_GetAttrString(obj, "name");
    const char *s = name && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
    stoke_dataset_init(ds);
    snprintf(ds->name, sizeof(ds->name), "%s", s ? s : "python");
    Py_XDECREF(name);
    PyErr_Clear();
    ds->kind = nbatches < 0 ? STOKE_DATASET_ITERABLE : STOKE_DATASET_MAP;
    ds->user = w;
    ds->nfields = 1;
    ds->fields = &w->field;
    if (nbatches > 0) {
        ds->length = pyw_length;
        ds->get = pyw_get;
    } else {
        ds->next = pyw_next;
    }
    ds->worker_init = pyw_worker_init;
    ds->set_epoch = pyw_set_epoch;
    ds->fork_prepare = pyw_fork_prepare;
    ds->fork_parent = pyw_fork_parent;
    ds->fork_child = pyw_fork_child;
    ds->close = pyw_close;
    return 0;
}
