/*
Reads batches of training examples from token shards.

Shard format (little-endian): header int32[256]: [0] = 20240520 magic, [1] = 1 version, [2] = number of
tokens N; then N uint16 tokens. The file is exactly 1024 + 2N bytes.

Rows and batches. A row is T+1 consecutive tokens: the model sees the first T (inputs) and learns to
predict the last T (targets, the same tokens shifted by one). Row r of a shard starts at token r*T, so
neighbouring rows share one token and a shard of N tokens holds (N-1)/T rows (rounded down).
A global batch is G = B * num_processes rows; process `rank` gets rows [rank*B, rank*B + B) of it.
Every shard must hold at least one global batch: N >= B * num_processes * T + 1 tokens.

    Invariant (data parallelism): which rows form global batch k, and in which order, depends only on
    the shards, T, G = B * num_processes, the shuffle flag, the seed and k. So num_processes ranks with
    B rows each together see exactly the rows, in the same order, that one process with
    B * num_processes rows sees: concatenating the ranks' batches gives the single process's batch.

Order. An epoch visits every shard once; within a shard, batch k is rows [k*G, k*G + G) of the shard's
row order, and the rows left over after the last whole batch (fewer than G) are skipped that epoch.
  - shuffle off: shards in the glob's (sorted) order, rows in file order; batches are contiguous text.
  - shuffle on: each epoch visits the shards in a random order drawn from (seed, epoch), and each shard's
    rows are visited in a random order drawn from (seed, epoch, shard). Since the orders are recomputed
    from those numbers, a position is just (epoch, shard position, batch within the shard): the
    DataLoaderState below, which a checkpoint saves as plain bytes and restore() continues from.

Validation, each a one-line fatal() error: no file matches the pattern, a file that is not a shard
(magic), an unsupported version, a file whose size disagrees with its header, a shard smaller than one
global batch, and (checked when a shard is loaded) a token id not below vocab_size, naming the file and
the token's index.

    DataLoader loader;
    loader.init("data/classics_train*.bin", B, T, rank, num_processes, shuffle, seed, vocab_size);
    loader.next_batch();           // fills loader.inputs and loader.targets, B*T ints each
    DataLoaderState saved = loader.state();   ...   loader.restore(saved);
*/
#pragma once

#include <glob.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "../rand.h"
#include "../utils.h"

constexpr int SHARD_MAGIC = 20240520;
constexpr int SHARD_VERSION = 1;
constexpr size_t SHARD_HEADER_BYTES = 256 * sizeof(int32_t);

// The position of the next batch, plus the configuration it is only meaningful for (checked by
// restore()). Fixed-width fields only, so it can be written and read back as raw bytes.
struct DataLoaderState {
    uint64_t epoch;           // completed passes over all shards
    uint64_t shard_position;  // index into this epoch's shard order
    uint64_t batch_in_shard;  // next global batch within that shard
    uint64_t seed;
    int32_t shuffle;
    int32_t num_shards;
    int32_t seq_len;          // T
    int32_t global_rows;      // B * num_processes
};

struct DataLoader {
    // configuration
    int B = 0, T = 0;
    int process_rank = 0, num_processes = 1;
    bool shuffle = false;
    uint64_t seed = 0;
    int vocab_size = 0;
    std::vector<std::string> files;
    std::vector<size_t> shard_tokens;  // token count of each file, from its (validated) header
    size_t total_tokens = 0;

    // position: the next batch is batch `batch_in_shard` of shard shard_order[shard_position]
    uint64_t epoch = 0;
    size_t shard_position = 0;
    size_t batch_in_shard = 0;

    // order of the current epoch, and the loaded shard with its row order
    std::vector<int> shard_order;
    uint64_t order_epoch = UINT64_MAX;  // epoch that shard_order was made for
    int loaded_shard = -1;              // file index of `tokens`
    uint64_t loaded_epoch = UINT64_MAX; // epoch that row_order was made for
    std::vector<uint16_t> tokens;
    std::vector<int> row_order;

    // the batch of this process, filled by next_batch()
    std::vector<int> inputs;   // (B, T)
    std::vector<int> targets;  // (B, T): targets[b][t] = the token after inputs[b][t]

