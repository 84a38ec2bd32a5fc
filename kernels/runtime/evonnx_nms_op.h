// Part of evonnx_ort.cc, included inside its anonymous namespace after the Fused op's callbacks (it uses
// make_status, ShapeInfo, read_node_name, cpu_parallel_for, EVO_RETURN_IF_ERROR and the shared callbacks): the `ai.evonnx::NonMaxSuppression` custom op, CPU only, which evonnx puts in place of
// an ONNX NonMaxSuppression node (passes/nms.py). Same inputs, attribute and output as the ONNX op; the checks,
// their order and their messages are onnxruntime 1.31's (non_max_suppression_helper.h), the selection is
// evonnx_nms.h's.

// evonnx_nms.h is included at the top of evonnx_ort.cc, outside any namespace.

constexpr const char* kNmsOpName = "NonMaxSuppression";

struct NmsKernel {
    const OrtApi* api;
    std::string node_name;
    int64_t center_point_box;
};

OrtStatus* create_nms_kernel(const OrtApi* api, const OrtKernelInfo* info, NmsKernel** out) {
    std::string name;
    EVO_RETURN_IF_ERROR(read_node_name(api, info, &name));
    int64_t center_point_box = 0;
    OrtStatus* status = api->KernelInfoGetAttribute_int64(info, "center_point_box", &center_point_box);
    if (status != nullptr) {  // absent: the ONNX default
        api->ReleaseStatus(status);
        center_point_box = 0;
    }
    if (center_point_box != 0 && center_point_box != 1) {
        return make_status(api, ORT_INVALID_ARGUMENT, "evonnx: node '%s': center_point_box only support 0 or 1",
                           name.c_str());
    }
    *out = new NmsKernel{api, std::move(name), center_point_box};
    return nullptr;
}

// One input as a typed host pointer with its dims; `data` stays NULL where the input is absent.
struct NmsInput {
    const void* data = nullptr;
    int64_t dims[3] = {0, 0, 0};
    size_t rank = 0;
    int64_t count = 0;
};

OrtStatus* nms_input(const NmsKernel& k, OrtKernelContext* context, size_t count, size_t index,
                     ONNXTensorElementDataType type, const char* what, NmsInput* out) {
    const OrtApi* api = k.api;
    if (index >= count) return nullptr;
    const OrtValue* value = nullptr;
    EVO_RETURN_IF_ERROR(api->KernelContext_GetInput(context, index, &value));
    if (value == nullptr) return nullptr;
    ShapeInfo info(api);
    EVO_RETURN_IF_ERROR(api->GetTensorTypeAndShape(value, info.out()));
    ONNXTensorElementDataType found = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    EVO_RETURN_IF_ERROR(api->GetTensorElementType(info.get(), &found));
    if (found != type) {
        return make_status(api, ORT_INVALID_ARGUMENT, "evonnx: node '%s': %s must be %s, not %s",
                           k.node_name.c_str(), what, type_name(type), type_name(found));
    }
    EVO_RETURN_IF_ERROR(api->GetDimensionsCount(info.get(), &out->rank));
    size_t elements = 0;
    EVO_RETURN_IF_ERROR(api->GetTensorShapeElementCount(info.get(), &elements));
    out->count = static_cast<int64_t>(elements);
    if (out->rank <= 3) EVO_RETURN_IF_ERROR(api->GetDimensions(info.get(), out->dims, out->rank));
    void* data = nullptr;
    EVO_RETURN_IF_ERROR(api->GetTensorMutableData(const_cast<OrtValue*>(value), &data));
    out->data = data != nullptr ? data : out->dims;  // present but empty: a non-NULL pointer all the same
    return nullptr;
}

// A scalar input: onnxruntime reads its element 0 whatever its shape. An empty one it reads out of bounds, which
// this op refuses instead.
OrtStatus* nms_scalar(const NmsKernel& k, const NmsInput& in, const char* what) {
    if (in.data != nullptr && in.count < 1) {
        return make_status(k.api, ORT_INVALID_ARGUMENT, "evonnx: node '%s': %s has no element", k.node_name.c_str(),
                           what);
    }
    return nullptr;
}

struct NmsTask {
    const std::vector<std::vector<evo_nms::Geom>>* boxes;  // per batch
    const std::vector<evo_nms::Grid>* grids;               // per batch
    const float* scores;
    int64_t num_classes, num_boxes, max_out;
    float iou_threshold, score_threshold;
    bool has_score_threshold;
    size_t pairs, per_task;                       // (batch, class) pairs, and how many one task runs
    std::vector<std::vector<int64_t>>* selected;  // per pair
    std::atomic<bool>* failed;
};

// Tasks run consecutive (batch, class) pairs with one scratch space: a class of 25,200 boxes would otherwise
// allocate (and have the kernel clear) its candidate array anew.
constexpr size_t kNmsTasks = 32;

