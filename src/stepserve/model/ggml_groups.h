/* GGUF groups of 32 weights to float32 in registers, for ggml_kernels.c: the formats'
 * sizes, fp16 scales, and one group (or row) dequantised to exactly the float32 that
 * gguf-py produces (the exactness note below). The __AVX512F__ section
 * is the 16-lane form, built where the CPU has AVX-512.
 *
 * Exactness: each weight is dequantised in registers to exactly the float32 that gguf-py
 * (and so transformers, the reference) produces:
 *   Q4_1  w = d * q + m   d * q is exact in float32 (an 11-bit d times a 4-bit q), so
 *                         fma(q, d, m) rounds once, as numpy's (d * q) + m does;
 *   Q8_0  w = d * q       exact (AVX2: d * (q + 128) - 128 d, see dequant_group).
 * Products and sums are float32 FMAs: only the summation order differs from a BLAS GEMM
 * on the dequantised matrix (as any two GEMMs differ).
 *
 * Layout (quant.py builds it from the GGUF blocks), one row per output feature, K % 32 == 0:
 *   Q4_1  qs uint8 [N, K/2]: 16 bytes per group of 32; byte j holds element j in its low
 *         nibble and element j + 16 in its high nibble (the GGUF order);
 *         scales fp16 [N, K/32, 2]: (d, m) per group.
 *   Q8_0  qs int8 [N, K]; scales fp16 [N, K/32]: d per group.
 * The GGUF interleaves scales and quants in 20- and 34-byte blocks; loading an fp16 from
 * such a block costs a slow scalar insert per group, so quant.py splits them once.
 */
#ifndef STEPSERVE_GGML_GROUPS_H
#define STEPSERVE_GGML_GROUPS_H
#include <immintrin.h>
#include <stdint.h>

#include "kernel_abi.h"  /* the formats' ids */

#define QK 32
#define INLINE static inline __attribute__((always_inline))

/* The weights' sizes. */
INLINE int scales_per_group(int fmt) { return fmt == FMT_Q8_0 ? 1 : 2; }
INLINE int64_t qs_bytes_per_group(int fmt) { return fmt == FMT_Q8_0 ? QK : QK / 2; }

/* Output rows (weight rows) per task of a product's `omp for`: ggml_matmul_team's tasks,
 * which decode_kernels.c's prefetch_start follows. */
#define TASK_ROWS 16

/* Hints that the n bytes at p will be read soon, a cache line at a time. */
INLINE void prefetch_bytes(const void *p, int64_t n) {
    for (int64_t b = 0; b < n; b += 64)
        _mm_prefetch((const char *)p + b, _MM_HINT_T0);
}

INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The float vector of the build: 16 lanes with AVX-512, else 8; for loops written once
 * for both (tile_dot, decode_kernels.c's dot). */
#ifdef __AVX512F__
typedef __m512 vec;
#define VLEN 16
#define vzero _mm512_setzero_ps
#define vload _mm512_loadu_ps
#define vfmadd _mm512_fmadd_ps
#define vadd _mm512_add_ps
#define vsum _mm512_reduce_add_ps
#define vset1 _mm512_set1_ps
#define vmul _mm512_mul_ps
#define vsub _mm512_sub_ps
#define vdiv _mm512_div_ps
#define vmin _mm512_min_ps
#define vmax _mm512_max_ps
#define vstore _mm512_storeu_ps
typedef __m512i vint;
#define vcvt_int _mm512_cvtps_epi32  /* to nearest even */
#define vcvt_float _mm512_cvtepi32_ps
#define vpow2(n) _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n, _mm512_set1_epi32(127)), 23))
#else
typedef __m256 vec;
#define VLEN 8
#define vzero _mm256_setzero_ps
#define vload _mm256_loadu_ps
#define vfmadd _mm256_fmadd_ps
#define vadd _mm256_add_ps
#define vsum hsum
#define vset1 _mm256_set1_ps
#define vmul _mm256_mul_ps
#define vsub _mm256_sub_ps
#define vdiv _mm256_div_ps
#define vmin _mm256_min_ps
#define vmax _mm256_max_ps
#define vstore _mm256_storeu_ps
typedef __m256i vint;
#define vcvt_int _mm256_cvtps_epi32
#define vcvt_float _mm256_cvtepi32_ps
#define vpow2(n) _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n, _mm256_set1_epi32(127)), 23))
#endif

/* exp(x) a vector at a time, within 2 ulp of expf (Cephes' polynomial after splitting
 * off x = n ln2 + r, |r| <= ln2 / 2); x is clamped to [-87.3, 88.3], where the result
 * stays a normal float (exp(-inf) gives ~1e-38, not 0). Softmax and SiLU use it, as
 * torch's own kernels use a vectorised exp (not libm's expf either). */
INLINE vec vexp(vec x) {
    x = vmax(vmin(x, vset1(88.3f)), vset1(-87.3f));
    const vint n = vcvt_int(vmul(x, vset1(1.44269504088896341f)));
    const vec nf = vcvt_float(n);
    vec r = vfmadd(nf, vset1(-0.693359375f), x);  /* ln2 in two parts: exact n * hi */
    r = vfmadd(nf, vset1(2.12194440e-4f), r);
    vec y = vset1(1.9875691500e-4f);
    y = vfmadd(y, r, vset1(1.3981999507e-3f));
    y = vfmadd(y, r, vset1(8.3334519073e-3f));
    y = vfmadd(y, r, vset1(4.1665795894e-2f));
    y = vfmadd(y, r, vset1(1.6666665459e-1f));
    y = vfmadd(y, r, vset1(5.0000001201e-1f));
    y = vadd(vfmadd(y, vmul(r, r), r), vset1(1.0f));
    return vmul(y, vpow2(n));
}

/* One row's fp16 scales as float32 (n values). */
INLINE void halves_to_floats(const uint16_t *h, int64_t n, float *out) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++)
        out[i] = _cvtsh_ss(h[i]);
}

