
/* ---------------------------------------------------------------------------------------------------------
 * kernel $kernel
 * source nodes: $nodes
 * ops: $ops
$io_comment
 * ------------------------------------------------------------------------------------------------------- */
typedef struct ${kernel}_ctx {
    const void *in[$n_in_alloc];
    void *out[$n_out];
    int64_t sym[$n_sym_alloc];
    evo_range ranges[$n_ranges];
    int zero_div; /* bits of the tasks' failures: 1, an integer divisor of 0; 2, an index out of range */
} ${kernel}_ctx;
$tables$tasks
static int ${kernel}_infer(const int64_t *const *in_dims, const int32_t *in_ranks, int64_t *const *out_dims,
                           int32_t *out_ranks, char *err) {
    (void)in_ranks;
    (void)out_ranks;
$sym_binding
$checks
$out_dims
    return 0;
}

static int ${kernel}_compute(const evo_args *a, char *err) {
    (void)err;
    const int64_t *const *in_dims = a->input_dims;
$sym_binding
$hoisted
    ${kernel}_ctx c;
    memset(&c, 0, sizeof c);
$ctx_fill
$runs
$zero_div
    return 0;
}

static const int32_t ${kernel}_in_types[] = {$in_types};
static const int32_t ${kernel}_in_ranks[] = {$in_ranks};
static const int32_t ${kernel}_out_types[] = {$out_types};
static const int32_t ${kernel}_out_ranks[] = {$out_ranks};
#ifdef EVO_WITH_CUDA /* set by the build when the CUDA host code (codegen_cuda.generate_cuda_host) is appended */
extern const evo_cuda_kernel ${kernel}_cuda;
#define ${kernel}_CUDA (&${kernel}_cuda)
#else
#define ${kernel}_CUDA NULL
#endif
const evo_kernel ${kernel}_entry = {
    "$kernel", $n_in, $n_out, ${kernel}_in_types, ${kernel}_in_ranks, ${kernel}_out_types, ${kernel}_out_ranks,
    ${kernel}_infer, ${kernel}_compute, ${kernel}_CUDA, "$fingerprint",
};
