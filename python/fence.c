/* Pinned memory the caller may still be copying from: a batch (or a PinnedBuffer) dropped right
 * after `tensor.to("cuda", non_blocking=True)` went back to the pool at once, and a worker
 * could write the next batch into it while the GPU's copy, queued behind the work before it,
 * had not read it yet (torch's own pinned batches are safe: its caching host allocator records
 * an event on the copy's stream and reuses the block after it; memory it did not allocate it
 * does not track).
 *
 * So a pinned block given back is fenced: the release fence (_set_release_fence; the package
 * installs one that records a torch.cuda.Event on the current stream when CUDA is initialized
 * in this process) is called, and the block is given back once its fence says done (query();
 * synchronize() waits).  Kept per loader (its core, stoke_py.h), at most `pend_max` of them (the
 * buffers beyond those the consumer may hold and one for the workers: more would stall the
 * loader), the oldest waited for beyond that; looked at before each next() and each release,
 * drained when the Loader closes (a batch given back later waits for its own fence) and before
 * the C loader is destroyed (the core's last reference).
 * PinnedBuffers (the drop-in's copies of held batches) have one list of their own.  GIL held
 * throughout. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stoke_py.h"

#define PIN_PEND_MAX 16 /* PinnedBuffers given back and not yet fenced done, at most */

static PyObject *release_fence; /* callable returning a fence or None; NULL: none */
static pid_t fence_pid;          /* the process whose fences these are (a forked child's copies
                                    of the lists are given back without asking them) */

typedef struct {
    PyObject *fence;
    void *p;
} pin_pending;

static pin_pending pin_pend[PIN_PEND_MAX];
static int pin_npend, pin_in_fence;

/* A fence for memory given back now (new reference), or NULL (none: give it back now).  The
 * exception being raised, if any, is kept; the fence's own is reported as unraisable. */
static PyObject *new_fence(void)
{
    if (!release_fence || stoke_py_finalizing())
        return NULL;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *f = PyObject_CallNoArgs(release_fence);
    if (!f)
        PyErr_WriteUnraisable(release_fence);
    else if (f == Py_None)
        Py_CLEAR(f);
    else
        fence_pid = getpid();
    PyErr_Restore(type, value, tb);
    return f;
}

/* 1 when the fence is done; with `wait`, waits for it first.  A fence that fails counts as done
 * (reported): the memory is not kept for ever. */
static int fence_done(PyObject *f, int wait)
{
    if (stoke_py_finalizing() || getpid() != fence_pid)
        return 1;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = PyObject_CallMethod(f, wait ? "synchronize" : "query", NULL);
    int done = 1;
    if (!r)
        PyErr_WriteUnraisable(f);
    else if (!wait && (done = PyObject_IsTrue(r)) < 0) {
        PyErr_WriteUnraisable(f);
        done = 1;
    }
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
    return done;
}

/* Gives back the n oldest waiting batches (their fences done or waited for). */
static void give_back(stoke_py_core *L, int n)
{
    for (int i = 0; i < n; i++) {
        stoke_batch_release(L->pend[i].b);
        Py_DECREF(L->pend[i].fence);
        L->outstanding--;
    }
    L->npend -= n;
    memmove(L->pend, L->pend + n, (size_t)L->npend * sizeof(*L->pend));
}

/* Gives back the batches whose fences are done, in the order given back up to the first not
 * done (all of them with `wait`, waiting): the events of one stream complete in order, and
 * one query a next() is what a loop running ahead of its GPU pays.  A fence's Python code may
 * free another batch of this loader (the cyclic GC): that one, seeing `in_fence`, waits for
 * its own fence at once and leaves the list alone. */
void stoke_py_settle(stoke_py_core *L, int wait)
{
    if (L->in_fence)
        return;
    L->in_fence = 1;
    int i = 0;
    while (i < L->npend && fence_done(L->pend[i].fence, wait))
        i++;
    give_back(L, i);
    L->in_fence = 0;
}

int stoke_py_settle_one(stoke_py_core *L)
{
    if (!L->npend || L->in_fence)
        return 0;
    L->in_fence = 1;
    fence_done(L->pend[0].fence, 1);
    give_back(L, 1);
    L->in_fence = 0;
    return 1;
}