void run_nms_task(void* data, size_t task) {
    auto* t = static_cast<NmsTask*>(data);
    try {
        evo_nms::Scratch scratch;
        const size_t end = std::min(t->pairs, (task + 1) * t->per_task);
        for (size_t pair = task * t->per_task; pair < end; ++pair) {
            const size_t batch = pair / static_cast<size_t>(t->num_classes);
            evo_nms::select_class((*t->boxes)[batch], (*t->grids)[batch],
                                  t->scores + static_cast<int64_t>(pair) * t->num_boxes, t->num_boxes, t->max_out,
                                  t->iou_threshold, t->has_score_threshold, t->score_threshold, scratch,
                                  (*t->selected)[pair]);
        }
    } catch (...) {  // bad_alloc: nothing may leave a task of onnxruntime's pool
        t->failed->store(true);
    }
}

OrtStatus* compute_nms(const NmsKernel& k, OrtKernelContext* context) {
    const OrtApi* api = k.api;
    const char* node = k.node_name.c_str();
    size_t count = 0;
    EVO_RETURN_IF_ERROR(api->KernelContext_GetInputCount(context, &count));
    NmsInput boxes, scores, max_out, iou, score;
    EVO_RETURN_IF_ERROR(nms_input(k, context, count, 0, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "boxes", &boxes));
    EVO_RETURN_IF_ERROR(nms_input(k, context, count, 1, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "scores", &scores));
    EVO_RETURN_IF_ERROR(nms_input(k, context, count, 2, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64,
                                  "max_output_boxes_per_class", &max_out));
    EVO_RETURN_IF_ERROR(nms_input(k, context, count, 3, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "iou_threshold",
                                  &iou));
    EVO_RETURN_IF_ERROR(nms_input(k, context, count, 4, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "score_threshold",
                                  &score));
    if (boxes.data == nullptr || scores.data == nullptr) {
        return make_status(api, ORT_INVALID_ARGUMENT, "evonnx: node '%s': boxes and scores are required", node);
    }
    if (boxes.rank != 3) return make_status(api, ORT_FAIL, "evonnx: node '%s': boxes must be a 3D tensor.", node);
    if (scores.rank != 3) return make_status(api, ORT_FAIL, "evonnx: node '%s': scores must be a 3D tensor.", node);
    if (boxes.dims[0] != scores.dims[0]) {
        return make_status(api, ORT_FAIL, "evonnx: node '%s': boxes and scores should have same num_batches.", node);
    }
    if (boxes.dims[1] != scores.dims[2]) {
        return make_status(api, ORT_FAIL, "evonnx: node '%s': boxes and scores should have same spatial_dimension.",
                           node);
    }
    if (boxes.dims[2] != 4) {
        return make_status(api, ORT_FAIL, "evonnx: node '%s': The most inner dimension in boxes must have 4 data.",
                           node);
    }
    EVO_RETURN_IF_ERROR(nms_scalar(k, max_out, "max_output_boxes_per_class"));
    EVO_RETURN_IF_ERROR(nms_scalar(k, iou, "iou_threshold"));
    EVO_RETURN_IF_ERROR(nms_scalar(k, score, "score_threshold"));
    int64_t max_per_class = 0;  // absent: nothing is selected
    if (max_out.data != nullptr) max_per_class = std::max<int64_t>(static_cast<const int64_t*>(max_out.data)[0], 0);
    float iou_threshold = 0.0f;
    if (iou.data != nullptr) {
        iou_threshold = static_cast<const float*>(iou.data)[0];
        if (!(iou_threshold >= 0.0f && iou_threshold <= 1.0f)) {
            return make_status(api, ORT_FAIL, "evonnx: node '%s': iou_threshold must be in range [0, 1].", node);
        }
    }
    const bool has_score_threshold = score.data != nullptr;
    const float score_threshold = has_score_threshold ? static_cast<const float*>(score.data)[0] : 0.0f;
    const int64_t num_batches = boxes.dims[0], num_boxes = boxes.dims[1], num_classes = scores.dims[1];

    std::vector<std::vector<int64_t>> selected;
    if (max_per_class > 0 && num_batches > 0 && num_classes > 0 && num_boxes > 0) {
        if (num_boxes > INT32_MAX) {
            return make_status(api, ORT_FAIL, "evonnx: node '%s': more than 2^31 - 1 boxes", node);
        }
        const auto* box_data = static_cast<const float*>(boxes.data);
        std::vector<std::vector<evo_nms::Geom>> geoms(static_cast<size_t>(num_batches));
        std::vector<evo_nms::Grid> grids(static_cast<size_t>(num_batches));
        for (int64_t b = 0; b < num_batches; ++b) {
            auto& g = geoms[static_cast<size_t>(b)];
            g.resize(static_cast<size_t>(num_boxes));
            for (int64_t i = 0; i < num_boxes; ++i) {
                g[static_cast<size_t>(i)] = evo_nms::geometry(box_data + (b * num_boxes + i) * 4, k.center_point_box);
            }
            grids[static_cast<size_t>(b)] = evo_nms::Grid::over(g);
        }
        const size_t pairs = static_cast<size_t>(num_batches * num_classes);
        const size_t per_task = (pairs + kNmsTasks - 1) / kNmsTasks;
        selected.resize(pairs);
        std::atomic<bool> failed{false};
        NmsTask task{&geoms, &grids, static_cast<const float*>(scores.data), num_classes, num_boxes,
                     max_per_class, iou_threshold, score_threshold, has_score_threshold, pairs, per_task,
                     &selected, &failed};
        ParallelRuntime rt{api, context};
        cpu_parallel_for(&rt, run_nms_task, &task, (pairs + per_task - 1) / per_task);
        if (failed.load()) return make_status(api, ORT_FAIL, "evonnx: node '%s': out of memory", node);
    }
    size_t rows = 0;
    for (const auto& s : selected) rows += s.size();
    const int64_t out_dims[2] = {static_cast<int64_t>(rows), 3};
    OrtValue* value = nullptr;
    EVO_RETURN_IF_ERROR(api->KernelContext_GetOutput(context, 0, out_dims, 2, &value));
    void* out = nullptr;
    EVO_RETURN_IF_ERROR(api->GetTensorMutableData(value, &out));
    auto* row = static_cast<int64_t*>(out);
    for (size_t t = 0; t < selected.size(); ++t) {
        const int64_t b = static_cast<int64_t>(t) / num_classes, c = static_cast<int64_t>(t) % num_classes;
        for (int64_t i : selected[t]) {
            row[0] = b;
            row[1] = c;
            row[2] = i;
            row += 3;
        }
    }
    return nullptr;
}

