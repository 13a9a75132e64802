/* End-to-end test of the C API, compiled by the system C compiler (capi/tests/c_program.rs,
 * .ci/capi). Builds ggml-like strided tensors (a KV cache with spare capacity, V stored
 * transposed as llama.cpp's non-flash path does, padded and permuted Q), runs GQA causal
 * attention with LSE, and checks it against a plain double-precision loop written here and
 * against sdpa's f64 reference called through the C API. Then bad inputs, threads, a merge,
 * the element types: an f16 KV cache with f32 Q/out (llama.cpp's way) and all-bf16, a paged
 * decode over a shuffled block table and a packed variable-length batch, the same batch as a
 * plan run for two layers, and the float/half conversions.
 * Exit status 0 on success; every failed check prints a line. */
#include "sdpa.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            failures++;                                                                      \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                             \
            fprintf(stderr, __VA_ARGS__);                                                    \
            fprintf(stderr, "\n");                                                           \
        }                                                                                    \
    } while (0)

/* Runs `t` with `o` into `out` (LSE into `lt`) and sdpa's reference on the same arguments into
 * `out_ref` (`lt_ref`), checking that both succeed. */
static void fused_and_reference(sdpa_attention_args t, const sdpa_options *o, void *out,
                                void *out_ref, float *lt, float *lt_ref, const char *what) {
    t.out.data = out;
    t.lse = lt;
    sdpa_status st = sdpa_attention(&t, o);
    CHECK(st == SDPA_STATUS_OK, "%s: %s", what, sdpa_last_error_message());
    t.out.data = out_ref;
    t.lse = lt_ref;
    st = sdpa_reference_attention(&t, o);
    CHECK(st == SDPA_STATUS_OK, "%s reference: %s", what, sdpa_last_error_message());
}

/* Deterministic pseudo-random floats in [-1, 1). */
static unsigned long long rng_state = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) & 0xFFFFFF) / 8388608.0f - 1.0f;
}

enum { B = 2, NQ = 5, NKV = 13, CAP = 16, H = 8, HKV = 2, D = 32, QPAD = 3 };

static size_t at(const size_t strides[4], size_t b, size_t s, size_t h, size_t d) {
    return b * strides[0] + s * strides[1] + h * strides[2] + d * strides[3];
}

/* IEEE binary16 and bfloat16 as uint16_t bit patterns (C99 has no half type). Round to
 * nearest even; the values here are finite and far below f16's range. */
static uint16_t f32_to_f16(float x) {
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x), m;
    int e;
    if (a == 0.0) return sign;
    frexp(a, &e);
    e -= 1; /* a in [2^e, 2^(e+1)) */
    if (e < -14) return (uint16_t)(sign | (uint16_t)rint(a * 16777216.0)); /* 2^-24 units */
    m = rint(ldexp(a, 10 - e)); /* in [1024, 2048] */
    if (m == 2048.0) {
        m = 1024.0;
        e += 1;
    }
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)(m - 1024.0));
}

static float f16_to_f32(uint16_t h) {
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
    return (float)((h & 0x8000) ? -v : v);
}

static uint16_t f32_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* One query row against n keys and values given as row pointers (D contiguous floats each),
 * in double precision: returns max |out - expected| over the row and adds |lse - expected| to
 * the worst in *lse_err. A row with no key expects 0 and -inf. */
static double check_row(const float *qrow, const float *const *krows, const float *const *vrows,
                        size_t n, double scale, const float *orow, float lse, double *lse_err) {
    double s[64], m = -INFINITY, sum = 0.0, worst = 0.0;
    for (size_t j = 0; j < n; j++) {
        double dot = 0.0;
        for (size_t d = 0; d < D; d++) dot += (double)qrow[d] * (double)krows[j][d];
        s[j] = dot * scale;
        if (s[j] > m) m = s[j];
    }
    for (size_t j = 0; j < n; j++) sum += exp(s[j] - m);
    for (size_t d = 0; d < D; d++) {
        double acc = 0.0;
        for (size_t j = 0; j < n; j++) acc += exp(s[j] - m) / sum * (double)vrows[j][d];
        double err = fabs(acc - (double)orow[d]);
        if (err != err || err > worst) worst = err;
    }
    if (n == 0) {
        if (lse != -INFINITY) *lse_err = INFINITY;
    } else {
        double err = fabs(m + log(sum) - (double)lse);
        if (err != err || err > *lse_err) *lse_err = err;
    }
    return worst;
}

/* max |x - y| over n outputs of type dtype (f32, f16 or bf16 bit patterns). */
static double max_diff(const void *x, const void *y, size_t n, uint32_t dtype) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double a, b;
        if (dtype == SDPA_DTYPE_F32) {
            a = ((const float *)x)[i];
            b = ((const float *)y)[i];
        } else if (dtype == SDPA_DTYPE_F16) {
            a = f16_to_f32(((const uint16_t *)x)[i]);
            b = f16_to_f32(((const uint16_t *)y)[i]);
        } else {
            a = bf16_to_f32(((const uint16_t *)x)[i]);
            b = bf16_to_f32(((const uint16_t *)y)[i]);
        }
        double d = fabs(a - b);
        if (d != d || d > worst) worst = d; /* NaN counts as the worst */
    }
    return worst;
}

