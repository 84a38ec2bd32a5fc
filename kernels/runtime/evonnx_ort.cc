// evonnx custom-op runtime: registers `ai.evonnx::Fused` with onnxruntime and runs a model's generated kernels,
// and `ai.evonnx::NonMaxSuppression` (evonnx_nms_op.h), which needs no generated code.
//
// Compiled once per install (kernels/build.py) and linked with each model's kernels object into
// `out.evonnx.so`; the contract with the kernels is evonnx_abi.h. Only onnxruntime's C API is used, built
// against the API 21 headers (onnxruntime 1.21): the OrtApi table is append-only, so asking for GetApi(21)
// works on every onnxruntime >= 1.21. The library's one exported symbol is RegisterCustomOps; it links no
// onnxruntime library, and no C++ exception may cross into onnxruntime.
//
// Checks happen as early as possible: the node's arity and the element types the graph declares are checked
// when the session is created (ORT allocates each output with the graph's declared type, whatever the kernel
// writes); shapes, known only at run time, are checked in every Compute.

#include <dlfcn.h>

#include <atomic>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <string>

#include "evonnx_abi.h"
#include "evonnx_nms.h"
#include "onnxruntime_c_api.h"

namespace {

constexpr const char* kDomain = "ai.evonnx";
constexpr const char* kOpName = "Fused";
constexpr const char* kKernelAttribute = "kernel";
constexpr const char* kFingerprintAttribute = "fingerprint";
constexpr size_t kMessageLen = EVO_ERRLEN + 512;  // a kernel's message plus our context around it
constexpr size_t kInlineTensors = 16;              // inputs/outputs handled without a heap allocation
constexpr int kListedKernels = 5;                  // how many available kernels a lookup error lists

OrtStatus* make_status(const OrtApi* api, OrtErrorCode code, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));

OrtStatus* make_status(const OrtApi* api, OrtErrorCode code, const char* fmt, ...) {
    char message[kMessageLen];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return api->CreateStatus(code, message);
}

const char* type_name(int32_t onnx_type) {
    switch (onnx_type) {
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "float";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8: return "uint8";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8: return "int8";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return "uint16";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16: return "int16";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "int32";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "int64";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING: return "string";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return "bool";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "float16";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "double";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32: return "uint32";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return "uint64";
        case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return "bfloat16";
        default: return "an unsupported type";
    }
}

// Inline storage for the common case and one heap block beyond it, so that Compute allocates nothing for
// nodes with up to kInlineTensors inputs and outputs. Elements are left uninitialised.
template <typename T, size_t Inline>
class SmallArray {
  public:
    explicit SmallArray(size_t n) : data_(n <= Inline ? inline_ : new T[n]) {}
    ~SmallArray() {
        if (data_ != inline_) delete[] data_;
    }
    SmallArray(const SmallArray&) = delete;
    SmallArray& operator=(const SmallArray&) = delete;

    T& operator[](size_t i) { return data_[i]; }
    T* data() { return data_; }

  private:
    T inline_[Inline];
    T* data_;
};

// Releases a tensor type-and-shape record on every path out of a scope.
class ShapeInfo {
  public:
    explicit ShapeInfo(const OrtApi* api) : api_(api) {}
    ~ShapeInfo() {
        if (info_ != nullptr) api_->ReleaseTensorTypeAndShapeInfo(info_);
    }
    ShapeInfo(const ShapeInfo&) = delete;
    ShapeInfo& operator=(const ShapeInfo&) = delete;

    OrtTensorTypeAndShapeInfo** out() { return &info_; }
    OrtTensorTypeAndShapeInfo* get() const { return info_; }

  private:
    const OrtApi* api_;
    OrtTensorTypeAndShapeInfo* info_ = nullptr;
};

#define EVO_RETURN_IF_ERROR(expr)                       \
    do {                                                \
        OrtStatus* evo_status_ = (expr);                \
        if (evo_status_ != nullptr) return evo_status_; \
    } while (0)

// ---------------------------------------------------------------------------------------------------------------
// Kernel lookup and the checks made at session creation (shared by every execution provider).

// One instance per graph node; read-only after creation, so concurrent Run() calls may share it.
struct FusedKernel {
    const OrtApi* api;
    const evo_kernel* kernel;
    std::string node_name;  // for messages
    int32_t cpu_level;      // evo_args.cpu_level: which variant of the task functions runs
};

// The CPU's level for the generated task functions (prelude.c, EVO_PICK): 3 where it has every x86-64-v3 feature,
// else 1. EVONNX_CPU_ISA=baseline forces 1, which is how evonnx's check runs the baseline variant on a machine that
// would pick the v3 one (a serving machine without AVX2 runs it); "auto" or unset picks by the CPU.
OrtStatus* cpu_level(const OrtApi* api, int32_t* out) {
    const char* forced = std::getenv("EVONNX_CPU_ISA");
    if (forced != nullptr && std::strcmp(forced, "baseline") == 0) {
        *out = 1;
        return nullptr;
    }
    if (forced != nullptr && forced[0] != '\0' && std::strcmp(forced, "auto") != 0) {
        return make_status(api, ORT_INVALID_ARGUMENT, "evonnx: EVONNX_CPU_ISA is '%.40s'; use 'auto' or 'baseline'",
                           forced);
    }
    *out = 1;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
#if defined(__clang__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
        __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c")) {
        *out = 3;
    }
#else
    if (__builtin_cpu_supports("x86-64-v3")) *out = 3;
#endif
#endif
    return nullptr;
}

const evo_kernel* find_kernel(const char* name) {
    for (int32_t i = 0; i < evo_kernel_count; ++i) {
        if (std::strcmp(evo_kernel_table[i]->name, name) == 0) return evo_kernel_table[i];
    }
    return nullptr;
}

