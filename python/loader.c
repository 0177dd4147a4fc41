/* _stoke.Loader: one stoke_loader over a source string or a Python dataset; iterating it
 * delivers the batches of one epoch.  stoke.DataLoader (stoke/__init__.py) subclasses it and
 * takes PyTorch's argument names. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke_py.h"

/* The C loader; NULL before init and once closed. */
static stoke_loader *c_loader(const LoaderObject *self)
{
    return self->core ? self->core->l : NULL;
}

static int raise_status(int rc, const char *msg)
{
    stoke_py_raise(StokeError, rc, msg, -1);
    return -1;
}

/* The DLPack device of the batches: host memory is kDLCPU (also when pinned: consumers such as
 * torch 1.x reject kDLCUDAHost, and torch finds the pinning by itself); device batches name the
 * device of `spec` ("cuda:1"). */
static DLDevice dl_device_of(const char *spec)
{
    if (!spec)
        return (DLDevice){kDLCPU, 0};
    const char *colon = strchr(spec, ':');
    size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
    int id = colon ? atoi(colon + 1) : 0;
    if (n == 4 && strncmp(spec, "cuda", 4) == 0)
        return (DLDevice){kDLCUDA, id};
    if (n == 3 && strncmp(spec, "hip", 3) == 0)
        return (DLDevice){kDLROCM, id};
    return (DLDevice){kDLExtDev, id};
}

static int open_dataset(LoaderObject *self, const char *source, PyObject *dataset,
                        PyObject *writer)
{
    if (writer && writer != Py_None)
        return stoke_pywriter_open(writer, &self->ds);
    if (dataset && dataset != Py_None) {
        PyErr_SetString(PyExc_TypeError, "stoke: a Python dataset goes through stoke.DataLoader "
                                         "(it wraps it in a batch writer)");
        return -1;
    }
    if (!source) {
        PyErr_SetString(PyExc_TypeError, "stoke: give a source string or a dataset");
        return -1;
    }
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    rc = stoke_source_open(source, &self->ds);
    PyEval_RestoreThread(ts);
    if (stoke_py_flush_warnings() < 0)
        return -1;
    return rc == STOKE_OK ? 0 : raise_status(rc, stoke_last_error());
}

/* Rank and world size the sampler will use (environment or explicit). */
static int find_rank(LoaderObject *self, const stoke_loader_opts *o)
{
    self->rank = 0;
    self->world_size = 1;
    if (!o->sampler.distributed)
        return 0;
    stoke_sampler *s;
    int rc = stoke_sampler_create(&o->sampler, self->ds.length(self->ds.user), &s);
    if (rc != STOKE_OK)
        return raise_status(rc, stoke_last_error());
    self->rank = stoke_sampler_rank(s);
    self->world_size = stoke_sampler_world_size(s);
    stoke_sampler_destroy(s);
    return 0;
}

/* An integer argument in lo..hi into *out (PyNumber_Index: ints, numpy integers).  0, or -1
 * with a ValueError naming `name` and the range (a TypeError for a non-integer). */
static int int_in_range(PyObject *v, const char *name, unsigned long long hi,
                        unsigned long long *out, const char *range)
{
    PyObject *n = PyNumber_Index(v);
    if (!n)
        return -1;
    int overflow = 0;
    long long s = PyLong_AsLongLongAndOverflow(n, &overflow);
    unsigned long long u = 0;
    int ok = 0;
    if (overflow > 0) {
        u = PyLong_AsUnsignedLongLong(n);
        ok = !(u == (unsigned long long)-1 && PyErr_Occurred());
        PyErr_Clear();
    } else if (!overflow && !(s == -1 && PyErr_Occurred())) {
        ok = s >= 0;
        u = (unsigned long long)s;
    }
    ok = ok && u <= hi;
    if (!ok && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "stoke: %s must be in %s, not %R", name, range, n);
    Py_DECREF(n);
    if (!ok)
        return -1;
    *out = u;
    return 0;
}