int main(void) {
    CHECK(sdpa_abi_version() == SDPA_ABI_VERSION, "ABI version %u vs header %u",
          sdpa_abi_version(), (unsigned)SDPA_ABI_VERSION);
    CHECK(sdpa_bf16_products_available() <= 1, "bf16 products available: %u",
          sdpa_bf16_products_available());
    CHECK(sdpa_amx_available() <= 1, "AMX available: %u", sdpa_amx_available());

    /* Q: stored [b][h][s][d] with each row padded by QPAD floats and 7 spare floats per batch
     * (a permuted view of a padded buffer). */
    size_t q_strides[4];
    q_strides[3] = 1;
    q_strides[1] = D + QPAD;
    q_strides[2] = NQ * (D + QPAD);
    q_strides[0] = H * NQ * (D + QPAD) + 7;
    size_t q_len = B * q_strides[0];
    /* K cache: llama.cpp's [n_ctx][n_head_kv][d] per batch with capacity CAP > NKV filled. */
    size_t k_strides[4] = {CAP * HKV * D, HKV * D, D, 1};
    size_t k_len = B * k_strides[0];
    /* V cache transposed (llama.cpp without flash attention): [n_head_kv][d][n_ctx]. */
    size_t v_strides[4] = {HKV * D * CAP, 1, D * CAP, CAP};
    size_t v_len = B * v_strides[0];
    /* out: ggml's [n_tokens][n_head][d], contiguous. */
    size_t o_strides[4] = {NQ * H * D, H * D, D, 1};
    size_t o_len = B * o_strides[0];

    float *q = malloc(q_len * sizeof(float));
    float *k = malloc(k_len * sizeof(float));
    float *v = malloc(v_len * sizeof(float));
    float *out = calloc(o_len, sizeof(float));
    float *out_ref = calloc(o_len, sizeof(float));
    float *out_1t = calloc(o_len, sizeof(float));
    float lse[B * H * NQ], lse_ref[B * H * NQ], lse_1t[B * H * NQ];
    if (!q || !k || !v || !out || !out_ref || !out_1t) {
        fprintf(stderr, "out of memory\n");
        return 2;
    }
    for (size_t i = 0; i < q_len; i++) q[i] = frand();
    for (size_t i = 0; i < k_len; i++) k[i] = frand();
    for (size_t i = 0; i < v_len; i++) v[i] = frand();

    sdpa_attention_args args;
    memset(&args, 0, sizeof args);
    args.size = sizeof args;
    args.q_dtype = SDPA_DTYPE_F32;
    args.kv_dtype = SDPA_DTYPE_F32;
    args.out_dtype = SDPA_DTYPE_F32;
    args.q.data = q;
    args.k.data = k;
    args.v.data = v;
    args.out.data = out;
    {
        size_t qd[4] = {B, NQ, H, D}, kd[4] = {B, NKV, HKV, D}, od[4] = {B, NQ, H, D};
        memcpy(args.q.dims, qd, sizeof qd);
        memcpy(args.k.dims, kd, sizeof kd);
        memcpy(args.v.dims, kd, sizeof kd);
        memcpy(args.out.dims, od, sizeof od);
    }
    memcpy(args.q.strides, q_strides, sizeof q_strides);
    memcpy(args.k.strides, k_strides, sizeof k_strides);
    memcpy(args.v.strides, v_strides, sizeof v_strides);
    memcpy(args.out.strides, o_strides, sizeof o_strides);
    args.lse = lse;
    args.lse_len = B * H * NQ;

    sdpa_options opts;
    memset(&opts, 0, sizeof opts);
    opts.size = sizeof opts;
    opts.has_scale = 1;
    opts.scale = 1.0f / sqrtf((float)D);
    opts.causal = SDPA_ALIGN_BOTTOM_RIGHT;

    /* 1. GQA causal attention with LSE on the fused kernel. */
    sdpa_status st = sdpa_attention(&args, &opts);
    CHECK(st == SDPA_STATUS_OK, "attention: %s: %s", sdpa_status_name(st),
          sdpa_last_error_message());
    CHECK(strcmp(sdpa_last_error_message(), "") == 0, "message after success: %s",
          sdpa_last_error_message());

    /* 2. Against a double-precision loop over the same strided memory. */
    double max_err = 0.0, max_lse_err = 0.0;
    for (size_t b = 0; b < B; b++) {
        for (size_t h = 0; h < H; h++) {
            size_t hk = h / (H / HKV);
            for (size_t i = 0; i < NQ; i++) {
                double s[NKV], m = -INFINITY, sum = 0.0;
                size_t last = i + (NKV - NQ); /* bottom-right causal: keys 0..=last */
                for (size_t j = 0; j <= last; j++) {
                    double dot = 0.0;
                    for (size_t d = 0; d < D; d++)
                        dot += (double)q[at(q_strides, b, i, h, d)] *
                               (double)k[at(k_strides, b, j, hk, d)];
                    s[j] = dot * (double)opts.scale;
                    if (s[j] > m) m = s[j];
                }
                for (size_t j = 0; j <= last; j++) sum += exp(s[j] - m);
                for (size_t d = 0; d < D; d++) {
                    double acc = 0.0;
                    for (size_t j = 0; j <= last; j++)
                        acc += exp(s[j] - m) / sum * (double)v[at(v_strides, b, j, hk, d)];
                    double err = fabs(acc - (double)out[at(o_strides, b, i, h, d)]);
                    if (err > max_err) max_err = err;
                }
                double err = fabs(m + log(sum) - (double)lse[(b * H + h) * NQ + i]);
                if (err > max_lse_err) max_lse_err = err;
            }
        }
    }
    CHECK(max_err < 1e-5, "fused vs C loop: max |out error| %g", max_err);
    CHECK(max_lse_err < 1e-5, "fused vs C loop: max |lse error| %g", max_lse_err);

    /* 3. Against sdpa's f64 reference through the C API. */
    sdpa_attention_args ref_args = args;
    ref_args.out.data = out_ref;
    ref_args.lse = lse_ref;
    st = sdpa_reference_attention(&ref_args, &opts);
    CHECK(st == SDPA_STATUS_OK, "reference: %s", sdpa_last_error_message());
    max_err = 0.0;
    for (size_t i = 0; i < o_len; i++) {
        double err = fabs((double)out[i] - (double)out_ref[i]);
        if (err > max_err) max_err = err;
    }
    CHECK(max_err < 1e-5, "fused vs reference: max |out error| %g", max_err);
    for (size_t i = 0; i < (size_t)(B * H * NQ); i++)
        CHECK(fabsf(lse[i] - lse_ref[i]) < 1e-5f, "lse[%zu]: %g vs %g", i, lse[i], lse_ref[i]);

    /* 4. One thread per calling thread: bitwise the same result. */
    CHECK(sdpa_set_num_threads(1) == SDPA_STATUS_OK, "set_num_threads(1)");
    CHECK(sdpa_get_num_threads() == 1, "get_num_threads");
    ref_args.out.data = out_1t;
    ref_args.lse = lse_1t;
    st = sdpa_attention(&ref_args, &opts);
    CHECK(st == SDPA_STATUS_OK, "one thread: %s", sdpa_last_error_message());
    CHECK(memcmp(out, out_1t, o_len * sizeof(float)) == 0, "one thread: different output");
    CHECK(memcmp(lse, lse_1t, sizeof lse) == 0, "one thread: different lse");
    sdpa_set_num_threads(0);

    /* 5. Bad inputs: each gives its status and the Rust error's text. */
    sdpa_attention_args bad = args;
    bad.q.dims[2] = 3; /* 3 query heads over 2 key/value heads */
    bad.out.dims[2] = 3;
    bad.lse_len = B * 3 * NQ;
    st = sdpa_attention(&bad, &opts);
    CHECK(st == SDPA_STATUS_HEADS_NOT_DIVISIBLE, "bad heads: %s", sdpa_status_name(st));
    CHECK(strcmp(sdpa_last_error_message(),
                 "query heads (3) must be a positive multiple of key/value heads (2)") == 0,
          "bad heads message: %s", sdpa_last_error_message());

    bad = args;
    bad.v.data = NULL;
    st = sdpa_attention(&bad, &opts);
    CHECK(st == SDPA_STATUS_NULL_POINTER, "null V: %s", sdpa_status_name(st));
    CHECK(strstr(sdpa_last_error_message(), "value tensor") != NULL, "null V message: %s",
          sdpa_last_error_message());

    bad = args;
    bad.kv_dtype = 7;
    st = sdpa_attention(&bad, &opts);
    CHECK(st == SDPA_STATUS_UNSUPPORTED_TYPE, "dtype 7: %s", sdpa_status_name(st));
    CHECK(strstr(sdpa_last_error_message(), "kv_dtype") != NULL, "dtype 7 message: %s",
          sdpa_last_error_message());

    bad = args;
    bad.size = 8;
    st = sdpa_attention(&bad, &opts);
    CHECK(st == SDPA_STATUS_INVALID_STRUCT_SIZE, "size 8: %s", sdpa_status_name(st));

    bad = args;
    bad.q.strides[0] = (size_t)-1; /* dims·strides overflow: an error, not a wild read */
    st = sdpa_attention(&bad, &opts);
    CHECK(st == SDPA_STATUS_LAYOUT_OVERFLOW, "overflow: %s", sdpa_status_name(st));

    bad = args;
    bad.out.data = q; /* writing over the queries */
    st = sdpa_attention(&bad, &opts);
    CHECK(st == SDPA_STATUS_ALIASED_BUFFERS, "aliased: %s", sdpa_status_name(st));

    sdpa_options bad_opts = opts;
    bad_opts.scale = NAN;
    st = sdpa_attention(&args, &bad_opts);
    CHECK(st == SDPA_STATUS_INVALID_SCALE, "NaN scale: %s", sdpa_status_name(st));
    CHECK(strcmp(sdpa_last_error_message(), "scale must be finite, got NaN") == 0,
          "NaN scale message: %s", sdpa_last_error_message());

    bad_opts = opts;
    bad_opts.window = SDPA_ALIGN_TOP_LEFT;
    bad_opts.window_left = 4;
    st = sdpa_attention(&args, &bad_opts);
    CHECK(st == SDPA_STATUS_CONFLICTING_ALIGNMENT, "alignments: %s", sdpa_status_name(st));

    /* 6. Split-KV: two halves of the keys (no mask), merged, equal the whole. */
    {
        sdpa_options plain;
        memset(&plain, 0, sizeof plain);
        plain.size = sizeof plain;
        float *whole = calloc(o_len, sizeof(float)), *merged = calloc(o_len, sizeof(float));
        float *p0 = calloc(o_len, sizeof(float)), *p1 = calloc(o_len, sizeof(float));
        float lw[B * H * NQ], l0[B * H * NQ], l1[B * H * NQ], lm[B * H * NQ];
        if (!whole || !merged || !p0 || !p1) return 2;
        sdpa_attention_args a = args;
        a.out.data = whole;
        a.lse = lw;
        CHECK(sdpa_attention(&a, &plain) == SDPA_STATUS_OK, "whole: %s",
              sdpa_last_error_message());
        size_t split = 6;
        a.k.dims[1] = a.v.dims[1] = split;
        a.out.data = p0;
        a.lse = l0;
        CHECK(sdpa_attention(&a, &plain) == SDPA_STATUS_OK, "part 0: %s",
              sdpa_last_error_message());
        a.k.data = k + split * k_strides[1];
        a.v.data = v + split * v_strides[1];
        a.k.dims[1] = a.v.dims[1] = NKV - split;
        a.out.data = p1;
        a.lse = l1;
        CHECK(sdpa_attention(&a, &plain) == SDPA_STATUS_OK, "part 1: %s",
              sdpa_last_error_message());

        sdpa_partial parts[2];
        parts[0].out.data = p0;
        parts[1].out.data = p1;
        parts[0].lse = l0;
        parts[1].lse = l1;
        for (int p = 0; p < 2; p++) {
            memcpy(parts[p].out.dims, args.out.dims, sizeof args.out.dims);
            memcpy(parts[p].out.strides, o_strides, sizeof o_strides);
            parts[p].lse_len = B * H * NQ;
        }
        sdpa_merge_args m;
        memset(&m, 0, sizeof m);
        m.size = sizeof m;
        m.dtype = SDPA_DTYPE_F32;
        m.parts = parts;
        m.n_parts = 2;
        m.out = args.out;
        m.out.data = merged;
        m.lse = lm;
        m.lse_len = B * H * NQ;
        st = sdpa_merge_partials(&m);
        CHECK(st == SDPA_STATUS_OK, "merge: %s", sdpa_last_error_message());
        max_err = 0.0;
        for (size_t i = 0; i < o_len; i++) {
            double err = fabs((double)whole[i] - (double)merged[i]);
            if (err > max_err) max_err = err;
        }
        CHECK(max_err < 1e-5, "merged vs whole: %g", max_err);
        for (size_t i = 0; i < (size_t)(B * H * NQ); i++)
            CHECK(fabsf(lw[i] - lm[i]) < 1e-5f, "merged lse[%zu]", i);
        m.n_parts = 0;
        st = sdpa_merge_partials(&m);
        CHECK(st == SDPA_STATUS_NO_PARTIALS, "no partials: %s", sdpa_status_name(st));
        CHECK(strcmp(sdpa_last_error_message(), "merge needs at least one partial result") == 0,
              "no partials message: %s", sdpa_last_error_message());
        free(whole);
        free(merged);
        free(p0);
        free(p1);
    }

    /* 7. Element types: the same strided layouts holding f16 / bf16 bit patterns (element
     * strides unchanged, 2-byte elements). Each typed run is checked against sdpa's reference
     * on the same typed inputs through the C API, within |fused - reference| <=
     * 2·u_out·max|v| + 1e-5 (u_out: 2^-11 f16, 2^-8 bf16, 2^-24 f32; max|v| <= 1 here), and
     * against the f32 run above within the inputs' own rounding. */
    {
        uint16_t *q16 = malloc(q_len * sizeof(uint16_t));
        uint16_t *k16 = malloc(k_len * sizeof(uint16_t));
        uint16_t *v16 = malloc(v_len * sizeof(uint16_t));
        uint16_t *kb = malloc(k_len * sizeof(uint16_t));
        uint16_t *vb = malloc(v_len * sizeof(uint16_t));
        uint16_t *qb = malloc(q_len * sizeof(uint16_t));
        float *o32 = calloc(o_len, sizeof(float)), *o32_ref = calloc(o_len, sizeof(float));
        uint16_t *ob = calloc(o_len, sizeof(uint16_t)), *ob_ref = calloc(o_len, sizeof(uint16_t));
        float lt[B * H * NQ], lt_ref[B * H * NQ];
        if (!q16 || !k16 || !v16 || !kb || !vb || !qb || !o32 || !o32_ref || !ob || !ob_ref)
            return 2;
        for (size_t i = 0; i < k_len; i++) {
            k16[i] = f32_to_f16(k[i]);
            kb[i] = f32_to_bf16(k[i]);
        }
        for (size_t i = 0; i < v_len; i++) {
            v16[i] = f32_to_f16(v[i]);
            vb[i] = f32_to_bf16(v[i]);
        }
        for (size_t i = 0; i < q_len; i++) {
            q16[i] = f32_to_f16(q[i]);
            qb[i] = f32_to_bf16(q[i]);
        }
        CHECK(f16_to_f32(f32_to_f16(0.1f)) == 0.0999755859375f, "f16 encoder");
        CHECK(bf16_to_f32(f32_to_bf16(0.1f)) == 0.10009765625f, "bf16 encoder");

        /* 7a. llama.cpp's way: an f16 KV cache (V transposed), f32 queries and output. */
        sdpa_attention_args t = args;
        t.kv_dtype = SDPA_DTYPE_F16;
        t.k.data = k16;
        t.v.data = v16;
        fused_and_reference(t, &opts, o32, o32_ref, lt, lt_ref, "f16 KV");
        double err = max_diff(o32, o32_ref, o_len, SDPA_DTYPE_F32);
        CHECK(err <= 2.0 * ldexp(1.0, -24) + 1e-5, "f16 KV vs reference: %g", err);
        for (size_t i = 0; i < (size_t)(B * H * NQ); i++)
            CHECK(fabsf(lt[i] - lt_ref[i]) < 1e-5f, "f16 KV lse[%zu]: %g vs %g", i, lt[i],
                  lt_ref[i]);
        err = max_diff(o32, out, o_len, SDPA_DTYPE_F32);
        CHECK(err < 4e-3, "f16 KV vs f32 KV: %g (more than the KV cache's rounding)", err);

        /* 7b. Everything bf16. */
        t = args;
        t.q_dtype = t.kv_dtype = t.out_dtype = SDPA_DTYPE_BF16;
        t.q.data = qb;
        t.k.data = kb;
        t.v.data = vb;
        fused_and_reference(t, &opts, ob, ob_ref, lt, lt_ref, "bf16");
        err = max_diff(ob, ob_ref, o_len, SDPA_DTYPE_BF16);
        CHECK(err <= 2.0 * ldexp(1.0, -8) + 1e-5, "bf16 vs reference: %g", err);
        for (size_t i = 0; i < (size_t)(B * H * NQ); i++)
            CHECK(fabsf(lt[i] - lt_ref[i]) < 1e-4f, "bf16 lse[%zu]: %g vs %g", i, lt[i],
                  lt_ref[i]);
        {
            double worst = 0.0;
            for (size_t i = 0; i < o_len; i++) {
                double d = fabs((double)bf16_to_f32(ob[i]) - (double)out[i]);
                if (d != d || d > worst) worst = d;
            }
            CHECK(worst < 5e-2, "bf16 vs f32: %g (more than bf16's rounding)", worst);
        }

        /* 7c. f16 pointers need 2-byte alignment, not 4; an odd address is misaligned. */
        t = args;
        t.kv_dtype = SDPA_DTYPE_F16;
        t.k.data = k16 + 1;
        t.k.dims[0] = 1; /* keep the shifted view inside the buffer */
        t.v.data = v16;
        t.v.dims[0] = 1;
        t.q.dims[0] = t.out.dims[0] = 1;
        t.lse_len = H * NQ;
        st = sdpa_attention(&t, &opts);
        CHECK(st == SDPA_STATUS_OK, "f16 K at 2 bytes: %s", sdpa_last_error_message());
        t.k.data = (const unsigned char *)k16 + 1;
        st = sdpa_attention(&t, &opts);
        CHECK(st == SDPA_STATUS_MISALIGNED, "f16 K at 1 byte: %s", sdpa_status_name(st));

        /* 7d. An 8-bit KV cache: K and V rounded to int8 (the same element strides), K with
         * per-(kv head, channel) scales, V with one scale, against the reference on the same
         * integers and scales. */
        {
            int8_t *k8 = malloc(k_len), *v8 = malloc(v_len);
            float ks[HKV * D], vs[1] = {1.0f / 127.0f};
            if (!k8 || !v8) return 2;
            for (size_t i = 0; i < k_len; i++) k8[i] = (int8_t)lrintf(k[i] * 127.0f);
            for (size_t i = 0; i < v_len; i++) v8[i] = (int8_t)lrintf(v[i] * 127.0f);
            for (size_t i = 0; i < HKV * D; i++) ks[i] = (float)(1 + i % 3) / 254.0f;
            sdpa_options o8 = opts;
            o8.size = sizeof o8;
            o8.k_scales = (sdpa_tensor){ks, {1, 1, HKV, D}, {HKV * D, HKV * D, D, 1}};
            o8.v_scales = (sdpa_tensor){vs, {1, 1, 1, 1}, {1, 1, 1, 1}};
            t = args;
            t.kv_dtype = SDPA_DTYPE_I8;
            t.k.data = k8;
            t.v.data = v8;
            fused_and_reference(t, &o8, o32, o32_ref, lt, lt_ref, "i8 KV");
            err = max_diff(o32, o32_ref, o_len, SDPA_DTYPE_F32);
            CHECK(err <= 3.0 * ldexp(1.0, -24) + 1e-5, "i8 KV vs reference: %g", err);
            st = sdpa_attention(&t, &opts);
            CHECK(st == SDPA_STATUS_KV_SCALES, "i8 KV without scales: %s", sdpa_status_name(st));
            free(k8);
            free(v8);
        }

        free(q16);
        free(k16);
        free(v16);
        free(qb);
        free(kb);
        free(vb);
        free(o32);
        free(o32_ref);
        free(ob);
        free(ob_ref);
    }

    /* 8. ALiBi slopes helper. */
    {
        float slopes[8];
        CHECK(sdpa_alibi_slopes(8, slopes, 8) == SDPA_STATUS_OK, "slopes");
        CHECK(slopes[0] == 0.5f && slopes[7] == 1.0f / 256.0f, "slopes values %g %g", slopes[0],
              slopes[7]);
        CHECK(sdpa_alibi_slopes(8, slopes, 4) == SDPA_STATUS_LENGTH_MISMATCH, "short slopes");
    }

    /* 9. Paged decode (vLLM's cache): pools [num_pages, page_size, H_kv, d], a shuffled block
     * table whose entries past each sequence's pages are garbage, key lengths from kv_lens.
     * Every slot no sequence reaches (a spare page, the tail of a last page) holds NaN, which
     * must not leak. Checked against a double loop over the table. */
    {
        enum { PB = 2, PS = 4, PPS = 4, NPAGES = PB * PPS + 1 };
        static const uint32_t table[PB * PPS] = {5, 2, 7, 0, 3, 8, 0xFFFFFFFFu, 6};
        static const size_t lens[PB] = {13, 6};
        size_t pool_len = (size_t)NPAGES * PS * HKV * D;
        float *kp = malloc(pool_len * sizeof(float)), *vp = malloc(pool_len * sizeof(float));
        float pq[PB * H * D], pout[PB * H * D], plse[PB * H];
        if (!kp || !vp) return 2;
        for (size_t i = 0; i < pool_len; i++) kp[i] = vp[i] = NAN;
        for (size_t b = 0; b < PB; b++)
            for (size_t j = 0; j < lens[b]; j++)
                for (size_t x = 0; x < HKV * D; x++) {
                    size_t at = (table[b * PPS + j / PS] * PS + j % PS) * HKV * D + x;
                    kp[at] = frand();
                    vp[at] = frand();
                }
        for (size_t i = 0; i < PB * H * D; i++) pq[i] = frand();

        sdpa_paged_args pa;
        memset(&pa, 0, sizeof pa);
        pa.size = sizeof pa;
        pa.q_dtype = pa.kv_dtype = pa.out_dtype = SDPA_DTYPE_F32;
        {
            size_t qd[4] = {PB, 1, H, D}, qs[4] = {H * D, H * D, D, 1};
            size_t pd[4] = {NPAGES, PS, HKV, D}, ps[4] = {PS * HKV * D, HKV * D, D, 1};
            memcpy(pa.q.dims, qd, sizeof qd);
            memcpy(pa.q.strides, qs, sizeof qs);
            memcpy(pa.out.dims, qd, sizeof qd);
            memcpy(pa.out.strides, qs, sizeof qs);
            memcpy(pa.k.dims, pd, sizeof pd);
            memcpy(pa.k.strides, ps, sizeof ps);
            memcpy(pa.v.dims, pd, sizeof pd);
            memcpy(pa.v.strides, ps, sizeof ps);
        }
        pa.q.data = pq;
        pa.k.data = kp;
        pa.v.data = vp;
        pa.out.data = pout;
        pa.block_table = table;
        pa.block_table_len = PB * PPS;
        pa.pages_per_seq = PPS;
        pa.lse = plse;
        pa.lse_len = PB * H;

        sdpa_options po;
        memset(&po, 0, sizeof po);
        po.size = sizeof po;
        po.causal = SDPA_ALIGN_BOTTOM_RIGHT; /* one decode row: sees every live key */
        po.kv_lens = lens;
        po.kv_lens_len = PB;
        st = sdpa_attention_paged(&pa, &po);
        CHECK(st == SDPA_STATUS_OK, "paged: %s: %s", sdpa_status_name(st),
              sdpa_last_error_message());

        double worst = 0.0, lse_err = 0.0;
        for (size_t b = 0; b < PB; b++)
            for (size_t h = 0; h < H; h++) {
                const float *kr[PPS * PS], *vr[PPS * PS];
                size_t hk = h / (H / HKV);
                for (size_t j = 0; j < lens[b]; j++) {
                    size_t at = ((table[b * PPS + j / PS] * PS + j % PS) * HKV + hk) * D;
                    kr[j] = kp + at;
                    vr[j] = vp + at;
                }
                double e = check_row(pq + (b * H + h) * D, kr, vr, lens[b],
                                     1.0 / sqrt((double)D), pout + (b * H + h) * D,
                                     plse[b * H + h], &lse_err);
                if (e != e || e > worst) worst = e;
            }
        CHECK(worst < 1e-5, "paged vs C loop: max |out error| %g", worst);
        CHECK(lse_err < 1e-5, "paged vs C loop: max |lse error| %g", lse_err);

        /* Errors: a table entry that a length reaches and that is not a page; no kv_lens. */
        {
            uint32_t bad_table[PB * PPS];
            memcpy(bad_table, table, sizeof table);
            bad_table[PPS + 1] = NPAGES;
            pa.block_table = bad_table;
            st = sdpa_attention_paged(&pa, &po);
            CHECK(st == SDPA_STATUS_INVALID_VALUE, "bad page: %s", sdpa_status_name(st));
            CHECK(strcmp(sdpa_last_error_message(),
                         "block table[5]: page index is not below the number of pages in the "
                         "pool") == 0,
                  "bad page message: %s", sdpa_last_error_message());
            pa.block_table = table;
        }
        po.kv_lens = NULL;
        po.kv_lens_len = 0;
        st = sdpa_attention_paged(&pa, &po);
        CHECK(st == SDPA_STATUS_LENGTH_MISMATCH, "paged without kv_lens: %s",
              sdpa_status_name(st));
        CHECK(strstr(sdpa_last_error_message(), "kv_lens") != NULL, "no kv_lens message: %s",
              sdpa_last_error_message());
        free(kp);
        free(vp);
    }

    /* 10. A packed variable-length batch (FlashAttention's varlen layout): a prefill chunk, an
     * empty sequence and a three-row chunk, K/V packed, int32 offsets, causal per sequence;
     * LSE [H, total_q]. Checked against a double loop per sequence. */
    {
        enum { VB = 3, TQ = 5, TK = 15 };
        static const int32_t cu_q[VB + 1] = {0, 2, 2, 5}, cu_k[VB + 1] = {0, 5, 8, 15};
        float vq[TQ * H * D], vk[TK * HKV * D], vv[TK * HKV * D], vout[TQ * H * D],
            vlse[H * TQ];
        for (size_t i = 0; i < TQ * H * D; i++) vq[i] = frand();
        for (size_t i = 0; i < TK * HKV * D; i++) {
            vk[i] = frand();
            vv[i] = frand();
        }
        sdpa_varlen_args va;
        memset(&va, 0, sizeof va);
        va.size = sizeof va;
        va.kv_layout = SDPA_KV_PACKED; /* and every dtype f32: all zero */
        {
            size_t qd[4] = {1, TQ, H, D}, qs[4] = {TQ * H * D, H * D, D, 1};
            size_t kd[4] = {1, TK, HKV, D}, ks[4] = {TK * HKV * D, HKV * D, D, 1};
            memcpy(va.q.dims, qd, sizeof qd);
            memcpy(va.q.strides, qs, sizeof qs);
            memcpy(va.out.dims, qd, sizeof qd);
            memcpy(va.out.strides, qs, sizeof qs);
            memcpy(va.k.dims, kd, sizeof kd);
            memcpy(va.k.strides, ks, sizeof ks);
            memcpy(va.v.dims, kd, sizeof kd);
            memcpy(va.v.strides, ks, sizeof ks);
        }
        va.q.data = vq;
        va.k.data = vk;
        va.v.data = vv;
        va.out.data = vout;
        va.cu_seqlens_q = cu_q;
        va.cu_seqlens_q_len = VB + 1;
        va.cu_seqlens_k = cu_k;
        va.cu_seqlens_k_len = VB + 1;
        va.lse = vlse;
        va.lse_len = H * TQ;
        sdpa_options vo;
        memset(&vo, 0, sizeof vo);
        vo.size = sizeof vo;
        vo.causal = SDPA_ALIGN_BOTTOM_RIGHT;
        st = sdpa_attention_varlen(&va, &vo);
        CHECK(st == SDPA_STATUS_OK, "varlen: %s: %s", sdpa_status_name(st),
              sdpa_last_error_message());

        double worst = 0.0, lse_err = 0.0;
        for (size_t b = 0; b < VB; b++) {
            size_t nq = (size_t)(cu_q[b + 1] - cu_q[b]), nk = (size_t)(cu_k[b + 1] - cu_k[b]);
            for (size_t i = 0; i < nq; i++)
                for (size_t h = 0; h < H; h++) {
                    const float *kr[TK], *vr[TK];
                    size_t t = (size_t)cu_q[b] + i, hk = h / (H / HKV);
                    size_t seen = i + (nk - nq) + 1; /* bottom-right causal, nk >= nq here */
                    for (size_t j = 0; j < seen; j++) {
                        size_t at = (((size_t)cu_k[b] + j) * HKV + hk) * D;
                        kr[j] = vk + at;
                        vr[j] = vv + at;
                    }
                    double e = check_row(vq + (t * H + h) * D, kr, vr, seen,
                                         1.0 / sqrt((double)D), vout + (t * H + h) * D,
                                         vlse[h * TQ + t], &lse_err);
                    if (e != e || e > worst) worst = e;
                }
        }
        CHECK(worst < 1e-5, "varlen vs C loop: max |out error| %g", worst);
        CHECK(lse_err < 1e-5, "varlen vs C loop: max |lse error| %g", lse_err);

        /* A negative offset is a typed error, not a huge size_t. */
        {
            static const int32_t neg[VB + 1] = {0, 2, -1, 5};
            va.cu_seqlens_q = neg;
            st = sdpa_attention_varlen(&va, &vo);
            CHECK(st == SDPA_STATUS_INVALID_VALUE, "negative offset: %s", sdpa_status_name(st));
            CHECK(strcmp(sdpa_last_error_message(), "cu_seqlens_q[2]: offset is negative") == 0,
                  "negative offset message: %s", sdpa_last_error_message());
        }

        /* 11. The same step as a plan, whose offsets are copies (the caller's array is
         * overwritten after sdpa_plan_new), run for two layers: the f32 K/V above (the varlen
         * call's bits) and the same K/V rounded to f16 by sdpa_f32_to_f16 (the bits of
         * sdpa_attention_varlen with an f16 K/V). The conversions agree with this file's. */
        {
            enum { NKV_ELEMS = TK * HKV * D };
            int32_t my_q[VB + 1];
            uint16_t hk[NKV_ELEMS], hv[NKV_ELEMS], hq[TQ * H * D];
            float back[NKV_ELEMS], qback[TQ * H * D], pout[TQ * H * D], plse[H * TQ],
                rout[TQ * H * D], rlse[H * TQ];
            size_t bad = 0;
            sdpa_plan *plan = NULL;
            sdpa_plan_args pl;
            sdpa_plan_run_args ra;
            memcpy(my_q, cu_q, sizeof my_q);
            memset(&pl, 0, sizeof pl);
            pl.size = sizeof pl;
            pl.kv_layout = SDPA_KV_PACKED;
            pl.heads = H;
            pl.kv_heads = HKV;
            pl.d_k = D;
            pl.d_v = D;
            pl.cu_seqlens_q = my_q;
            pl.cu_seqlens_q_len = VB + 1;
            pl.cu_seqlens_k = cu_k;
            pl.cu_seqlens_k_len = VB + 1;
            st = sdpa_plan_new(&pl, &vo, &plan);
            CHECK(st == SDPA_STATUS_OK && plan != NULL, "plan: %s", sdpa_last_error_message());
            memset(my_q, 0xff, sizeof my_q);

            memset(&ra, 0, sizeof ra);
            ra.size = sizeof ra;
            ra.q = va.q;
            ra.k = va.k;
            ra.v = va.v;
            ra.out = va.out;
            ra.out.data = pout;
            ra.lse = plse;
            ra.lse_len = H * TQ;
            st = sdpa_plan_run(plan, &ra);
            CHECK(st == SDPA_STATUS_OK, "plan layer 1: %s", sdpa_last_error_message());
            CHECK(memcmp(pout, vout, sizeof pout) == 0, "plan layer 1: not varlen's output");
            CHECK(memcmp(plse, vlse, sizeof plse) == 0, "plan layer 1: not varlen's lse");

            st = sdpa_f32_to_f16(vk, hk, NKV_ELEMS);
            CHECK(st == SDPA_STATUS_OK, "f32 to f16: %s", sdpa_last_error_message());
            st = sdpa_f32_to_f16(vv, hv, NKV_ELEMS);
            CHECK(st == SDPA_STATUS_OK, "f32 to f16: %s", sdpa_last_error_message());
            st = sdpa_f16_to_f32(hk, back, NKV_ELEMS);
            CHECK(st == SDPA_STATUS_OK, "f16 to f32: %s", sdpa_last_error_message());
            for (size_t i = 0; i < NKV_ELEMS; i++)
                bad += hk[i] != f32_to_f16(vk[i]) || back[i] != f16_to_f32(hk[i]);
            st = sdpa_f32_to_bf16(vq, hq, TQ * H * D);
            CHECK(st == SDPA_STATUS_OK, "f32 to bf16: %s", sdpa_last_error_message());
            for (size_t i = 0; i < TQ * H * D; i++) bad += hq[i] != f32_to_bf16(vq[i]);
            st = sdpa_bf16_to_f32(hq, qback, TQ * H * D);
            CHECK(st == SDPA_STATUS_OK, "bf16 to f32: %s", sdpa_last_error_message());
            for (size_t i = 0; i < TQ * H * D; i++) bad += qback[i] != bf16_to_f32(hq[i]);
            CHECK(bad == 0, "conversions: %zu values differ from this file's", bad);
            CHECK(sdpa_f32_to_f16(NULL, hk, 1) == SDPA_STATUS_NULL_POINTER, "NULL src");
            CHECK(sdpa_f16_to_f32(NULL, NULL, 0) == SDPA_STATUS_OK, "NULL with n = 0");

            ra.kv_dtype = SDPA_DTYPE_F16;
            ra.k.data = hk;
            ra.v.data = hv;
            st = sdpa_plan_run(plan, &ra);
            CHECK(st == SDPA_STATUS_OK, "plan layer 2: %s", sdpa_last_error_message());
            va.cu_seqlens_q = cu_q;
            va.kv_dtype = SDPA_DTYPE_F16;
            va.k.data = hk;
            va.v.data = hv;
            va.out.data = rout;
            va.lse = rlse;
            st = sdpa_attention_varlen(&va, &vo);
            CHECK(st == SDPA_STATUS_OK, "varlen f16: %s", sdpa_last_error_message());
            CHECK(memcmp(pout, rout, sizeof pout) == 0, "plan layer 2: not varlen's output");
            CHECK(memcmp(plse, rlse, sizeof plse) == 0, "plan layer 2: not varlen's lse");

            /* A layer of the wrong rows is a typed error. */
            ra.q.dims[1] = TQ - 1;
            st = sdpa_plan_run(plan, &ra);
            CHECK(st == SDPA_STATUS_SHAPE_MISMATCH, "plan bad Q: %s", sdpa_status_name(st));
            sdpa_plan_free(plan);
            sdpa_plan_free(NULL);
        }
    }

    free(q);
    free(k);
    free(v);
    free(out);
    free(out_ref);
    free(out_1t);
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("capi_test: all checks passed\n");
    return 0;
}
