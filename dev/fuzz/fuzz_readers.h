/*
Fuzzing the readers of untrusted input: every file or command line a user, a crash or a disk can hand the
program. Each reader must accept a good input, and stop on a bad one with one "error: ..." line; it must
never crash, hang, or allocate for a size its input merely claims.

    reader       what it runs on each input                                          seeds made from
    model        gpt2_read_config, then gpt2_read_parameters in that shape            gpt2_save
    shard        DataLoader::init on the input as a token shard, then one epoch        a shard by hand
    tokenizer    tokenizer_init, then every token id decoded and shown as text         a tokenizer by hand
    checkpoint   CheckpointReader: open, section_names, verify_all, the int values,    CheckpointWriter
                 and a main file's list of shard files (listed_shard_files)
    flags        parse_options on the input split at NUL or newline into argv          flag lines

How to run (needs clang: apt-get install clang):
    scripts/fuzz.sh [SECONDS_PER_READER]     builds dev/fuzz/fuzz_reader.cu once per reader with libFuzzer,
                                             ASan and UBSan, fuzzes each from dev/fuzz/seeds/<reader>/, and
                                             leaves corpora, crashes and logs in build/fuzz/
    build/fuzz/fuzz_<reader> FILE            replays one input (a crash file from build/fuzz/<reader>/)
    make build/test_fuzz_regressions && build/test_fuzz_regressions
                                             replays dev/fuzz/regressions/ with g++ (part of make test)
Seeds are written by dev/fuzz/make_seeds.cu with the project's own writers (see there to regenerate).

Built with -DLLMC_FUZZ, fatal() throws a FatalError instead of exiting (llmc/utils.h), so one process can
run thousands of inputs; run_fuzzed_reader catches it and closes the files the reader had open when it
threw. Each reader below also checks what its reader promises beyond "no crash" and abort()s when a
promise is broken, which the fuzzer reports like a crash. A checkpoint's mutants get their checksums
recomputed half the time (repair_checkpoint_checksums), or few would get past them to the table checks.
*/
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "../../llmc/utils.h"
#include "../../llmc/model/gpt2.cuh"
#include "../../llmc/io/dataloader.h"
#include "../../llmc/io/tokenizer.h"
#include "../../llmc/io/checkpoint.h"
#include "../../llmc/io/options.h"

#ifndef LLMC_FUZZ
#error "the fuzz harnesses need -DLLMC_FUZZ, which makes fatal() throw instead of exiting"
#endif

// A broken promise or a broken harness: abort, so that the fuzzer keeps the input as a crash.
[[noreturn]] __attribute__((format(printf, 1, 2))) inline void fuzz_finding(const char* format, ...) {
    va_list args;
    va_start(args, format);
    fprintf(stderr, "fuzz finding: ");
    vfprintf(stderr, format, args);
    fprintf(stderr, "\n");
    va_end(args);
    abort();
}

// The input as a file, for readers that take a path: one memory-backed file per process (memfd),
// rewritten for each input and named by its /proc/self/fd path, so parallel fuzzers never share a file
// and a killed one leaves nothing behind.
inline std::string fuzz_input_path(const uint8_t* data, size_t size) {
    static int fd = -1;
    if (fd < 0) {
        fd = memfd_create("llmc_fuzz_input", MFD_CLOEXEC);
        if (fd < 0) fuzz_finding("memfd_create: %s", strerror(errno));
    }
    if (ftruncate(fd, 0) != 0) fuzz_finding("ftruncate of the input file: %s", strerror(errno));
    for (size_t written = 0; written < size;) {
        ssize_t count = pwrite(fd, data + written, size - written, (off_t)written);
        if (count <= 0) fuzz_finding("writing the input file: %s", strerror(errno));
        written += (size_t)count;
    }
    return "/proc/self/fd/" + std::to_string(fd);
}

// ---------------------------------------------------------------------------------------------------
// the readers

