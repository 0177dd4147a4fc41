/* The data loader: creation and teardown, batch memory and pinning.  The consumer side
 * (stoke_loader_next, the reorder stage, the hand-off and auto workers) is in next.c, worker
 * threads and sample production in worker.c, the device transfer in transfer.c,
 * epochs/state/statistics in state.c, the batch handle in batch.c; the shared structures and the
 * locking rules are in loader_internal.h.
 */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/internal.h"
#include "ipc/arena_internal.h"
#include "loader/loader_internal.h"
#include "pinned/pinned_internal.h"
#include "registry/registry.h"
#include "stoke/accelerator.h"
#include "stoke/loader.h"
#include "stoke/pinned.h"

void stoke_loader_opts_init(stoke_loader_opts *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof(*o)); /* every other default is 0 (loader.h) */
    o->size = sizeof(*o);
    o->batch_size = 1;
    o->prefetch_factor = 2;
    o->in_order = 1;
    o->pin_memory = 1;
    stoke_sampler_opts_init(&o->sampler);
    o->on_error = STOKE_ON_ERROR_ERROR;
    o->max_bad = UINT64_MAX;
    o->max_bad_fraction = 1.0;
    o->held_buffers = 2;
}

int stoke__loader_fail(stoke_loader *l, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    stoke__vfmt_short(l->err, sizeof(l->err), fmt, ap);
    va_end(ap);
    return stoke__fail(code, "%s", l->err);
}

/* ---- memory ------------------------------------------------------------------------------- */

static int slot_alloc(stoke_loader *l, stoke__slot *s)
{
    void *p = NULL;
    int rc = STOKE_OK;
    switch (l->alloc_kind) {
    case STOKE__ALLOC_POOL: rc = stoke_pinned_alloc(l->buf_bytes, &p); break;
    case STOKE__ALLOC_ARENA: rc = stoke_arena_alloc(l->arena, l->buf_bytes, &p); break;
    case STOKE__ALLOC_BACKEND: /* another backend or device: still the pinned layer's block */
        rc = stoke__pinned_alloc_on(l->pin_vt, l->pin_dev, l->buf_bytes, &p);
        break;
    default: /* pageable: resident from creation (stoke__resident_alloc) */
        if (!(p = stoke__resident_alloc(l->buf_bytes)))
            rc = stoke__fail(STOKE_ENOMEM, "cannot allocate %zu bytes", l->buf_bytes);
        break;
    }
    s->mem = p;
    s->pinned = rc == STOKE_OK && l->alloc_kind != STOKE__ALLOC_PAGEABLE && stoke_is_pinned(p);
    return rc;
}

int stoke__loader_resolve_spec(stoke_loader *l, const char *what, const char *spec,
                               const stoke_backend **vt, int *index)
{
    char name[64];
    *vt = NULL;
    *index = -1;
    if (stoke__parse_accel_spec(spec, name, sizeof(name), index) != STOKE_OK)
        return stoke__loader_fail(l, STOKE_EINVAL,
                                  "loader: %s '%s' is not of the form name[:index] (e.g. "
                                  "\"simdev\", \"cuda:1\")",
                                  what, spec);
    int rc = stoke__backend_lookup(name, vt);
    if (rc != STOKE_OK)
        return rc;
    if (*index >= 0) {
        int count = 0;
        if ((*vt)->device_count(&count) != STOKE_OK)
            count = 0;
        if (*index >= count)
            return stoke__loader_fail(l, STOKE_ERANGE,
                                      "loader: %s '%s': %s has %d device(s), no device %d", what,
                                      spec, (*vt)->name, count, *index);
    }
    return STOKE_OK;
}

void stoke__loader_batch_desc(const stoke_loader *l, const stoke_batch *b, char *buf, size_t len)
{
    size_t n = b->count;
    const uint64_t *ix = b->indices;
    int contiguous = 1;
    for (size_t j = 1; j < n && contiguous; j++)
        contiguous = ix[j] == ix[0] + j;
    if (n == 0) {
        stoke__fmt(buf, len, "batch %" PRIu64 " of epoch %" PRIu64 " (no samples)", b->seq,
                   b->epoch);
    } else if (contiguous) {
        stoke__fmt(buf, len,
                   "batch %" PRIu64 " of epoch %" PRIu64 " (sample indices %" PRIu64 "..%" PRIu64
                   ")",
                   b->seq, b->epoch, ix[0], ix[n - 1]);
    } else if (l->iterable) {
        stoke__fmt(buf, len,
                   "batch %" PRIu64 " of epoch %" PRIu64 " (%zu samples, indices %" PRIu64
                   " ... %" PRIu64 ")",
                   b->seq, b->epoch, n, ix[0], ix[n - 1]);
    } else {
        uint64_t first = b->seq * l->o.batch_size;
        stoke__fmt(buf, len,
                   "batch %" PRIu64 " of epoch %" PRIu64 " (positions %" PRIu64 "..%" PRIu64
                   " of the epoch's order: %zu samples, indices %" PRIu64 " ... %" PRIu64 ")",
                   b->seq, b->epoch, first, first + n - 1, n, ix[0], ix[n - 1]);
    }
}

