/*
Device memory: what a training run will need, by arithmetic (nothing allocated, no GPU), and beside it what the
run held (booked in llmc/device_memory.h by tracked_alloc). One concern a file:
    memory_plan.h           the plan per rank: model state by ZeRO stage, bytes sent per step, the totals
                            (plan_training_memory, print_memory_plan)
    activation_memory.h     a micro-batch's activations and workspace, buffer by buffer as gpt2_allocate makes
                            them (GPT2MemoryShape, gpt2_activation_bytes)
    korthikanti_table2.h    the per-layer activations beside Korthikanti et al.'s Table 2 (--plan prints it)
    memory_report.h         the end of a run: what rank 0 held beside the formulas (report_memory)
*/
#pragma once

#include "memory_plan.h"
#include "korthikanti_table2.h"
#include "memory_report.h"
