/* evonnx generated kernels for model '$model'. Generated code: do not edit; regenerate with evonnx optimize.
 * Each kernel starts with a comment naming its source nodes and the views it reads. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "evonnx_abi.h"

/* float16 elements are kept as their bits (evo_half) and converted where a kernel loads or stores them; every
 * operation on them is float32 (expr.HALF). The conversions are integer and float32 arithmetic that gcc vectorises
 * (it does not vectorise _Float16 conversions before gcc 13: a score filter ran 10x slower with them), in either
 * variant: exact from float16 (the exponent rebiased by a float multiply, which also normalises subnormals), and
 * rounded to nearest even to float16, overflowing to infinity, subnormal results rounded by a float addition
 * at 2^-24's granularity (bit for bit numpy's conversion on every float16 and on 20 million float32 patterns,
 * tests/kernels/test_float16.py). A NaN becomes the quiet NaN of its sign. */
$half
#ifdef EVO_HALF
typedef uint16_t evo_half;
static inline float evo_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static inline uint32_t evo_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float evo_h2f(evo_half h) {
    uint32_t em = (uint32_t)(h & 0x7fffu) << 13;
    uint32_t u = em >= (0x7c00u << 13) ? (em | 0x7f800000u) : evo_f32_bits(evo_bits_f32(em) * 0x1p112f);
    return evo_bits_f32(u | ((uint32_t)(h & 0x8000u) << 16));
}
static inline evo_half evo_f2h(float f) {
    uint32_t x = evo_f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    uint32_t sub = evo_f32_bits(evo_bits_f32(x) + 0.5f) - evo_f32_bits(0.5f);
    uint32_t nrm = (x - (112u << 23) + 0xfffu + ((x >> 13) & 1u)) >> 13;
    nrm = nrm < 0x7c00u ? nrm : 0x7c00u; /* overflow (inf and NaN included) to inf */
    /* a min, one `?:` and an or, not a chain of three `?:`: after a Clip or a Max (a compare and select of its own)
     * gcc 12 turned the chain into branches and left the loop scalar ("control flow in loop"), a float16
     * delta2bbox of 60,000 boxes 6 ms against its float32 twin's 0.25. Of the forms tried this one was also the
     * fastest where all vectorise (anchor_grid's loop; selects by masks alone ran 10% slower there) */
    uint32_t o = x < (113u << 23) ? sub : nrm;
    o |= -(uint32_t)(x > 0x7f800000u) & 0x7e00u; /* NaN: the quiet one */
    return (evo_half)(o | sign);
}
/* float16's rounding of a float32, as a float32: evo_h2f(evo_f2h(x)) bit for bit on every float32 (compared
 * exhaustively, both variants), in float arithmetic that gcc vectorises in about a third of the time (the value of
 * each float16 operation of a kernel rounds this way: expr.HALF). Adding S = 2^(E + 13) to |x|, E its exponent and
 * at least -14 (below float16's smallest normal number its step is 2^-24), leaves float16's 11 significant bits
 * rounded to nearest even; subtracting S gives them back exactly. 65520 and up round to 65536 or more: infinity,
 * as beyond float16's largest finite number, 65504. A NaN becomes the quiet NaN of its sign, as through evo_f2h. */
static inline float evo_round_h(float x) {
    const uint32_t u = evo_f32_bits(x);
    const uint32_t a = u & 0x7fffffffu;
    uint32_t e = a & 0x7f800000u;
    e = e < (113u << 23) ? (113u << 23) : e;
    e = e > (142u << 23) ? (142u << 23) : e; /* no overflow of S; such |x| (>= 2^16, inf, NaN) are settled below */
    const float s = evo_bits_f32(e + (13u << 23));
    const float r = (evo_bits_f32(a) + s) - s;
    uint32_t o = r >= 65536.0f ? 0x7f800000u : evo_f32_bits(r);
    o = a > 0x7f800000u ? 0x7fc00000u : o;
    return evo_bits_f32(o | (u & 0x80000000u));
}
#endif

