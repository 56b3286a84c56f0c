/* The fused render kernel: one pass per output pixel, from the source tiles to RGB CHW uint8.
 *
 * The arithmetic is defined (and documented) in kernel.py; this file implements it and
 * tests/unit/test_augment_straightforward.py re-implements it in numpy. Built with
 * -ffp-contract=off and without -ffast-math or -march (setup.py): every float operation
 * below is one IEEE-754 operation in the written order, so the bytes are the same on every
 * x86-64 CPU.
 *
 * Python API (all arrays through the buffer protocol, no numpy headers):
 *   render(size, out, floats, layers, flip_ud, flip_lr, ratio, tables)
 *     out     uint8 (3, size, size) C-contiguous, written, or None
 *     floats  float32 (size, size, 3) C-contiguous, written (B G R before quantisation), or None
 *     layers  1 or 2 tuples (inverse: 9 floats, tiles: tuple, mask: uint8 (size, size) or None)
 *             tile = (image (h, w, 3) float32 or uint8, rows C-contiguous per pixel,
 *                     ox, oy, xa0, ya0, xa1, ya1)
 *     ratio   the mixup ratio (float32 value), used with two layers
 *     tables  bytes (768): hue, saturation, value tables, or None (no HSV)
 *   hsv(image, tables): uint8 (h, w, 3) RGB C-contiguous, jittered in place.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TILES 4
#define FILL 114.0f
#define CLS_ZERO (-1)
#define CLS_MIXED (-2)

typedef struct {
    const char *base; /* pixel (0, 0) */
    Py_ssize_t row;   /* bytes per row */
    int u8;           /* uint8 pixels (else float32) */
    int ox, oy;       /* canvas position of pixel (0, 0) */
    int xa0, ya0, xa1, ya1;
} Tile;

typedef struct {
    double m[9];
    Tile tiles[MAX_TILES];
    int ntiles;
    int bx0, by0, bx1, by1; /* union of the tile rectangles */
    const uint8_t *mask;
    Py_buffer views[MAX_TILES + 1];
    int nviews;
} Layer;

static inline float tap(const Tile *t, int cx, int cy, int c) {
    const char *p = t->base + (Py_ssize_t)(cy - t->oy) * t->row;
    Py_ssize_t i = (Py_ssize_t)(cx - t->ox) * 3 + c;
    if (t->u8) return (float)((const uint8_t *)p)[i] - FILL;
    return ((const float *)p)[i];
}

static inline int tile_at(const Layer *L, int cx, int cy) {
    for (int k = 0; k < L->ntiles; k++) {
        const Tile *t = &L->tiles[k];
        if (cx >= t->xa0 && cx < t->xa1 && cy >= t->ya0 && cy < t->ya1) return k;
    }
    return -1;
}

/* One pixel from canvas coordinates (u, v): bilinear over the four taps, 0 off every tile. */
static inline void sample_px(const Layer *L, double u, double v, float *dst) {
    if (!(u >= L->bx0 - 1 && u < L->bx1 && v >= L->by0 - 1 && v < L->by1)) {
        dst[0] = dst[1] = dst[2] = 0.0f;
        return;
    }
    double xf = floor(u), yf = floor(v);
    int x0 = (int)xf, y0 = (int)yf;
    float fx = (float)(u - xf), fy = (float)(v - yf);
    float ifx = 1.0f - fx, ify = 1.0f - fy;
    int t00 = tile_at(L, x0, y0), t01 = tile_at(L, x0 + 1, y0), t10 = tile_at(L, x0, y0 + 1), t11 = tile_at(L, x0 + 1, y0 + 1);
    for (int c = 0; c < 3; c++) {
        float p00 = t00 >= 0 ? tap(&L->tiles[t00], x0, y0, c) : 0.0f;
        float p01 = t01 >= 0 ? tap(&L->tiles[t01], x0 + 1, y0, c) : 0.0f;
        float p10 = t10 >= 0 ? tap(&L->tiles[t10], x0, y0 + 1, c) : 0.0f;
        float p11 = t11 >= 0 ? tap(&L->tiles[t11], x0 + 1, y0 + 1, c) : 0.0f;
        float top = p00 * ifx + p01 * fx;
        float bot = p10 * ifx + p11 * fx;
        dst[c] = top * ify + bot * fy;
    }
}

