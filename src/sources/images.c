/* The images: source: a torchvision ImageFolder tree of JPEGs (root/<class>/.../<file>.jpg).
 *
 * Open walks the tree once: class directories sorted by name (byte order) give the labels
 * 0..C-1; within a class the files (.jpg/.jpeg, any case, in subdirectories too) sorted by
 * their path relative to the class directory give the canonical order; the paths are packed
 * into one arena.  get(i) reads file i with pread() into a per-worker buffer (reused, grown to
 * the largest file; slot worker % IMAGES_SLOTS, each under its own mutex, so two loaders that
 * share a dataset only serialise) and decodes it straight into the sample's slot
 * (image_jpeg.c).  set_epoch() records the epoch that train augmentation draws from. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/internal.h"
#include "sources/image.h"
#include "sources/regular.h"
#include "stoke/sources.h"

#define IMAGES_SLOTS     64
#define IMAGES_DEPTH_MAX 32 /* directory nesting below a class */

typedef struct images_slot {
    pthread_mutex_t mu; /* guards buf/cap: held for a whole read + decode */
    unsigned char *buf;
    size_t cap;
} images_slot;

typedef struct images_ds {
    char *root;
    int dirfd;
    stoke__image_opts img;
    uint64_t n;      /* files */
    char *arena;     /* relative paths, NUL-terminated */
    size_t *off;     /* file i's path at arena + off[i] */
    uint32_t *label; /* file i's class */
    uint32_t nclasses;
    char **classes;
    _Atomic uint64_t epoch;
    images_slot slots[IMAGES_SLOTS];
    stoke_field fields[2]; /* data, label */
    int64_t shape[3];
} images_ds;

/* ---- the walk ---- */

typedef struct strvec {
    char **v;
    size_t n, cap;
} strvec;

static int strvec_push(strvec *s, char *p)
{
    if (!p)
        return -1;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 64;
        char **v = realloc(s->v, cap * sizeof(*v));
        if (!v) {
            free(p);
            return -1;
        }
        s->v = v, s->cap = cap;
    }
    s->v[s->n++] = p;
    return 0;
}

static void strvec_free(strvec *s, size_t from)
{
    for (size_t i = from; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof(*s));
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A name ending in .jpg or .jpeg, in any case: ".jpg" itself too, as torchvision's
 * ImageFolder (has_file_allowed_extension) takes it. */
static int is_jpeg_name(const char *name)
{
    size_t n = strlen(name);
    return (n >= 4 && strcasecmp(name + n - 4, ".jpg") == 0) ||
           (n >= 5 && strcasecmp(name + n - 5, ".jpeg") == 0);
}

static int is_other_image_name(const char *name)
{
    static const char *const ext[] = {".png", ".gif",  ".bmp", ".webp",
                                      ".tif", ".tiff", ".ppm", ".pgm"};
    const char *dot = strrchr(name, '.');
    for (size_t k = 0; dot && k < STOKE__ARRAY_LEN(ext); k++)
        if (strcasecmp(dot, ext[k]) == 0)
            return 1;
    return 0;
}

static char *join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *p = malloc(la + lb + 2);
    if (p) {
        memcpy(p, a, la);
        p[la] = '/';
        memcpy(p + la + 1, b, lb + 1);
    }
    return p;
}

/* Kind of `rel` (relative to dirfd), following symlinks: 1 directory, 2 regular file, 0 other
 * or unreadable. */
static int kind_at(int dirfd, const char *rel)
{
    struct stat st;
    if (fstatat(dirfd, rel, &st, 0) != 0)
        return 0;
    return S_ISDIR(st.st_mode) ? 1 : S_ISREG(st.st_mode) ? 2 : 0;
}

typedef struct walk {
    images_ds *s;
    strvec files; /* paths relative to root */
    uint64_t other_images;
    struct {
        dev_t dev;
        ino_t ino;
        const char *rel;
    } up[IMAGES_DEPTH_MAX + 1]; /* the directories walk_dir is in, the class's first */
} walk;

