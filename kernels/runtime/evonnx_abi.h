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

#define EVO_ABI_VERSION 1
#define EVO_ERRLEN 512
#define EVO_MAX_RANK 16

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
    int32_t num_threads;                /* a hint, currently always 1: the API 21 header cannot ask the pool's
                                         * size. parallel_for still uses the whole pool; size tasks by work. */
} evo_args;

typedef struct evo_kernel {
    const char *name;                   /* matches the node attribute `kernel` */
    int32_t num_inputs;
    int32_t num_outputs;
    const int32_t *input_types;         /* expected ONNX element type per input; 0 = any (read for its shape) */
    const int32_t *input_ranks;         /* expected rank per input */
    const int32_t *output_types;        /* ONNX element type per output */
    const int32_t *output_ranks;        /* rank per output */
    /* Checks the input shapes and computes every output's dims into out_dims[o][0 .. output_ranks[o]).
     * Returns 0, or non-zero after writing a message (naming the kernel and what was wrong) into err. */
    int (*infer)(const int64_t *const *input_dims, const int32_t *input_ranks, int64_t *const *out_dims,
                 char *err);
    /* Computes every output. Returns 0, or non-zero after writing a message into err. */
    int (*compute)(const evo_args *args, char *err);
} evo_kernel;

/* Defined by the generated kernels object of each model library. */
extern const evo_kernel *const evo_kernel_table[];
extern const int32_t evo_kernel_count;
extern const char evo_library_model[]; /* the model file name the library was built for, for messages */

#ifdef __cplusplus
}
#endif

#endif /* EVONNX_ABI_H */
