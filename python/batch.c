/* _stoke.Batch and _stoke.Field: delivered batches and their fields as tensors, without a copy.
 *
 * Lifetime chain (each arrow a strong reference):
 *     buffer view / DLPack tensor -> Field -> Batch -> core (stoke_py.h) <- Loader
 * Batch's dealloc gives the stoke_batch back (stoke_batch_release); the core's last reference
 * destroys the stoke_loader.  So memory a consumer still views is never returned to the pool,
 * and a batch keeps its loader's memory however long it lives, but not the Loader object, its
 * dataset or its workers. */
#include <stdlib.h>
#include <string.h>

#include "stoke_py.h"

/* ---- Field ----------------------------------------------------------------------------------- */

static void layout_contiguous(FieldObject *f)
{
    Py_ssize_t stride = f->itemsize;
    for (int d = f->ndim - 1; d >= 0; d--) {
        f->strides[d] = stride;
        stride *= f->shape[d];
    }
}

/* The indices: int64 (the values are < 2^63; torch has no uint64 tensors). */
static int field_fill_indices(FieldObject *f, BatchObject *b)
{
    f->data = (char *)stoke_batch_indices(b->b);
    f->bytes = b->count * sizeof(uint64_t);
    f->ndim = 1;
    f->shape[0] = (Py_ssize_t)b->count;
    f->itemsize = 8;
    f->format = "q";
    f->dl_dtype = (DLDataType){kDLInt, 64, 1};
    return 0;
}

static int field_fill(FieldObject *f, BatchObject *b, int field)
{
    int64_t shape[STOKE_PY_MAX_DIMS + 1];
    int ndim = 0, dtype = 0;
    const stoke_field *desc = stoke_batch_field(b->b, field);
    if (!desc || stoke_batch_shape(b->b, field, shape, STOKE_PY_MAX_DIMS + 1, &ndim) != STOKE_OK ||
        stoke_batch_dtype(b->b, field, &dtype) != STOKE_OK ||
        stoke_py_dtype(dtype, desc->itemsize, &f->format, &f->dl_dtype) < 0) {
        PyErr_Format(PyExc_IndexError, "stoke: batch has no field %d", field);
        return -1;
    }
    f->ndim = ndim;
    for (int d = 0; d < ndim; d++)
        f->shape[d] = (Py_ssize_t)shape[d];
    f->itemsize = (Py_ssize_t)desc->itemsize;
    if (dtype == STOKE_DTYPE_RAW) { /* opaque items: one more dimension of bytes */
        f->shape[f->ndim++] = (Py_ssize_t)desc->itemsize;
        f->itemsize = 1;
    }
    f->bytes = stoke_batch_field_bytes(b->b, field);
    if (b->core->device_mode) {
        stoke_device_buffer *buf = stoke_batch_device_buffer(b->b);
        f->data = (char *)stoke_device_buffer_handle(buf) + stoke_batch_device_offset(b->b, field);
    } else {
        f->data = stoke_batch_data(b->b, field);
    }
    return 0;
}

static PyObject *field_new(BatchObject *b, int field)
{
    FieldObject *f = PyObject_New(FieldObject, &StokeField_Type);
    if (!f)
        return NULL;
    f->batch = (BatchObject *)Py_NewRef(b);
    f->field = field;
    if ((field < 0 ? field_fill_indices(f, b) : field_fill(f, b, field)) < 0) {
        Py_DECREF(f);
        return NULL;
    }
    layout_contiguous(f);
    for (int d = 0; d < f->ndim; d++)
        f->dl_shape[d] = f->shape[d];
    return (PyObject *)f;
}

/* Fields and batches are not the cycle collector's: they refer to no object that could refer
 * back (a batch holds its loader's core, not the Loader). */
static void field_dealloc(FieldObject *f)
{
    Py_XDECREF(f->batch);
    PyObject_Del(f);
}

static int field_on_device(FieldObject *f)
{
    return f->field >= 0 && f->batch->core->device_mode;
}

static int field_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    FieldObject *f = (FieldObject *)self;
    if (field_on_device(f)) {
        PyErr_SetString(PyExc_BufferError,
                        "stoke: this batch is in device memory: use DLPack (torch.from_dlpack)");
        return -1;
    }
    if (!f->format && (flags & PyBUF_FORMAT)) {
        PyErr_SetString(PyExc_BufferError, "stoke: bf16 has no buffer format: use DLPack");
        return -1;
    }
    view->obj = Py_NewRef(self);
    view->buf = f->data;
    view->len = (Py_ssize_t)f->bytes;
    view->readonly = 0;
    view->itemsize = f->itemsize;
    view->format = (flags & PyBUF_FORMAT) ? (char *)f->format : NULL;
    view->ndim = f->ndim;
    view->shape = (flags & PyBUF_ND) == PyBUF_ND ? f->shape : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? f->strides : NULL;
    view->suboffsets = NULL;
    view->internal = NULL;
    if (!view->shape && f->ndim != 1) /* a 1-D byte view of the whole field */
        view->ndim = 1;
    return 0;
}