/* Adds the JPEGs under `rel` (a directory relative to root) to w->files, unsorted. */
static int walk_dir(walk *w, const char *rel, int depth)
{
    if (depth > IMAGES_DEPTH_MAX)
        return stoke__fail(STOKE_ELIMIT,
                           "images %s: %s: directories nested deeper than %d "
                           "(a symlink loop?)",
                           w->s->root, rel, IMAGES_DEPTH_MAX);
    int fd = openat(w->s->dirfd, rel, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return stoke__fail(STOKE_EIO, "images %s: cannot open directory %s: %s", w->s->root, rel,
                           strerror(e));
    }
    /* a directory that is its own ancestor (a link to "." or above it): said at once, naming
     * both, not after IMAGES_DEPTH_MAX turns of the loop */
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        closedir(d);
        return stoke__fail(STOKE_EIO, "images %s: cannot stat directory %s: %s", w->s->root, rel,
                           strerror(e));
    }
    for (int i = 0; i < depth; i++)
        if (w->up[i].dev == st.st_dev && w->up[i].ino == st.st_ino) {
            closedir(d);
            return stoke__fail(STOKE_ELIMIT,
                               "images %s: %s is %s again: a symlink loop (a link to a "
                               "directory above it)",
                               w->s->root, rel, w->up[i].rel);
        }
    w->up[depth].dev = st.st_dev, w->up[depth].ino = st.st_ino, w->up[depth].rel = rel;
    int rc = STOKE_OK;
    struct dirent *de;
    while (rc == STOKE_OK && (de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        char *p = join(rel, de->d_name);
        if (!p) {
            rc = stoke__fail(STOKE_ENOMEM, "images %s: out of memory", w->s->root);
            break;
        }
        int k = kind_at(w->s->dirfd, p);
        if (k == 1) {
            rc = walk_dir(w, p, depth + 1);
            free(p);
        } else if (k == 2 && is_jpeg_name(de->d_name)) {
            if (strvec_push(&w->files, p) != 0)
                rc = stoke__fail(STOKE_ENOMEM, "images %s: out of memory", w->s->root);
        } else {
            w->other_images += k == 2 && is_other_image_name(de->d_name);
            free(p);
        }
    }
    closedir(d);
    return rc;
}

/* The class directories of root, sorted, into s->classes. */
static int find_classes(images_ds *s)
{
    DIR *d = NULL;
    int fd = dup(s->dirfd);
    if (fd >= 0 && (d = fdopendir(fd)) == NULL)
        close(fd);
    if (!d)
        return stoke__fail(STOKE_EIO, "images %s: cannot list the directory: %s", s->root,
                           strerror(errno));
    rewinddir(d);
    strvec cls = {0};
    int rc = STOKE_OK;
    struct dirent *de;
    while (rc == STOKE_OK && (de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
            kind_at(s->dirfd, de->d_name) != 1)
            continue;
        if (strvec_push(&cls, strdup(de->d_name)) != 0)
            rc = stoke__fail(STOKE_ENOMEM, "images %s: out of memory", s->root);
    }
    closedir(d);
    if (rc == STOKE_OK && cls.n == 0)
        rc = stoke__fail(STOKE_ENOENT,
                         "images %s: no class directories (expected the ImageFolder layout "
                         "DIR/<class>/<image>.jpg)",
                         s->root);
    if (rc == STOKE_OK && cls.n > UINT32_MAX)
        rc = stoke__fail(STOKE_ELIMIT, "images %s: too many classes", s->root);
    if (rc != STOKE_OK) {
        strvec_free(&cls, 0);
        return rc;
    }
    qsort(cls.v, cls.n, sizeof(char *), cmp_str);
    s->classes = cls.v;
    s->nclasses = (uint32_t)cls.n;
    return STOKE_OK;
}

/* Packs w->files (sorted per class) into the arena; class c's files are w->files[first[c] ..
 * first[c + 1]). */