/* The loader's `interrupted` hook: runs the Python signal handlers while next() waits, so
 * that Ctrl-C (SIGINT to this process) raises KeyboardInterrupt there however long the batch
 * takes.  The exception stays set for next_locked. */
static int py_interrupted(void *user)
{
    (void)user;
    PyGILState_STATE g = PyGILState_Ensure();
    int stop = PyErr_CheckSignals() < 0;
    PyGILState_Release(g);
    return stop;
}

static int loader_init(PyObject *obj, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"source",
                             "dataset",
                             "batch_size",
                             "shuffle",
                             "seed",
                             "num_workers",
                             "drop_last",
                             "pin_memory",
                             "pin_memory_device",
                             "prefetch_factor",
                             "persistent_workers",
                             "timeout_ms",
                             "device",
                             "distributed",
                             "rank",
                             "world_size",
                             "in_order",
                             "worker_mode",
                             "arena",
                             "writer",
                             "round_robin",
                             "on_error",
                             "held_buffers",
                             "errors_go_on",
                             "pin_on_use",
                             NULL};
    LoaderObject *self = (LoaderObject *)obj;
    const char *source = NULL, *pin_dev = NULL, *device = NULL, *mode = NULL, *arena = NULL;
    const char *on_error = NULL;
    PyObject *dataset = NULL, *seed_obj = NULL, *timeout_obj = NULL, *writer = NULL;
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    Py_ssize_t batch_size = 1;
    unsigned long long seed = 0, timeout_ms = 0;
    long long rank = -1, world_size = 0;
    if (!PyArg_ParseTupleAndKeywords(
            args, kw, "|zO$npOippzipOzpLLpzzOpzipp:Loader", kwlist, &source, &dataset, &batch_size,
            &o.shuffle, &seed_obj, &o.num_workers, &o.drop_last, &o.pin_memory, &pin_dev,
            &o.prefetch_factor, &o.persistent_workers, &timeout_obj, &device,
            &o.sampler.distributed, &rank, &world_size, &o.in_order, &mode, &arena, &writer,
            &o.round_robin, &on_error, &o.held_buffers, &o.errors_go_on, &o.pin_on_use))
        return -1;
    if (on_error && stoke_on_error_parse(on_error, &o) != STOKE_OK) {
        PyErr_Format(PyExc_ValueError, "stoke: on_error: %s", stoke_last_error());
        return -1;
    }
    /* no silent wrap-around: seed=-1 is not 2^64 - 1, nor 2^64 zero */
    if ((seed_obj && int_in_range(seed_obj, "seed", UINT64_MAX, &seed, "0 .. 2**64 - 1") < 0) ||
        (timeout_obj && int_in_range(timeout_obj, "timeout_ms", UINT32_MAX, &timeout_ms,
                                     "0 .. 2**32 - 1 (0: no limit)") < 0))
        return -1;
    if (rank < -1 || world_size < 0 || (world_size > 0 && rank >= world_size)) {
        PyErr_Format(PyExc_ValueError,
                     "stoke: rank must be in 0 .. world_size - 1 (-1: from the environment) and "
                     "world_size >= 1 (0: from the environment), not rank=%lld, world_size=%lld",
                     rank, world_size);
        return -1;
    }
    if (mode && strcmp(mode, "processes") == 0) {
        o.worker_mode = STOKE_WORKER_PROCESSES;
    } else if (mode && strcmp(mode, "threads") != 0) {
        PyErr_Format(PyExc_ValueError,
                     "stoke: worker_mode must be 'threads' or 'processes', not '%s'", mode);
        return -1;
    }
    if (self->core) {
        PyErr_SetString(PyExc_RuntimeError, "stoke: the loader is already initialized");
        return -1;
    }
    if (batch_size < 1) {
        PyErr_SetString(PyExc_ValueError, "stoke: batch_size must be >= 1");
        return -1;
    }
    o.batch_size = (size_t)batch_size;
    o.interrupted = py_interrupted;
    o.seed = seed;
    o.timeout_ms = (uint32_t)timeout_ms;
    o.pin_memory_device = pin_dev;
    o.device = device;
    o.arena = arena; /* NULL: $STOKE_ARENA */
    o.sampler.rank = rank;
    o.sampler.world_size = world_size;
    if (open_dataset(self, source, dataset, writer) < 0)
        return -1;
    stoke_loader *l = NULL;
    int rc = find_rank(self, &o);
    if (rc == 0) {
        PyThreadState *ts = PyEval_SaveThread();
        rc = stoke_loader_create(&o, &self->ds, &l);
        PyEval_RestoreThread(ts);
        if (stoke_py_flush_warnings() < 0)
            rc = -1;
        else if (rc != STOKE_OK)
            rc = raise_status(rc, stoke_last_error());
    }
    stoke_py_core *c = NULL;
    if (rc == 0 && !(c = calloc(1, sizeof(*c)))) {
        PyErr_NoMemory();
        rc = -1;
    }
    if (rc != 0) {
        stoke_loader_destroy(l);
        stoke_dataset_close(&self->ds);
        return -1;
    }
    c->refs = 1;
    c->l = l;
    c->device_mode = device != NULL;
    c->dl_device = dl_device_of(device);
    c->held = o.held_buffers;
    c->pend_max = -1;
    self->core = c;
    self->fresh = 1;
    self->persistent = o.persistent_workers;
    return 0;
}

