/* A plain C11 program that runs an evonnx-optimized model with onnxruntime and no Python: the C-host
 * instructions of the README, as a test.
 *
 * Usage: c_host MODEL LIBRARY N
 * MODEL has one Fused node running k_add_index (inputs x float [N,4], idx int64 [N]; outputs y float [N,4],
 * positive bool [N]). The program feeds x[i][j] = i + j/4 and idx[i] = i - 1 and prints each output on one line:
 * its name, then its values. Exit status 1 with the message on stderr on any onnxruntime error.
 *
 * Build: cc -std=c11 c_host.c -I<ort headers> -L<dir with libonnxruntime.so> -lonnxruntime -Wl,-rpath,<dir> */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "onnxruntime_c_api.h"

static const OrtApi *api;

static void check(OrtStatus *status) {
    if (status != NULL) {
        fprintf(stderr, "c_host: %s\n", api->GetErrorMessage(status));
        api->ReleaseStatus(status);
        exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL LIBRARY N\n", argv[0]);
        return 2;
    }
    const int64_t n = atoll(argv[3]);
    api = OrtGetApiBase()->GetApi(ORT_API_VERSION);
    if (api == NULL) {
        fprintf(stderr, "c_host: onnxruntime %s lacks C API %d\n", OrtGetApiBase()->GetVersionString(),
                ORT_API_VERSION);
        return 1;
    }

    OrtEnv *env;
    OrtSessionOptions *options;
    OrtSession *session;
    check(api->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "c_host", &env));
    check(api->CreateSessionOptions(&options));
    check(api->SetIntraOpNumThreads(options, 1));
    check(api->RegisterCustomOpsLibrary_V2(options, argv[2]));
    check(api->CreateSession(env, argv[1], options, &session));

    float *x = malloc(sizeof(float) * (size_t)(n * 4 + 1));
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(n + 1));
    for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < 4; ++j) x[i * 4 + j] = (float)i + (float)j / 4.0f;
        idx[i] = i - 1;
    }
    OrtMemoryInfo *cpu;
    check(api->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &cpu));
    const int64_t x_shape[] = {n, 4}, idx_shape[] = {n};
    OrtValue *inputs[2] = {NULL, NULL};
    check(api->CreateTensorWithDataAsOrtValue(cpu, x, sizeof(float) * (size_t)(n * 4), x_shape, 2,
                                              ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, &inputs[0]));
    check(api->CreateTensorWithDataAsOrtValue(cpu, idx, sizeof(int64_t) * (size_t)n, idx_shape, 1,
                                              ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, &inputs[1]));

    const char *input_names[] = {"x", "idx"}, *output_names[] = {"y", "positive"};
    OrtValue *outputs[2] = {NULL, NULL};
    check(api->Run(session, NULL, input_names, (const OrtValue *const *)inputs, 2, output_names, 2, outputs));

    const float *y;
    const bool *positive;
    check(api->GetTensorMutableData(outputs[0], (void **)&y));
    check(api->GetTensorMutableData(outputs[1], (void **)&positive));
    printf("y");
    for (int64_t i = 0; i < n * 4; ++i) printf(" %.9g", y[i]);
    printf("\npositive");
    for (int64_t i = 0; i < n; ++i) printf(" %d", positive[i] ? 1 : 0);
    printf("\n");

    for (int k = 0; k < 2; ++k) {
        api->ReleaseValue(outputs[k]);
        api->ReleaseValue(inputs[k]);
    }
    api->ReleaseMemoryInfo(cpu);
    api->ReleaseSession(session);
    api->ReleaseSessionOptions(options);
    api->ReleaseEnv(env);
    free(x);
    free(idx);
    return 0;
}