OrtStatus* unknown_kernel_status(const OrtApi* api, const std::string& node, const std::string& name) {
    std::string available;
    for (int32_t i = 0; i < evo_kernel_count && i < kListedKernels; ++i) {
        if (i > 0) available += ", ";
        available += evo_kernel_table[i]->name;
    }
    if (evo_kernel_count > kListedKernels) {
        char more[32];
        snprintf(more, sizeof more, " and %d more", static_cast<int>(evo_kernel_count - kListedKernels));
        available += more;
    }
    if (available.empty()) available = "none";
    return make_status(api, ORT_INVALID_ARGUMENT,
                       "evonnx: this library (built for model '%s') has no kernel '%s' (node '%s'); it has %s. "
                       "Rebuild it with 'evonnx optimize'",
                       evo_library_model, name.c_str(), node.c_str(), available.c_str());
}

OrtStatus* read_node_name(const OrtApi* api, const OrtKernelInfo* info, std::string* out) {
    size_t size = 0;
    EVO_RETURN_IF_ERROR(api->KernelInfo_GetNodeName(info, nullptr, &size));
    out->assign(size, '\0');
    EVO_RETURN_IF_ERROR(api->KernelInfo_GetNodeName(info, &(*out)[0], &size));
    out->resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
    return nullptr;
}

OrtStatus* read_string_attribute(const OrtApi* api, const OrtKernelInfo* info, const std::string& node,
                                 const char* attribute, std::string* out) {
    size_t size = 0;
    OrtStatus* status = api->KernelInfoGetAttribute_string(info, attribute, nullptr, &size);
    if (status != nullptr) {
        OrtStatus* missing = make_status(api, ORT_INVALID_ARGUMENT,
                                         "evonnx: node '%s' (%s::%s) has no string attribute '%s' (%s)",
                                         node.c_str(), kDomain, kOpName, attribute,
                                         api->GetErrorMessage(status));
        api->ReleaseStatus(status);
        return missing;
    }
    out->assign(size, '\0');
    EVO_RETURN_IF_ERROR(api->KernelInfoGetAttribute_string(info, attribute, &(*out)[0], &size));
    out->resize(size > 0 ? size - 1 : 0);
    return nullptr;
}

// Element type of a node input or output as the graph declares it, or -1 when it is not a tensor.
OrtStatus* declared_type(const OrtApi* api, const OrtKernelInfo* info, bool is_input, size_t index,
                         int32_t* out) {
    OrtTypeInfo* type_info = nullptr;
    EVO_RETURN_IF_ERROR(is_input ? api->KernelInfo_GetInputTypeInfo(info, index, &type_info)
                                 : api->KernelInfo_GetOutputTypeInfo(info, index, &type_info));
    const OrtTensorTypeAndShapeInfo* tensor_info = nullptr;
    ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    OrtStatus* status = api->CastTypeInfoToTensorInfo(type_info, &tensor_info);
    if (status == nullptr && tensor_info != nullptr) status = api->GetTensorElementType(tensor_info, &type);
    api->ReleaseTypeInfo(type_info);
    *out = tensor_info != nullptr ? static_cast<int32_t>(type) : -1;
    return status;
}

OrtStatus* check_node_signature(const OrtApi* api, const OrtKernelInfo* info, const evo_kernel& k,
                                const std::string& node) {
    size_t num_inputs = 0, num_outputs = 0;
    EVO_RETURN_IF_ERROR(api->KernelInfo_GetInputCount(info, &num_inputs));
    EVO_RETURN_IF_ERROR(api->KernelInfo_GetOutputCount(info, &num_outputs));
    if (num_inputs != static_cast<size_t>(k.num_inputs) || num_outputs != static_cast<size_t>(k.num_outputs)) {
        return make_status(api, ORT_INVALID_ARGUMENT,
                           "evonnx: node '%s' has %zu inputs and %zu outputs, but kernel '%s' takes %d and "
                           "produces %d",
                           node.c_str(), num_inputs, num_outputs, k.name, k.num_inputs, k.num_outputs);
    }
    for (int32_t i = 0; i < k.num_inputs; ++i) {
        int32_t found = 0;
        EVO_RETURN_IF_ERROR(declared_type(api, info, true, static_cast<size_t>(i), &found));
        const bool any_type = k.input_types[i] == 0;  // an input read only for its shape
        if ((!any_type && found != k.input_types[i]) || k.input_ranks[i] > EVO_MAX_RANK) {
            return make_status(api, ORT_INVALID_ARGUMENT,
                               "evonnx: node '%s' (kernel '%s') input %d: expected %s, the graph declares %s",
                               node.c_str(), k.name, i, type_name(k.input_types[i]), type_name(found));
        }
    }
    for (int32_t o = 0; o < k.num_outputs; ++o) {
        int32_t found = 0;
        EVO_RETURN_IF_ERROR(declared_type(api, info, false, static_cast<size_t>(o), &found));
        if (found != k.output_types[o] || k.output_ranks[o] > EVO_MAX_RANK) {
            return make_status(api, ORT_INVALID_ARGUMENT,
                               "evonnx: node '%s' (kernel '%s') output %d: the kernel writes %s, the graph "
                               "declares %s (onnxruntime would allocate the declared type)",
                               node.c_str(), k.name, o, type_name(k.output_types[o]), type_name(found));
        }
    }
    return nullptr;
}

