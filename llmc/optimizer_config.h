/*
AdamW's hyperparameters, as the flags set them (llmc/io/options.h) and the optimizer step uses them
(zero_optimizer_step in llmc/parallel/zero.h; the update's math: llmc/kernels/adamw.cuh). Kept apart from
both so that reading the flags needs neither the model nor a kernel.
*/
#pragma once

struct AdamWConfig {
    float beta1 = 0.9f;
    float beta2 = 0.95f;
    float eps = 1e-8f;
    float weight_decay = 0.1f;   // matrices only
};
