/* _stoke's command line and build facts: _cli_main runs the stoke CLI's own code (tools/, linked
 * in) for `python -m stoke`, so its output, --json and exit status are the C tool's;
 * build_features reports what the loaded libstoke was built with (stoke.build_info). */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "stoke_py.h"

/* _cli_main(args): runs `stoke ARGS...` and returns its exit status.  It writes to the
 * process's stdout and stderr (file descriptors 1 and 2, not sys.stdout), with the library's
 * messages on stderr as the CLI prints them; the GIL is released meanwhile. */
PyObject *stoke_py_cli_main(PyObject *self, PyObject *args)
{
    PyObject *seq;
    if (!PyArg_ParseTuple(args, "O", &seq))
        return NULL;
    PyObject *t = PySequence_Tuple(seq);
    if (!t)
        return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    char **argv = calloc((size_t)n + 2, sizeof(*argv));
    if (!argv) {
        Py_DECREF(t);
        return PyErr_NoMemory();
    }
    static char prog[] = "stoke";
    argv[0] = prog;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = PyTuple_GET_ITEM(t, i);
        const char *s = PyUnicode_Check(a) ? PyUnicode_AsUTF8(a) : NULL;
        if (!s) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_TypeError, "stoke: argument %zd is not a str", i);
            free(argv);
            Py_DECREF(t);
            return NULL;
        }
        argv[i + 1] = (char *)s; /* cli_run reorders argv, never writes the strings */
    }
    PyThreadState *ts = PyEval_SaveThread();
    stoke_log_set_callback(NULL, NULL); /* the CLI's messages: on stderr, as it prints them */
    clearerr(stdout);
    int status = cli_check_output(cli_run((int)n + 1, argv));
    stoke_py_log_install();
    PyEval_RestoreThread(ts);
    free(argv);
    Py_DECREF(t);
    return PyLong_FromLong(status);
}

/* build_features(): {"liburing": bool, "libjpeg": bool, "libcurl": bool, "check_invariants": bool,
 * "zlib": bool} */
PyObject *stoke_py_build_features(PyObject *self, PyObject *unused)
{
    unsigned f = stoke_build_features();
    return Py_BuildValue("{s:O,s:O,s:O,s:O,s:O}", "liburing",
                         f & STOKE_FEATURE_LIBURING ? Py_True : Py_False, "libjpeg",
                         f & STOKE_FEATURE_LIBJPEG ? Py_True : Py_False, "libcurl",
                         f & STOKE_FEATURE_LIBCURL ? Py_True : Py_False, "check_invariants",
                         f & STOKE_FEATURE_CHECK ? Py_True : Py_False, "zlib",
                         f & STOKE_FEATURE_ZLIB ? Py_True : Py_False);
}