/* Decides where batches live; logs the warnings of the pin semantics.  Sets l->err on error. */
static int choose_pinning(stoke_loader *l)
{
    const stoke_loader_opts *o = &l->o; /* (l: calloc'd, pageable and no pin_backend) */
    const char *pdev = o->pin_memory_device, *want = pdev ? pdev : o->device;
    if (pdev) {
        char name[64];
        int index;
        if (stoke__parse_accel_spec(pdev, name, sizeof(name), &index) != STOKE_OK)
            return stoke__loader_fail(l, STOKE_EINVAL,
                                      "loader: pin_memory_device '%s' is not of the form "
                                      "name[:index] (e.g. \"simdev\", \"cuda:1\")",
                                      pdev);
    }
    if (!o->pin_memory) {
        if (pdev)
            stoke__log(STOKE_LOG_WARN,
                       "pin_memory_device '%s' has no effect because pin_memory is off", pdev);
        return STOKE_OK;
    }
    const stoke_backend *cur = NULL, *vt = NULL;
    int cdev = 0, index = -1;
    int crc = stoke__accel_current(&cur, &cdev, NULL);
    if (crc != STOKE_OK && crc != STOKE_ENODEV)
        return stoke__loader_fail(l, crc, "loader: %s", stoke_last_error());
    int rc = !want ? STOKE_OK
                   : stoke__loader_resolve_spec(l, pdev ? "pin_memory_device" : "device", want, &vt,
                                                &index);
    if (rc == STOKE_EINVAL || rc == STOKE_ERANGE)
        return rc;
    if (rc != STOKE_OK && !pdev)
        return stoke__loader_fail(l, rc, "loader: device '%s': %s", want, stoke_last_error());
    if (vt && rc == STOKE_OK && (vt->caps & STOKE_CAP_PINNED_ALLOC)) {
        int other = vt != cur || (index >= 0 && index != cdev); /* than the current one */
        l->alloc_kind = other ? STOKE__ALLOC_BACKEND : STOKE__ALLOC_POOL;
        l->pin_vt = vt;
        l->pin_dev = index < 0 ? 0 : index;
        stoke__strlcpy(l->pin_backend, vt->name, sizeof(l->pin_backend));
        return STOKE_OK;
    }
    /* device: a backend that pins nothing (the cpu fallback: its "pinned" memory is ordinary
     * memory) pins for the current accelerator, if any; pin_memory_device: a backend that cannot
     * pin warns, then as if unset */
    if (pdev) {
        char detail[384];
        if (rc == STOKE_OK)
            stoke__fmt(detail, sizeof(detail), "the %s backend pins nothing", vt->name);
        else
            stoke__strlcpy(detail, stoke_last_error(), sizeof(detail));
        if (crc != STOKE_OK) {
            stoke__log(STOKE_LOG_WARN,
                       "pin_memory_device '%s' is not available (%s); batches will not be "
                       "pinned",
                       want, detail);
            return STOKE_OK;
        }
        stoke__log(STOKE_LOG_WARN,
                   "pin_memory_device '%s' is not available (%s); pinning for the current "
                   "accelerator %s instead",
                   want, detail, cur->name);
    }
    if (crc == STOKE_OK) {
        l->alloc_kind = STOKE__ALLOC_POOL;
        stoke__strlcpy(l->pin_backend, cur->name, sizeof(l->pin_backend));
    } else {
        /* said once a process, and not when the pinned allocator said it already */
        stoke__pn_warn_unpinned("pin_memory is set but no accelerator was found; batches will "
                                "not be pinned");
    }
    return STOKE_OK;
}

/* Sizes one batch buffer for l->cap samples and the field offsets in it.  A batch of the full
 * batch_size must be representable (indices, every field, the alignment: batch_size x (8 +
 * sample_bytes) and some 256 bytes per field): STOKE_ERANGE otherwise, so a nonsensical
 * batch_size fails the same way whatever the dataset's length. */
static int size_buffers(stoke_loader *l)
{
    size_t bs = l->o.batch_size, sb = 0, nominal;
    int over = 0;
    for (int f = 0; f < l->ds.nfields; f++)
        over |= __builtin_add_overflow(sb, l->fields[f].bytes, &sb);
    l->sample_bytes = sb;
    over |= __builtin_add_overflow(sb, sizeof(uint64_t), &nominal) ||
            __builtin_mul_overflow(nominal, bs, &nominal) ||
            __builtin_add_overflow(nominal, 4096 + 8 + 256 * (size_t)l->ds.nfields, &nominal);
    if (over)
        return stoke__loader_fail(l, STOKE_ERANGE,
                                  "loader: batch_size %zu is too large: a batch of %zu samples "
                                  "of %zu bytes does not fit in the address space",
                                  bs, bs, l->sample_bytes);
    l->cap = bs;
    if (!l->iterable && l->nsamples < bs)
        l->cap = l->nsamples ? (size_t)l->nsamples : 1;
    size_t off = 0;
    for (int f = 0; f < l->ds.nfields; f++) {
        l->off[f] = off;
        off = stoke__align_up(off + l->cap * l->fields[f].bytes, 256);
    }
    /* each batch's ragged words (b->rmeta; 2 + 2 cap fits: the indices of a batch did) */
    size_t rmeta;
    if (__builtin_mul_overflow((size_t)l->nragged * sizeof(int64_t), STOKE__RMETA_WORDS(l), &rmeta))
        return stoke__loader_fail(l, STOKE_ERANGE, "loader: batch_size %zu is too large", bs);
    l->buf_bytes = stoke__align_up(off, 4096);
    return STOKE_OK;
}