OrtStatus* create_fused_kernel(const OrtApi* api, const OrtKernelInfo* info, FusedKernel** out) {
    std::string node, name;
    EVO_RETURN_IF_ERROR(read_node_name(api, info, &node));
    EVO_RETURN_IF_ERROR(read_string_attribute(api, info, node, kKernelAttribute, &name));
    const evo_kernel* k = find_kernel(name.c_str());
    if (k == nullptr) return unknown_kernel_status(api, node, name);
    // The kernel's name alone does not say what it computes: two models can have kernels of the same name.
    std::string fingerprint;
    EVO_RETURN_IF_ERROR(read_string_attribute(api, info, node, kFingerprintAttribute, &fingerprint));
    if (k->fingerprint == nullptr || fingerprint != k->fingerprint) {
        return make_status(api, ORT_INVALID_ARGUMENT,
                           "evonnx: node '%s' needs kernel '%s' with fingerprint %s, but this library (built for "
                           "model '%s') has fingerprint %s for it: the model and the library do not belong "
                           "together. Register the library 'evonnx optimize' wrote next to this model",
                           node.c_str(), name.c_str(), fingerprint.c_str(), evo_library_model,
                           k->fingerprint != nullptr ? k->fingerprint : "(none)");
    }
    EVO_RETURN_IF_ERROR(check_node_signature(api, info, *k, node));
    int32_t level = 1;
    EVO_RETURN_IF_ERROR(cpu_level(api, &level));
    *out = new FusedKernel{api, k, std::move(node), level};
    return nullptr;
}

// ---------------------------------------------------------------------------------------------------------------
// CPU execution.

// What evo_args.rt points to during one Compute: enough to reach onnxruntime's intra-op thread pool.
struct ParallelRuntime {
    const OrtApi* api;
    OrtKernelContext* context;
};

// evo_parallel_for_fn. Each index is one task; num_batch = 0 makes onnxruntime schedule the tasks one by one
// with work stealing over the session's intra-op pool (inline when the pool has one thread). Kernels therefore
// choose the task count by work size, not by thread count. In onnxruntime's source the call fails before
// running anything (kernel-context API disabled in a minimal build, no context); only an exception inside the
// pool could fail it midway, and then the inline fallback reruns tasks, which is harmless as long as each task
// just writes its own slice of the outputs.
void cpu_parallel_for(void* rt, evo_task_fn fn, void* data, size_t n) {
    if (n > 1) {
        const auto* runtime = static_cast<const ParallelRuntime*>(rt);
        OrtStatus* status = runtime->api->KernelContext_ParallelFor(runtime->context, fn, n, 0, data);
        if (status == nullptr) return;
        runtime->api->ReleaseStatus(status);
    }
    for (size_t i = 0; i < n; ++i) fn(data, i);
}

OrtStatus* kernel_error(const OrtApi* api, OrtErrorCode code, const FusedKernel& fk, const char* stage,
                        char* err) {
    err[EVO_ERRLEN - 1] = '\0';
    if (err[0] != '\0') return make_status(api, code, "evonnx: node '%s': %s", fk.node_name.c_str(), err);
    return make_status(api, code, "evonnx: node '%s': kernel '%s' failed in %s without a message",
                       fk.node_name.c_str(), fk.kernel->name, stage);
}

// The inputs and outputs of one Compute, with every input checked, infer() run and the outputs allocated. Shared
// by the CPU and CUDA paths (data pointers are host or device memory accordingly; dims are always on the host).
struct NodeIo {
    NodeIo(size_t num_inputs, size_t num_outputs)
        : inputs(num_inputs),
          input_dims(num_inputs),
          outputs(num_outputs),
          output_values(num_outputs),
          output_dims(num_outputs),
          output_ranks(num_outputs),
          dims((num_inputs + num_outputs) * EVO_MAX_RANK) {}
    SmallArray<const void*, kInlineTensors> inputs;
    SmallArray<const int64_t*, kInlineTensors> input_dims;
    SmallArray<void*, kInlineTensors> outputs;
    SmallArray<OrtValue*, kInlineTensors> output_values;
    SmallArray<int64_t*, kInlineTensors> output_dims;
    SmallArray<int32_t, kInlineTensors> output_ranks;
    SmallArray<int64_t, kInlineTensors * EVO_MAX_RANK> dims;
};

// Per call: 7 C-API calls per input (value, shape record, type, rank, dims, release, data) and 2 per output.
OrtStatus* prepare_io(const FusedKernel& fk, OrtKernelContext* context, NodeIo& io, char* err) {
    const OrtApi* api = fk.api;
    const evo_kernel& k = *fk.kernel;
    const size_t num_inputs = static_cast<size_t>(k.num_inputs);  // the node's arity, checked at creation
    const size_t num_outputs = static_cast<size_t>(k.num_outputs);

    for (size_t i = 0; i < num_inputs; ++i) {
        const OrtValue* value = nullptr;
        EVO_RETURN_IF_ERROR(api->KernelContext_GetInput(context, i, &value));
        if (value == nullptr) {
            return make_status(api, ORT_INVALID_ARGUMENT, "evonnx: node '%s' (kernel '%s') input %zu is missing",
                               fk.node_name.c_str(), k.name, i);
        }
        ShapeInfo info(api);
        EVO_RETURN_IF_ERROR(api->GetTensorTypeAndShape(value, info.out()));
        ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
        size_t rank = 0;
        EVO_RETURN_IF_ERROR(api->GetTensorElementType(info.get(), &type));
        EVO_RETURN_IF_ERROR(api->GetDimensionsCount(info.get(), &rank));
        const bool type_ok = k.input_types[i] == 0 || static_cast<int32_t>(type) == k.input_types[i];
        if (!type_ok || rank != static_cast<size_t>(k.input_ranks[i])) {
            return make_status(api, ORT_INVALID_ARGUMENT,
                               "evonnx: node '%s' (kernel '%s') input %zu: expected %s of rank %d, found %s of "
                               "rank %zu",
                               fk.node_name.c_str(), k.name, i, type_name(k.input_types[i]), k.input_ranks[i],
                               type_name(type), rank);
        }
        int64_t* input_shape = io.dims.data() + i * EVO_MAX_RANK;
        EVO_RETURN_IF_ERROR(api->GetDimensions(info.get(), input_shape, rank));
        io.input_dims[i] = input_shape;
        void* data = nullptr;  // NULL is allowed for a zero-size tensor
        // API 21 has no read-only accessor; the kernel receives the pointer as const.
        EVO_RETURN_IF_ERROR(api->GetTensorMutableData(const_cast<OrtValue*>(value), &data));
        io.inputs[i] = data;
    }

    for (size_t o = 0; o < num_outputs; ++o) {
        io.output_dims[o] = io.dims.data() + (num_inputs + o) * EVO_MAX_RANK;
        io.output_ranks[o] = k.output_ranks[o];
    }
    if (k.infer(io.input_dims.data(), k.input_ranks, io.output_dims.data(), io.output_ranks.data(), err) != 0) {
        return kernel_error(api, ORT_INVALID_ARGUMENT, fk, "infer", err);
    }

    for (size_t o = 0; o < num_outputs; ++o) {
        if (io.output_ranks[o] < 0 || io.output_ranks[o] > EVO_MAX_RANK) {
            return make_status(api, ORT_FAIL, "evonnx: node '%s': kernel '%s' inferred rank %d for output %zu",
                               fk.node_name.c_str(), k.name, static_cast<int>(io.output_ranks[o]), o);
        }
        const size_t rank = static_cast<size_t>(io.output_ranks[o]);
        for (size_t d = 0; d < rank; ++d) {
            if (io.output_dims[o][d] < 0) {
                return make_status(api, ORT_FAIL,
                                   "evonnx: node '%s': kernel '%s' inferred dim %zu of output %zu as %lld",
                                   fk.node_name.c_str(), k.name, d, o,
                                   static_cast<long long>(io.output_dims[o][d]));
            }
        }
        OrtValue* value = nullptr;
        EVO_RETURN_IF_ERROR(api->KernelContext_GetOutput(context, o, io.output_dims[o], rank, &value));
        io.output_values[o] = value;
        EVO_RETURN_IF_ERROR(api->GetTensorMutableData(value, &io.outputs[o]));
    }
    return nullptr;
}