void stoke_py_core_decref(stoke_py_core *c)
{
    if (--c->refs > 0)
        return;
    stoke_py_drain(c); /* (the batches whose copies were in flight: given back first) */
    /* With the GIL: stopped, it has no thread to join, and no Python code to wait for. */
    stoke_loader_destroy(c->l);
    free(c);
}

/* Loaders whose close was deferred: freed on a thread inside a call of a Python dataset (the
 * cyclic GC runs on whichever thread allocates, one of the loader's own workers too), which
 * may not join the loader's threads.  The main thread closes them in a pending call, or the
 * exit hook does (stoke_py_reap_loaders).  List and counters: GIL. */
typedef struct deferred {
    struct deferred *next;
    stoke_py_core *core;
    stoke_dataset ds;
} deferred;
static deferred *to_reap;
static int reap_scheduled;
static long long n_deferred, n_reaped;

/* Stops c's loader (its threads joined, its processes ended), closes ds and drops the Loader's
 * reference to c: the loader is destroyed now, or when its last batch goes.  GIL held; not on a
 * thread inside a dataset call. */
static void close_now(stoke_py_core *c, stoke_dataset *ds)
{
    /* without the GIL: workers may be waiting for it (a Python dataset) */
    PyThreadState *ts = PyEval_SaveThread();
    stoke_loader_stop(c->l);
    PyEval_RestoreThread(ts);
    stoke_dataset_close(ds);
    stoke_py_core_decref(c);
}

void stoke_py_reap_loaders(void)
{
    reap_scheduled = 0;
    while (to_reap) {
        deferred *d = to_reap;
        to_reap = d->next; /* unlinked first: closing the dataset runs Python code */
        close_now(d->core, &d->ds);
        free(d);
        n_reaped++;
    }
}

static int reap_pending(void *unused)
{
    (void)unused;
    stoke_py_reap_loaders();
    return 0;
}

/* Hands c and ds to the main thread.  Without memory for the record it leaks them (a message
 * says so) rather than join from here: the library would abort. */
static void defer_close(stoke_py_core *c, stoke_dataset *ds)
{
    deferred *d = malloc(sizeof(*d));
    if (!d) {
        fprintf(stderr, "stoke: out of memory: a loader freed on a worker thread is leaked\n");
        return;
    }
    d->core = c;
    d->ds = *ds;
    memset(ds, 0, sizeof(*ds));
    d->next = to_reap;
    to_reap = d;
    n_deferred++;
    /* a full queue (-1): a later deferral or the exit hook reaps it */
    if (!reap_scheduled && Py_AddPendingCall(reap_pending, NULL) == 0)
        reap_scheduled = 1;
}

