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
 *     layers  1 or 2 tuples (inverse: 9 floats, tiles: tuple, mask: uint8 (size, size) or None
 *             [, pastes: tuple of (mask uint8 (size, size), layer tuple)])
 *             tile = (image (h, w, 3) float32 or uint8, rows C-contiguous per pixel,
 *                     ox, oy, xa0, ya0, xa1, ya1)
 *             a paste's layer is rendered like a layer (steps 2-5) and replaces the
 *             values where its mask is set (copy-paste from a partner, cutmix)
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

/* Four float lanes: SSE2 (every x86-64 CPU has it) or a plain struct. Each lane operation
 * is the same single IEEE-754 operation either way, so both give the same bytes. */
#if defined(__SSE2__) && !defined(PIXPOOL_SCALAR)
#include <emmintrin.h>
typedef __m128 v4;
#define V_LOAD(p) _mm_loadu_ps(p)
#define V_STORE(p, a) _mm_storeu_ps(p, a)
#define V_SET(x) _mm_set1_ps(x)
#define V_ADD(a, b) _mm_add_ps(a, b)
#define V_SUB(a, b) _mm_sub_ps(a, b)
#define V_MUL(a, b) _mm_mul_ps(a, b)
#define V_DIV(a, b) _mm_div_ps(a, b)
#define V_MAX(a, b) _mm_max_ps(a, b)
#define V_MIN(a, b) _mm_min_ps(a, b)
#define V_EQ(a, b) _mm_cmpeq_ps(a, b)
#define V_GE(a, b) _mm_cmpge_ps(a, b)
#define V_SEL(m, a, b) _mm_or_ps(_mm_and_ps(m, a), _mm_andnot_ps(m, b))
#define V_ANDNOT(m, a) _mm_andnot_ps(m, a) /* a where m is clear */
#define V_AND(m, a) _mm_and_ps(m, a)
#define V_ABS(a) _mm_andnot_ps(_mm_set1_ps(-0.0f), a)
#define V_TRUNC(a) _mm_cvtepi32_ps(_mm_cvttps_epi32(a)) /* positive values below 2^31 */
static inline void v_store_i32(int32_t *p, v4 a) { _mm_storeu_si128((__m128i *)p, _mm_cvttps_epi32(a)); }
static inline v4 v_load_u8(const uint8_t *p) { /* 4 bytes -> 4 floats */
    int32_t w;
    memcpy(&w, p, 4);
    __m128i z = _mm_setzero_si128();
    return _mm_cvtepi32_ps(_mm_unpacklo_epi16(_mm_unpacklo_epi8(_mm_cvtsi32_si128(w), z), z));
}
/* 16 floats -> 16 bytes, each rint (ties to even, the default mode) saturated to 0..255. */
static inline void v_quant16(const float *src, uint8_t *dst) {
    __m128i a = _mm_cvtps_epi32(_mm_loadu_ps(src)), b = _mm_cvtps_epi32(_mm_loadu_ps(src + 4));
    __m128i c = _mm_cvtps_epi32(_mm_loadu_ps(src + 8)), d = _mm_cvtps_epi32(_mm_loadu_ps(src + 12));
    _mm_storeu_si128((__m128i *)dst, _mm_packus_epi16(_mm_packs_epi32(a, b), _mm_packs_epi32(c, d)));
}
#else
typedef struct { float f[4]; } v4;
#define V_OP2(name, expr)                                   \
    static inline v4 name(v4 a, v4 b) {                     \
        v4 r;                                               \
        for (int i = 0; i < 4; i++) r.f[i] = (expr);        \
        return r;                                           \
    }
V_OP2(V_ADD, a.f[i] + b.f[i])
V_OP2(V_SUB, a.f[i] - b.f[i])
V_OP2(V_MUL, a.f[i] * b.f[i])
V_OP2(V_DIV, a.f[i] / b.f[i])
V_OP2(V_MAX, a.f[i] > b.f[i] ? a.f[i] : b.f[i])
V_OP2(V_MIN, a.f[i] < b.f[i] ? a.f[i] : b.f[i])
V_OP2(V_EQ, a.f[i] == b.f[i] ? 1.0f : 0.0f)
V_OP2(V_GE, a.f[i] >= b.f[i] ? 1.0f : 0.0f)
V_OP2(V_ANDNOT, a.f[i] != 0.0f ? 0.0f : b.f[i])
V_OP2(V_AND, a.f[i] != 0.0f ? b.f[i] : 0.0f)
static inline v4 V_SEL(v4 m, v4 a, v4 b) {
    v4 r;
    for (int i = 0; i < 4; i++) r.f[i] = m.f[i] != 0.0f ? a.f[i] : b.f[i];
    return r;
}
static inline v4 V_LOAD(const float *p) { v4 r; memcpy(r.f, p, 16); return r; }
static inline void V_STORE(float *p, v4 a) { memcpy(p, a.f, 16); }
static inline v4 V_SET(float x) { v4 r = {{x, x, x, x}}; return r; }
static inline v4 V_TRUNC(v4 a) { v4 r; for (int i = 0; i < 4; i++) r.f[i] = (float)(int32_t)a.f[i]; return r; }
static inline void v_store_i32(int32_t *p, v4 a) { for (int i = 0; i < 4; i++) p[i] = (int32_t)a.f[i]; }
static inline v4 v_load_u8(const uint8_t *p) { v4 r; for (int i = 0; i < 4; i++) r.f[i] = (float)p[i]; return r; }
static inline void v_quant16(const float *src, uint8_t *dst) {
    for (int i = 0; i < 16; i++) {
        long q = lrintf(src[i]);
        dst[i] = (uint8_t)(q < 0 ? 0 : q > 255 ? 255 : q);
    }
}
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(PIXPOOL_SCALAR)
#define HAVE_AVX2_PATH 1
#define HAVE_AVX512_PATH 1
#endif
/* 1 when the CPU has AVX2 (and PIXPOOL_KERNEL_SSE2 is unset): the 8-lane versions of the
 * row loops below run. They do the same lane operations per output value (no FMA, same
 * order), so the bytes do not depend on it. */
static int lanes8;
/* 1 when the CPU also has AVX-512F (lanes8 is then 1 too): the fill/quantise/HSV rows run
 * 16 pixels a step (out_row_avx512), with the same lane operations. */
static int lanes16;

#define MAX_TILES 4
#define CLS_ZERO (-1)
#define CLS_MIXED (-2)

typedef struct {
    const char *base; /* pixel (0, 0) */
    const char *end;  /* one past the image's last byte: no vector load reaches beyond it */
    Py_ssize_t row;   /* bytes per row */
    int u8;           /* uint8 pixels (else float32) */
    float fill;       /* what a uint8 tap subtracts: the caller's fill (the snapshot header's) */
    int ox, oy;       /* canvas position of pixel (0, 0) */
    int xa0, ya0, xa1, ya1;
    int yfast; /* the last y0 whose vector reads of taps up to x0 = xa1 - 2 stay inside the image */
} Tile;

#define MAX_PASTES 4
#define STRIP 16 /* output rows a layer renders at a time */
struct Paste;
typedef struct Layer {
    double m[9];
    Tile tiles[MAX_TILES];
    int ntiles;
    int bx0, by0, bx1, by1; /* union of the tile rectangles */
    const uint8_t *mask;
    Py_buffer views[MAX_TILES + 1];
    int nviews;
    struct Paste *pastes; /* npastes of them, applied in order after the mask */
    int npastes;
} Layer;

static inline float tap(const Tile *t, int cx, int cy, int c) {
    const char *p = t->base + (Py_ssize_t)(cy - t->oy) * t->row;
    Py_ssize_t i = (Py_ssize_t)(cx - t->ox) * 3 + c;
    if (t->u8) return (float)((const uint8_t *)p)[i] - t->fill;
    return ((const float *)p)[i];
}

static inline int tile_at(const Layer *L, int cx, int cy) {
    for (int k = 0; k < L->ntiles; k++) {
        const Tile *t = &L->tiles[k];
        if (cx >= t->xa0 && cx < t->xa1 && cy >= t->ya0 && cy < t->ya1) return k;
    }
    return -1;
}

/* Step 3's fixed point: a canvas coordinate rounded to the nearest 1/32 (ties to even, the
 * default mode; 32 c and the division by 32 are exact), so the weights of step 4 have 5
 * fractional bits and, on integer taps, step 5's float32 products and sums are exact: the
 * integer bilinear with weights summing to 1024, whatever the order. Every map's u and v
 * pass through it where they are computed; it is idempotent and monotonic (non-decreasing),
 * so the spans and segment decisions made on its values stay exact. */
static inline double grid_q(double c) {
    /* rint by the 1.5 * 2^52 sum (exact, ties to even, for |32 c| < 2^51; beyond, some value as
     * far off the canvas, and still monotonic): no libm call in the per-column loops */
    const double magic = 6755399441055744.0;
    return ((c * 32.0 + magic) - magic) / 32.0;
}

/* One pixel from canvas coordinates (u, v) on the grid: bilinear over the four taps, 0 off every tile. */
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

/* Bilinear from one tile that holds all four taps; writes dst[0..3] (dst[3] is scratch: the
 * next pixel's slot or the row's padding, written again later). */
static inline __attribute__((always_inline)) void bilerp_tile(const Tile *t, int x0, int y0, v4 fx, v4 ifx, v4 fy, v4 ify, float *dst) {
    const char *r0 = t->base + (Py_ssize_t)(y0 - t->oy) * t->row;
    Py_ssize_t o = (Py_ssize_t)(x0 - t->ox) * 3;
    v4 p00, p01, p10, p11;
    if (t->u8) {
        const uint8_t *a = (const uint8_t *)r0 + o, *b = (const uint8_t *)(r0 + t->row) + o;
        if ((const char *)(b + 7) > t->end) goto scalar;
        const v4 fill = V_SET(t->fill);
        p00 = V_SUB(v_load_u8(a), fill), p01 = V_SUB(v_load_u8(a + 3), fill);
        p10 = V_SUB(v_load_u8(b), fill), p11 = V_SUB(v_load_u8(b + 3), fill);
    } else {
        const float *a = (const float *)r0 + o, *b = (const float *)(r0 + t->row) + o;
        if ((const char *)(b + 7) > t->end) goto scalar;
        p00 = V_LOAD(a), p01 = V_LOAD(a + 3), p10 = V_LOAD(b), p11 = V_LOAD(b + 3);
    }
    {
        v4 top = V_ADD(V_MUL(p00, ifx), V_MUL(p01, fx));
        v4 bot = V_ADD(V_MUL(p10, ifx), V_MUL(p11, fx));
        V_STORE(dst, V_ADD(V_MUL(top, ify), V_MUL(bot, fy)));
    }
    return;
scalar : {
    float sfx, sifx, sfy, sify, tmp[4];
    V_STORE(tmp, fx), sfx = tmp[0];
    V_STORE(tmp, ifx), sifx = tmp[0];
    V_STORE(tmp, fy), sfy = tmp[0];
    V_STORE(tmp, ify), sify = tmp[0];
    for (int c = 0; c < 3; c++) {
        float top = tap(t, x0, y0, c) * sifx + tap(t, x0 + 1, y0, c) * sfx;
        float bot = tap(t, x0, y0 + 1, c) * sifx + tap(t, x0 + 1, y0 + 1, c) * sfx;
        dst[c] = top * sify + bot * sfy;
    }
}
}

static inline int holds_taps(const Tile *t, int x0, int y0) { return x0 >= t->xa0 && x0 + 1 < t->xa1 && y0 >= t->ya0 && y0 + 1 < t->ya1; }

/* The axis-aligned map, separably. u depends on x alone and v on y alone, so the definition's
 * "top" and "bot" of output pixel (x, y) are the horizontal blends of canvas rows y0 and
 * y0 + 1 at column x: H_r[x] = T(x0, r) (1 - fx) + T(x0 + 1, r) fx, a function of (r, x).
 * Each canvas row's H is computed once and kept (two slots: rows r and r + 1 differ in
 * parity), and every output row is one dense blend s = H_y0 (1 - fy) + H_y0+1 fy over its
 * 3 S floats: the same operations in the same order as the definition, shared by the output
 * rows that read the same canvas row (all of them twice when the map enlarges). */
typedef struct {
    int *x0;
    float *fx, *ifx;
    signed char *valid;
    int *cls;     /* per column: tile index of both taps of the cached row key, CLS_ZERO or CLS_MIXED */
    int *runs;    /* (start, end, cls) triples */
    int nruns;
    int key;      /* tile coverage bits the runs were built for, -1 = none */
    float *h[2];  /* H of canvas row tag[r & 1], 3 S (+ padding) floats each */
    int tag[2];
    float *w4;    /* with lanes8: ifx of each column 4 times (4 S floats), then fx likewise: the 8-lane weights */
    /* The integer rows (with lanes8; uint8 tiles, one layer, uint8 output only): per column the
     * weight pair (32 - ax, ax) 4 times as bytes, and per canvas row its H in raw pixel units
     * times 32, B G R + scratch as int16 per column, in two slots as h. */
    int8_t *wb;
    int16_t *ih[2];
    int itag[2];
    /* With a copy-paste mask on the direct rows: the two rows an output row blends with its
     * masked columns taken from the mirrored ones (float H rows, then integer H rows). */
    float *mh[2];
    int16_t *mih[2];
} Axis;

#ifdef HAVE_AVX2_PATH
static void axis_blend_avx2(const float *top, const float *bot, float fy, float ify, int n, float *dst);
static int axis_irun_avx2(const int8_t *wb, const int *x0, int xs, int xe, const uint8_t *a0, int16_t *dst, Py_ssize_t ahead);
static int axis_run_avx2(const float *wi, const float *wf, const int *x0, int xs, int xe, const char *a0, int u8, float fill, float *dst, Py_ssize_t ahead);
#endif

static int axis_init(Axis *A, const Layer *L, int size) {
    A->x0 = malloc(sizeof(int) * size);
    A->fx = malloc(sizeof(float) * size);
    A->ifx = malloc(sizeof(float) * size);
    A->valid = malloc(size);
    A->cls = malloc(sizeof(int) * size);
    A->runs = malloc(sizeof(int) * 3 * size);
    A->h[0] = calloc(6 * (size_t)size + 128, sizeof(float)); /* padding: the 16-pixel groups of out_row_avx512 read up to 45 past 3 S */
    A->h[1] = A->h[0] ? A->h[0] + 3 * (size_t)size + 64 : NULL;
    A->key = -1, A->tag[0] = A->tag[1] = INT32_MIN;
    A->nruns = 0;
    A->w4 = lanes8 ? malloc(sizeof(float) * 8 * ((size_t)size + 1)) : NULL;
    A->wb = lanes8 ? malloc(8 * ((size_t)size + 4)) : NULL;
    /* each slot 4 (S + 8) int16: the output loop reads 8 pixels a step, up to 7 past S */
    A->ih[0] = lanes8 ? calloc(8 * ((size_t)size + 8), sizeof(int16_t)) : NULL;
    A->ih[1] = A->ih[0] ? A->ih[0] + 4 * ((size_t)size + 8) : NULL;
    A->itag[0] = A->itag[1] = INT32_MIN;
    const int mirror = lanes8 && L->mask;
    A->mh[0] = mirror ? malloc(sizeof(float) * (6 * (size_t)size + 128)) : NULL;
    A->mh[1] = A->mh[0] ? A->mh[0] + 3 * (size_t)size + 64 : NULL;
    A->mih[0] = mirror ? malloc(sizeof(int16_t) * 8 * ((size_t)size + 8)) : NULL;
    A->mih[1] = A->mih[0] ? A->mih[0] + 4 * ((size_t)size + 8) : NULL;
    if ((mirror && (!A->mh[0] || !A->mih[0])) || !A->x0 || !A->fx || !A->ifx || !A->valid || !A->cls || !A->runs || !A->h[0] || (lanes8 && (!A->w4 || !A->wb || !A->ih[0]))) return -1;
    const double a = L->m[0], c = L->m[2];
    for (int x = 0; x < size; x++) {
        const double u = grid_q(a * (double)x + c); /* = a*x + (b*y + c) with b = 0, on the 1/32 grid */
        int ok = u >= L->bx0 - 1 && u < L->bx1;
        A->valid[x] = (signed char)ok;
        double xf = ok ? floor(u) : 0.0;
        A->x0[x] = (int)xf;
        A->fx[x] = ok ? (float)(u - xf) : 0.0f;
        A->ifx[x] = 1.0f - A->fx[x];
        if (A->w4)
            for (int k = 0; k < 4; k++) A->w4[4 * x + k] = A->ifx[x], A->w4[4 * ((Py_ssize_t)size + x) + k] = A->fx[x];
        if (A->wb) {
            const int ax = (int)(A->fx[x] * 32.0f); /* exact: fx is a multiple of 1/32 */
            for (int k = 0; k < 4; k++) A->wb[8 * x + 2 * k] = (int8_t)(32 - ax), A->wb[8 * x + 2 * k + 1] = (int8_t)ax;
        }
    }
    return 0;
}