/* ---- create / destroy --------------------------------------------------------------------- */

/* Copies the dataset's fields (names, shapes) into the loader, checks each and lays out its
 * ragged ones. */
static int copy_fields(stoke_loader *l, const stoke_dataset *ds)
{
    int nf = ds->nfields;
    size_t ndims = 0; /* (a negative ndim: stoke_field_finish refuses it below) */
    for (int f = 0; f < nf; f++)
        ndims += ds->fields[f].ndim > 0 ? (size_t)ds->fields[f].ndim : 0;
    /* One block, in this order: fields, off, step, the shapes, rix, rg (each array's start is
     * aligned for its type: sizeof(stoke_field) is a multiple of 8, the int arrays come last). */
    size_t per_field = sizeof(stoke_field) + 2 * sizeof(size_t) + 2 * sizeof(int);
    if (!(l->fields = calloc(1, (size_t)nf * per_field + ndims * sizeof(int64_t))))
        return stoke__loader_fail(l, STOKE_ENOMEM, "loader: out of memory for %d fields", nf);
    l->off = (size_t *)(l->fields + nf);
    l->step = l->off + nf;
    int64_t *sh = (int64_t *)(l->step + nf);
    l->rix = (int *)(sh + ndims);
    l->rg = l->rix + nf;
    for (int f = 0; f < nf; f++) {
        stoke_field *fd = &l->fields[f];
        *fd = ds->fields[f];
        fd->name[sizeof(fd->name) - 1] = '\0';
        size_t given = fd->bytes;
        if (stoke_field_finish(fd) != STOKE_OK) /* (on the caller's shape, checked there) */
            return stoke__loader_fail(l, STOKE_EINVAL, "loader: dataset %s: field %d: %s", ds->name,
                                      f, stoke_last_error());
        /* (fd->bytes is 0 only for a shape with a 0 dimension: a legal sample of 0 bytes) */
        if (fd->ndim)
            memcpy(sh, fd->shape, (size_t)fd->ndim * sizeof(*sh));
        fd->shape = fd->ndim ? sh : NULL;
        sh += fd->ndim;
        if (given && given != fd->bytes)
            return stoke__loader_fail(l, STOKE_EINVAL,
                                      "loader: dataset %s: field %d ('%s') says %zu bytes per "
                                      "sample, its dtype and shape make %zu",
                                      ds->name, f, fd->name, given, fd->bytes);
        l->step[f] = fd->bytes;
        l->rix[f] = -1;
        if (fd->ndim && fd->shape[0] == STOKE_DIM_VAR) {
            l->rg[l->nragged] = f;
            l->rix[f] = l->nragged++;
        }
    }
    l->ds.fields = l->fields;
    return STOKE_OK;
}

static int check_dataset(stoke_loader *l, const stoke_dataset *ds)
{
    switch (ds->kind) {
    case STOKE_DATASET_MAP:
        if (!ds->length || !ds->get)
            return stoke__loader_fail(l, STOKE_EINVAL,
                                      "loader: dataset %s has no length() or get()", ds->name);
        break;
    case STOKE_DATASET_ITERABLE:
        if (!ds->next)
            return stoke__loader_fail(l, STOKE_EINVAL, "loader: iterable dataset %s has no next()",
                                      ds->name);
        if (l->o.shuffle || l->o.sampler.kind != STOKE_SAMPLER_SEQUENTIAL ||
            l->o.sampler.distributed)
            return stoke__loader_fail(
                l, STOKE_EINVAL,
                "loader: iterable dataset %s: shuffle and samplers do not apply (the "
                "dataset orders and shards itself)",
                ds->name);
        break;
    default:
        return stoke__loader_fail(l, STOKE_EINVAL, "loader: dataset %s has an unknown kind %d",
                                  ds->name, ds->kind);
    }
    if (ds->nfields < 1 || !ds->fields)
        return stoke__loader_fail(l, STOKE_EINVAL,
                                  "loader: dataset %s has %d fields%s (at least 1)", ds->name,
                                  ds->nfields, ds->fields ? "" : " and no field list");
    return copy_fields(l, ds);
}

/* A zeroed loader with its options, dataset and synchronization objects (destroy works on it
 * from here on), or NULL. */
static stoke_loader *loader_new(const stoke_loader_opts *o, const stoke_dataset *ds)
{
    stoke_loader *l = calloc(1, sizeof(*l));
    if (!l)
        return NULL;
    stoke_loader_opts_init(&l->o);
    memcpy(&l->o, o, o->size);
    l->ds = *ds; /* its size was checked (stoke_loader_create) */
    l->ds.name[sizeof(l->ds.name) - 1] = '\0';
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
    pthread_mutexattr_settype(&ma, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
    pthread_mutex_init(&l->mu, &ma);
    pthread_mutexattr_destroy(&ma);
    pthread_mutex_init(&l->stream_mu, NULL);
    pthread_cond_init(&l->work_cv, NULL);
    pthread_condattr_t ca; /* done_cv's waits are until CLOCK_MONOTONIC times */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&l->done_cv, &ca);
    pthread_condattr_destroy(&ca);
    l->done_tail = &l->done;
    l->fork_gen = stoke__fork_gen();
    l->pid = (int)getpid();
    return l;
}

