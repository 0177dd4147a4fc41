/* The read-ahead of the cache of remote files (cache_internal.h; cache.h, set_order): the
 * downloads of the files after the one a read waits for, queued for background threads, each
 * with its own slot of the pool (STOKE__REMOTE_BG(k)), which fetch them into the cache through
 * cache.c's stoke__cache_acquire (never waiting for another process's download, never
 * evicting).  Locking: c->d.lock guards the queue, the running jobs and the order. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "common/internal.h"
#include "sources/cache_internal.h"

typedef struct dl_arg {
    stoke__cache *c;
    int k; /* the thread's index: its slot of the pool is STOKE__REMOTE_BG(k) */
} dl_arg;

static int queued(const stoke__cache_downloader *d, const stoke__remote_file *f)
{
    for (size_t i = 0; i < d->len; i++)
        if (d->q[(d->head + i) % STOKE__CACHE_QUEUE_MAX].f == f)
            return 1;
    for (int k = 0; k < d->nth; k++)
        if (d->run[k].f == f)
            return 1;
    return 0;
}

static void *dl_main(void *arg)
{
    stoke__cache *c = ((dl_arg *)arg)->c;
    int k = ((dl_arg *)arg)->k;
    free(arg);
    stoke__cache_downloader *d = &c->d;
    pthread_mutex_lock(&d->lock);
    for (;;) {
        while (!d->stop && (d->len == 0 || d->paused))
            pthread_cond_wait(&d->work, &d->lock);
        if (d->stop)
            break;
        stoke__cache_job j = d->q[d->head];
        d->head = (d->head + 1) % STOKE__CACHE_QUEUE_MAX;
        d->len--;
        d->run[k] = j;
        d->running++;
        stoke__remote_pool *p = d->p;
        pthread_mutex_unlock(&d->lock);
        char why[512] = "";
        int fd;
        uint64_t size;
        int rc = stoke__cache_acquire(c, p, STOKE__REMOTE_BG(k), j.f, j.expect, &fd, &size, why,
                                      sizeof(why));
        if (rc == STOKE_OK)
            close(fd);              /* in the cache now: the reads open it */
        else if (rc != STOKE_EBUSY) /* the read that needs it tries again and reports */
            stoke__log(STOKE_LOG_DEBUG, "cache %s: read-ahead of %s: %s", c->dir, j.f->url, why);
        pthread_mutex_lock(&d->lock);
        d->run[k].f = NULL;
        d->running--;
        pthread_cond_broadcast(&d->idle);
    }
    pthread_mutex_unlock(&d->lock);
    return NULL;
}

/* Whether this process is a fork the hooks did not see, of one whose threads had started: its
 * stoke__cache_downloader's threads are not here, and its lock may have been held at the fork. */
static int foreign(const stoke__cache_downloader *d)
{
    return __atomic_load_n(&d->nth, __ATOMIC_RELAXED) > 0 &&
           __atomic_load_n(&d->pid, __ATOMIC_RELAXED) != getpid();
}

/* Starts the threads missing (d->lock held): at least one, else the jobs wait for the reads. */
static void dl_start(stoke__cache *c)
{
    stoke__cache_downloader *d = &c->d;
    __atomic_store_n(&d->pid, getpid(), __ATOMIC_RELAXED);
    while (d->nth < c->connections) {
        dl_arg *a = malloc(sizeof(*a));
        if (!a)
            break;
        *a = (dl_arg){c, d->nth};
        d->run[d->nth].f = NULL;
        if (pthread_create(&d->th[d->nth], NULL, dl_main, a) != 0) {
            free(a);
            break;
        }
        __atomic_store_n(&d->nth, d->nth + 1, __ATOMIC_RELAXED); /* foreign() reads it unlocked */
    }
}

size_t stoke__cache_prefetch(stoke__cache *c, stoke__remote_pool *p,
                             const stoke__remote_file *const *f, const uint64_t *expect, size_t n)
{
    if (!c || c->connections == 0 || foreign(&c->d))
        return 0;
    if (n > (size_t)c->connections)
        n = (size_t)c->connections;
    stoke__cache_downloader *d = &c->d;
    size_t added = 0;
    pthread_mutex_lock(&d->lock);
    d->p = p;
    for (size_t i = 0; i < n && d->len < STOKE__CACHE_QUEUE_MAX; i++) {
        if (!f[i] || queued(d, f[i]))
            continue;
        d->q[(d->head + d->len) % STOKE__CACHE_QUEUE_MAX] =
            (stoke__cache_job){f[i], expect ? expect[i] : 0};
        d->len++;
        added++;
    }
    if (added) {
        dl_start(c);
        pthread_cond_broadcast(&d->work);
    }
    pthread_mutex_unlock(&d->lock);
    return added;
}