static void axis_free(Axis *A) {
    free(A->x0), free(A->fx), free(A->ifx), free(A->valid), free(A->cls), free(A->runs), free(A->h[0]), free(A->w4);
    free(A->wb), free(A->ih[0]), free(A->mh[0]), free(A->mih[0]);
}

static int row_bits(const Layer *L, int cy) {
    int bits = 0;
    for (int k = 0; k < L->ntiles; k++)
        if (cy >= L->tiles[k].ya0 && cy < L->tiles[k].ya1) bits |= 1 << k;
    return bits;
}

/* Runs of the columns of a canvas row r whose two taps lie in one tile, in none, or mixed. */
static void axis_runs(Axis *A, const Layer *L, int size, int r) {
    for (int x = 0; x < size; x++) {
        if (!A->valid[x]) {
            A->cls[x] = CLS_ZERO;
            continue;
        }
        int x0 = A->x0[x];
        int t0 = tile_at(L, x0, r), t1 = tile_at(L, x0 + 1, r);
        A->cls[x] = t0 == t1 ? (t0 >= 0 ? t0 : CLS_ZERO) : CLS_MIXED;
    }
    A->nruns = 0;
    int start = 0;
    for (int x = 1; x <= size; x++) {
        if (x == size || A->cls[x] != A->cls[start]) {
            int *run = &A->runs[3 * A->nruns++];
            run[0] = start, run[1] = x, run[2] = A->cls[start];
            start = x;
        }
    }
}

/* H of canvas row r into dst (3 S floats; dst[3 S] is scratch). */
static void axis_hrow(Axis *A, const Layer *L, int size, int r, float *dst) {
    const int key = row_bits(L, r);
    if (!key) {
        memset(dst, 0, sizeof(float) * 3 * size);
        return;
    }
    if (key != A->key) {
        axis_runs(A, L, size, r);
        A->key = key;
    }
    for (int n = 0; n < A->nruns; n++) {
        const int *run = &A->runs[3 * n];
        if (run[2] == CLS_ZERO) {
            memset(dst + 3 * run[0], 0, sizeof(float) * 3 * (run[1] - run[0]));
        } else if (run[2] == CLS_MIXED) {
            for (int x = run[0]; x < run[1]; x++) {
                const int x0 = A->x0[x], t0 = tile_at(L, x0, r), t1 = tile_at(L, x0 + 1, r);
                for (int c = 0; c < 3; c++) {
                    const float p0 = t0 >= 0 ? tap(&L->tiles[t0], x0, r, c) : 0.0f;
                    const float p1 = t1 >= 0 ? tap(&L->tiles[t1], x0 + 1, r, c) : 0.0f;
                    dst[3 * x + c] = p0 * A->ifx[x] + p1 * A->fx[x];
                }
            }
        } else {
            const Tile *t = &L->tiles[run[2]];
            const char *rp = t->base + (Py_ssize_t)(r - t->oy) * t->row;
            /* x0 is monotonic in x (floor of a linear map): if the vector reads at both ends
             * stay inside the image, every pixel's do, and the loop needs no test. */
            const Py_ssize_t last = (A->x0[run[0]] > A->x0[run[1] - 1] ? A->x0[run[0]] : A->x0[run[1] - 1]) - t->ox;
            const Py_ssize_t esz = t->u8 ? 1 : 4;
            /* The source is read once per sample, from memory: fetch a row ahead while this
             * row computes. A hint only; the values do not depend on it. The vector loop
             * fetches row r + 3 one line per column pair as it goes (measured 0.82-0.88x the
             * kernel's time on float32 sources against the whole span of row r + 2 fetched
             * here in one burst, whose prefetches stalled on the full line-fill buffers);
             * the scalar loops below keep the burst. */
            const int vector_run = A->w4 && rp + (last * 3 + 7) * esz <= t->end;
            if (r + 2 < t->ya1 && !vector_run) {
                const Py_ssize_t first = (A->x0[run[0]] < A->x0[run[1] - 1] ? A->x0[run[0]] : A->x0[run[1] - 1]) - t->ox;
                const char *p0 = rp + 2 * t->row + first * 3 * esz, *p1 = rp + 2 * t->row + (last * 3 + 6) * esz;
                for (const char *p = p0; p < p1 + 64; p += 64) __builtin_prefetch(p);
            }
            int xs = run[0];
#ifdef HAVE_AVX2_PATH
            if (vector_run) /* it prefetches row r + 3 as it goes */
                xs = axis_run_avx2(A->w4, A->w4 + 4 * (Py_ssize_t)size, A->x0, xs, run[1], rp - (Py_ssize_t)t->ox * 3 * esz, t->u8, t->fill, dst, r + 3 < t->ya1 ? 3 * t->row : 0);
#endif
            if (rp + (last * 3 + 7) * esz > t->end) {
                for (int x = run[0]; x < run[1]; x++)
                    for (int c = 0; c < 3; c++) dst[3 * x + c] = tap(t, A->x0[x], r, c) * A->ifx[x] + tap(t, A->x0[x] + 1, r, c) * A->fx[x];
            } else if (t->u8) {
                const uint8_t *a0 = (const uint8_t *)rp - (Py_ssize_t)t->ox * 3;
                const v4 fill = V_SET(t->fill);
                for (int x = xs; x < run[1]; x++) {
                    const uint8_t *a = a0 + (Py_ssize_t)A->x0[x] * 3;
                    V_STORE(dst + 3 * x, V_ADD(V_MUL(V_SUB(v_load_u8(a), fill), V_SET(A->ifx[x])), V_MUL(V_SUB(v_load_u8(a + 3), fill), V_SET(A->fx[x]))));
                }
            } else {
                const float *a0 = (const float *)rp - (Py_ssize_t)t->ox * 3;
                for (int x = xs; x < run[1]; x++) {
                    const float *a = a0 + (Py_ssize_t)A->x0[x] * 3;
                    V_STORE(dst + 3 * x, V_ADD(V_MUL(V_LOAD(a), V_SET(A->ifx[x])), V_MUL(V_LOAD(a + 3), V_SET(A->fx[x]))));
                }
            }
        }
    }
}

static const float *axis_h(Axis *A, const Layer *L, int size, int r) {
    const int slot = r & 1;
    if (A->tag[slot] != r) {
        axis_hrow(A, L, size, r, A->h[slot]);
        A->tag[slot] = r;
    }
    return A->h[slot];
}

/* The two H rows output row y blends and its weight fy; 0 when the row reads no canvas row
 * (all zeros). */
static int axis_pair(Axis *A, const Layer *L, int size, int y, const float **top, const float **bot, float *fy) {
    const double v = grid_q(L->m[4] * (double)y + L->m[5]); /* = d*x + (e*y + f) with d = 0, on the 1/32 grid */
    if (!(v >= L->by0 - 1 && v < L->by1)) return 0;
    double yf = floor(v);
    int r0 = (int)yf;
    *fy = (float)(v - yf);
    *top = axis_h(A, L, size, r0), *bot = axis_h(A, L, size, r0 + 1);
    return 1;
}

static void axis_row(Axis *A, const Layer *L, int size, int y, float *dst) {
    const float *top, *bot;
    float fy;
    if (!axis_pair(A, L, size, y, &top, &bot, &fy)) {
        memset(dst, 0, sizeof(float) * 3 * size);
        return;
    }
    const float ify = 1.0f - fy;
#ifdef HAVE_AVX2_PATH
    if (lanes8) {
        axis_blend_avx2(top, bot, fy, ify, 3 * size, dst);
        return;
    }
#endif
    const v4 vfy = V_SET(fy), vify = V_SET(ify);
    const int n3 = 3 * size;
    for (int i = 0; i < n3; i += 4) V_STORE(dst + i, V_ADD(V_MUL(V_LOAD(top + i), vify), V_MUL(V_LOAD(bot + i), vfy)));
}

/* ---- The axis map in integers (uint8 tiles): the same values as the float rows above ----
 * On the 1/32 grid the float32 steps 4-5 are exact on integer taps, so they are the integer
 * bilinear: with p the raw pixels (the fill F where no tile covers a tap) and ax, ay the
 * weights in 1/32, H_r[x] = p(x0, r) (32 - ax) + p(x0 + 1, r) ax (at most 255 * 32: int16)
 * and s = H_y0 (32 - ay) + H_y0+1 ay, at most 255 * 1024, which is 1024 (f of step 6).
 * Step 7's rint(f), ties to even, is then (s + 511 + ((s >> 10) & 1)) >> 10, already in
 * 0..255 (computed as cvtps2dq of the exact float32 s / 1024: fewer operations). */
static inline int tap_raw(const Tile *t, int cx, int cy, int c) {
    return ((const uint8_t *)(t->base + (Py_ssize_t)(cy - t->oy) * t->row))[(Py_ssize_t)(cx - t->ox) * 3 + c];
}

/* H of canvas row r in integers into dst (4 S int16: B G R + scratch per column); F = fill. */
static void axis_ihrow(Axis *A, const Layer *L, int size, int r, int fill, int16_t *dst) {
    const int key = row_bits(L, r);
    if (key && key != A->key) {
        axis_runs(A, L, size, r);
        A->key = key;
    }
    const int nruns = key ? A->nruns : 1;
    for (int n = 0; n < nruns; n++) {
        const int zero_run[3] = {0, size, CLS_ZERO};
        const int *run = key ? &A->runs[3 * n] : zero_run;
        if (run[2] == CLS_ZERO) { /* 32 F in all 4 lanes of each column: one 64-bit pattern (the compiler widens the loop) */
            const uint64_t f4 = (uint64_t)(uint16_t)(32 * fill) * 0x0001000100010001ull;
            const int xa = run[0], xb = run[1]; /* in locals: a store through dst may alias run */
            for (int x = xa; x < xb; x++) memcpy(dst + 4 * x, &f4, 8);
        } else if (run[2] == CLS_MIXED) {
            for (int x = run[0]; x < run[1]; x++) {
                const int x0 = A->x0[x], t0 = tile_at(L, x0, r), t1 = tile_at(L, x0 + 1, r), ax = A->wb[8 * x + 1];
                for (int c = 0; c < 3; c++) {
                    const int p0 = t0 >= 0 ? tap_raw(&L->tiles[t0], x0, r, c) : fill;
                    const int p1 = t1 >= 0 ? tap_raw(&L->tiles[t1], x0 + 1, r, c) : fill;
                    dst[4 * x + c] = (int16_t)(p0 * (32 - ax) + p1 * ax);
                }
            }
        } else {
            const Tile *t = &L->tiles[run[2]];
            const char *rp = t->base + (Py_ssize_t)(r - t->oy) * t->row;
            const Py_ssize_t last = (A->x0[run[0]] > A->x0[run[1] - 1] ? A->x0[run[0]] : A->x0[run[1] - 1]) - t->ox;
            const uint8_t *a0 = (const uint8_t *)rp - (Py_ssize_t)t->ox * 3;
            int xs = run[0];
#ifdef HAVE_AVX2_PATH
            if (rp + last * 3 + 8 <= t->end) /* it prefetches row r + 3 as it goes */
                xs = axis_irun_avx2(A->wb, A->x0, xs, run[1], a0, dst, r + 3 < t->ya1 ? 3 * t->row : 0);
#endif
            for (int x = xs; x < run[1]; x++) {
                const int x0 = A->x0[x], ax = A->wb[8 * x + 1];
                for (int c = 0; c < 3; c++) dst[4 * x + c] = (int16_t)(tap_raw(t, x0, r, c) * (32 - ax) + tap_raw(t, x0 + 1, r, c) * ax);
            }
        }
    }
}

/* The two integer H rows output row y blends and its weight ay (in 1/32); 0 when the row
 * reads no canvas row (every value the fill). */
static int axis_ipair(Axis *A, const Layer *L, int size, int y, int fill, const int16_t **top, const int16_t **bot, int *ay) {
    const double v = grid_q(L->m[4] * (double)y + L->m[5]);
    if (!(v >= L->by0 - 1 && v < L->by1)) return 0;
    const double yf = floor(v);
    const int r0 = (int)yf;
    *ay = (int)((v - yf) * 32.0);
    for (int k = 0; k < 2; k++) {
        const int r = r0 + k, slot = r & 1;
        if (A->itag[slot] != r) {
            axis_ihrow(A, L, size, r, fill, A->ih[slot]);
            A->itag[slot] = r;
        }
    }
    *top = A->ih[r0 & 1], *bot = A->ih[(r0 + 1) & 1];
    return 1;
}

/* Copy-paste on the direct rows (AVX2 only, as those rows): the value at a masked column x is
 * the row's value at S-1-x, and an output row's value at any column is the blend of its two H
 * rows there, so blending two rows whose masked columns were taken from the mirrored ones gives
 * the same values as blending first and mirroring after (apply_mask). Rows whose mask row is
 * clear stay as they are. px: bytes per column; n: the rows' bytes, padding included. */
#ifdef HAVE_AVX2_PATH
static int mask_any(const uint8_t *mrow, int size) { /* OR of the row's bytes: the compiler widens it */
    uint64_t acc = 0;
    int x = 0;
    for (; x + 8 <= size; x += 8) {
        uint64_t w;
        memcpy(&w, mrow + x, 8);
        acc |= w;
    }
    for (; x < size; x++) acc |= mrow[x];
    return acc != 0;
}

static void mirror_masked(const uint8_t *mrow, int size, size_t px, const void *src, void *dst, size_t n) {
    const char *s = (const char *)src;
    char *d = (char *)dst;
    memcpy(d, s, n);
    for (int x = 0; x < size; x++)
        if (mrow[x]) memcpy(d + px * x, s + px * (size - 1 - x), px);
}

static void mirror_masked_i_avx2(const uint8_t *mrow, int size, const int16_t *src, int16_t *dst);

static void masked_pair(Axis *A, const Layer *L, int size, int y, const float **top, const float **bot) {
    const uint8_t *mrow = L->mask + (Py_ssize_t)y * size;
    if (!mask_any(mrow, size)) return;
    const size_t n = sizeof(float) * (3 * (size_t)size + 64);
    mirror_masked(mrow, size, 3 * sizeof(float), *top, A->mh[0], n);
    mirror_masked(mrow, size, 3 * sizeof(float), *bot, A->mh[1], n);
    *top = A->mh[0], *bot = A->mh[1];
}

static void masked_ipair(Axis *A, const Layer *L, int size, int y, const int16_t **top, const int16_t **bot) {
    const uint8_t *mrow = L->mask + (Py_ssize_t)y * size;
    if (!mask_any(mrow, size)) return;
    mirror_masked_i_avx2(mrow, size, *top, A->mih[0]);
    mirror_masked_i_avx2(mrow, size, *bot, A->mih[1]);
    *top = A->mih[0], *bot = A->mih[1];
}
#endif