/* Keeps a copy of option string *opt (at most len - 1 characters) in buf. */
static int copy_spec(stoke_loader *l, const char *what, const char **opt, char *buf, size_t len)
{
    if (!*opt)
        return STOKE_OK;
    if (strlen(*opt) >= len) {
        char shown[48];
        stoke__shorten(shown, sizeof(shown), *opt);
        *opt = NULL;
        return stoke__loader_fail(l, STOKE_EINVAL, "loader: %s '%s' is longer than %zu characters",
                                  what, shown, len - 1);
    }
    *opt = stoke__strlcpy(buf, *opt, len);
    return STOKE_OK;
}

/* Step 1 of create: the options and the dataset make sense. */
static int validate(stoke_loader *l)
{
    int rc = copy_spec(l, "device", &l->o.device, l->device_spec, sizeof(l->device_spec));
    if (rc == STOKE_OK)
        rc = copy_spec(l, "pin_memory_device", &l->o.pin_memory_device, l->pin_spec,
                       sizeof(l->pin_spec));
    if (rc != STOKE_OK)
        return rc;
    /* The bounds keep prefetch_factor * workers (the reorder window) far from INT_MAX. */
    int auto_w = l->o.num_workers == STOKE_LOADER_WORKERS_AUTO;
    /* each option named with its value (the message listed every bound at once) */
    if (l->o.batch_size == 0)
        return stoke__loader_fail(l, STOKE_EINVAL, "loader: batch_size is 0; it must be >= 1");
    if (!auto_w && (l->o.num_workers < 0 || l->o.num_workers > 1024))
        return stoke__loader_fail(l, STOKE_EINVAL,
                                  "loader: num_workers is %d; it must be in 0..1024 or "
                                  "STOKE_LOADER_WORKERS_AUTO",
                                  l->o.num_workers);
    if (l->o.prefetch_factor < 0 || l->o.prefetch_factor > 4096)
        return stoke__loader_fail(l, STOKE_EINVAL,
                                  "loader: prefetch_factor is %d; it must be in 1..4096 or "
                                  "STOKE_LOADER_PREFETCH_AUTO",
                                  l->o.prefetch_factor);
    if (l->o.held_buffers < 1 || l->o.held_buffers > 4096)
        return stoke__loader_fail(l, STOKE_EINVAL,
                                  "loader: held_buffers is %d; it must be in 1..4096",
                                  l->o.held_buffers);
    if (l->o.pin_on_use && (l->o.worker_mode != STOKE_WORKER_PROCESSES || l->o.device))
        return stoke__loader_fail(l, STOKE_EINVAL, "loader: pin_on_use is %s",
                                  l->o.device ? "for host batches (with device, the loader "
                                                "copies each batch before its consumer sees it)"
                                              : "for worker_mode processes (worker threads' "
                                                "buffers are pinned whole, each its own)");
    if (l->o.round_robin && auto_w)
        return stoke__loader_fail(l, STOKE_EINVAL,
                                  "loader: round_robin needs a fixed num_workers (batch k is "
                                  "worker k %% num_workers's), not STOKE_LOADER_WORKERS_AUTO");
    /* per worker; with STOKE_LOADER_PREFETCH_AUTO 2, and the plan may deepen the window */
    l->prefetch = l->o.prefetch_factor ? l->o.prefetch_factor : 2;
    if (l->o.on_error < STOKE_ON_ERROR_ERROR || l->o.on_error > STOKE_ON_ERROR_REPLACE)
        return stoke__loader_fail(
            l, STOKE_EINVAL, "loader: unknown on_error %d (error, skip, replace)", l->o.on_error);
    if (!(l->o.max_bad_fraction >= 0.0 && l->o.max_bad_fraction <= 1.0))
        return stoke__loader_fail(l, STOKE_EINVAL, "loader: max_bad_fraction %g is not in 0..1",
                                  l->o.max_bad_fraction);
    return check_dataset(l, &l->ds);
}

/* The batch buffers are allocated up front (docs/loader.md): refuses a count and size whose
 * total exceeds physical memory, naming the options behind it. */
static int check_upfront_bytes(stoke_loader *l)
{
    uint64_t phys = stoke__physical_memory(), total;
    int overflow = __builtin_mul_overflow((uint64_t)l->nbuf, (uint64_t)l->buf_bytes, &total);
    if (!phys || (!overflow && total <= phys))
        return STOKE_OK;
    return stoke__loader_fail(
        l, STOKE_ENOMEM,
        "loader: %d batch buffers of %zu bytes (%s%" PRIu64 " bytes in all) exceed the %" PRIu64
        " bytes of physical memory: buffers = num_workers %d x prefetch_factor %d + %d (at most "
        "batches per epoch + %d), each holding batch_size %zu samples of %zu bytes; lower "
        "num_workers, prefetch_factor or batch_size",
        l->nbuf, l->buf_bytes, overflow ? "more than " : "", overflow ? UINT64_MAX : total, phys,
        l->nw1, l->prefetch, l->o.held_buffers, l->o.held_buffers, l->cap, l->sample_bytes);
}