/* Task functions are compiled twice on x86-64 by gcc: for x86-64-v3 (AVX2 and FMA, as onnxruntime's MLAS kernels
 * use them) and for the baseline. EVO_TASK(f) defines the body once (f_body, always inlined) and the two variants
 * f_v3 and f; EVO_PICK(a, f) picks one per Compute by evo_args.cpu_level, which the runtime sets when the kernel is
 * created: 3 where the CPU has x86-64-v3 and EVONNX_CPU_ISA is not "baseline". So the library stays portable while
 * vector loops run 8 floats wide where they can, and evonnx's check runs both variants (not gcc's target_clones,
 * whose resolver always picks the best one: a compiler bug in the variant the optimizing machine does not run would
 * reach a serving machine that runs it unchecked; gcc 12.2 drops the permutation of SLP-vectorised masked loads,
 * PR 114375, only in the v3 variant). -ffp-contract=off still applies: no FMA is introduced where the source has
 * none; the explicit fmaf of evo_sigmoid_f32 is exact on either variant (an instruction on v3, libm's correctly
 * rounded fmaf on the baseline), so results do not depend on the variant. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(EVO_NO_CLONES)
#define EVO_TASK(f)                                                                                                \
    static inline __attribute__((always_inline)) void f##_body(void *vctx, size_t task);                        \
    __attribute__((target("arch=x86-64-v3"))) static void f##_v3(void *vctx, size_t task) { f##_body(vctx, task); } \
    static void f(void *vctx, size_t task) { f##_body(vctx, task); }                                             \
    static inline __attribute__((always_inline)) void f##_body(void *vctx, size_t task)
#define EVO_PICK(a, f) ((a)->cpu_level >= 3 ? f##_v3 : f)
#else
#define EVO_TASK(f) static void f(void *vctx, size_t task)
#define EVO_PICK(a, f) ((void)(a), f)
#endif

/* An 8x8 block of 4-byte elements transposed in registers: t[r][c] -> o[c][r]. Three rounds of two-vector
 * shuffles of 8-lane vectors (unpack pairs, then 64-bit pairs, then 128-bit halves): AVX registers in the
 * x86-64-v3 clone of a task, pairs of SSE registers in the baseline one. Tiled tasks (task_tile.c) compute a
 * block in the order their input is laid out and store its transpose in the order their output is, so both the
 * reads and the writes are contiguous rows. Copies through memcpy keep any 4-byte type's bits unchanged. */
typedef float evo_v8 __attribute__((vector_size(32)));
typedef int32_t evo_v8i __attribute__((vector_size(32)));
#ifdef __clang__
#define EVO_SHUFFLE8(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define EVO_SHUFFLE8(a, b, ...) __builtin_shuffle(a, b, (evo_v8i){__VA_ARGS__})
#endif
/* always inlined: a task that calls it twice (a 16-wide block) got a call into the baseline copy from its x86-64-v3
 * clone, SSE shuffles in the AVX loop and 40% slower than inlined. The first two rounds, into c; rows 1 and 2 of
 * each half come out swapped (EVO_TRANSPOSE_ROW) */
static inline __attribute__((always_inline)) void evo_transpose_rounds(const void *t, evo_v8 c[8]) {
    evo_v8 b[8];
    for (int k = 0; k < 4; ++k) { /* row by row into registers: t copied as a whole went through 16-byte moves */
        evo_v8 x, y;
        memcpy(&x, (const char *)t + 2 * k * sizeof x, sizeof x);
        memcpy(&y, (const char *)t + (2 * k + 1) * sizeof y, sizeof y);
        b[2 * k] = EVO_SHUFFLE8(x, y, 0, 8, 1, 9, 4, 12, 5, 13);
        b[2 * k + 1] = EVO_SHUFFLE8(x, y, 2, 10, 3, 11, 6, 14, 7, 15);
    }
    for (int k = 0; k < 2; ++k) {
        for (int l = 0; l < 2; ++l) {
            c[4 * k + l] = EVO_SHUFFLE8(b[4 * k + l], b[4 * k + l + 2], 0, 1, 8, 9, 4, 5, 12, 13);
            c[4 * k + l + 2] = EVO_SHUFFLE8(b[4 * k + l], b[4 * k + l + 2], 2, 3, 10, 11, 6, 7, 14, 15);
        }
    }
}
/* the last round: from c's k and k + 4, rows EVO_TRANSPOSE_ROW(k) (lo) and EVO_TRANSPOSE_ROW(k) + 4 (hi) */
#define EVO_TRANSPOSE_ROW(k) ((k) == 1 ? 2 : (k) == 2 ? 1 : (k))
#define EVO_TRANSPOSE_LO(c, k) EVO_SHUFFLE8((c)[k], (c)[(k) + 4], 0, 1, 2, 3, 8, 9, 10, 11)
#define EVO_TRANSPOSE_HI(c, k) EVO_SHUFFLE8((c)[k], (c)[(k) + 4], 4, 5, 6, 7, 12, 13, 14, 15)
/* Row r of the transpose is stored at o plus r times `stride` elements, each one 8-element store from a register
 * (the cached loop of a tiled task, task_tile_loop.c). Stored into a block and copied on to the output rows with
 * memcpy, gcc 12 read the block back in 16-byte halves of its 32-byte stores, which the store buffer does not
 * forward: YOLOv5's decode at 640x640 ran 12% slower (benchmarks/ab_builds.py) */