/* The general map (rotation, shear, perspective), one row segment of at most BLOCK output
 * columns at a time. The segment's two ends decide first (segment_class): when every column
 * reads all four taps from one tile, one loop with no test per pixel (general_uniform); when
 * no column reaches a tile, zeros. That is most segments: a row crosses a tile's edge once or
 * twice. The others take three passes over small arrays:
 *   1. coordinates: the definition's double-precision u, v for every column (the same
 *      operations per column, no tests; the division only for a perspective map);
 *   2. classes: per column the tile that holds all four taps (and whose vector reads stay
 *      inside its image), CLS_ZERO where no tap lies in a tile (outside, mosaic gaps: the
 *      bilinear of four zeros is 0), CLS_MIXED otherwise, computed with selects, and the
 *      byte offset of tap (x0, y0) in that tile;
 *   3. runs of one class: the one-tile bilinear with no test per pixel, zeros, or the per-tap
 *      lookup for the few boundary pixels. */
#define BLOCK 64
typedef struct {
    double u[BLOCK], v[BLOCK];
    int x0[BLOCK], y0[BLOCK], cls[BLOCK];
    float fx[BLOCK], fy[BLOCK];
    Py_ssize_t off[BLOCK];
} Segment;

static void general_coords(const Layer *L, int persp, int xa, int n, int y, Segment *S) {
    const double *m = L->m;
    const double yd = (double)y;
    const double cu = m[1] * yd + m[2], cv = m[4] * yd + m[5];
    if (persp) {
        const double cw = m[7] * yd + m[8];
        for (int i = 0; i < n; i++) {
            const double xd = (double)(xa + i), w = m[6] * xd + cw;
            S->u[i] = grid_q((m[0] * xd + cu) / w), S->v[i] = grid_q((m[3] * xd + cv) / w);
        }
    } else {
        for (int i = 0; i < n; i++) {
            const double xd = (double)(xa + i);
            S->u[i] = grid_q(m[0] * xd + cu), S->v[i] = grid_q(m[3] * xd + cv);
        }
    }
}

static void general_classes(const Layer *L, int n, Segment *S) {
    const double ulo = L->bx0 - 1, uhi = L->bx1, vlo = L->by0 - 1, vhi = L->by1;
    for (int i = 0; i < n; i++) {
        const double u = S->u[i], v = S->v[i];
        const int in = u >= ulo && u < uhi && v >= vlo && v < vhi; /* false for NaN too */
        const double uc = in ? u : 0.0, vc = in ? v : 0.0;         /* |uc|, |vc| < 2^31: floor by truncation */
        int x0 = (int)uc, y0 = (int)vc;
        x0 -= (double)x0 > uc, y0 -= (double)y0 > vc;
        int touch = 0; /* some tap lies in some tile: else the bilinear of four zeros */
        for (int k = 0; k < L->ntiles; k++) {
            const Tile *t = &L->tiles[k];
            touch |= x0 + 1 >= t->xa0 && x0 < t->xa1 && y0 + 1 >= t->ya0 && y0 < t->ya1;
        }
        int cls = in && touch ? CLS_MIXED : CLS_ZERO;
        for (int k = L->ntiles - 1; k >= 0; k--) cls = in && holds_taps(&L->tiles[k], x0, y0) ? k : cls;
        S->x0[i] = x0, S->y0[i] = y0, S->cls[i] = cls;
        S->fx[i] = (float)(uc - (double)x0), S->fy[i] = (float)(vc - (double)y0); /* exact subtraction */
    }
    for (int i = 0; i < n; i++) {
        const int k = S->cls[i];
        if (k < 0) continue;
        const Tile *t = &L->tiles[k];
        const Py_ssize_t esz = t->u8 ? 1 : 4;
        const Py_ssize_t off = (Py_ssize_t)(S->y0[i] - t->oy) * t->row + (Py_ssize_t)(S->x0[i] - t->ox) * 3 * esz;
        /* The vector reads of the lower taps end 7 elements past tap (x0, y0 + 1); at the
         * image's last pixel that is beyond the buffer, and the per-tap lookup takes it. */
        const int fits = t->base + off + t->row + 7 * esz <= t->end;
        S->off[i] = off, S->cls[i] = fits ? k : CLS_MIXED;
    }
}

static void general_run_u8(const Tile *t, const Segment *S, int i0, int i1, float *dst) {
    const uint8_t *base = (const uint8_t *)t->base;
    const Py_ssize_t row = t->row;
    const v4 fill = V_SET(t->fill), one = V_SET(1.0f);
    for (int i = i0; i < i1; i++) {
        const uint8_t *a = base + S->off[i], *b = a + row;
        const v4 fx = V_SET(S->fx[i]), fy = V_SET(S->fy[i]), ifx = V_SUB(one, fx), ify = V_SUB(one, fy);
        v4 top = V_ADD(V_MUL(V_SUB(v_load_u8(a), fill), ifx), V_MUL(V_SUB(v_load_u8(a + 3), fill), fx));
        v4 bot = V_ADD(V_MUL(V_SUB(v_load_u8(b), fill), ifx), V_MUL(V_SUB(v_load_u8(b + 3), fill), fx));
        V_STORE(dst + 3 * i, V_ADD(V_MUL(top, ify), V_MUL(bot, fy)));
    }
}

static void general_run_f32(const Tile *t, const Segment *S, int i0, int i1, float *dst) {
    const char *base = t->base;
    const Py_ssize_t row = t->row;
    const v4 one = V_SET(1.0f);
    for (int i = i0; i < i1; i++) {
        const float *a = (const float *)(base + S->off[i]), *b = (const float *)(base + S->off[i] + row);
        const v4 fx = V_SET(S->fx[i]), fy = V_SET(S->fy[i]), ifx = V_SUB(one, fx), ify = V_SUB(one, fy);
        v4 top = V_ADD(V_MUL(V_LOAD(a), ifx), V_MUL(V_LOAD(a + 3), fx));
        v4 bot = V_ADD(V_MUL(V_LOAD(b), ifx), V_MUL(V_LOAD(b + 3), fx));
        V_STORE(dst + 3 * i, V_ADD(V_MUL(top, ify), V_MUL(bot, fy)));
    }
}

/* Whether every column of the segment reads all four taps from tile k, with vector reads
 * inside its image (k), or none reaches any tile (CLS_ZERO), decided from its two ends;
 * CLS_MIXED: neither is certain, classify column by column. For an affine map u and v are
 * monotonic along the row (each rounded operation is), so the floors of the inner columns lie
 * between those of the ends. A perspective map's u and v are monotonic too where w > 0, up to
 * rounding (a few ulps): its ends must lie a whole pixel inside the box (``margin``). */
static int segment_class(const Layer *L, int persp, int xa, int n, int y) {
    const double *m = L->m;
    const double yd = (double)y, xe[2] = {(double)xa, (double)(xa + n - 1)};
    double u[2], v[2];
    for (int e = 0; e < 2; e++) {
        u[e] = m[0] * xe[e] + (m[1] * yd + m[2]), v[e] = m[3] * xe[e] + (m[4] * yd + m[5]);
        if (persp) {
            const double w = m[6] * xe[e] + (m[7] * yd + m[8]);
            if (!(w > 0.0)) return CLS_MIXED;
            u[e] = u[e] / w, v[e] = v[e] / w;
        }
        u[e] = grid_q(u[e]), v[e] = grid_q(v[e]);
        if (!(fabs(u[e]) < 1e9 && fabs(v[e]) < 1e9)) return CLS_MIXED; /* also NaN */
    }
    const int margin = persp ? 1 : 0;
    const double ulo = L->bx0 - 1 - margin, uhi = L->bx1 + margin, vlo = L->by0 - 1 - margin, vhi = L->by1 + margin;
    if ((u[0] < ulo && u[1] < ulo) || (u[0] >= uhi && u[1] >= uhi) || (v[0] < vlo && v[1] < vlo) || (v[0] >= vhi && v[1] >= vhi))
        return CLS_ZERO;
    const double x0a = floor(u[0]), x0b = floor(u[1]), y0a = floor(v[0]), y0b = floor(v[1]);
    const double xmin = (x0a < x0b ? x0a : x0b) - margin, xmax = (x0a < x0b ? x0b : x0a) + margin;
    const double ymin = (y0a < y0b ? y0a : y0b) - margin, ymax = (y0a < y0b ? y0b : y0a) + margin;
    /* Taps (x0 .. x0 + 1, y0 .. y0 + 1) of every column lie in [xmin, xmax + 1] x [ymin, ymax + 1]:
     * when that box meets no tile (a mosaic gap), every column is the bilinear of four zeros. */
    int touch = 0;
    for (int k = 0; k < L->ntiles; k++) {
        const Tile *t = &L->tiles[k];
        touch |= xmax + 1 >= t->xa0 && xmin < t->xa1 && ymax + 1 >= t->ya0 && ymin < t->ya1;
    }
    if (!touch) return CLS_ZERO;
    for (int k = 0; k < L->ntiles; k++) {
        const Tile *t = &L->tiles[k];
        /* Tiles are tried in order, as tile_at does: a column inside tile k is inside no earlier one. */
        if (xmin >= t->xa0 && xmax <= t->xa1 - 2 && ymin >= t->ya0 && ymax <= t->yfast && t->xa0 >= 0 && t->ya0 >= 0) {
            int earlier = 0;
            for (int j = 0; j < k; j++) earlier |= L->tiles[j].xa0 < t->xa1 && t->xa0 < L->tiles[j].xa1 && L->tiles[j].ya0 < t->ya1 && t->ya0 < L->tiles[j].ya1;
            return earlier ? CLS_MIXED : k;
        }
    }
    return CLS_MIXED;
}

/* A segment that reads only tile t: per column the definition's map, the floors (u, v >= 0
 * here, so truncation), the weights and the one-tile bilinear, with no test. */
#define UNIFORM_BODY(LOAD_TAPS)                                                                   \
    for (int i = 0; i < n; i++) {                                                                 \
        const double xd = (double)(xa + i);                                                       \
        double u = m[0] * xd + cu, v = m[3] * xd + cv;                                            \
        if (persp) {                                                                              \
            const double w = m[6] * xd + cw;                                                      \
            u = u / w, v = v / w;                                                                 \
        }                                                                                         \
        u = grid_q(u), v = grid_q(v);                                                             \
        const int x0 = (int)u, y0 = (int)v;                                                       \
        const v4 fx = V_SET((float)(u - (double)x0)), fy = V_SET((float)(v - (double)y0));        \
        const v4 ifx = V_SUB(one, fx), ify = V_SUB(one, fy);                                      \
        const Py_ssize_t off = (Py_ssize_t)y0 * row + (Py_ssize_t)x0 * step + origin;             \
        __builtin_prefetch((const char *)t->base + off + ahead);                                  \
        __builtin_prefetch((const char *)t->base + off + ahead + row);                            \
        v4 p00, p01, p10, p11;                                                                    \
        LOAD_TAPS;                                                                                \
        v4 top = V_ADD(V_MUL(p00, ifx), V_MUL(p01, fx));                                          \
        v4 bot = V_ADD(V_MUL(p10, ifx), V_MUL(p11, fx));                                          \
        V_STORE(dst + 3 * i, V_ADD(V_MUL(top, ify), V_MUL(bot, fy)));                             \
    }

#ifdef HAVE_AVX2_PATH
static int general_uniform_avx2(const Layer *L, const Tile *t, int persp, int xa, int n, int y, float *dst);
#endif

static void general_uniform(const Layer *L, const Tile *t, int persp, int xa, int n, int y, float *dst) {
#ifdef HAVE_AVX2_PATH
    if (lanes8) { /* whole groups of 8 columns in AVX2 lanes; the rest below */
        const int done = general_uniform_avx2(L, t, persp, xa, n, y, dst);
        xa += done, n -= done, dst += 3 * done;
    }
#endif
    const double *m = L->m;
    const double yd = (double)y, cu = m[1] * yd + m[2], cv = m[4] * yd + m[5], cw = m[7] * yd + m[8];
    const v4 one = V_SET(1.0f), fill = V_SET(t->fill);
    const Py_ssize_t row = t->row, step = t->u8 ? 3 : 12, origin = -(Py_ssize_t)t->oy * row - (Py_ssize_t)t->ox * step;
    /* Where the next output row reads (about u + m1, v + m4): fetched while this row computes.
     * A hint only; the values do not depend on it. */
    const double dv = m[4] > 0.0 ? m[4] : 0.0, du = m[1];
    const Py_ssize_t ahead = (Py_ssize_t)(dv + 1.0) * row + (Py_ssize_t)du * step;
    if (t->u8) {
        const uint8_t *base = (const uint8_t *)t->base;
        UNIFORM_BODY(const uint8_t *a = base + off; const uint8_t *b = a + row; p00 = V_SUB(v_load_u8(a), fill);
                     p01 = V_SUB(v_load_u8(a + 3), fill); p10 = V_SUB(v_load_u8(b), fill); p11 = V_SUB(v_load_u8(b + 3), fill))
    } else {
        const char *base = t->base;
        UNIFORM_BODY(const float *a = (const float *)(base + off); const float *b = (const float *)(base + off + row);
                     p00 = V_LOAD(a); p01 = V_LOAD(a + 3); p10 = V_LOAD(b); p11 = V_LOAD(b + 3))
    }
}

static void general_leaf(const Layer *L, int persp, int xa, int n, int y, float *dst, Segment *S);

/* Columns xa .. xa + n - 1 of output row y into dst (dst[3 i] is column xa + i). */
static void general_segment(const Layer *L, int persp, int xa, int n, int y, float *dst, Segment *S) {
    const int whole = segment_class(L, persp, xa, n, y);
    if (whole == CLS_ZERO) {
        memset(dst, 0, sizeof(float) * 3 * n);
        return;
    }
    if (whole >= 0) {
        general_uniform(L, &L->tiles[whole], persp, xa, n, y, dst);
        return;
    }
    if (n >= 16) { /* halves of whole 8-column groups: most of a segment that crosses a tile
                    * edge lies on one side of it (halving further was slower: more ends to decide) */
        const int h = (n / 2 + 7) & ~7;
        general_segment(L, persp, xa, h, y, dst, S);
        general_segment(L, persp, xa + h, n - h, y, dst + 3 * h, S);
        return;
    }
    general_leaf(L, persp, xa, n, y, dst, S);
}

/* general_segment's last step: classify each column (n <= BLOCK), then runs of one class. */
static void general_leaf(const Layer *L, int persp, int xa, int n, int y, float *dst, Segment *S) {
    general_coords(L, persp, xa, n, y, S);
    general_classes(L, n, S);
    for (int i0 = 0; i0 < n;) {
        const int k = S->cls[i0];
        int i1 = i0 + 1;
        while (i1 < n && S->cls[i1] == k) i1++;
        if (k == CLS_ZERO) memset(dst + 3 * i0, 0, sizeof(float) * 3 * (i1 - i0));
        else if (k == CLS_MIXED)
            for (int i = i0; i < i1; i++) sample_px(L, S->u[i], S->v[i], dst + 3 * i);
        else if (L->tiles[k].u8) general_run_u8(&L->tiles[k], S, i0, i1, dst);
        else general_run_f32(&L->tiles[k], S, i0, i1, dst);
        i0 = i1;
    }
}

/* A row's exact intervals. Along output row y the map is g(x) = (a x + c) / (p x + q) (the
 * definition's rounded operations; affine: g(x) = a x + c, no division), monotonic in x: each
 * rounded operation of an affine map is, and a perspective map is up to a few ulps where
 * w = p x + q > 0 (the thresholds then keep a whole pixel of margin, as segment_class does).
 * So the columns where g lies in [lo, hi) are one interval. Its ends are guessed by solving
 * g(x) = thr, then moved column by column until the exact values agree: the per-column
 * classification's own answer. */
