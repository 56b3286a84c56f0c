/* The HSV rows of _kernel.c, included once per lane width (VL) with the V_ lane macros
 * defined: R, G, B planes of n pixels (each buffer padded to a multiple of VL), jittered
 * in place; tab: the hue, saturation and value tables as int32 (3 x 256); plan: what
 * hsv_plan found the tables to be; hi, si, vi: int32 work rows of the same padded length
 * (used where there is no gather). */
#ifndef VM
#define VM v4 /* a lane mask: a vector of all-ones lanes, or an AVX-512 mask register */
#endif
#ifndef V_STORE3_U8 /* the three channels' values (0..255.x) into their planes at i */
#define V_STORE3_U8(planes, i, out) (v_store_u8((planes)[0] + (i), (out)[0]), v_store_u8((planes)[1] + (i), (out)[1]), v_store_u8((planes)[2] + (i), (out)[2]))
#endif
#ifndef V_ABS /* |a| of integer-valued lanes: max(a, -a) */
#define V_ABS(a) V_MAX(a, V_SUB(V_SET(0.0f), a))
#endif
#ifndef HSV_CAT
#define HSV_CAT_(a, b) a##b
#define HSV_CAT(a, b) HSV_CAT_(a, b)
#endif
#define HSV_FWD HSV_CAT(HSV_FN, _fwd)
#define HSV_FWDV HSV_CAT(HSV_FN, _fwdv)
#define HSV_FWDU HSV_CAT(HSV_FN, _fwdu)
#define HSV_BACK HSV_CAT(HSV_FN, _back)

/* The forward conversion of VL pixels r, g, b (integers 0..255 as floats): the hue plus 180
 * before its reduction mod 180 (150..210), saturation and value. */
static inline void HSV_FWDU(v4 r, v4 g, v4 b, v4 *ph, v4 *ps, v4 *pv) {
    const v4 one = V_SET(1.0f), half = V_SET(0.5f), c255 = V_SET(255.0f), c30 = V_SET(30.0f);
    const v4 c4 = V_SET(4.0f), h_off = V_SET(180.5f);
    v4 v = V_MAX(r, V_MAX(g, b)), d = V_SUB(v, V_MIN(r, V_MIN(g, b)));
    v4 s = V_TRUNC(V_ADD(V_DIV(V_MUL(c255, d), V_MAX(v, one)), half));
    VM mr = V_EQ(v, r), mg = V_EQ(v, g);
    v4 num = V_SEL(mr, V_SUB(g, b), V_SEL(mg, V_ADD(V_SUB(b, r), V_ADD(d, d)), V_ADD(V_SUB(r, g), V_MUL(c4, d))));
    *ph = V_TRUNC(V_ADD(V_DIV(V_MUL(c30, num), V_MAX(d, one)), h_off)); /* floor(q + 1/2) + 180 */
    *ps = s;
    *pv = v;
}

/* HSV_FWDU with the hue reduced to 0..179 (the table's index). */
static inline void HSV_FWDV(v4 r, v4 g, v4 b, v4 *ph, v4 *ps, v4 *pv) {
    const v4 c180 = V_SET(180.0f);
    v4 hh;
    HSV_FWDU(r, g, b, &hh, ps, pv);
    *ph = V_SUB(hh, V_AND(V_GE(hh, c180), c180));
}

/* The forward conversion of the VL pixels at i of the R, G, B planes. */
static inline void HSV_FWD(const uint8_t *R, const uint8_t *G, const uint8_t *B, int i, v4 *ph, v4 *ps, v4 *pv) {
    HSV_FWDV(v_load_u8(R + i), v_load_u8(G + i), v_load_u8(B + i), ph, ps, pv);
}

/* The back conversion of the VL pixels at i from h2 (a hue, reduced or not), S' and V';
 * off: hsv_offsets' for that hue's range. */