/* The plan: which of the loader's fast paths apply, decided here once from the options and
 * the dataset; the hot paths test l->plan, not the modes.  docs/loader.md, "The plan".
 *
 *   path         applies when                                    what it does
 *   group        MAP, threads, host copies                       a producer claims up to 16
 *                                                                tiny batches per hold of mu
 *   scatter      group, dataset read(), no ragged field, no      a group's samples in one
 *                timeout                                         read() call
 *   assist       MAP, threads, no worker_init, not round_robin,  the caller's thread makes the
 *                no timeout                                      batch it needs when nobody is
 *   help         assist                                          ... and the next one while a
 *                                                                worker makes the one it needs
 *   hint_next    MAP, batch_size <= STOKE_DATASET_PREFETCH_MAX,  a producer names its next
 *                dataset hint()                                  batch's samples to the dataset
 *   marks        timeout_ms, or process workers                  busy marks per dataset call
 *                                                                (a child's: its crashes name
 *                                                                their sample)
 *   caller_all   0 workers                                       the caller's thread makes every
 *                                                                batch (its look-ahead spans them)
 *   deep_window  prefetch_factor auto, workers, threads, MAP,    the reorder window grows to
 *                buffers under 256 KiB                           what 1 MiB of buffers holds
 *
 * (device copies: one batch per claim, since taking a staging slot may wait on a copy with mu
 * dropped; process workers: one batch per request.)  A deeper window means one wake-up per
 * many tiny batches instead of one every few: at batch size 1 on 2 cores a window of 6 cost
 * about one sleep and wake-up of a worker per 3 batches, which made 2 workers 3x slower than
 * none.  ITERABLE datasets keep their per-worker count (it bounds each worker's share in
 * flight); process workers keep theirs (each buffer is a shared slot of every child).  Auto
 * workers go down to 0 given work (nact_min) only where the caller's thread can make batches. */
#define STOKE__SMALL_WINDOW_BYTES (1u << 20)
#define STOKE__SMALL_WINDOW       256u

static void plan_loader(stoke_loader *l)
{
    stoke__plan *p = &l->plan;
    int map = !l->iterable, threads = l->o.worker_mode == STOKE_WORKER_THREADS;
    int host = !l->o.device, timed = l->o.timeout_ms != 0;
    p->group = map && threads && host;
    p->scatter = p->group && l->ds.read && !l->nragged && !timed;
    /* not under a timeout: a caller's thread inside a stuck get() could not time it out */
    p->assist = map && threads && !l->ds.worker_init && !l->o.round_robin && !timed;
    p->help = p->assist;
    p->hint_next = map && l->o.batch_size <= STOKE_DATASET_PREFETCH_MAX && l->ds.hint;
    p->marks = timed || !threads;
    p->caller_all = l->nworkers == 0;
    l->window = l->prefetch * l->nw1;
    if (l->o.prefetch_factor == STOKE_LOADER_PREFETCH_AUTO && l->nworkers && map && threads &&
        l->buf_bytes < STOKE__SMALL_WINDOW_BYTES / 4) { /* the deep window */
        /* (batches of 0-byte samples, an npy of shape (N, 0): the deepest window) */
        uint64_t deep = l->buf_bytes ? STOKE__SMALL_WINDOW_BYTES / l->buf_bytes : UINT64_MAX;
        deep = deep < STOKE__SMALL_WINDOW ? deep : STOKE__SMALL_WINDOW;
        l->window = deep > (uint64_t)l->window ? (int)deep : l->window;
    }
    int auto_w = l->o.num_workers == STOKE_LOADER_WORKERS_AUTO;
    l->nact_min = !auto_w || !map ? l->nworkers : p->assist ? 0 : 1;
}

/* Step 2 of create: the sampler, the epoch's batches, the buffer size and count. */
static int size_loader(stoke_loader *l)
{
    const stoke_dataset *ds = &l->ds;
    l->iterable = ds->kind == STOKE_DATASET_ITERABLE;
    stoke_sampler_opts so = l->o.sampler;
    if (l->o.shuffle) {
        if (so.kind == STOKE_SAMPLER_SEQUENTIAL)
            so.kind = STOKE_SAMPLER_RANDOM;
        else if (so.kind == STOKE_SAMPLER_SUBSET)
            so.shuffle = 1;
    }
    uint64_t len = l->iterable ? 0 : ds->length(ds->user);
    int rc = stoke_sampler_create(&so, len, &l->sampler);
    if (rc != STOKE_OK)
        return stoke__loader_fail(l, rc, "loader: %s", stoke_last_error());
    l->nsamples = stoke_sampler_length(l->sampler);
    if (!l->iterable && ds->hint) { /* before a zygote forks */
        stoke_hint h = {.kind = STOKE_HINT_ORDER, .sampler_kind = so.kind};
        if (so.kind == STOKE_SAMPLER_BLOCK) { /* the values in use (else 0) */
            h.block_rows = so.block_rows ? so.block_rows : STOKE_SAMPLER_BLOCK_ROWS_DEFAULT;
            h.block_window = so.block_window ? so.block_window : STOKE_SAMPLER_BLOCK_WINDOW_DEFAULT;
        }
        ds->hint(ds->user, &h);
    }
    l->nbatches = l->nsamples / l->o.batch_size; /* no overflow with a huge batch_size */
    if (!l->o.drop_last && l->nsamples % l->o.batch_size)
        l->nbatches++;
    if (l->o.drop_last)
        l->nsamples = l->nbatches * l->o.batch_size;
    if ((rc = size_buffers(l)) != STOKE_OK)
        return rc;
    /* The worker count: num_workers, or for STOKE_LOADER_WORKERS_AUTO one per CPU the calling
     * thread may run on (its affinity mask: taskset, cgroup cpusets; else those online) up to
     * STOKE_LOADER_WORKERS_AUTO_MAX, all given work at first (autotune.c varies that).  The
     * caller's thread may make batches itself ("assist") for MAP datasets without worker_init,
     * which promises one call per thread before its samples; an ITERABLE dataset's shares are
     * fixed per worker. */
    cpu_set_t set;
    long ncpu = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
    if (ncpu <= 0)
        ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    l->ncpu = ncpu > 0 ? (int)ncpu : 1;
    l->nworkers = l->o.num_workers;
    if (l->o.num_workers == STOKE_LOADER_WORKERS_AUTO)
        l->nworkers =
            l->ncpu < STOKE_LOADER_WORKERS_AUTO_MAX ? l->ncpu : STOKE_LOADER_WORKERS_AUTO_MAX;
    l->nact = l->nworkers;
    stoke__autotune_init(&l->autotune, l->nact);
    l->nw1 = l->nworkers ? l->nworkers : 1;
    plan_loader(l);
    uint64_t held = (uint64_t)l->o.held_buffers; /* the consumer's, beyond the window */
    uint64_t nbuf = (uint64_t)l->window + held;
    if (!l->iterable && nbuf > l->nbatches + held)
        nbuf = l->nbatches + held;
    l->nbuf = (int)nbuf;
    return check_upfront_bytes(l);
}