static PyBufferProcs field_as_buffer = {field_getbuffer, NULL};

/* DLPack: the capsule owns a DLManagedTensor (and its shape/strides, in the same block) whose
 * manager_ctx is a reference to the Field; the deleter drops it, from any thread. */
typedef struct {
    DLManagedTensor t;
    int64_t strides[STOKE_PY_MAX_DIMS + 2];
} managed;

typedef struct {
    DLManagedTensorVersioned t;
    int64_t strides[STOKE_PY_MAX_DIMS + 2];
} managed_v;

static void drop_ctx(void *ctx)
{
    if (!Py_IsInitialized()) /* a consumer freeing its tensor after Python finalized */
        return;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF((PyObject *)ctx);
    PyGILState_Release(g);
}

static void managed_deleter(DLManagedTensor *t)
{
    drop_ctx(t->manager_ctx);
    free(t);
}

static void managed_v_deleter(DLManagedTensorVersioned *t)
{
    drop_ctx(t->manager_ctx);
    free(t);
}

static void capsule_destructor(PyObject *cap)
{
    /* Consumed capsules are renamed "used_dltensor"; an unconsumed one still owns the tensor. */
    if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *t = PyCapsule_GetPointer(cap, "dltensor");
        t->deleter(t);
    } else if (PyCapsule_IsValid(cap, "dltensor_versioned")) {
        DLManagedTensorVersioned *t = PyCapsule_GetPointer(cap, "dltensor_versioned");
        t->deleter(t);
    }
}

static void fill_dltensor(FieldObject *f, DLTensor *t, int64_t *strides)
{
    t->data = f->data;
    t->device = f->field >= 0 ? f->batch->core->dl_device : (DLDevice){kDLCPU, 0};
    t->ndim = f->ndim;
    t->dtype = f->dl_dtype;
    t->shape = f->dl_shape;
    for (int d = 0; d < f->ndim; d++)
        strides[d] = f->strides[d] / f->itemsize;
    t->strides = strides;
    t->byte_offset = 0;
}

/* Device batches: the consumer's stream must see the finished copy.  stoke has no cross-stream
 * wait in its public API, so this synchronizes with the batch's copy (documented). */
static int wait_device_copy(FieldObject *f)
{
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    rc = stoke_batch_device_wait(f->batch->b);
    PyEval_RestoreThread(ts);
    if (rc != STOKE_OK) {
        stoke_py_raise(StokeLoaderError, rc, stoke_loader_last_error(f->batch->core->l), -1);
        return -1;
    }
    return 0;
}

static int wants_versioned(PyObject *max_version)
{
    if (!max_version || max_version == Py_None || !PyTuple_Check(max_version) ||
        PyTuple_GET_SIZE(max_version) < 1)
        return 0;
    long major = PyLong_AsLong(PyTuple_GET_ITEM(max_version, 0));
    if (major == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return major >= STOKE_DLPACK_MAJOR;
}

static PyObject *field_dlpack(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    FieldObject *f = (FieldObject *)self;
    PyObject *stream = NULL, *max_version = NULL, *dl_device = NULL, *copy = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist, &stream, &max_version,
                                     &dl_device, &copy))
        return NULL;
    if (copy && copy == Py_True) {
        PyErr_SetString(PyExc_BufferError, "stoke: batches are exported without a copy only");
        return NULL;
    }
    if (field_on_device(f) && wait_device_copy(f) < 0)
        return NULL;
    if (wants_versioned(max_version)) {
        managed_v *m = calloc(1, sizeof(*m));
        if (!m)
            return PyErr_NoMemory();
        m->t.version = (DLPackVersion){STOKE_DLPACK_MAJOR, STOKE_DLPACK_MINOR};
        m->t.manager_ctx = Py_NewRef(self);
        m->t.deleter = managed_v_deleter;
        fill_dltensor(f, &m->t.dl_tensor, m->strides);
        PyObject *cap = PyCapsule_New(&m->t, "dltensor_versioned", capsule_destructor);
        if (!cap)
            managed_v_deleter(&m->t);
        return cap;
    }
    managed *m = calloc(1, sizeof(*m));
    if (!m)
        return PyErr_NoMemory();
    m->t.manager_ctx = Py_NewRef(self);
    m->t.deleter = managed_deleter;
    fill_dltensor(f, &m->t.dl_tensor, m->strides);
    PyObject *cap = PyCapsule_New(&m->t, "dltensor", capsule_destructor);
    if (!cap)
        managed_deleter(&m->t);
    return cap;
}