typedef struct {
    double a, c, p, q;
    int persp, inc; /* inc: g non-decreasing along the row */
} RowMap;
static inline double row_at(const RowMap *g, int x) {
    const double xd = (double)x, u = g->a * xd + g->c;
    if (!g->persp) return grid_q(u);
    const double w = g->p * xd + g->q;
    return grid_q(u / w);
}
static int first_where(const RowMap *g, int n, double thr, int ge) {
    /* The first x in [0, n] from which (g(x) >= thr) == ge holds on (it holds on a suffix). */
    if (n == 0 || (row_at(g, 0) >= thr) == ge) return 0;
    if ((row_at(g, n - 1) >= thr) != ge) return n;
    /* The boundary lies inside: the solution of g(x) = thr on this branch (w > 0) is near it. */
    const double den = g->persp ? g->a - thr * g->p : g->a, num = g->persp ? thr * g->q - g->c : thr - g->c;
    const double guess = den != 0.0 ? num / den : 0.0;
    int x = !(guess > 1.0) ? 1 : guess >= (double)(n - 1) ? n - 1 : (int)ceil(guess); /* NaN: 1 */
    while (x > 0 && (row_at(g, x - 1) >= thr) == ge) x--;
    while (x < n && (row_at(g, x) >= thr) != ge) x++;
    return x;
}
static void row_interval(const RowMap *g, int n, double lo, double hi, int *x0, int *x1) {
    int b, e;
    if (g->inc) b = first_where(g, n, lo, 1), e = first_where(g, n, hi, 1);
    else b = first_where(g, n, hi, 0), e = first_where(g, n, lo, 0);
    *x0 = b < *x0 ? *x0 : b, *x1 = e > *x1 ? *x1 : e;
    if (*x1 < *x0) *x1 = *x0;
}

/* A run of columns [x0, x1) of an affine row: k >= 0, every tap in tile k (the one-tile loop);
 * CLS_ZERO, off the tiles' box; CLS_MIXED, what lies between (the columns whose taps straddle
 * an edge, mosaic gaps), which general_segment classifies. */
typedef struct {
    int x0, x1, k;
} Span;
#define MAX_SPANS (2 * MAX_TILES + 3)

/* The spans of output row y, left to right, covering [0, size); returns their number. */
static int row_spans(const Layer *L, int persp, int size, int y, Span *sp) {
    const double *m = L->m;
    const double yd = (double)y, cu = m[1] * yd + m[2], cv = m[4] * yd + m[5], cw = m[7] * yd + m[8];
    RowMap gu = {m[0], cu, m[6], cw, persp, 1}, gv = {m[3], cv, m[6], cw, persp, 1};
    const double ue[2] = {row_at(&gu, 0), row_at(&gu, size - 1)}, ve[2] = {row_at(&gv, 0), row_at(&gv, size - 1)};
    const double we[2] = {m[6] * 0.0 + cw, m[6] * (double)(size - 1) + cw};
    int n = 0;
    if (!(fabs(ue[0]) < 1e9 && fabs(ue[1]) < 1e9 && fabs(ve[0]) < 1e9 && fabs(ve[1]) < 1e9) /* also NaN */
        || (persp && !(we[0] > 0.0 && we[1] > 0.0))) {
        sp[n++] = (Span){0, size, CLS_MIXED};
        return n;
    }
    gu.inc = persp ? ue[1] >= ue[0] : m[0] >= 0.0, gv.inc = persp ? ve[1] >= ve[0] : m[3] >= 0.0;
    const double mg = persp ? 1.0 : 0.0;
    int b0 = 0, b1 = size; /* inside the box [bx0 - 1, bx1) x [by0 - 1, by1): else zeros */
    row_interval(&gu, size, L->bx0 - 1 - mg, L->bx1 + mg, &b0, &b1);
    row_interval(&gv, size, L->by0 - 1 - mg, L->by1 + mg, &b0, &b1);
    int s[MAX_TILES], e[MAX_TILES], ks[MAX_TILES], nk = 0;
    for (int k = 0; k < L->ntiles; k++) {
        const Tile *t = &L->tiles[k];
        if (t->xa0 < 0 || t->ya0 < 0) continue; /* u, v >= 0 in the one-tile loop: floors by truncation */
        int earlier = 0; /* tiles are tried in order, as tile_at does */
        for (int j = 0; j < k; j++) earlier |= L->tiles[j].xa0 < t->xa1 && t->xa0 < L->tiles[j].xa1 && L->tiles[j].ya0 < t->ya1 && t->ya0 < L->tiles[j].ya1;
        if (earlier) continue;
        int x0 = b0, x1 = b1; /* floor(u) in [xa0, xa1 - 2], floor(v) in [ya0, yfast] (segment_class's test) */
        row_interval(&gu, size, t->xa0 + mg, t->xa1 - 1 - mg, &x0, &x1);
        row_interval(&gv, size, t->ya0 + mg, (double)t->yfast + 1.0 - mg, &x0, &x1);
        if (x1 <= x0) continue;
        int p = nk++; /* by start: the intervals of tiles that do not overlap are disjoint */
        while (p > 0 && s[p - 1] > x0) s[p] = s[p - 1], e[p] = e[p - 1], ks[p] = ks[p - 1], p--;
        s[p] = x0, e[p] = x1, ks[p] = k;
    }
    if (b0 > 0) sp[n++] = (Span){0, b0, CLS_ZERO};
    int pos = b0;
    for (int q = 0; q < nk; q++) {
        if (s[q] > pos) sp[n++] = (Span){pos, s[q], CLS_MIXED};
        sp[n++] = (Span){s[q], e[q], ks[q]}, pos = e[q];
    }
    if (b1 > pos) sp[n++] = (Span){pos, b1, CLS_MIXED};
    if (b1 < size) sp[n++] = (Span){b1 > 0 ? b1 : 0, size, CLS_ZERO};
    return n;
}

/* Rows y0 .. y0 + ny - 1 of the general map into buf (row stride ``stride`` floats), in
 * blocks of BLOCK columns: a rotated map reads the source along slanted lines, and a block
 * keeps what it reads in cache (row by row it would sweep a hundred source rows). The
 * values do not depend on the order. An affine row is cut once into its exact spans; within
 * a block its columns are written left to right (each column's loop writes a 4th float into
 * the next one's slot, which the next column then writes). */
static void general_strip(const Layer *L, int size, int y0, int ny, float *buf, Py_ssize_t stride) {
    const int persp = !(L->m[6] == 0.0 && L->m[7] == 0.0 && L->m[8] == 1.0);
    Segment S;
    Span sp[STRIP][MAX_SPANS];
    int nsp[STRIP], at[STRIP];
    for (int k = 0; k < ny; k++) nsp[k] = row_spans(L, persp, size, y0 + k, sp[k]), at[k] = 0;
    for (int bx = 0; bx < size; bx += BLOCK) {
        const int bend = size - bx < BLOCK ? size : bx + BLOCK;
        for (int k = 0; k < ny; k++) {
            float *row = buf + k * stride;
            for (int q = at[k]; q < nsp[k] && sp[k][q].x0 < bend; q++) {
                const int x0 = sp[k][q].x0 > bx ? sp[k][q].x0 : bx, x1 = sp[k][q].x1 < bend ? sp[k][q].x1 : bend, c = sp[k][q].k;
                if (x1 > x0) {
                    if (c == CLS_ZERO) memset(row + 3 * x0, 0, sizeof(float) * 3 * (x1 - x0));
                    else if (c == CLS_MIXED) /* mostly the one or two columns at an edge: classified at once */
                        (x1 - x0 < 16 ? general_leaf : general_segment)(L, persp, x0, x1 - x0, y0 + k, row + 3 * x0, &S);
                    else general_uniform(L, &L->tiles[c], persp, x0, x1 - x0, y0 + k, row + 3 * x0);
                }
                if (sp[k][q].x1 <= bend) at[k] = q + 1; /* done with it */
            }
        }
    }
}

/* ---- HSV: the exact integer formulation defined in kernel.py, in float lanes ----
 * Every value below is an integer (or an exact quotient rounded once) well inside float32's
 * exact range, and each rounding to an integer is floor(q + 1/2) of a correctly rounded
 * quotient q whose distance from a half-integer (>= 1/510, >= 1/15300 for the last step)
 * exceeds float32's error, so the lanes give the integer definition's values exactly. */
#if defined(__SSE2__) && !defined(PIXPOOL_SCALAR)
static inline v4 v_load_i32(const int32_t *p) { return _mm_cvtepi32_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline void v_store_u8(uint8_t *p, v4 a) {
    __m128i i = _mm_cvttps_epi32(a);
    i = _mm_packus_epi16(_mm_packs_epi32(i, i), i);
    int32_t w = _mm_cvtsi128_si32(i);
    memcpy(p, &w, 4);
}
#else
static inline v4 v_load_i32(const int32_t *p) { v4 r; for (int i = 0; i < 4; i++) r.f[i] = (float)p[i]; return r; }
static inline void v_store_u8(uint8_t *p, v4 a) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)a.f[i]; }
#endif

typedef struct {
    int arith;     /* the tables are hue, gs, gv below (hsv_plan checked every entry) */
    int hue;       /* min(TH[h], 179) = (h + hue) mod 180 */
    float gs, gv;  /* TS[s] = trunc(min(s gs, 255)), TV likewise, in float32 lanes */
} HsvPlan;

/* The back conversion's per-channel offsets: e = h + off[c] is K + 30 mod 180 (K the hue
 * h shifted by the table's hue and channel c's 30 n, n = 5, 3, 1 for R, G, B) and lies in
 * -180..180, for h in 0..179 (unreduced = 0) or the forward conversion's unreduced 150..210. */
static void hsv_offsets(int hue, int unreduced, float off[3]) {
    for (int c = 0; c < 3; c++) {
        const int k = hue + 150 - 60 * c + 30;
        off[c] = (float)(unreduced ? (k + 330) % 180 - 330 : k % 180 - 180);
    }
}

/* hsv_rows_sse (4 lanes) and, on CPUs that have it, hsv_rows_avx2 (8 lanes): the same
 * lane operations (_kernel_hsv.h), so the same bytes; chosen once at import. */
#define HSV_FN hsv_rows_sse
#define VL 4
#include "_kernel_hsv.h"
#undef HSV_FN
#undef VL


typedef void (*hsv_fn)(uint8_t *, uint8_t *, uint8_t *, int, const int32_t *, const HsvPlan *, int32_t *, int32_t *, int32_t *);
static hsv_fn hsv_rows = hsv_rows_sse;

/* A gain g (float32) with trunc(min(s g, 255)) = table[s] for every s in 0..255, the lane
 * operations' own result checked entry by entry; -1 if there is none. g is the middle of
 * the gains the table allows (the table is floor(clip(s gain, 0, 255)), shared.stream.hsv_tables). */
static float hsv_gain(const int32_t *t) {
    double lo = 0.0, hi = -1.0;
    for (int s = 1; s < 256; s++) {
        if (t[s] >= 255) {
            if (255.0 / s > lo) lo = 255.0 / s;
        } else {
            if ((double)t[s] / s > lo) lo = (double)t[s] / s;
            if (hi < 0.0 || (t[s] + 1.0) / s < hi) hi = (t[s] + 1.0) / s;
        }
    }
    const float g = (float)(hi < 0.0 ? lo : 0.5 * (lo + hi));
    for (int s = 0; s < 256; s++) {
        float p = (float)s * g;
        p = p < 255.0f ? p : 255.0f;
        if ((int32_t)p != t[s]) return -1.0f;
    }
    return g;
}

/* Whether the tables are what shared.stream.hsv_tables builds, in the form the rows can evaluate
 * without lookups: a hue shift c (min(TH[h], 179) = (h + c) mod 180 for every hue h, which
 * then joins each channel's 30 n) and two clipped gains (hsv_gain). Checked entry by entry,
 * so the shortcut gives exactly the tables' values; otherwise the rows look them up. */
static HsvPlan hsv_plan(const int32_t *tab) {
    HsvPlan p = {0, tab[0] < 179 ? tab[0] : 179, hsv_gain(tab + 256), hsv_gain(tab + 512)};
    int shift = 1;
    for (int h = 0; h < 180; h++)
        if ((tab[h] < 179 ? tab[h] : 179) != (h + p.hue) % 180) shift = 0;
    p.arith = shift && p.gs >= 0.0f && p.gv >= 0.0f;
    return p;
}

/* ---- argument parsing ---- */
static int get_buffer(PyObject *obj, Py_buffer *view, int writable, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_RECORDS_RO | (writable ? PyBUF_WRITABLE : 0)) < 0) {
        PyErr_Format(PyExc_TypeError, "%s: not a %s buffer", what, writable ? "writable" : "readable");
        return -1;
    }
    return 0;
}

static int is_axis(const Layer *L) { return L->m[1] == 0.0 && L->m[3] == 0.0 && L->m[6] == 0.0 && L->m[7] == 0.0 && L->m[8] == 1.0; }

/* A layer pasted into another under a mask: its own strip rows (``buf``, STRIP rows of the
 * caller's row stride) and, for an axis-aligned map, its own row cache. */
typedef struct Paste {
    const uint8_t *mask;
    Py_buffer mask_view;
    int have_mask;
    Layer layer;
    int parsed;
    Axis axis;
    int axis_ok;
    float *buf;
} Paste;

static void release_layer(Layer *L) {
    for (int i = 0; i < L->nviews; i++) PyBuffer_Release(&L->views[i]);
    L->nviews = 0;
    for (int i = 0; i < L->npastes; i++) {
        Paste *P = &L->pastes[i];
        if (P->have_mask) PyBuffer_Release(&P->mask_view);
        if (P->parsed) release_layer(&P->layer);
        if (P->axis_ok) axis_free(&P->axis);
        free(P->buf);
    }
    free(L->pastes);
    L->pastes = NULL, L->npastes = 0;
}

static int parse_layer(PyObject *obj, Layer *L, int size, float fill) {
    PyObject *inv, *tiles, *mask, *pastes = NULL;
    memset(L, 0, sizeof(*L));
    if (!PyArg_ParseTuple(obj, "OOO|O", &inv, &tiles, &mask, &pastes)) return -1;
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
        t->base = (const char *)view->buf, t->end = t->base + view->len, t->row = view->strides[0], t->u8 = u8, t->fill = fill;
        {   /* bilerp reads 7 elements from tap (x0, y0 + 1), the integer one-tile loop 8 bytes: the
             * largest y0 where that fits for every x0 */
            const Py_ssize_t esz = u8 ? 1 : 4, room = view->len - (u8 ? 8 : 7) * esz - (Py_ssize_t)(t->xa1 - 2 - t->ox) * 3 * esz;
            const Py_ssize_t rows = room < 0 ? -1 : room / t->row; /* row pairs (y0 + 1 - oy) <= rows fit */
            t->yfast = rows - 1 + t->oy < t->ya1 - 2 ? (int)(rows - 1 + t->oy) : t->ya1 - 2;
        }
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
    if (pastes && pastes != Py_None) {
        if (!PyTuple_Check(pastes) || PyTuple_GET_SIZE(pastes) > MAX_PASTES) {
            PyErr_SetString(PyExc_ValueError, "pastes must be a tuple of at most 4 (mask, layer) pairs");
            return -1;
        }
        const int np_ = (int)PyTuple_GET_SIZE(pastes);
        L->pastes = calloc(np_ ? np_ : 1, sizeof(Paste));
        if (!L->pastes) {
            PyErr_NoMemory();
            return -1;
        }
        for (int i = 0; i < np_; i++) {
            Paste *P = &L->pastes[i];
            L->npastes = i + 1; /* released from here on, whatever fails below */
            PyObject *pmask, *player;
            if (!PyArg_ParseTuple(PyTuple_GET_ITEM(pastes, i), "OO", &pmask, &player)) return -1;
            if (get_buffer(pmask, &P->mask_view, 0, "paste mask") < 0) return -1;
            P->have_mask = 1;
            if (P->mask_view.len != (Py_ssize_t)size * size || !PyBuffer_IsContiguous(&P->mask_view, 'C')) {
                PyErr_SetString(PyExc_ValueError, "a paste mask must be uint8 (size, size) C-contiguous");
                return -1;
            }
            P->mask = (const uint8_t *)P->mask_view.buf;
            P->parsed = 1;
            if (parse_layer(player, &P->layer, size, fill) < 0) return -1;
            if (is_axis(&P->layer)) {
                P->axis_ok = 1;
                if (axis_init(&P->axis, &P->layer, size) < 0) {
                    PyErr_NoMemory();
                    return -1;
                }
            }
            P->buf = malloc(sizeof(float) * STRIP * (3 * (size_t)size + 48));
            if (!P->buf) {
                PyErr_NoMemory();
                return -1;
            }
        }
    }
    return 0;
}

