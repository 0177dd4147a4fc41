/* _stoke: module functions, exceptions, and the log sink that turns the library's warnings into
 * Python UserWarnings (each distinct message once per process, as the library itself warns). */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "stoke_py.h"

PyObject *StokeError;
PyObject *StokeLoaderError;
PyObject *StokeThreadsWarning;

/* ---- log sink -------------------------------------------------------------------------------
 * The sink may run in any thread (a worker's) and must not call back into stoke, nor take the
 * GIL (a thread holding the GIL may be inside a stoke call waiting for the log lock).  So it only
 * queues WARN and ERROR messages; stoke_py_flush_warnings() issues them from the Python thread
 * after each call into the library.  More verbose levels go to stderr, as the default sink. */
#define QUEUE_LEN 16
#define SEEN_LEN  64
#define MSG_LEN   600
static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static char queue[QUEUE_LEN][MSG_LEN];
static int queued;
static atomic_int pending;
static char seen[SEEN_LEN][MSG_LEN]; /* GIL */
static int nseen;

static void log_sink(void *user, int level, const char *msg)
{
    (void)user;
    if (level > STOKE_LOG_WARN) {
        fprintf(stderr, "stoke: %s: %s\n", stoke_log_level_name(level), msg);
        return;
    }
    pthread_mutex_lock(&q_lock);
    if (queued < QUEUE_LEN) {
        snprintf(queue[queued++], MSG_LEN, "%s", msg);
        atomic_store(&pending, 1);
    }
    pthread_mutex_unlock(&q_lock);
}

static int already_seen(const char msg[MSG_LEN])
{
    for (int i = 0; i < nseen; i++)
        if (strcmp(seen[i], msg) == 0)
            return 1;
    if (nseen < SEEN_LEN)
        memcpy(seen[nseen++], msg, MSG_LEN);
    return 0;
}

void stoke_py_log_install(void)
{
    stoke_log_set_callback(log_sink, NULL);
}

/* The package's directory with a trailing '/' (set at import: the extension's own), for
 * user_stacklevel. */
static char pkg_dir[4096];

static void note_pkg_dir(void)
{
    static int tried; /* (GIL) __file__ is set once the import returned: asked at first use */
    if (tried)
        return;
    tried = 1;
    PyObject *name = PyUnicode_FromString("stoke._stoke");
    PyObject *m = name ? PyImport_GetModule(name) : NULL;
    Py_XDECREF(name);
    PyObject *f = m ? PyModule_GetFilenameObject(m) : NULL;
    Py_XDECREF(m);
    const char *s = f ? PyUnicode_AsUTF8(f) : NULL;
    const char *slash = s ? strrchr(s, '/') : NULL;
    if (slash && (size_t)(slash - s) + 1 < sizeof(pkg_dir))
        snprintf(pkg_dir, sizeof(pkg_dir), "%.*s", (int)(slash - s) + 1, s);
    Py_XDECREF(f);
    PyErr_Clear(); /* (no file: the warnings then point at the package's own line) */
}

/* The stack level of the first frame outside the package: a warning names the user's line
 * (their DataLoader(...) or for loop), not stoke/__init__.py's. */
static int user_stacklevel(void)
{
    int level = 1;
    note_pkg_dir();
    if (!pkg_dir[0])
        return level;
    size_t n = strlen(pkg_dir);
    PyFrameObject *f = PyEval_GetFrame(); /* borrowed */
    Py_XINCREF(f);
    while (f) {
        PyCodeObject *co = PyFrame_GetCode(f);
        const char *fn = co ? PyUnicode_AsUTF8(co->co_filename) : NULL;
        Py_XDECREF(co);
        if (!fn || strncmp(fn, pkg_dir, n) != 0 || strchr(fn + n, '/'))
            break;
        level++;
        PyFrameObject *back = PyFrame_GetBack(f);
        Py_DECREF(f);
        f = back;
    }
    Py_XDECREF(f);
    PyErr_Clear();
    return level;
}

