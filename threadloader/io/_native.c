/* threadloader.io._native: read a file and decode its JPEG at the DCT scale in one GIL release.
 *
 * The pure-Python frame path releases and re-takes the GIL at every system
 * call (open, fstat, read, read, close) and in the decoder: with many threads
 * per core each re-take can block behind another thread. load() does the
 * file read, the header parse and the scaled decode with the GIL released
 * once. It calls TurboJPEG 3 through pointers found with dlsym in the library
 * Python found (threadloader/io/_turbojpeg.py): no header or library is
 * needed to build this file. Anything it does not decode itself (not a JPEG,
 * CMYK/YCCK, lossless, over the pixel limit, any error or warning) is handed
 * back to the Python path, which decodes it (or fails) exactly as before.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* TurboJPEG 3 (turbojpeg.h), declared here: the API is stable across 3.x. */
typedef struct { int num, denom; } tj_scaling;
enum {
    TJINIT_DECOMPRESS = 1,
    TJPARAM_STOPONWARNING = 0, TJPARAM_JPEGWIDTH = 5, TJPARAM_JPEGHEIGHT = 6, TJPARAM_COLORSPACE = 8,
    TJPARAM_FASTUPSAMPLE = 9, TJPARAM_FASTDCT = 10, TJPARAM_LOSSLESS = 15,
    TJCS_CMYK = 3, TJCS_YCCK = 4, TJPF_RGB = 0,
};

static struct {
    void *(*init)(int);
    void (*destroy)(void *);
    int (*set)(void *, int, int);
    int (*get)(void *, int);
    int (*header)(void *, const unsigned char *, size_t);
    int (*scale)(void *, tj_scaling);
    int (*decompress8)(void *, const unsigned char *, size_t, unsigned char *, int, int);
} tj;
static int tj_bound = 0;
static pthread_key_t handle_key;

/* One decompressor per thread, destroyed when the thread ends. */
static void destroy_handle(void *handle) {
    if (handle != NULL) tj.destroy(handle);
}

static void *thread_handle(void) {
    void *handle = pthread_getspecific(handle_key);
    if (handle == NULL) {
        handle = tj.init(TJINIT_DECOMPRESS);
        if (handle != NULL && pthread_setspecific(handle_key, handle) != 0) {
            tj.destroy(handle);
            handle = NULL;
        }
    }
    return handle;
}

static PyObject *bind(PyObject *self, PyObject *arg) {
    PyObject *path_bytes = NULL;
    if (!PyUnicode_FSConverter(arg, &path_bytes)) return NULL;
    void *lib = dlopen(PyBytes_AS_STRING(path_bytes), RTLD_NOW | RTLD_LOCAL);
    Py_DECREF(path_bytes);
    if (lib == NULL) {
        PyErr_Format(PyExc_OSError, "cannot load TurboJPEG: %s", dlerror());
        return NULL;
    }
#define FIND(field, name) \
    if ((*(void **)&tj.field = dlsym(lib, name)) == NULL) { \
        PyErr_Format(PyExc_OSError, "TurboJPEG library has no %s", name); \
        return NULL; \
    }
    FIND(init, "tj3Init") FIND(destroy, "tj3Destroy") FIND(set, "tj3Set") FIND(get, "tj3Get")
    FIND(header, "tj3DecompressHeader") FIND(scale, "tj3SetScalingFactor") FIND(decompress8, "tj3Decompress8")
#undef FIND
    tj_bound = 1;
    Py_RETURN_NONE;
}

/* Pixels decoded into memory of our own (the caller's buffer was too small). */
typedef struct {
    PyObject_HEAD
    unsigned char *data;
    Py_ssize_t size;
} Pixels;

static void pixels_dealloc(Pixels *self) {
    free(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int pixels_getbuffer(Pixels *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->data, self->size, 0, flags);
}

static PyBufferProcs pixels_as_buffer = {(getbufferproc)pixels_getbuffer, NULL};

static PyTypeObject PixelsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "threadloader.io._native.Pixels",
    .tp_basicsize = sizeof(Pixels),
    .tp_dealloc = (destructor)pixels_dealloc,
    .tp_as_buffer = &pixels_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Decoded pixels in memory of their own (a writable buffer).",
};

/* What load() did, told to Python. */
enum { DECODED = 0, HANDED_BACK = 1 };