/* Byte shuffles that widen bytes to int32 within each 128-bit lane: with a group's 16
 * bytes in both lanes, WIDEN_0 makes bytes 0-3 | 4-7 and WIDEN_1 bytes 8-11 | 12-15 into
 * eight int32. (One in-lane vpshufb each: cheaper than vpmovzxbd, which crosses lanes.) */
#define Z -1
#define WIDEN_0 _mm256_setr_epi8(0, Z, Z, Z, 1, Z, Z, Z, 2, Z, Z, Z, 3, Z, Z, Z, \
                                 4, Z, Z, Z, 5, Z, Z, Z, 6, Z, Z, Z, 7, Z, Z, Z)
#define WIDEN_1 _mm256_setr_epi8(8, Z, Z, Z, 9, Z, Z, Z, 10, Z, Z, Z, 11, Z, Z, Z, \
                                 12, Z, Z, Z, 13, Z, Z, Z, 14, Z, Z, Z, 15, Z, Z, Z)

INLINE __m256i load_both_lanes(const uint8_t *p) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
}

/* The 32 weights of group g as four vectors of 8 (elements 0-7, 8-15, 16-23, 24-31). */
INLINE void dequant_group(int fmt, const uint8_t *qs, const float *sc, int64_t g, __m256 w[4]) {
    const __m256i widen0 = WIDEN_0, widen1 = WIDEN_1;
    if (fmt == FMT_Q4_1) {
        /* Bytes widened first, then each int32 lane split into its two nibbles (an and, a
         * shift): six integer ops a group instead of seven (and, shift, and, four
         * widenings), on a loop that is bound by its vector ops. */
        const __m256 d = _mm256_broadcast_ss(sc + 2 * g), m = _mm256_broadcast_ss(sc + 2 * g + 1);
        const __m256i mask = _mm256_set1_epi32(0x0F);
        const __m256i raw = load_both_lanes(qs + 16 * g);
        const __m256i a = _mm256_shuffle_epi8(raw, widen0);  /* bytes 0-7 */
        const __m256i b = _mm256_shuffle_epi8(raw, widen1);  /* bytes 8-15 */
        w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(a, mask)), d, m);
        w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, mask)), d, m);
        w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), d, m);
        w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), d, m);
    } else {
        /* q + 128 as an unsigned byte u, then w = d * u - 128 d: d * u and 128 d are exact
         * and so is their difference d * q, so the fma rounds nothing. */
        const __m256 d = _mm256_broadcast_ss(sc + g);
        const __m256 offset = _mm256_mul_ps(d, _mm256_set1_ps(-128.0f));
        const __m256i flip = _mm256_set1_epi8((char)0x80);
        const __m256i a = _mm256_xor_si256(load_both_lanes(qs + QK * g), flip);
        const __m256i b = _mm256_xor_si256(load_both_lanes(qs + QK * g + 16), flip);
        w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(a, widen0)), d, offset);
        w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(a, widen1)), d, offset);
        w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(b, widen0)), d, offset);
        w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_shuffle_epi8(b, widen1)), d, offset);
    }
}

#ifdef __AVX512F__
/* The 32 weights of group g as two vectors of 16 (elements 0-15, 16-31), the same
 * float32 values as dequant_group: Q4_1 fma(q, d, m); Q8_0 d * q, exact (an 11-bit d
 * times an 8-bit q). */
INLINE void dequant_group16(int fmt, const uint8_t *qs, const float *sc, int64_t g,
                            __m512 w[2]) {
    if (fmt == FMT_Q4_1) {
        /* The group's 16 possible weights fma(k, d, m), k = 0..15, then a lookup: vpermps
         * reads only the low 4 bits of each index lane, so the widened bytes index the low
         * nibbles (elements 0-15) as they are and, shifted right by 4, the high ones. */
        const __m512 d = _mm512_set1_ps(sc[2 * g]), m = _mm512_set1_ps(sc[2 * g + 1]);
        const __m512 k = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        const __m512 table = _mm512_fmadd_ps(k, d, m);
        const __m512i raw = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qs + 16 * g)));
        w[0] = _mm512_permutexvar_ps(raw, table);
        w[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(raw, 4), table);
    } else {
        const __m512 d = _mm512_set1_ps(sc[g]);
        const __m128i a = _mm_loadu_si128((const __m128i *)(qs + QK * g));
        const __m128i b = _mm_loadu_si128((const __m128i *)(qs + QK * g + 16));
        w[0] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(a)), d);
        w[1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), d);
    }
}
#endif

INLINE void dequant_row(int fmt, const uint8_t *wq, const uint16_t *wsc, int64_t K, float *out) {
    const int64_t groups = K / QK;
    float sc[groups * scales_per_group(fmt)];
    halves_to_floats(wsc, groups * scales_per_group(fmt), sc);
    for (int64_t g = 0; g < groups; g++) {
#ifdef __AVX512F__
        __m512 v[2];
        dequant_group16(fmt, wq, sc, g, v);
        _mm512_storeu_ps(out + g * QK, v[0]);
        _mm512_storeu_ps(out + g * QK + 16, v[1]);
#else
        __m256 v[4];
        dequant_group(fmt, wq, sc, g, v);
        for (int j = 0; j < 4; j++)
            _mm256_storeu_ps(out + g * QK + 8 * j, v[j]);
#endif
    }
}

#endif