    void init(const std::string& pattern, int batch_rows, int seq_len, int rank, int processes,
              bool shuffled, uint64_t shuffle_seed, int vocabulary_size) {
        if (batch_rows <= 0 || seq_len <= 0) fatal("data loader: B=%d and T=%d must be positive", batch_rows, seq_len);
        if (processes <= 0 || rank < 0 || rank >= processes) {
            fatal("data loader: process rank %d is not in [0, %d)", rank, processes);
        }
        if (vocabulary_size <= 0 || vocabulary_size > 65536) {
            fatal("data loader: vocabulary size %d does not fit uint16 tokens", vocabulary_size);
        }
        B = batch_rows;
        T = seq_len;
        process_rank = rank;
        num_processes = processes;
        shuffle = shuffled;
        seed = shuffle_seed;
        vocab_size = vocabulary_size;

        glob_t matches;
        int found = glob(pattern.c_str(), 0, nullptr, &matches);
        if (found == GLOB_NOMATCH || (found == 0 && matches.gl_pathc == 0)) {
            fatal("no file matches the data pattern %s", pattern.c_str());
        }
        if (found != 0) fatal("cannot search for the data pattern %s", pattern.c_str());
        files.assign(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);  // glob sorts them
        globfree(&matches);

        size_t needed = global_rows() * (size_t)T + 1;
        shard_tokens.clear();
        total_tokens = 0;
        for (const std::string& path : files) {
            size_t count = read_shard_header(path);
            if (count < needed) {
                fatal("%s has %zu tokens; a batch of %d process(es) x %d rows x %d tokens needs at least %zu",
                      path.c_str(), count, num_processes, B, T, needed);
            }
            shard_tokens.push_back(count);
            total_tokens += count;
        }
        inputs.assign((size_t)B * T, 0);
        targets.assign((size_t)B * T, 0);
        loaded_shard = -1;
        order_epoch = loaded_epoch = UINT64_MAX;
        reset();
    }

    size_t global_rows() const { return (size_t)B * num_processes; }
    size_t rows_in_shard(int file) const { return (shard_tokens[file] - 1) / T; }
    size_t batches_in_shard(int file) const { return rows_in_shard(file) / global_rows(); }
    size_t batches_per_epoch() const {
        size_t total = 0;
        for (size_t i = 0; i < files.size(); i++) total += batches_in_shard((int)i);
        return total;
    }

    // Back to the first batch of epoch 0.
    void reset() {
        epoch = 0;
        shard_position = 0;
        batch_in_shard = 0;
    }

    DataLoaderState state() const {
        DataLoaderState saved;
        saved.epoch = epoch;
        saved.shard_position = shard_position;
        saved.batch_in_shard = batch_in_shard;
        saved.seed = seed;
        saved.shuffle = shuffle ? 1 : 0;
        saved.num_shards = (int32_t)files.size();
        saved.seq_len = T;
        saved.global_rows = (int32_t)global_rows();
        return saved;
    }

    // Continues from a saved position; the configuration must match the one the state was saved with. B and
    // the number of processes may differ where the rows read so far in the shard are a whole number of this
    // loader's global batches (a relaunch on fewer ranks with the same tokens per step: the position is at a
    // step's end, and a step's rows are a multiple of both).
    void restore(const DataLoaderState& saved) {
        const size_t rows_read = (size_t)saved.batch_in_shard * (size_t)std::max(saved.global_rows, 0);
        if (saved.num_shards != (int32_t)files.size() || saved.seq_len != T ||
            saved.global_rows <= 0 || rows_read % global_rows() != 0 || saved.shuffle != (shuffle ? 1 : 0) ||
            saved.seed != seed) {
            fatal("data loader state was saved for %d shard(s), T=%d, %d rows per global batch (%zu rows read), "
                  "shuffle %d, seed %llu; this loader has %zu, T=%d, %zu (the rows read must be a multiple), "
                  "shuffle %d, seed %llu",
                  saved.num_shards, saved.seq_len, saved.global_rows, rows_read, saved.shuffle,
                  (unsigned long long)saved.seed, files.size(), T, global_rows(), shuffle ? 1 : 0,
                  (unsigned long long)seed);
        }
        if (saved.shard_position >= files.size()) {
            fatal("data loader state has shard position %llu of %zu shards",
                  (unsigned long long)saved.shard_position, files.size());
        }
        epoch = saved.epoch;
        shard_position = saved.shard_position;
        batch_in_shard = rows_read / global_rows();
        prepare_epoch();
        if (batch_in_shard > batches_in_shard(shard_order[shard_position])) {
            fatal("data loader state has batch %llu of a shard with %zu batches",
                  (unsigned long long)batch_in_shard, batches_in_shard(shard_order[shard_position]));
        }
    }