static inline __attribute__((always_inline)) void evo_transpose8x8_to(const void *t, void *o, int64_t stride) {
    evo_v8 c[8];
    evo_transpose_rounds(t, c);
    for (int k = 0; k < 4; ++k) {
        const int r = EVO_TRANSPOSE_ROW(k);
        const evo_v8 lo = EVO_TRANSPOSE_LO(c, k), hi = EVO_TRANSPOSE_HI(c, k);
        memcpy((char *)o + (size_t)(r * stride) * sizeof(float), &lo, sizeof lo);
        memcpy((char *)o + (size_t)((r + 4) * stride) * sizeof(float), &hi, sizeof hi);
    }
}

/* Boxes: 8 rows of 4 elements of 4 bytes (32 contiguous, as a [N, 4] tensor holds 8 boxes) to and from the 4
 * columns of 8 lanes each, o[c][l] = p[4 * l + c]. Box tasks (task.c, codegen_c._box_block) read their inputs
 * and write their outputs through these, so that the arithmetic of 8 boxes runs in 8 lanes of one vector: gcc's
 * own choice for such loops puts the 4 coordinates of 2 boxes in a vector, and computes an exp or a log for all 4
 * where 2 of them need it (models/delta2bbox.onnx, 60,000 boxes at 1 thread: 364 -> 249 us). Bits only. */
/* single vectors, not arrays of them: gcc 12 keeps an array of vectors on the stack, and the 16-byte halves it
 * stores there and loads back as 32 bytes stall the loop (delta2bbox's task: 427 us, against 241 us). V is the
 * vector of 8 lanes, SH its shuffle, B its bytes (two rows of a box). */
