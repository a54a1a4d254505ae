/*
Writes the fuzzers' seed inputs, small valid files of each kind (dev/fuzz/fuzz_readers.h), with the
project's own writers where it has one (gpt2_save, CheckpointWriter); the rest by hand, as their
headers' format comments describe. Seeds are kept small, because the fuzzer mutates mostly within the
sizes its corpus already has.
    g++ -std=c++17 -O1 -DLLMC_CPU -DLLMC_FUZZ -fopenmp $(mpicxx --showme:compile) -x c++ dev/fuzz/make_seeds.cu \
        -o build/fuzz/make_seeds -lboost_context -lopenblas $(mpicxx --showme:link) && build/fuzz/make_seeds dev/fuzz/seeds
The committed seeds under dev/fuzz/seeds/ were made so; build/test_fuzz_regressions checks that every
one of them is still accepted.
*/
#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_readers.h"
#include "../../llmc/rand.h"

static void make_directory(const std::string& path) {
    if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) fatal("cannot create %s: %s", path.c_str(), strerror(errno));
}

static void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
    FILE* file = open_file(path, "wb");
    write_exact(bytes.data(), 1, bytes.size(), file, path);
    close_file(file, path);
}

// The smallest shape the kernels accept: one layer, one head of 16 channels, a vocabulary of 5 padded
// to 128, 4 positions. About 5,400 parameters: 22 KB in fp32, 11 KB in bf16.
static GPT2Config tiny_config() {
    GPT2Config c;
    c.num_layers = 1, c.num_heads = 1, c.channels = 16, c.vocab_size = 5, c.padded_vocab_size = 128, c.max_seq_len = 4;
    return gpt2_shape(c);
}

static void write_model_seeds(const std::string& directory) {
    const ParameterLayout layout(tiny_config());
    Rng rng{42};
    const std::vector<float> values = gpt2_initial_parameters(layout, [&] { return rng.next_normal(); });
    gpt2_save(layout, values, directory + "/tiny_fp32.bin");
    // the same model in bf16 (version 5), which only llm.c writes: the header with another version, then
    // each parameter's upper 16 bits
    std::vector<uint8_t> file;
    int header[256] = {0};
    header[0] = kModelMagic, header[1] = kModelVersionBF16;
    const GPT2Config& c = layout.config;
    header[2] = c.max_seq_len, header[3] = c.vocab_size, header[4] = c.num_layers, header[5] = c.num_heads;
    header[6] = c.channels, header[7] = c.padded_vocab_size;
    file.insert(file.end(), (uint8_t*)header, (uint8_t*)(header + 256));
    for_each_tensor_in_file_order(layout, [&](int, int, size_t offset, size_t count) {
        for (size_t i = 0; i < count; i++) {
            uint32_t bits;
            memcpy(&bits, &values[offset + i], 4);
            const uint16_t upper = (uint16_t)(bits >> 16);
            file.insert(file.end(), (const uint8_t*)&upper, (const uint8_t*)&upper + 2);
        }
    });
    write_bytes(directory + "/tiny_bf16.bin", file);
}

static void write_shard_seeds(const std::string& directory) {
    auto shard = [&](const std::string& name, const std::vector<uint16_t>& tokens) {
        int32_t header[256] = {0};
        header[0] = SHARD_MAGIC, header[1] = SHARD_VERSION, header[2] = (int32_t)tokens.size();
        std::vector<uint8_t> file((uint8_t*)header, (uint8_t*)(header + 256));
        file.insert(file.end(), (const uint8_t*)tokens.data(), (const uint8_t*)(tokens.data() + tokens.size()));
        write_bytes(directory + "/" + name, file);
    };
    std::vector<uint16_t> tokens;
    Rng rng{7};
    for (int i = 0; i < 64; i++) tokens.push_back((uint16_t)rng.next_below(50257));
    tokens.push_back(50256);  // GPT-2's end of text, the largest id allowed
    shard("tiny.bin", tokens);
    shard("two_tokens.bin", {50256, 0});  // the smallest shard that holds one batch
}

static void write_tokenizer_seeds(const std::string& directory) {
    // the 256 single bytes (as GPT-2's tokenizer has them), a few merged tokens, including the first
    // and last two bytes of a three-byte character, and the end-of-text token last
    std::vector<std::string> tokens;
    for (int byte = 0; byte < 256; byte++) tokens.push_back(std::string(1, (char)byte));
    for (const char* merged : {" the", "ing", "\xe2\x80", "\x99s", "\n\n", "<|endoftext|>"}) tokens.push_back(merged);
    int32_t header[256] = {0};
    header[0] = TOKENIZER_MAGIC, header[1] = TOKENIZER_VERSION;
    header[2] = (int32_t)tokens.size(), header[3] = (int32_t)tokens.size() - 1;
    std::vector<uint8_t> file((uint8_t*)header, (uint8_t*)(header + 256));
    for (const std::string& token : tokens) {
        file.push_back((uint8_t)token.size());
        file.insert(file.end(), token.begin(), token.end());
    }
    write_bytes(directory + "/tiny.bin", file);
}