inline void read_model_file(const uint8_t* data, size_t size) {
    const std::string path = fuzz_input_path(data, size);
    const GPT2Config config = gpt2_read_config(path);
    // the header was checked against the file's size before anything was allocated: a shape it accepts
    // holds no more parameters than the file has room for (2 bytes each, bf16)
    const ParameterLayout layout(config);
    if (layout.num_parameters > size / 2)
        fuzz_finding("model header accepted for %zu parameters in a file of %zu bytes", layout.num_parameters, size);
    const std::vector<float> values = gpt2_read_parameters(path, layout);
    if (values.size() != layout.total) fuzz_finding("read %zu parameters, the layout has %zu", values.size(), layout.total);
}

inline void read_token_shard(const uint8_t* data, size_t size) {
    constexpr int kVocabulary = 50257;  // GPT-2's: ids 50257..65535 fit in uint16 and must be refused
    const std::string path = fuzz_input_path(data, size);
    DataLoader loader;
    // one row of one token per batch: any shard of two or more tokens holds a batch
    loader.init(path, 1, 1, 0, 1, /*shuffled=*/true, /*shuffle_seed=*/1337, kVocabulary);
    // one epoch and the first batch of the next: the first batch loads the shard and checks every id
    const size_t batches = loader.batches_per_epoch() + 1;
    for (size_t i = 0; i < batches; i++) {
        loader.next_batch();
        if (loader.inputs[0] < 0 || loader.inputs[0] >= kVocabulary || loader.targets[0] < 0 ||
            loader.targets[0] >= kVocabulary)
            fuzz_finding("shard batch %zu holds token %d -> %d outside the vocabulary", i, loader.inputs[0],
                         loader.targets[0]);
    }
    loader.free();
}

inline void read_tokenizer(const uint8_t* data, size_t size) {
    const std::string path = fuzz_input_path(data, size);
    Tokenizer tokenizer;
    tokenizer_init(&tokenizer, path);
    std::vector<int> ids(tokenizer.vocab_size);
    for (size_t id = 0; id < ids.size(); id++) {
        ids[id] = (int)id;
        if (tokenizer_decode(&tokenizer, (uint32_t)id).empty()) fuzz_finding("token %zu decodes to nothing", id);
    }
    // the text shown while sampling: valid UTF-8 with no control characters but newline and tab
    const std::string shown = tokenizer_printable(&tokenizer, ids.data(), ids.size());
    for (size_t i = 0; i < shown.size();) {
        const unsigned char* at = (const unsigned char*)shown.data() + i;
        const int length = utf8_sequence_length(at, shown.size() - i);
        if (length <= 0) fuzz_finding("shown text has invalid UTF-8 at byte %zu", i);
        if (length == 1 && ((at[0] < 0x20 && at[0] != '\n' && at[0] != '\t') || at[0] == 0x7F))
            fuzz_finding("shown text has control character 0x%02x at byte %zu", at[0], i);
        i += (size_t)length;
    }
    tokenizer_free(&tokenizer);
}

inline void read_checkpoint(const uint8_t* data, size_t size) {
    const std::string path = fuzz_input_path(data, size);
    CheckpointReader reader(path);
    // from here the reader owns its file and its destructor closes it (with fclose, not close_file), also
    // when a later call throws
    fuzz_files_left_open().clear();
    for (const std::string& name : reader.section_names()) {
        if (!reader.has(name) || reader.bytes(name) > size)
            fuzz_finding("checkpoint section '%s' listed but not found, or larger than the file", name.c_str());
        for (unsigned char c : name)
            if (c < 0x20 || c == 0x7F) fuzz_finding("the reader accepted a section name with a control character");
    }
    reader.verify_all();
    // the int values that the training program reads from a main checkpoint
    for (const char* name : {"shards", "precision_bytes", "tensor_parallel", "pipeline", "pipeline_virtual"}) {
        if (reader.has(name)) (void)reader.read_value<int>(name);
    }
    // a main file's identity and its list of shard files, as a resume reads them (for the step it holds)
    if (reader.has("step") && reader.has("shard_files")) {
        const long long step = reader.read_value<long long>("step");
        const std::vector<ShardFileEntry> listed = listed_shard_files(reader, path, step);
        if (listed.size() * sizeof(ShardFileEntry) != reader.bytes("shard_files"))
            fuzz_finding("the list of shard files has %zu entries in %zu bytes", listed.size(),
                         reader.bytes("shard_files"));
    }
}