static PyObject *field_dlpack_device(PyObject *self, PyObject *unused)
{
    FieldObject *f = (FieldObject *)self;
    DLDevice d = f->field >= 0 ? f->batch->core->dl_device : (DLDevice){kDLCPU, 0};
    return Py_BuildValue("(ii)", d.device_type, d.device_id);
}

static PyObject *field_data_ptr(PyObject *self, PyObject *unused)
{
    return PyLong_FromVoidPtr(((FieldObject *)self)->data);
}

static PyObject *field_get_shape(PyObject *self, void *unused)
{
    FieldObject *f = (FieldObject *)self;
    PyObject *t = PyTuple_New(f->ndim);
    for (int d = 0; t && d < f->ndim; d++)
        PyTuple_SET_ITEM(t, d, PyLong_FromSsize_t(f->shape[d]));
    return t;
}

static PyObject *field_get_nbytes(PyObject *self, void *unused)
{
    return PyLong_FromSize_t(((FieldObject *)self)->bytes);
}

static Py_ssize_t field_len(PyObject *self)
{
    FieldObject *f = (FieldObject *)self;
    return f->ndim ? f->shape[0] : 0;
}

static PyMethodDef field_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))field_dlpack, METH_VARARGS | METH_KEYWORDS,
     "A DLPack capsule viewing the field's memory (no copy)."},
    {"__dlpack_device__", field_dlpack_device, METH_NOARGS, "(device_type, device_id)"},
    {"data_ptr", field_data_ptr, METH_NOARGS, "Address of the field's first byte."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef field_getset[] = {{"shape", field_get_shape, NULL, "shape", NULL},
                                     {"nbytes", field_get_nbytes, NULL, "bytes", NULL},
                                     {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods field_as_sequence = {.sq_length = field_len};

PyTypeObject StokeField_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stoke.Field",
    .tp_basicsize = sizeof(FieldObject),
    .tp_dealloc = (destructor)field_dealloc,
    .tp_as_buffer = &field_as_buffer,
    .tp_as_sequence = &field_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One field of a batch (or its indices): buffer protocol and DLPack, no copy.",
    .tp_methods = field_methods,
    .tp_getset = field_getset,
};

/* ---- Batch ----------------------------------------------------------------------------------- */

PyObject *stoke_py_batch_new(stoke_py_core *core, stoke_batch *b)
{
    BatchObject *o = PyObject_New(BatchObject, &StokeBatch_Type);
    if (!o) {
        stoke_batch_release(b);
        return NULL;
    }
    o->b = b;
    o->core = core;
    core->refs++;
    o->count = stoke_batch_count(b);
    o->nfields = stoke_batch_num_fields(b);
    core->outstanding++;
    return (PyObject *)o;
}

static void batch_dealloc(BatchObject *o)
{
    stoke_py_release_batch(o->core, o->b); /* (once a copy from it is done: fence.c) */
    stoke_py_core_decref(o->core);
    PyObject_Del(o);
}

static int field_by_name(BatchObject *o, PyObject *key)
{
    if (PyLong_Check(key)) {
        long i = PyLong_AsLong(key);
        if (i == -1 && PyErr_Occurred())
            return -2;
        if (i < 0)
            i += o->nfields;
        return i >= 0 && i < o->nfields ? (int)i : -2;
    }
    const char *name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
    if (!name)
        return -2;
    if (strcmp(name, "indices") == 0)
        return -1;
    for (int f = 0; f < o->nfields; f++)
        if (strcmp(stoke_batch_field(o->b, f)->name, name) == 0)
            return f;
    return -2;
}

static PyObject *batch_subscript(PyObject *self, PyObject *key)
{
    BatchObject *o = (BatchObject *)self;
    int f = field_by_name(o, key);
    if (f == -2) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    return field_new(o, f);
}

static Py_ssize_t batch_len(PyObject *self)
{
    return (Py_ssize_t)((BatchObject *)self)->count;
}

static int batch_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    PyObject *f = field_new((BatchObject *)self, 0);
    if (!f)
        return -1;
    int rc = field_getbuffer(f, view, flags); /* the view holds the field */
    Py_DECREF(f);
    return rc;
}

static PyObject *batch_dlpack(PyObject *self, PyObject *args, PyObject *kw)
{
    PyObject *f = field_new((BatchObject *)self, 0);
    if (!f)
        return NULL;
    PyObject *cap = field_dlpack(f, args, kw);
    Py_DECREF(f);
    return cap;
}

static PyObject *batch_dlpack_device(PyObject *self, PyObject *unused)
{
    DLDevice d = ((BatchObject *)self)->core->dl_device;
    return Py_BuildValue("(ii)", d.device_type, d.device_id);
}

static PyObject *batch_data_ptr(PyObject *self, PyObject *args)
{
    PyObject *key = NULL;
    if (!PyArg_ParseTuple(args, "|O:data_ptr", &key))
        return NULL;
    BatchObject *o = (BatchObject *)self;
    int f = key ? field_by_name(o, key) : 0;
    if (f == -2) {
        if (!PyErr_Occurred())
            PyErr_SetObject(PyExc_KeyError, key);
        return NULL;
    }
    if (f == -1)
        return PyLong_FromVoidPtr((void *)stoke_batch_indices(o->b));
    if (o->core->device_mode)
        return PyLong_FromVoidPtr(
            (char *)stoke_device_buffer_handle(stoke_batch_device_buffer(o->b)) +
            stoke_batch_device_offset(o->b, f));
    return PyLong_FromVoidPtr(stoke_batch_data(o->b, f));
}

static PyObject *batch_keys(PyObject *self, PyObject *unused)
{
    BatchObject *o = (BatchObject *)self;
    PyObject *t = PyTuple_New(o->nfields);
    for (int f = 0; t && f < o->nfields; f++)
        PyTuple_SET_ITEM(t, f, PyUnicode_FromString(stoke_batch_field(o->b, f)->name));
    return t;
}

static PyObject *batch_get_indices(PyObject *self, void *unused)
{
    return field_new((BatchObject *)self, -1);
}

static PyObject *batch_get_epoch(PyObject *self, void *unused)
{
    return PyLong_FromUnsignedLongLong(stoke_batch_epoch(((BatchObject *)self)->b));
}

static PyObject *batch_get_seq(PyObject *self, void *unused)
{
    return PyLong_FromUnsignedLongLong(stoke_batch_seq(((BatchObject *)self)->b));
}

static PyObject *batch_get_pinned(PyObject *self, void *unused)
{
    return PyBool_FromLong(stoke_batch_is_pinned(((BatchObject *)self)->b));
}

/* _pin(nbytes): stoke_batch_pin (a loader made with pin_on_use).  None when the first nbytes
 * are pinned (and the batch is: is_pinned), else the reason they are not (a str: the batch is
 * readable as it is, in ordinary memory); ValueError past the batch's buffer. */
static PyObject *batch_pin(PyObject *self, PyObject *arg)
{
    BatchObject *o = (BatchObject *)self;
    Py_ssize_t n = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_Format(PyExc_ValueError, "stoke: _pin(%zd): a byte count is >= 0", n);
        return NULL;
    }
    PyThreadState *ts = PyEval_SaveThread(); /* (a registration: ms for a large batch) */
    int rc = stoke_batch_pin(o->b, (size_t)n);
    PyEval_RestoreThread(ts);
    if (rc == STOKE_ERANGE) {
        PyErr_Format(PyExc_ValueError, "stoke: %s", stoke_last_error());
        return NULL;
    }
    if (rc != STOKE_OK)
        return PyUnicode_FromString(stoke_last_error());
    Py_RETURN_NONE;
}