/* Copy-paste: where the layer's mask is set, the pixel is the row's mirrored one. */
static void apply_mask(const Layer *L, int size, int y, float *row, float *tmp) {
    const uint8_t *mrow = L->mask + (Py_ssize_t)y * size;
    int any = 0;
    for (int x = 0; x < size && !any; x++) any = mrow[x];
    if (!any) return;
    memcpy(tmp, row, sizeof(float) * 3 * size);
    for (int x = 0; x < size; x++)
        if (mrow[x]) memcpy(row + 3 * x, tmp + 3 * (size - 1 - x), sizeof(float) * 3);
}

static void layer_strip(Layer *L, Axis *A, int size, int y0, int ny, float *buf, Py_ssize_t stride, float *tmp) {
    if (A)
        for (int k = 0; k < ny; k++) axis_row(A, L, size, y0 + k, buf + k * stride);
    else general_strip(L, size, y0, ny, buf, stride);
    if (L->mask)
        for (int k = 0; k < ny; k++) apply_mask(L, size, y0 + k, buf + k * stride, tmp);
    /* Pastes: the pasted layer's values where its mask is set; its rows are only rendered
     * for a strip that its mask reaches. */
    for (int i = 0; i < L->npastes; i++) {
        Paste *P = &L->pastes[i];
        const uint8_t *m = P->mask + (Py_ssize_t)y0 * size;
        int any = 0;
        for (Py_ssize_t j = 0; j < (Py_ssize_t)ny * size && !any; j++) any = m[j];
        if (!any) continue;
        layer_strip(&P->layer, P->axis_ok ? &P->axis : NULL, size, y0, ny, P->buf, stride, tmp);
        for (int k = 0; k < ny; k++) {
            const uint8_t *mrow = m + (Py_ssize_t)k * size;
            float *dst = buf + k * stride;
            const float *src = P->buf + k * stride;
            for (int x = 0; x < size; x++)
                if (mrow[x]) memcpy(dst + 3 * x, src + 3 * x, sizeof(float) * 3);
        }
    }
}

/* This thread's work rows, grown as needed and kept: a fresh calloc of a few hundred KB per
 * sample is a fresh mmap, and its page faults cost more than the row arithmetic. */
static __thread void *work_buf;
static __thread size_t work_cap;
static float *work_rows(size_t nbytes) {
    if (nbytes > work_cap) {
        void *p = calloc(1, nbytes);
        if (!p) return NULL;
        free(work_buf);
        work_buf = p, work_cap = nbytes;
    }
    return (float *)work_buf;
}

/* Steps 6 and 7 for one row: f = s + fill (one layer, ``rb`` NULL) or (s1 + fill) r + (s2 + fill)(1 - r)
 * over the interleaved B G R floats of ``ra``, written back when ``keep`` (the float image),
 * and q = clip(rint(f), 0, 255) split into the planes pb, pg, pr (each padded to 16 bytes
 * past ``size``; pb NULL: no planes). Groups of 16 pixels: 12 vectors of 4 floats are
 * transposed into 4 of each channel, quantised and packed; the lanes past the row end read
 * the row's padding and land in the planes' padding. */
static void out_row(float *ra, const float *rb, float fillv, float ratio, float iratio, int size, int keep, uint8_t *pb, uint8_t *pg, uint8_t *pr) {
    const v4 fill = V_SET(fillv), vr = V_SET(ratio), vir = V_SET(iratio);
    const int n3 = 3 * size;
    if (!pb) {
        for (int i = 0; i < n3; i += 4) {
            v4 f = rb ? V_ADD(V_MUL(V_ADD(V_LOAD(ra + i), fill), vr), V_MUL(V_ADD(V_LOAD(rb + i), fill), vir)) : V_ADD(V_LOAD(ra + i), fill);
            V_STORE(ra + i, f);
        }
        return;
    }
    for (int x = 0; x < size; x += 16) {
        v4 f[12];
        for (int j = 0; j < 12; j++) {
            const int i = 3 * x + 4 * j;
            f[j] = rb ? V_ADD(V_MUL(V_ADD(V_LOAD(ra + i), fill), vr), V_MUL(V_ADD(V_LOAD(rb + i), fill), vir)) : V_ADD(V_LOAD(ra + i), fill);
            if (keep) V_STORE(ra + i, f[j]);
        }
#if defined(__SSE2__) && !defined(PIXPOOL_SCALAR)
        __m128i cb[4], cg[4], cr[4];
        for (int g = 0; g < 4; g++) { /* pixels 4g .. 4g + 3: a = b0 g0 r0 b1, b = g1 r1 b2 g2, c = r2 b3 g3 r3 */
            const __m128 a = f[3 * g], b = f[3 * g + 1], c = f[3 * g + 2];
            const __m128 bc = _mm_shuffle_ps(b, c, _MM_SHUFFLE(1, 1, 2, 2));        /* b2 b2 c1 c1 */
            const __m128 B = _mm_shuffle_ps(a, bc, _MM_SHUFFLE(2, 0, 3, 0));        /* b0 b1 b2 b3 */
            const __m128 ab = _mm_shuffle_ps(a, b, _MM_SHUFFLE(0, 0, 1, 1));        /* g0 g0 g1 g1 */
            const __m128 bc2 = _mm_shuffle_ps(b, c, _MM_SHUFFLE(2, 2, 3, 3));       /* g2 g2 g3 g3 */
            const __m128 G = _mm_shuffle_ps(ab, bc2, _MM_SHUFFLE(2, 0, 2, 0));      /* g0 g1 g2 g3 */
            const __m128 ab2 = _mm_shuffle_ps(a, b, _MM_SHUFFLE(1, 1, 2, 2));       /* r0 r0 r1 r1 */
            const __m128 cc = _mm_shuffle_ps(c, c, _MM_SHUFFLE(3, 3, 0, 0));        /* r2 r2 r3 r3 */
            const __m128 R = _mm_shuffle_ps(ab2, cc, _MM_SHUFFLE(2, 0, 2, 0));      /* r0 r1 r2 r3 */
            cb[g] = _mm_cvtps_epi32(B), cg[g] = _mm_cvtps_epi32(G), cr[g] = _mm_cvtps_epi32(R);
        }
        _mm_storeu_si128((__m128i *)(pb + x), _mm_packus_epi16(_mm_packs_epi32(cb[0], cb[1]), _mm_packs_epi32(cb[2], cb[3])));
        _mm_storeu_si128((__m128i *)(pg + x), _mm_packus_epi16(_mm_packs_epi32(cg[0], cg[1]), _mm_packs_epi32(cg[2], cg[3])));
        _mm_storeu_si128((__m128i *)(pr + x), _mm_packus_epi16(_mm_packs_epi32(cr[0], cr[1]), _mm_packs_epi32(cr[2], cr[3])));
#else
        float t[48];
        uint8_t q[48];
        for (int j = 0; j < 12; j++) V_STORE(t + 4 * j, f[j]);
        v_quant16(t, q), v_quant16(t + 16, q + 16), v_quant16(t + 32, q + 32);
        for (int p = 0; p < 16; p++) pb[x + p] = q[3 * p], pg[x + p] = q[3 * p + 1], pr[x + p] = q[3 * p + 2];
#endif
    }
}

#ifdef HAVE_AVX2_PATH
static void out_row_avx2(float *ra, const float *rb, const float *top, const float *bot, float fy, float fillv, float ratio, float iratio, int size, int keep, uint8_t *pb, uint8_t *pg, uint8_t *pr, const HsvPlan *plan, int32_t *hi, int32_t *si, int32_t *vi);
static void out_row_i_avx2(const int16_t *top, const int16_t *bot, int ay, int fill, int size, uint8_t *pb, uint8_t *pg, uint8_t *pr, const HsvPlan *plan, int32_t *hi, int32_t *si, int32_t *vi);
#endif
#ifdef HAVE_AVX512_PATH
static void out_row_avx512(float *ra, const float *rb, const float *top, const float *bot, float fy, float fillv, float ratio, float iratio, int size, int keep, uint8_t *pb, uint8_t *pg, uint8_t *pr, const HsvPlan *plan);
#endif

#ifdef HAVE_AVX2_PATH
static void copy_reversed_avx2(uint8_t *dst, const uint8_t *src, int n);
#endif

/* dst[i] = src[n - 1 - i] for i < n. */
static void copy_reversed(uint8_t *dst, const uint8_t *src, int n) {
    int i = 0;
#ifdef HAVE_AVX2_PATH
    if (lanes8) {
        copy_reversed_avx2(dst, src, n);
        return;
    }
#endif
#if defined(__SSE2__) && !defined(PIXPOOL_SCALAR)
    for (; i + 16 <= n; i += 16) {
        __m128i v = _mm_loadu_si128((const __m128i *)(src + n - 16 - i));
        v = _mm_shuffle_epi32(v, _MM_SHUFFLE(0, 1, 2, 3));                               /* reverse the 4 dwords */
        v = _mm_shufflehi_epi16(_mm_shufflelo_epi16(v, _MM_SHUFFLE(2, 3, 0, 1)), _MM_SHUFFLE(2, 3, 0, 1)); /* words in dwords */
        v = _mm_or_si128(_mm_slli_epi16(v, 8), _mm_srli_epi16(v, 8));                     /* bytes in words */
        _mm_storeu_si128((__m128i *)(dst + i), v);
    }
#endif
    for (; i < n; i++) dst[i] = src[n - 1 - i];
}