    // Fills inputs and targets with this process's rows of the next global batch, then advances.
    void next_batch() {
        prepare_epoch();
        while (batch_in_shard >= batches_in_shard(shard_order[shard_position])) advance_shard();
        int file = shard_order[shard_position];
        load_shard(file);
        size_t first_row = batch_in_shard * global_rows() + (size_t)process_rank * B;
        for (int b = 0; b < B; b++) {
            size_t start = (size_t)row_order[first_row + b] * T;
            const uint16_t* row = &tokens[start];
            int* in = &inputs[(size_t)b * T];
            int* out = &targets[(size_t)b * T];
            for (int t = 0; t < T; t++) {
                in[t] = row[t];
                out[t] = row[t + 1];
            }
        }
        batch_in_shard++;
        // keep the position pointing at a batch that exists, so state() reads naturally (e.g. epoch 1
        // begins exactly when epoch 0's last batch has been taken)
        if (batch_in_shard == batches_in_shard(file)) advance_shard();
    }

    void free() {
        tokens = std::vector<uint16_t>();
        row_order = std::vector<int>();
        inputs = std::vector<int>();
        targets = std::vector<int>();
        loaded_shard = -1;
    }

  private:
    // Validates a shard's header and size; returns its token count.
    size_t read_shard_header(const std::string& path) {
        FILE* file = open_file(path, "rb");
        int32_t header[256];
        read_exact(header, sizeof(int32_t), 256, file, path, "shard header");
        close_file(file, path);
        if (header[0] != SHARD_MAGIC) {
            fatal("%s is not a token shard (magic %d, expected %d)", path.c_str(), header[0], SHARD_MAGIC);
        }
        if (header[1] != SHARD_VERSION) {
            fatal("%s has shard version %d; only version %d is supported", path.c_str(), header[1], SHARD_VERSION);
        }
        if (header[2] < 0) fatal("%s has a negative token count %d", path.c_str(), header[2]);
        size_t count = (size_t)header[2];
        size_t expected = SHARD_HEADER_BYTES + count * sizeof(uint16_t);
        size_t actual = file_size(path);
        if (actual != expected) {
            fatal("%s is %zu bytes but its header promises %zu tokens (%zu bytes)", path.c_str(), actual, count,
                  expected);
        }
        return count;
    }

    void prepare_epoch() {
        if (order_epoch == epoch) return;
        shard_order.resize(files.size());
        for (size_t i = 0; i < files.size(); i++) shard_order[i] = (int)i;
        if (shuffle) {
            Rng rng = rng_for_stream(seed, {epoch});
            ::shuffle(rng, shard_order.data(), shard_order.size());
        }
        order_epoch = epoch;
    }

    void advance_shard() {
        batch_in_shard = 0;
        shard_position++;
        if (shard_position == files.size()) {
            shard_position = 0;
            epoch++;
            prepare_epoch();
        }
    }

    // Reads a shard's tokens (validating every id) and makes its row order for the current epoch.
    void load_shard(int file) {
        if (loaded_shard != file) {
            const std::string& path = files[file];
            size_t count = read_shard_header(path);  // the file may have changed since init
            if (count != shard_tokens[file]) {
                fatal("%s changed since the data loader started (%zu tokens, was %zu)", path.c_str(), count,
                      shard_tokens[file]);
            }
            FILE* stream = open_file(path, "rb");
            if (fseek(stream, (long)SHARD_HEADER_BYTES, SEEK_SET) != 0) fatal("cannot seek in %s", path.c_str());
            tokens.resize(count);
            read_exact(tokens.data(), sizeof(uint16_t), count, stream, path, "tokens");
            close_file(stream, path);
            for (size_t i = 0; i < count; i++) {
                if (tokens[i] >= vocab_size) {
                    fatal("%s: token %d at index %zu is not below the vocabulary size %d", path.c_str(),
                          (int)tokens[i], i, vocab_size);
                }
            }
            loaded_shard = file;
            loaded_epoch = UINT64_MAX;
        }
        if (loaded_epoch != epoch) {
            row_order.resize(rows_in_shard(file));
            for (size_t i = 0; i < row_order.size(); i++) row_order[i] = (int)i;
            if (shuffle) {
                Rng rng = rng_for_stream(seed, {epoch, (uint64_t)file});
                ::shuffle(rng, row_order.data(), row_order.size());
            }
            loaded_epoch = epoch;
        }
    }
};
