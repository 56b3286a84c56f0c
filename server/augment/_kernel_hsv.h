/* The HSV rows of _kernel.c, included once per lane width (VL) with the V_ lane macros
 * defined: R, G, B planes of n pixels (each buffer padded to a multiple of VL), jittered
 * in place; tab: the hue, saturation and value tables as int32 (3 x 256); hi, si, vi:
 * int32 work rows of the same padded length (used where there is no gather). */
static void HSV_FN(uint8_t *R, uint8_t *G, uint8_t *B, int n, const int32_t *tab, int32_t *hi, int32_t *si, int32_t *vi) {
    const v4 one = V_SET(1.0f), half = V_SET(0.5f), c255 = V_SET(255.0f), c30 = V_SET(30.0f), c180 = V_SET(180.0f);
    const v4 c4 = V_SET(4.0f), h_off = V_SET(180.5f), c120 = V_SET(120.0f), c179 = V_SET(179.0f), zero = V_SET(0.0f);
    const v4 c7650 = V_SET(7650.0f), c15300 = V_SET(15300.0f), r15300 = V_SET(1.0f / 15300.0f);
    uint8_t *planes[3] = {R, G, B};
    const float shift[3] = {150.0f, 90.0f, 30.0f}; /* 30 n for R (n = 5), G (3), B (1) */
    for (int i = 0; i < n; i += VL) {
        v4 r = v_load_u8(R + i), g = v_load_u8(G + i), b = v_load_u8(B + i);
        v4 v = V_MAX(r, V_MAX(g, b)), d = V_SUB(v, V_MIN(r, V_MIN(g, b)));
        v4 s = V_TRUNC(V_ADD(V_DIV(V_MUL(c255, d), V_MAX(v, one)), half));
        v4 mr = V_EQ(v, r), mg = V_EQ(v, g);
        v4 num = V_SEL(mr, V_SUB(g, b), V_SEL(mg, V_ADD(V_SUB(b, r), V_ADD(d, d)), V_ADD(V_SUB(r, g), V_MUL(c4, d))));
        v4 hh = V_TRUNC(V_ADD(V_DIV(V_MUL(c30, num), V_MAX(d, one)), h_off)); /* floor(q + 1/2) + 180 */
        v4 h = V_SUB(hh, V_AND(V_GE(hh, c180), c180));
#ifdef V_GATHER
        v4 h2 = V_MIN(V_GATHER(tab, h), c179), s2 = V_GATHER(tab + 256, s), v2 = V_GATHER(tab + 512, v);
        {
#else
        v_store_i32(hi + i, h), v_store_i32(si + i, s), v_store_i32(vi + i, v);
    }
    for (int i = 0; i < n; i++) hi[i] = tab[hi[i]], si[i] = tab[256 + si[i]], vi[i] = tab[512 + vi[i]];
    for (int i = 0; i < n; i += VL) {
        v4 h2 = V_MIN(v_load_i32(hi + i), c179), s2 = v_load_i32(si + i), v2 = v_load_i32(vi + i);
        {
#endif
            for (int c = 0; c < 3; c++) {
                v4 k = V_ADD(h2, V_SET(shift[c]));
                k = V_SUB(k, V_AND(V_GE(k, c180), c180));
                v4 w = V_MIN(V_MAX(V_MIN(k, V_SUB(c120, k)), zero), c30);
                /* floor(t / 15300), t = 2 V'(7650 - S'W) + 7650 < 2^22: the product with the
                 * rounded reciprocal is the quotient or one below it; one exact test corrects it. */
                v4 t = V_ADD(V_MUL(V_ADD(v2, v2), V_SUB(c7650, V_MUL(s2, w))), c7650);
                v4 q = V_TRUNC(V_MUL(t, r15300));
                q = V_ADD(q, V_AND(V_GE(t, V_MUL(V_ADD(q, one), c15300)), one));
                v_store_u8(planes[c] + i, q);
            }
        }
    }
}