/* Batch buffers from the node-wide arena (opts.arena or $STOKE_ARENA), when asked for: only
 * where they would be pinned for the current accelerator (or not at all, with none). */
static int open_arena(stoke_loader *l)
{
    const char *spec = l->o.arena; /* NULL: $STOKE_ARENA decides */
    size_t idx = /* process workers: a batch's indices and ragged words are shared too */
        stoke__align_up((l->cap + 1 + (size_t)l->nragged * STOKE__RMETA_WORDS(l)) * 8, 4096);
    uint64_t need = (uint64_t)l->nbuf * (l->buf_bytes + 2 * idx) + 16 * 4096;
    stoke_arena *a = NULL;
    if (!l->o.pin_memory) {
        if (spec && spec[0])
            stoke__log(STOKE_LOG_WARN, "loader: arena '%s' has no effect because pin_memory is off",
                       spec);
        return STOKE_OK;
    }
    if (l->alloc_kind == STOKE__ALLOC_BACKEND) {
        if (!spec || !spec[0]) /* ($STOKE_ARENA: not for a loader pinning for another device) */
            return STOKE_OK;
        return stoke__loader_fail(l, STOKE_EINVAL,
                                  "loader: arena '%s' is pinned for the current accelerator, but "
                                  "batches are to be pinned for %s",
                                  spec,
                                  l->o.pin_memory_device ? l->o.pin_memory_device : l->o.device);
    }
    int rc = stoke__arena_open_spec(spec, need, "loader", &a);
    if (rc != STOKE_OK)
        return stoke__loader_fail(l, rc, "%s", stoke_last_error());
    if (a) {
        l->arena = a;
        l->alloc_kind = STOKE__ALLOC_ARENA;
    }
    return STOKE_OK;
}

_Static_assert(offsetof(stoke_batch, l) == STOKE__LINE,
               "stoke_batch: what every hand-off touches fills its first cache line");

/* Step 3 of create: batch handles, worker records, where batches live, the host buffers. */
static int allocate(stoke_loader *l)
{
    l->bat = stoke__calloc_lines((size_t)l->nbuf, sizeof(*l->bat));
    l->slots = calloc((size_t)l->nbuf, sizeof(*l->slots));
    l->w = calloc((size_t)l->nw1, sizeof(*l->w));
    l->free_v = calloc((size_t)l->nbuf, sizeof(*l->free_v));
    int want_bits = !l->o.in_order && !l->iterable, want_ready = l->o.in_order && !l->iterable;
    if (want_bits)
        l->bits = calloc((size_t)((l->nbatches + 7) / 8 + 1), 1);
    if (want_ready) {
        uint64_t slots = 1;
        while (slots < (uint64_t)l->nbuf)
            slots <<= 1;
        l->ready = calloc((size_t)slots, sizeof(*l->ready));
        l->ready_mask = slots - 1;
    }
    if (!l->bat || !l->slots || !l->w || !l->free_v || (want_bits && !l->bits) ||
        (want_ready && !l->ready))
        return stoke__loader_fail(l, STOKE_ENOMEM, "loader: out of memory for %d batch handles",
                                  l->nbuf);
    for (int i = 0; i < l->nw1; i++) {
        stoke__worker *w = &l->w[i];
        w->l = l;
        w->p.wid = i;
        w->p.w = w;
        w->p.busy = &w->busy;
    }
    l->caller.wid = l->nworkers;
    /* each producer's scratch: the slots of a batch or of a group's samples */
    size_t nsc = (l->cap > STOKE__AHEAD_RUN ? l->cap : STOKE__AHEAD_RUN) * (size_t)l->ds.nfields;
    for (int i = 0; i <= l->nw1; i++) {
        stoke__ahead *a = i < l->nw1 ? &l->w[i].p.ahead : &l->caller.ahead;
        a->dst = calloc(nsc, sizeof(*a->dst));
        a->len = l->nragged ? calloc(nsc, sizeof(*a->len)) : NULL;
        if (!a->dst || (l->nragged && !a->len))
            return stoke__loader_fail(l, STOKE_ENOMEM, "loader: out of memory for %zu slots", nsc);
    }
    int rc = choose_pinning(l);
    if (rc == STOKE_OK)
        rc = open_arena(l);
    if (rc != STOKE_OK)
        return rc;
    if (l->o.worker_mode != STOKE_WORKER_THREADS)
        return stoke__proc_create(l); /* shared buffers, the zygote (procworker.c) */
    for (int i = 0; i < l->nbuf; i++) {
        stoke_batch *b = &l->bat[i];
        b->l = l;
        b->indices =
            l->cap <= STOKE__BATCH_INLINE ? b->idx_inline : calloc(l->cap, sizeof(uint64_t));
        if (l->nragged)
            b->rmeta = calloc((size_t)l->nragged * STOKE__RMETA_WORDS(l), sizeof(int64_t));
        if (!b->indices || (l->nragged && !b->rmeta))
            return stoke__loader_fail(l, STOKE_ENOMEM,
                                      "loader: out of memory for the indices (and ragged lengths) "
                                      "of %zu samples",
                                      l->cap);
        if ((rc = slot_alloc(l, &l->slots[i])) != STOKE_OK)
            return stoke__loader_fail(l, rc, "loader: batch buffer %d of %d: %s", i + 1, l->nbuf,
                                      stoke_last_error());
    }
    return STOKE_OK;
}

