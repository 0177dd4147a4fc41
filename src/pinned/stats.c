/* Statistics of the pinned allocator: the versioned struct and its JSON form. */
#include <stdio.h>
#include <string.h>

#include "common/internal.h"
#include "pinned/pinned_internal.h"
#include "registry/registry.h"

/* Every uint64_t member of stoke_pinned_stats, in order: the JSON printer walks this list. */
#define STATS_U64(X)                                                                               \
    X(limit_bytes)                                                                                 \
    X(limit_policy) X(bytes_in_use) X(count_in_use) X(peak_bytes_in_use) X(bytes_reserved)         \
        X(count_reserved) X(peak_bytes_reserved) X(bytes_cached) X(count_cached) X(bytes_waiting)  \
            X(count_waiting) X(total_allocs) X(total_frees) X(bytes_requested) X(cache_hits)       \
                X(cache_misses) X(pin_calls) X(pin_ns) X(pin_failures) X(unpin_calls) X(unpin_ns)  \
                    X(standin_allocs) X(pageable_fallbacks) X(pageable_fallback_bytes)             \
                        X(limit_failures) X(limit_releases) X(events_recorded) X(events_created)   \
                            X(registered_count) X(registered_bytes) X(register_failures)

#define COUNT_ONE(name) +1
_Static_assert(sizeof(stoke_pinned_stats) == offsetof(stoke_pinned_stats, limit_bytes) +
                                                 (0 STATS_U64(COUNT_ONE)) * sizeof(uint64_t),
               "STATS_U64 must list every uint64_t member of stoke_pinned_stats");

static uint64_t clamp0(int64_t v)
{
    return v > 0 ? (uint64_t)v : 0;
}

static void collect(stoke_pinned_stats *s)
{
    memset(s, 0, sizeof(*s));
    s->size = sizeof(*s);
    s->version = STOKE_PINNED_STATS_VERSION;
    stoke__pn_ensure_init();
    const stoke_backend *vt;
    int dev;
    const char *name = "none";
    if (stoke__accel_current(&vt, &dev, NULL) == STOKE_OK && vt && !stoke__pinned.disabled)
        name = vt->name;
    stoke__strlcpy(s->backend, name, sizeof(s->backend));
    pn_counters c;
    uint64_t tc_bytes, tc_count;
    stoke__pn_sum(&c, &tc_bytes, &tc_count);
    s->limit_bytes = atomic_load(&stoke__pinned.limit);
    s->limit_policy = (uint64_t)atomic_load(&stoke__pinned.policy);
    s->bytes_in_use = clamp0(c.bytes_in_use);
    s->count_in_use = clamp0(c.count_in_use);
    uint64_t peak = PN_GET(peak_bytes_in_use);
    while (s->bytes_in_use > peak && !atomic_compare_exchange_weak(&stoke__pinned.peak_bytes_in_use,
                                                                   &peak, s->bytes_in_use)) {
    }
    s->peak_bytes_in_use = s->bytes_in_use > peak ? s->bytes_in_use : peak;
    s->bytes_reserved = PN_GET(bytes_reserved);
    s->count_reserved = PN_GET(count_reserved);
    s->peak_bytes_reserved = PN_GET(peak_bytes_reserved);
    s->bytes_cached = PN_GET(bins_bytes) + tc_bytes;
    s->count_cached = PN_GET(bins_count) + tc_count;
    s->bytes_waiting = PN_GET(bytes_waiting);
    s->count_waiting = PN_GET(count_waiting);
    s->total_allocs = c.allocs;
    s->total_frees = c.frees;
    s->bytes_requested = c.bytes_requested;
    s->cache_hits = c.hits;
    s->cache_misses = c.misses;
    s->pin_calls = PN_GET(pin_calls);
    s->pin_ns = PN_GET(pin_ns);
    s->pin_failures = PN_GET(pin_failures);
    s->unpin_calls = PN_GET(unpin_calls);
    s->unpin_ns = PN_GET(unpin_ns);
    s->standin_allocs = PN_GET(standin_allocs);
    s->pageable_fallbacks = PN_GET(pageable_fallbacks);
    s->pageable_fallback_bytes = PN_GET(pageable_fallback_bytes);
    s->limit_failures = PN_GET(limit_failures);
    s->limit_releases = PN_GET(limit_releases);
    s->events_recorded = PN_GET(events_recorded);
    s->events_created = PN_GET(events_created);
    s->registered_count = PN_GET(registered_count);
    s->registered_bytes = PN_GET(registered_bytes);
    s->register_failures = PN_GET(register_failures);
}

int stoke_pinned_stats_get(stoke_pinned_stats *out)
{
    if (!out || out->size < offsetof(stoke_pinned_stats, backend))
        return stoke__fail(STOKE_EINVAL, "stoke_pinned_stats_get: NULL or size not set");
    stoke_pinned_stats s;
    collect(&s);
    size_t n = out->size < sizeof(s) ? out->size : sizeof(s);
    /* the version whose members all fit: a caller built against version 1 is told 1 */
    if (n < offsetof(stoke_pinned_stats, register_failures) + sizeof(uint64_t))
        s.version = 1;
    memcpy(out, &s, n);
    out->size = (uint32_t)n;
    return STOKE_OK;
}

int stoke_pinned_stats_json(char *buf, size_t len, size_t *needed)
{
    if (!buf && len)
        return stoke__fail(STOKE_EINVAL, "stoke_pinned_stats_json: NULL buffer");
    stoke_pinned_stats s;
    collect(&s);
    char tmp[2048];
    size_t n = 0;
    n += (size_t)snprintf(tmp + n, sizeof(tmp) - n, "{\"version\":%u,\"backend\":\"%s\"", s.version,
                          s.backend);
#define PRINT_ONE(name)                                                                            \
    if (n < sizeof(tmp))                                                                           \
        n += (size_t)snprintf(tmp + n, sizeof(tmp) - n, ",\"" #name "\":%llu",                     \
                              (unsigned long long)s.name);
    STATS_U64(PRINT_ONE)
#undef PRINT_ONE
    if (n < sizeof(tmp))
        n += (size_t)snprintf(tmp + n, sizeof(tmp) - n, "}");
    if (n >= sizeof(tmp))
        return stoke__fail(STOKE_ERANGE, "stoke_pinned_stats_json: internal buffer too small");
    if (needed)
        *needed = n;
    if (len) {
        size_t c = n < len - 1 ? n : len - 1;
        memcpy(buf, tmp, c);
        buf[c] = '\0';
    }
    if (n >= len)
        return stoke__fail(STOKE_ERANGE, "stoke_pinned_stats_json: %zu bytes needed", n + 1);
    return STOKE_OK;
}
