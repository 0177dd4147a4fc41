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
    int64_t nbatches;    /* MAP: the C loader's batches per epoch (a bound); < 0: ITERABLE */
    /* MAP: the planned epoch's batches, and the word that says to answer length() with them
     * (the writer's `live_length`: two addresses in its plan's shared header; NULL: none) */
    const int64_t *live_n, *live_on;
    size_t blob_bytes;   /* one batch's block */
    stoke_field field;   /* "batch": u8 [blob_bytes] */
    int64_t shape[1];
    PyGILState_STATE fork_gil; /* taken by fork_prepare, released after the fork on both sides */
    int froze;                 /* fork_prepare froze the GC's objects: fork_parent thaws them */
    int inherited;             /* a forked child (the zygote): its objects came frozen */
};

/* A fill's result when the dataset raised a KeyboardInterrupt or SystemExit (bytes: its text):
 * not a bad sample (fill_status). */
#define RESULT_INTERRUPTED (-2)

/* The result of a writer call: -1 (a str: its text in msg), RESULT_INTERRUPTED (bytes: its text
 * in msg), or the int it returned (None: 0).  A raised exception (a bug of the Python layer,
 * which catches the dataset's) is a failure too, its text in msg.  GIL held; steals r. */
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
    } else if (PyBytes_Check(r)) {
        snprintf(msg, msg_len, "%s", PyBytes_AS_STRING(r));
        v = RESULT_INTERRUPTED;
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

/* A fill's or next_fill's status from its result v (< 0: it failed; 0 from next_fill: the
 * worker's iterator ended).  A failure while the batch is no longer wanted is the batch given
 * up between two samples (the writer's _Abandoned): STOKE_ECANCELED, not a bad sample.  A
 * KeyboardInterrupt or SystemExit (RESULT_INTERRUPTED) is STOKE_ECANCELED too: never a bad
 * sample (src/loader/badsample.c), it ends the epoch with the loader's error (the Python layer
 * raises the exception itself in its place where it was raised in the caller's process). */
static int fill_status(long long v, int next)
{
    if (v == RESULT_INTERRUPTED)
        return STOKE_ECANCELED;
    if (v < 0)
        return stoke_dataset_abandoned() ? STOKE_ECANCELED : STOKE_EDATA;
    return next && v == 0 ? STOKE_EEND : STOKE_OK;
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
    return fill_status(v, 0);
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
    return fill_status(v, 1);
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
 * inherited are not collected there); a program that froze objects itself is left as it is.
 * The zygote, whose objects came frozen, forks its workers without asking: gc.get_freeze_count()
 * walks every frozen object (9-18 ms a worker's start there, the parent's ~100 k objects with
 * torch imported, on the first batch's path). */
static void pyw_fork_prepare(void *user)
{
    stoke_pywriter *w = user;
    w->fork_gil = PyGILState_Ensure();
    w->froze = !w->inherited && gc_call("get_freeze_count") == 0 && gc_call("freeze") == 0;
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
    w->inherited = 1;
    PyObject *r = PyObject_CallMethod(w->obj, "fork_child", "i", worker);
    if (!r)
        PyErr_Print();
    Py_XDECREF(r);
    PyGILState_Release(w->fork_gil);
}

/* The loader's creation sizes its epochs by the bound (nbatches); once the writer turns
 * live_on on, the loader's later questions (a replacement's candidates, the on_error budget's
 * fraction) get the planned epoch's batches, which may change from epoch to epoch. */
static uint64_t pyw_length(void *user)
{
    const stoke_pywriter *w = user;
    if (w->live_on && __atomic_load_n(w->live_on, __ATOMIC_ACQUIRE)) {
        int64_t n = __atomic_load_n(w->live_n, __ATOMIC_RELAXED);
        return n > 0 ? (uint64_t)n : 0;
    }
    return (uint64_t)w->nbatches;
}

static void pyw_close(void *user)
{
    stoke_pywriter *w = user;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(w->obj);
    PyGILState_Release(g);
    free(w);
}

/* Interned attribute names for stoke_py_pad_batch (GIL held): all made, or none kept. */
static PyObject *s_dtype, *s_shape, *s_is_contiguous, *s_is_cpu, *s_data_ptr, *s_is_conj,
    *s_is_neg, *s_is_complex, *s_element_size;

static int pad_names(void)
{
    if (s_element_size)
        return 0;
    PyObject **names[] = {&s_dtype,   &s_shape,   &s_is_contiguous, &s_is_cpu,
                          &s_data_ptr, &s_is_conj, &s_is_neg,       &s_is_complex,
                          &s_element_size};
    static const char *const text[] = {"dtype",    "shape",   "is_contiguous", "is_cpu",
                                       "data_ptr", "is_conj", "is_neg",        "is_complex",
                                       "element_size"};
    size_t n = sizeof(names) / sizeof(names[0]);
    for (size_t i = 0; i < n; i++) {
        if (*names[i])
            continue;
        *names[i] = PyUnicode_InternFromString(text[i]);
        if (!*names[i]) {
            for (size_t j = 0; j < i; j++) /* none kept: the next call makes them again */
                Py_CLEAR(*names[j]);
            return -1;
        }
    }
    return 0;
}

/* A tensor's shape as a tuple (torch.Size), a new reference; NULL with an exception set. */
static PyObject *pad_shape(PyObject *t)
{
    PyObject *sh = PyObject_GetAttr(t, s_shape);
    if (sh && !PyTuple_Check(sh)) {
        PyErr_SetString(PyExc_TypeError, "stoke: pad: a tensor's shape is not a tuple");
        Py_CLEAR(sh);
    }
    return sh;
}

/* Whether a.dtype is d and a's shape after its first dimension is rest's (rest: shape 0's).
 * 1 yes, 0 no, -1 with an exception set; *len: a's first dimension. */
static int pad_same(PyObject *t, PyObject *d0, PyObject *rest, Py_ssize_t *len)
{
    PyObject *d = PyObject_GetAttr(t, s_dtype);
    if (!d)
        return -1;
    int same = PyObject_RichCompareBool(d, d0, Py_EQ);
    Py_DECREF(d);
    if (same != 1)
        return same;
    PyObject *sh = pad_shape(t);
    if (!sh)
        return -1;
    Py_ssize_t nd = PyTuple_GET_SIZE(sh);
    same = nd >= 1 && nd == PyTuple_GET_SIZE(rest);
    for (Py_ssize_t k = 1; same == 1 && k < nd; k++)
        same = PyObject_RichCompareBool(PyTuple_GET_ITEM(sh, k), PyTuple_GET_ITEM(rest, k), Py_EQ);
    *len = same == 1 ? PyLong_AsSsize_t(PyTuple_GET_ITEM(sh, 0)) : 0;
    Py_DECREF(sh);
    if (same == 1 && *len == -1 && PyErr_Occurred())
        return -1;
    return same;
}

/* A method's answer as a truth value: 1, 0, -1 with an exception set. */
static int pad_call_true(PyObject *t, PyObject *name)
{
    PyObject *r = PyObject_CallMethodNoArgs(t, name);
    int ok = r ? PyObject_IsTrue(r) : -1;
    Py_XDECREF(r);
    return ok;
}

/* Whether t's bytes are its values, in order, in host memory: t is exactly the tensor type
 * (a subclass may keep its data elsewhere or read it otherwise: __torch_dispatch__ wrappers
 * have no data pointer), contiguous, on the CPU, without the negative bit (a lazy negation)
 * nor, for complex dtypes (cx: 1), the conjugate bit.  1, 0, -1 with an exception set;
 * *ptr its data_ptr() when it is. */
static int pad_plain(PyObject *t, PyTypeObject *type, int cx, const char **ptr)
{
    if (!Py_IS_TYPE(t, type))
        return 0;
    int ok = pad_call_true(t, s_is_contiguous);
    if (ok == 1) {
        PyObject *r = PyObject_GetAttr(t, s_is_cpu);
        ok = r ? PyObject_IsTrue(r) : -1;
        Py_XDECREF(r);
    }
    if (ok == 1) {
        ok = pad_call_true(t, s_is_neg);
        ok = ok < 0 ? -1 : !ok;
    }
    if (ok == 1 && cx) {
        ok = pad_call_true(t, s_is_conj);
        ok = ok < 0 ? -1 : !ok;
    }
    if (ok == 1) {
        PyObject *r = PyObject_CallMethodNoArgs(t, s_data_ptr);
        *ptr = r ? PyLong_AsVoidPtr(r) : NULL;
        Py_XDECREF(r);
        if (!r || (!*ptr && PyErr_Occurred()))
            ok = -1;
    }
    return ok;
}

/* _stoke._pad_batch(dst, off, batch, tensor_type, itemsize, cap, multiple_of, pad): the
 * built-in padding of one leaf (stoke/_dropin.py _Collator.pad_leaf) in one call, the checks of
 * every sample's tensor included.  batch: a sequence of tensors (isinstance of tensor_type) of
 * one dtype (itemsize bytes an element) and one shape after the first dimension; their lengths
 * (first dimensions) are capped at cap (None: no cap) and padded to the longest, rounded up to
 * multiple_of (0: not) but not beyond cap.  Sample i's rows go to dst[off + i * L * row ...],
 * the rest of its L rows the pad pattern (one element, repeated); then the int64 lengths at the
 * next 64-byte boundary: the layout of _Block.tensor((n, L) + rest), then _Block.tensor((n,)).
 * Answers:
 *   None          an element is not a tensor_type (the caller converts them and calls again);
 *   an int i      sample i has no dimension, or another dtype or shape after the first
 *                 dimension than sample 0 (0: sample 0 has no dimension);
 *   (shape, None) written: shape (n, L) + rest;
 *   (shape, lengths) not written: a sample's tensor is not one whose bytes are its values
 *                 (pad_plain: a subclass, not contiguous, not on the CPU, a negative or
 *                 conjugate view; the caller copies with torch), or the two do not fit in dst
 *                 (the caller's _Block.tensor raises its overflow); lengths: the capped
 *                 lengths, a list.
 * The checks run in pad_leaf's order: dtype and shape of every sample (the first bad one
 * answers; sample 0's are read once), then pad_plain's up to the first that is not. */
PyObject *stoke_py_pad_batch(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer dst, pad;
    Py_ssize_t off, itemsize, multiple;
    PyObject *batch, *type, *capo;
    if (!PyArg_ParseTuple(args, "w*nOOnOny*:_pad_batch", &dst, &off, &batch, &type, &itemsize,
                          &capo, &multiple, &pad))
        return NULL;
    PyObject *res = NULL, *seq = NULL, *d0 = NULL, *sh0 = NULL, *shape = NULL, *lens = NULL;
    Py_ssize_t stack_len[64], *len = stack_len;
    const char *stack_ptr[64], **ptr = stack_ptr;
    Py_ssize_t cap = -1;
    if (pad_names() < 0)
        goto out;
    if (capo != Py_None) {
        cap = PyLong_AsSsize_t(capo);
        if (cap == -1 && PyErr_Occurred())
            goto out;
        if (cap < 0) {
            PyErr_Format(PyExc_ValueError, "stoke: pad: max_length %zd is negative", cap);
            goto out;
        }
    }
    if (multiple < 0) {
        PyErr_Format(PyExc_ValueError, "stoke: pad: pad_to_multiple_of %zd is negative", multiple);
        goto out;
    }
    if (!PyType_Check(type) || off < 0 || off > dst.len || itemsize < 1 || pad.len != itemsize) {
        PyErr_SetString(PyExc_ValueError, "stoke: _pad_batch: bad arguments");
        goto out;
    }
    /* a tuple of its own: attribute reads below can run Python code (tensor subclasses) that
     * could change a list given here under the borrowed items */
    seq = PySequence_Tuple(batch);
    if (!seq)
        goto out;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "stoke: _pad_batch: an empty batch");
        goto out;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyObject_TypeCheck(items[i], (PyTypeObject *)type)) {
            res = Py_NewRef(Py_None);
            goto out;
        }
    if (n > 64) {
        len = PyMem_Malloc((size_t)n * sizeof(*len));
        ptr = PyMem_Malloc((size_t)n * sizeof(*ptr));
        if (!len || !ptr) {
            PyErr_NoMemory();
            goto out;
        }
    }
    /* dtype and shape after the first dimension: sample 0's, then each one's */
    d0 = PyObject_GetAttr(items[0], s_dtype);
    sh0 = d0 ? pad_shape(items[0]) : NULL;
    if (!sh0)
        goto out;
    if (PyTuple_GET_SIZE(sh0) < 1) {
        res = PyLong_FromLong(0);
        goto out;
    }
    /* the copy's sizes come from itemsize: it must be the dtype's (every sample's, checked
     * below) */
    PyObject *es = PyObject_CallMethodNoArgs(items[0], s_element_size);
    Py_ssize_t esize = es ? PyLong_AsSsize_t(es) : -1;
    Py_XDECREF(es);
    if (esize == -1 && PyErr_Occurred())
        goto out;
    if (esize != itemsize) {
        PyErr_Format(PyExc_ValueError, "stoke: _pad_batch: itemsize %zd, the dtype's is %zd",
                     itemsize, esize);
        goto out;
    }
    Py_ssize_t L = 0, row = itemsize;
    for (Py_ssize_t k = 1; k < PyTuple_GET_SIZE(sh0); k++) {
        Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(sh0, k));
        if (d == -1 && PyErr_Occurred())
            goto out;
        if (row >= 0) /* -1: too many bytes (an expanded view): not written here */
            row = d == 0 ? 0 : d > 0 && row <= PY_SSIZE_T_MAX / d ? row * d : -1;
    }
    len[0] = PyLong_AsSsize_t(PyTuple_GET_ITEM(sh0, 0)); /* sample 0: read above */
    if (len[0] == -1 && PyErr_Occurred())
        goto out;
    for (Py_ssize_t i = 0; i < n; i++) {
        int same = i == 0 ? 1 : pad_same(items[i], d0, sh0, &len[i]);
        if (same < 0)
            goto out;
        if (!same) {
            res = PyLong_FromSsize_t(i);
            goto out;
        }
        if (cap >= 0 && len[i] > cap)
            len[i] = cap;
        if (len[i] > L)
            L = len[i];
    }
    Py_ssize_t longest = L;
    if (multiple > 0) {
        if (L % multiple && L / multiple + 1 > PY_SSIZE_T_MAX / multiple) {
            PyErr_Format(PyExc_OverflowError, "stoke: pad: pad_to_multiple_of %zd: too large",
                         multiple);
            goto out;
        }
        L = L % multiple ? (L / multiple + 1) * multiple : L;
        if (cap >= 0 && L > (cap > longest ? cap : longest))
            L = cap > longest ? cap : longest;
    }
    shape = PyTuple_New(PyTuple_GET_SIZE(sh0) + 1);
    if (!shape)
        goto out;
    PyTuple_SET_ITEM(shape, 0, PyLong_FromSsize_t(n));
    PyTuple_SET_ITEM(shape, 1, PyLong_FromSsize_t(L));
    for (Py_ssize_t k = 1; k < PyTuple_GET_SIZE(sh0); k++)
        PyTuple_SET_ITEM(shape, k + 1, Py_NewRef(PyTuple_GET_ITEM(sh0, k)));
    if (PyErr_Occurred())
        goto out;
    /* contiguous CPU tensors, and room for both: written here */
    PyObject *cxo = PyObject_GetAttr(d0, s_is_complex);
    int is_cx = cxo ? PyObject_IsTrue(cxo) : -1;
    Py_XDECREF(cxo);
    if (is_cx < 0)
        goto out;
    int plain = row >= 0;
    for (Py_ssize_t i = 0; plain == 1 && i < n; i++)
        plain = pad_plain(items[i], (PyTypeObject *)type, is_cx, &ptr[i]);
    if (plain < 0)
        goto out;
    if (row > 0 && L > PY_SSIZE_T_MAX / row)
        plain = 0;
    Py_ssize_t width = plain && row && L ? row * L : 0; /* one sample's bytes */
    size_t room = (size_t)(dst.len - off), out_bytes = 0, lens_at = 0;
    if (plain && width && (size_t)width > room / (size_t)n)
        plain = 0;
    if (plain) {
        out_bytes = (size_t)n * (size_t)width;
        lens_at = (out_bytes + 63) & ~(size_t)63; /* _align(), as _Block.take */
        plain = lens_at <= room && (size_t)n * 8 <= room - lens_at;
    }
    if (!plain) {
        lens = PyList_New(n);
        for (Py_ssize_t i = 0; lens && i < n; i++) {
            PyObject *v = PyLong_FromSsize_t(len[i]);
            if (!v)
                Py_CLEAR(lens);
            else
                PyList_SET_ITEM(lens, i, v);
        }
        if (!lens)
            goto out;
        res = PyTuple_Pack(2, shape, lens);
        goto out;
    }
    int same_bytes =
        pad.len == 1 || !memcmp(pad.buf, (const char *)pad.buf + 1, (size_t)pad.len - 1);
    char *d = (char *)dst.buf + off;
    for (Py_ssize_t i = 0; i < n; i++, d += width) {
        size_t keep = (size_t)len[i] * (size_t)row;
        if (keep)
            memcpy(d, ptr[i], keep);
        char *p = d + keep, *end = d + width;
        if (same_bytes)
            memset(p, *(const char *)pad.buf, (size_t)(end - p)); /* every byte alike: 0, -1 */
        else
            for (; p < end; p += pad.len)
                memcpy(p, pad.buf, (size_t)pad.len);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = len[i];
        memcpy((char *)dst.buf + off + lens_at + (size_t)i * 8, &v, 8);
    }
    res = PyTuple_Pack(2, shape, Py_None);