/* Per-sample column tables of the axis-aligned map, and the run cache of its row pairs. */
typedef struct {
    int *x0;
    float *fx, *ifx;
    signed char *valid;
    int *cls;     /* per column: tile index of all four taps, CLS_ZERO or CLS_MIXED */
    int *runs;    /* (start, end, cls) triples */
    int nruns;
    int key0, key1; /* tile coverage bits of the cached row pair, -1 = none cached */
} Axis;

static int axis_init(Axis *A, const Layer *L, int size) {
    A->x0 = malloc(sizeof(int) * size);
    A->fx = malloc(sizeof(float) * size);
    A->ifx = malloc(sizeof(float) * size);
    A->valid = malloc(size);
    A->cls = malloc(sizeof(int) * size);
    A->runs = malloc(sizeof(int) * 3 * size);
    A->key0 = A->key1 = -1;
    A->nruns = 0;
    if (!A->x0 || !A->fx || !A->ifx || !A->valid || !A->cls || !A->runs) return -1;
    const double a = L->m[0], c = L->m[2];
    for (int x = 0; x < size; x++) {
        double u = a * (double)x + c; /* = a*x + (b*y + c) with b = 0 */
        int ok = u >= L->bx0 - 1 && u < L->bx1;
        A->valid[x] = (signed char)ok;
        double xf = ok ? floor(u) : 0.0;
        A->x0[x] = (int)xf;
        A->fx[x] = ok ? (float)(u - xf) : 0.0f;
        A->ifx[x] = 1.0f - A->fx[x];
    }
    return 0;
}

static void axis_free(Axis *A) {
    free(A->x0), free(A->fx), free(A->ifx), free(A->valid), free(A->cls), free(A->runs);
}

static int row_bits(const Layer *L, int cy) {
    int bits = 0;
    for (int k = 0; k < L->ntiles; k++)
        if (cy >= L->tiles[k].ya0 && cy < L->tiles[k].ya1) bits |= 1 << k;
    return bits;
}

static void axis_runs(Axis *A, const Layer *L, int size, int r0, int r1) {
    for (int x = 0; x < size; x++) {
        if (!A->valid[x]) {
            A->cls[x] = CLS_ZERO;
            continue;
        }
        int x0 = A->x0[x];
        int t00 = tile_at(L, x0, r0), t01 = tile_at(L, x0 + 1, r0), t10 = tile_at(L, x0, r1), t11 = tile_at(L, x0 + 1, r1);
        if (t00 == t01 && t00 == t10 && t00 == t11) A->cls[x] = t00 >= 0 ? t00 : CLS_ZERO;
        else A->cls[x] = CLS_MIXED;
    }
    A->nruns = 0;
    int start = 0;
    for (int x = 1; x <= size; x++) {
        if (x == size || A->cls[x] != A->cls[start]) {
            int *r = &A->runs[3 * A->nruns++];
            r[0] = start, r[1] = x, r[2] = A->cls[start];
            start = x;
        }
    }
}

#define INTERIOR_LOOP(T, LOAD)                                                             \
    do {                                                                                   \
        const T *row0 = (const T *)(t->base + (Py_ssize_t)(r0 - t->oy) * t->row);          \
        const T *row1 = (const T *)(t->base + (Py_ssize_t)(r0 + 1 - t->oy) * t->row);      \
        for (int x = run[0]; x < run[1]; x++) {                                            \
            Py_ssize_t o = (Py_ssize_t)(A->x0[x] - t->ox) * 3;                             \
            float fx = A->fx[x], ifx = A->ifx[x];                                          \
            const T *a = row0 + o, *b = row1 + o;                                          \
            float *d = dst + 3 * x;                                                        \
            for (int c = 0; c < 3; c++) {                                                  \
                float top = LOAD(a[c]) * ifx + LOAD(a[c + 3]) * fx;                        \
                float bot = LOAD(b[c]) * ifx + LOAD(b[c + 3]) * fx;                        \
                d[c] = top * ify + bot * fy;                                               \
            }                                                                              \
        }                                                                                  \
    } while (0)