/* Stops the C loader and closes the dataset, whatever batches are alive (their memory stays
 * theirs: the core); later calls raise. */
static void loader_close(LoaderObject *self)
{
    stoke_py_core *c = self->core;
    /* taken out first: closing it runs Python code, and a collection meanwhile must not
     * traverse a dataset being closed (loader_traverse) */
    stoke_dataset ds = self->ds;
    memset(&self->ds, 0, sizeof(self->ds));
    self->core = NULL;
    if (!c) {
        stoke_dataset_close(&ds);
        return;
    }
    stoke_py_drain(c); /* (the batches whose copies were in flight: given back first) */
    c->closed = 1;
    if (stoke_pyds_in_call())
        defer_close(c, &ds);
    else
        close_now(c, &ds);
}

PyObject *stoke_py_reap_stats(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return Py_BuildValue("LL", n_deferred, n_reaped);
}

static void loader_dealloc(PyObject *obj)
{
    PyObject_GC_UnTrack(obj);
    loader_close((LoaderObject *)obj);
    Py_TYPE(obj)->tp_free(obj);
}

/* The reference the C dataset holds to a Python dataset's batch writer (which holds the
 * dataset, its collate_fn, sampler...), for the cyclic GC: a loader in a cycle through them (a
 * dataset that keeps its loader, a trainer whose bound method is the collate_fn) is collected,
 * its worker processes, shared memory and descriptors with it. */
static int loader_traverse(PyObject *obj, visitproc visit, void *arg)
{
    Py_VISIT(stoke_pywriter_object(&((LoaderObject *)obj)->ds));
    return 0;
}

/* PEP 442's finalizer: runs before the GC clears any object of a cycle found unreachable, so
 * the C loader is stopped (its threads joined) while the dataset and writer it calls are
 * whole, as when its last reference goes. */
static void loader_finalize(PyObject *obj)
{
    LoaderObject *self = (LoaderObject *)obj;
    if (!self->core || self->busy)
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    loader_close(self);
    PyErr_Restore(type, value, tb);
}

/* Stops the C loader now (joining its threads, ending its processes) and closes the dataset,
 * unless another thread is inside a call on it; batches alive keep their memory; later calls
 * raise.  Returns whether it did.  For the exit hook: Python does not promise to deallocate
 * every object at exit. */
static PyObject *loader_close_if_idle(PyObject *obj, PyObject *unused)
{
    LoaderObject *self = (LoaderObject *)obj;
    if (self->busy)
        Py_RETURN_FALSE;
    loader_close(self);
    Py_RETURN_TRUE;
}

static int check(LoaderObject *self)
{
    if (c_loader(self))
        return 0;
    if (stoke_pyds_stopped_elsewhere()) {
        /* closed by the exit hook between two calls of a daemon thread (a prefetcher): ended
         * quietly, as a call the hook stopped mid-way (raise_loader_error); the RuntimeError's
         * traceback went to the stderr of a script that exited normally (test_shutdown, 2
         * runs in 10 under ASan's load) */
        PyErr_SetString(PyExc_SystemExit, "stoke: the Python interpreter is exiting: the "
                                          "DataLoader was closed by its exit hook");
        return -1;
    }
    PyErr_SetString(PyExc_RuntimeError, "stoke: the loader is not initialized");
    return -1;
}

/* The C loader takes one consumer at a time: a second Python thread calling into it while the
 * first waits without the GIL (next, set_epoch...) raises instead of deadlocking in it.  0 with
 * the loader marked busy (leave() unmarks), or -1 with a RuntimeError. */
static int enter(LoaderObject *self)
{
    if (check(self) < 0)
        return -1;
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError,
                        "stoke: DataLoader is being used by another thread (one thread at a time "
                        "may iterate it or call set_epoch, state_dict, load_state_dict)");
        return -1;
    }
    self->busy = 1;
    return 0;
}

static void leave(LoaderObject *self)
{
    self->busy = 0;
}

