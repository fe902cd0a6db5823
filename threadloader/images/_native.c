/* threadloader.images._native: read a file and decode its JPEG at the DCT scale in one GIL release.
 *
 * The pure-Python frame path releases and re-takes the GIL at every system
 * call (open, fstat, read, read, close) and in the decoder: with many threads
 * per core each re-take can block behind another thread. load() does the
 * file read, the header parse and the scaled decode with the GIL released
 * once. It calls TurboJPEG 3 through pointers found with dlsym in the library
 * Python found (threadloader/images/_turbojpeg.py): no header or library is
 * needed to build this file. Anything it does not decode itself (not a JPEG,
 * CMYK/YCCK, lossless, over the pixel limit, any error or warning) is handed
 * back to the Python path, which decodes it (or fails) exactly as before.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
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
    .tp_name = "threadloader.images._native.Pixels",
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

/* As threadloader.images.decode._dct_factor: 1/2, 1/4, 1/8 (the SIMD-fast scales) while the
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

/* --- antialiased bilinear resize, uint8 RGB: torch's _upsample_bilinear2d_aa integer kernel ---
 *
 * The same separable filter and fixed-point arithmetic as torch's uint8 CPU kernel (itself
 * Pillow-SIMD's): weights computed in double, normalised, scaled to int16 at the precision the
 * largest weight allows; a horizontal pass into uint8 rows, then a vertical one; each sum
 * rounded by adding half an LSB, shifted and clamped. A pass whose size does not change is
 * skipped, as there. The result is bit-identical (tests/test_frames.py checks it against torch).
 */
typedef struct {
    int size;       /* output length */
    int taps;       /* weights per output */
    int precision;  /* fixed-point bits */
    int *start;     /* first input index per output */
    int *count;     /* inputs used per output */
    int16_t *w;     /* size x taps */
} axis;

static void axis_free(axis *a) {
    free(a->start);
    free(a->count);
    free(a->w);
}