typedef struct {
    /* in */
    const char *path;  /* NULL: decode `in` */
    const unsigned char *in;
    size_t in_size;
    int size_h, size_w;  /* 0: no output size (full scale) */
    double reducing_gap;  /* 0: always full scale */
    long long pixel_limit;  /* < 0: none */
    int fastdct, fastupsample;
    unsigned char *out;
    size_t out_capacity;
    /* out */
    unsigned char *file;  /* the file's bytes (malloc), when read here */
    size_t file_size;
    int os_errno;
    unsigned char *own;  /* malloc'd pixels, when `out` was too small */
    int status, height, width, factor;
} job;

static int read_whole(job *j) {
    int fd = open(j->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
    struct stat st;
    if (fstat(fd, &st) != 0) { int e = errno; close(fd); return e; }
    if (S_ISDIR(st.st_mode)) { close(fd); return EISDIR; }
    /* One byte more than the size, so that a file that grew is not cut; then to the end. */
    size_t cap = (size_t)st.st_size + 1, n = 0;
    unsigned char *buf = malloc(cap);
    if (buf == NULL) { close(fd); return ENOMEM; }
    for (;;) {
        if (n == cap) {
            size_t grown = cap * 2;
            unsigned char *more = realloc(buf, grown);
            if (more == NULL) { free(buf); close(fd); return ENOMEM; }
            buf = more, cap = grown;
        }
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0) {
            if (errno == EINTR) continue;
            int e = errno; free(buf); close(fd); return e;
        }
        if (got == 0) break;
        n += (size_t)got;
    }
    close(fd);
    j->file = buf, j->file_size = n;
    j->in = buf, j->in_size = n;
    return 0;
}

/* As threadloader.io.image._dct_factor: 1/2, 1/4, 1/8 (the SIMD-fast scales) while the
 * scaled image stays >= reducing_gap x size. */
static int dct_factor(int h, int w, const job *j) {
    if (j->size_h <= 0 || j->reducing_gap <= 0) return 1;
    for (int f = 8; f >= 2; f /= 2)
        if ((double)h >= (double)(j->size_h * f) * j->reducing_gap &&
            (double)w >= (double)(j->size_w * f) * j->reducing_gap)
            return f;
    return 1;
}

/* After a failed call a decompressor may be left unusable (a header error leaves it so): the
 * thread's next call gets a new one. */
static void drop_handle(void *h) {
    pthread_setspecific(handle_key, NULL);
    tj.destroy(h);
}

static void run(job *j) {
    j->status = HANDED_BACK;
    if (j->path != NULL && (j->os_errno = read_whole(j)) != 0) return;
    if (j->in_size < 3 || j->in[0] != 0xFF || j->in[1] != 0xD8 || j->in[2] != 0xFF) return;
    void *h = thread_handle();
    if (h == NULL) return;
    if (tj.header(h, j->in, j->in_size) != 0) {
        drop_handle(h);
        return;
    }
    int height = tj.get(h, TJPARAM_JPEGHEIGHT), width = tj.get(h, TJPARAM_JPEGWIDTH);
    int cs = tj.get(h, TJPARAM_COLORSPACE);
    if (cs == TJCS_CMYK || cs == TJCS_YCCK || tj.get(h, TJPARAM_LOSSLESS) == 1) return;
    if (height <= 0 || width <= 0) return;
    if (j->pixel_limit >= 0 && (long long)height * width > j->pixel_limit) return;
    int f = dct_factor(height, width, j);
    int oh = (height + f - 1) / f, ow = (width + f - 1) / f;
    size_t need = (size_t)oh * ow * 3;
    unsigned char *out = j->out;
    if (need > j->out_capacity) {
        if ((j->own = malloc(need)) == NULL) return;
        out = j->own;
    }
    if (tj.set(h, TJPARAM_STOPONWARNING, 1) || tj.set(h, TJPARAM_FASTDCT, j->fastdct) ||
        tj.set(h, TJPARAM_FASTUPSAMPLE, j->fastupsample) || tj.scale(h, (tj_scaling){1, f}) ||
        tj.decompress8(h, j->in, j->in_size, out, ow * 3, TJPF_RGB) != 0) {
        free(j->own);
        j->own = NULL;
        drop_handle(h);
        return;
    }
    j->status = DECODED, j->height = height, j->width = width, j->factor = f;
}

static size_t need_bytes(const job *j) {
    int f = j->factor;
    return (size_t)((j->height + f - 1) / f) * ((j->width + f - 1) / f) * 3;
}