static int pack(images_ds *s, walk *w, const size_t *first)
{
    size_t total = 0;
    for (size_t i = 0; i < w->files.n; i++)
        total += strlen(w->files.v[i]) + 1;
    s->arena = malloc(total ? total : 1);
    s->off = malloc(w->files.n * sizeof(size_t));
    s->label = malloc(w->files.n * sizeof(uint32_t));
    if (!s->arena || !s->off || !s->label)
        return stoke__fail(STOKE_ENOMEM, "images %s: out of memory (%zu files)", s->root,
                           w->files.n);
    size_t at = 0;
    for (uint32_t c = 0; c < s->nclasses; c++)
        for (size_t i = first[c]; i < first[c + 1]; i++) {
            size_t len = strlen(w->files.v[i]) + 1;
            memcpy(s->arena + at, w->files.v[i], len);
            s->off[i] = at;
            s->label[i] = c;
            at += len;
        }
    s->n = w->files.n;
    return STOKE_OK;
}

static int scan(images_ds *s)
{
    int rc = find_classes(s);
    if (rc)
        return rc;
    walk w = {.s = s};
    size_t *first = malloc(((size_t)s->nclasses + 1) * sizeof(size_t));
    if (!first)
        return stoke__fail(STOKE_ENOMEM, "images %s: out of memory", s->root);
    for (uint32_t c = 0; c < s->nclasses && rc == STOKE_OK; c++) {
        first[c] = w.files.n;
        rc = walk_dir(&w, s->classes[c], 0);
        if (rc == STOKE_OK && w.files.n == first[c])
            rc = stoke__fail(STOKE_ENOENT,
                             "images %s: class directory '%s' has no .jpg/.jpeg files%s", s->root,
                             s->classes[c],
                             w.other_images ? " (other image formats are not decoded: only "
                                              "JPEG)"
                                            : "");
        if (rc == STOKE_OK) /* the class's files in byte order of their paths */
            qsort(w.files.v + first[c], w.files.n - first[c], sizeof(char *), cmp_str);
    }
    first[s->nclasses] = w.files.n;
    if (rc == STOKE_OK)
        rc = pack(s, &w, first);
    if (rc == STOKE_OK && w.other_images)
        stoke__log(STOKE_LOG_WARN,
                   "images %s: %" PRIu64 " files with other image extensions (.png, ...) "
                   "ignored: only JPEG is decoded",
                   s->root, w.other_images);
    free(first);
    strvec_free(&w.files, 0);
    return rc;
}

/* ---- samples ---- */

static uint64_t images_length(void *user)
{
    return ((const images_ds *)user)->n;
}

static int images_set_epoch(void *user, uint64_t epoch)
{
    atomic_store_explicit(&((images_ds *)user)->epoch, epoch, memory_order_relaxed);
    return STOKE_OK;
}

/* Reads file i into the slot's buffer: STOKE_OK with *len, or an error with why.  The file is
 * opened as every data file is (regular.h): a path replaced by a FIFO since the scan fails the
 * sample at once instead of blocking the worker in open(). */
static int read_file(const images_ds *s, uint64_t i, images_slot *sl, size_t *len, char *why,
                     size_t why_len)
{
    struct stat st;
    *len = 0;
    int fd = stoke__open_regular(s->dirfd, s->arena + s->off[i], &st, why, why_len);
    if (fd < 0)
        return fd;
    int rc = STOKE_OK;
    if ((uint64_t)st.st_size > STOKE__IMAGE_FILE_MAX) {
        stoke__fmt(why, why_len, "file of %lld bytes is larger than the limit (%zu)",
                   (long long)st.st_size, STOKE__IMAGE_FILE_MAX);
        rc = STOKE_ELIMIT;
    } else if ((size_t)st.st_size > sl->cap) {
        unsigned char *b = realloc(sl->buf, (size_t)st.st_size);
        if (!b) {
            stoke__fmt(why, why_len, "out of memory");
            rc = STOKE_ENOMEM;
        } else {
            sl->buf = b, sl->cap = (size_t)st.st_size;
        }
    }
    size_t got = 0, want = rc ? 0 : (size_t)st.st_size;
    while (got < want) {
        ssize_t r = pread(fd, sl->buf + got, want - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            stoke__fmt(why, why_len, "read failed: %s", strerror(errno));
            rc = STOKE_EIO;
            break;
        }
        if (r == 0)
            break; /* shrank since fstat: decode what there is (a truncated JPEG errs) */
        got += (size_t)r;
    }
    close(fd);
    *len = got;
    return rc;
}