int stoke_py_flush_warnings(void)
{
    if (!atomic_load_explicit(&pending, memory_order_relaxed))
        return 0;
    char msgs[QUEUE_LEN][MSG_LEN];
    pthread_mutex_lock(&q_lock);
    int n = queued;
    memcpy(msgs, queue, sizeof(msgs[0]) * (size_t)n);
    queued = 0;
    atomic_store(&pending, 0);
    pthread_mutex_unlock(&q_lock);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        if (already_seen(msgs[i]))
            continue;
        if (PyErr_WarnFormat(PyExc_UserWarning, user_stacklevel(), "stoke: %s", msgs[i]) < 0)
            rc = -1; /* warnings turned into errors: the exception is set */
    }
    return rc;
}

/* ---- errors ---------------------------------------------------------------------------------- */

PyObject *stoke_py_text(const char *s, const char *errors)
{
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), errors);
}

/* Raises `type`(msg) with the attributes code, code_name, message and sample (None if < 0). */
PyObject *stoke_py_raise(PyObject *type, int code, const char *msg, long long sample)
{
    if (!msg || !*msg)
        msg = stoke_strerror(code);
    /* a message may quote a file name that is not UTF-8: its bytes as \xNN */
    PyObject *m = stoke_py_text(msg, "backslashreplace");
    PyObject *exc = m ? PyObject_CallOneArg(type, m) : NULL;
    if (!exc) {
        Py_XDECREF(m);
        return NULL;
    }
    PyObject *s = sample >= 0 ? PyLong_FromLongLong(sample) : Py_NewRef(Py_None);
    PyObject *c = PyLong_FromLong(code);
    PyObject *n = PyUnicode_FromString(stoke_err_name(code));
    if (s && c && n && PyObject_SetAttrString(exc, "code", c) == 0 &&
        PyObject_SetAttrString(exc, "code_name", n) == 0 &&
        PyObject_SetAttrString(exc, "message", m) == 0 &&
        PyObject_SetAttrString(exc, "sample", s) == 0)
        PyErr_SetObject(type, exc);
    Py_XDECREF(s);
    Py_XDECREF(c);
    Py_XDECREF(n);
    Py_XDECREF(m);
    Py_DECREF(exc);
    return NULL;
}

/* ---- dtypes ---------------------------------------------------------------------------------- */

int stoke_py_dtype(int dtype, size_t itemsize, const char **format, DLDataType *dl)
{
    static const struct {
        int dtype;
        const char *format;
        uint8_t code, bits;
    } map[] = {{STOKE_DTYPE_BOOL, "?", kDLBool, 8},      {STOKE_DTYPE_U8, "B", kDLUInt, 8},
               {STOKE_DTYPE_I8, "b", kDLInt, 8},         {STOKE_DTYPE_U16, "H", kDLUInt, 16},
               {STOKE_DTYPE_I16, "h", kDLInt, 16},       {STOKE_DTYPE_U32, "I", kDLUInt, 32},
               {STOKE_DTYPE_I32, "i", kDLInt, 32},       {STOKE_DTYPE_U64, "Q", kDLUInt, 64},
               {STOKE_DTYPE_I64, "q", kDLInt, 64},       {STOKE_DTYPE_F16, "e", kDLFloat, 16},
               {STOKE_DTYPE_BF16, NULL, kDLBfloat, 16},  {STOKE_DTYPE_F32, "f", kDLFloat, 32},
               {STOKE_DTYPE_F64, "d", kDLFloat, 64},     {STOKE_DTYPE_C64, "Zf", kDLComplex, 64},
               {STOKE_DTYPE_C128, "Zd", kDLComplex, 128}};
    if (dtype == STOKE_DTYPE_RAW) { /* bytes: one more dimension of itemsize u8 */
        (void)itemsize;
        *format = "B";
        *dl = (DLDataType){kDLUInt, 8, 1};
        return 0;
    }
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        if (map[i].dtype == dtype) {
            *format = map[i].format;
            *dl = (DLDataType){map[i].code, map[i].bits, 1};
            return 0;
        }
    return -1;
}