#define LOAD_F(v) (v)
#define LOAD_U8(v) ((float)(v) - FILL)

static void axis_row(Axis *A, const Layer *L, int size, int y, float *dst) {
    double v = L->m[4] * (double)y + L->m[5]; /* = d*x + (e*y + f) with d = 0 */
    if (!(v >= L->by0 - 1 && v < L->by1)) {
        memset(dst, 0, sizeof(float) * 3 * size);
        return;
    }
    double yf = floor(v);
    int r0 = (int)yf;
    float fy = (float)(v - yf), ify = 1.0f - fy;
    int k0 = row_bits(L, r0), k1 = row_bits(L, r0 + 1);
    if (k0 != A->key0 || k1 != A->key1) {
        axis_runs(A, L, size, r0, r0 + 1);
        A->key0 = k0, A->key1 = k1;
    }
    for (int n = 0; n < A->nruns; n++) {
        const int *run = &A->runs[3 * n];
        if (run[2] == CLS_ZERO) {
            memset(dst + 3 * run[0], 0, sizeof(float) * 3 * (run[1] - run[0]));
        } else if (run[2] == CLS_MIXED) {
            for (int x = run[0]; x < run[1]; x++) sample_px(L, L->m[0] * (double)x + L->m[2], v, dst + 3 * x);
        } else {
            const Tile *t = &L->tiles[run[2]];
            if (t->u8) INTERIOR_LOOP(uint8_t, LOAD_U8);
            else INTERIOR_LOOP(float, LOAD_F);
        }
    }
}

static void general_row(const Layer *L, int size, int y, float *dst) {
    const double *m = L->m;
    double yd = (double)y;
    double ub = m[1] * yd + m[2], vb = m[4] * yd + m[5], wb = m[7] * yd + m[8];
    int persp = !(m[6] == 0.0 && m[7] == 0.0 && m[8] == 1.0);
    for (int x = 0; x < size; x++) {
        double xd = (double)x;
        double u = m[0] * xd + ub, v = m[3] * xd + vb;
        if (persp) {
            double w = m[6] * xd + wb;
            u = u / w, v = v / w;
        }
        sample_px(L, u, v, dst + 3 * x);
    }
}

/* ---- HSV: the integer formulation defined in kernel.py ---- */
static int SDIV[256], HDIV[256];
static uint8_t HWEIGHT[180][3]; /* per hue: the weight W (0..30) of R, G, B */

static void hsv_init(void) {
    SDIV[0] = HDIV[0] = 0;
    for (int i = 1; i < 256; i++) {
        SDIV[i] = (255 * 4096 * 2 + i) / (2 * i); /* round(255 * 4096 / i) */
        HDIV[i] = (30 * 4096 * 2 + i) / (2 * i);  /* round(30 * 4096 / i) */
    }
    for (int h = 0; h < 180; h++) {
        int s = h / 30, f = h - 30 * s;
        int q = f, t = 30 - f; /* channel = V' * (7650 - S' * W) / 7650: W = 0 is V', 30 is p */
        static const int perm[6][3] = {{0, 3, 1}, {2, 0, 1}, {1, 0, 3}, {1, 2, 0}, {3, 1, 0}, {0, 1, 2}};
        /* index: 0 v (W 0), 1 p (W 30), 2 q (W f), 3 t (W 30 - f) */
        int w[4] = {0, 30, q, t};
        for (int c = 0; c < 3; c++) HWEIGHT[h][c] = (uint8_t)w[perm[s][c]];
    }
}

static inline void hsv_px(uint8_t *rgb, const uint8_t *tables) {
    int r = rgb[0], g = rgb[1], b = rgb[2];
    int v = r > g ? r : g;
    v = v > b ? v : b;
    int mn = r < g ? r : g;
    mn = mn < b ? mn : b;
    int d = v - mn;
    int s = (d * SDIV[v] + 2048) >> 12;
    int num = v == r ? g - b : v == g ? b - r + 2 * d : r - g + 4 * d;
    int h = (num * HDIV[d] + 2048) >> 12; /* arithmetic shift: floor */
    h += h < 0 ? 180 : 0;
    h -= h >= 180 ? 180 : 0;
    int h2 = tables[h], s2 = tables[256 + s], v2 = tables[512 + v];
    if (h2 >= 180) h2 = 179; /* the hue table maps into 0..179 already */
    const uint8_t *w = HWEIGHT[h2];
    for (int c = 0; c < 3; c++) rgb[c] = (uint8_t)(((unsigned)(v2 * (7650 - s2 * w[c])) + 3825u) / 7650u);
}