#define EVO_BOXES(IN, OUT, V, SH, B)                                                                          \
    static inline __attribute__((always_inline)) void IN(const void *p, void *o) {                          \
        const char *q = (const char *)p;                                                                     \
        V a0, a1, a2, a3;                                                                                    \
        memcpy(&a0, q, B); /* rows 0 and 1 */                                                                \
        memcpy(&a1, q + B, B);                                                                               \
        memcpy(&a2, q + 2 * B, B);                                                                           \
        memcpy(&a3, q + 3 * B, B);                                                                           \
        const V b0 = SH(a0, a2, 0, 1, 2, 3, 8, 9, 10, 11); /* rows 0 | 4 */                                  \
        const V b1 = SH(a0, a2, 4, 5, 6, 7, 12, 13, 14, 15); /* rows 1 | 5 */                                \
        const V b2 = SH(a1, a3, 0, 1, 2, 3, 8, 9, 10, 11); /* rows 2 | 6 */                                  \
        const V b3 = SH(a1, a3, 4, 5, 6, 7, 12, 13, 14, 15); /* rows 3 | 7 */                                \
        /* each half: a 4x4 transpose of its 4 rows */                                                       \
        const V t0 = SH(b0, b1, 0, 8, 1, 9, 4, 12, 5, 13);                                                   \
        const V t1 = SH(b0, b1, 2, 10, 3, 11, 6, 14, 7, 15);                                                 \
        const V t2 = SH(b2, b3, 0, 8, 1, 9, 4, 12, 5, 13);                                                   \
        const V t3 = SH(b2, b3, 2, 10, 3, 11, 6, 14, 7, 15);                                                 \
        const V c0 = SH(t0, t2, 0, 1, 8, 9, 4, 5, 12, 13);                                                   \
        const V c1 = SH(t0, t2, 2, 3, 10, 11, 6, 7, 14, 15);                                                 \
        const V c2 = SH(t1, t3, 0, 1, 8, 9, 4, 5, 12, 13);                                                   \
        const V c3 = SH(t1, t3, 2, 3, 10, 11, 6, 7, 14, 15);                                                 \
        char *r = (char *)o;                                                                                 \
        memcpy(r, &c0, B);                                                                                   \
        memcpy(r + B, &c1, B);                                                                               \
        memcpy(r + 2 * B, &c2, B);                                                                           \
        memcpy(r + 3 * B, &c3, B);                                                                           \
    }                                                                                                        \
    static inline __attribute__((always_inline)) void OUT(const void *i, void *p) {                         \
        const char *q = (const char *)i;                                                                     \
        V c0, c1, c2, c3;                                                                                    \
        memcpy(&c0, q, B);                                                                                   \
        memcpy(&c1, q + B, B);                                                                               \
        memcpy(&c2, q + 2 * B, B);                                                                           \
        memcpy(&c3, q + 3 * B, B);                                                                           \
        const V t0 = SH(c0, c1, 0, 8, 1, 9, 4, 12, 5, 13); /* rows 0, 1 columns 0, 1 | rows 4, 5 */          \
        const V t1 = SH(c0, c1, 2, 10, 3, 11, 6, 14, 7, 15); /* rows 2, 3 | rows 6, 7 */                     \
        const V t2 = SH(c2, c3, 0, 8, 1, 9, 4, 12, 5, 13); /* columns 2, 3 */                                \
        const V t3 = SH(c2, c3, 2, 10, 3, 11, 6, 14, 7, 15);                                                 \
        const V r0 = SH(t0, t2, 0, 1, 8, 9, 2, 3, 10, 11);                                                   \
        const V r1 = SH(t1, t3, 0, 1, 8, 9, 2, 3, 10, 11);                                                   \
        const V r2 = SH(t0, t2, 4, 5, 12, 13, 6, 7, 14, 15);                                                 \
        const V r3 = SH(t1, t3, 4, 5, 12, 13, 6, 7, 14, 15);                                                 \
        char *r = (char *)p;                                                                                 \
        memcpy(r, &r0, B);                                                                                   \
        memcpy(r + B, &r1, B);                                                                               \
        memcpy(r + 2 * B, &r2, B);                                                                           \
        memcpy(r + 3 * B, &r3, B);                                                                           \
    }
EVO_BOXES(evo_boxes_in, evo_boxes_out, evo_v8, EVO_SHUFFLE8, 32)

/* The same for boxes of 2-byte elements (float16 as its bits): 8 rows of 4 are 64 bytes, 4 columns of 8 lanes
 * of 16 bits, the same lane moves on 16-byte vectors; a block of 2-byte elements only takes 16 boxes through
 * evo_boxes_in2x16 below. */
typedef uint16_t evo_v8h __attribute__((vector_size(16)));
typedef int16_t evo_v8hi __attribute__((vector_size(16)));
#ifdef __clang__
#define EVO_SHUFFLE8H(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define EVO_SHUFFLE8H(a, b, ...) __builtin_shuffle(a, b, (evo_v8hi){__VA_ARGS__})
#endif
EVO_BOXES(evo_boxes_in2, evo_boxes_out2, evo_v8h, EVO_SHUFFLE8H, 16)

/* 16 boxes of 2-byte elements, as two blocks of 8: 4 columns of 16 lanes. A block of only 2-byte elements runs 16
 * boxes, so that gcc vectorises its lane loop with 32-byte vectors; with 8 lanes it took 16-byte ones, and 8
 * floats in two halves (float16 delta2bbox: 1.82 -> 1.12 ms). */