static inline void HSV_BACK(uint8_t *const *planes, int i, v4 h2, v4 s2, v4 v2, const float *off) {
    const v4 c90 = V_SET(90.0f), c30 = V_SET(30.0f), c60 = V_SET(60.0f), c7650 = V_SET(7650.0f), r15300 = V_SET(1.0f / 15300.0f);
    const v4 v2x2 = V_ADD(v2, v2);
    /* t = 2 V'(7650 - S'W) + 7650 with W = 60 - D, D = clamp(d, 30, 60): t = base + slope D,
     * base = 2 V'(7650 - 60 S') + 7650, slope = 2 V' S'. Every product and sum is an integer
     * of magnitude below 2^23, exact in float32, so t is the same integer in either order. */
    const v4 base = V_ADD(V_MUL(v2x2, V_SUB(c7650, V_MUL(c60, s2))), c7650), slope = V_MUL(v2x2, s2);
    v4 out[3];
    for (int c = 0; c < 3; c++) {
        /* W = clamp(min(K, 120 - K), 0, 30) = 60 - clamp(d, 30, 60), d the distance from K to 60
         * on the circle of 180: e = h2 + off[c] is K + 30 mod 180 and lies in -180..180, so
         * d = ||e| - 90| (test_augment_straightforward checks every hue, shift and range). */
        const v4 e = V_ADD(h2, V_SET(off[c]));
        const v4 d = V_MIN(V_MAX(V_ABS(V_SUB(V_ABS(e), c90)), c30), c60);
        /* floor(t / 15300), t < 2^22: the truncated product with the rounded reciprocal is
         * the quotient itself for every t these V', S', W can make
         * (test_augment_straightforward checks all 256 x 256 x 31). */
        out[c] = V_MUL(V_ADD(base, V_MUL(slope, d)), r15300);
    }
    V_STORE3_U8(planes, i, out);
}

static void HSV_FN(uint8_t *R, uint8_t *G, uint8_t *B, int n, const int32_t *tab, const HsvPlan *plan, int32_t *hi, int32_t *si, int32_t *vi) {
    const v4 c179 = V_SET(179.0f), c255 = V_SET(255.0f);
    uint8_t *const planes[3] = {R, G, B};
    float off[3];
    hsv_offsets(plan->arith ? plan->hue : 0, plan->arith, off);
    v4 h, s, v;
    if (plan->arith) {
        /* The tables are a hue shift and two clipped gains: no lookups. Two loops through the
         * work rows beat one: the fused loop runs out of registers and spills. */
        const v4 gs = V_SET(plan->gs), gv = V_SET(plan->gv);
        for (int i = 0; i < n; i += VL) {
            HSV_FWDU(v_load_u8(R + i), v_load_u8(G + i), v_load_u8(B + i), &h, &s, &v);
            v_store_i32(hi + i, h), v_store_i32(si + i, V_MIN(V_MUL(s, gs), c255)), v_store_i32(vi + i, V_MIN(V_MUL(v, gv), c255));
        }
        for (int i = 0; i < n; i += VL) HSV_BACK(planes, i, v_load_i32(hi + i), v_load_i32(si + i), v_load_i32(vi + i), off);
        return;
    }
#ifdef V_GATHER
    for (int i = 0; i < n; i += VL) {
        HSV_FWD(R, G, B, i, &h, &s, &v);
        HSV_BACK(planes, i, V_MIN(V_GATHER(tab, h), c179), V_GATHER(tab + 256, s), V_GATHER(tab + 512, v), off);
    }
#else
    for (int i = 0; i < n; i += VL) {
        HSV_FWD(R, G, B, i, &h, &s, &v);
        v_store_i32(hi + i, h), v_store_i32(si + i, s), v_store_i32(vi + i, v);
    }
    for (int i = 0; i < n; i++) hi[i] = tab[hi[i]], si[i] = tab[256 + si[i]], vi[i] = tab[512 + vi[i]];
    for (int i = 0; i < n; i += VL) HSV_BACK(planes, i, V_MIN(v_load_i32(hi + i), c179), v_load_i32(si + i), v_load_i32(vi + i), off);
#endif
}
#undef HSV_FWD
#undef HSV_FWDV
#undef HSV_FWDU
#undef HSV_BACK
