/* _stoke.PinnedBuffer(nbytes, pin=True): a block of stoke's pinned memory (stoke_pinned_alloc:
 * the pinned pool's cache, cap and statistics), or of ordinary memory when the pool cannot give
 * one or pin is False (`pinned` says which).  Buffer protocol (writable bytes), freed when the last
 * view goes. stoke.DataLoader copies a batch into one when its caller holds every batch buffer of
 * the loader (list(loader)), so that holding batches never stops the loader. */
#include "stoke_py.h" /* (Python.h first: it sets the feature macros, MAP_ANONYMOUS's too) */

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

typedef struct {
    PyObject_HEAD void *p;
    Py_ssize_t n;
    int pinned;
    int own; /* p is this object's memory (OWN_HEAP, OWN_MAP), not the pool's (0) */
} PinBufObject;

enum { OWN_HEAP = 1, OWN_MAP = 2 };
#define MAP_MIN    ((size_t)128 << 10) /* glibc's first mmap threshold */
#define KEEP_MAPS  8                   /* mappings kept for reuse ... */
#define KEEP_BYTES ((size_t)64 << 20)  /* ... up to this many bytes */

/* Large blocks freed, kept for the next ones (under the GIL): a fresh mapping's pages are
 * faulted in and zeroed by the kernel, which made list(loader) of 600 MB 0.31 s instead of the
 * heap's 0.19 (glibc reuses what was freed); a few are kept, not all (they stay resident). */
static struct {
    void *p;
    size_t n;
} kept[KEEP_MAPS];
static size_t kept_bytes;

/* The PinnedBuffers alive and their bytes (under the GIL): PinnedBuffer.held(), with which the
 * tests see what a kept part of a batch keeps (a label's copy, not the whole batch's). */
static Py_ssize_t live_count, live_bytes;

static size_t map_size(Py_ssize_t n)
{
    return ((size_t)n + 4095) & ~(size_t)4095;
}

static void *map_get(Py_ssize_t n)
{
    size_t want = map_size(n);
    for (int i = 0; i < KEEP_MAPS; i++)
        if (kept[i].p && kept[i].n == want) {
            void *p = kept[i].p;
            kept[i].p = NULL;
            kept_bytes -= want;
            return p;
        }
    void *p = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void map_put(void *p, Py_ssize_t n)
{
    size_t sz = map_size(n);
    for (int i = 0; sz <= KEEP_BYTES && i < KEEP_MAPS; i++)
        if (!kept[i].p) {
            while (kept_bytes + sz > KEEP_BYTES) { /* make room: the others go */
                for (int j = 0; j < KEEP_MAPS; j++)
                    if (kept[j].p) {
                        munmap(kept[j].p, kept[j].n);
                        kept_bytes -= kept[j].n;
                        kept[j].p = NULL;
                        break;
                    }
            }
            kept[i].p = p;
            kept[i].n = sz;
            kept_bytes += sz;
            return;
        }
    munmap(p, sz);
}

static PyObject *pinbuf_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    Py_ssize_t n;
    int pin = 1;
    static char *kwlist[] = {"nbytes", "pin", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "n|p:PinnedBuffer", kwlist, &n, &pin))
        return NULL;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "stoke: PinnedBuffer needs nbytes >= 1");
        return NULL;
    }
    PinBufObject *self = (PinBufObject *)type->tp_alloc(type, 0);
    if (!self)
        return NULL;
    self->n = n;
    int rc = STOKE_ENOTSUP; /* pin=False: ordinary memory, the pool (and its warning) unasked */
    if (pin) {
        stoke_py_pinned_settle(); /* (blocks whose copies are done may be reused) */
        Py_BEGIN_ALLOW_THREADS;
        rc = stoke_pinned_alloc((size_t)n, &self->p);
        Py_END_ALLOW_THREADS;
    }
    self->pinned = rc == STOKE_OK && stoke_is_pinned(self->p) > 0;
    if (rc != STOKE_OK && (size_t)n >= MAP_MIN) {
        /* a large one mapped on its own: from the heap, a held batch's small tensors between
         * the large ones freed kept the heap from giving them back (glibc's mmap threshold
         * rises to the largest block freed): 3 MiB a batch while a loop kept only labels */
        self->own = OWN_MAP;
        self->p = map_get(n);
        if (!self->p) {
            Py_DECREF(self);
            return PyErr_NoMemory();
        }
    } else if (rc != STOKE_OK) {
        self->own = OWN_HEAP; /* (64-byte aligned: tensors of any dtype view it) */
        self->p = aligned_alloc(64, ((size_t)n + 63) & ~(size_t)63);
        if (!self->p) {
            Py_DECREF(self);
            return PyErr_NoMemory();
        }
    }
    live_count++;
    live_bytes += n;
    stoke_py_flush_warnings();
    return (PyObject *)self;
}

static void pinbuf_dealloc(PyObject *obj)
{
    PinBufObject *self = (PinBufObject *)obj;
    if (self->p && self->own == OWN_MAP)
        map_put(self->p, self->n);
    else if (self->p && self->own)
        free(self->p);
    else if (self->p && self->pinned)
        stoke_py_pinned_free(self->p); /* (once a copy from it is done: fence.c) */
    else if (self->p)
        stoke_pinned_free(self->p);
    if (self->p) {
        live_count--;
        live_bytes -= self->n;
    }
    Py_TYPE(obj)->tp_free(obj);
}

static int pinbuf_getbuffer(PyObject *obj, Py_buffer *view, int flags)
{
    PinBufObject *self = (PinBufObject *)obj;
    return PyBuffer_FillInfo(view, obj, self->p, self->n, 0, flags);
}

static PyBufferProcs pinbuf_as_buffer = {.bf_getbuffer = pinbuf_getbuffer};

static PyObject *pinbuf_get_pinned(PyObject *obj, void *unused)
{
    (void)unused;
    return PyBool_FromLong(((PinBufObject *)obj)->pinned);
}

static Py_ssize_t pinbuf_len(PyObject *obj)
{
    return ((PinBufObject *)obj)->n;
}

static PyGetSetDef pinbuf_getset[] = {
    {"pinned", pinbuf_get_pinned, NULL, "Whether the memory is pinned (else ordinary).", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyObject *pinbuf_held(PyObject *unused, PyObject *noargs)
{
    (void)unused;
    (void)noargs;
    return Py_BuildValue("(nn)", live_count, live_bytes);
}

static PyMethodDef pinbuf_methods[] = {
    {"held", pinbuf_held, METH_NOARGS | METH_STATIC,
     "held() -> (count, nbytes): the PinnedBuffers alive in this process and their bytes."},
    {NULL, NULL, 0, NULL}};

static PySequenceMethods pinbuf_as_sequence = {.sq_length = pinbuf_len};

PyTypeObject StokePinBuf_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stoke._stoke.PinnedBuffer",
    .tp_basicsize = sizeof(PinBufObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PinnedBuffer(nbytes, pin=True): stoke's pinned memory (ordinary with pin=False "
              "or when none can be had).",
    .tp_new = pinbuf_new,
    .tp_dealloc = pinbuf_dealloc,
    .tp_as_buffer = &pinbuf_as_buffer,
    .tp_as_sequence = &pinbuf_as_sequence,
    .tp_getset = pinbuf_getset,
    .tp_methods = pinbuf_methods,
};