static int axis_init(axis *a, int in, int out) {
    double scale = (double)in / out;
    double support = scale >= 1.0 ? scale : 1.0;
    double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    int taps = (int)ceil(support) * 2 + 1;
    a->size = out, a->taps = taps;
    a->start = malloc(sizeof(int) * out);
    a->count = malloc(sizeof(int) * out);
    a->w = malloc(sizeof(int16_t) * ((size_t)out * taps + 1));
    double *wd = malloc(sizeof(double) * (size_t)out * taps);
    if (!a->start || !a->count || !a->w || !wd) {
        free(wd);
        axis_free(a);
        return -1;
    }
    double wmax = 0.0;
    for (int i = 0; i < out; i++) {
        double center = scale * (i + 0.5);
        long long lo = (long long)(center - support + 0.5);
        if (lo < 0) lo = 0;
        long long hi = (long long)(center + support + 0.5);
        if (hi > in) hi = in;
        int n = (int)(hi - lo);
        if (n > taps) n = taps;
        double *wi = wd + (size_t)i * taps, total = 0.0;
        for (int j = 0; j < n; j++) {
            double x = (j + lo - center + 0.5) * invscale;
            if (x < 0) x = -x;
            double v = x < 1.0 ? 1.0 - x : 0.0;
            wi[j] = v;
            total += v;
        }
        for (int j = n; j < taps; j++) wi[j] = 0.0;
        if (total != 0.0)
            for (int j = 0; j < n; j++) {
                wi[j] /= total;
                if (wi[j] > wmax) wmax = wi[j];
            }
        a->start[i] = (int)lo, a->count[i] = n;
    }
    int p = 0;
    for (; p < 22; p++)
        if ((int)(0.5 + wmax * (1 << (p + 1))) >= (1 << 15)) break;
    a->precision = p;
    a->w[(size_t)out * taps] = 0;  /* read, with weight 0, by the last output's last pair of taps */
    for (size_t k = 0; k < (size_t)out * taps; k++) {
        double v = wd[k] * (1 << p);
        a->w[k] = (int16_t)(v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
    }
    free(wd);
    return 0;
}

static inline unsigned char clamp8(int v) { return v < 0 ? 0 : v > 255 ? 255 : (unsigned char)v; }

/* src rows of RGB pixels (row stride src_stride bytes) -> dst rows of ax->size pixels. */
static void pass_horizontal_scalar(const unsigned char *src, Py_ssize_t src_stride, int rows, const axis *ax,
                                   unsigned char *dst, Py_ssize_t dst_stride) {
    int half = 1 << (ax->precision - 1), shift = ax->precision;
    for (int y = 0; y < rows; y++) {
        const unsigned char *row = src + y * src_stride;
        unsigned char *o = dst + y * dst_stride;
        for (int x = 0; x < ax->size; x++) {
            const unsigned char *p = row + (Py_ssize_t)ax->start[x] * 3;
            const int16_t *w = ax->w + (size_t)x * ax->taps;
            int r = half, g = half, b = half;
            for (int k = 0; k < ax->count[x]; k++, p += 3) {
                r += p[0] * w[k], g += p[1] * w[k], b += p[2] * w[k];
            }
            o[3 * x] = clamp8(r >> shift), o[3 * x + 1] = clamp8(g >> shift), o[3 * x + 2] = clamp8(b >> shift);
        }
    }
}

/* src rows of `bytes_per_row` bytes -> ax->size rows. */
static void pass_vertical_scalar(const unsigned char *src, Py_ssize_t src_stride, int bytes_per_row, const axis *ax,
                                 unsigned char *dst, Py_ssize_t dst_stride, int *acc) {
    int half = 1 << (ax->precision - 1), shift = ax->precision;
    for (int y = 0; y < ax->size; y++) {
        const int16_t *w = ax->w + (size_t)y * ax->taps;
        for (int i = 0; i < bytes_per_row; i++) acc[i] = half;
        for (int k = 0; k < ax->count[y]; k++) {
            const unsigned char *row = src + (Py_ssize_t)(ax->start[y] + k) * src_stride;
            int wk = w[k];
            for (int i = 0; i < bytes_per_row; i++) acc[i] += row[i] * wk;
        }
        unsigned char *o = dst + y * dst_stride;
        for (int i = 0; i < bytes_per_row; i++) o[i] = clamp8(acc[i] >> shift);
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_SIMD 1

/* The same sums as the scalar passes (integer arithmetic: the order of the additions does not
 * matter), two taps per multiply-add. `pairs` holds each output's weights two by two, as the
 * int32 (w[k] | w[k+1] << 16) a multiply-add takes; count[x] rounded up to pairs. */
/* Pairs per output, rounded up to an even count (the AVX2 pass takes two pairs at a time). */
static int pairs_per(const axis *ax) { return ((ax->taps + 1) / 2 + 1) & ~1; }

static int32_t *weight_pairs(const axis *ax) {
    int per = pairs_per(ax);
    int32_t *pairs = malloc(sizeof(int32_t) * (size_t)ax->size * per);
    if (pairs == NULL) return NULL;
    for (int x = 0; x < ax->size; x++) {
        const int16_t *w = ax->w + (size_t)x * ax->taps;
        int n = ax->count[x];
        for (int k = 0; k < per; k++) {
            int a = 2 * k < n ? w[2 * k] : 0, b = 2 * k + 1 < n ? w[2 * k + 1] : 0;
            pairs[(size_t)x * per + k] = (int32_t)((uint32_t)(uint16_t)a | ((uint32_t)(uint16_t)b << 16));
        }
    }
    return pairs;
}

/* Rows whose every 8-byte load stays inside the buffer: all but the last (a pair of taps reads 8
 * bytes from its first pixel, up to 5 past the row's end; the next row is there). */
__attribute__((target("ssse3"))) static void pass_horizontal_simd(
        const unsigned char *src, Py_ssize_t src_stride, int rows, const axis *ax, const int32_t *pairs,
        unsigned char *dst, Py_ssize_t dst_stride) {
    int shift = ax->precision, per = pairs_per(ax);
    const __m128i half = _mm_set1_epi32(1 << (ax->precision - 1));
    /* bytes A.r A.g A.b B.r B.g B.b -> int16 A.r B.r A.g B.g A.b B.b 0 0 */
    const __m128i shuffle = _mm_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
    int y = 0;
    for (; y + 1 < rows; y += 2) {  /* two rows at once: the same weights */
        const unsigned char *r0 = src + y * src_stride, *r1 = r0 + src_stride;
        unsigned char *o0 = dst + y * dst_stride, *o1 = o0 + dst_stride;
        for (int x = 0; x < ax->size; x++) {
            Py_ssize_t off = (Py_ssize_t)ax->start[x] * 3;
            const unsigned char *p0 = r0 + off, *p1 = r1 + off;
            const int32_t *wp = pairs + (size_t)x * per;
            int np = (ax->count[x] + 1) / 2;
            __m128i a0 = half, a1 = half;
            for (int k = 0; k < np; k++, p0 += 6, p1 += 6) {
                int64_t b0, b1;
                memcpy(&b0, p0, 8);
                memcpy(&b1, p1, 8);
                __m128i wt = _mm_set1_epi32(wp[k]);
                a0 = _mm_add_epi32(a0, _mm_madd_epi16(_mm_shuffle_epi8(_mm_cvtsi64_si128(b0), shuffle), wt));
                a1 = _mm_add_epi32(a1, _mm_madd_epi16(_mm_shuffle_epi8(_mm_cvtsi64_si128(b1), shuffle), wt));
            }
            __m128i packed = _mm_packs_epi32(_mm_srai_epi32(a0, shift), _mm_srai_epi32(a1, shift));
            packed = _mm_packus_epi16(packed, packed);
            int32_t rgb0 = _mm_cvtsi128_si32(packed), rgb1 = _mm_extract_epi16(packed, 2) |
                           (_mm_extract_epi16(packed, 3) << 16);
            o0[3 * x] = (unsigned char)rgb0, o0[3 * x + 1] = (unsigned char)(rgb0 >> 8);
            o0[3 * x + 2] = (unsigned char)(rgb0 >> 16);
            o1[3 * x] = (unsigned char)rgb1, o1[3 * x + 1] = (unsigned char)(rgb1 >> 8);
            o1[3 * x + 2] = (unsigned char)(rgb1 >> 16);
        }
    }
    for (; y < rows; y++) {
        const unsigned char *r0 = src + y * src_stride;
        unsigned char *o0 = dst + y * dst_stride;
        for (int x = 0; x < ax->size; x++) {
            const unsigned char *p0 = r0 + (Py_ssize_t)ax->start[x] * 3;
            const int32_t *wp = pairs + (size_t)x * per;
            int np = (ax->count[x] + 1) / 2;
            __m128i a0 = half;
            for (int k = 0; k < np; k++, p0 += 6) {
                int64_t b0;
                memcpy(&b0, p0, 8);
                a0 = _mm_add_epi32(a0, _mm_madd_epi16(_mm_shuffle_epi8(_mm_cvtsi64_si128(b0), shuffle),
                                                      _mm_set1_epi32(wp[k])));
            }
            __m128i packed = _mm_packs_epi32(_mm_srai_epi32(a0, shift), a0);
            int32_t rgb0 = _mm_cvtsi128_si32(_mm_packus_epi16(packed, packed));
            o0[3 * x] = (unsigned char)rgb0, o0[3 * x + 1] = (unsigned char)(rgb0 >> 8);
            o0[3 * x + 2] = (unsigned char)(rgb0 >> 16);
        }
    }
}

__attribute__((target("ssse3"))) static void pass_vertical_simd(
        const unsigned char *src, Py_ssize_t src_stride, int bytes_per_row, const axis *ax, const int32_t *pairs,
        unsigned char *dst, Py_ssize_t dst_stride, int *acc_scalar) {
    int shift = ax->precision, per = pairs_per(ax);
    const __m128i half = _mm_set1_epi32(1 << (ax->precision - 1)), zero = _mm_setzero_si128();
    int simd_bytes = bytes_per_row & ~15;
    for (int y = 0; y < ax->size; y++) {
        const int16_t *w = ax->w + (size_t)y * ax->taps;
        const int32_t *wp = pairs + (size_t)y * per;
        int n = ax->count[y], full = n / 2;
        const unsigned char *first = src + (Py_ssize_t)ax->start[y] * src_stride;
        unsigned char *o = dst + y * dst_stride;
        for (int i = 0; i < simd_bytes; i += 16) {
            __m128i a0 = half, a1 = half, a2 = half, a3 = half;
            const unsigned char *r = first + i;
            for (int k = 0; k < full; k++, r += 2 * src_stride) {
                __m128i r0 = _mm_loadu_si128((const __m128i *)r);
                __m128i r1 = _mm_loadu_si128((const __m128i *)(r + src_stride));
                __m128i wt = _mm_set1_epi32(wp[k]);
                __m128i lo = _mm_unpacklo_epi8(r0, r1), hi = _mm_unpackhi_epi8(r0, r1);
                a0 = _mm_add_epi32(a0, _mm_madd_epi16(_mm_unpacklo_epi8(lo, zero), wt));
                a1 = _mm_add_epi32(a1, _mm_madd_epi16(_mm_unpackhi_epi8(lo, zero), wt));
                a2 = _mm_add_epi32(a2, _mm_madd_epi16(_mm_unpacklo_epi8(hi, zero), wt));
                a3 = _mm_add_epi32(a3, _mm_madd_epi16(_mm_unpackhi_epi8(hi, zero), wt));
            }
            if (n & 1) {  /* the odd last tap, paired with zeros */
                __m128i r0 = _mm_loadu_si128((const __m128i *)r);
                __m128i wt = _mm_set1_epi32(wp[full]);
                __m128i lo = _mm_unpacklo_epi8(r0, zero), hi = _mm_unpackhi_epi8(r0, zero);
                a0 = _mm_add_epi32(a0, _mm_madd_epi16(_mm_unpacklo_epi8(lo, zero), wt));
                a1 = _mm_add_epi32(a1, _mm_madd_epi16(_mm_unpackhi_epi8(lo, zero), wt));
                a2 = _mm_add_epi32(a2, _mm_madd_epi16(_mm_unpacklo_epi8(hi, zero), wt));
                a3 = _mm_add_epi32(a3, _mm_madd_epi16(_mm_unpackhi_epi8(hi, zero), wt));
            }
            __m128i lo16 = _mm_packs_epi32(_mm_srai_epi32(a0, shift), _mm_srai_epi32(a1, shift));
            __m128i hi16 = _mm_packs_epi32(_mm_srai_epi32(a2, shift), _mm_srai_epi32(a3, shift));
            _mm_storeu_si128((__m128i *)(o + i), _mm_packus_epi16(lo16, hi16));
        }
        if (simd_bytes < bytes_per_row) {  /* the row's last bytes */
            int rest = bytes_per_row - simd_bytes, half_s = 1 << (shift - 1);
            for (int i = 0; i < rest; i++) acc_scalar[i] = half_s;
            for (int k = 0; k < n; k++) {
                const unsigned char *r = first + k * src_stride + simd_bytes;
                for (int i = 0; i < rest; i++) acc_scalar[i] += r[i] * w[k];
            }
            for (int i = 0; i < rest; i++) o[simd_bytes + i] = clamp8(acc_scalar[i] >> shift);
        }
    }
}

/* As pass_horizontal_simd, four taps per multiply-add (two pairs, one per 128-bit lane), two rows
 * at once. Loads reach up to 11 bytes past a row's end: the caller leaves the last rows to the
 * scalar pass. */
__attribute__((target("avx2"))) static void pass_horizontal_avx2(
        const unsigned char *src, Py_ssize_t src_stride, int rows, const axis *ax, const int32_t *pairs,
        unsigned char *dst, Py_ssize_t dst_stride) {
    int shift = ax->precision, per = pairs_per(ax);
    const __m256i shuffle = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
                                             0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
    const __m256i spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const __m128i half = _mm_set1_epi32(1 << (ax->precision - 1));
    for (int y = 0; y < rows; y += 2) {
        int two = y + 1 < rows;
        const unsigned char *r0 = src + y * src_stride, *r1 = two ? r0 + src_stride : r0;
        unsigned char *o0 = dst + y * dst_stride, *o1 = o0 + dst_stride;
        for (int x = 0; x < ax->size; x++) {
            Py_ssize_t off = (Py_ssize_t)ax->start[x] * 3;
            const unsigned char *p0 = r0 + off, *p1 = r1 + off;
            const int32_t *wp = pairs + (size_t)x * per;
            int nq = (ax->count[x] + 3) / 4;
            __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
            for (int q = 0; q < nq; q++, p0 += 12, p1 += 12) {
                int64_t b0, b1, c0, c1;
                memcpy(&b0, p0, 8);
                memcpy(&c0, p0 + 6, 8);
                memcpy(&b1, p1, 8);
                memcpy(&c1, p1 + 6, 8);
                __m256i wt = _mm256_permutevar8x32_epi32(
                    _mm256_castsi128_si256(_mm_loadl_epi64((const __m128i *)(wp + 2 * q))), spread);
                __m256i x0 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_cvtsi64_si128(b0)),
                                                     _mm_cvtsi64_si128(c0), 1);
                __m256i x1 = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_cvtsi64_si128(b1)),
                                                     _mm_cvtsi64_si128(c1), 1);
                a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_shuffle_epi8(x0, shuffle), wt));
                a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_shuffle_epi8(x1, shuffle), wt));
            }
            __m128i s0 = _mm_add_epi32(half, _mm_add_epi32(_mm256_castsi256_si128(a0), _mm256_extracti128_si256(a0, 1)));
            __m128i s1 = _mm_add_epi32(half, _mm_add_epi32(_mm256_castsi256_si128(a1), _mm256_extracti128_si256(a1, 1)));
            __m128i packed = _mm_packs_epi32(_mm_srai_epi32(s0, shift), _mm_srai_epi32(s1, shift));
            packed = _mm_packus_epi16(packed, packed);
            int32_t rgb0 = _mm_cvtsi128_si32(packed), rgb1 = _mm_extract_epi16(packed, 2) |
                           (_mm_extract_epi16(packed, 3) << 16);
            o0[3 * x] = (unsigned char)rgb0, o0[3 * x + 1] = (unsigned char)(rgb0 >> 8);
            o0[3 * x + 2] = (unsigned char)(rgb0 >> 16);
            if (two) {
                o1[3 * x] = (unsigned char)rgb1, o1[3 * x + 1] = (unsigned char)(rgb1 >> 8);
                o1[3 * x + 2] = (unsigned char)(rgb1 >> 16);
            }
        }
    }
}
#endif

