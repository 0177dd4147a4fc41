/* stoke's CPython extension (_stoke): shared declarations of its C files.
 *
 * Objects:
 *   Loader  — the dataset it reads and a core (below); the iterator of its epochs.  When it
 *             goes (its last reference, the cyclic GC, the exit hook) the C loader is stopped
 *             (stoke_loader_stop: no worker thread or process is left) and the dataset closed,
 *             whatever batches are still alive.
 *   core    — the stoke_loader and what its batches need of it (device, fences), shared by
 *             the Loader and its Batches (a count, not a Python object): the stoke_loader is
 *             destroyed when the last of them lets go.  A Batch does not hold the Loader, so a
 *             batch's tensor kept on its loader (`loader.last = batch`), which the GC cannot
 *             see through, makes no cycle.
 *   Batch   — one delivered stoke_batch; holds the core, so a batch may outlive every Python
 *             reference to the loader (stoke_batch_release in Batch's dealloc).
 *   Field   — one field of a batch (or its indices) as a tensor: buffer protocol and DLPack.
 *             Holds a reference to its Batch; a buffer view or a DLPack capsule/tensor holds a
 *             reference to the Field.  So the pinned memory goes back to the pool only when the
 *             last view, tensor or Python reference lets go.
 */
#ifndef STOKE_PY_H
#define STOKE_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dlpack.h"
#include "stoke/stoke.h"


#define STOKE_PY_PEND_MAX 8 /* a loader's batches given back, their copies in flight (fence.c) */

/* All GIL. */
typedef struct stoke_py_core {
    Py_ssize_t refs;        /* the Loader's (until it closes) and one per Batch alive */
    stoke_loader *l;        /* stopped once the Loader closed; destroyed with the core */
    int device_mode;        /* batches are copied to a device */
    DLDevice dl_device;     /* what __dlpack_device__ reports for the batches */
    Py_ssize_t outstanding; /* Batch objects alive, and those given back still fenced */
    int held;               /* the consumer's held_buffers */
    int closed;             /* the Loader closed: a batch given back waits for its fence */
    /* pinned batches given back whose release fences are not done yet, oldest first
     * (fence.c): at most STOKE_PY_PEND_MAX, and one more while it is being added */
    struct {
        PyObject *fence;
        stoke_batch *b;
    } pend[STOKE_PY_PEND_MAX + 1];
    int npend;
    int pend_max; /* the most kept so (-1: not computed yet) */
    int in_fence; /* a fence's Python code runs for this list */
} stoke_py_core;

typedef struct {
    PyObject_HEAD stoke_py_core *core; /* NULL before init and once closed */
    stoke_dataset ds;
    int fresh;              /* 1: the next iter() continues from the current position */
    int64_t rank, world_size;
    int busy;               /* a thread is inside a call on the loader that drops the GIL */
    uint64_t passes;        /* iter() calls: an iterator of an earlier one is superseded */
    int persistent;         /* iterators are not superseded (torch's iter() resets its one
                               iterator with persistent_workers): persistent_workers, or what
                               the drop-in sets (_passes_go_on: its workers persist anyway) */
} LoaderObject;

/* The most dimensions a field has in Python (NumPy 2's NPY_MAXDIMS; the C loader has no limit). */
#define STOKE_PY_MAX_DIMS 64

typedef struct {
    PyObject_HEAD stoke_batch *b;
    stoke_py_core *core; /* counted */
    size_t count;
    int nfields;
} BatchObject;

typedef struct {
    PyObject_HEAD BatchObject *batch; /* strong reference */
    int field;                        /* -1: the batch's indices */
    char *data;                       /* host or device address */
    size_t bytes;
    int ndim;
    Py_ssize_t shape[STOKE_PY_MAX_DIMS + 2];
    Py_ssize_t strides[STOKE_PY_MAX_DIMS + 2];
    int64_t dl_shape[STOKE_PY_MAX_DIMS + 2];
    Py_ssize_t itemsize;
    const char *format; /* NULL: no buffer-protocol format (bf16) */
    DLDataType dl_dtype;
} FieldObject;

extern PyTypeObject StokeLoader_Type;
extern PyTypeObject StokeBatch_Type;
extern PyTypeObject StokeField_Type;
extern PyTypeObject StokeIter_Type;
extern PyTypeObject StokePinBuf_Type;
extern PyObject *StokeError;
extern PyObject *StokeLoaderError;
extern PyObject *StokeThreadsWarning;

