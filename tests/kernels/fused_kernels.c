/* Hand-written kernels for the runtime tests, shaped like the generator's output: each kernel declares its
 * input/output element types and ranks, checks shapes in infer() and fills its outputs in compute(). */
#define _GNU_SOURCE /* syscall(SYS_gettid) and clock_gettime under -std=c11 */
#include <stdbool.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "evonnx_abi.h"

enum { FLOAT = 1, INT64 = 7, BOOL = 9 };

/* k_add_index: x float [N,4], idx int64 [N] -> y float [N,4] = x + idx[:, None], positive bool [N] = idx > 0 */
static const int32_t add_in_types[] = {FLOAT, INT64}, add_in_ranks[] = {2, 1};
static const int32_t add_out_types[] = {FLOAT, BOOL}, add_out_ranks[] = {2, 1};

static int add_infer(const int64_t *const *in, const int32_t *ranks, int64_t *const *out, int32_t *out_ranks,
                       char *err) {
    (void)out_ranks;
    (void)ranks;
    if (in[0][1] != 4) {
        snprintf(err, EVO_ERRLEN, "k_add_index: input 0 dim 1 is %lld, expected 4", (long long)in[0][1]);
        return 1;
    }
    if (in[1][0] != in[0][0]) {
        snprintf(err, EVO_ERRLEN, "k_add_index: input 1 dim 0 is %lld, expected %lld (input 0 dim 0)",
                 (long long)in[1][0], (long long)in[0][0]);
        return 1;
    }
    out[0][0] = in[0][0];
    out[0][1] = 4;
    out[1][0] = in[0][0];
    return 0;
}

static int add_compute(const evo_args *a, char *err) {
    (void)err;
    const float *x = a->inputs[0];
    const int64_t *idx = a->inputs[1];
    float *y = a->outputs[0];
    bool *positive = a->outputs[1];
    for (int64_t i = 0; i < a->input_dims[0][0]; ++i) {
        for (int64_t j = 0; j < 4; ++j) y[i * 4 + j] = x[i * 4 + j] + (float)idx[i];
        positive[i] = idx[i] > 0;
    }
    return 0;
}

static const evo_kernel k_add_index = {"k_add_index", 2, 2, add_in_types, add_in_ranks, add_out_types,
                                       add_out_ranks, add_infer, add_compute, NULL, "test-k_add_index"};

/* k_scale_rows: x float [N,4] -> y float [N,4] = 2x + 1, in tasks of 64 rows through parallel_for. */
enum { ROWS_PER_TASK = 64 };
static const int32_t scale_types[] = {FLOAT}, scale_ranks[] = {2};

struct scale_task {
    const float *x;
    float *y;
    int64_t rows;
};

static void scale_rows(void *data, size_t task) {
    const struct scale_task *t = data;
    int64_t end = (int64_t)(task + 1) * ROWS_PER_TASK;
    if (end > t->rows) end = t->rows;
    for (int64_t i = (int64_t)task * ROWS_PER_TASK * 4; i < end * 4; ++i) t->y[i] = 2.0f * t->x[i] + 1.0f;
}

static int scale_infer(const int64_t *const *in, const int32_t *ranks, int64_t *const *out, int32_t *out_ranks,
                       char *err) {
    (void)out_ranks;
    (void)ranks;
    (void)err;
    out[0][0] = in[0][0];
    out[0][1] = in[0][1];
    return 0;
}

static int scale_compute(const evo_args *a, char *err) {
    (void)err;
    if (a->input_dims[0][1] != 4) {
        snprintf(err, EVO_ERRLEN, "k_scale_rows: input 0 dim 1 must be 4");
        return 1;
    }
    struct scale_task t = {a->inputs[0], a->outputs[0], a->input_dims[0][0]};
    a->parallel_for(a->rt, scale_rows, &t, (size_t)((t.rows + ROWS_PER_TASK - 1) / ROWS_PER_TASK));
    return 0;
}

static const evo_kernel k_scale_rows = {"k_scale_rows", 1, 1, scale_types, scale_ranks, scale_types,
                                        scale_ranks, scale_infer, scale_compute, NULL, "test-k_scale_rows"};

/* k_thread_ids: x float [T] -> tid int64 [T]: task i busy-waits about 1 ms, then writes the id of the thread
 * that ran it, so a test can see whether parallel_for reached more than one thread. */
static const int32_t tid_in_types[] = {FLOAT}, tid_out_types[] = {INT64}, tid_ranks[] = {1};

static void record_thread(void *data, size_t task) {
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do clock_gettime(CLOCK_MONOTONIC, &now);
    while ((now.tv_sec - start.tv_sec) * 1000000000L + (now.tv_nsec - start.tv_nsec) < 1000000L);
    ((int64_t *)data)[task] = (int64_t)syscall(SYS_gettid);
}

static int tid_infer(const int64_t *const *in, const int32_t *ranks, int64_t *const *out, int32_t *out_ranks,
                       char *err) {
    (void)out_ranks;
    (void)ranks;
    (void)err;
    out[0][0] = in[0][0];
    return 0;
}

static int tid_compute(const evo_args *a, char *err) {
    (void)err;
    a->parallel_for(a->rt, record_thread, a->outputs[0], (size_t)a->output_dims[0][0]);
    return 0;
}

static const evo_kernel k_thread_ids = {"k_thread_ids", 1, 1, tid_in_types, tid_ranks, tid_out_types, tid_ranks,
                                        tid_infer, tid_compute, NULL, "test-k_thread_ids"};

/* k_fail: x float [N] -> y float [N]; compute always fails, to test how kernel errors reach the caller. */
static int fail_compute(const evo_args *a, char *err) {
    snprintf(err, EVO_ERRLEN, "k_fail: deliberate failure at N=%lld", (long long)a->input_dims[0][0]);
    return 1;
}

static const evo_kernel k_fail = {"k_fail", 1, 1, tid_in_types, tid_ranks, tid_in_types, tid_ranks,
                                  tid_infer, fail_compute, NULL, "test-k_fail"};

const evo_kernel *const evo_kernel_table[] = {&k_add_index, &k_scale_rows, &k_thread_ids, &k_fail};
const int32_t evo_kernel_count = 4;
const char evo_library_model[] = "test_model.onnx";