static inline uint8_t quant(float v) {
    long q = lrintf(v); /* the default rounding mode: nearest, ties to even */
    return (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
}

/* ---- argument parsing ---- */
static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Format(PyExc_TypeError, "%s: not a %s buffer", what, writable ? "writable" : "readable");
        return -1;
    }
    return 0;
}

static void release_layer(Layer *L) {
    for (int i = 0; i < L->nviews; i++) PyBuffer_Release(&L->views[i]);
    L->nviews = 0;
}

static int parse_layer(PyObject *obj, Layer *L, int size) {
    PyObject *inv, *tiles, *mask;
    memset(L, 0, sizeof(*L));
    if (!PyArg_ParseTuple(obj, "OOO", &inv, &tiles, &mask)) return -1;
    PyObject *seq = PySequence_Fast(inv, "inverse must be a sequence of 9 floats");
    if (!seq) return -1;
    if (PySequence_Fast_GET_SIZE(seq) != 9) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "inverse must hold 9 floats");
        return -1;
    }
    for (int i = 0; i < 9; i++) L->m[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
    Py_DECREF(seq);
    if (PyErr_Occurred()) return -1;
    if (!PyTuple_Check(tiles) || PyTuple_GET_SIZE(tiles) > MAX_TILES) {
        PyErr_SetString(PyExc_ValueError, "tiles must be a tuple of at most 4 tiles");
        return -1;
    }
    L->bx0 = L->by0 = 0, L->bx1 = L->by1 = 0;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(tiles); k++) {
        PyObject *arr;
        Tile *t = &L->tiles[L->ntiles];
        if (!PyArg_ParseTuple(PyTuple_GET_ITEM(tiles, k), "Oiiiiii", &arr, &t->ox, &t->oy, &t->xa0, &t->ya0, &t->xa1, &t->ya1)) return -1;
        Py_buffer *view = &L->views[L->nviews];
        if (get_buffer(arr, view, 0, "tile image") < 0) return -1;
        L->nviews++;
        const char *fmt = view->format ? view->format : "B";
        int u8 = strcmp(fmt, "B") == 0, f32 = strcmp(fmt, "f") == 0 || strcmp(fmt, "<f") == 0 || strcmp(fmt, "=f") == 0;
        if (view->ndim != 3 || view->shape[2] != 3 || !(u8 || f32) || view->strides[2] != view->itemsize || view->strides[1] != 3 * view->itemsize) {
            PyErr_SetString(PyExc_ValueError, "a tile image must be float32 or uint8 (h, w, 3) with contiguous pixels");
            return -1;
        }
        int h = (int)view->shape[0], w = (int)view->shape[1];
        /* The tile's rectangle must lie inside its image. */
        if (t->xa0 >= t->xa1 || t->ya0 >= t->ya1) continue;
        if (t->xa0 - t->ox < 0 || t->ya0 - t->oy < 0 || t->xa1 - t->ox > w || t->ya1 - t->oy > h) {
            PyErr_SetString(PyExc_ValueError, "a tile rectangle reaches outside its image");
            return -1;
        }
        t->base = (const char *)view->buf, t->row = view->strides[0], t->u8 = u8;
        if (L->ntiles == 0) L->bx0 = t->xa0, L->by0 = t->ya0, L->bx1 = t->xa1, L->by1 = t->ya1;
        else {
            L->bx0 = t->xa0 < L->bx0 ? t->xa0 : L->bx0, L->by0 = t->ya0 < L->by0 ? t->ya0 : L->by0;
            L->bx1 = t->xa1 > L->bx1 ? t->xa1 : L->bx1, L->by1 = t->ya1 > L->by1 ? t->ya1 : L->by1;
        }
        L->ntiles++;
    }
    if (mask != Py_None) {
        Py_buffer *view = &L->views[L->nviews];
        if (get_buffer(mask, view, 0, "mask") < 0) return -1;
        L->nviews++;
        if (view->len != (Py_ssize_t)size * size || !PyBuffer_IsContiguous(view, 'C')) {
            PyErr_SetString(PyExc_ValueError, "mask must be uint8 (size, size) C-contiguous");
            return -1;
        }
        L->mask = (const uint8_t *)view->buf;
    }
    return 0;
}