static inline __attribute__((always_inline)) void evo_boxes_in2x16(const void *p, void *o) {
    uint16_t a[4][8], b[4][8], (*r)[16] = (uint16_t(*)[16])o;
    evo_boxes_in2(p, a);
    evo_boxes_in2((const char *)p + 64, b);
    for (int c = 0; c < 4; ++c) {
        memcpy(r[c], a[c], 16);
        memcpy(r[c] + 8, b[c], 16);
    }
}
static inline __attribute__((always_inline)) void evo_boxes_out2x16(const void *i, void *p) {
    uint16_t a[4][8], b[4][8];
    const uint16_t(*r)[16] = (const uint16_t(*)[16])i;
    for (int c = 0; c < 4; ++c) {
        memcpy(a[c], r[c], 16);
        memcpy(b[c], r[c] + 8, 16);
    }
    evo_boxes_out2(a, p);
    evo_boxes_out2(b, (char *)p + 64);
}

/* Blocks of 8 along w that one unit of a tiled task runs (task_tile.c): 256 floats, 1 KB per row read. */
#define EVO_TILE_CHUNK 32

/* A tiled task's output row of 16 4-byte elements (two rows of its 8x8 transposes, vectors `a` then `b`), stored
 * at `p` (EVO_STORE16). Where `p` starts a 64-byte cache line, the row is that whole line, stored around the cache
 * with non-temporal stores (SSE's movntps, in both clones of a task): a store that misses the cache otherwise
 * reads the line for ownership first, and a transpose's output rows are stored one line per input row, too far
 * apart for the hardware to see whole lines. mmdet RetinaNet's [1, 720, 80, 80] scores under Sigmoid, 18 MB:
 * 4.6 -> 3.4 ms in a harness (a plain copy 3.7 -> 1.9 ms) on an AMD EPYC with 2 MB of L2 per core and 32 MB of
 * L3; in the model, 4.4 -> 3.7 ms, and its 4.6 MB level 1.1 -> 1.0 ms, with no loss in the ReduceMax reading
 * them. A stream goes past the cache, so only the streamed loop of a tiled task (outputs larger than
 * EVO_STREAM_BYTES, rows whole lines apart) calls it. Bits only;
 * evo_stream_fence orders the stores before the task returns (they are weakly ordered). */
#define EVO_STREAM_BYTES (4.0 * 1024 * 1024)
#if defined(__SSE__) && (defined(__x86_64__) || defined(__i386__)) && (defined(__clang__) || __GNUC__ >= 12)
#include <xmmintrin.h>
/* 4 lanes of an 8-lane vector, from lane h; __builtin_shufflevector keeps them in registers (gcc 12 and clang) */
#define EVO_QUARTER(v, h) ((__m128)__builtin_shufflevector((v), (v), (h), (h) + 1, (h) + 2, (h) + 3))
/* a macro, not a function of two vectors: gcc notes that passing 32-byte vectors by value changed ABI (-Wpsabi) */
#define EVO_STORE16(p, a, b)                                                                                      \
    do {                                                                                                          \
        float *evo_d = (float *)(p);                                                                              \
        const evo_v8 evo_a = (a), evo_b = (b);                                                                    \
        if (((uintptr_t)evo_d & 63) == 0) {                                                                       \
            _mm_stream_ps(evo_d, EVO_QUARTER(evo_a, 0));                                                          \
            _mm_stream_ps(evo_d + 4, EVO_QUARTER(evo_a, 4));                                                      \
            _mm_stream_ps(evo_d + 8, EVO_QUARTER(evo_b, 0));                                                      \
            _mm_stream_ps(evo_d + 12, EVO_QUARTER(evo_b, 4));                                                     \
        } else {                                                                                                  \
            memcpy(evo_d, &evo_a, sizeof evo_a);                                                                  \
            memcpy(evo_d + 8, &evo_b, sizeof evo_b);                                                              \
        }                                                                                                         \
    } while (0)
static inline void evo_stream_fence(int stream) {
    if (stream)
        _mm_sfence();
}
#else
#define EVO_STORE16(p, a, b)                                                                                      \
    do {                                                                                                          \
        char *evo_d = (char *)(p);                                                                                \
        const evo_v8 evo_a = (a), evo_b = (b);                                                                    \
        memcpy(evo_d, &evo_a, sizeof evo_a);                                                                      \
        memcpy(evo_d + sizeof evo_a, &evo_b, sizeof evo_b);                                                       \
    } while (0)
