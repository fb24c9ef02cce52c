/* muse-engine kernel-check: the flags of the kernel checker (engine/check/ops_check.c). */
#include "cmd/cmd_check.h"

#include "backend/backend.h"
#include "base/flags.h"
#include "check/ops_check.h"
#include "check/registry.h"

static const char about[] =
    "Checks every kernel of the registry (engine/backend/ops.h) on the backend: the exact path\n"
    "against the CPU reference at 1, 16, 17 and N rows, the fast path (--kernels fast) against\n"
    "the exact path on the same backend at 1, 4, 16, 17, 64, 256 and N rows: outputs written,\n"
    "relative error within the bound, batch invariance bitwise, prompt rows == decode rows,\n"
    "repeatability, padding, a chunked prompt and graph replay; the EXL3 tiles path equals the\n"
    "small-M path; the sampler on --sample-rows random rows; planted controls must show red.\n"
    "Prints TAP and one SUMMARY line; exit 0 all green, 1 a failure or a missed control, 2 the\n"
    "pack or the backend could not be made. --contract prints kernels/CONTRACT.md's table.\n";

int muse_cmd_kernel_check(int argc, char **argv)
{
    const char *model = NULL, *backend = "cpu";
    const char *gpus = NULL, *kernels = NULL;
    long long max_rows = 64, ranks = 0, sample_rows = 10000;
    bool contract = false;
    const muse_flag table[] = {
        MUSE_FLAG_S("model", &model, "DIR", "the pack (required unless --contract)", .def = ""),
        MUSE_FLAG_S("kernels", &kernels, "exact|fast",
                    "the kernel path checked: exact against the CPU, fast against exact",
                    .def = "MUSE_CUDA_PATH, else exact"),
        MUSE_FLAG_S("backend", &backend, "cpu|cuda", "the backend checked", .def = "cpu"),
        MUSE_FLAG_L("max-rows", &max_rows, 17, 4096, "N", "the largest row count checked"),
        MUSE_FLAG_L("ranks", &ranks, 1, MUSE_MAX_RANKS, "N",
                    "tensor-parallel ranks of the backend and of the CPU reference",
                    .def = "1, or the count of --gpus"),
        MUSE_FLAG_S("gpus", &gpus, "LIST", "--backend cuda: the GPU of each rank, e.g. 0,0",
                    .def = "every rank on GPU 0"),
        MUSE_FLAG_L("sample-rows", &sample_rows, 1, 10000000, "N",
                    "random rows the sampler is checked on against the host's (default 10000)"),
        MUSE_FLAG_B("contract", &contract,
                    "print the registry as kernels/CONTRACT.md's table (markdown) and exit"),
    };
    const muse_flags set = {.prog = "muse-engine kernel-check",
                            .about = about,
                            .flags = table,
                            .n = sizeof table / sizeof *table};
    int rc = muse_flags_parse(&set, argc, argv);
    if (rc != MUSE_FLAGS_RUN) return rc;
    if (contract) {
        muse_kernel_contract_table(stdout);
        return 0;
    }
    if (!model) return muse_flags_error(&set, "--model DIR is required");
    muse_err e = {{0}};
    muse_kernels path;
    if (muse_kernels_parse("--kernels", kernels, &path, &e) ||
        muse_kernels_resolve(path, &path, &e))
        return muse_flags_error(&set, "%s", e.msg);
    muse_backend_opts bo = {0};
    const muse_rank_flags names = {"--gpus", "--ranks", "--backend"};
    if (muse_backend_ranks(&names, backend, gpus, ranks, &bo, &e))
        return muse_flags_error(&set, "%s", e.msg);
    muse_ops_check_opts o = {.model = model,
                             .backend = backend,
                             .max_rows = (long)max_rows,
                             .sample_rows = (long)sample_rows,
                             .ranks = bo.ranks,
                             .kernels = path,
                             .out = stdout};
    memcpy(o.devices, bo.devices, sizeof o.devices);
    return muse_ops_check("muse-engine kernel-check", &o);
}
