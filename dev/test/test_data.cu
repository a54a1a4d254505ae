/*
Tests of the host-side data path: the token-shard data loader (llmc/io/dataloader.h), the tokenizer
(llmc/io/tokenizer.h) and the random number generator (llmc/rand.h). Host code only; one of the host suites
(dev/test/host_suites.cu):
    make build/test_data && build/test_data [path/to/gpt2_tokenizer.bin]
The real GPT-2 tokenizer file (default data/gpt2_tokenizer.bin, made by data/prepare.py) is checked
when it exists; otherwise those checks are counted as skipped. Bad inputs are exercised in forked
children, which must exit non-zero with one line on stderr naming the problem.
*/
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../lab/lab.h"
#include "../../llmc/io/dataloader.h"
#include "../../llmc/rand.h"
#include "../../llmc/io/tokenizer.h"

namespace test_data {  // one suite of dev/test/host_suites.cu

static int skipped = 0;

// ---------------------------------------------------------------------------------------------------
// files

static std::string temp_dir;

static std::string temp_path(const std::string& name) { return temp_dir + "/" + name; }

// Writes a shard; header fields and the payload can be overridden to make bad files.
static void write_shard(const std::string& path, const std::vector<uint16_t>& tokens, int magic = SHARD_MAGIC,
                        int version = SHARD_VERSION, long count_override = -1, long extra_bytes = 0) {
    int32_t header[256] = {};
    header[0] = magic;
    header[1] = version;
    header[2] = count_override >= 0 ? (int32_t)count_override : (int32_t)tokens.size();
    FILE* file = open_file(path, "wb");
    write_exact(header, sizeof(header), 1, file, path);
    if (!tokens.empty()) write_exact(tokens.data(), sizeof(uint16_t), tokens.size(), file, path);
    for (long i = 0; i < extra_bytes; i++) fputc(0, file);
    close_file(file, path);
}

// Shard `s` of n tokens whose token i is s*1000 + i: every token tells where it came from.
static std::vector<uint16_t> position_tokens(int s, int n) {
    std::vector<uint16_t> tokens(n);
    for (int i = 0; i < n; i++) tokens[i] = (uint16_t)(s * 1000 + i);
    return tokens;
}

static const int kVocab = 8000;

// Three shards of different sizes: with T=4 they hold (N-1)/4 = 25, 33, 18 rows.
static std::string make_position_shards() {
    write_shard(temp_path("pos_000.bin"), position_tokens(0, 101));
    write_shard(temp_path("pos_001.bin"), position_tokens(1, 135));
    write_shard(temp_path("pos_002.bin"), position_tokens(2, 75));
    return temp_path("pos_*.bin");
}

// The batch of a loader as one vector: inputs then targets.
static std::vector<int> take_batch(DataLoader& loader) {
    loader.next_batch();
    std::vector<int> both(loader.inputs);
    both.insert(both.end(), loader.targets.begin(), loader.targets.end());
    return both;
}

// ---------------------------------------------------------------------------------------------------
// data loader

static void test_sequential(const std::string& pattern) {
    printf("data loader: sequential order\n");
    const int B = 2, T = 4;
    DataLoader loader;
    loader.init(pattern, B, T, 0, 1, false, 0, kVocab);
    check_true("three shards found", loader.files.size() == 3);
    check_true("total tokens counted", loader.total_tokens == 101 + 135 + 75);
    // rows per shard 25, 33, 18; batches of 2 rows: 12 + 16 + 9
    check_true("batches per epoch", loader.batches_per_epoch() == 37, std::to_string(loader.batches_per_epoch()));
    bool contiguous = true, shifted = true;
    int shard_sizes[3] = {12, 16, 9};
    for (int epoch = 0; epoch < 2; epoch++) {
        for (int s = 0; s < 3; s++) {
            for (int k = 0; k < shard_sizes[s]; k++) {
                loader.next_batch();
                for (int b = 0; b < B; b++) {
                    for (int t = 0; t < T; t++) {
                        int expected = s * 1000 + (k * B + b) * T + t;
                        contiguous &= loader.inputs[b * T + t] == expected;
                        shifted &= loader.targets[b * T + t] == expected + 1;
                    }
                }
            }
        }
    }
    check_true("sequential batches are consecutive rows of consecutive shards, over two epochs", contiguous);
    check_true("targets are the inputs shifted by one token", shifted);
    check_true("after two epochs the position is epoch 2", loader.state().epoch == 2);
    loader.reset();
    loader.next_batch();
    check_true("reset starts again at the first token", loader.inputs[0] == 0 && loader.inputs[1] == 1);
    loader.free();
}

static void test_shuffled(const std::string& pattern) {
    printf("data loader: shuffled order\n");
    const int B = 3, T = 4;
    DataLoader loader;
    loader.init(pattern, B, T, 0, 1, true, 1234, kVocab);
    size_t batches = loader.batches_per_epoch();  // 8 + 11 + 6
    check_true("batches per epoch with 3 rows per batch", batches == 25, std::to_string(batches));
    std::vector<std::vector<int>> epochs[2];
    for (int epoch = 0; epoch < 2; epoch++) {
        std::map<int, int> rows_seen;  // first token of a row -> count
        bool rows_whole = true, in_range = true;
        std::vector<int> first_tokens;
        for (size_t k = 0; k < batches; k++) {
            loader.next_batch();
            std::vector<int> batch(loader.inputs);
            for (int b = 0; b < B; b++) {
                int first = loader.inputs[b * T];
                rows_seen[first]++;
                first_tokens.push_back(first);
                in_range &= first % T == 0;  // rows start at multiples of T within a shard
                for (int t = 0; t < T; t++) {
                    rows_whole &= loader.inputs[b * T + t] == first + t && loader.targets[b * T + t] == first + t + 1;
                }
            }
            epochs[epoch].push_back(batch);
        }
        check_true("shuffled rows are whole rows of T+1 consecutive tokens", rows_whole);
        check_true("shuffled rows start at row boundaries", in_range);
        bool each_once = true;
        for (auto& seen : rows_seen) each_once &= seen.second == 1;
        // every row of a shard except the leftover (rows % 3 = 1, 0, 0) appears exactly once
        check_true("no row repeats within an epoch", each_once);
        check_true("every row but the leftovers is visited", rows_seen.size() == 75, std::to_string(rows_seen.size()));
        bool sorted = std::is_sorted(first_tokens.begin(), first_tokens.end());
        check_true("the shuffled order is not the file order", !sorted);
    }
    check_true("the next epoch has a different order", epochs[0] != epochs[1]);

    DataLoader same, other;
    same.init(pattern, B, T, 0, 1, true, 1234, kVocab);
    other.init(pattern, B, T, 0, 1, true, 99, kVocab);
    bool all_same = true, all_other = true;
    for (size_t k = 0; k < batches; k++) {
        same.next_batch();
        other.next_batch();
        all_same &= same.inputs == epochs[0][k];
        all_other &= other.inputs == epochs[0][k];
    }
    check_true("the same seed gives the same order", all_same);
    check_true("another seed gives another order", !all_other);
}

// N ranks with B rows each together see the rows one process with N*B rows sees, in the same order.
static void test_rank_slicing(const std::string& pattern, bool shuffle) {
    printf("data loader: rank slicing (shuffle %s)\n", shuffle ? "on" : "off");
    const int B = 2, T = 4, N = 3;
    DataLoader single;
    single.init(pattern, B * N, T, 0, 1, shuffle, 7, kVocab);
    std::vector<DataLoader> ranks(N);
    for (int r = 0; r < N; r++) ranks[r].init(pattern, B, T, r, N, shuffle, 7, kVocab);
    bool same = true;
    size_t steps = 2 * single.batches_per_epoch() + 3;  // crosses two epoch boundaries
    for (size_t k = 0; k < steps; k++) {
        single.next_batch();
        std::vector<int> inputs, targets;
        for (int r = 0; r < N; r++) {
            ranks[r].next_batch();
            inputs.insert(inputs.end(), ranks[r].inputs.begin(), ranks[r].inputs.end());
            targets.insert(targets.end(), ranks[r].targets.begin(), ranks[r].targets.end());
        }
        same &= inputs == single.inputs && targets == single.targets;
    }
    check_true(std::string("concatenated ranks equal one process with N*B rows") + (shuffle ? " (shuffled)" : ""), same);
    bool ranks_differ = ranks[0].inputs != ranks[1].inputs && ranks[1].inputs != ranks[2].inputs;
    check_true("ranks get different rows", ranks_differ);
}

static void test_state(const std::string& pattern) {
    printf("data loader: save and restore\n");
    const int B = 2, T = 4;
    for (bool shuffle : {false, true}) {
        DataLoader original;
        original.init(pattern, B, T, 0, 1, shuffle, 42, kVocab);
        size_t per_epoch = original.batches_per_epoch();
        // save points: start, mid-shard, end of a shard, end of an epoch, inside the next epoch
        std::vector<size_t> save_points = {0, 5, 12, per_epoch, per_epoch + 14};
        for (size_t point : save_points) {
            original.reset();
            for (size_t k = 0; k < point; k++) original.next_batch();
            DataLoaderState saved = original.state();
            std::vector<std::vector<int>> expected;
            for (int k = 0; k < 30; k++) expected.push_back(take_batch(original));

            DataLoader restored;
            restored.init(pattern, B, T, 0, 1, shuffle, 42, kVocab);
            restored.next_batch();  // a loader somewhere else first: restore must not depend on it
            restored.restore(saved);
            bool same = true;
            for (int k = 0; k < 30; k++) same &= take_batch(restored) == expected[k];
            check_true("restore after " + std::to_string(point) + " batches continues identically" +
                      (shuffle ? " (shuffled)" : ""),
                  same);
        }
    }
    // a state saved by one process with 4 rows restores into 2 ranks with 2 rows each
    DataLoader single;
    single.init(pattern, 4, T, 0, 1, true, 5, kVocab);
    for (int k = 0; k < 7; k++) single.next_batch();
    DataLoaderState saved = single.state();
    single.next_batch();
    DataLoader rank0, rank1;
    rank0.init(pattern, 2, T, 0, 2, true, 5, kVocab);
    rank1.init(pattern, 2, T, 1, 2, true, 5, kVocab);
    rank0.restore(saved);
    rank1.restore(saved);
    rank0.next_batch();
    rank1.next_batch();
    std::vector<int> joined(rank0.inputs);
    joined.insert(joined.end(), rank1.inputs.begin(), rank1.inputs.end());
    check_true("a state restores into more ranks with the same global batch", joined == single.inputs);
    // ... and into another global batch where the rows read so far in the shard are a multiple of it (a relaunch
    // on other ranks with the same tokens per step): 2 ranks of 1 row read the next 2 rows `single` read
    DataLoader narrow0, narrow1;
    narrow0.init(pattern, 1, T, 0, 2, true, 5, kVocab);
    narrow1.init(pattern, 1, T, 1, 2, true, 5, kVocab);
    narrow0.restore(saved);
    narrow1.restore(saved);
    narrow0.next_batch();
    narrow1.next_batch();
    std::vector<int> narrow(narrow0.inputs);
    narrow.insert(narrow.end(), narrow1.inputs.begin(), narrow1.inputs.end());
    check_true("a state restores into another global batch that divides the rows read",
               narrow == std::vector<int>(single.inputs.begin(), single.inputs.begin() + 2 * T));
    static_assert(std::is_trivially_copyable<DataLoaderState>::value, "state must be plain bytes");
}

static void test_bad_shards(const std::string& pattern) {
    printf("data loader: bad inputs\n");
    const int T = 4;
    write_shard(temp_path("bad_magic.bin"), position_tokens(0, 100), 12345);
    write_shard(temp_path("bad_version.bin"), position_tokens(0, 100), SHARD_MAGIC, 7);
    write_shard(temp_path("short_body.bin"), position_tokens(0, 100), SHARD_MAGIC, SHARD_VERSION, 120);
    write_shard(temp_path("long_body.bin"), position_tokens(0, 100), SHARD_MAGIC, SHARD_VERSION, -1, 3);
    write_shard(temp_path("small.bin"), position_tokens(0, 8));  // needs 2*4+1 = 9 for B=2, T=4
    write_shard(temp_path("exact.bin"), position_tokens(0, 9));
    std::vector<uint16_t> with_bad_token = position_tokens(0, 100);
    with_bad_token[57] = kVocab;  // the first id that is out of range
    write_shard(temp_path("bad_token.bin"), with_bad_token);
    {
        FILE* file = open_file(temp_path("header_only_part.bin"), "wb");
        fputs("short", file);
        close_file(file, temp_path("header_only_part.bin"));
    }
    auto loads = [T](const std::string& file, int B, int rank, int processes) {
        return [=]() {
            DataLoader loader;
            loader.init(temp_path(file), B, T, rank, processes, false, 0, kVocab);
            loader.next_batch();
        };
    };
    expect_failure("no file matches the pattern",
                   [] { DataLoader l; l.init(temp_path("nothing_*.bin"), 2, 4, 0, 1, false, 0, kVocab); },
                   "no file matches");
    expect_failure("wrong magic", loads("bad_magic.bin", 2, 0, 1), "bad_magic.bin is not a token shard");
    expect_failure("wrong version", loads("bad_version.bin", 2, 0, 1), "bad_version.bin has shard version 7");
    expect_failure("header promises more tokens than the file holds", loads("short_body.bin", 2, 0, 1),
                   "short_body.bin is 1224 bytes but its header promises 120 tokens");
    expect_failure("file longer than its header says", loads("long_body.bin", 2, 0, 1),
                   "long_body.bin is 1227 bytes");
    expect_failure("file shorter than a header", loads("header_only_part.bin", 2, 0, 1),
                   "header_only_part.bin is truncated");
    expect_failure("shard smaller than one batch", loads("small.bin", 2, 0, 1),
                   "small.bin has 8 tokens; a batch of 1 process(es) x 2 rows x 4 tokens needs at least 9");
    expect_failure("shard smaller than one global batch of several ranks", loads("exact.bin", 2, 1, 2),
                   "exact.bin has 9 tokens; a batch of 2 process(es) x 2 rows x 4 tokens needs at least 17");
    auto [status, message] = run_in_child(loads("exact.bin", 2, 0, 1));
    check_true("a shard of exactly B*T+1 tokens is enough", status == 0, message);
    expect_failure("token id not below the vocabulary size", loads("bad_token.bin", 2, 0, 1),
                   "bad_token.bin: token 8000 at index 57 is not below the vocabulary size 8000");
    expect_failure("rank outside the process count", loads("exact.bin", 1, 2, 2), "process rank 2");
    expect_failure("non-positive B", loads("exact.bin", 0, 0, 1), "must be positive");
    expect_failure("state from another configuration", [=] {
        DataLoader a, b;
        a.init(pattern, 2, 4, 0, 1, true, 1, kVocab);
        b.init(pattern, 3, 4, 0, 1, true, 1, kVocab);
        a.next_batch();  // 2 rows read: not a whole number of b's batches of 3
        b.restore(a.state());
    }, "T=4, 2 rows per global batch (2 rows read)");
}

// ---------------------------------------------------------------------------------------------------
// tokenizer

static void write_tokenizer(const std::string& path, const std::vector<std::string>& tokens, int magic,
                            int version, int vocab_override = -1, int end_of_text = 0, int extra_bytes = 0) {
    int32_t header[256] = {};
    header[0] = magic;
    header[1] = version;
    header[2] = vocab_override >= 0 ? vocab_override : (int32_t)tokens.size();
    header[3] = end_of_text;
    FILE* file = open_file(path, "wb");
    write_exact(header, sizeof(header), 1, file, path);
    for (const std::string& token : tokens) {
        uint8_t length = (uint8_t)token.size();
        write_exact(&length, 1, 1, file, path);
        if (length) write_exact(token.data(), 1, length, file, path);
    }
    for (int i = 0; i < extra_bytes; i++) fputc('x', file);
    close_file(file, path);
}

static void test_tokenizer_small() {
    printf("tokenizer: format and display\n");
    std::vector<std::string> tokens = {"a", " bc", "\xF0\x9F", "\x98\x80", "\n", "\x01", "\xFF", "<|end|>"};
    std::string good = temp_path("tokenizer_good.bin");
    write_tokenizer(good, tokens, TOKENIZER_MAGIC, TOKENIZER_VERSION, -1, 7);
    Tokenizer tokenizer;
    tokenizer_init(&tokenizer, good);
    check_true("vocabulary size read", tokenizer.vocab_size == 8);
    check_true("end-of-text id read", tokenizer.end_of_text == 7);
    check_true("token bytes read", tokenizer_decode(&tokenizer, 1) == " bc" && tokenizer_decode(&tokenizer, 3) == "\x98\x80");
    int emoji[] = {0, 2, 3, 1};
    check_true("a character split over two tokens prints whole", tokenizer_printable(&tokenizer, emoji, 4) ==
                                                                 "a\xF0\x9F\x98\x80 bc");
    TextAssembler assembler;
    std::string first = assembler.push("\xF0\x9F");
    check_true("the first half of a character is held back", first.empty() && assembler.pending.size() == 2);
    check_true("the second half completes it", assembler.push("\x98\x80") == "\xF0\x9F\x98\x80");
    int odd[] = {5, 4, 6, 0};
    check_true("control and invalid bytes are escaped, newline kept",
          tokenizer_printable(&tokenizer, odd, 4) == "\\x01\n\\xffa", tokenizer_printable(&tokenizer, odd, 4));
    int unfinished[] = {0, 2};
    check_true("an unfinished character at the end is escaped", tokenizer_printable(&tokenizer, unfinished, 2) ==
                                                               "a\\xf0\\x9f");
    int interrupted[] = {2, 0};
    check_true("a character interrupted by ASCII is escaped",
          tokenizer_printable(&tokenizer, interrupted, 2) == "\\xf0\\x9fa");
    const unsigned char surrogate[] = {0xED, 0xA0, 0x80};
    const unsigned char overlong[] = {0xC0, 0xAF};
    check_true("UTF-8 surrogates and overlong forms are invalid",
          utf8_sequence_length(surrogate, 3) == -1 && utf8_sequence_length(overlong, 2) == -1);

    expect_failure("decode of an id outside the vocabulary", [&] { tokenizer_decode(&tokenizer, 8); },
                   "token id 8 is outside the tokenizer's vocabulary of 8");
    tokenizer_free(&tokenizer);

    auto loads = [](const std::string& path) {
        return [=]() {
            Tokenizer t;
            tokenizer_init(&t, path);
        };
    };
    std::string path;
    path = temp_path("tok_magic.bin");
    write_tokenizer(path, tokens, 1, TOKENIZER_VERSION);
    expect_failure("tokenizer with wrong magic", loads(path), "tok_magic.bin is not a tokenizer file");
    path = temp_path("tok_version.bin");
    write_tokenizer(path, tokens, TOKENIZER_MAGIC, 1);
    expect_failure("tokenizer with wrong version", loads(path), "tok_version.bin has tokenizer version 1");
    path = temp_path("tok_eot.bin");
    write_tokenizer(path, tokens, TOKENIZER_MAGIC, TOKENIZER_VERSION, -1, 8);
    expect_failure("end-of-text id outside the vocabulary", loads(path), "end-of-text id 8");
    path = temp_path("tok_vocab.bin");
    write_tokenizer(path, tokens, TOKENIZER_MAGIC, TOKENIZER_VERSION, 0);
    expect_failure("zero vocabulary size", loads(path), "invalid vocabulary size 0");
    path = temp_path("tok_short.bin");
    write_tokenizer(path, tokens, TOKENIZER_MAGIC, TOKENIZER_VERSION, 9);
    expect_failure("fewer tokens than the header says", loads(path), "tok_short.bin is truncated");
    path = temp_path("tok_long.bin");
    write_tokenizer(path, tokens, TOKENIZER_MAGIC, TOKENIZER_VERSION, -1, 0, 5);
    expect_failure("bytes after the last token", loads(path), "tok_long.bin has 5 bytes after its 8 tokens");
    path = temp_path("tok_empty_token.bin");
    std::vector<std::string> with_empty = tokens;
    with_empty[3] = "";
    write_tokenizer(path, with_empty, TOKENIZER_MAGIC, TOKENIZER_VERSION);
    expect_failure("a token of length 0", loads(path), "token 3 has length 0");
    expect_failure("missing tokenizer file", loads(temp_path("absent.bin")), "cannot open");
}

static void test_tokenizer_gpt2(const std::string& path) {
    if (!file_exists(path)) {
        printf("tokenizer: %s not found (run data/prepare.py); GPT-2 checks skipped\n", path.c_str());
        skipped += 6;
        return;
    }
    printf("tokenizer: GPT-2 vocabulary from %s\n", path.c_str());
    Tokenizer tokenizer;
    tokenizer_init(&tokenizer, path);
    check_true("GPT-2 vocabulary has 50257 tokens", tokenizer.vocab_size == 50257);
    check_true("GPT-2 end-of-text is 50256", tokenizer.end_of_text == 50256);
    check_true("15496 995 is 'Hello world'",
          tokenizer_decode(&tokenizer, 15496) + tokenizer_decode(&tokenizer, 995) == "Hello world");
    check_true("262 is ' the', 0 is '!', 628 is two newlines", tokenizer_decode(&tokenizer, 262) == " the" &&
                                                            tokenizer_decode(&tokenizer, 0) == "!" &&
                                                            tokenizer_decode(&tokenizer, 628) == "\n\n");
    check_true("50256 is <|endoftext|>", tokenizer_decode(&tokenizer, 50256) == "<|endoftext|>");
    int emoji[] = {350, 1491, 1636, 47249, 222};  // " Pemberley" then an emoji split over two tokens
    check_true("GPT-2 tokens print ' Pemberley' and a whole emoji",
          tokenizer_printable(&tokenizer, emoji, 5) == " Pemberley\xF0\x9F\x98\x80");
    tokenizer_free(&tokenizer);
}

// ---------------------------------------------------------------------------------------------------
// random numbers

static void test_rand() {
    printf("random numbers\n");
    Rng a = rng_from_seed(17), b = rng_from_seed(17), c = rng_from_seed(18);
    bool same = true, differs = false;
    for (int i = 0; i < 100; i++) {
        uint32_t x = a.next_u32();
        same &= x == b.next_u32();
        differs |= x != c.next_u32();
    }
    check_true("the same seed gives the same numbers", same);
    check_true("another seed gives other numbers", differs);
    Rng saved = a;
    uint64_t next = a.next_u64();
    check_true("a copied state continues identically", saved.next_u64() == next);
    Rng zero = rng_from_seed(0);
    check_true("seed 0 works", zero.next_u64() != 0 || zero.next_u64() != 0);

    Rng rng = rng_from_seed(1);
    bool in_unit = true;
    double sum = 0;
    const int n = 200000;
    for (int i = 0; i < n; i++) {
        float f = rng.next_float();
        in_unit &= f >= 0.0f && f < 1.0f;
        sum += f;
    }
    check_true("next_float is in [0, 1)", in_unit);
    check_true("next_float has mean 1/2", std::abs(sum / n - 0.5) < 0.005, std::to_string(sum / n));
    int counts[7] = {};
    bool below = true;
    for (int i = 0; i < 70000; i++) {
        uint32_t k = rng.next_below(7);
        below &= k < 7;
        if (k < 7) counts[k]++;
    }
    bool even = true;
    for (int k = 0; k < 7; k++) even &= std::abs(counts[k] - 10000) < 500;  // ~5 standard deviations
    check_true("next_below(7) stays below 7 and is even", below && even);
    double mean = 0, square = 0;
    for (int i = 0; i < n; i++) {
        double z = rng.next_normal();
        mean += z;
        square += z * z;
    }
    mean /= n;
    square /= n;
    check_true("next_normal has mean 0 and variance 1", std::abs(mean) < 0.01 && std::abs(square - 1) < 0.02,
          std::to_string(mean) + " " + std::to_string(square));

    std::vector<int> order(1000);
    random_permutation(rng, order.data(), order.size());
    std::vector<int> sorted(order);
    std::sort(sorted.begin(), sorted.end());
    bool permutation = true;
    for (int i = 0; i < 1000; i++) permutation &= sorted[i] == i;
    check_true("random_permutation is a permutation", permutation);
    check_true("random_permutation is not the identity", order != sorted);
    // each of the 6 orders of 3 items equally likely
    std::map<std::vector<int>, int> orders;
    for (int i = 0; i < 60000; i++) {
        int items[3] = {0, 1, 2};
        shuffle(rng, items, 3);
        orders[std::vector<int>(items, items + 3)]++;
    }
    bool uniform = orders.size() == 6;
    for (auto& o : orders) uniform &= std::abs(o.second - 10000) < 500;
    check_true("shuffle makes all orders of 3 items equally likely", uniform);
    Rng s1 = rng_for_stream(3, {0, 1}), s2 = rng_for_stream(3, {1, 0}), s3 = rng_for_stream(3, {0, 1});
    check_true("streams differ by their numbers and repeat for the same ones",
          s1.next_u64() != s2.next_u64() && s3.next_u64() == rng_for_stream(3, {0, 1}).next_u64());
}

int run(int argc, char** argv) {
    lab.quiet = true;  // print failed checks only
    char pattern[] = "/tmp/test_data_XXXXXX";
    if (!mkdtemp(pattern)) fatal("cannot make a temporary folder");
    temp_dir = pattern;
    std::string shards = make_position_shards();

    test_sequential(shards);
    test_shuffled(shards);
    test_rank_slicing(shards, false);
    test_rank_slicing(shards, true);
    test_state(shards);
    test_bad_shards(shards);
    test_tokenizer_small();
    test_tokenizer_gpt2(argc > 1 ? argv[1] : "data/gpt2_tokenizer.bin");
    test_rand();

    std::string remove = "rm -rf '" + temp_dir + "'";
    if (system(remove.c_str()) != 0) printf("could not remove %s\n", temp_dir.c_str());
    printf("%d passed, %d failed, %d skipped\n", lab.passed, lab.failed, skipped);
    return lab.failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
}  // namespace test_data