static PyObject *raise_loader_error(LoaderObject *self, int rc)
{
    if (rc == STOKE_ECANCELED && stoke_pyds_stopped_elsewhere()) {
        /* A daemon thread iterating while the interpreter exits (a prefetcher): its loader was
         * stopped by the exit hook.  SystemExit ends the thread quietly (threading's excepthook
         * ignores it), as torch's thread is frozen silently; a LoaderError's traceback, cut
         * off by the finalization, would go to the stderr of a script that exited normally. */
        PyErr_SetString(PyExc_SystemExit, "stoke: the Python interpreter is exiting: the "
                                          "DataLoader was stopped by its exit hook");
        return NULL;
    }
    const char *err = stoke_loader_last_error(c_loader(self));
    const char *s = strstr(err, "sample ");
    unsigned long long idx;
    long long sample = s && sscanf(s, "sample %llu", &idx) == 1 ? (long long)idx : -1;
    return stoke_py_raise(StokeLoaderError, rc, *err ? err : stoke_last_error(), sample);
}

static PyObject *set_epoch_locked(LoaderObject *self, uint64_t epoch, int next)
{
    stoke_loader *l = c_loader(self);
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    rc = next ? stoke_loader_next_epoch(l) : stoke_loader_set_epoch(l, epoch);
    PyEval_RestoreThread(ts);
    if (stoke_py_flush_warnings() < 0)
        return NULL;
    if (rc != STOKE_OK)
        return raise_loader_error(self, rc);
    Py_RETURN_NONE;
}

/* Busy until the error is read: issuing a warning runs Python code, which may switch threads. */
static PyObject *loader_set_epoch_to(LoaderObject *self, uint64_t epoch, int next)
{
    if (enter(self) < 0)
        return NULL;
    PyObject *r = set_epoch_locked(self, epoch, next);
    leave(self);
    return r;
}

/* The iterator of one pass: iter(loader) returns a new one, whose __iter__ is itself (so
 * `it = iter(loader); next(it); for b in it:` goes on where `it` was). */
typedef struct {
    PyObject_HEAD LoaderObject *loader; /* strong reference */
    uint64_t pass;                      /* the loader's `passes` when this one was made */
} IterObject;

static PyObject *next_locked(LoaderObject *self)
{
    self->fresh = 0;
    if (self->core->npend) /* the batches whose copies are done: back to the workers */
        stoke_py_settle(self->core, 0);
    stoke_loader *l = c_loader(self);
    stoke_batch *b = NULL;
    int rc;
    for (;;) {
        PyThreadState *ts = PyEval_SaveThread();
        rc = stoke_loader_next(l, &b);
        PyEval_RestoreThread(ts);
        /* every buffer out: those fenced come back once their copies are done (fence.c) */
        if (rc != STOKE_ELIMIT || !stoke_py_settle_one(self->core))
            break;
    }
    if (stoke_py_flush_warnings() < 0 || (rc == STOKE_ECANCELED && PyErr_Occurred())) {
        stoke_batch_release(b); /* (NULL when interrupted: a signal handler raised) */
        return NULL;
    }
    if (rc == STOKE_OK)
        return stoke_py_batch_new(self->core, b);
    if (rc == STOKE_EEND)
        return NULL; /* StopIteration */
    return raise_loader_error(self, rc);
}

static PyObject *iter_next(PyObject *obj)
{
    LoaderObject *self = ((IterObject *)obj)->loader;
    if (!self->persistent && ((IterObject *)obj)->pass != self->passes) {
        /* (the C loader delivers one pass at a time: this one would go on in the new one's) */
        PyErr_SetString(PyExc_RuntimeError,
                        "stoke: this iterator of the DataLoader was superseded by a later "
                        "iter(loader): a stoke.DataLoader delivers one pass at a time (the new "
                        "pass restarted its loader), unlike torch's independent iterators. Finish "
                        "(or drop) one pass before starting the next, or iterate two DataLoader "
                        "objects (zip(loader, loader) needs two)");
        return NULL;
    }
    if (enter(self) < 0)
        return NULL;
    PyObject *r = next_locked(self);
    leave(self);
    return r;
}