static int simd_ok(void) {
#ifdef HAVE_SIMD
    static int ok = -1;
    if (ok < 0) ok = __builtin_cpu_supports("ssse3") ? 1 : 0;
    return ok;
#else
    return 0;
#endif
}

static int avx2_ok(void) {
#ifdef HAVE_SIMD
    static int ok = -1;
    if (ok < 0) ok = __builtin_cpu_supports("avx2") ? 1 : 0;
    return ok;
#else
    return 0;
#endif
}

static void pass_horizontal(const unsigned char *src, Py_ssize_t src_stride, int rows, const axis *ax,
                            unsigned char *dst, Py_ssize_t dst_stride) {
#ifdef HAVE_SIMD
    int32_t *pairs;
    if (rows > 4 && avx2_ok() && (pairs = weight_pairs(ax)) != NULL) {
        pass_horizontal_avx2(src, src_stride, rows - 4, ax, pairs, dst, dst_stride);
        free(pairs);
        /* the last rows: loads past their end could leave the buffer */
        pass_horizontal_scalar(src + (rows - 4) * src_stride, src_stride, 4, ax, dst + (rows - 4) * dst_stride,
                               dst_stride);
        return;
    }
    if (rows > 1 && simd_ok() && (pairs = weight_pairs(ax)) != NULL) {
        pass_horizontal_simd(src, src_stride, rows - 1, ax, pairs, dst, dst_stride);
        free(pairs);
        /* the last row: loads past its end could leave the buffer */
        pass_horizontal_scalar(src + (rows - 1) * src_stride, src_stride, 1, ax, dst + (rows - 1) * dst_stride,
                               dst_stride);
        return;
    }
#endif
    pass_horizontal_scalar(src, src_stride, rows, ax, dst, dst_stride);
}