/* module.c */
int stoke_py_flush_warnings(void);
PyObject *stoke_py_raise(PyObject *type, int code, const char *msg, long long sample);
/* s (NUL-terminated) as a str: UTF-8, its other bytes by the codec error handler `errors`
 * ("backslashreplace" for messages; "surrogateescape" for paths, as os.fsdecode). */
PyObject *stoke_py_text(const char *s, const char *errors);
/* Makes the library's log messages Python warnings (the module's sink; cli.c lends the default
 * stderr sink to the CLI and installs this one again). */
void stoke_py_log_install(void);

/* cli.c: _cli_main (python -m stoke) and build_features (stoke.build_info) */
PyObject *stoke_py_cli_main(PyObject *self, PyObject *args);
PyObject *stoke_py_build_features(PyObject *self, PyObject *unused);

/* batch.c */
PyObject *stoke_py_batch_new(stoke_py_core *core, stoke_batch *b);

/* loader.c: drops a reference to the core; the last one destroys its stoke_loader (stopped
 * by then: no thread to join) after the copies from its fenced batches. */
void stoke_py_core_decref(stoke_py_core *c);

/* fence.c: pinned memory given back after its release fence is done (a caller's asynchronous
 * copy from it).  release_batch gives b back (now or once fenced: 1; on a closed core, once
 * its fence is waited for) and counts it out of `outstanding`; settle gives back those done
 * (wait: all, waiting); drain when the Loader closes and before the core's end.  pinned_free is
 * stoke_pinned_free fenced so. */
int stoke_py_release_batch(stoke_py_core *L, stoke_batch *b);
void stoke_py_settle(stoke_py_core *L, int wait);
int stoke_py_settle_one(stoke_py_core *L); /* waits for the oldest; 0: none was fenced */
void stoke_py_drain(stoke_py_core *L);
void stoke_py_pinned_free(void *p);
void stoke_py_pinned_settle(void);
PyObject *stoke_py_set_release_fence(PyObject *self, PyObject *fn);
PyObject *stoke_py_settle_pinned(PyObject *self, PyObject *wait);

/* pyexit.c */
/* For the exit hook (GIL held): waits for the calls into Python datasets in progress, then
 * makes every later one fail at once (STOKE_ECANCELED) without touching Python, so no worker
 * thread runs Python while the interpreter finalizes.  For good: the process is exiting. */
void stoke_pyds_stop_all(void);
/* Around every call into Python from a loader thread: 0 (go on; stoke_pyds_leave after it) or -1
 * with why in msg when the interpreter is exiting (do not touch Python). */
int stoke_pyds_enter(char *msg, size_t msg_len);
void stoke_pyds_leave(void);
/* Whether this thread is inside such a call (it may be one of a loader's own workers). */
int stoke_pyds_in_call(void);
/* Whether the exit hook stopped the datasets and this thread is another than the one that ran
 * it (a daemon thread still iterating a loader while the interpreter exits). */
int stoke_pyds_stopped_elsewhere(void);

/* loader.c: destroys the loaders freed on a thread inside a Python dataset's call (deferred:
 * such a thread may be one of the loader's own workers).  GIL held, on a thread that may join
 * them (the main thread's pending call, the exit hook).  _reap_stats (deferred, destroyed). */
void stoke_py_reap_loaders(void);
int stoke_py_finalizing(void); /* the interpreter finalizes (no Python code may run) */
PyObject *stoke_py_reap_stats(PyObject *self, PyObject *unused);

/* pywriter.c: the batch writer of stoke/_dropin.py (its attributes nbatches, blob_bytes, name
 * and methods fill, next_fill, worker_init, set_epoch, fork_child) as a stoke_dataset.  0, or
 * -1 with a Python exception set. */
typedef struct stoke_pywriter stoke_pywriter;
int stoke_pywriter_open(PyObject *obj, stoke_dataset *ds);
/* The writer object ds holds a reference to (borrowed), or NULL where ds is not a writer's: for
 * the cyclic GC's traversal of the loader that holds ds. */
PyObject *stoke_pywriter_object(const stoke_dataset *ds);
PyObject *stoke_py_pad_batch(PyObject *self, PyObject *args);

/* Maps a stoke dtype to a buffer format and a DLPack dtype.  Returns 0, -1 for an unknown one. */
int stoke_py_dtype(int dtype, size_t itemsize, const char **format, DLDataType *dl);

#endif