static void iter_dealloc(PyObject *obj)
{
    PyObject_GC_UnTrack(obj);
    Py_XDECREF(((IterObject *)obj)->loader);
    PyObject_GC_Del(obj);
}

/* (a reference the GC must see: an iterator kept on its loader, or in a generator, a trainer,
 * a Python dataset's pass, that its loader reaches, is a cycle) */
static int iter_traverse(PyObject *obj, visitproc visit, void *arg)
{
    Py_VISIT(((IterObject *)obj)->loader);
    return 0;
}

PyTypeObject StokeIter_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stoke.LoaderIterator",
    .tp_basicsize = sizeof(IterObject),
    .tp_dealloc = iter_dealloc,
    .tp_traverse = iter_traverse,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One pass over a DataLoader.",
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = iter_next,
};

/* iter(): continues the current epoch when nothing was iterated since create, set_epoch or
 * load_state_dict; otherwise starts the next epoch (as every iter() of a torch DataLoader
 * starts a new pass). */
static PyObject *loader_iter(PyObject *obj)
{
    LoaderObject *self = (LoaderObject *)obj;
    if (check(self) < 0)
        return NULL;
    if (!self->fresh) {
        PyObject *r = loader_set_epoch_to(self, 0, 1);
        if (!r)
            return NULL;
        Py_DECREF(r);
    }
    self->fresh = 0;
    IterObject *it = PyObject_GC_New(IterObject, &StokeIter_Type);
    if (it) {
        it->loader = (LoaderObject *)Py_NewRef(obj);
        it->pass = ++self->passes;
        PyObject_GC_Track(it);
    }
    return (PyObject *)it;
}

static PyObject *loader_set_epoch(PyObject *obj, PyObject *arg)
{
    LoaderObject *self = (LoaderObject *)obj;
    PyObject *n = PyNumber_Index(arg); /* ints, numpy integers */
    unsigned long long e = n ? PyLong_AsUnsignedLongLong(n) : (unsigned long long)-1;
    Py_XDECREF(n);
    if ((e == (unsigned long long)-1 && PyErr_Occurred()) || check(self) < 0)
        return NULL;
    self->fresh = 1;
    return loader_set_epoch_to(self, e, 0);
}

static PyObject *loader_save_state(PyObject *obj, PyObject *unused)
{
    LoaderObject *self = (LoaderObject *)obj;
    if (enter(self) < 0)
        return NULL;
    stoke_loader_state st;
    int rc = stoke_loader_save_state(c_loader(self), &st);
    leave(self);
    if (rc != STOKE_OK)
        return stoke_py_raise(StokeError, rc, stoke_last_error(), -1);
    return Py_BuildValue("(IKKKI)", st.version, (unsigned long long)st.seed,
                         (unsigned long long)st.epoch, (unsigned long long)st.cursor, st.workers);
}

static PyObject *loader_restore_state(PyObject *obj, PyObject *args)
{
    LoaderObject *self = (LoaderObject *)obj;
    stoke_loader_state st = {0};
    unsigned long long seed, epoch, cursor;
    if (!PyArg_ParseTuple(args, "IKKK|I:_restore_state", &st.version, &seed, &epoch, &cursor,
                          &st.workers) ||
        enter(self) < 0)
        return NULL;
    st.seed = seed;
    st.epoch = epoch;
    st.cursor = cursor;
    stoke_loader *l = c_loader(self);
    int rc;
    PyThreadState *ts = PyEval_SaveThread();
    rc = stoke_loader_restore_state(l, &st);
    PyEval_RestoreThread(ts);
    leave(self);
    if (rc != STOKE_OK)
        return stoke_py_raise(StokeError, rc, stoke_last_error(), -1);
    self->fresh = 1;
    Py_RETURN_NONE;
}