static void pass_vertical(const unsigned char *src, Py_ssize_t src_stride, int bytes_per_row, const axis *ax,
                          unsigned char *dst, Py_ssize_t dst_stride, int *acc) {
#ifdef HAVE_SIMD
    int32_t *pairs;
    if (simd_ok() && (pairs = weight_pairs(ax)) != NULL) {
        pass_vertical_simd(src, src_stride, bytes_per_row, ax, pairs, dst, dst_stride, acc);
        free(pairs);
        return;
    }
#endif
    pass_vertical_scalar(src, src_stride, bytes_per_row, ax, dst, dst_stride, acc);
}

typedef struct {
    const unsigned char *src;
    Py_ssize_t src_stride;
    int in_h, in_w;
} image_in;

/* One image into `dst` (out_h x out_w x 3, contiguous), with `mid` (in_h x out_w x 3 bytes) and
 * `acc` (out_w x 3 ints, or in_w x 3 when only the vertical pass runs) as scratch. 0, or -1 when
 * out of memory. */
static int resize_one(const image_in *im, int out_h, int out_w, unsigned char *dst, unsigned char *mid, int *acc) {
    Py_ssize_t dst_stride = (Py_ssize_t)out_w * 3;
    int need_h = im->in_w != out_w, need_v = im->in_h != out_h;
    if (!need_h && !need_v) {
        for (int y = 0; y < out_h; y++) memcpy(dst + y * dst_stride, im->src + y * im->src_stride, dst_stride);
        return 0;
    }
    axis ah = {0}, av = {0};
    int status = -1;
    if (need_h && axis_init(&ah, im->in_w, out_w) != 0) goto done;
    if (need_v && axis_init(&av, im->in_h, out_h) != 0) goto done;
    const unsigned char *vsrc = im->src;
    Py_ssize_t vstride = im->src_stride;
    if (need_h) {
        pass_horizontal(im->src, im->src_stride, im->in_h, &ah, need_v ? mid : dst, dst_stride);
        vsrc = mid, vstride = dst_stride;
    }
    if (need_v) pass_vertical(vsrc, vstride, (need_h ? out_w : im->in_w) * 3, &av, dst, dst_stride, acc);
    status = 0;
done:
    if (need_h) axis_free(&ah);
    if (need_v) axis_free(&av);
    return status;
}