static inline void evo_stream_fence(int stream) { (void)stream; }
#endif
/* Two 8x8 blocks, t's rows 0-7 and 8-15, transposed side by side: row r of the result, 16 elements, is row r of
 * the first block's transpose then row r of the second's, stored at o plus r times `stride` elements through
 * EVO_STORE16, from registers */
static inline __attribute__((always_inline)) void evo_transpose16x8_to(const void *t, void *o, int64_t stride) {
    evo_v8 c[8], e[8];
    evo_transpose_rounds(t, c);
    evo_transpose_rounds((const char *)t + sizeof c, e);
    for (int k = 0; k < 4; ++k) {
        const int r = EVO_TRANSPOSE_ROW(k);
        EVO_STORE16((char *)o + (size_t)(r * stride) * sizeof(float), EVO_TRANSPOSE_LO(c, k), EVO_TRANSPOSE_LO(e, k));
        EVO_STORE16((char *)o + (size_t)((r + 4) * stride) * sizeof(float), EVO_TRANSPOSE_HI(c, k),
                    EVO_TRANSPOSE_HI(e, k));
    }
}

/* Work below this many element-operations runs on the calling thread: handing it to the pool costs more. */
#define EVO_PAR_MIN 32768

/* Index arithmetic: floor division and floor modulo (C's / and % truncate). */
/* A divisor of 0 is reached only in loops that run no iteration (infer checks the divisors of output sizes),
 * and -1 would trap on INT64_MIN: neither reaches the hardware division. */
