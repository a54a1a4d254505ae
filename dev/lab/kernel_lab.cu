/*
The kernel lab: every kernel in llmc/ checked against a plain C++ reference, in the build's
precision, on the GPU or on the CPU device. With --bench it also times each kernel at GPT-2 124M shapes.

    ./kernel_lab_cpu                     all checks (CPU build, BF16)
    ./kernel_lab_fp32_cpu --only attention
    ./kernel_lab_cpu --only models       every kernel at every named model's widths, under the H100's and the
                                         A100's limits, and the table of their launches (lab_models.cuh)
    ./kernel_lab_cpu --skip models       all checks but that family (make test's reverse-lane runs: the
                                         forward-lane run of each precision has it)
    ./kernel_lab --bench                 checks, then timings (GPU build)
*/
#include "lab.h"
#include "lab_encoder.cuh"
#include "lab_layernorm.cuh"
#include "lab_matmul.cuh"
#include "lab_mma.cuh"
#include "lab_attention.cuh"
#include "lab_gelu.cuh"
#include "lab_rope.cuh"
#include "lab_swiglu.cuh"
#include "lab_moe.cuh"
#include "lab_classifier.cuh"
#include "lab_adamw.cuh"
#include "lab_global_norm.cuh"
#include "lab_models.cuh"

int main(int argc, char** argv) {
    for (int i = 1; i < argc; i++) {
        std::string arg = argv[i];
        if (arg == "--bench") {
            lab.bench = true;
        } else if (arg == "--only" && i + 1 < argc) {
            lab.only = argv[++i];
        } else if (arg == "--skip" && i + 1 < argc) {
            lab.skip = argv[++i];
        } else {
            fprintf(stderr, "usage: %s [--bench] [--only FAMILY] [--skip FAMILY]\n", argv[0]);
            return EXIT_FAILURE;
        }
    }
    printf("kernel lab: %s, %s\n", PRECISION_NAME, device_properties().name);
    matmul_setup();
    lab_encoder();
    lab_layernorm();
    lab_rmsnorm();
    lab_matmul();
    lab_mma();
    lab_attention();
    lab_gelu();
    lab_rope();
    lab_swiglu();
    lab_moe();
    lab_classifier();
    lab_adamw();
    lab_global_norm();
    lab_models();
    matmul_teardown();
    return lab_closing_line();
}
