/* evonnx generated CUDA kernels for model '$model'. Generated code: do not edit; regenerate with evonnx optimize.
 *
 * Compiled by nvcc into one fatbin (CUBINs plus PTX) that the model's custom-op library embeds as data; the
 * library launches these with the CUDA driver API on onnxruntime's compute stream (evonnx_abi.h says how).
 * Each __global__ exists twice, `<name>_i32` and `<name>_i64`: the index arithmetic in 32 or 64 bits. The host
 * plan picks _i32 only when a bound of every index the piece computes stays below 2^31.
 * Built with --fmad=false: no fused multiply-add, so float results match onnxruntime's separate Mul and Add.
 */
#include <math.h>
#include <stdint.h>

#define EVO_CUDA_BLOCK 256 /* must equal evonnx_abi.h */

#pragma nv_diag_suppress 186 /* "pointless comparison of unsigned integer with zero" in the shared helpers */

/* Index arithmetic: floor division and floor modulo (C's / and % truncate), in the piece's index type. */
#define EVO_INDEX_HELPERS(I)                                                                               \
    __device__ __forceinline__ I evo_fdiv(I a, I b) {                                                     \
        I q = a / b;                                                                                       \
        return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;                                           \
    }                                                                                                      \
    __device__ __forceinline__ I evo_fmod(I a, I b) {                                                     \
        I r = a % b;                                                                                       \
        return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;                                               \
    }                                                                                                      \
    __device__ __forceinline__ I evo_imin(I a, I b) { return a < b ? a : b; }                              \
    __device__ __forceinline__ I evo_imax(I a, I b) { return a < b ? b : a; }
EVO_INDEX_HELPERS(int32_t)
EVO_INDEX_HELPERS(int64_t)

/* Min/Max/Relu/Sign as onnxruntime's kernels compute them (std::min / std::max argument order). */
#define EVO_ORDERED(T, S)                                                                                  \
    __device__ __forceinline__ T evo_min_##S(T a, T b) { return b < a ? b : a; }                           \
    __device__ __forceinline__ T evo_max_##S(T a, T b) { return a < b ? b : a; }                           \
    __device__ __forceinline__ T evo_relu_##S(T x) { return x < (T)0 ? (T)0 : x; }                        \
    __device__ __forceinline__ T evo_sign_##S(T x) { return (T)((x > (T)0) - (x < (T)0)); }
EVO_ORDERED(float, f32)
EVO_ORDERED(double, f64)
EVO_ORDERED(int64_t, i64)
EVO_ORDERED(int32_t, i32)
EVO_ORDERED(int16_t, i16)
EVO_ORDERED(int8_t, i8)
EVO_ORDERED(uint8_t, u8)
EVO_ORDERED(uint16_t, u16)
EVO_ORDERED(uint32_t, u32)
EVO_ORDERED(uint64_t, u64)

/* The CPU kernels' evo_expf is a polynomial that lets gcc vectorise loops; on the GPU, CUDA's own expf (within
 * 2 ulp, on the SFU) is fast already and is what onnxruntime's CUDA Exp uses. */
__device__ __forceinline__ float evo_expf(float x) { return expf(x); }

__device__ __forceinline__ float evo_abs_f32(float x) { return fabsf(x); }
__device__ __forceinline__ double evo_abs_f64(double x) { return fabs(x); }
__device__ __forceinline__ float evo_sigmoid_f32(float x) { return 1.0f / (1.0f + evo_expf(-x)); }
__device__ __forceinline__ double evo_sigmoid_f64(double x) { return 1.0 / (1.0 + exp(-x)); }
__device__ __forceinline__ float evo_softplus_f32(float x) {
    return x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x));
}
__device__ __forceinline__ double evo_softplus_f64(double x) { return x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x)); }

/* Integer division and remainder: truncating like C, wrapping on MIN/-1, and 0 instead of a trap on /0. */
#define EVO_SIGNED_DIV(T, U, S)                                                                            \
    __device__ __forceinline__ T evo_abs_##S(T x) { return x < 0 ? (T)(0 - (U)x) : x; }                   \
    __device__ __forceinline__ T evo_div_##S(T a, T b) {                                                  \
        if (b == 0) return 0;                                                                              \
        if (b == -1) return (T)(0 - (U)a);                                                                 \
        return (T)(a / b);                                                                                 \
    }                                                                                                      \
    __device__ __forceinline__ T evo_tmod_##S(T a, T b) { return (b == 0 || b == -1) ? 0 : (T)(a % b); }   \
    __device__ __forceinline__ T evo_pmod_##S(T a, T b) {                                                 \
        T r = evo_tmod_##S(a, b);                                                                          \
        return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;                                          \
    }
EVO_SIGNED_DIV(int64_t, uint64_t, i64)
EVO_SIGNED_DIV(int32_t, uint32_t, i32)
EVO_SIGNED_DIV(int16_t, uint16_t, i16)
EVO_SIGNED_DIV(int8_t, uint8_t, i8)
#define EVO_UNSIGNED_DIV(T, S)                                                                             \
    __device__ __forceinline__ T evo_abs_##S(T x) { return x; }                                            \
    __device__ __forceinline__ T evo_div_##S(T a, T b) { return b == 0 ? 0 : (T)(a / b); }                 \
    __device__ __forceinline__ T evo_tmod_##S(T a, T b) { return b == 0 ? 0 : (T)(a % b); }                \
    __device__ __forceinline__ T evo_pmod_##S(T a, T b) { return evo_tmod_##S(a, b); }
EVO_UNSIGNED_DIV(uint8_t, u8)
EVO_UNSIGNED_DIV(uint16_t, u16)
EVO_UNSIGNED_DIV(uint32_t, u32)
EVO_UNSIGNED_DIV(uint64_t, u64)

/* Grid-stride loop over the flattened work items of one piece; consecutive threads take consecutive items,
 * whose innermost coordinate is the fastest, so a warp's stores are consecutive in memory. The counter is
 * 64-bit whatever I is: f + stride cannot overflow, and the piece's own arithmetic starts from (I)f < total. */
#define EVO_GRID_STRIDE(f, total)                                                                         \
    for (long long f = (long long)blockIdx.x * EVO_CUDA_BLOCK + threadIdx.x; f < (total);                  \
         f += (long long)gridDim.x * EVO_CUDA_BLOCK)