static PyObject *py_render(PyObject *self, PyObject *args) {
    int size, flip_ud, flip_lr;
    double ratio_d, fill_d;
    PyObject *out_obj, *floats_obj, *layers_obj, *tables_obj;
    if (!PyArg_ParseTuple(args, "iOOOppdOd", &size, &out_obj, &floats_obj, &layers_obj, &flip_ud, &flip_lr, &ratio_d, &tables_obj, &fill_d)) return NULL;
    /* The fill the snapshot was centred by (its header's, checked at attach): subtracted from
     * a uint8 tap and added back to every output value. */
    const float fillf = (float)fill_d;
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
    float *rows = NULL; /* this thread's work rows (work_rows), kept for its next call */
    PyObject *result = NULL;
    for (int i = 0; i < nl; i++) {
        if (parse_layer(PyTuple_GET_ITEM(layers_obj, i), &layers[i], size, fillf) < 0) {
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
    /* Work rows: three float rows of 3 S (+48 padding: the vector tails read up to the next
     * multiple of 16 pixels; what they read there reaches no output), the quantised
     * interleaved row, three planar byte rows and three int32 rows for HSV. */
    const Py_ssize_t frow = 3 * (Py_ssize_t)size + 48, prow = (Py_ssize_t)size + 16;
    rows = work_rows(sizeof(float) * (2 * STRIP + 1) * frow + frow + 3 * prow + sizeof(int32_t) * 3 * prow + sizeof(int16_t) * 4 * ((size_t)size + 8));
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
        int32_t tab32[768];
        HsvPlan plan = {0, 0, 0.0f, 0.0f};
        if (tab) {
            for (int i = 0; i < 768; i++) tab32[i] = tab[i];
            plan = hsv_plan(tab32);
        }
        uint8_t *planes = have_out ? (uint8_t *)out.buf : NULL;
        float *fl = have_floats ? (float *)floats.buf : NULL;
        Py_ssize_t plane = (Py_ssize_t)size * size;
        float *sa = rows, *sb = rows + STRIP * frow, *tmp = rows + 2 * STRIP * frow;
        uint8_t *q = (uint8_t *)(rows + (2 * STRIP + 1) * frow), *pr = q + frow, *pg = pr + prow, *pb = pg + prow;
        int32_t *hi = (int32_t *)(pb + prow), *si = hi + prow, *vi = si + prow;
        int16_t *ifill = (int16_t *)(vi + prow); /* an integer H row of the fill alone (32 F per lane) */
        const int n3 = 3 * size;
        /* One axis-aligned layer with nothing pasted from another layer, planes only:
         * out_row_avx2 blends the two kept H rows itself (axis_row's operations), with no strip
         * in between; a copy-paste mask mirrors the columns of those two rows (masked_pair). */
        const int direct = lanes8 && nl == 1 && axis_ok[0] && !layers[0].npastes && planes && !fl;
        /* ... and with only uint8 tiles and a whole fill in 0..255, the same values in integers. */
        int idirect = direct && fillf >= 0.0f && fillf <= 255.0f && fillf == (float)(int)fillf;
        for (int k = 0; idirect && k < layers[0].ntiles; k++) idirect = layers[0].tiles[k].u8;
        if (idirect)
            for (Py_ssize_t i = 0; i < 4 * ((Py_ssize_t)size + 8); i++) ifill[i] = (int16_t)(32 * (int)fillf);
        Py_BEGIN_ALLOW_THREADS;
        for (int y = 0; y < size; y++) {
            const int k = y % STRIP;
            if (k == 0 && !direct) {
                int ny = size - y < STRIP ? size - y : STRIP;
                layer_strip(&layers[0], axis_ok[0] ? &axes[0] : NULL, size, y, ny, sa, frow, tmp);
                if (nl == 2) layer_strip(&layers[1], axis_ok[1] ? &axes[1] : NULL, size, y, ny, sb, frow, tmp);
            }
            float *ra = sa + k * frow, *rb = sb + k * frow;
            const int yo = flip_ud ? size - 1 - y : y;
            /* Steps 6 and 7: the float image f (written back into ra for ``floats``) and its
             * quantised B, G, R planes. */
            int hsv_done = 0;
#ifdef HAVE_AVX2_PATH
            if (lanes8 && planes) {
                hsv_done = tab && plan.arith;
                const float *top = NULL, *bot = NULL;
                float fy = 0.0f;
                const int16_t *itop, *ibot;
                int ay;
                if (idirect) {
                    if (!axis_ipair(&axes[0], &layers[0], size, y, (int)fillf, &itop, &ibot, &ay))
                        itop = ibot = ifill, ay = 0; /* a row that reads no canvas row: the fill everywhere */
                    else if (layers[0].mask)
                        masked_ipair(&axes[0], &layers[0], size, y, &itop, &ibot);
                    out_row_i_avx2(itop, ibot, ay, (int)fillf, size, pb, pg, pr, hsv_done ? &plan : NULL, hi, si, vi);
                } else {
                    if (direct && !axis_pair(&axes[0], &layers[0], size, y, &top, &bot, &fy)) memset(ra, 0, sizeof(float) * n3), top = NULL;
                    else if (direct && layers[0].mask) masked_pair(&axes[0], &layers[0], size, y, &top, &bot);
#ifdef HAVE_AVX512_PATH
                    if (lanes16)
                        out_row_avx512(ra, nl == 2 ? rb : NULL, top, bot, fy, fillf, ratio, iratio, size, fl != NULL, pb, pg, pr, hsv_done ? &plan : NULL);
                    else
#endif
                        out_row_avx2(ra, nl == 2 ? rb : NULL, top, bot, fy, fillf, ratio, iratio, size, fl != NULL, pb, pg, pr, hsv_done ? &plan : NULL, hi, si, vi);
                }
            } else
#endif
                out_row(ra, nl == 2 ? rb : NULL, fillf, ratio, iratio, size, fl != NULL, planes ? pb : NULL, pg, pr);
            if (fl) {
                float *frow_out = fl + (Py_ssize_t)yo * n3;
                if (!flip_lr) memcpy(frow_out, ra, sizeof(float) * n3);
                else
                    for (int x = 0; x < size; x++) memcpy(frow_out + 3 * (size - 1 - x), ra + 3 * x, sizeof(float) * 3);
            }
            if (!planes) continue;
            if (tab && !hsv_done) hsv_rows(pr, pg, pb, size, tab32, &plan, hi, si, vi);
            uint8_t *dst[3] = {planes + (Py_ssize_t)yo * size, planes + plane + (Py_ssize_t)yo * size, planes + 2 * plane + (Py_ssize_t)yo * size};
            const uint8_t *srcp[3] = {pr, pg, pb};
            if (!flip_lr)
                for (int c = 0; c < 3; c++) memcpy(dst[c], srcp[c], size);
            else /* the left-right flip rides on the copy into the output */
                for (int c = 0; c < 3; c++) copy_reversed(dst[c], srcp[c], size);
        }
        Py_END_ALLOW_THREADS;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    for (int i = 0; i < nl; i++)
        if (axis_ok[i]) axis_free(&axes[i]);
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
        int32_t tab32[768];
        for (int i = 0; i < 768; i++) tab32[i] = tab[i];
        const HsvPlan plan = hsv_plan(tab32);
        Py_ssize_t n = img.len / 3;
        enum { CHUNK = 1024 };
        uint8_t pr[CHUNK], pg[CHUNK], pb[CHUNK];
        int32_t hi[CHUNK], si[CHUNK], vi[CHUNK];
        Py_BEGIN_ALLOW_THREADS;
        for (Py_ssize_t start = 0; start < n; start += CHUNK) {
            int m = (int)(n - start < CHUNK ? n - start : CHUNK);
            uint8_t *px = p + 3 * start;
            memset(pr, 0, sizeof pr), memset(pg, 0, sizeof pg), memset(pb, 0, sizeof pb);
            for (int i = 0; i < m; i++) pr[i] = px[3 * i], pg[i] = px[3 * i + 1], pb[i] = px[3 * i + 2];
            hsv_rows(pr, pg, pb, m, tab32, &plan, hi, si, vi);
            for (int i = 0; i < m; i++) px[3 * i] = pr[i], px[3 * i + 1] = pg[i], px[3 * i + 2] = pb[i];
        }
        Py_END_ALLOW_THREADS;
        result = Py_None;
        Py_INCREF(result);
    }
    PyBuffer_Release(&img);
    PyBuffer_Release(&tables);
    return result;
}

/* ---- the 8-lane HSV: last in the file, since it redefines the lane macros ---- */
#ifdef HAVE_AVX2_PATH
#pragma GCC push_options
#pragma GCC target("avx2")
#include <immintrin.h>
#undef V_LOAD
#undef V_STORE
#undef V_SET
#undef V_ADD
#undef V_SUB
#undef V_MUL
#undef V_DIV
#undef V_MAX
#undef V_MIN
#undef V_EQ
#undef V_GE
#undef V_SEL
#undef V_AND
#undef V_TRUNC
#define v4 v8
typedef __m256 v8;
#define V_SET(x) _mm256_set1_ps(x)
#define V_ADD(a, b) _mm256_add_ps(a, b)
#define V_SUB(a, b) _mm256_sub_ps(a, b)
#define V_MUL(a, b) _mm256_mul_ps(a, b)
#define V_DIV(a, b) _mm256_div_ps(a, b)
#define V_MAX(a, b) _mm256_max_ps(a, b)
#define V_MIN(a, b) _mm256_min_ps(a, b)
#define V_EQ(a, b) _mm256_cmp_ps(a, b, _CMP_EQ_OQ)
#define V_GE(a, b) _mm256_cmp_ps(a, b, _CMP_GE_OQ)
#define V_SEL(m, a, b) _mm256_blendv_ps(b, a, m) /* m: all-ones or all-zero lanes, so the or/and/andnot select's value */
#define V_AND(m, a) _mm256_and_ps(m, a)
#undef V_ABS
#define V_ABS(a) _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a)
#define V_TRUNC(a) _mm256_round_ps(a, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC) /* one vroundps: the same value as the int32 round trip */
#define v_load_u8 v8_load_u8
#define v_store_u8 v8_store_u8
#define v_store_i32 v8_store_i32
#define v_load_i32 v8_load_i32
static inline v8 v8_load_u8(const uint8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
static inline void v8_store_u8(uint8_t *p, v8 a) {
    __m256i i = _mm256_cvttps_epi32(a);
    __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64((__m128i *)p, _mm_packus_epi16(w, w));
}
/* The 8-lane work rows hold the truncated values' float32 bits, not int32: only the 8-lane
 * loops write and read them, and a truncation plus a plain load is cheaper than a conversion
 * each way. */
static inline void v8_store_i32(int32_t *p, v8 a) { _mm256_storeu_ps((float *)p, V_TRUNC(a)); }
/* v8_store_i32 of lanes already whole (the forward hue, truncated where it is made): no second rounding. */
static inline void v8_store_whole(int32_t *p, v8 a) { _mm256_storeu_ps((float *)p, a); }
/* v8_store_u8 of three vectors at once: the same truncation and saturating packs per value,
 * two packs for the three instead of two each, one permute to put each plane's 8 bytes in a row. */
static inline void v8_store3_u8(uint8_t *const *planes, int i, const v8 *out) {
    const __m256i ab = _mm256_packs_epi32(_mm256_cvttps_epi32(out[0]), _mm256_cvttps_epi32(out[1]));
    const __m256i c = _mm256_cvttps_epi32(out[2]);
    const __m256i u = _mm256_packus_epi16(ab, _mm256_packs_epi32(c, c)); /* per half: 4 of a, 4 of b, 4 of c, 4 of c */
    const __m256i r = _mm256_permutevar8x32_epi32(u, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    const __m128i lo = _mm256_castsi256_si128(r);
    _mm_storel_epi64((__m128i *)(planes[0] + i), lo);
    _mm_storeh_pd((double *)(planes[1] + i), _mm_castsi128_pd(lo));
    _mm_storel_epi64((__m128i *)(planes[2] + i), _mm256_extracti128_si256(r, 1));
}
#undef V_STORE3_U8
#define V_STORE3_U8(planes, i, out) v8_store3_u8(planes, i, out)
static inline v8 v8_load_i32(const int32_t *p) { return _mm256_loadu_ps((const float *)p); }
#define V_GATHER(table, idx) _mm256_cvtepi32_ps(_mm256_i32gather_epi32(table, _mm256_cvttps_epi32(idx), 4))
#define HSV_FN hsv_rows_avx2
#define VL 8
#include "_kernel_hsv.h"
#undef HSV_FN
#undef VL

/* Two unaligned 4-float loads into one 8-lane vector (lo in the low half). */
static inline __m256 load2_m128(const float *hi, const float *lo) { return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(lo)), _mm_loadu_ps(hi), 1); }

/* The one-tile bilinear of 8 columns of uint8 taps in integers (the float32 rows' values: on
 * the 1/32 grid both are exact). Per column one 8-byte load per tap row (the tile's yfast
 * keeps it inside the image), the two taps of each channel paired by a byte shuffle, times
 * (32 - ax, ax) and summed (maddubs: at most 255 * 32), 4 columns per vector; then the two
 * rows interleaved, times (32 - ay, ay) and summed (madd: s' at most 255 * 1024), and the
 * centred value s' / 1024 - F, exact in float32. Columns are stored left to right: each
 * 4th float is scratch that the next column overwrites. */
static inline void general_u8_avx2(const char *base, const int32_t *off, Py_ssize_t row, Py_ssize_t ahead, __m256i ax, __m256i ay, float fillv, float *dst) {
    const __m256i pairs = _mm256_setr_epi8(0, 3, 1, 4, 2, 5, 6, 7, 8, 11, 9, 12, 10, 13, 14, 15, 0, 3, 1, 4, 2, 5, 6, 7, 8, 11, 9, 12, 10, 13, 14, 15);
    const __m256i rep4 = _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 8, 9, 8, 9, 8, 9, 8, 9, 0, 1, 0, 1, 0, 1, 0, 1, 8, 9, 8, 9, 8, 9, 8, 9);
    const __m256i c32 = _mm256_set1_epi32(32);
    const __m256i wx = _mm256_or_si256(_mm256_sub_epi32(c32, ax), _mm256_slli_epi32(ax, 8));  /* bytes (32 - ax, ax) */
    const __m256i wy = _mm256_or_si256(_mm256_sub_epi32(c32, ay), _mm256_slli_epi32(ay, 16)); /* int16 (32 - ay, ay) */
    const __m256 scale = _mm256_set1_ps(1.0f / 1024.0f), fill = _mm256_set1_ps(fillv);
    for (int g = 0; g < 8; g += 4) {
        __m128i top[4], bot[4];
        for (int c = 0; c < 4; c++) {
            const char *a = base + off[g + c];
            if (!(c & 1)) __builtin_prefetch(a + ahead), __builtin_prefetch(a + ahead + row);
            top[c] = _mm_loadl_epi64((const __m128i *)a), bot[c] = _mm_loadl_epi64((const __m128i *)(a + row));
        }
        const __m256i T = _mm256_shuffle_epi8(_mm256_set_m128i(_mm_unpacklo_epi64(top[2], top[3]), _mm_unpacklo_epi64(top[0], top[1])), pairs);
        const __m256i B = _mm256_shuffle_epi8(_mm256_set_m128i(_mm_unpacklo_epi64(bot[2], bot[3]), _mm_unpacklo_epi64(bot[0], bot[1])), pairs);
        const __m256i w = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(wx, _mm256_setr_epi32(g, g, g + 1, g + 1, g + 2, g + 2, g + 3, g + 3)), rep4);
        const __m256i ht = _mm256_maddubs_epi16(T, w), hb = _mm256_maddubs_epi16(B, w); /* halves: columns g, g + 1 | g + 2, g + 3 */
        const __m256i sl = _mm256_madd_epi16(_mm256_unpacklo_epi16(ht, hb), _mm256_permutevar8x32_epi32(wy, _mm256_setr_epi32(g, g, g, g, g + 2, g + 2, g + 2, g + 2)));
        const __m256i sh = _mm256_madd_epi16(_mm256_unpackhi_epi16(ht, hb), _mm256_permutevar8x32_epi32(wy, _mm256_setr_epi32(g + 1, g + 1, g + 1, g + 1, g + 3, g + 3, g + 3, g + 3)));
        const __m256 fl = _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sl), scale), fill); /* columns g | g + 2 */
        const __m256 fh = _mm256_sub_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sh), scale), fill); /* columns g + 1 | g + 3 */
        _mm_storeu_ps(dst + 3 * g, _mm256_castps256_ps128(fl));
        _mm_storeu_ps(dst + 3 * (g + 1), _mm256_castps256_ps128(fh));
        _mm_storeu_ps(dst + 3 * (g + 2), _mm256_extractf128_ps(fl, 1));
        _mm_storeu_ps(dst + 3 * (g + 3), _mm256_extractf128_ps(fh, 1));
    }
}

/* general_uniform in AVX2 lanes, across output columns: the map of 4 columns per double
 * vector, 8 per float vector (the same operations per column as the scalar body), then the
 * bilinear of 2 columns per vector, one column's B G R (+ scratch) in each 128-bit half.
 * Returns how many columns it wrote (whole groups of 8; 0 when the tile's image is too large
 * for 32-bit offsets). */