out:
    if (len != stack_len)
        PyMem_Free(len);
    if (ptr != stack_ptr)
        PyMem_Free(ptr);
    Py_XDECREF(lens);
    Py_XDECREF(shape);
    Py_XDECREF(sh0);
    Py_XDECREF(d0);
    Py_XDECREF(seq);
    PyBuffer_Release(&dst);
    PyBuffer_Release(&pad);
    return res;
}

/* An address given as a Python int (a converter for PyArg_ParseTuple): 1, or 0 with an error. */
static int address_of(PyObject *v, void *out)
{
    void *p = PyLong_AsVoidPtr(v);
    if (!p && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "stoke: writer: live_length: a NULL address");
    *(void **)out = p;
    return p != NULL;
}

PyObject *stoke_pywriter_object(const stoke_dataset *ds)
{
    return ds->close == pyw_close && ds->user ? ((stoke_pywriter *)ds->user)->obj : NULL;
}

int stoke_pywriter_open(PyObject *obj, stoke_dataset *ds)
{
    long long nbatches = 0, blob = 0;
    void *live_n = NULL, *live_on = NULL;
    PyObject *n = PyObject_GetAttrString(obj, "nbatches");
    PyObject *b = n ? PyObject_GetAttrString(obj, "blob_bytes") : NULL;
    PyObject *live = b ? PyObject_GetAttrString(obj, "live_length") : NULL;
    if (live) {
        nbatches = PyLong_AsLongLong(n);
        blob = PyLong_AsLongLong(b);
        if (live != Py_None)
            (void)PyArg_ParseTuple(live, "O&O&;stoke: writer: live_length", address_of, &live_n,
                                   address_of, &live_on); /* (an error: PyErr_Occurred below) */
    }
    Py_XDECREF(n);
    Py_XDECREF(b);
    Py_XDECREF(live);
    if (PyErr_Occurred())
        return -1;
    if (blob < 64) {
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
    w->live_n = live_n;
    w->live_on = live_on;
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
    if (nbatches >= 0) { /* (0: a MAP dataset whose epochs have no batch) */
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
