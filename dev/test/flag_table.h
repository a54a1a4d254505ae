/*
A flag table for the tests of llmc/io/flags.h (dev/test/test_flags.cu) and of the logger, which writes a run's
flags (dev/test/test_host.cu): a few flags of each kind, as a training program might declare them.
*/
#pragma once

#include <string>
#include <vector>
#include "../../llmc/io/flags.h"

// The table a training program might declare; each test parses a fresh one.
struct TestFlags {
    Flags flags{"train_gpt", "Trains GPT-2 on token shards."};
    int& batch_size;
    int& shift;
    float& learning_rate;
    float& dropout;
    bool& resume;
    std::string& output_dir;
    std::string& schedule;
    TestFlags()
        : batch_size((flags.heading("Model and data"), flags.add_int("batch-size", 4, "sequences per micro-batch", 1, 1024))),
          shift(flags.add_int("shift", 0, "any integer")),
          learning_rate((flags.heading("Optimizer"), flags.add_float("learning-rate", 3e-4f, "peak learning rate", 0.0f))),
          dropout(flags.add_float("dropout", 0.0f, "a fraction", 0.0f, 1.0f)),
          resume(flags.add_bool("resume", false, "continue from the latest checkpoint")),
          output_dir(flags.add_string("output-dir", "out", "where logs and checkpoints go")),
          schedule(flags.add_choice("lr-schedule", "cosine", {"cosine", "constant"}, "learning-rate schedule")) {}

    void parse(std::vector<std::string> arguments) {
        arguments.insert(arguments.begin(), "train_gpt");
        std::vector<char*> argv;
        for (std::string& a : arguments) argv.push_back(a.data());
        flags.parse((int)argv.size(), argv.data());
    }
};