// A main checkpoint file (the values the training program saves, and its own shard of the optimizer
// state) and a further shard file: the same container, other sections.
static void write_checkpoint_seeds(const std::string& directory) {
    const std::vector<float> params(96, 0.5f), moments(96, 0.001f);
    auto add_optimizer_shard = [&](CheckpointWriter& writer) {
        writer.add("params", params.data(), params.size() * sizeof(float));
        writer.add("adamw_m", moments.data(), moments.size() * sizeof(float));
        writer.add("adamw_v", moments.data(), moments.size() * sizeof(float));
    };
    // the shard file first: the main file lists its table checksum, as the trainer's does
    const uint64_t id = 0x5eed5eed5eed5eedull;
    {
        CheckpointWriter writer(directory + "/main.shard1.bin");
        add_checkpoint_identity(writer, id, 12);
        add_optimizer_shard(writer);
        writer.add("empty", nullptr, 0);
        writer.commit();
    }
    const ShardFileEntry listed{1, id, CheckpointReader(directory + "/main.shard1.bin").table_checksum()};
    {
        CheckpointWriter writer(directory + "/main.bin");
        add_checkpoint_identity(writer, id, 12);
        writer.add("shard_files", &listed, sizeof(listed));
        writer.add_value("config", tiny_config());
        writer.add_value("precision_bytes", (int)sizeof(float));
        DataLoaderState data = {1, 0, 3, 1337, 1, 1, 64, 4};
        writer.add_value("train_data", data);
        writer.add_value("sample_rng", Rng{42});
        writer.add_value("shards", 2);
        writer.add_value("tensor_parallel", 1);
        writer.add_value("pipeline", 1);
        writer.add_value("pipeline_virtual", 1);
        add_optimizer_shard(writer);
        writer.commit();
    }
}

// Flag lines as a user types them: one argument per line (the harness also splits at NUL).
static void write_flag_seeds(const std::string& directory) {
    const std::vector<std::pair<std::string, std::string>> lines = {
        {"custom_model.txt", "--model\ncustom\n--layers\n2\n--heads\n2\n--channels\n64\n--vocab-size\n512\n"
                             "--max-seq-len\n128\n--batch-size\n2\n--seq-len\n32\n--steps\n10\n"},
        {"parallel.txt", "--tp=2\n--pp=2\n--pp-schedule\ninterleaved\n--pp-virtual\n2\n--cp\n2\n--cp-mode=ulysses\n"
                         "--zero\n3\n--dp-shard\n2\n--recompute\nfull\n--recompute-every\n2\n--sequence-parallel\n"},
        {"optimizer.txt", "--learning-rate\n6e-4\n--lr-schedule\nconstant\n--warmup-steps\n5\n--weight-decay=0\n"
                          "--beta2\n0.99\n--grad-clip\n0\n--shuffle\nfalse\n--data-seed=7\n"},
        {"plan.txt", "--plan\n8\n--gpu-memory\n80\n--plan-top\n3\n--model\n1558M\n--resume\n--save-model=no\n"},
        {"paths.txt", "--train-data\ndata/*.bin\n--output-dir=out dir\n--tokenizer\n\n--trace\n/tmp/trace.json\n"},
    };
    for (const auto& [name, text] : lines) write_bytes(directory + "/" + name, std::vector<uint8_t>(text.begin(), text.end()));
}

int main(int argc, char** argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SEED_DIRECTORY   (writes SEED_DIRECTORY/<reader>/...)\n", argv[0]);
        return 2;
    }
    const std::string root = argv[1];
    try {  // fatal() throws in this build (-DLLMC_FUZZ)
        make_directory(root);
        for (const FuzzedReader& reader : fuzzed_readers()) make_directory(root + "/" + reader.name);
        write_model_seeds(root + "/model");
        write_shard_seeds(root + "/shard");
        write_tokenizer_seeds(root + "/tokenizer");
        write_checkpoint_seeds(root + "/checkpoint");
        write_flag_seeds(root + "/flags");
    } catch (const FatalError& error) {
        fprintf(stderr, "%s\n", error.message.c_str());
        return 1;
    }
    printf("seeds written under %s\n", root.c_str());
    return 0;
}