OrtStatus* compute_cpu(const FusedKernel& fk, OrtKernelContext* context) {
    const OrtApi* api = fk.api;
    const evo_kernel& k = *fk.kernel;
    NodeIo io(static_cast<size_t>(k.num_inputs), static_cast<size_t>(k.num_outputs));
    // Per-call error buffer on the stack: kernels are reentrant and Run() may be concurrent.
    char err[EVO_ERRLEN];
    err[0] = '\0';
    EVO_RETURN_IF_ERROR(prepare_io(fk, context, io, err));

    ParallelRuntime rt{api, context};
    evo_args args;
    args.num_inputs = k.num_inputs;
    args.num_outputs = k.num_outputs;
    args.inputs = io.inputs.data();
    args.input_dims = io.input_dims.data();
    args.input_ranks = k.input_ranks;  // equal to the inputs' ranks, checked in prepare_io
    args.outputs = io.outputs.data();
    args.output_dims = io.output_dims.data();
    args.parallel_for = cpu_parallel_for;
    args.rt = &rt;
    args.cpu_level = fk.cpu_level;
    if (k.compute(&args, err) != 0) return kernel_error(api, ORT_FAIL, fk, "compute", err);
    return nullptr;
}

// ---------------------------------------------------------------------------------------------------------------
// CUDA execution, through the CUDA driver API loaded at run time: the library links no CUDA library, so a
// CPU-only onnxruntime loads it, and libcuda.so.1 is opened only when a CUDA kernel is created. The function
// types below are written by hand; compiling this file with -DEVO_CHECK_CUDA_H (and cuda.h on the include path)
// checks every one against cuda.h.

}  // namespace

// The driver's opaque handle types, with cuda.h's own (global) tags, so the types are identical to cuda.h's.
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;

namespace {

namespace cu {
using Result = int;  // CUresult, an enum of int size
using Device = int;  // CUdevice
using Context = CUctx_st*;
using Module = CUmod_st*;
using Function = CUfunc_st*;
using Stream = CUstream_st*;
constexpr Result kSuccess = 0;
constexpr int kAttributeMultiprocessorCount = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT

using InitFn = Result (*)(unsigned int);
using GetErrorStringFn = Result (*)(Result, const char**);
using DeviceGetFn = Result (*)(Device*, int);
using DeviceGetAttributeFn = Result (*)(int*, int, Device);  // the attribute is a CUdevice_attribute
using DevicePrimaryCtxRetainFn = Result (*)(Context*, Device);
using CtxPushCurrentFn = Result (*)(Context);
using CtxPopCurrentFn = Result (*)(Context*);
using ModuleLoadDataFn = Result (*)(Module*, const void*);
using ModuleGetFunctionFn = Result (*)(Function*, Module, const char*);
using LaunchKernelFn = Result (*)(Function, unsigned int, unsigned int, unsigned int, unsigned int, unsigned int,
                                  unsigned int, unsigned int, Stream, void**, void**);

// The exported names: cuda.h maps cuCtxPushCurrent and cuCtxPopCurrent to these _v2 symbols.
struct Driver {
    InitFn Init;
    GetErrorStringFn GetErrorString;
    DeviceGetFn DeviceGet;
    DeviceGetAttributeFn DeviceGetAttribute;
    DevicePrimaryCtxRetainFn DevicePrimaryCtxRetain;
    CtxPushCurrentFn CtxPushCurrent;
    CtxPopCurrentFn CtxPopCurrent;
    ModuleLoadDataFn ModuleLoadData;
    ModuleGetFunctionFn ModuleGetFunction;
    LaunchKernelFn LaunchKernel;
    std::string error;  // empty when every symbol was found and cuInit succeeded
};
}  // namespace cu

#ifdef EVO_CHECK_CUDA_H
}  // namespace
#include <cuda.h>

#include <type_traits>
// The plain names are what driver() looks up with dlsym: cuda.h must not map them to versioned symbols.
#if defined(cuInit) || defined(cuGetErrorString) || defined(cuDeviceGet) || defined(cuDeviceGetAttribute) || \
    defined(cuDevicePrimaryCtxRetain) || defined(cuModuleLoadData) || defined(cuModuleGetFunction) ||      \
    defined(cuLaunchKernel)