static inline int64_t evo_fdiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return (int64_t)(0 - (uint64_t)a);
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t evo_fmod(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
/* A float constant the compiler cannot see (cprint.Hoist.opaque: a Clip's bounds, declared before the loops). gcc 12
 * folds a comparison of a select with constants, min(max(x, lo), hi) < hi into (x < lo ? lo < hi : x < hi), and
 * then vectorises the clamp as three compares and their masks and blends (9 instructions); with bounds it cannot
 * see it keeps each ?: whole and emits vmaxps/vminps, whose operand order gives exactly `a < b ? b : a` (NaN and
 * zero signs included). The value is unchanged. */
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
static inline float evo_opaque_f32(float c) { __asm__("" : "+x"(c)); return c; }
static inline double evo_opaque_f64(double c) { __asm__("" : "+x"(c)); return c; }
#else
static inline float evo_opaque_f32(float c) { return c; }
static inline double evo_opaque_f64(double c) { return c; }
#endif
static inline int64_t evo_imin(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t evo_imax(int64_t a, int64_t b) { return a < b ? b : a; }

/* The element helpers are always inlined: a plain `static inline` is a hint that gcc drops once a large kernels.c
 * exceeds its inlining budget (inline-unit-growth), and a call per element keeps the loop around it scalar.
 * YOLOv4's 71 kernels: its Mish kernels called evo_softplus_f32 and ran 6x slower than the same kernel built alone
 * (189 ms against 25 ms on 5.5 M floats). */
#if defined(__GNUC__)
#define EVO_INLINE static inline __attribute__((always_inline))
#else
#define EVO_INLINE static inline
#endif
/* exp for float32 without a libm call, so loops around it vectorise: exp(x) = 2^n * exp(r), |r| <= ln2/2, with
 * Cephes' degree-6 polynomial (relative error about 1e-7, like onnxruntime's own vectorised exp, which is not
 * libm's either). evo_expf_poly gives exp(r) and n for an argument already clamped. */
EVO_INLINE float evo_expf_poly(float xc, int32_t *ni) {
    float n = xc * 1.44269504088896341f;
    n = (n + 12582912.0f) - 12582912.0f; /* round to nearest integer (1.5 * 2^23 trick) */
    float r = xc - n * 0.693359375f;
    r = r - n * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    *ni = (int32_t)n;
    return p * (r * r) + r + 1.0f;
}
/* 2^n is applied in two halves so that the overflow to inf above 88.72 and the gradual underflow to 0 below -87.3
 * come out as IEEE expf gives them. NaN propagates through the clamp. */
EVO_INLINE float evo_expf(float x) {
    int32_t ni;
    const float y = evo_expf_poly(x > 89.0f ? 89.0f : (x < -104.0f ? -104.0f : x), &ni);
    const int32_t n1 = ni / 2, n2 = ni - n1;
    union { float f; int32_t i; } s1, s2;
    s1.i = (n1 + 127) << 23;
    s2.i = (n2 + 127) << 23;
    return y * s1.f * s2.f;
}
/* evo_expf of an argument at most 88, or NaN (Softmax's x - max(x), at most 0, passes/lower_reduce.py; an exp of a
 * Clip's or Min's result under a constant at most 88, cprint): no overflow clamp, and 2^n applied in one step,
 * about half evo_expf's instructions in a vectorised loop (a DFL head's exps, a box decoder's clamped ones). The
 * bits of evo_expf from 88 down to -87.34, where exp reaches the subnormals, and a little below (the product rounds
 * once); from -88 on, -inf too, the clamp gives n = -127 and 2^n = +0, so 0 where exp is below 8.6e-39. */
EVO_INLINE float evo_expf_bounded(float x) {
    int32_t ni;
    const float y = evo_expf_poly(x < -88.0f ? -88.0f : x, &ni);
    union { float f; int32_t i; } s;
    s.i = (ni + 127) << 23;
    return y * s.f;
}

/* log for float32 without a libm call, so loops around it vectorise: Cephes' degree-8 polynomial on the mantissa
 * taken into [sqrt(1/2), sqrt(2)), plus the exponent times ln 2 in two parts. A subnormal is scaled by 2^23 into
 * the normal range first. At most 1 ulp from the correctly rounded logarithm over every positive float (99.4%
 * exact; onnxruntime's Log, Eigen's, is within 2). Selects, not branches: log(0) = -inf, log(+inf) = +inf, NaN
 * for NaN and below 0 (tests/kernels/test_vector_math.py). */
EVO_INLINE float evo_logf(float x) {
    const int sub = x < 1.17549435e-38f;
    const float xs = sub ? x * 8388608.0f : x;
    int32_t bits;
    memcpy(&bits, &xs, sizeof bits);
    int32_t e = ((bits >> 23) & 0xff) - 126 - (sub ? 23 : 0);
    const int32_t mbits = (bits & 0x007fffff) | 0x3f000000; /* the mantissa in [0.5, 1) */
    float m;
    memcpy(&m, &mbits, sizeof m);
    const int low = m < 0.707106781186547524f;
    e -= low;
    const float f = (low ? m + m : m) - 1.0f;
    const float z = f * f;
    float p = 7.0376836292e-2f;
    p = p * f - 1.1514610310e-1f;
    p = p * f + 1.1676998740e-1f;
    p = p * f - 1.2420140846e-1f;
    p = p * f + 1.4249322787e-1f;
    p = p * f - 1.6668057665e-1f;
    p = p * f + 2.0000714765e-1f;
    p = p * f - 2.4999993993e-1f;
    p = p * f + 3.3333331174e-1f;
    const float fe = (float)e;
    float y = p * f * z;
    y = y + fe * -2.12194440e-4f;
    y = y - 0.5f * z;
    float r = f + y;
    r = r + fe * 0.693359375f;
    r = x == __builtin_inff() ? x : r;
    r = x == 0.0f ? -__builtin_inff() : r;
    return (x < 0.0f || x != x) ? __builtin_nanf("") : r;
}

#define EVO_FN EVO_INLINE /* the helpers below, always inlined like evo_expf */
$helpers


/* Runs fn over [0, total) work items, split into tasks on onnxruntime's pool when the work is large. */
typedef struct evo_range {
    int64_t total;
    int64_t per;
} evo_range;

static void evo_run(const evo_args *a, evo_task_fn fn, void *ctx, evo_range *range, int64_t total,
                    int64_t cost) {
    range->total = total;
    if (total <= 0) return;
    /* Tasks of about EVO_PAR_MIN element-operations each; onnxruntime spreads them over its pool. */
    int64_t ntask = total * cost / EVO_PAR_MIN;
    if (ntask > 256) ntask = 256;
    if (ntask <= 1) {
        range->per = total;
        fn(ctx, 0);
        return;
    }
    int64_t per = (total + ntask - 1) / ntask;
    range->per = per;
    a->parallel_for(a->rt, fn, ctx, (size_t)((total + per - 1) / per));
}
