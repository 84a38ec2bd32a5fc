
/* $kernel, output $output ('$tensor'), piece $piece: $extent_note */
template <typename I>
__device__ __forceinline__ void ${fname}_body($params) {
    int evo_zero = 0; /* evo_nz_* records a zero divisor; onnxruntime's CUDA Div/Mod return a value there */
    (void)evo_zero;
$bindings
    EVO_GRID_STRIDE(f, total) {
$unravel
$body
    }
}
extern "C" __global__ void __launch_bounds__(EVO_CUDA_BLOCK) ${fname}_i32($params) {
    ${fname}_body<int32_t>($args);
}
extern "C" __global__ void __launch_bounds__(EVO_CUDA_BLOCK) ${fname}_i64($params) {
    ${fname}_body<int64_t>($args);
}