#error "cuda.h maps a driver function evonnx loads by its plain name to a versioned symbol"
#endif
namespace {
// Function types compared with enums replaced by int (CUresult and CUdevice_attribute are int-sized enums).
template <typename T, bool = std::is_enum<T>::value>
struct AbiOf {
    using type = T;
};
template <typename T>
struct AbiOf<T, true> {
    static_assert(sizeof(T) == sizeof(int), "enum of int size");
    using type = int;
};
template <typename F>
struct AbiFn;
template <typename R, typename... A>
struct AbiFn<R (*)(A...)> {
    using type = typename AbiOf<R>::type (*)(typename AbiOf<A>::type...);
};
#define EVO_CHECK_DRIVER(ours, theirs)                                                                   \
    static_assert(std::is_same<AbiFn<cu::ours>::type, AbiFn<decltype(&::theirs)>::type>::value, #theirs \
                  " in cuda.h differs from evonnx's cu::" #ours)
EVO_CHECK_DRIVER(InitFn, cuInit);
EVO_CHECK_DRIVER(GetErrorStringFn, cuGetErrorString);
EVO_CHECK_DRIVER(DeviceGetFn, cuDeviceGet);
EVO_CHECK_DRIVER(DeviceGetAttributeFn, cuDeviceGetAttribute);
EVO_CHECK_DRIVER(DevicePrimaryCtxRetainFn, cuDevicePrimaryCtxRetain);
EVO_CHECK_DRIVER(CtxPushCurrentFn, cuCtxPushCurrent_v2);
EVO_CHECK_DRIVER(CtxPopCurrentFn, cuCtxPopCurrent_v2);
EVO_CHECK_DRIVER(ModuleLoadDataFn, cuModuleLoadData);
EVO_CHECK_DRIVER(ModuleGetFunctionFn, cuModuleGetFunction);
EVO_CHECK_DRIVER(LaunchKernelFn, cuLaunchKernel);
static_assert(std::is_same<cu::Context, CUcontext>::value && std::is_same<cu::Module, CUmodule>::value &&
                  std::is_same<cu::Function, CUfunction>::value && std::is_same<cu::Stream, CUstream>::value &&
                  std::is_same<cu::Device, CUdevice>::value,
              "driver handle types");
static_assert(cu::kSuccess == CUDA_SUCCESS, "CUDA_SUCCESS");
static_assert(cu::kAttributeMultiprocessorCount == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "SM count attribute");
#undef EVO_CHECK_DRIVER
#endif  // EVO_CHECK_CUDA_H

template <typename F>
bool load_symbol(void* lib, const char* name, F* out, std::string* error) {
    *out = reinterpret_cast<F>(dlsym(lib, name));
    if (*out == nullptr && error->empty()) *error = std::string("libcuda.so.1 has no ") + name;
    return *out != nullptr;
}

// Loaded once per process (thread-safe static initialisation) and never unloaded.
const cu::Driver& driver() {
    static const cu::Driver d = [] {
        cu::Driver x{};
        void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (lib == nullptr) {
            const char* why = dlerror();
            x.error = std::string("cannot load the CUDA driver libcuda.so.1 (") + (why ? why : "unknown") + ")";
            return x;
        }
        load_symbol(lib, "cuInit", &x.Init, &x.error);
        load_symbol(lib, "cuGetErrorString", &x.GetErrorString, &x.error);
        load_symbol(lib, "cuDeviceGet", &x.DeviceGet, &x.error);
        load_symbol(lib, "cuDeviceGetAttribute", &x.DeviceGetAttribute, &x.error);
        load_symbol(lib, "cuDevicePrimaryCtxRetain", &x.DevicePrimaryCtxRetain, &x.error);
        load_symbol(lib, "cuCtxPushCurrent_v2", &x.CtxPushCurrent, &x.error);
        load_symbol(lib, "cuCtxPopCurrent_v2", &x.CtxPopCurrent, &x.error);
        load_symbol(lib, "cuModuleLoadData", &x.ModuleLoadData, &x.error);
        load_symbol(lib, "cuModuleGetFunction", &x.ModuleGetFunction, &x.error);
        load_symbol(lib, "cuLaunchKernel", &x.LaunchKernel, &x.error);
        if (x.error.empty()) {
            const cu::Result r = x.Init(0);
            if (r != cu::kSuccess) x.error = "cuInit failed with CUDA error " + std::to_string(r);
        }
        return x;
    }();
    return d;
}

std::string driver_error_text(const cu::Driver& d, cu::Result r) {
    const char* text = nullptr;
    if (d.GetErrorString == nullptr || d.GetErrorString(r, &text) != cu::kSuccess || text == nullptr) {
        text = "unknown error";
    }
    return std::string(text) + " (CUDA error " + std::to_string(r) + ")";
}

constexpr int kMaxDevices = 64;

// The library's module on one device: loaded once, in the device's primary context (the one onnxruntime's CUDA
// execution provider uses through the runtime API), and kept for the life of the process.
struct DeviceModule {
    cu::Context context = nullptr;
    cu::Module module = nullptr;
    unsigned int max_blocks = 0;  // grid cap: 32 blocks of EVO_CUDA_BLOCK threads per SM; loops stride over the rest
};

std::mutex g_module_mutex;
std::atomic<const DeviceModule*> g_modules[kMaxDevices];

OrtStatus* device_module(const OrtApi* api, const cu::Driver& d, int device, const DeviceModule** out) {
    const DeviceModule* known = g_modules[device].load(std::memory_order_acquire);
    if (known != nullptr) {
        *out = known;
        return nullptr;
    }
    std::lock_guard<std::mutex> lock(g_module_mutex);
    known = g_modules[device].load(std::memory_order_relaxed);
    if (known != nullptr) {
        *out = known;
        return nullptr;
    }
    auto* m = new DeviceModule();
    cu::Device dev = 0;
    cu::Result r = d.DeviceGet(&dev, device);
    if (r == cu::kSuccess) r = d.DevicePrimaryCtxRetain(&m->context, dev);  // never released: process lifetime
    if (r != cu::kSuccess) {
        delete m;
        return make_status(api, ORT_FAIL, "evonnx: CUDA device %d: cannot retain its primary context: %s", device,
                           driver_error_text(d, r).c_str());
    }
    int sms = 0;
    if (d.DeviceGetAttribute(&sms, cu::kAttributeMultiprocessorCount, dev) != cu::kSuccess || sms <= 0) sms = 16;
    m->max_blocks = static_cast<unsigned int>(sms) * 32u;
    r = d.CtxPushCurrent(m->context);
    if (r == cu::kSuccess) {
        r = d.ModuleLoadData(&m->module, evo_cuda_image);
        cu::Context popped = nullptr;
        d.CtxPopCurrent(&popped);
    }
    if (r != cu::kSuccess) {
        delete m;
        return make_status(api, ORT_FAIL,
                           "evonnx: cannot load the CUDA kernels of this library (built for model '%s') on device "
                           "%d: %s. The library holds CUBINs for the architectures it was built for and PTX for "
                           "the newest; rebuild with evonnx optimize --target cuda for this GPU or update the driver",
                           evo_library_model, device, driver_error_text(d, r).c_str());
    }
    g_modules[device].store(m, std::memory_order_release);
    *out = m;
    return nullptr;
}

// One instance per graph node placed on the CUDA execution provider.
struct CudaFusedKernel {
    FusedKernel base;
    std::mutex mutex;
    std::atomic<const cu::Function*> functions[kMaxDevices];  // the kernel's entries on each device, resolved once
};

OrtStatus* kernel_functions(CudaFusedKernel& ck, const cu::Driver& d, int device, const DeviceModule& m,
                            const cu::Function** out) {
    const cu::Function* known = ck.functions[device].load(std::memory_order_acquire);
    if (known != nullptr) {
        *out = known;
        return nullptr;
    }
    std::lock_guard<std::mutex> lock(ck.mutex);
    known = ck.functions[device].load(std::memory_order_relaxed);
    if (known != nullptr) {
        *out = known;
        return nullptr;
    }
    const evo_cuda_kernel& c = *ck.base.kernel->cuda;
    auto* functions = new cu::Function[static_cast<size_t>(c.num_entries)];
    for (int32_t e = 0; e < c.num_entries; ++e) {
        const cu::Result r = d.ModuleGetFunction(&functions[e], m.module, c.entries[e]);
        if (r != cu::kSuccess) {
            delete[] functions;
            return make_status(ck.base.api, ORT_FAIL,
                               "evonnx: node '%s': the CUDA image has no function '%s' (kernel '%s'): %s",
                               ck.base.node_name.c_str(), c.entries[e], ck.base.kernel->name,
                               driver_error_text(d, r).c_str());
        }
    }
    ck.functions[device].store(functions, std::memory_order_release);  // freed with the kernel
    *out = functions;
    return nullptr;
}

// Pops the context pushed for one Compute on every path out of it.
class ContextScope {
  public:
    explicit ContextScope(const cu::Driver& d) : d_(d) {}
    ~ContextScope() {
        if (pushed_) {
            cu::Context popped = nullptr;
            d_.CtxPopCurrent(&popped);
        }
    }
    ContextScope(const ContextScope&) = delete;
    ContextScope& operator=(const ContextScope&) = delete;
    cu::Result push(cu::Context c) {
        const cu::Result r = d_.CtxPushCurrent(c);
        pushed_ = r == cu::kSuccess;
        return r;
    }

  private:
    const cu::Driver& d_;
    bool pushed_ = false;
};

constexpr size_t kInlineLaunches = 64;
constexpr size_t kInlineParams = 64;

// Launches every piece of the kernel on onnxruntime's compute stream; no synchronisation.
OrtStatus* compute_cuda(CudaFusedKernel& ck, OrtKernelContext* context) {
    const FusedKernel& fk = ck.base;
    const OrtApi* api = fk.api;
    const evo_kernel& k = *fk.kernel;
    const evo_cuda_kernel& c = *k.cuda;
    const size_t num_inputs = static_cast<size_t>(k.num_inputs);
    const size_t num_outputs = static_cast<size_t>(k.num_outputs);
    NodeIo io(num_inputs, num_outputs);
    char err[EVO_ERRLEN];
    err[0] = '\0';
    EVO_RETURN_IF_ERROR(prepare_io(fk, context, io, err));

    const size_t num_syms = static_cast<size_t>(c.num_syms);
    SmallArray<int64_t, kInlineParams> syms(num_syms > 0 ? num_syms : 1);
    SmallArray<evo_cuda_launch, kInlineLaunches> launches(static_cast<size_t>(c.num_launches));
    if (c.plan(io.input_dims.data(), syms.data(), launches.data(), err) != 0) {
        return kernel_error(api, ORT_INVALID_ARGUMENT, fk, "plan", err);
    }
    bool any = false;
    for (int32_t l = 0; l < c.num_launches; ++l) any = any || launches[static_cast<size_t>(l)].total > 0;
    if (!any) return nullptr;  // only empty outputs: nothing to launch, no driver needed

    // The device of the outputs (onnxruntime allocated them on this node's device).
    const OrtMemoryInfo* memory = nullptr;
    int device = 0;
    EVO_RETURN_IF_ERROR(api->GetTensorMemoryInfo(io.output_values[0], &memory));
    EVO_RETURN_IF_ERROR(api->MemoryInfoGetId(memory, &device));
    if (device < 0 || device >= kMaxDevices) {
        return make_status(api, ORT_FAIL, "evonnx: node '%s': CUDA device id %d is out of range", fk.node_name.c_str(),
                           device);
    }
    void* stream = nullptr;  // NULL: the default stream
    EVO_RETURN_IF_ERROR(api->KernelContext_GetGPUComputeStream(context, &stream));

    const cu::Driver& d = driver();  // loaded in CreateKernel already; error-free there
    const DeviceModule* m = nullptr;
    EVO_RETURN_IF_ERROR(device_module(api, d, device, &m));
    ContextScope scope(d);
    cu::Result r = scope.push(m->context);
    if (r != cu::kSuccess) {
        return make_status(api, ORT_FAIL, "evonnx: node '%s': cannot make CUDA device %d current: %s",
                           fk.node_name.c_str(), device, driver_error_text(d, r).c_str());
    }
    const cu::Function* functions = nullptr;
    EVO_RETURN_IF_ERROR(kernel_functions(ck, d, device, *m, &functions));

    // Kernel parameters: input pointers, output pointers, the size symbols, then the work-item count.
    int64_t total = 0;
    SmallArray<void*, kInlineParams> params(num_inputs + num_outputs + num_syms + 1);
    size_t n = 0;
    for (size_t i = 0; i < num_inputs; ++i) params[n++] = const_cast<const void**>(&io.inputs[i]);
    for (size_t o = 0; o < num_outputs; ++o) params[n++] = &io.outputs[o];
    for (size_t s = 0; s < num_syms; ++s) params[n++] = &syms[s];
    params[n++] = &total;
    for (int32_t l = 0; l < c.num_launches; ++l) {
        const evo_cuda_launch& launch = launches[static_cast<size_t>(l)];
        if (launch.total <= 0) continue;
        if (launch.entry < 0 || launch.entry >= c.num_entries) {
            return make_status(api, ORT_FAIL, "evonnx: node '%s': kernel '%s' planned entry %d of %d",
                               fk.node_name.c_str(), k.name, launch.entry, c.num_entries);
        }
        total = launch.total;  // cuLaunchKernel copies the parameters at the call
        const int64_t wanted = (total + EVO_CUDA_BLOCK - 1) / EVO_CUDA_BLOCK;
        const unsigned int blocks = wanted < static_cast<int64_t>(m->max_blocks) ? static_cast<unsigned int>(wanted)
                                                                                 : m->max_blocks;
        r = d.LaunchKernel(functions[launch.entry], blocks, 1, 1, EVO_CUDA_BLOCK, 1, 1, 0,
                           static_cast<cu::Stream>(stream), params.data(), nullptr);
        if (r != cu::kSuccess) {
            return make_status(api, ORT_FAIL, "evonnx: node '%s': launching %s (%u blocks) failed: %s",
                               fk.node_name.c_str(), c.entries[launch.entry], blocks, driver_error_text(d, r).c_str());
        }
    }
    return nullptr;
}

// ---------------------------------------------------------------------------------------------------------------
// OrtCustomOp callbacks. Everything but the four EP-specific ones below (create, compute, destroy, provider name)
// is shared by the CPU and the CUDA op.

OrtStatus* ORT_API_CALL create_kernel_cpu(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info,
                                          void** kernel) {
    *kernel = nullptr;
    try {
        FusedKernel* fk = nullptr;
        EVO_RETURN_IF_ERROR(create_fused_kernel(api, info, &fk));
        *kernel = fk;
        return nullptr;
    } catch (const std::exception& e) {  // std::string's bad_alloc; nothing may propagate into onnxruntime
        return make_status(api, ORT_FAIL, "evonnx: creating a Fused kernel failed: %s", e.what());
    }
}

OrtStatus* ORT_API_CALL compute_kernel_cpu(void* kernel, OrtKernelContext* context) {
    const auto* fk = static_cast<const FusedKernel*>(kernel);
    try {
        return compute_cpu(*fk, context);
    } catch (const std::bad_alloc&) {  // only SmallArray's heap block for very wide nodes can throw
        return make_status(fk->api, ORT_FAIL, "evonnx: node '%s': out of memory", fk->node_name.c_str());
    }
}

const char* ORT_API_CALL execution_provider_cpu(const OrtCustomOp*) { return "CPUExecutionProvider"; }

void ORT_API_CALL destroy_kernel(void* kernel) { delete static_cast<FusedKernel*>(kernel); }

OrtStatus* ORT_API_CALL create_kernel_cuda(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info,
                                           void** kernel) {
    *kernel = nullptr;
    try {
        FusedKernel* fk = nullptr;
        EVO_RETURN_IF_ERROR(create_fused_kernel(api, info, &fk));
        FusedKernel base = std::move(*fk);
        delete fk;
        if (base.kernel->cuda == nullptr || &evo_cuda_image_size == nullptr || evo_cuda_image == nullptr ||
            evo_cuda_image_size == 0) {
            return make_status(api, ORT_NOT_IMPLEMENTED,
                               "evonnx: node '%s' is placed on the CUDA execution provider, but this library (for "
                               "model '%s') was built for CPU only; re-run evonnx optimize --target cuda (or "
                               "--target both)",
                               base.node_name.c_str(), evo_library_model);
        }
        const cu::Driver& d = driver();
        if (!d.error.empty()) {
            return make_status(api, ORT_FAIL, "evonnx: node '%s' (CUDA execution provider): %s",
                               base.node_name.c_str(), d.error.c_str());
        }
        auto* ck = new CudaFusedKernel();
        ck->base = std::move(base);
        *kernel = ck;
        return nullptr;
    } catch (const std::exception& e) {
        return make_status(api, ORT_FAIL, "evonnx: creating a Fused CUDA kernel failed: %s", e.what());
    }
}

OrtStatus* ORT_API_CALL compute_kernel_cuda(void* kernel, OrtKernelContext* context) {
    auto* ck = static_cast<CudaFusedKernel*>(kernel);
    try {
        return compute_cuda(*ck, context);
    } catch (const std::exception& e) {  // bad_alloc of wide nodes' arrays, std::string in messages
        return make_status(ck->base.api, ORT_FAIL, "evonnx: node '%s': %s", ck->base.node_name.c_str(), e.what());
    }
}

const char* ORT_API_CALL execution_provider_cuda(const OrtCustomOp*) { return "CUDAExecutionProvider"; }

void ORT_API_CALL destroy_kernel_cuda(void* kernel) {
    auto* ck = static_cast<CudaFusedKernel*>(kernel);
    for (auto& f : ck->functions) delete[] f.load();
    delete ck;
}
const char* ORT_API_CALL op_name(const OrtCustomOp*) { return kOpName; }
// One formal input and one formal output, both variadic over mixed element types (homogeneity 0; with 1, ORT
// rejects mixed types at load time), at least one tensor each.
size_t ORT_API_CALL one_formal(const OrtCustomOp*) { return 1; }
ONNXTensorElementDataType ORT_API_CALL any_type(const OrtCustomOp*, size_t) {
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL variadic(const OrtCustomOp*, size_t) {
    return INPUT_OUTPUT_VARIADIC;
}
// onnxruntime 1.31 calls this for every input without a NULL check (seen as a crash at session creation).
OrtMemType ORT_API_CALL default_memory(const OrtCustomOp*, size_t) { return OrtMemTypeDefault; }
int ORT_API_CALL min_arity(const OrtCustomOp*) { return 1; }
int ORT_API_CALL heterogeneous(const OrtCustomOp*) { return 0; }
int ORT_API_CALL start_version(const OrtCustomOp*) { return 1; }
int ORT_API_CALL end_version(const OrtCustomOp*) { return INT_MAX; }

OrtCustomOp make_fused_op(const char*(ORT_API_CALL* execution_provider)(const OrtCustomOp*),
                          OrtStatusPtr(ORT_API_CALL* create)(const OrtCustomOp*, const OrtApi*,
                                                             const OrtKernelInfo*, void**),
                          OrtStatusPtr(ORT_API_CALL* compute)(void*, OrtKernelContext*),
                          void(ORT_API_CALL* destroy)(void*)) {
    OrtCustomOp op{};  // every field not set here stays NULL, which ORT reads as "not provided"
    // Tells ORT which fields of the struct exist; must be the build header's version, never the runtime's.
    op.version = ORT_API_VERSION;
    op.GetName = op_name;
    op.GetExecutionProviderType = execution_provider;
    op.GetInputTypeCount = one_formal;
    op.GetInputType = any_type;
    op.GetInputCharacteristic = variadic;
    op.GetInputMemoryType = default_memory;
    op.GetVariadicInputMinArity = min_arity;
    op.GetVariadicInputHomogeneity = heterogeneous;
    op.GetOutputTypeCount = one_formal;
    op.GetOutputType = any_type;
    op.GetOutputCharacteristic = variadic;
    op.GetVariadicOutputMinArity = min_arity;
    op.GetVariadicOutputHomogeneity = heterogeneous;
    op.CreateKernelV2 = create;
    op.KernelComputeV2 = compute;
    op.KernelDestroy = destroy;
    op.GetStartVersion = start_version;
    op.GetEndVersion = end_version;
    return op;
}

}  // namespace

// The NonMaxSuppression op (issue 14), in the same anonymous namespace as the helpers it uses.
namespace {
#include "evonnx_nms_op.h"

// ORT keeps pointers to these for as long as any session uses the library, hence static storage.
// One domain holds the op for both providers; onnxruntime picks by the node's provider (a CPU session, or a CPU-only
// onnxruntime, only ever creates the CPU kernel, so the CUDA one costs nothing there). Inputs and outputs use the
// provider's default memory: host memory on CPU, device memory on CUDA.
const OrtCustomOp kFusedOps[] = {
    make_fused_op(execution_provider_cpu, create_kernel_cpu, compute_kernel_cpu, destroy_kernel),
    make_fused_op(execution_provider_cuda, create_kernel_cuda, compute_kernel_cuda, destroy_kernel_cuda),
};

}  // namespace

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
    const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
    if (api == nullptr) {
        // An onnxruntime older than the build headers. API 1 exists in every release and can carry the message.
        const OrtApi* oldest = api_base->GetApi(1);
        if (oldest == nullptr) return nullptr;  // no way to report anything; ORT then finds no Fused kernel
        char message[256];
        snprintf(message, sizeof message,
                 "evonnx: this library needs onnxruntime >= 1.%d (C API %d); this process has onnxruntime %s",
                 ORT_API_VERSION, ORT_API_VERSION, api_base->GetVersionString());
        return oldest->CreateStatus(ORT_FAIL, message);
    }
    OrtCustomOpDomain* domain = nullptr;
    EVO_RETURN_IF_ERROR(api->CreateCustomOpDomain(kDomain, &domain));
    for (const OrtCustomOp& op : kFusedOps) {
        // A library built for CPU only registers no CUDA kernel, so in a CUDA session onnxruntime places the fused
        // nodes on the CPU provider (with copies) instead of failing to create the session.
        if (&op != &kFusedOps[0] && &evo_cuda_image_size == nullptr) continue;
        OrtStatus* status = api->CustomOpDomain_Add(domain, &op);
        if (status != nullptr) {
            api->ReleaseCustomOpDomain(domain);
            return status;
        }
    }
    OrtStatus* added = api->CustomOpDomain_Add(domain, &kNmsOp);
    if (added != nullptr) {
        api->ReleaseCustomOpDomain(domain);
        return added;
    }
    OrtStatus* status = api->AddCustomOpDomain(options, domain);
    if (status != nullptr) {
        api->ReleaseCustomOpDomain(domain);
        return status;
    }
    // The domain is deliberately never released: the session options, their copies and every session made
    // from them keep raw pointers to it, and the library gets no callback when the last of them is gone.
    // That is one small allocation per registration.
    return nullptr;
}
