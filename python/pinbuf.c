/* _stoke.PinnedBuffer(nbytes, pin=True): a block of stoke's pinned memory (stoke_pinned_alloc:
 * the pinned pool's cache, cap and statistics), or of ordinary memory when the pool cannot give
 * one or pin is False (`pinned` says which).  Buffer protocol (writable bytes), freed when the last view goes.
 * stoke.DataLoader copies a batch into one when its caller holds every batch buffer of the
 * loader (list(loader)), so that holding batches never stops the loader. */
#include <stdlib.h>
#include <string.h>

#include "stoke_py.h"

typedef struct {
    PyObject_HEAD void *p;
    Py_ssize_t n;
    int pinned;
    int own; /* p is this object's malloc'd memory, not the pool's */
} PinBufObject;

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
        Py_BEGIN_ALLOW_THREADS;
        rc = stoke_pinned_alloc((size_t)n, &self->p);
        Py_END_ALLOW_THREADS;
    }
    self->pinned = rc == STOKE_OK && stoke_is_pinned(self->p) > 0;
    if (rc != STOKE_OK) {
        self->own = 1; /* (64-byte aligned: tensors of any dtype view it) */
        self->p = aligned_alloc(64, ((size_t)n + 63) & ~(size_t)63);
        if (!self->p) {
            Py_DECREF(self);
            return PyErr_NoMemory();
        }
    }
    stoke_py_flush_warnings();
    return (PyObject *)self;
}

static void pinbuf_dealloc(PyObject *obj)
{
    PinBufObject *self = (PinBufObject *)obj;
    if (self->p && self->own)
        free(self->p);
    else if (self->p)
        stoke_pinned_free(self->p);
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
};
