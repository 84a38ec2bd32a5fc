
/* kernel $kernel: what to launch on CUDA (device code in the library's evo_cuda_image) */
static const char *const ${kernel}_cuda_entries[] = {
$entries
};

static int ${kernel}_cuda_plan(const int64_t *const *in_dims, int64_t *syms, evo_cuda_launch *launches,
                               char *err) {
    (void)err;
    (void)in_dims;
$sym_binding
$sym_fill
    double bound; /* an upper bound of |every index| a piece computes: _i32 only below 2^31 */
$launches
    return 0;
}

const evo_cuda_kernel ${kernel}_cuda = {$n_entries, ${kernel}_cuda_entries, $n_launches, $n_syms, ${kernel}_cuda_plan};