static PyMethodDef batch_methods[] = {
    {"_pin", batch_pin, METH_O,
     "_pin(nbytes): pins the batch's first nbytes (pin_on_use); None, or why not."},
    {"__dlpack__", (PyCFunction)(void (*)(void))batch_dlpack, METH_VARARGS | METH_KEYWORDS,
     "DLPack capsule of the first field (no copy)."},
    {"__dlpack_device__", batch_dlpack_device, METH_NOARGS, "(device_type, device_id)"},
    {"data_ptr", batch_data_ptr, METH_VARARGS,
     "data_ptr(field=0): address of a field ('data', 'label', 'indices' or its number)."},
    {"keys", batch_keys, METH_NOARGS, "The field names."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef batch_getset[] = {
    {"indices", batch_get_indices, NULL, "Dataset index of each sample (int64).", NULL},
    {"epoch", batch_get_epoch, NULL, "Epoch of the batch.", NULL},
    {"seq", batch_get_seq, NULL, "Position of the batch in its epoch.", NULL},
    {"is_pinned", batch_get_pinned, NULL, "Whether the host memory is pinned.", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyMappingMethods batch_as_mapping = {.mp_length = batch_len,
                                            .mp_subscript = batch_subscript};
static PyBufferProcs batch_as_buffer = {batch_getbuffer, NULL};

PyTypeObject StokeBatch_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stoke.Batch",
    .tp_basicsize = sizeof(BatchObject),
    .tp_dealloc = (destructor)batch_dealloc,
    .tp_as_mapping = &batch_as_mapping,
    .tp_as_buffer = &batch_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A batch: batch['data'], batch['label'], batch.indices; the batch itself is its "
              "first field (DLPack, buffer protocol).",
    .tp_methods = batch_methods,
    .tp_getset = batch_getset,
};
