// evonnx custom-op runtime: registers `ai.evonnx::Fused` with onnxruntime and runs a model's generated kernels.
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

#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "evonnx_abi.h"
#include "onnxruntime_c_api.h"

namespace {

constexpr const char* kDomain = "ai.evonnx";
constexpr const char* kOpName = "Fused";
constexpr const char* kKernelAttribute = "kernel";
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
};

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

OrtStatus* read_kernel_attribute(const OrtApi* api, const OrtKernelInfo* info, const std::string& node,
                                 std::string* out) {
    size_t size = 0;
    OrtStatus* status = api->KernelInfoGetAttribute_string(info, kKernelAttribute, nullptr, &size);
    if (status != nullptr) {
        OrtStatus* missing = make_status(api, ORT_INVALID_ARGUMENT,
                                         "evonnx: node '%s' (%s::%s) has no string attribute '%s' (%s)",
                                         node.c_str(), kDomain, kOpName, kKernelAttribute,
                                         api->GetErrorMessage(status));
        api->ReleaseStatus(status);
        return missing;
    }
    out->assign(size, '\0');
    EVO_RETURN_IF_ERROR(api->KernelInfoGetAttribute_string(info, kKernelAttribute, &(*out)[0], &size));
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
    EVO_RETURN_IF_ERROR(read_kernel_attribute(api, info, node, &name));
    const evo_kernel* k = find_kernel(name.c_str());
    if (k == nullptr) return unknown_kernel_status(api, node, name);
    EVO_RETURN_IF_ERROR(check_node_signature(api, info, *k, node));
    *out = new FusedKernel{api, k, std::move(node)};
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

// Per call: 7 C-API calls per input (value, shape record, type, rank, dims, release, data) and 2 per output.
OrtStatus* compute_cpu(const FusedKernel& fk, OrtKernelContext* context) {
    const OrtApi* api = fk.api;
    const evo_kernel& k = *fk.kernel;
    const size_t num_inputs = static_cast<size_t>(k.num_inputs);  // the node's arity, checked at creation
    const size_t num_outputs = static_cast<size_t>(k.num_outputs);

    SmallArray<const void*, kInlineTensors> inputs(num_inputs);
    SmallArray<const int64_t*, kInlineTensors> input_dims(num_inputs);
    SmallArray<void*, kInlineTensors> outputs(num_outputs);
    SmallArray<int64_t*, kInlineTensors> output_dims(num_outputs);
    SmallArray<int64_t, kInlineTensors * EVO_MAX_RANK> dims((num_inputs + num_outputs) * EVO_MAX_RANK);

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
        int64_t* input_shape = dims.data() + i * EVO_MAX_RANK;
        EVO_RETURN_IF_ERROR(api->GetDimensions(info.get(), input_shape, rank));
        input_dims[i] = input_shape;
        void* data = nullptr;  // NULL is allowed for a zero-size tensor
        // API 21 has no read-only accessor; the kernel receives the pointer as const.
        EVO_RETURN_IF_ERROR(api->GetTensorMutableData(const_cast<OrtValue*>(value), &data));
        inputs[i] = data;
    }

    // Per-call error buffer on the stack: kernels are reentrant and Run() may be concurrent.
    char err[EVO_ERRLEN];
    err[0] = '\0';
    for (size_t o = 0; o < num_outputs; ++o) output_dims[o] = dims.data() + (num_inputs + o) * EVO_MAX_RANK;
    if (k.infer(input_dims.data(), k.input_ranks, output_dims.data(), err) != 0) {
        return kernel_error(api, ORT_INVALID_ARGUMENT, fk, "infer", err);
    }

    for (size_t o = 0; o < num_outputs; ++o) {
        const size_t rank = static_cast<size_t>(k.output_ranks[o]);
        for (size_t d = 0; d < rank; ++d) {
            if (output_dims[o][d] < 0) {
                return make_status(api, ORT_FAIL,
                                   "evonnx: node '%s': kernel '%s' inferred dim %zu of output %zu as %lld",
                                   fk.node_name.c_str(), k.name, d, o, static_cast<long long>(output_dims[o][d]));
            }
        }
        OrtValue* value = nullptr;
        EVO_RETURN_IF_ERROR(api->KernelContext_GetOutput(context, o, output_dims[o], rank, &value));
        EVO_RETURN_IF_ERROR(api->GetTensorMutableData(value, &outputs[o]));
    }

    ParallelRuntime rt{api, context};
    evo_args args;
    args.num_inputs = k.num_inputs;
    args.num_outputs = k.num_outputs;
    args.inputs = inputs.data();
    args.input_dims = input_dims.data();
    args.input_ranks = k.input_ranks;  // equal to the inputs' ranks, checked above
    args.outputs = outputs.data();
    args.output_dims = output_dims.data();
    args.parallel_for = cpu_parallel_for;
    args.rt = &rt;
    // 1 because the API 21 header offers no way to ask the size of the intra-op pool; parallel_for still uses
    // the whole pool (see cpu_parallel_for).
    args.num_threads = 1;
    if (k.compute(&args, err) != 0) return kernel_error(api, ORT_FAIL, fk, "compute", err);
    return nullptr;
}

// ---------------------------------------------------------------------------------------------------------------
// OrtCustomOp callbacks. Everything but the three EP-specific ones below is shared; a CUDA variant adds its own
// create/compute pair and execution-provider name to kFusedOps.

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
                          OrtStatusPtr(ORT_API_CALL* compute)(void*, OrtKernelContext*)) {
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
    op.KernelDestroy = destroy_kernel;
    op.GetStartVersion = start_version;
    op.GetEndVersion = end_version;
    return op;
}

// ORT keeps pointers to these for as long as any session uses the library, hence static storage.
const OrtCustomOp kFusedOps[] = {
    make_fused_op(execution_provider_cpu, create_kernel_cpu, compute_kernel_cpu),
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
        OrtStatus* status = api->CustomOpDomain_Add(domain, &op);
        if (status != nullptr) {
            api->ReleaseCustomOpDomain(domain);
            return status;
        }
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