int stoke_loader_create(const stoke_loader_opts *o, stoke_dataset *ds, stoke_loader **out)
{
    if (!o || !ds || !out)
        return stoke__fail(STOKE_EINVAL, "stoke_loader_create: NULL argument");
    *out = NULL;
    if (o->size == 0 || o->size > sizeof(stoke_loader_opts))
        return stoke__fail(STOKE_EINVAL, "stoke_loader_create: options not initialized with "
                                         "stoke_loader_opts_init");
    /* The dataset interface's size must be this library's: a struct never initialized, or
     * built against another header (version 1 ended before describe), is named rather than
     * misread.  Only one size is taken: stoke_dataset_init, a library function, clears this
     * version's size, so a program built against another could not have called it safely. */
    if (ds->size != sizeof(stoke_dataset))
        return stoke__fail(STOKE_EINVAL,
                           "stoke_loader_create: dataset '%.64s' has size %" PRIu32 ", this "
                           "library's stoke_dataset has %zu: %s",
                           ds->name, ds->size, sizeof(stoke_dataset),
                           ds->size == 0 ? "initialize it with stoke_dataset_init"
                                         : "built against another version of stoke/dataset.h "
                                           "(this is version 2, which appended describe): "
                                           "rebuild it against this one");
    stoke_loader *l = loader_new(o, ds);
    if (!l)
        return stoke__fail(STOKE_ENOMEM, "loader: out of memory");
    int rc = validate(l);
    if (rc == STOKE_OK)
        rc = size_loader(l);
    /* before allocate forks a zygote: process workers start from the dataset as set here */
    if (rc == STOKE_OK)
        rc = stoke__loader_dataset_epoch(l, l->o.epoch);
    if (rc == STOKE_OK)
        rc = allocate(l);
    if (rc == STOKE_OK && l->o.device)
        rc = stoke__loader_setup_device(l);
    if (rc != STOKE_OK) {
        stoke__fail(rc, "%s", l->err[0] ? l->err : stoke_last_error());
        stoke_loader_destroy(l); /* keeps the last error */
        return rc;
    }
    for (int i = l->nbuf - 1; i >= 0; i--) { /* every batch (device mode: slot) free */
        if (l->o.device) {
            l->slots[i].next = l->free_s;
            l->free_s = &l->slots[i];
        } else {
            l->bat[i].host = &l->slots[i];
        }
        l->free_v[l->nfree++] = &l->bat[i];
    }
    l->created = 1;
    l->seed = l->o.seed;
    stoke__loader_lock(l); /* (mu) for set_position; no other thread yet, the check runs */
    stoke__loader_set_position(l, l->o.epoch, 0);
    stoke__loader_unlock(l);
    stoke__log(STOKE_LOG_DEBUG,
               "loader: %s, %" PRIu64 " samples, %" PRIu64 " batches of %zu, %d workers, %d "
               "buffers of %zu bytes for %zu samples (%s)",
               ds->name, l->nsamples, l->nbatches, l->o.batch_size, l->nworkers, l->nbuf,
               l->buf_bytes, l->cap, l->pin_backend[0] ? l->pin_backend : "pageable");
    *out = l;
    return STOKE_OK;
}

void stoke_loader_interrupt(stoke_loader *l)
{
    if (l)
        atomic_store(&l->interrupted, 2);
}

/* A slot's buffer goes back where it came from (nothing for a process worker's: the shared
 * mapping goes whole, stoke__proc_destroy, which clears `mem` first). */
static void slot_free(stoke_loader *l, stoke__slot *s)
{
    if (l->alloc_kind == STOKE__ALLOC_ARENA)
        stoke_arena_free(l->arena, s->mem);
    else if (l->alloc_kind != STOKE__ALLOC_PAGEABLE)
        stoke_pinned_free(s->mem);
    else
        stoke__resident_free(s->mem, l->buf_bytes);
    s->mem = NULL;
}

/* (mu) A buffer nobody uses any more, on a stopped loader, once: a process worker's gives its
 * pages back (the shared mapping stays), any other goes back where it came from. */