static PyObject *loader_stats(PyObject *obj, PyObject *unused)
{
    LoaderObject *self = (LoaderObject *)obj;
    if (check(self) < 0)
        return NULL;
    stoke_loader_stats s = {.size = sizeof(s)}; /* thread-safe */
    stoke_loader_get_stats(c_loader(self), &s);
    return Py_BuildValue(
        "{s:K,s:K,s:K,s:K,s:K,s:K,s:d,s:d,s:d,s:d,s:K,s:K,s:K,s:K,s:K,s:K}", "samples",
        (unsigned long long)s.samples, "batches", (unsigned long long)s.batches, "bytes",
        (unsigned long long)s.bytes, "pinned_batches", (unsigned long long)s.pinned_batches,
        "pageable_batches", (unsigned long long)s.pageable_batches, "device_copies",
        (unsigned long long)s.device_copies, "wait_s", s.wait_s, "wait_p50_s", s.wait_p50_s,
        "wait_p99_s", s.wait_p99_s, "worker_busy_s", s.worker_busy_s, "buffers",
        (unsigned long long)s.buffers, "buffer_bytes", (unsigned long long)s.buffer_bytes,
        "bad_samples", (unsigned long long)s.bad_samples, "skipped_samples",
        (unsigned long long)s.skipped_samples, "replaced_samples",
        (unsigned long long)s.replaced_samples, "worker_restarts",
        (unsigned long long)s.worker_restarts);
}

/* The quarantine's entries from `start` on, as dicts (stoke_loader_quarantine). */
static PyObject *loader_quarantine(PyObject *obj, PyObject *args)
{
    LoaderObject *self = (LoaderObject *)obj;
    Py_ssize_t start = 0;
    if (check(self) < 0 || !PyArg_ParseTuple(args, "|n:quarantine", &start))
        return NULL;
    static const char *const actions[] = {"error", "skip", "replace"};
    PyObject *out = PyList_New(0);
    stoke_bad_sample e;
    for (size_t i = start > 0 ? (size_t)start : 0;
         out && stoke_loader_quarantine(c_loader(self), i, &e) == STOKE_OK; i++) {
        PyObject *rep = e.replacement == UINT64_MAX ? Py_NewRef(Py_None)
                                                    : PyLong_FromUnsignedLongLong(e.replacement);
        PyObject *d = Py_BuildValue(
            "{s:K,s:K,s:i,s:s,s:N,s:N,s:N}", "index", (unsigned long long)e.index, "epoch",
            (unsigned long long)e.epoch, "code", e.code, "action",
            actions[e.action >= 0 && e.action <= 2 ? e.action : 0], "replacement", rep,
            "source", stoke_py_text(e.source, "surrogateescape"), "reason",
            stoke_py_text(e.reason, "backslashreplace"));
        if (!d || PyList_Append(out, d) < 0)
            Py_CLEAR(out);
        Py_XDECREF(d);
    }
    return out;
}

static Py_ssize_t loader_len(PyObject *obj)
{
    LoaderObject *self = (LoaderObject *)obj;
    if (check(self) < 0)
        return -1;
    return (Py_ssize_t)stoke_loader_num_batches(c_loader(self));
}

static PyObject *loader_get_epoch(PyObject *obj, void *unused)
{
    return PyLong_FromUnsignedLongLong(stoke_loader_epoch(c_loader((LoaderObject *)obj)));
}

static PyObject *loader_get_rank(PyObject *obj, void *unused)
{
    return PyLong_FromLongLong(((LoaderObject *)obj)->rank);
}

static PyObject *loader_get_world_size(PyObject *obj, void *unused)
{
    return PyLong_FromLongLong(((LoaderObject *)obj)->world_size);
}

static PyObject *loader_get_pinned_backend(PyObject *obj, void *unused)
{
    const char *b = stoke_loader_pinned_backend(c_loader((LoaderObject *)obj));
    if (!b)
        Py_RETURN_NONE;
    return PyUnicode_FromString(b);
}

static PyObject *loader_get_dataset_len(PyObject *obj, void *unused)
{
    LoaderObject *self = (LoaderObject *)obj;
    if (!self->ds.length)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(self->ds.length(self->ds.user));
}