/* The most batches kept fenced: the buffers less those the consumer may hold and one, and at
 * most STOKE_PY_PEND_MAX (a loop that many batches ahead of its GPU's copies waits for the
 * oldest; an automatic prefetch of small batches has hundreds of buffers). */
static int pend_max(stoke_py_core *L)
{
    if (L->pend_max < 0) {
        stoke_loader_stats s = {.size = sizeof(s)};
        L->pend_max = 0;
        if (L->l && stoke_loader_get_stats(L->l, &s) == STOKE_OK &&
            s.buffers > (uint64_t)L->held + 1)
            L->pend_max = (int)(s.buffers - (uint64_t)L->held - 1);
        if (L->pend_max > STOKE_PY_PEND_MAX)
            L->pend_max = STOKE_PY_PEND_MAX;
    }
    return L->pend_max;
}

int stoke_py_release_batch(stoke_py_core *L, stoke_batch *b)
{
    PyObject *f = NULL;
    if (!L->device_mode && stoke_batch_is_pinned(b))
        f = new_fence();
    /* a fence's own code runs, or the Loader closed: no next() will look at the list again,
     * and the stopped loader frees this buffer at its release (stoke_loader_stop); or no
     * buffer may wait fenced (buffers = held + 1): waited for here, the copy done before a
     * worker writes the buffer again, or its registration ends (pin_on_use) */
    if (f && (L->in_fence || L->closed || pend_max(L) == 0)) {
        fence_done(f, 1);
        Py_CLEAR(f);
    }
    if (!f) {
        stoke_batch_release(b);
        L->outstanding--;
        return 0;
    }
    stoke_py_settle(L, 0);
    L->in_fence = 1;
    L->pend[L->npend].fence = f;
    L->pend[L->npend++].b = b;
    while (L->npend > pend_max(L)) { /* the oldest waited for */
        fence_done(L->pend[0].fence, 1);
        give_back(L, 1);
    }
    L->in_fence = 0;
    return 1;
}

void stoke_py_drain(stoke_py_core *L)
{
    stoke_py_settle(L, 1);
}

/* ---- PinnedBuffers --------------------------------------------------------------------------- */

static void pin_settle(int wait)
{
    if (pin_in_fence)
        return;
    pin_in_fence = 1;
    int i = 0;
    for (; i < pin_npend && fence_done(pin_pend[i].fence, wait); i++) {
        stoke_pinned_free(pin_pend[i].p);
        Py_DECREF(pin_pend[i].fence);
    }
    pin_npend -= i;
    if (i)
        memmove(pin_pend, pin_pend + i, (size_t)pin_npend * sizeof(*pin_pend));
    pin_in_fence = 0;
}

void stoke_py_pinned_settle(void)
{
    if (pin_npend)
        pin_settle(0);
}

void stoke_py_pinned_free(void *p)
{
    PyObject *f = new_fence();
    if (f && pin_in_fence) {
        fence_done(f, 1);
        Py_CLEAR(f);
    }
    if (!f) {
        stoke_pinned_free(p);
        return;
    }
    stoke_py_pinned_settle();
    pin_in_fence = 1;
    if (pin_npend == PIN_PEND_MAX) { /* the oldest waited for */
        fence_done(pin_pend[0].fence, 1);
        stoke_pinned_free(pin_pend[0].p);
        Py_DECREF(pin_pend[0].fence);
        memmove(pin_pend, pin_pend + 1, (size_t)--pin_npend * sizeof(*pin_pend));
    }
    pin_pend[pin_npend].fence = f;
    pin_pend[pin_npend++].p = p;
    pin_in_fence = 0;
}

/* ---- module functions -------------------------------------------------------------------------- */

PyObject *stoke_py_set_release_fence(PyObject *self, PyObject *fn)
{
    (void)self;
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "_set_release_fence: a callable or None");
        return NULL;
    }
    Py_XSETREF(release_fence, fn == Py_None ? NULL : Py_NewRef(fn));
    Py_RETURN_NONE;
}

PyObject *stoke_py_settle_pinned(PyObject *self, PyObject *wait)
{
    (void)self;
    int w = PyObject_IsTrue(wait);
    if (w < 0)
        return NULL;
    pin_settle(w);
    return PyLong_FromLong(pin_npend);
}
