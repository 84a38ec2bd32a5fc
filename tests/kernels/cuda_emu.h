/* Host emulation of the few CUDA constructs evonnx's generated device code uses, so tests can compile a model's
 * .cu with g++ and run every __global__ on the CPU: one call per emulated thread, blocks and threads set below.
 * Checks the generated index arithmetic, pieces, grid-stride loops and vector stores; not the GPU itself. */
#ifndef EVONNX_CUDA_EMU_H
#define EVONNX_CUDA_EMU_H
#include <math.h>
#include <stdint.h>

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__ __restrict

struct evo_emu_dim3 {
    unsigned int x, y, z;
};
extern thread_local evo_emu_dim3 blockIdx, threadIdx, gridDim;
struct uint2 {
    unsigned int x, y;
};
struct uint4 {
    unsigned int x, y, z, w;
};
#endif