static PyObject *loader_get_fenced(PyObject *obj, void *unused)
{
    (void)unused;
    const stoke_py_core *c = ((LoaderObject *)obj)->core;
    return PyLong_FromLong(c ? c->npend : 0);
}

static PyObject *loader_get_outstanding(PyObject *obj, void *unused)
{
    (void)unused;
    const stoke_py_core *c = ((LoaderObject *)obj)->core;
    return PyLong_FromSsize_t(c ? c->outstanding : 0);
}

/* stoke_loader_interrupt: at the interpreter's exit (the atexit hook, for every live loader)
 * the worker processes' batches are not waited for. */
static PyObject *loader_interrupt(PyObject *obj, PyObject *unused)
{
    (void)unused;
    stoke_loader_interrupt(c_loader((LoaderObject *)obj));
    Py_RETURN_NONE;
}

static PyMethodDef loader_methods[] = {
    {"set_epoch", loader_set_epoch, METH_O, "Starts `epoch` from its beginning."},
    {"_interrupt", loader_interrupt, METH_NOARGS,
     "Marks the loader interrupted (Ctrl-C): busy worker processes are not waited for."},
    {"_save_state", loader_save_state, METH_NOARGS, "(version, seed, epoch, cursor, workers)"},
    {"_restore_state", loader_restore_state, METH_VARARGS, "Moves to a saved position."},
    {"stats", loader_stats, METH_NOARGS, "The loader's counters."},
    {"quarantine", loader_quarantine, METH_VARARGS,
     "The bad samples (on_error), from entry `start` on, as dicts."},
    {"_close_if_idle", loader_close_if_idle, METH_NOARGS,
     "Stops the loader and closes its dataset now unless another thread is in a call on it "
     "(batches alive keep their memory); returns whether it did."},
    {NULL, NULL, 0, NULL}};

static PyObject *loader_get_passes_go_on(PyObject *obj, void *unused)
{
    return PyBool_FromLong(((LoaderObject *)obj)->persistent);
}

static int loader_set_passes_go_on(PyObject *obj, PyObject *v, void *unused)
{
    int on = v ? PyObject_IsTrue(v) : -1;
    if (on < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "stoke: _passes_go_on cannot be deleted");
        return -1;
    }
    ((LoaderObject *)obj)->persistent = on;
    return 0;
}

static PyGetSetDef loader_getset[] = {
    {"epoch", loader_get_epoch, NULL, "The current epoch.", NULL},
    {"rank", loader_get_rank, NULL, "This process's rank (0 when not distributed).", NULL},
    {"world_size", loader_get_world_size, NULL, "Number of ranks (1 when not distributed).", NULL},
    {"pinned_backend", loader_get_pinned_backend, NULL, "Backend batches are pinned for.", NULL},
    {"dataset_len", loader_get_dataset_len, NULL, "Samples in the dataset.", NULL},
    {"_fenced", loader_get_fenced, NULL,
     "Batches released whose release fences are not done yet (counted in _outstanding).", NULL},
    {"_outstanding", loader_get_outstanding, NULL, "Batches delivered and not yet released.",
     NULL},
    {"_passes_go_on", loader_get_passes_go_on, loader_set_passes_go_on,
     "An iterator goes on in a later pass (torch's persistent_workers=True) instead of raising "
     "that it was superseded; persistent_workers by default.",
     NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PySequenceMethods loader_as_sequence = {.sq_length = loader_len};

PyTypeObject StokeLoader_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stoke.Loader",
    .tp_basicsize = sizeof(LoaderObject),
    .tp_dealloc = loader_dealloc,
    .tp_as_sequence = &loader_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = loader_traverse,
    .tp_finalize = loader_finalize,
    .tp_doc = "The C loader behind stoke.DataLoader.",
    .tp_iter = loader_iter,
    .tp_methods = loader_methods,
    .tp_getset = loader_getset,
    .tp_init = loader_init,
    .tp_new = PyType_GenericNew,
};