OrtStatus* ORT_API_CALL create_nms(const OrtCustomOp*, const OrtApi* api, const OrtKernelInfo* info, void** kernel) {
    *kernel = nullptr;
    try {
        NmsKernel* k = nullptr;
        EVO_RETURN_IF_ERROR(create_nms_kernel(api, info, &k));
        *kernel = k;
        return nullptr;
    } catch (const std::exception& e) {
        return make_status(api, ORT_FAIL, "evonnx: creating a NonMaxSuppression kernel failed: %s", e.what());
    }
}

OrtStatus* ORT_API_CALL compute_nms_kernel(void* kernel, OrtKernelContext* context) {
    const auto* k = static_cast<const NmsKernel*>(kernel);
    try {
        return compute_nms(*k, context);
    } catch (const std::exception& e) {  // bad_alloc of the per-box arrays
        return make_status(k->api, ORT_FAIL, "evonnx: node '%s': %s", k->node_name.c_str(), e.what());
    }
}

void ORT_API_CALL destroy_nms(void* kernel) { delete static_cast<NmsKernel*>(kernel); }
const char* ORT_API_CALL nms_name(const OrtCustomOp*) { return kNmsOpName; }
size_t ORT_API_CALL nms_inputs(const OrtCustomOp*) { return 5; }
ONNXTensorElementDataType ORT_API_CALL nms_input_type(const OrtCustomOp*, size_t index) {
    return index == 2 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL nms_input_kind(const OrtCustomOp*, size_t index) {
    return index < 2 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}
ONNXTensorElementDataType ORT_API_CALL nms_output_type(const OrtCustomOp*, size_t) {
    return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
}
OrtCustomOpInputOutputCharacteristic ORT_API_CALL nms_output_kind(const OrtCustomOp*, size_t) {
    return INPUT_OUTPUT_REQUIRED;
}

OrtCustomOp make_nms_op() {
    OrtCustomOp op{};  // fields not set stay NULL: "not provided"
    op.version = ORT_API_VERSION;
    op.GetName = nms_name;
    op.GetExecutionProviderType = execution_provider_cpu;
    op.GetInputTypeCount = nms_inputs;
    op.GetInputType = nms_input_type;
    op.GetInputCharacteristic = nms_input_kind;
    op.GetInputMemoryType = default_memory;
    op.GetOutputTypeCount = one_formal;
    op.GetOutputType = nms_output_type;
    op.GetOutputCharacteristic = nms_output_kind;
    op.CreateKernelV2 = create_nms;
    op.KernelComputeV2 = compute_nms_kernel;
    op.KernelDestroy = destroy_nms;
    op.GetStartVersion = start_version;
    op.GetEndVersion = end_version;
    return op;
}

const OrtCustomOp kNmsOp = make_nms_op();
