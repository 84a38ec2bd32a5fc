/* evonnx kernel ABI: the contract between generated kernels (compiled per model, plain C, no onnxruntime
 * headers) and the onnxruntime custom-op runtime (C++, compiled once per install against the ORT C API).
 *
 * A model's library `out.evonnx.so` = the runtime object + the generated kernels object. The runtime
 * registers one op, `ai.evonnx::Fused`, whose node attribute `kernel` names an entry of `evo_kernel_table`.
 *
 * Element types are ONNX TensorProto.DataType codes (1 float, 2 uint8, 3 int8, 5 int16, 6 int32, 7 int64,
 * 9 bool, 10 float16, 11 double, 12 uint32, 13 uint64, 4 uint16).
 */
#ifndef EVONNX_ABI_H
#define EVONNX_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EVO_ABI_VERSION 4
#define EVO_ERRLEN 512
#define EVO_MAX_RANK 16
/* Threads per block of every CUDA launch; the generated __global__ functions declare it as their bound. */
#define EVO_CUDA_BLOCK 256

/* One unit of parallel work: the runtime calls fn(data, i) for every i in [0, n) on onnxruntime's
 * intra-op thread pool (or inline when the pool has one thread). */
typedef void (*evo_task_fn)(void *data, size_t i);
typedef void (*evo_parallel_for_fn)(void *rt, evo_task_fn fn, void *data, size_t n);

typedef struct evo_args {
    int32_t num_inputs;
    int32_t num_outputs;
    const void *const *inputs;          /* input data pointers (NULL allowed for zero-size tensors) */
    const int64_t *const *input_dims;   /* input_dims[i][0 .. input_ranks[i]) */
    const int32_t *input_ranks;
    void *const *outputs;               /* output data pointers, allocated by onnxruntime */
    const int64_t *const *output_dims;  /* as computed by infer() */
    evo_parallel_for_fn parallel_for;   /* never NULL */
    void *rt;                           /* opaque, passed back to parallel_for */
    int32_t cpu_level;                  /* which variant of the task functions runs: 3 for x86-64-v3 (AVX2,
                                         * FMA), 1 for the baseline (prelude.c, EVO_PICK); set per kernel at
                                         * creation (EVONNX_CPU_ISA=baseline forces 1). parallel_for uses the
                                         * whole pool whatever its size: size tasks by work. */
} evo_args;

/* ---- CUDA (ABI 2) ----------------------------------------------------------------------------------------
 * A library built with `--target cuda|both` holds one fatbin (`evo_cuda_image`: CUBINs for the chosen
 * architectures plus PTX) with every kernel's __global__ functions, and, per kernel, host code that says what to
 * launch. Every __global__ takes, in order: one pointer per input (also for inputs read only for their shape),
 * one per output, one int64 per size symbol, and the int64 work-item count `total`; it runs a grid-stride loop
 * over [0, total), so any grid size is correct. The host code is plain C compiled with the kernels object: the
 * library has no link-time CUDA dependency, the runtime reaches the driver through dlopen. */
typedef struct evo_cuda_launch {
    int32_t entry;                      /* index into evo_cuda_kernel.entries */
    int64_t total;                      /* work items; the runtime skips a launch of 0 */
} evo_cuda_launch;

typedef struct evo_cuda_kernel {
    int32_t num_entries;
    const char *const *entries;         /* __global__ names in evo_cuda_image, resolved once per device */
    int32_t num_launches;               /* launches per Compute, made in this order on one stream */
    int32_t num_syms;                   /* int64 size arguments after the pointers */
    /* Called after infer() succeeded on the same dims: binds the size symbols into syms[0 .. num_syms) and
     * fills launches[0 .. num_launches) (each picks the 32-bit-index variant of its entry when every index it
     * computes fits, else the 64-bit one). Returns 0, or non-zero after writing a message into err. */
    int (*plan)(const int64_t *const *input_dims, int64_t *syms, evo_cuda_launch *launches, char *err);
} evo_cuda_kernel;

typedef struct evo_kernel {
    const char *name;                   /* matches the node attribute `kernel` */
    int32_t num_inputs;
    int32_t num_outputs;
    const int32_t *input_types;         /* expected ONNX element type per input; 0 = any (read for its shape) */
    const int32_t *input_ranks;         /* expected rank per input */
    const int32_t *output_types;        /* ONNX element type per output */
    const int32_t *output_ranks;        /* rank per output, as the model declares it */
    /* Checks the input shapes and computes every output's dims into out_dims[o][0 .. out_ranks[o]). The runtime
     * sets out_ranks[o] to output_ranks[o] first; infer may change it (at most EVO_MAX_RANK) for an output that
     * onnxruntime gives another rank where it has no element (ABI 4: a ReduceMax(axes=[-1], keepdims=0) of an
     * empty input keeps the input's shape in onnxruntime 1.31).
     * Returns 0, or non-zero after writing a message (naming the kernel and what was wrong) into err. */
    int (*infer)(const int64_t *const *input_dims, const int32_t *input_ranks, int64_t *const *out_dims,
                 int32_t *out_ranks, char *err);
    /* Computes every output. Returns 0, or non-zero after writing a message into err. */
    int (*compute)(const evo_args *args, char *err);
    /* The CUDA side of this kernel, or NULL when the library was built for the CPU only. */
    const evo_cuda_kernel *cuda;
    /* A digest of what the kernel computes (records.kernel_fingerprint). The Fused node carries the same string
     * in its attribute `fingerprint`; a node whose fingerprint differs, or is missing, is refused when the session
     * is created, so one model's library never runs another model's nodes. */
    const char *fingerprint;
} evo_kernel;

/* Defined by the generated kernels object of each model library. */
extern const evo_kernel *const evo_kernel_table[];
extern const int32_t evo_kernel_count;
extern const char evo_library_model[]; /* the model file name the library was built for, for messages */

/* The fatbin of a CUDA build, defined (hidden, in .rodata) by an object the build generates; weak, so a CPU-only
 * library leaves both undefined and their addresses NULL. Test `&evo_cuda_image_size != NULL` before reading. */
#if defined(__GNUC__)
#define EVO_WEAK __attribute__((weak))
#else
#define EVO_WEAK
#endif
extern const unsigned char evo_cuda_image[] EVO_WEAK;
extern const size_t evo_cuda_image_size EVO_WEAK;

#ifdef __cplusplus
}
#endif

#endif /* EVONNX_ABI_H */