// Recomputes the checksums in a mutated checkpoint whose table still lies where its header says: without
// this the fuzzer seldom gets a mutant past the table's checksum to the checks behind it.
inline void repair_checkpoint_checksums(uint8_t* data, size_t size) {
    CheckpointHeader header;
    if (size < sizeof(header)) return;
    memcpy(&header, data, sizeof(header));
    const uint64_t table_bytes = (uint64_t)header.section_count * sizeof(CheckpointSection);
    if (header.table_offset < sizeof(header) || header.table_offset > size || size - header.table_offset != table_bytes)
        return;
    for (uint32_t i = 0; i < header.section_count; i++) {
        uint8_t* entry = data + header.table_offset + i * sizeof(CheckpointSection);
        CheckpointSection section;
        memcpy(&section, entry, sizeof(section));
        if (section.offset > header.table_offset || section.bytes > header.table_offset - section.offset) continue;
        section.checksum = fnv1a64(data + section.offset, section.bytes);
        memcpy(entry, &section, sizeof(section));
    }
    header.table_checksum = fnv1a64(data + header.table_offset, table_bytes);
    memcpy(data, &header, sizeof(header));
}

inline void parse_flag_lines(const uint8_t* data, size_t size) {
    std::vector<std::string> arguments = {"train_gpt"};
    std::string word;
    for (size_t i = 0; i < size; i++) {
        if (data[i] == '\0' || data[i] == '\n') {
            arguments.push_back(word);
            word.clear();
        } else {
            word += (char)data[i];
        }
    }
    if (!word.empty()) arguments.push_back(word);
    // --help prints the table and exits with status 0: the one way parse_options may end the program
    for (const std::string& argument : arguments)
        if (argument == "--help" || argument == "-h") return;
    std::vector<char*> argv;
    for (std::string& argument : arguments) argv.push_back(&argument[0]);
    argv.push_back(nullptr);
    const Options options = parse_options((int)arguments.size(), argv.data());
    if (options.flags_json.empty()) fuzz_finding("parse_options returned without its flags' JSON");
}

// ---------------------------------------------------------------------------------------------------
// the table the fuzzer and the regression suite both use

struct FuzzedReader {
    const char* name;  // its folder under dev/fuzz/seeds/ and dev/fuzz/regressions/
    void (*read)(const uint8_t* data, size_t size);
    // fixes what a mutation broke that the reader checks first (checksums), or nullptr
    void (*repair)(uint8_t* data, size_t size);
};

inline const std::vector<FuzzedReader>& fuzzed_readers() {
    static const std::vector<FuzzedReader> readers = {
        {"model", read_model_file, nullptr},
        {"shard", read_token_shard, nullptr},
        {"tokenizer", read_tokenizer, nullptr},
        {"checkpoint", read_checkpoint, repair_checkpoint_checksums},
        {"flags", parse_flag_lines, nullptr},
    };
    return readers;
}

inline const FuzzedReader* find_fuzzed_reader(const std::string& name) {
    for (const FuzzedReader& reader : fuzzed_readers())
        if (name == reader.name) return &reader;
    return nullptr;
}

// Runs one reader on one input: "" when the reader accepted it, else the error line fatal() threw. The
// files a throwing reader left open are closed here; one that returns must have closed its own.
inline std::string run_fuzzed_reader(const FuzzedReader& reader, const uint8_t* data, size_t size) {
    try {
        reader.read(data, size);
    } catch (const FatalError& error) {
        for (FILE* file : fuzz_files_left_open()) fclose(file);
        fuzz_files_left_open().clear();
        if (error.message.find('\n') != std::string::npos)
            fuzz_finding("the %s reader's error spans lines: %s", reader.name, error.message.c_str());
        return error.message;
    }
    if (!fuzz_files_left_open().empty())
        fuzz_finding("the %s reader returned with %zu file(s) still open", reader.name, fuzz_files_left_open().size());
    return "";
}
