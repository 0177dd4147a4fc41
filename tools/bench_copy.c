/* stoke bench copy — host<->device copy bandwidth on the current accelerator, from pinned
 * (stoke_pinned_alloc) and from pageable (malloc) host memory, for sizes 64 KiB ... 64 MiB.
 *
 * Each figure is the best of three batches; a batch queues `reps` copies back to back on one
 * stream and waits on an event recorded after them, so queueing overlaps the copies as a loader
 * would.  GB/s are 10^9 bytes per second.  Public API only. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "stoke/stoke.h"

#define KiB ((size_t)1024)
#define MiB (KiB * 1024)
#define BATCHES 3

static const size_t sizes[] = {64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

enum { H2D_PINNED, H2D_PAGEABLE, D2H_PINNED, D2H_PAGEABLE, NMODES };
static const char *const mode_key[NMODES] = {"h2d_pinned_gbps", "h2d_pageable_gbps",
                                             "d2h_pinned_gbps", "d2h_pageable_gbps"};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct bench {
    const cli_cmd *cmd;
    stoke_stream *s;
    stoke_event *ev;
    stoke_device_buffer *dev;
    unsigned char *pinned, *pageable;
    size_t budget; /* bytes per batch */
} bench;

/* One batch of `reps` copies of `n` bytes in `mode`; returns seconds or -1 on error. */
static double batch(bench *b, int mode, size_t n, int reps)
{
    unsigned char *host = (mode == H2D_PINNED || mode == D2H_PINNED) ? b->pinned : b->pageable;
    int h2d = mode == H2D_PINNED || mode == H2D_PAGEABLE;
    double t0 = now_s();
    for (int i = 0; i < reps; i++) {
        int rc = h2d ? stoke_copy_h2d_async(b->dev, 0, host, n, b->s)
                     : stoke_copy_d2h_async(host, b->dev, 0, n, b->s);
        if (rc != STOKE_OK) {
            cli_fail_rc(b->cmd, 1, h2d ? "host-to-device copy" : "device-to-host copy", rc);
            return -1;
        }
    }
    int rc = stoke_event_record(b->ev, b->s);
    if (rc == STOKE_OK)
        rc = stoke_event_synchronize(b->ev);
    if (rc != STOKE_OK) {
        cli_fail_rc(b->cmd, 1, "waiting for the copies", rc);
        return -1;
    }
    return now_s() - t0;
}

static double measure(bench *b, int mode, size_t n)
{
    size_t r = b->budget / n;
    int reps = r < 3 ? 3 : r > 500 ? 500 : (int)r;
    if (batch(b, mode, n, 1) < 0) /* warm-up */
        return -1;
    double best = 0;
    for (int k = 0; k < BATCHES; k++) {
        double t = batch(b, mode, n, reps);
        if (t < 0)
            return -1;
        double gbps = t > 0 ? (double)n * reps / t / 1e9 : 0;
        if (gbps > best)
            best = gbps;
    }
    return best;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: stoke bench copy [--json] [--quick]\n"
               "  host->device and device->host bandwidth from pinned and pageable memory on the\n"
               "  current accelerator (STOKE_ACCELERATOR=name[:index] to choose), 64 KiB..64 MiB\n"
               "  --quick  fewer repetitions (a smoke test, not a measurement)\n");
}

int bench_copy(int argc, char **argv)
{
    cli_cmd c = {"bench copy", cli_has_json(argc, argv)};
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (cli_is(argv[i], "--json"))
            continue;
        if (cli_is(argv[i], "--quick")) {
            quick = 1;
        } else if (cli_is(argv[i], "--help") || cli_is(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            if (!c.json)
                usage(stderr);
            return cli_fail(&c, 2, "unknown option '%s'", argv[i]);
        }
    }
    stoke_accelerator_info ai;
    int rc = stoke_accelerator_get(&ai);
    if (rc != STOKE_OK)
        return cli_fail(&c, 1, "needs an accelerator: %s",
                        ai.reason[0] ? ai.reason : stoke_last_error());
    stoke_device_props props = {.size = sizeof(props)};
    stoke_device_get_props(NULL, ai.current_device, &props);

    size_t max = sizes[NSIZES - 1];
    bench b = {.cmd = &c, .budget = quick ? 4 * MiB : 256 * MiB};
    int status = 1;
    if ((rc = stoke_stream_create(NULL, &b.s)) != STOKE_OK) {
        cli_fail_rc(&c, 1, "creating a stream", rc);
        goto out;
    }
    if ((rc = stoke_event_create(b.s, &b.ev)) != STOKE_OK) {
        cli_fail_rc(&c, 1, "creating an event", rc);
        goto out;
    }
    if ((rc = stoke_device_buffer_create(b.s, max, &b.dev)) != STOKE_OK) {
        cli_fail_rc(&c, 1, "allocating device memory", rc);
        goto out;
    }
    if ((rc = stoke_pinned_alloc(max, (void **)&b.pinned)) != STOKE_OK) {
        cli_fail_rc(&c, 1, "allocating pinned memory", rc);
        goto out;
    }
    b.pageable = malloc(max);
    if (!b.pageable) {
        cli_fail(&c, 1, "out of memory for %zu bytes of pageable memory", max);
        goto out;
    }
    memset(b.pinned, 1, max); /* fault every page in before timing */
    memset(b.pageable, 2, max);
    int really_pinned = stoke_is_pinned(b.pinned);

    double gbps[NSIZES][NMODES];
    for (size_t i = 0; i < NSIZES; i++)
        for (int m = 0; m < NMODES; m++)
            if ((gbps[i][m] = measure(&b, m, sizes[i])) < 0)
                goto out;

    if (c.json) {
        printf("{\"bench\": \"copy\", \"backend\": ");
        cli_json_str(stdout, ai.backend);
        printf(", \"device\": %d, \"device_name\": ", ai.current_device);
        cli_json_str(stdout, props.name);
        printf(", \"pinned_is_pinned\": %s, \"batches\": %d, \"results\": [",
               really_pinned ? "true" : "false", BATCHES);
        for (size_t i = 0; i < NSIZES; i++) {
            printf("%s{\"size\": %zu", i ? ", " : "", sizes[i]);
            for (int m = 0; m < NMODES; m++)
                printf(", \"%s\": %.3f", mode_key[m], gbps[i][m]);
            printf("}");
        }
        printf("]}\n");
    } else {
        printf("copy bandwidth on %s device %d (%s), GB/s, best of %d batches%s\n", ai.backend,
               ai.current_device, props.name, BATCHES,
               really_pinned ? "" : " -- NOTE: pinned memory is not pinned here");
        printf("%10s  %12s %12s  %12s %12s\n", "size", "h2d pinned", "h2d pageable",
               "d2h pinned", "d2h pageable");
        for (size_t i = 0; i < NSIZES; i++) {
            char sz[32];
            if (sizes[i] >= MiB)
                snprintf(sz, sizeof(sz), "%zu MiB", sizes[i] / MiB);
            else
                snprintf(sz, sizeof(sz), "%zu KiB", sizes[i] / KiB);
            printf("%10s  %12.2f %12.2f  %12.2f %12.2f\n", sz, gbps[i][H2D_PINNED],
                   gbps[i][H2D_PAGEABLE], gbps[i][D2H_PINNED], gbps[i][D2H_PAGEABLE]);
        }
    }
    status = 0;
out:
    stoke_device_buffer_destroy(b.dev);
    stoke_event_destroy(b.ev);
    stoke_stream_destroy(b.s);
    if (b.pinned)
        stoke_pinned_free(b.pinned);
    free(b.pageable);
    return status;
}
