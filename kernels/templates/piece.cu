
/* $kernel, output $output ('$tensor'), piece $piece: $extent_note */
template <typename I>
__device__ __forceinline__ void ${fname}_body($params) {
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
