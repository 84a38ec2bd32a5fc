/* evonnx generated CUDA kernels for model '$model'. Generated code: do not edit; regenerate with evonnx optimize.
 *
 * Compiled by nvcc into one fatbin (CUBINs plus PTX) that the model's custom-op library embeds as data; the
 * library launches these with the CUDA driver API on onnxruntime's compute stream (evonnx_abi.h says how).
 * Each __global__ exists twice, `<name>_i32` and `<name>_i64`: the index arithmetic in 32 or 64 bits. The host
 * plan picks _i32 only when a bound of every index the piece computes stays below 2^31.
 * Built with --fmad=false: no fused multiply-add, so float results match onnxruntime's separate Mul and Add.
 */
#ifdef __CUDACC_RTC__
/* NVRTC ships no C headers: what these kernels use of <stdint.h>, <limits.h> and <math.h>, as glibc defines it
 * on x86-64 and aarch64 (int64_t is long). NVRTC's math functions need no header. */
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long uint64_t;
typedef unsigned long uintptr_t;
#define INT8_MIN (-128)
#define INT8_MAX 127
#define UINT8_MAX 255
#define INT16_MIN (-32767 - 1)
#define INT16_MAX 32767
#define UINT16_MAX 65535
#define INT32_MIN (-2147483647 - 1)
#define INT32_MAX 2147483647
#define UINT32_MAX 4294967295U
#define INT64_C(c) c##L
#define UINT64_C(c) c##UL
#define INT64_MIN (-INT64_C(9223372036854775807) - 1)
#define INT64_MAX INT64_C(9223372036854775807)
#define UINT64_MAX UINT64_C(18446744073709551615)
#define INT_MIN INT32_MIN
#define INT_MAX INT32_MAX
#define SIZE_MAX UINT64_MAX
#define NAN __builtin_bit_cast(float, 0x7fc00000U) /* constant expressions, as glibc's */
#define INFINITY __builtin_bit_cast(float, 0x7f800000U)
#else
#include <math.h>
#include <stdint.h>
#endif

#define EVO_CUDA_BLOCK 256 /* must equal evonnx_abi.h */

/* float16 elements are kept as their bits (evo_half) and converted where a kernel loads or stores them; every
 * operation on them is float32 (expr.HALF). PTX's conversions need no header: exact one way, rounded to nearest
 * even the other (cvt.rn), as cuda_fp16.h's __half2float and __float2half are. */
$half
#ifdef EVO_HALF
typedef unsigned short evo_half;
__device__ __forceinline__ float evo_h2f(evo_half h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ evo_half evo_f2h(float f) {
    evo_half h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
__device__ __forceinline__ float evo_round_h(float f) { return evo_h2f(evo_f2h(f)); } /* as prelude.c's */
#endif

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

/* The CPU kernels' evo_expf is a polynomial that lets gcc vectorise loops; on the GPU, CUDA's own expf (within
 * 2 ulp, on the SFU) is fast already and is what onnxruntime's CUDA Exp uses. */
__device__ __forceinline__ float evo_expf(float x) { return expf(x); }
__device__ __forceinline__ float evo_expf_bounded(float x) { return expf(x); }
__device__ __forceinline__ float evo_logf(float x) { return logf(x); } /* likewise for the CPU's evo_logf */

#define EVO_FN __device__ __forceinline__
$helpers


/* Grid-stride loop over the flattened work items of one piece; consecutive threads take consecutive items,
 * whose innermost coordinate is the fastest, so a warp's stores are consecutive in memory. The counter is
 * 64-bit whatever I is: f + stride cannot overflow, and the piece's own arithmetic starts from (I)f < total. */
#define EVO_GRID_STRIDE(f, total)                                                                         \
    for (long long f = (long long)blockIdx.x * EVO_CUDA_BLOCK + threadIdx.x; f < (total);                  \
         f += (long long)gridDim.x * EVO_CUDA_BLOCK)