/* ---- module functions ------------------------------------------------------------------------ */

static PyObject *py_devices(PyObject *self, PyObject *unused)
{
    int n = stoke_backend_count();
    PyObject *list = PyList_New(0);
    for (int i = 0; list && i < n; i++) {
        stoke_backend_info bi;
        if (stoke_backend_get_info(i, &bi) != STOKE_OK)
            continue;
        PyObject *d = Py_BuildValue("{s:s,s:s,s:O,s:i,s:s,s:s,s:K}", "name", bi.name, "origin",
                                    bi.origin == STOKE_ORIGIN_PLUGIN ? "plugin" : "builtin",
                                    "available", bi.available ? Py_True : Py_False, "device_count",
                                    bi.device_count, "reason", bi.reason, "path", bi.path, "caps",
                                    (unsigned long long)bi.caps);
        if (!d || PyList_Append(list, d) < 0) {
            Py_XDECREF(d);
            Py_CLEAR(list);
            break;
        }
        Py_DECREF(d);
    }
    if (list && stoke_py_flush_warnings() < 0)
        Py_CLEAR(list);
    return list;
}

static PyObject *py_accelerator(PyObject *self, PyObject *unused)
{
    stoke_accelerator_info ai;
    int rc = stoke_accelerator_get(&ai);
    if (stoke_py_flush_warnings() < 0)
        return NULL;
    if (rc == STOKE_ENODEV)
        Py_RETURN_NONE;
    if (rc != STOKE_OK)
        return stoke_py_raise(StokeError, rc, stoke_last_error(), -1);
    return Py_BuildValue("{s:s,s:i,s:i,s:s}", "backend", ai.backend, "device_count",
                         ai.device_count, "current_device", ai.current_device, "reason", ai.reason);
}

static PyObject *py_pinned_stats_json(PyObject *self, PyObject *unused)
{
    char buf[4096];
    size_t need = 0;
    int rc = stoke_pinned_stats_json(buf, sizeof(buf), &need);
    if (rc != STOKE_OK)
        return stoke_py_raise(StokeError, rc, stoke_last_error(), -1);
    return PyUnicode_FromStringAndSize(buf, (Py_ssize_t)need);
}

static PyObject *py_empty_cache(PyObject *self, PyObject *unused)
{
    PyThreadState *ts = PyEval_SaveThread();
    stoke_pinned_empty_cache();
    PyEval_RestoreThread(ts);
    Py_RETURN_NONE;
}