static void layer_row(Layer *L, Axis *A, int size, int y, float *dst, float *tmp) {
    if (A) axis_row(A, L, size, y, dst);
    else general_row(L, size, y, dst);
    if (L->mask) {
        const uint8_t *mrow = L->mask + (Py_ssize_t)y * size;
        int any = 0;
        for (int x = 0; x < size && !any; x++) any = mrow[x];
        if (!any) return;
        memcpy(tmp, dst, sizeof(float) * 3 * size);
        for (int x = 0; x < size; x++)
            if (mrow[x]) memcpy(dst + 3 * x, tmp + 3 * (size - 1 - x), sizeof(float) * 3);
    }
}

static int is_axis(const Layer *L) { return L->m[1] == 0.0 && L->m[3] == 0.0 && L->m[6] == 0.0 && L->m[7] == 0.0 && L->m[8] == 1.0; }

static PyObject *py_render(PyObject *self, PyObject *args) {
    int size, flip_ud, flip_lr;
    double ratio_d;
    PyObject *out_obj, *floats_obj, *layers_obj, *tables_obj;
    if (!PyArg_ParseTuple(args, "iOOOppdO", &size, &out_obj, &floats_obj, &layers_obj, &flip_ud, &flip_lr, &ratio_d, &tables_obj)) return NULL;
    if (size <= 0 || !PyTuple_Check(layers_obj) || PyTuple_GET_SIZE(layers_obj) < 1 || PyTuple_GET_SIZE(layers_obj) > 2) {
        PyErr_SetString(PyExc_ValueError, "size > 0 and a tuple of 1 or 2 layers are required");
        return NULL;
    }
    int nl = (int)PyTuple_GET_SIZE(layers_obj);
    Layer layers[2];
    Axis axes[2];
    int axis_ok[2] = {0, 0};
    Py_buffer out = {0}, floats = {0}, tables = {0};
    int have_out = 0, have_floats = 0, have_tables = 0, nparsed = 0;
    float *rows = NULL;
    PyObject *result = NULL;
    for (int i = 0; i < nl; i++) {
        if (parse_layer(PyTuple_GET_ITEM(layers_obj, i), &layers[i], size) < 0) {
            release_layer(&layers[i]);
            goto done;
        }
        nparsed++;
    }
    if (out_obj != Py_None) {
        if (get_buffer(out_obj, &out, 1, "out") < 0) goto done;
        have_out = 1;
        if (out.len != (Py_ssize_t)3 * size * size || out.itemsize != 1 || !PyBuffer_IsContiguous(&out, 'C')) {
            PyErr_SetString(PyExc_ValueError, "out must be uint8 (3, size, size) C-contiguous");
            goto done;
        }
    }
    if (floats_obj != Py_None) {
        if (get_buffer(floats_obj, &floats, 1, "floats") < 0) goto done;
        have_floats = 1;
        if (floats.len != (Py_ssize_t)12 * size * size || floats.itemsize != 4 || !PyBuffer_IsContiguous(&floats, 'C')) {
            PyErr_SetString(PyExc_ValueError, "floats must be float32 (size, size, 3) C-contiguous");
            goto done;
        }
    }
    if (tables_obj != Py_None) {
        if (get_buffer(tables_obj, &tables, 0, "tables") < 0) goto done;
        have_tables = 1;
        if (tables.len != 768) {
            PyErr_SetString(PyExc_ValueError, "tables must hold 3 x 256 bytes");
            goto done;
        }
    }
    rows = malloc(sizeof(float) * 3 * size * 3);
    if (!rows) {
        PyErr_NoMemory();
        goto done;
    }
    for (int i = 0; i < nl; i++) {
        if (is_axis(&layers[i])) {
            if (axis_init(&axes[i], &layers[i], size) < 0) {
                axis_free(&axes[i]);
                PyErr_NoMemory();
                goto done;
            }
            axis_ok[i] = 1;
        }
    }
    {
        const float ratio = (float)ratio_d, iratio = 1.0f - ratio;
        const uint8_t *tab = have_tables ? (const uint8_t *)tables.buf : NULL;
        uint8_t *planes = have_out ? (uint8_t *)out.buf : NULL;
        float *fl = have_floats ? (float *)floats.buf : NULL;
        Py_ssize_t plane = (Py_ssize_t)size * size;
        float *ra = rows, *rb = rows + 3 * size, *tmp = rows + 6 * size;
        Py_BEGIN_ALLOW_THREADS;
        for (int y = 0; y < size; y++) {
            layer_row(&layers[0], axis_ok[0] ? &axes[0] : NULL, size, y, ra, tmp);
            if (nl == 2) layer_row(&layers[1], axis_ok[1] ? &axes[1] : NULL, size, y, rb, tmp);
            int yo = flip_ud ? size - 1 - y : y;
            for (int x = 0; x < size; x++) {
                int xo = flip_lr ? size - 1 - x : x;
                float val[3];
                for (int c = 0; c < 3; c++) {
                    if (nl == 2) val[c] = (ra[3 * x + c] + FILL) * ratio + (rb[3 * x + c] + FILL) * iratio;
                    else val[c] = ra[3 * x + c] + FILL;
                }
                Py_ssize_t o = (Py_ssize_t)yo * size + xo;
                if (fl) fl[3 * o] = val[0], fl[3 * o + 1] = val[1], fl[3 * o + 2] = val[2];
                if (planes) {
                    uint8_t rgb[3] = {quant(val[2]), quant(val[1]), quant(val[0])};
                    if (tab) hsv_px(rgb, tab);
                    planes[o] = rgb[0], planes[plane + o] = rgb[1], planes[2 * plane + o] = rgb[2];
                }
            }
        }
        Py_END_ALLOW_THREADS;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    for (int i = 0; i < nl; i++)
        if (axis_ok[i]) axis_free(&axes[i]);
    free(rows);
    for (int i = 0; i < nparsed; i++) release_layer(&layers[i]);
    if (have_out) PyBuffer_Release(&out);
    if (have_floats) PyBuffer_Release(&floats);
    if (have_tables) PyBuffer_Release(&tables);
    return result;
}

static PyObject *py_hsv(PyObject *self, PyObject *args) {
    PyObject *img_obj, *tables_obj;
    if (!PyArg_ParseTuple(args, "OO", &img_obj, &tables_obj)) return NULL;
    Py_buffer img, tables;
    if (get_buffer(img_obj, &img, 1, "image") < 0) return NULL;
    if (get_buffer(tables_obj, &tables, 0, "tables") < 0) {
        PyBuffer_Release(&img);
        return NULL;
    }
    PyObject *result = NULL;
    if (img.itemsize != 1 || img.len % 3 || !PyBuffer_IsContiguous(&img, 'C') || tables.len != 768) {
        PyErr_SetString(PyExc_ValueError, "image must be uint8 (..., 3) C-contiguous and tables 3 x 256 bytes");
    } else {
        uint8_t *p = (uint8_t *)img.buf;
        const uint8_t *tab = (const uint8_t *)tables.buf;
        Py_ssize_t n = img.len / 3;
        Py_BEGIN_ALLOW_THREADS;
        for (Py_ssize_t i = 0; i < n; i++) hsv_px(p + 3 * i, tab);
        Py_END_ALLOW_THREADS;
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&img);
    PyBuffer_Release(&tables);
    return result;
}

static PyMethodDef methods[] = {
    {"render", py_render, METH_VARARGS, "render(size, out, floats, layers, flip_ud, flip_lr, ratio, tables): one sample in one pass"},
    {"hsv", py_hsv, METH_VARARGS, "hsv(image, tables): the integer HSV jitter, in place on uint8 (..., 3) RGB"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernel", "The fused render kernel (see kernel.py).", -1, methods};

PyMODINIT_FUNC PyInit__kernel(void) {
    hsv_init();
    return PyModule_Create(&module);
}