static void slot_idle(stoke_loader *l, stoke__slot *s)
{
    if (s->idle)
        return;
    s->idle = 1;
    if (l->proc)
        stoke__proc_release_buffer(l, s);
    else if (s->mem)
        slot_free(l, s);
}

/* stoke_loader_stop, and each release after it: the buffers of the batches not held go at
 * once, so a loader stopped with one batch alive (a tensor kept after its Python loader went)
 * keeps that batch's buffer, not all of them.  Device mode: the device buffers of the batches
 * not held, and every staging buffer (a delivered batch's went back after its copy), once the
 * copies queued are done.  Each buffer once (a release frees its own).  Keeps the calling
 * thread's last error. */
void stoke__loader_free_idle(stoke_loader *l)
{
    stoke__saved_error saved;
    stoke__error_save(&saved);
    if (l->stream) { /* (a copy may still write a device buffer given back) */
        pthread_mutex_lock(&l->stream_mu);
        stoke_stream_synchronize(l->stream);
        pthread_mutex_unlock(&l->stream_mu);
    }
    stoke__loader_lock(l);
    stoke__loader_reclaim(l); /* (those released since: free too) */
    for (int k = l->idle_from; k < l->nfree; k++) {
        stoke_batch *b = l->free_v[k];
        if (l->o.device) {
            stoke_device_buffer_destroy(b->dbuf);
            b->dbuf = NULL;
        } else {
            slot_idle(l, b->host);
        }
    }
    l->idle_from = l->nfree;
    for (stoke__slot *s = l->free_s; s; s = s->next)
        slot_idle(l, s);
    for (stoke__slot *s = l->copy_head; s; s = s->next)
        slot_idle(l, s);
    stoke__loader_unlock(l);
    stoke__error_restore(&saved);
}

/* Abandons the run, joins the worker threads and ends the worker processes (not in a fork:
 * they are the creator's); the buffers stay. */
static void end_work(stoke_loader *l)
{
    if (l->created && !l->stopped) {
        stoke__loader_lock(l);
        stoke__loader_abandon(l);
        stoke__loader_unlock(l);
        stoke__proc_stopping(l);
        stoke__loader_stop_workers(l);
    }
    stoke__proc_end(l);
}

void stoke_loader_stop(stoke_loader *l)
{
    if (!l || stoke__loader_forked(l) || l->stopped)
        return;
    stoke__saved_error saved;
    stoke__error_save(&saved);
    end_work(l);
    /* a batch a worker finished after the abandon, before it was joined, is done: free too */
    stoke__loader_lock(l);
    stoke__loader_abandon(l);
    stoke__loader_unlock(l);
    atomic_store(&l->stopped, 1); /* (before the reclaim: a release sees one or the other) */
    stoke__loader_free_idle(l);   /* (saved's: it keeps the last error too) */
    stoke__error_restore(&saved);
}

int stoke__loader_stopped_fail(stoke_loader *l, const char *call)
{
    return stoke__loader_fail(l, STOKE_ECANCELED,
                              "%s: the loader over %s was stopped (stoke_loader_stop): its "
                              "workers are gone, only the batches still held remain",
                              call, l->ds.name);
}

/* Never changes the calling thread's last error: it runs on create's failure path, after the
 * message that says why.  In a process forked from the creator's, l's threads, worker
 * processes, accelerator objects, pinned and arena memory are the creator's (their state here
 * is a copy, locks maybe held): only this process's descriptors and plain memory go. */
void stoke_loader_destroy(stoke_loader *l)
{
    if (!l)
        return;
    stoke__saved_error saved;
    stoke__error_save(&saved);
    int forked = stoke__loader_forked(l);
    if (!forked)
        end_work(l);
    stoke__proc_destroy(l); /* before the buffers below: it unmaps the shared ones */
    if (l->stream && !forked)
        stoke_stream_synchronize(l->stream);
    for (int i = 0; l->bat && l->slots && i < l->nbuf; i++) { /* (allocated together) */
        stoke_batch *b = &l->bat[i];
        stoke__slot *s = &l->slots[i];
        if (b->indices != b->idx_inline)
            free(b->indices);
        free(b->rmeta);
        free(b->bad.v);
        if (forked) /* the device objects and the buffers are the creator's */
            continue;
        stoke_device_buffer_destroy(b->dbuf);
        stoke_event_destroy(b->ev);
        slot_free(l, s);
        stoke_event_destroy(s->ev);
    }
    if (!forked) {
        stoke_arena_close(l->arena);
        stoke_event_destroy(l->read_ev);
        stoke_stream_destroy(l->stream);
    }
    stoke_sampler_destroy(l->sampler);
    for (int i = 0; l->w && i <= l->nw1; i++) {
        stoke__ahead *a = i < l->nw1 ? &l->w[i].p.ahead : &l->caller.ahead;
        free(a->dst);
        free(a->len);
    }
    free(l->fields); /* (with off, step, rix and rg) */
    free(l->bat);
    free(l->slots);
    free(l->w);
    free(l->bits);
    free(l->free_v);
    free(l->ready);
    free(l->quar);
    if (!forked) {
        pthread_cond_destroy(&l->work_cv);
        pthread_cond_destroy(&l->done_cv);
        pthread_mutex_destroy(&l->mu);
        pthread_mutex_destroy(&l->stream_mu);
    }
    free(l);
    stoke__error_restore(&saved);
}