static PyObject *load(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"source", "size_h", "size_w", "reducing_gap", "pixel_limit", "fastdct",
                            "fastupsample", "out", NULL};
    PyObject *source, *out_obj;
    job j;
    memset(&j, 0, sizeof j);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OiidLppO:load", names, &source, &j.size_h, &j.size_w,
                                     &j.reducing_gap, &j.pixel_limit, &j.fastdct, &j.fastupsample, &out_obj))
        return NULL;
    if (!tj_bound) {
        PyErr_SetString(PyExc_RuntimeError, "TurboJPEG is not bound (call bind first)");
        return NULL;
    }
    PyObject *path_bytes = NULL;
    Py_buffer in = {0}, out = {0};
    if (PyBytes_Check(source)) {
        if (PyObject_GetBuffer(source, &in, PyBUF_SIMPLE) != 0) return NULL;
        j.in = in.buf, j.in_size = (size_t)in.len;
    } else {
        if (!PyUnicode_FSConverter(source, &path_bytes)) return NULL;
        j.path = PyBytes_AS_STRING(path_bytes);
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE) != 0) {
        if (in.obj) PyBuffer_Release(&in);
        Py_XDECREF(path_bytes);
        return NULL;
    }
    j.out = out.buf, j.out_capacity = (size_t)out.len;

    Py_BEGIN_ALLOW_THREADS
    run(&j);
    Py_END_ALLOW_THREADS

    if (in.obj) PyBuffer_Release(&in);
    PyBuffer_Release(&out);
    PyObject *result = NULL;
    if (j.os_errno != 0) {
        errno = j.os_errno;
        PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, source);
    } else if (j.status == DECODED) {
        PyObject *pixels;
        if (j.own != NULL) {
            Pixels *p = PyObject_New(Pixels, &PixelsType);
            if (p != NULL) p->data = j.own, p->size = (Py_ssize_t)need_bytes(&j), j.own = NULL;
            pixels = (PyObject *)p;
        } else {
            pixels = Py_NewRef(out_obj);
        }
        if (pixels != NULL)
            result = Py_BuildValue("(iOOiii)", DECODED, Py_None, pixels, j.height, j.width, j.factor);
        Py_XDECREF(pixels);
    } else if (j.file != NULL) {
        PyObject *data = PyBytes_FromStringAndSize((const char *)j.file, (Py_ssize_t)j.file_size);
        if (data != NULL) result = Py_BuildValue("(iOOiii)", HANDED_BACK, data, Py_None, 0, 0, 1);
        Py_XDECREF(data);
    } else {
        result = Py_BuildValue("(iOOiii)", HANDED_BACK, Py_None, Py_None, 0, 0, 1);
    }
    free(j.file);
    free(j.own);
    Py_XDECREF(path_bytes);
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(path): use the TurboJPEG 3 library at path."},
    {"load", (PyCFunction)(void (*)(void))load, METH_VARARGS | METH_KEYWORDS,
     "load(source, size_h, size_w, reducing_gap, pixel_limit, fastdct, fastupsample, out)\n"
     "-> (status, data, pixels, height, width, factor): status 0, the image (height x width) decoded at\n"
     "scale 1/factor into `out` (or a Pixels buffer when `out` is too small), ceil(height / factor) x\n"
     "ceil(width / factor) x 3 bytes; status 1, handed back (data: the file's bytes when read here)."},
    {NULL, NULL, 0, NULL},
};

static int exec_module(PyObject *module) {
    if (PyType_Ready(&PixelsType) < 0) return -1;
    if (pthread_key_create(&handle_key, destroy_handle) != 0) {
        PyErr_SetString(PyExc_OSError, "pthread_key_create failed");
        return -1;
    }
    if (PyModule_AddIntConstant(module, "DECODED", DECODED) < 0) return -1;
    if (PyModule_AddIntConstant(module, "HANDED_BACK", HANDED_BACK) < 0) return -1;
    return 0;
}

static PyModuleDef_Slot slots[] = {
    {Py_mod_exec, exec_module},
#ifdef Py_GIL_DISABLED
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},  /* thread-safe: per-thread handles, no shared state after bind */
#endif
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "threadloader.io._native",
    "Read and decode a JPEG file with the GIL released once (see threadloader/io/image.py).",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModuleDef_Init(&module_def); }