static int general_uniform_avx2(const Layer *L, const Tile *t, int persp, int xa, int n, int y, float *dst) {
    if (t->end - t->base >= INT32_MAX || n < 8) return 0;
    const double *m = L->m;
    const double yd = (double)y, cu = m[1] * yd + m[2], cv = m[4] * yd + m[5], cw = m[7] * yd + m[8];
    /* 32 u computed directly: (32 m0) x + 32 cu, and its quotient by w, are 32 times the
     * definition's u exactly (a power-of-two factor commutes with each rounding) */
    const __m256d m0 = _mm256_set1_pd(32.0 * m[0]), m3 = _mm256_set1_pd(32.0 * m[3]), m6 = _mm256_set1_pd(m[6]);
    const __m256d vcu = _mm256_set1_pd(32.0 * cu), vcv = _mm256_set1_pd(32.0 * cv), vcw = _mm256_set1_pd(cw);
    const __m128i c31 = _mm_set1_epi32(31);
    const __m128 c1_32 = _mm_set1_ps(1.0f / 32.0f);
    const __m256 one = _mm256_set1_ps(1.0f), fill = _mm256_set1_ps(t->fill);
    const Py_ssize_t row = t->row, step = t->u8 ? 3 : 12, origin = -(Py_ssize_t)t->oy * row - (Py_ssize_t)t->ox * step;
    const __m256i vrow = _mm256_set1_epi32((int)row), vstep = _mm256_set1_epi32((int)step), vorigin = _mm256_set1_epi32((int)origin);
    const double dv = m[4] > 0.0 ? m[4] : 0.0, du = m[1];
    const Py_ssize_t ahead = (Py_ssize_t)(dv + 1.0) * row + (Py_ssize_t)du * step;
    const char *base = t->base;
    const int n8 = n & ~7;
    for (int i = 0; i < n8; i += 8) {
        __m128i x0h[2], y0h[2], axh[2], ayh[2];
        __m128 fxh[2], fyh[2];
        for (int h = 0; h < 2; h++) {
            const __m256d xd = _mm256_cvtepi32_pd(_mm_add_epi32(_mm_set1_epi32(xa + i + 4 * h), _mm_setr_epi32(0, 1, 2, 3)));
            __m256d u = _mm256_add_pd(_mm256_mul_pd(m0, xd), vcu), v = _mm256_add_pd(_mm256_mul_pd(m3, xd), vcv);
            if (persp) {
                const __m256d w = _mm256_add_pd(_mm256_mul_pd(m6, xd), vcw);
                u = _mm256_div_pd(u, w), v = _mm256_div_pd(v, w);
            }
            /* grid_q: 32 u rounded to nearest, ties to even (an integer below 2^31 here: u, v >= 0
             * inside the tile), then x0 = its floor / 32 and fx = (its remainder) / 32, exact */
            const __m128i U = _mm256_cvttpd_epi32(_mm256_round_pd(u, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            const __m128i V = _mm256_cvttpd_epi32(_mm256_round_pd(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            x0h[h] = _mm_srai_epi32(U, 5), y0h[h] = _mm_srai_epi32(V, 5);
            axh[h] = _mm_and_si128(U, c31), ayh[h] = _mm_and_si128(V, c31);
            fxh[h] = _mm_mul_ps(_mm_cvtepi32_ps(axh[h]), c1_32);
            fyh[h] = _mm_mul_ps(_mm_cvtepi32_ps(ayh[h]), c1_32);
        }
        const __m256 fx = _mm256_set_m128(fxh[1], fxh[0]), fy = _mm256_set_m128(fyh[1], fyh[0]);
        const __m256 ifx = _mm256_sub_ps(one, fx), ify = _mm256_sub_ps(one, fy);
        const __m256i x0 = _mm256_set_m128i(x0h[1], x0h[0]), y0 = _mm256_set_m128i(y0h[1], y0h[0]);
        /* The byte offset of tap (x0, y0): below 2^31 here, so 32-bit lanes hold it exactly. */
        int32_t off[8];
        _mm256_storeu_si256((__m256i *)off, _mm256_add_epi32(_mm256_add_epi32(_mm256_mullo_epi32(y0, vrow), _mm256_mullo_epi32(x0, vstep)), vorigin));
        if (t->u8) {
            general_u8_avx2(base, off, row, ahead, _mm256_set_m128i(axh[1], axh[0]), _mm256_set_m128i(ayh[1], ayh[0]), t->fill, dst + 3 * i);
            continue;
        }
        for (int j = 0; j < 8; j += 2) {
            const __m256i pick = _mm256_setr_epi32(j, j, j, j, j + 1, j + 1, j + 1, j + 1);
            const __m256 wfx = _mm256_permutevar8x32_ps(fx, pick), wifx = _mm256_permutevar8x32_ps(ifx, pick);
            const __m256 wfy = _mm256_permutevar8x32_ps(fy, pick), wify = _mm256_permutevar8x32_ps(ify, pick);
            const char *a = base + off[j], *b = base + off[j + 1];
            __builtin_prefetch(a + ahead);
            __builtin_prefetch(a + ahead + row);
            __m256 p00, p01, p10, p11;
            if (t->u8) {
                int32_t w0, w1;
#define PAIR_U8(dst_, pa, pb)                                                                     \
    memcpy(&w0, pa, 4), memcpy(&w1, pb, 4);                                                       \
    dst_ = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_insert_epi32(_mm_cvtsi32_si128(w0), w1, 1))), fill)
                PAIR_U8(p00, a, b);
                PAIR_U8(p01, a + 3, b + 3);
                PAIR_U8(p10, a + row, b + row);
                PAIR_U8(p11, a + row + 3, b + row + 3);
#undef PAIR_U8
            } else {
                const float *fa = (const float *)a, *fb = (const float *)b, *ga = (const float *)(a + row), *gb = (const float *)(b + row);
                p00 = load2_m128(fb, fa), p01 = load2_m128(fb + 3, fa + 3);
                p10 = load2_m128(gb, ga), p11 = load2_m128(gb + 3, ga + 3);
            }
            const __m256 top = _mm256_add_ps(_mm256_mul_ps(p00, wifx), _mm256_mul_ps(p01, wfx));
            const __m256 bot = _mm256_add_ps(_mm256_mul_ps(p10, wifx), _mm256_mul_ps(p11, wfx));
            const __m256 s = _mm256_add_ps(_mm256_mul_ps(top, wify), _mm256_mul_ps(bot, wfy));
            /* Column i + j first: its 4th lane is scratch that column i + j + 1 then overwrites. */
            _mm_storeu_ps(dst + 3 * (i + j), _mm256_castps256_ps128(s));
            _mm_storeu_ps(dst + 3 * (i + j + 1), _mm256_extractf128_ps(s, 1));
        }
    }
    return n8;
}
/* 8 int32 lanes -> 8 bytes, saturated to 0..255 (out_row's packs). */
static inline void store8_u8(uint8_t *p, __m256i q) {
    const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    _mm_storel_epi64((__m128i *)p, _mm_packus_epi16(w, w));
}

/* out_row in AVX2 lanes, 8 pixels a step (out_row's shuffles, one 4-pixel group in each
 * 128-bit half), planes required. With ``plan`` (tables hsv_plan evaluates without lookups)
 * step 8 runs on the quantised values while they are in registers and writes the jittered
 * planes: no second pass over the row. q = clip(rint(f), 0, 255) is the same integer as the
 * packs' saturation, so the HSV sees the bytes the planes would have held. */
static void out_row_avx2(float *ra, const float *rb, const float *top, const float *bot, float fy, float fillv, float ratio, float iratio, int size, int keep, uint8_t *pb, uint8_t *pg, uint8_t *pr, const HsvPlan *plan, int32_t *hi, int32_t *si, int32_t *vi) {
    const __m256 fill = _mm256_set1_ps(fillv), vr = _mm256_set1_ps(ratio), vir = _mm256_set1_ps(iratio);
    const __m256 vfy = _mm256_set1_ps(fy), vify = _mm256_set1_ps(1.0f - fy);
    const __m256i zero = _mm256_setzero_si256(), c255i = _mm256_set1_epi32(255);
    const __m256 c255 = _mm256_set1_ps(255.0f), gs = _mm256_set1_ps(plan ? plan->gs : 0.0f), gv = _mm256_set1_ps(plan ? plan->gv : 0.0f);
    uint8_t *const planes[3] = {pr, pg, pb};
    float off[3];
    hsv_offsets(plan ? plan->hue : 0, 1, off);
    for (int x = 0; x < size; x += 8) {
        const int i = 3 * x;
        __m256 f[3];
        for (int j = 0; j < 3; j++) { /* floats 4j.. of pixels x..x+3 (low half) and x+4..x+7 (high) */
            __m256 a;
            if (top) /* axis_row's s = H_y0 (1 - fy) + H_y0+1 fy, then the fill */
                a = _mm256_add_ps(_mm256_mul_ps(load2_m128(top + i + 12 + 4 * j, top + i + 4 * j), vify), _mm256_mul_ps(load2_m128(bot + i + 12 + 4 * j, bot + i + 4 * j), vfy));
            else
                a = load2_m128(ra + i + 12 + 4 * j, ra + i + 4 * j);
            if (rb) {
                const __m256 b = load2_m128(rb + i + 12 + 4 * j, rb + i + 4 * j);
                a = _mm256_add_ps(_mm256_mul_ps(_mm256_add_ps(a, fill), vr), _mm256_mul_ps(_mm256_add_ps(b, fill), vir));
            } else a = _mm256_add_ps(a, fill);
            if (keep) _mm_storeu_ps(ra + i + 4 * j, _mm256_castps256_ps128(a)), _mm_storeu_ps(ra + i + 12 + 4 * j, _mm256_extractf128_ps(a, 1));
            f[j] = a;
        }
        const __m256 a = f[0], b = f[1], c = f[2];
        const __m256 B = _mm256_shuffle_ps(a, _mm256_shuffle_ps(b, c, _MM_SHUFFLE(1, 1, 2, 2)), _MM_SHUFFLE(2, 0, 3, 0));
        const __m256 G = _mm256_shuffle_ps(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(0, 0, 1, 1)), _mm256_shuffle_ps(b, c, _MM_SHUFFLE(2, 2, 3, 3)), _MM_SHUFFLE(2, 0, 2, 0));
        const __m256 R = _mm256_shuffle_ps(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(1, 1, 2, 2)), _mm256_shuffle_ps(c, c, _MM_SHUFFLE(3, 3, 0, 0)), _MM_SHUFFLE(2, 0, 2, 0));
        const __m256i qb = _mm256_cvtps_epi32(B), qg = _mm256_cvtps_epi32(G), qr = _mm256_cvtps_epi32(R);
        if (!plan) {
            store8_u8(pb + x, qb), store8_u8(pg + x, qg), store8_u8(pr + x, qr);
            continue;
        }
#define CLIP255(q) _mm256_cvtepi32_ps(_mm256_min_epi32(_mm256_max_epi32(q, zero), c255i))
        __m256 h, sat, val;
        hsv_rows_avx2_fwdu(CLIP255(qr), CLIP255(qg), CLIP255(qb), &h, &sat, &val);
#undef CLIP255
        v8_store_whole(hi + x, h), v8_store_i32(si + x, _mm256_min_ps(_mm256_mul_ps(sat, gs), c255)), v8_store_i32(vi + x, _mm256_min_ps(_mm256_mul_ps(val, gv), c255));
    }
    /* The back conversion as its own loop, as hsv_rows does: one loop for both spills registers. */
    if (plan)
        for (int x = 0; x < size; x += 8) hsv_rows_avx2_back(planes, x, v8_load_i32(hi + x), v8_load_i32(si + x), v8_load_i32(vi + x), off);
}

/* axis_row's vertical blend, 8 floats a step: dst[i] = top[i] (1 - fy) + bot[i] fy for i < n
 * (rounded up to 8: the rows' padding). */
static void axis_blend_avx2(const float *top, const float *bot, float fy, float ify, int n, float *dst) {
    const __m256 vfy = _mm256_set1_ps(fy), vify = _mm256_set1_ps(ify);
    for (int i = 0; i < n; i += 8) _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(top + i), vify), _mm256_mul_ps(_mm256_loadu_ps(bot + i), vfy)));
}

/* The axis map's horizontal blend of one tile run, 2 columns per vector (each 128-bit half
 * one column's B G R + scratch): the same operations per value as axis_hrow's loop. Columns
 * xs .. xe - 1 in pairs; returns the first column it left (xe, or xe - 1 for an odd count). */
static int axis_run_avx2(const float *wi, const float *wf, const int *x0, int xs, int xe, const char *a0, int u8, float fill, float *dst, Py_ssize_t ahead) {
    int x = xs;
    if (u8) {
        const __m256 vfill = _mm256_set1_ps(fill);
        const uint8_t *b = (const uint8_t *)a0;
        for (; x + 2 <= xe; x += 2) {
            const uint8_t *a = b + (Py_ssize_t)x0[x] * 3, *c = b + (Py_ssize_t)x0[x + 1] * 3;
            if (ahead) __builtin_prefetch((const char *)a + ahead);
            int32_t w[4];
            memcpy(&w[0], a, 4), memcpy(&w[1], c, 4), memcpy(&w[2], a + 3, 4), memcpy(&w[3], c + 3, 4);
            const __m128i q = _mm_setr_epi32(w[0], w[1], w[2], w[3]);
            const __m256 p0 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q)), vfill);
            const __m256 p1 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_unpackhi_epi64(q, q))), vfill);
            const __m256 h = _mm256_add_ps(_mm256_mul_ps(p0, _mm256_loadu_ps(wi + 4 * x)), _mm256_mul_ps(p1, _mm256_loadu_ps(wf + 4 * x)));
            _mm_storeu_ps(dst + 3 * x, _mm256_castps256_ps128(h));
            _mm_storeu_ps(dst + 3 * x + 3, _mm256_extractf128_ps(h, 1));
        }
    } else {
        const float *b = (const float *)a0;
        for (; x + 2 <= xe; x += 2) {
            const float *a = b + (Py_ssize_t)x0[x] * 3, *c = b + (Py_ssize_t)x0[x + 1] * 3;
            if (ahead) __builtin_prefetch((const char *)a + ahead);
            const __m256 p0 = load2_m128(c, a), p1 = load2_m128(c + 3, a + 3);
            const __m256 h = _mm256_add_ps(_mm256_mul_ps(p0, _mm256_loadu_ps(wi + 4 * x)), _mm256_mul_ps(p1, _mm256_loadu_ps(wf + 4 * x)));
            _mm_storeu_ps(dst + 3 * x, _mm256_castps256_ps128(h));
            _mm_storeu_ps(dst + 3 * x + 3, _mm256_extractf128_ps(h, 1));
        }
    }
    return x;
}

/* axis_ihrow's tile run, 4 columns per vector: each column's 8 bytes from x0 (its two taps'
 * B G R and 2 more) in one load, interleaved into tap pairs, times its weight pair
 * (32 - ax, ax), adjacent products summed (maddubs: at most 255 * 32, no saturation) into
 * B G R + scratch int16. The caller checked that 8 bytes from the run's last x0 lie in the
 * image. Returns the first column it left. */
static int axis_irun_avx2(const int8_t *wb, const int *x0, int xs, int xe, const uint8_t *a0, int16_t *dst, Py_ssize_t ahead) {
    const __m256i pairs = _mm256_setr_epi8(0, 3, 1, 4, 2, 5, 6, 7, 8, 11, 9, 12, 10, 13, 14, 15, 0, 3, 1, 4, 2, 5, 6, 7, 8, 11, 9, 12, 10, 13, 14, 15);
    int x = xs;
    for (; x + 4 <= xe; x += 4) {
        const uint8_t *a = a0 + (Py_ssize_t)x0[x] * 3, *b = a0 + (Py_ssize_t)x0[x + 1] * 3;
        const uint8_t *c = a0 + (Py_ssize_t)x0[x + 2] * 3, *d = a0 + (Py_ssize_t)x0[x + 3] * 3;
        if (ahead) __builtin_prefetch((const char *)a + ahead); /* 4 columns span at most 12 / scale bytes */
        const __m128i lo = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a), _mm_loadl_epi64((const __m128i *)b));
        const __m128i hi = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)c), _mm_loadl_epi64((const __m128i *)d));
        const __m256i taps = _mm256_shuffle_epi8(_mm256_set_m128i(hi, lo), pairs);
        _mm256_storeu_si256((__m256i *)(dst + 4 * x), _mm256_maddubs_epi16(taps, _mm256_loadu_si256((const __m256i *)(wb + 8 * x))));
    }
    return x;
}

/* copy_reversed 32 bytes a step: the bytes of each 128-bit half reversed, then the halves swapped. */
static void copy_reversed_avx2(uint8_t *dst, const uint8_t *src, int n) {
    const __m256i rev = _mm256_setr_epi8(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i v = _mm256_shuffle_epi8(_mm256_loadu_si256((const __m256i *)(src + n - 32 - i)), rev);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_permute4x64_epi64(v, _MM_SHUFFLE(1, 0, 3, 2)));
    }
    for (; i < n; i++) dst[i] = src[n - 1 - i];
}

/* mirror_masked on an integer H row (4 int16 per column), 4 columns a vector: the mirrored
 * columns S-4-x .. S-1-x reversed as 64-bit lanes, taken where the mask byte is set; the
 * padding past S (what the output loop reads past the row end) copied as it is. */
static void mirror_masked_i_avx2(const uint8_t *mrow, int size, const int16_t *src, int16_t *dst) {
    const __m256i zero = _mm256_setzero_si256();
    int x = 0;
    for (; x + 4 <= size; x += 4) {
        int32_t m4;
        memcpy(&m4, mrow + x, 4);
        const __m256i set = _mm256_xor_si256(_mm256_cmpeq_epi64(_mm256_cvtepu8_epi64(_mm_cvtsi32_si128(m4)), zero), _mm256_set1_epi64x(-1));
        const __m256i own = _mm256_loadu_si256((const __m256i *)(src + 4 * x));
        const __m256i mir = _mm256_permute4x64_epi64(_mm256_loadu_si256((const __m256i *)(src + 4 * (size - 4 - x))), _MM_SHUFFLE(0, 1, 2, 3));
        _mm256_storeu_si256((__m256i *)(dst + 4 * x), _mm256_blendv_epi8(own, mir, set));
    }
    for (; x < size; x++) memcpy(dst + 4 * x, src + 4 * (mrow[x] ? size - 1 - x : x), 8);
    memcpy(dst + 4 * (Py_ssize_t)size, src + 4 * (Py_ssize_t)size, 8 * 8);
}

/* The direct path's output row in integers, 8 pixels a step: s = H_y0 (32 - ay) + H_y0+1 ay
 * per channel (madd of the interleaved rows), step 7's rounding, then the B, G, R planes (or,
 * with ``plan``, HSV on the integers as out_row_avx2 does; ``fill``: F, whose groups are
 * copied). Reads up to 7 pixels past size (the rows' padding); writes up to 7 bytes past size
 * (the planes' padding). */