static PyObject *resize_into(PyObject *self, PyObject *args) {
    PyObject *sources, *out_obj;
    int out_h, out_w;
    if (!PyArg_ParseTuple(args, "OOii:resize_into", &sources, &out_obj, &out_h, &out_w)) return NULL;
    PyObject *seq = PySequence_Fast(sources, "resize_into needs a sequence of arrays");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer out = {0};
    Py_buffer *views = calloc(n > 0 ? n : 1, sizeof(Py_buffer));
    image_in *ims = calloc(n > 0 ? n : 1, sizeof(image_in));
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    if (views == NULL || ims == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (out_h <= 0 || out_w <= 0) {
        PyErr_SetString(PyExc_ValueError, "resize_into: the output size must be positive");
        goto done;
    }
    if (PyObject_GetBuffer(out_obj, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) goto done;
    if (out.len < (Py_ssize_t)n * out_h * out_w * 3) {
        PyErr_SetString(PyExc_ValueError, "resize_into: the output buffer is too small");
        goto done;
    }
    for (; got < n; got++) {
        Py_buffer *v = &views[got];
        PyObject *item = PySequence_Fast_GET_ITEM(seq, got);
        if (item == Py_None) continue;  /* a slot filled by the caller */
        if (PyObject_GetBuffer(item, v, PyBUF_STRIDED_RO | PyBUF_FORMAT) != 0) goto done;
        if ((v->format != NULL && strcmp(v->format, "B") != 0) || v->ndim != 3 || v->shape[2] != 3 || v->itemsize != 1 || v->strides[2] != 1 || v->strides[1] != 3 ||
            v->strides[0] < v->shape[1] * 3 || v->shape[0] <= 0 || v->shape[1] <= 0) {
            got++;
            PyErr_SetString(PyExc_ValueError, "resize_into: each source must be (H, W, 3) uint8 with packed rows");
            goto done;
        }
        ims[got].src = v->buf, ims[got].src_stride = v->strides[0];
        ims[got].in_h = (int)v->shape[0], ims[got].in_w = (int)v->shape[1];
    }
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    /* Scratch for the whole batch, sized for its largest image. */
    size_t slot = (size_t)out_h * out_w * 3, mid_bytes = 1, acc_ints = (size_t)out_w * 3;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (ims[i].src == NULL) continue;
        size_t m = (size_t)ims[i].in_h * out_w * 3, a = (size_t)ims[i].in_w * 3;
        if (m > mid_bytes) mid_bytes = m;
        if (a > acc_ints) acc_ints = a;
    }
    unsigned char *mid = malloc(mid_bytes);
    int *acc = malloc(sizeof(int) * acc_ints);
    failed = mid == NULL || acc == NULL;
    for (Py_ssize_t i = 0; i < n && !failed; i++)
        if (ims[i].src != NULL) failed = resize_one(&ims[i], out_h, out_w, (unsigned char *)out.buf + i * slot, mid, acc);
    free(mid);
    free(acc);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t i = 0; i < got; i++)
        if (views[i].obj) PyBuffer_Release(&views[i]);
    if (out.obj) PyBuffer_Release(&out);
    free(views);
    free(ims);
    Py_DECREF(seq);
    return result;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_O, "bind(path): use the TurboJPEG 3 library at path."},
    {"load", (PyCFunction)(void (*)(void))load, METH_VARARGS | METH_KEYWORDS,
     "load(source, size_h, size_w, reducing_gap, pixel_limit, fastdct, fastupsample, out)\n"
     "-> (status, data, pixels, height, width, factor): status 0, the image (height x width) decoded at\n"
     "scale 1/factor into `out` (or a Pixels buffer when `out` is too small), ceil(height / factor) x\n"
     "ceil(width / factor) x 3 bytes; status 1, handed back (data: the file's bytes when read here)."},
    {"resize_into", resize_into, METH_VARARGS,
     "resize_into(sources, out, height, width): antialiased bilinear resize of each (H, W, 3) uint8 source\n"
     "(rows of packed pixels) into its height x width x 3 slot of `out` (None: the slot is left as it\n"
     "is), bit for bit as torch's uint8 kernel, with the GIL released once for them all."},
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
    PyModuleDef_HEAD_INIT, "threadloader.images._native",
    "Read and decode a JPEG file with the GIL released once (see threadloader/images/decode.py).",
    0, methods, slots, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__native(void) { return PyModuleDef_Init(&module_def); }