static PyObject *py_flush_warnings(PyObject *self, PyObject *unused)
{
    if (stoke_py_flush_warnings() < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *py_abandoned(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(stoke_dataset_abandoned());
}

static PyObject *py_stop_python_datasets(PyObject *self, PyObject *unused)
{
    stoke_pyds_stop_all();
    stoke_py_reap_loaders(); /* the pending call may not run any more */
    Py_RETURN_NONE;
}

/* _die_with_parent(ppid), in a child the drop-in forked itself (the first batch's probe): the
 * kernel kills it when its parent dies, as the workers are (src/loader/procchild.c), so a child
 * stuck in the dataset never outlives a parent that was killed, holding its pipes open.  A
 * parent already gone (getppid() no longer ppid) ends the child now. */
static PyObject *py_die_with_parent(PyObject *self, PyObject *arg)
{
    (void)self;
    long ppid = PyLong_AsLong(arg);
    if (ppid == -1 && PyErr_Occurred())
        return NULL;
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    if ((long)getppid() != ppid)
        _exit(1);
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"devices", py_devices, METH_NOARGS, "Backends stoke considered, as dicts."},
    {"accelerator", py_accelerator, METH_NOARGS, "The chosen accelerator as a dict, or None."},
    {"pinned_stats_json", py_pinned_stats_json, METH_NOARGS, "The pinned allocator's counters."},
    {"empty_cache", py_empty_cache, METH_NOARGS, "Releases every idle cached pinned block."},
    {"_die_with_parent", py_die_with_parent, METH_O,
     "In a forked child: killed (SIGKILL) when the parent whose pid is given dies."},
    {"flush_warnings", py_flush_warnings, METH_NOARGS, "Issues queued library warnings."},
    {"build_features", stoke_py_build_features, METH_NOARGS,
     "What the loaded libstoke was built with, as a dict."},
    {"_cli_main", stoke_py_cli_main, METH_VARARGS, "Runs the stoke CLI; returns its status."},
    {"_pad_batch", stoke_py_pad_batch, METH_VARARGS,
     "The built-in padding of the drop-in DataLoader (private)."},
    {"_abandoned", py_abandoned, METH_NOARGS,
     "In a dataset call of a worker: whether its batch is no longer wanted (private; "
     "stoke_dataset_abandoned)."},
    {"_stop_python_datasets", py_stop_python_datasets, METH_NOARGS,
     "For the exit hook: no Python dataset is called from now on."},
    {"_set_release_fence", stoke_py_set_release_fence, METH_O,
     "fn() -> a fence (query(), synchronize()) or None, called as pinned memory is given back: "
     "it is reused once the fence is done (private; fence.c)."},
    {"_settle_pinned", stoke_py_settle_pinned, METH_O,
     "Frees the PinnedBuffers given back whose fences are done (all, waiting, if the argument "
     "is true); returns how many wait (private)."},
    {"_reap_stats", stoke_py_reap_stats, METH_NOARGS,
     "(loaders whose destroy was deferred, loaders those destroyed): for tests."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_stoke",
    .m_doc = "stoke's C extension (use the stoke package).",
    .m_size = -1,
    .m_methods = module_methods,
};

static int add_type(PyObject *m, PyTypeObject *t, const char *name)
{
    if (PyType_Ready(t) < 0)
        return -1;
    Py_INCREF(t);
    if (PyModule_AddObject(m, name, (PyObject *)t) < 0) {
        Py_DECREF(t);
        return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__stoke(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    StokeError = PyErr_NewExceptionWithDoc("stoke.StokeError",
                                           "An error reported by libstoke (code, code_name, "
                                           "message, sample).",
                                           PyExc_RuntimeError, NULL);
    StokeLoaderError = PyErr_NewExceptionWithDoc(
        "stoke.LoaderError", "A failing sample or batch; `sample` is its dataset index.",
        StokeError, NULL);
    StokeThreadsWarning = PyErr_NewExceptionWithDoc(
        "stoke.ThreadsWarning",
        "A Python dataset runs on several worker threads of one interpreter, sharing its global "
        "state (RNGs); docs/python.md, \"Python datasets\".",
        PyExc_RuntimeWarning, NULL);
    if (!StokeError || !StokeLoaderError || !StokeThreadsWarning ||
        PyModule_AddObjectRef(m, "ThreadsWarning", StokeThreadsWarning) < 0 ||
        PyModule_AddObjectRef(m, "StokeError", StokeError) < 0 ||
        PyModule_AddObjectRef(m, "LoaderError", StokeLoaderError) < 0 ||
        add_type(m, &StokeLoader_Type, "Loader") < 0 ||
        add_type(m, &StokeBatch_Type, "Batch") < 0 || add_type(m, &StokeField_Type, "Field") < 0 ||
        add_type(m, &StokeIter_Type, "LoaderIterator") < 0 ||
        add_type(m, &StokePinBuf_Type, "PinnedBuffer") < 0 ||
        PyModule_AddIntConstant(m, "QUARANTINE_MAX", STOKE_QUARANTINE_MAX) < 0 ||
        PyModule_AddStringConstant(m, "version", stoke_version_string()) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    stoke_py_log_install();
    return m;
}