static void out_row_i_avx2(const int16_t *top, const int16_t *bot, int ay, int fill, int size, uint8_t *pb, uint8_t *pg, uint8_t *pr, const HsvPlan *plan, int32_t *hi, int32_t *si, int32_t *vi) {
    const __m256i w = _mm256_set1_epi32((int32_t)(((uint32_t)ay << 16) | (uint32_t)(32 - ay)));
    const __m256 scale = _mm256_set1_ps(1.0f / 1024.0f);
    /* per 128-bit half: pixels a, b, c, d (4 bytes each) -> a b c d of B, then of G, R, scratch */
    const __m256i group = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    const __m256 c255 = _mm256_set1_ps(255.0f), gs = _mm256_set1_ps(plan ? plan->gs : 0.0f), gv = _mm256_set1_ps(plan ? plan->gv : 0.0f);
    uint8_t *const planes[3] = {pr, pg, pb};
    float off[3];
    hsv_offsets(plan ? plan->hue : 0, 1, off);
    /* With HSV, a group of 8 columns whose two H rows hold 32 F in every lane (mosaic gaps, the
     * canvas's border, a row that reads no canvas row) is the fill F in each channel, whose
     * value after HSV is the same for every such group: computed once here through the same
     * rows, then copied (about 7 % of the groups on coco128's detect route, besides whole rows). */
    const __m256i fill32 = _mm256_set1_epi16((int16_t)(32 * fill));
    uint8_t fillv[3][8] = {{0}};
    uint64_t fills[3]; /* R, G, B as in planes[] */
    if (plan) {
        uint8_t *const fp[3] = {fillv[0], fillv[1], fillv[2]};
        const __m256 f = _mm256_set1_ps((float)fill);
        __m256 h, sat, val;
        hsv_rows_avx2_fwdu(f, f, f, &h, &sat, &val);
        hsv_rows_avx2_back(fp, 0, V_TRUNC(h), V_TRUNC(_mm256_min_ps(_mm256_mul_ps(sat, gs), c255)), V_TRUNC(_mm256_min_ps(_mm256_mul_ps(val, gv), c255)), off);
    }
    for (int c = 0; c < 3; c++) memcpy(&fills[c], fillv[c], 8);
    int nfill = 0;
    for (int x = 0; x < size; x += 8) {
        const __m256i t0 = _mm256_loadu_si256((const __m256i *)(top + 4 * x)), t1 = _mm256_loadu_si256((const __m256i *)(top + 4 * x + 16));
        const __m256i b0 = _mm256_loadu_si256((const __m256i *)(bot + 4 * x)), b1 = _mm256_loadu_si256((const __m256i *)(bot + 4 * x + 16));
        /* only with HSV: without it the test costs about what the group's blend does; the top row
         * first, which settles most groups */
        if (plan && _mm256_movemask_epi8(_mm256_and_si256(_mm256_cmpeq_epi16(t0, fill32), _mm256_cmpeq_epi16(t1, fill32))) == -1 &&
            _mm256_movemask_epi8(_mm256_and_si256(_mm256_cmpeq_epi16(b0, fill32), _mm256_cmpeq_epi16(b1, fill32))) == -1) {
            for (int c = 0; c < 3; c++) memcpy(planes[c] + x, &fills[c], 8);
            hi[x] = -1; /* the back loop leaves this group as it is */
            nfill++;
            continue;
        }
        __m256 f[4]; /* f[2j + k]: B G R scratch of pixels 4j + k (low half) and 4j + k + 2 (high half), s / 1024 */
        for (int j = 0; j < 2; j++) { /* pixels x + 4j .. x + 4j + 3 */
            const __m256i t = j ? t1 : t0, b = j ? b1 : b0;
            for (int k = 0; k < 2; k++) /* k = 0: pixels 4j and 4j + 2; k = 1: 4j + 1 and 4j + 3 */
                f[2 * j + k] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(k ? _mm256_unpackhi_epi16(t, b) : _mm256_unpacklo_epi16(t, b), w)), scale);
        }
        if (plan) {
            /* step 7's rint, ties to even, of s / 1024 (exact in float32: s < 2^18), kept as floats
             * and taken apart into B, G, R of pixels x .. x + 7 for HSV's forward conversion: the
             * same integers as through the byte planes, with fewer operations */
            __m256 r[4];
            for (int i = 0; i < 4; i++) r[i] = _mm256_round_ps(f[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            const __m256 lo01 = _mm256_unpacklo_ps(r[0], r[1]), hi01 = _mm256_unpackhi_ps(r[0], r[1]); /* B0 B1 G0 G1 | B2 B3 G2 G3; R0 R1 .. */
            const __m256 lo23 = _mm256_unpacklo_ps(r[2], r[3]), hi23 = _mm256_unpackhi_ps(r[2], r[3]); /* the same for pixels 4-7 */
            const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7); /* pixels 0 1 4 5 | 2 3 6 7 -> 0 .. 7 */
            const __m256 B = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(lo01, lo23, _MM_SHUFFLE(1, 0, 1, 0)), order);
            const __m256 G = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(lo01, lo23, _MM_SHUFFLE(3, 2, 3, 2)), order);
            const __m256 R = _mm256_permutevar8x32_ps(_mm256_shuffle_ps(hi01, hi23, _MM_SHUFFLE(1, 0, 1, 0)), order);
            __m256 h, sat, val;
            hsv_rows_avx2_fwdu(R, G, B, &h, &sat, &val);
            v8_store_whole(hi + x, h), v8_store_i32(si + x, _mm256_min_ps(_mm256_mul_ps(sat, gs), c255)), v8_store_i32(vi + x, _mm256_min_ps(_mm256_mul_ps(val, gv), c255));
            continue;
        }
        /* step 7's rint, ties to even, of s / 1024: cvtps2dq (the default rounding mode) rounds
         * it as the float path does */
        __m256i q[4];
        for (int i = 0; i < 4; i++) q[i] = _mm256_cvtps_epi32(f[i]);
        /* halves: (x, x+1 | x+2, x+3) and (x+4, x+5 | x+6, x+7); bytes per half: x x+1 x+4 x+5 | x+2 x+3 x+6 x+7 */
        const __m256i bytes = _mm256_shuffle_epi8(_mm256_packus_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])), group);
        const __m128i lo = _mm256_castsi256_si128(bytes), hi128 = _mm256_extracti128_si256(bytes, 1);
        const __m128i bg = _mm_unpacklo_epi16(lo, hi128); /* B x..x+7, G x..x+7 */
        const __m128i rs = _mm_unpackhi_epi16(lo, hi128); /* R x..x+7, scratch */
        _mm_storel_epi64((__m128i *)(pb + x), bg);
        _mm_storel_epi64((__m128i *)(pg + x), _mm_srli_si128(bg, 8));
        _mm_storel_epi64((__m128i *)(pr + x), rs);
    }
    if (!plan) return;
    if (!nfill)
        for (int x = 0; x < size; x += 8) hsv_rows_avx2_back(planes, x, v8_load_i32(hi + x), v8_load_i32(si + x), v8_load_i32(vi + x), off);
    else /* hi holds float32 bits of a hue of at least 150, a positive int32: -1 marks a fill group */
        for (int x = 0; x < size; x += 8)
            if (hi[x] >= 0) hsv_rows_avx2_back(planes, x, v8_load_i32(hi + x), v8_load_i32(si + x), v8_load_i32(vi + x), off);
}
#pragma GCC pop_options
#endif

/* ---- 16 lanes (AVX-512F): the fill/quantise/HSV rows, 16 pixels a step ---- */
#ifdef HAVE_AVX512_PATH
#pragma GCC push_options
#pragma GCC target("avx512f")
#undef v4
#undef VM
#undef V_SET
#undef V_ADD
#undef V_SUB
#undef V_MUL
#undef V_DIV
#undef V_MAX
#undef V_MIN
#undef V_EQ
#undef V_GE
#undef V_SEL
#undef V_AND
#undef V_TRUNC
#undef V_GATHER
#undef V_STORE3_U8
#undef v_load_u8
#undef v_store_u8
#undef v_store_i32
#undef v_load_i32
typedef __m512 v16;
#define v4 v16
#define VM __mmask16 /* compares give mask registers here: selects and ands take them */
#define V_SET(x) _mm512_set1_ps(x)
#define V_ADD(a, b) _mm512_add_ps(a, b)
#define V_SUB(a, b) _mm512_sub_ps(a, b)
#define V_MUL(a, b) _mm512_mul_ps(a, b)
#define V_DIV(a, b) _mm512_div_ps(a, b)
#define V_MAX(a, b) _mm512_max_ps(a, b)
#define V_MIN(a, b) _mm512_min_ps(a, b)
#define V_EQ(a, b) _mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ)
#define V_GE(a, b) _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ)
#define V_SEL(m, a, b) _mm512_mask_blend_ps(m, b, a)
#define V_AND(m, a) _mm512_maskz_mov_ps(m, a)
#undef V_ABS
#define V_ABS(a) V_MAX(a, V_SUB(V_SET(0.0f), a))
#define V_TRUNC(a) _mm512_cvtepi32_ps(_mm512_cvttps_epi32(a))
#define v_load_u8 v16_load_u8
#define v_store_u8 v16_store_u8
#define v_store_i32 v16_store_i32
#define v_load_i32 v16_load_i32
static inline v16 v16_load_u8(const uint8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p))); }
/* Values 0..255.x here: the truncation, then the unsigned saturation, is what the 4- and
 * 8-lane packs give for them. */
static inline void v16_store_u8(uint8_t *p, v16 a) { _mm_storeu_si128((__m128i *)p, _mm512_cvtusepi32_epi8(_mm512_cvttps_epi32(a))); }
static inline void v16_store_i32(int32_t *p, v16 a) { _mm512_storeu_si512((void *)p, _mm512_cvttps_epi32(a)); }
static inline v16 v16_load_i32(const int32_t *p) { return _mm512_cvtepi32_ps(_mm512_loadu_si512((const void *)p)); }
#define V_GATHER(table, idx) _mm512_cvtepi32_ps(_mm512_i32gather_epi32(_mm512_cvttps_epi32(idx), table, 4))
#define V_STORE3_U8(planes, i, out) (v16_store_u8((planes)[0] + (i), (out)[0]), v16_store_u8((planes)[1] + (i), (out)[1]), v16_store_u8((planes)[2] + (i), (out)[2]))
#define HSV_FN hsv_rows_avx512
#define VL 16
#include "_kernel_hsv.h"
#undef HSV_FN
#undef VL

/* Channel c (0 B, 1 G, 2 R) of 16 interleaved pixels, floats 0..47 in a, b, c: two permutes. */
static inline __m512 channel16(__m512 a, __m512 b, __m512 c, int ch) {
    int i1[16], i2[16];
    for (int p = 0; p < 16; p++) {
        const int k = 3 * p + ch;
        i1[p] = k < 32 ? k : 0;
        i2[p] = k < 32 ? p : 16 + k - 32;
    }
    const __m512 ab = _mm512_permutex2var_ps(a, _mm512_loadu_si512((const void *)i1), b);
    return _mm512_permutex2var_ps(ab, _mm512_loadu_si512((const void *)i2), c);
}

/* out_row_avx2 in 16 lanes, 16 pixels a step: the same operations per value (the vertical
 * blend, the fill or the mixup blend, rint, the clip to 0..255); with ``plan`` then step 8,
 * forward and back in one loop (32 vector registers: nothing spills, so no work rows). */
static void out_row_avx512(float *ra, const float *rb, const float *top, const float *bot, float fy, float fillv, float ratio, float iratio, int size, int keep, uint8_t *pb, uint8_t *pg, uint8_t *pr, const HsvPlan *plan) {
    const __m512 fill = _mm512_set1_ps(fillv), vr = _mm512_set1_ps(ratio), vir = _mm512_set1_ps(iratio);
    const __m512 vfy = _mm512_set1_ps(fy), vify = _mm512_set1_ps(1.0f - fy);
    const __m512i zero = _mm512_setzero_si512(), c255i = _mm512_set1_epi32(255);
    const __m512 c255 = _mm512_set1_ps(255.0f), gs = _mm512_set1_ps(plan ? plan->gs : 0.0f), gv = _mm512_set1_ps(plan ? plan->gv : 0.0f);
    uint8_t *const planes[3] = {pr, pg, pb};
    float off[3];
    hsv_offsets(plan ? plan->hue : 0, 0, off);
    for (int x = 0; x < size; x += 16) {
        const int i = 3 * x;
        __m512 f[3];
        for (int j = 0; j < 3; j++) {
            __m512 a;
            if (top) /* axis_row's s = H_y0 (1 - fy) + H_y0+1 fy, then the fill */
                a = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(top + i + 16 * j), vify), _mm512_mul_ps(_mm512_loadu_ps(bot + i + 16 * j), vfy));
            else
                a = _mm512_loadu_ps(ra + i + 16 * j);
            if (rb) {
                const __m512 b = _mm512_loadu_ps(rb + i + 16 * j);
                a = _mm512_add_ps(_mm512_mul_ps(_mm512_add_ps(a, fill), vr), _mm512_mul_ps(_mm512_add_ps(b, fill), vir));
            } else a = _mm512_add_ps(a, fill);
            if (keep) _mm512_storeu_ps(ra + i + 16 * j, a);
            f[j] = a;
        }
        __m512i qi[3]; /* B, G, R: rint(f) */
        for (int c = 0; c < 3; c++) qi[c] = _mm512_cvtps_epi32(channel16(f[0], f[1], f[2], c));
        if (!plan) { /* clip to 0..255 as the packs do */
            _mm_storeu_si128((__m128i *)(pb + x), _mm512_cvtusepi32_epi8(_mm512_max_epi32(qi[0], zero)));
            _mm_storeu_si128((__m128i *)(pg + x), _mm512_cvtusepi32_epi8(_mm512_max_epi32(qi[1], zero)));
            _mm_storeu_si128((__m128i *)(pr + x), _mm512_cvtusepi32_epi8(_mm512_max_epi32(qi[2], zero)));
            continue;
        }
        __m512 q[3]; /* clip(rint(f), 0, 255) */
        for (int c = 0; c < 3; c++) q[c] = _mm512_cvtepi32_ps(_mm512_min_epi32(_mm512_max_epi32(qi[c], zero), c255i));
        __m512 h, sat, val;
        hsv_rows_avx512_fwdv(q[2], q[1], q[0], &h, &sat, &val);
        hsv_rows_avx512_back(planes, x, h, V_TRUNC(_mm512_min_ps(_mm512_mul_ps(sat, gs), c255)), V_TRUNC(_mm512_min_ps(_mm512_mul_ps(val, gv), c255)), off);
    }
}
#pragma GCC pop_options
#endif

static long lanes_in_use(void) { return lanes16 ? 16 : lanes8 ? 8 : 4; }

static PyObject *py_simd(PyObject *self, PyObject *unused) { return PyLong_FromLong(lanes_in_use()); }

/* Whether this build and CPU have the loops of ``n`` lanes. */
static int lanes_available(int n) {
    if (n == 4) return 1;
#ifdef HAVE_AVX2_PATH
    __builtin_cpu_init();
    if (n == 8) return __builtin_cpu_supports("avx2");
    if (n == 16) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("avx512f");
#endif
    return 0;
}

static void use_lanes(int n) {
    lanes8 = n >= 8, lanes16 = n == 16;
    hsv_rows = hsv_rows_sse;
#ifdef HAVE_AVX2_PATH
    if (n == 8) hsv_rows = hsv_rows_avx2;
    if (n == 16) hsv_rows = hsv_rows_avx512;
#endif
}

/* Tests: run the 4-lane (SSE2), 8-lane (AVX2) or 16-lane (AVX-512F) loops from now on, in
 * this process; returns the width in use before. A width the CPU lacks is refused. */
static PyObject *py_set_lanes(PyObject *self, PyObject *args) {
    int n;
    if (!PyArg_ParseTuple(args, "i", &n)) return NULL;
    const long before = lanes_in_use();
    if (!lanes_available(n)) {
        PyErr_Format(PyExc_ValueError, "set_lanes(%d): this build and CPU run 4 lanes (SSE2)%s", n,
#ifdef HAVE_AVX2_PATH
                     ", 8 (AVX2) or 16 (AVX-512F), where the CPU has them"
#else
                     ""
#endif
        );
        return NULL;
    }
    use_lanes(n);
    return PyLong_FromLong(before);
}

static PyObject *py_hsv_lookup_free(PyObject *self, PyObject *args) {
    Py_buffer tables;
    if (!PyArg_ParseTuple(args, "y*", &tables)) return NULL;
    if (tables.len != 768) {
        PyBuffer_Release(&tables);
        PyErr_SetString(PyExc_ValueError, "tables must hold 3 x 256 bytes");
        return NULL;
    }
    int32_t tab32[768];
    for (int i = 0; i < 768; i++) tab32[i] = ((const uint8_t *)tables.buf)[i];
    PyBuffer_Release(&tables);
    return PyBool_FromLong(hsv_plan(tab32).arith);
}

static PyMethodDef methods[] = {
    {"render", py_render, METH_VARARGS, "render(size, out, floats, layers, flip_ud, flip_lr, ratio, tables, fill): one sample in one pass"},
    {"simd", py_simd, METH_NOARGS, "simd(): the lane width in use (4, 8 or 16)"},
    {"set_lanes", py_set_lanes, METH_VARARGS, "set_lanes(n): run 4-lane (SSE2), 8-lane (AVX2) or 16-lane (AVX-512F) loops from now on; returns the width before (tests)"},
    {"hsv_lookup_free", py_hsv_lookup_free, METH_VARARGS, "hsv_lookup_free(tables): whether the HSV rows evaluate these tables without lookups (tests)"},
    {"hsv", py_hsv, METH_VARARGS, "hsv(image, tables): the integer HSV jitter, in place on uint8 (..., 3) RGB"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernel", "The fused render kernel (see kernel.py).", -1, methods};

PyMODINIT_FUNC PyInit__kernel(void) {
    /* The widest loops the CPU has, unless told fewer: PIXPOOL_KERNEL_SSE2=1 (4 lanes) or
     * PIXPOOL_KERNEL_LANES=4|8 (tests; a width the CPU lacks is ignored). */
    const char *force = getenv("PIXPOOL_KERNEL_SSE2"), *lanes = getenv("PIXPOOL_KERNEL_LANES");
    int n = lanes_available(16) ? 16 : lanes_available(8) ? 8 : 4;
    if (lanes && *lanes) {
        const int want = atoi(lanes);
        if (want < n && lanes_available(want)) n = want;
    }
    if (force && *force && *force != '0') n = 4;
    use_lanes(n);
    return PyModule_Create(&module);
}