static int images_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                      char *msg, size_t msg_len)
{
    images_ds *s = user;
    (void)lens;
    if (index >= s->n) {
        stoke__fmt(msg, msg_len, "images %s: index %" PRIu64 " out of range (length %" PRIu64 ")",
                   s->root, index, s->n);
        return STOKE_ERANGE;
    }
    if (dst[1]) {
        int64_t label = s->label[index];
        memcpy(dst[1], &label, sizeof(label));
    }
    if (!dst[0])
        return STOKE_OK;
    images_slot *sl = &s->slots[(unsigned)worker % IMAGES_SLOTS];
    char why[256];
    size_t len = 0;
    pthread_mutex_lock(&sl->mu);
    int rc = read_file(s, index, sl, &len, why, sizeof(why));
    if (rc == STOKE_OK) {
        uint64_t epoch = atomic_load_explicit(&s->epoch, memory_order_relaxed);
        rc = stoke__image_decode(&s->img, sl->buf, len, epoch, index, dst[0], why, sizeof(why));
    }
    pthread_mutex_unlock(&sl->mu);
    if (rc != STOKE_OK) {
        char full[1024];
        stoke__fmt(full, sizeof(full), "%s/%s: %s", s->root, s->arena + s->off[index], why);
        stoke__shorten(msg, msg_len, full);
    }
    return rc;
}

static void images_close(void *user)
{
    images_ds *s = user;
    if (!s)
        return;
    for (int k = 0; k < IMAGES_SLOTS; k++) {
        pthread_mutex_destroy(&s->slots[k].mu);
        free(s->slots[k].buf);
    }
    for (uint32_t c = 0; c < s->nclasses; c++)
        free(s->classes[c]);
    free(s->classes);
    free(s->arena);
    free(s->off);
    free(s->label);
    if (s->dirfd >= 0)
        close(s->dirfd);
    free(s->root);
    free(s);
}

/* ---- public ---- */

void stoke_images_opts_init(stoke_images_opts *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof(*opts));
    opts->size = (uint32_t)sizeof(*opts);
    stoke__image_opts init;
    stoke__image_opts_init(&init);
    opts->image_size = init.size;
    opts->train = init.train;
    opts->layout = STOKE_IMAGES_CHW;
    opts->dtype = init.dtype;
    for (int c = 0; c < 3; c++)
        opts->std[c] = 1.0f;
    opts->max_decode_bytes = init.max_decode;
}

static int to_image_opts(const stoke_images_opts *o, stoke__image_opts *img)
{
    stoke__image_opts_init(img);
    if (o->layout != STOKE_IMAGES_CHW && o->layout != STOKE_IMAGES_HWC)
        return stoke__fail(STOKE_EINVAL, "images: unknown layout %d", o->layout);
    for (int c = 0; c < 3 && o->normalize; c++)
        if (!(o->std[c] > 0))
            return stoke__fail(STOKE_EINVAL, "images: std[%d] must be > 0", c);
    img->size = o->image_size;
    img->train = o->train != 0;
    img->chw = o->layout == STOKE_IMAGES_CHW;
    img->dtype = o->dtype;
    img->normalize = o->normalize != 0;
    memcpy(img->mean, o->mean, sizeof(img->mean));
    memcpy(img->std, o->std, sizeof(img->std));
    img->seed = o->seed;
    if (o->size >= offsetof(stoke_images_opts, max_decode_bytes) + sizeof(o->max_decode_bytes)) {
        if (o->max_decode_bytes < ((uint64_t)1 << 20))
            return stoke__fail(STOKE_EINVAL,
                               "images: max_decode_bytes %llu is below the minimum (1 MiB)",
                               (unsigned long long)o->max_decode_bytes);
        img->max_decode = o->max_decode_bytes;
    }
    return STOKE_OK;
}

