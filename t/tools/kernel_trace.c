/* kernel_trace.c: a CUDA injection library (CUDA_INJECTION64_PATH) that records every kernel's
 * device start and end by CUPTI's activity API, graph launches included, into the CSV named
 * by MUSE_TRACE_OUT (default kernel-trace.csv) when the process exits: what nsys would show of
 * a decode round, where nsys cannot run (the device machines). No change to the traced program;
 * t/tools/trace_round.py reads the file. Built by `make trace` (mk/gpu.mk). */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *trace_out;
static const char *trace_path;

static void CUPTIAPI trace_buffer(uint8_t **buf, size_t *size, size_t *max_records)
{
    *size = (size_t)16 << 20;
    *buf = aligned_alloc(8, *size);
    *max_records = 0; /* as many as fit */
}

static void CUPTIAPI trace_done(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size,
                                size_t valid)
{
    (void)ctx, (void)stream, (void)size;
    if (!trace_out && trace_path) {
        trace_out = fopen(trace_path, "w");
        if (trace_out)
            fprintf(trace_out, "start_ns,end_ns,stream,graph,node,grid,block,name\n");
        else
            fprintf(stderr, "kernel_trace: cannot write %s\n", trace_path), trace_path = NULL;
    }
    CUpti_Activity *rec = NULL;
    while (trace_out && cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
        const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
        fprintf(trace_out, "%llu,%llu,%u,%u,%llu,%d,%d,%s\n", (unsigned long long)k->start,
                (unsigned long long)k->end, k->streamId, k->graphId,
                (unsigned long long)k->graphNodeId, k->gridX * k->gridY * k->gridZ,
                k->blockX * k->blockY * k->blockZ, k->name ? k->name : "?");
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
        fprintf(stderr, "kernel_trace: %zu records dropped\n", dropped);
    free(buf);
}

static void trace_flush(void)
{
    cuptiActivityFlushAll(1);
    if (trace_out) fclose(trace_out), trace_out = NULL;
}

/* called by the CUDA driver at its initialisation where CUDA_INJECTION64_PATH names this file */
int InitializeInjection(void)
{
    const char *p = getenv("MUSE_TRACE_OUT");
    trace_path = p && *p ? p : "kernel-trace.csv";
    if (cuptiActivityRegisterCallbacks(trace_buffer, trace_done) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI would not start: no trace\n");
        return 1;
    }
    atexit(trace_flush);
    return 1;
}