int stoke__cache_set_order(stoke__cache *c, const stoke__remote_file *const *f,
                           const uint64_t *expect, size_t n)
{
    if (!c)
        return STOKE_OK;
    const stoke__remote_file **nf = n ? malloc(n * sizeof(*nf)) : NULL;
    uint64_t *ne = n ? calloc(n, sizeof(*ne)) : NULL;
    if (n && (!nf || !ne)) {
        free(nf);
        free(ne);
        return STOKE_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        nf[i] = f[i];
        ne[i] = expect ? expect[i] : 0;
    }
    pthread_mutex_lock(&c->d.lock);
    free(c->d.order);
    free(c->d.order_expect);
    c->d.order = nf;
    c->d.order_expect = ne;
    c->d.norder = n;
    pthread_mutex_unlock(&c->d.lock);
    return STOKE_OK;
}

void stoke__cache_ahead(stoke__cache *c, stoke__remote_pool *p, const stoke__remote_file *f)
{
    stoke__cache_downloader *d = &c->d;
    const stoke__remote_file *next[STOKE__REMOTE_BG_MAX];
    uint64_t exp[STOKE__REMOTE_BG_MAX];
    size_t k = 0;
    pthread_mutex_lock(&d->lock);
    for (size_t i = 0; i < d->norder; i++) {
        if (d->order[i] != f)
            continue;
        for (size_t j = i + 1; j < d->norder && k < (size_t)c->connections; j++, k++) {
            next[k] = d->order[j];
            exp[k] = d->order_expect[j];
        }
        break;
    }
    pthread_mutex_unlock(&d->lock);
    if (k)
        stoke__cache_prefetch(c, p, next, exp, k);
}

void stoke__cache_ahead_init(stoke__cache *c)
{
    pthread_mutex_init(&c->d.lock, NULL);
    pthread_cond_init(&c->d.work, NULL);
    pthread_cond_init(&c->d.idle, NULL);
    c->d.ready = 1;
}

void stoke__cache_ahead_destroy(stoke__cache *c)
{
    if (c->d.ready && !foreign(&c->d)) { /* the downloads running end; the queued are dropped */
        pthread_mutex_lock(&c->d.lock);
        __atomic_store_n(&c->d.stop, 1, __ATOMIC_RELAXED);
        c->d.len = 0;
        pthread_cond_broadcast(&c->d.work);
        pthread_mutex_unlock(&c->d.lock);
        for (int k = 0; k < c->d.nth; k++)
            pthread_join(c->d.th[k], NULL);
        pthread_mutex_destroy(&c->d.lock);
        pthread_cond_destroy(&c->d.work);
        pthread_cond_destroy(&c->d.idle);
    }
    free(c->d.order);
    free(c->d.order_expect);
}

void stoke__cache_ahead_fork_prepare(stoke__cache *c)
{
    /* no download half done in the child: its lock file and temporary copy would stay the
     * child's too (an fd shared with it keeps the flock) */
    pthread_mutex_lock(&c->d.lock);
    c->d.paused = 1; /* the running end, the queued wait for the parent's hook */
    while (c->d.running)
        pthread_cond_wait(&c->d.idle, &c->d.lock);
}

void stoke__cache_ahead_fork_parent(stoke__cache *c)
{
    c->d.paused = 0;
    pthread_cond_broadcast(&c->d.work);
    pthread_mutex_unlock(&c->d.lock);
}

void stoke__cache_ahead_fork_child(stoke__cache *c)
{
    /* no thread crossed the fork; the parent's queue stays the parent's */
    stoke__cache_downloader *d = &c->d;
    /* and none starts here: a worker process ends with _exit, which would cut a download
     * short (a request made, not counted, its .part left for a later scan) */
    c->connections = 0;
    d->nth = d->running = d->paused = 0;
    d->head = d->len = 0;
    pthread_cond_init(&d->work, NULL);
    pthread_cond_init(&d->idle, NULL);
    pthread_mutex_unlock(&d->lock);
}