static int open_root(images_ds *s, const char *dir)
{
    s->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s->dirfd >= 0)
        return STOKE_OK;
    int e = errno;
    return stoke__fail(e == ENOENT ? STOKE_ENOENT : STOKE_EIO, "images %s: %s", dir,
                       e == ENOTDIR ? "not a directory" : strerror(e));
}

int stoke_images_open(const char *dir, const stoke_images_opts *opts, stoke_dataset *out)
{
    if (!out)
        return stoke__fail(STOKE_EINVAL, "images: NULL dataset");
    stoke_dataset_init(out);
    if (!dir || !*dir)
        return stoke__fail(STOKE_EINVAL, "images: empty directory name");
    stoke_images_opts def;
    if (!opts) {
        stoke_images_opts_init(&def);
        opts = &def;
    }
    if (opts->size < offsetof(stoke_images_opts, seed) + sizeof(opts->seed))
        return stoke__fail(STOKE_EINVAL,
                           "images: opts->size %u is too small for a stoke_images_opts (call "
                           "stoke_images_opts_init)",
                           (unsigned)opts->size);
    stoke_dataset ds;
    stoke_dataset_init(&ds);
    stoke__image_opts img;
    stoke_field fields[2];
    int64_t shape[3];
    int rc = to_image_opts(opts, &img);
    if (rc == STOKE_OK && (rc = stoke__image_field(&img, &fields[0], shape)) != STOKE_OK) {
        char why[512];
        stoke__strlcpy(why, stoke_last_error(), sizeof(why));
        return stoke__fail(rc, "images %s: %s", dir, why);
    }
    if (rc)
        return rc;
    if (!stoke__image_available())
        return stoke__fail(STOKE_ENOTSUP,
                           "images %s: JPEG decoding is not available: stoke was built without "
                           "libjpeg-turbo (Debian libjpeg62-turbo-dev)",
                           dir);
    stoke_field *l = &fields[1];
    memset(l, 0, sizeof(*l));
    stoke__strlcpy(l->name, "label", sizeof(l->name));
    l->dtype = STOKE_DTYPE_I64;
    l->ndim = 0;
    if ((rc = stoke_field_finish(l)) != STOKE_OK)
        return rc;
    images_ds *s = calloc(1, sizeof(*s));
    if (!s || !(s->root = strdup(dir))) {
        free(s);
        return stoke__fail(STOKE_ENOMEM, "images %s: out of memory", dir);
    }
    memcpy(s->fields, fields, sizeof(fields));
    memcpy(s->shape, shape, sizeof(shape));
    s->fields[0].shape = s->shape;
    ds.nfields = 2;
    ds.fields = s->fields;
    s->dirfd = -1;
    s->img = img;
    for (int k = 0; k < IMAGES_SLOTS; k++)
        pthread_mutex_init(&s->slots[k].mu, NULL);
    if ((rc = open_root(s, dir)) != STOKE_OK || (rc = scan(s)) != STOKE_OK) {
        images_close(s);
        return rc;
    }
    stoke__fmt_short(ds.name, sizeof(ds.name), "images:%s", dir);
    ds.kind = STOKE_DATASET_MAP;
    ds.user = s;
    ds.length = images_length;
    ds.get = images_get;
    ds.set_epoch = images_set_epoch;
    ds.close = images_close;
    *out = ds;
    return STOKE_OK;
}

static const images_ds *as_images(const stoke_dataset *ds)
{
    return ds && ds->get == images_get ? ds->user : NULL;
}

uint32_t stoke_images_num_classes(const stoke_dataset *ds)
{
    const images_ds *s = as_images(ds);
    return s ? s->nclasses : 0;
}

const char *stoke_images_class_name(const stoke_dataset *ds, uint32_t label)
{
    const images_ds *s = as_images(ds);
    return s && label < s->nclasses ? s->classes[label] : NULL;
}

const char *stoke_images_path(const stoke_dataset *ds, uint64_t index)
{
    const images_ds *s = as_images(ds);
    return s && index < s->n ? s->arena + s->off[index] : NULL;
}
