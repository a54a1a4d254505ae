/*
Tests of the training program's host-side headers: checkpoints, batch ramps, learning-rate schedules, the
logger, the MFU arithmetic and the CPU runtime's host calls (the flags are dev/test/test_flags.cu's). Expected values are worked out by hand in the comments, not taken from
the code under test. Every error path is run in a forked child whose exit status and message are
checked: it must fail, in one line, naming the problem.
Prints `N passed, M failed` and exits non-zero on any failure.
*/
#include <functional>
#include <map>
#include <string>
#include <vector>
#include "../lab/lab.h"
#include "../../llmc/io/checkpoint.h"
#include "../../llmc/schedulers.h"
#include "../../llmc/batch_ramp.h"
#include "../../llmc/rand.h"
#include "../../llmc/io/logger.h"
#include "../../llmc/planning/mfu.h"
#include "../../llmc/kernels/matmul.cuh"
#include "flag_table.h"

namespace test_host {  // one suite of dev/test/host_suites.cu

// ----------------------------------------------------------------------------
// checkpoints

std::string test_dir;  // a fresh directory under /tmp for this run

std::vector<char> read_bytes(const std::string& path) {
    std::vector<char> bytes(file_size(path));
    FILE* f = open_file(path, "rb");
    if (!bytes.empty()) read_exact(bytes.data(), 1, bytes.size(), f, path, "bytes");
    close_file(f, path);
    return bytes;
}
void write_bytes(const std::string& path, const std::vector<char>& bytes) {
    FILE* f = open_file(path, "wb");
    if (!bytes.empty()) write_exact(bytes.data(), 1, bytes.size(), f, path);
    close_file(f, path);
}

// A checkpoint with three sections: 1000 floats starting at `first`, an int, and an empty section.
void write_test_checkpoint(const std::string& path, float first) {
    std::vector<float> params(1000);
    for (int i = 0; i < 1000; i++) params[i] = first + i;
    CheckpointWriter writer(path);
    writer.add("params", params.data(), params.size() * sizeof(float));
    writer.add_value("step", (int)first);
    writer.add("empty", nullptr, 0);
    writer.commit();
}
// Reads it back and returns the first float (fatal on any problem).
float read_test_checkpoint(const std::string& path) {
    CheckpointReader reader(path);
    std::vector<float> params(1000);
    reader.read("params", params.data(), params.size() * sizeof(float));
    for (int i = 0; i < 1000; i++)
        if (params[i] != params[0] + i) fatal("params differ at %d", i);
    if (reader.read_value<int>("step") != (int)params[0]) fatal("step differs");
    reader.read("empty", nullptr, 0);
    return params[0];
}

void test_checkpoints() {
    printf("checkpoints\n");
    std::string path = test_dir + "/model.bin";
    write_test_checkpoint(path, 42.0f);
    {
        CheckpointReader reader(path);
        std::vector<std::string> names = reader.section_names();
        check_true("sections listed in the order written",
                   names == std::vector<std::string>{"params", "step", "empty"} && reader.has("step") &&
                       !reader.has("nope") && reader.bytes("params") == 4000);
        reader.verify_all();
    }
    check_true("write + read roundtrip", read_test_checkpoint(path) == 42.0f);
    check_true("no temporary file left after commit", !file_exists(path + ".tmp"));
    // 32 header + 4000 + 4 + 0 data + 3 * 72 table
    check_true("file size is header + data + table", file_size(path) == 32 + 4004 + 3 * 72,
               std::to_string(file_size(path)));

    std::vector<char> good = read_bytes(path);
    std::string bad = test_dir + "/bad.bin";
    auto damaged = [&](const std::function<void(std::vector<char>&)>& damage) {
        std::vector<char> bytes = good;
        damage(bytes);
        write_bytes(bad, bytes);
    };
    damaged([](std::vector<char>& b) { b.pop_back(); });
    expect_failure("truncated by one byte", [&] { CheckpointReader r(bad); }, "checkpoint " + bad + " is truncated");
    damaged([](std::vector<char>& b) { b.resize(2000); });
    expect_failure("truncated inside the data", [&] { CheckpointReader r(bad); }, "is truncated or damaged");
    damaged([](std::vector<char>& b) { b.resize(10); });
    expect_failure("truncated inside the header", [&] { CheckpointReader r(bad); }, "smaller than its header");
    damaged([](std::vector<char>& b) { b.push_back(0); });
    expect_failure("trailing garbage", [&] { CheckpointReader r(bad); }, "is truncated or damaged");
    damaged([](std::vector<char>& b) { b[32 + 1234] ^= 0x10; });
    expect_failure("flipped byte in a section is caught when it is read",
                   [&] { CheckpointReader r(bad); std::vector<float> p(1000); r.read("params", p.data(), 4000); },
                   "checkpoint " + bad + " is corrupted: section 'params' fails its checksum");
    expect_failure("flipped byte is caught by verify_all", [&] { CheckpointReader r(bad); r.verify_all(); },
                   "section 'params' fails its checksum");
    damaged([](std::vector<char>& b) { b[b.size() - 72 + 3] ^= 0x01; });  // a name in the table
    expect_failure("flipped byte in the section table", [&] { CheckpointReader r(bad); },
                   "section table fails its checksum");
    damaged([](std::vector<char>& b) { b[0] = 'X'; });
    expect_failure("wrong magic", [&] { CheckpointReader r(bad); }, bad + " is not a checkpoint (bad magic number)");
    damaged([](std::vector<char>& b) { b[8] = 7; });
    expect_failure("wrong version", [&] { CheckpointReader r(bad); }, "has version 7; this program reads version 1");
    expect_failure("missing file", [&] { CheckpointReader r(test_dir + "/none.bin"); }, "none.bin does not exist");
    expect_failure("missing section", [&] { CheckpointReader r(path); int x; r.read("adamw_m", &x, 4); },
                   "checkpoint " + path + " has no section 'adamw_m'");
    expect_failure("size mismatch",
                   [&] { CheckpointReader r(path); std::vector<float> p(999); r.read("params", p.data(), 3996); },
                   "section 'params' holds 4000 bytes, expected 3996");
    expect_failure("section added twice", [&] { CheckpointWriter w(bad); w.add_value("a", 1); w.add_value("a", 2); },
                   "section 'a' added twice");
    expect_failure("section name too long", [&] { CheckpointWriter w(bad); w.add_value(std::string(48, 'n'), 1); },
                   "must have 1 to 47 characters");

    // A run killed while writing: the child writes part of a new checkpoint over the same path and dies
    // before commit. The previous checkpoint must still be there, complete and readable.
    auto [status, output] = run_in_child([&] {
        std::vector<float> other(1000, 7.0f);
        CheckpointWriter writer(path);
        writer.add("params", other.data(), 4000);
        fflush(nullptr);
        _exit(9);  // no destructors, no commit: as if killed
    });
    check_true("killed writer left its .tmp behind", status == 9 && file_exists(path + ".tmp"));
    check_true("killed writer: the previous checkpoint is intact", read_test_checkpoint(path) == 42.0f);
    expect_failure("the .tmp of a killed writer is not a valid checkpoint", [&] { CheckpointReader r(path + ".tmp"); },
                   "is not a checkpoint");
    write_test_checkpoint(path, 43.0f);
    check_true("the next writer replaces the .tmp and commits", read_test_checkpoint(path) == 43.0f &&
                                                                 !file_exists(path + ".tmp"));

    // checkpoint_<step>.bin in a directory: names, the newest complete one, and keep the newest K
    long long step = 0, file = 0;
    check_true("names: main and shard files parse, other spellings do not",
               parse_checkpoint_name("checkpoint_12.bin", &step, &file) && step == 12 && file == 0 &&
                   parse_checkpoint_name("checkpoint_12.shard3.bin", &step, &file) && step == 12 && file == 3 &&
                   !parse_checkpoint_name("checkpoint_012.bin", &step, &file) &&
                   !parse_checkpoint_name("checkpoint_12.shard0.bin", &step, &file) &&
                   !parse_checkpoint_name("checkpoint_12.shard.bin", &step, &file) &&
                   !parse_checkpoint_name("checkpoint_12.bin.tmp", &step, &file));
    {
        // P 2 x T 3 x X 2 x S 2 files: p varies slowest, then t, x, and the shard k fastest
        const ShardFileGrid grid{2, 3, 2, 2};
        bool round_trip = grid.files() == 24;
        for (int file = 0; file < grid.files(); file++) {
            const ShardOwner o = shard_file_owner(grid, file);
            round_trip = round_trip && shard_file(grid, o) == file && o.pp_rank < 2 && o.tp_rank < 3 && o.ep_rank < 2 &&
                         o.shard < 2;
        }
        const ShardOwner last = shard_file_owner(grid, 23), some = shard_file_owner(grid, 13);
        check_true("shard files: 24 of a 2 x 3 x 2 x 2 grid; shard_file_owner inverts shard_file; file 13 is "
                   "p 1, t 0, x 0, k 1 (((1 3 + 0) 2 + 0) 2 + 1)",
                   round_trip && last.pp_rank == 1 && last.tp_rank == 2 && last.ep_rank == 1 && last.shard == 1 &&
                       some.pp_rank == 1 && some.tp_rank == 0 && some.ep_rank == 0 && some.shard == 1);
    }
    check_true("checkpoint_path and shard_path spell the names",
               checkpoint_path("d", 12) == "d/checkpoint_12.bin" &&
                   shard_path(checkpoint_path("d", 12), 2) == "d/checkpoint_12.shard2.bin");
    std::string dir = test_dir + "/run";
    check_true("no directory: no checkpoint", latest_checkpoint_step(dir) == -1);
    make_directories(dir);
    check_true("empty directory: no checkpoint", latest_checkpoint_step(dir) == -1);
    // a checkpoint of `shards` files as the trainer writes one: shard files first, then the main file
    // listing them; `id` is the same in every file
    auto write_sharded = [&](long long at, int shards, uint64_t id) {
        std::vector<ShardFileEntry> listed;
        for (int f = 1; f < shards; f++) {
            const std::string path = shard_path(checkpoint_path(dir, at), f);
            CheckpointWriter writer(path);
            add_checkpoint_identity(writer, id, at);
            writer.add_value("data", (float)(at * 10 + f));
            writer.commit();
            listed.push_back({(uint64_t)f, id, CheckpointReader(path).table_checksum()});
        }
        CheckpointWriter writer(checkpoint_path(dir, at));
        add_checkpoint_identity(writer, id, at);
        writer.add("shard_files", listed.data(), listed.size() * sizeof(ShardFileEntry));
        writer.commit();
    };
    for (long long at : {0, 5, 100, 10, 20}) write_sharded(at, 3, 1000 + at);
    for (const char* decoy : {"checkpoint_007.bin", "checkpoint_300.bin.tmp", "checkpoint_x.bin", "checkpoint_.bin",
                              "other_400.bin", "checkpoint_500.binx"})
        write_bytes(dir + "/" + decoy, {'x'});
    check_true("main files listed in numeric order, decoys ignored",
               list_checkpoint_steps(dir) == std::vector<long long>{0, 5, 10, 20, 100});
    check_true("latest is the highest complete step", latest_checkpoint_step(dir) == 100);
    remove((shard_path(checkpoint_path(dir, 100), 2)).c_str());
    check_true("a missing shard file: the one before is the latest", latest_checkpoint_step(dir) == 20);
    write_sharded(200, 3, 7);
    remove(checkpoint_path(dir, 200).c_str());
    check_true("shard files without a main file (an interrupted save): skipped", latest_checkpoint_step(dir) == 20);
    write_sharded(30, 3, 30);
    check_true("the newest complete one, whatever order the files were written in", latest_checkpoint_step(dir) == 30);
    // a stale file (another checkpoint's) in the newest: refused, not skipped
    const std::string newest_shard = shard_path(checkpoint_path(dir, 30), 1);
    const std::vector<char> original = read_bytes(newest_shard);
    write_bytes(newest_shard, read_bytes(shard_path(checkpoint_path(dir, 20), 1)));
    expect_failure("a shard of another step is refused", [&] { latest_checkpoint_step(dir); },
                   "checkpoint_30.shard1.bin belongs to another checkpoint (id 00000000000003fc, step 20)");
    {  // same step, same id, other contents: the main file's table checksum tells
        CheckpointWriter writer(newest_shard);
        add_checkpoint_identity(writer, 30, 30);
        writer.add_value("data", 0.5f);
        writer.commit();
    }
    expect_failure("a shard whose contents the main file does not list is refused",
                   [&] { latest_checkpoint_step(dir); }, "checkpoint_30.shard1.bin is not the file");
    write_bytes(newest_shard, original);
    check_true("restored: the newest is back", latest_checkpoint_step(dir) == 30);

    // after the save of step 30 (as if resumed from 20 because 100 and 200 were incomplete), keep 2
    write_sharded(15, 3, 15);
    remove(checkpoint_path(dir, 15).c_str());  // an interrupted save between the kept ones
    remove_old_checkpoints(dir, 2, 30);
    using Files = std::vector<std::pair<long long, long long>>;
    check_true("keep 2: steps 20 and 30 stay, older files and orphans go, later steps are left alone",
               list_checkpoint_files(dir) == Files{{20, 0}, {20, 1}, {20, 2}, {30, 0}, {30, 1}, {30, 2}, {100, 0},
                                                   {100, 1}, {200, 1}, {200, 2}} &&
                   file_exists(dir + "/checkpoint_007.bin") && file_exists(dir + "/checkpoint_300.bin.tmp"));
    remove_old_checkpoints(dir, 5, 30);
    check_true("keeping more than there are removes nothing", list_checkpoint_files(dir).size() == 10);
    remove_old_checkpoints(dir, 1, 30);
    check_true("keep 1: only the newest", list_checkpoint_files(dir) == Files{{30, 0}, {30, 1}, {30, 2}, {100, 0},
                                                                           {100, 1}, {200, 1}, {200, 2}});
}

// ----------------------------------------------------------------------------
// batch ramps (llmc/batch_ramp.h)

void test_batch_ramp() {
    printf("batch ramps\n");
    BatchRamp ramp;
    check_true("parses 0:16384,2000000:32768,8000000:65536",
               batch_ramp_parse("0:16384,2000000:32768,8000000:65536", &ramp).empty() && ramp.phases.size() == 3 &&
                   ramp.phases[1].threshold == 2000000 && ramp.phases[1].tokens == 32768 &&
                   ramp.phases[2].threshold == 8000000 && ramp.phases[2].tokens == 65536);
    auto refused = [](const std::string& text, const std::string& part) {
        BatchRamp r;
        const std::string error = batch_ramp_parse(text, &r);
        check_true("refuses '" + text + "'", contains(error, "--batch-ramp " + text + ": ") &&
                   contains(error, part) && error.find('\n') == std::string::npos, error);
    };
    refused("16:64", "must start at 0");
    refused("0:64,128:128,128:256", "thresholds must increase");
    refused("0:64,256:128,128:256", "thresholds must increase");
    refused("0:0", "between 1 and 2147483647");
    refused("0:4294967296", "between 1 and 2147483647");
    refused("0:64,", "is not TOKENS_SEEN:TOKENS_PER_STEP");
    refused("0-64", "is not TOKENS_SEEN:TOKENS_PER_STEP");
    refused("0:64x", "is not TOKENS_SEEN:TOKENS_PER_STEP");
    refused("0:-64", "is not TOKENS_SEEN:TOKENS_PER_STEP");
    refused("", "is not TOKENS_SEEN:TOKENS_PER_STEP");

    // 0:64,128:128,384:256: steps of 64 until 128 seen (2 steps), of 128 until 384 (2 more), then 256:
    // tokens seen after n steps 0, 64, 128, 256, 384, 640, 896
    batch_ramp_parse("0:64,128:128,384:256", &ramp);
    const std::vector<long long> seen = {0, 64, 128, 256, 384, 640, 896};
    bool all = true;
    for (size_t n = 0; n < seen.size(); n++) all = all && batch_ramp_tokens_after(ramp, (long long)n) == seen[n];
    check_true("tokens seen after n steps, by hand", all);
    check_true("each step's batch: 64, 64, 128, 128, 256",
               batch_ramp_step_tokens(ramp, 0) == 64 && batch_ramp_step_tokens(ramp, 1) == 64 &&
                   batch_ramp_step_tokens(ramp, 2) == 128 && batch_ramp_step_tokens(ramp, 3) == 128 &&
                   batch_ramp_step_tokens(ramp, 4) == 256);
    check_true("the phase at a count of tokens seen: the last threshold reached",
               batch_ramp_phase(ramp, 127).tokens == 64 && batch_ramp_phase(ramp, 128).tokens == 128 &&
                   batch_ramp_phase(ramp, 383).tokens == 128 && batch_ramp_phase(ramp, 1LL << 40).tokens == 256);
    // a threshold that falls inside a step: 0:100,150:1000 -> steps of 100 at 0 and 100 (150 not yet seen
    // before the second), then 1000 from 200 on; a phase skipped by one step: 0:100,50:7,60:1000 -> the second
    // step starts at 100, past both, and runs at 1000
    batch_ramp_parse("0:100,150:1000", &ramp);
    check_true("a step is never cut: the threshold's phase starts with the next step",
               batch_ramp_tokens_after(ramp, 2) == 200 && batch_ramp_tokens_after(ramp, 3) == 1200 &&
                   batch_ramp_step_tokens(ramp, 1) == 100 && batch_ramp_step_tokens(ramp, 2) == 1000);
    batch_ramp_parse("0:100,50:7,60:1000", &ramp);
    check_true("a phase whose threshold and the next one's fall inside one step is skipped",
               batch_ramp_tokens_after(ramp, 1) == 100 && batch_ramp_step_tokens(ramp, 1) == 1000 &&
                   batch_ramp_tokens_after(ramp, 3) == 2100);
    // brute force: tokens seen step by step against the closed form, over ramps of up to 4 random phases
    Rng rng = rng_from_seed(7);
    bool brute = true;
    std::string detail;
    for (int trial = 0; trial < 200 && brute; trial++) {
        BatchRamp r{{BatchPhase{0, 1 + (int)(rng.next_u32() % 50)}}};
        for (int k = 1; k < 4; k++)
            r.phases.push_back(BatchPhase{r.phases.back().threshold + 1 + rng.next_u32() % 300,
                                          1 + (int)(rng.next_u32() % 50)});
        long long t = 0;
        for (long long n = 0; n < 60 && brute; n++) {
            if (batch_ramp_tokens_after(r, n) != t) brute = false, detail = "trial " + std::to_string(trial);
            t += batch_ramp_phase(r, t).tokens;
        }
    }
    check_true("tokens seen: the closed form equals stepping through the phases (200 random ramps)", brute, detail);
}

// ----------------------------------------------------------------------------
// learning-rate schedules

bool near(double got, double expected) { return fabs(got - expected) <= 1e-6 * fabs(expected) + 1e-12; }

void test_schedulers() {
    printf("schedulers\n");
    // cosine, lr 1, warmup 4, 13 steps, final fraction 0.1: warmup (s+1)/4 for s = 0..3, then the decay
    // runs over s = 4..12, progress (s-4)/8: s=4 -> 1, s=6 -> 0.1 + 0.9*(1+cos(pi/4))/2 = 0.868198052,
    // s=8 -> 0.1 + 0.9*0.5 = 0.55, s=12 -> 0.1, and past the end it stays at 0.1
    LearningRateSchedule cosine = make_lr_schedule("cosine", 1.0f, 4, 13, 0.1f);
    std::vector<std::pair<int, double>> expected = {{0, 0.25}, {1, 0.5},  {3, 1.0},   {4, 1.0},
                                                    {6, 0.868198052}, {8, 0.55}, {12, 0.1}, {20, 0.1}};
    bool all = true;
    std::string detail;
    for (auto [step, lr] : expected) {
        if (!near(cosine.at(step), lr)) all = false, detail += " step " + std::to_string(step) + ": " + std::to_string(cosine.at(step));
    }
    check_true("cosine with warmup: hand-computed values", all, detail);
    bool decreasing = true;
    for (int s = 4; s < 12; s++) decreasing = decreasing && cosine.at(s + 1) < cosine.at(s);
    check_true("cosine decreases strictly after the warmup", decreasing);

    // no warmup, 3 steps, lr 6e-4, final 0: 6e-4, 3e-4 (cos(pi/2) = 0), 0
    LearningRateSchedule short_run = make_lr_schedule("cosine", 6e-4f, 0, 3, 0.0f);
    check_true("cosine without warmup starts at lr and ends at lr*final",
               near(short_run.at(0), 6e-4) && near(short_run.at(1), 3e-4) && short_run.at(2) == 0.0f);
    check_true("a single step after the warmup runs at lr", make_lr_schedule("cosine", 2.0f, 0, 1, 0.0f).at(0) == 2.0f &&
                                                                 near(make_lr_schedule("cosine", 2.0f, 1, 2, 0.0f).at(1), 2.0));
    LearningRateSchedule constant = make_lr_schedule("constant", 0.5f, 10, 100, 0.1f);
    check_true("constant with warmup: 0.05 at step 0, 0.25 at step 4, 0.5 from step 9 on",
               near(constant.at(0), 0.05) && near(constant.at(4), 0.25) && constant.at(9) == 0.5f &&
                   constant.at(99) == 0.5f);
    check_true("constant without warmup", make_lr_schedule("constant", 0.5f, 0, 10, 0.0f).at(0) == 0.5f);
    check_true("schedule names are the ones make_lr_schedule accepts",
               lr_schedule_names() == std::vector<std::string>{"cosine", "constant"});
    expect_failure("unknown schedule", [] { make_lr_schedule("linear", 1, 0, 10, 0); }, "unknown learning-rate schedule 'linear'");
    expect_failure("final fraction above 1", [] { make_lr_schedule("cosine", 1, 0, 10, 1.5f); }, "between 0 and 1");
    expect_failure("zero steps", [] { make_lr_schedule("cosine", 1, 0, 0, 0); }, "at least 1 step");
    expect_failure("negative warmup", [] { make_lr_schedule("cosine", 1, -1, 10, 0); }, "warmup steps must be >= 0");

    // the token axis for a fixed batch B is the step formulas bit for bit (llmc/schedulers.h's header): the
    // step formulas as they were before the token axis, against the schedule over fixed batches
    auto step_formula = [](const std::string& kind, float max_lr, int W, int total, float fraction, int s) {
        if (s < W) return (float)((double)max_lr * (s + 1) / W);
        if (kind == "constant") return max_lr;
        const double min_lr = (double)max_lr * fraction;
        const int decay_steps = total - 1 - W;
        double progress = decay_steps > 0 ? (double)(s - W) / decay_steps : 0.0;
        if (progress > 1.0) progress = 1.0;
        return (float)(min_lr + (max_lr - min_lr) * 0.5 * (1.0 + cos(3.14159265358979323846 * progress)));
    };
    int compared = 0;
    std::string first_difference;
    for (const char* kind : {"cosine", "constant"})
        for (float max_lr : {6e-4f, 3e-4f, 1e-3f, 0.1f / 3})
            for (int W : {0, 1, 3, 7, 700})
                for (int total : {1, 2, 10, 97, 19073})
                    for (int B : {1, 3, 64, 524288, 1000003, 16777215}) {
                        LearningRateSchedule schedule = make_lr_schedule(kind, max_lr, W, total, 0.1f);
                        schedule.ramp = batch_ramp_fixed(B);
                        for (int s : {0, 1, 2, W - 1, W, W + 1, total / 2, total - 2, total - 1, total, total + 5}) {
                            if (s < 0) continue;
                            const float token_axis = schedule.at(s), steps = step_formula(kind, max_lr, W, total, 0.1f, s);
                            compared++;
                            if (memcmp(&token_axis, &steps, sizeof(float)) != 0 && first_difference.empty())
                                first_difference = std::string(kind) + " W " + std::to_string(W) + " total " +
                                                   std::to_string(total) + " B " + std::to_string(B) + " step " +
                                                   std::to_string(s);
                        }
                    }
    check_true("a fixed batch: the token axis gives the step formulas bit for bit (" + std::to_string(compared) +
               " rates)", first_difference.empty(), first_difference);
    // a ramp and a fixed batch that see the same tokens decay alike: 0:64,128:128,384:256 over 6 steps sees
    // 0, 64, 128, 256, 384, 640 before its steps; warmup 2 steps = 128 tokens, the decay ends at 640. A fixed
    // batch of 64 over 11 steps (warmup 2) ends its decay at 640 too: where both have seen the same tokens (128,
    // 256, 384, 640: its steps 2, 4, 6, 10) the rates are equal
    LearningRateSchedule ramped = make_lr_schedule("cosine", 1e-3f, 2, 6, 0.0f), fixed = make_lr_schedule("cosine", 1e-3f, 2, 11, 0.0f);
    batch_ramp_parse("0:64,128:128,384:256", &ramped.ramp);
    fixed.ramp = batch_ramp_fixed(64);
    check_true("a ramp's warmup: (t + b) / t_W = 0.5, 1", ramped.at(0) == 5e-4f && ramped.at(1) == 1e-3f);
    check_true("a ramp and a fixed batch at the same tokens seen: the same rate",
               ramped.at(2) == fixed.at(2) && ramped.at(3) == fixed.at(4) && ramped.at(4) == fixed.at(6) &&
                   ramped.at(5) == fixed.at(10) && ramped.at(5) == 0.0f && near(ramped.at(3), 1e-3 * 0.5 * (1 + cos(M_PI / 4))));
}

// ----------------------------------------------------------------------------
// logger: a minimal JSON parser checks that every line is one valid JSON object

struct JsonCursor {
    const std::string& s;
    size_t i = 0;
    void skip_space() { while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) i++; }
    bool literal(const char* word) {
        size_t n = strlen(word);
        if (s.compare(i, n, word) != 0) return false;
        i += n;
        return true;
    }
    bool string(std::string* out) {
        if (i >= s.size() || s[i] != '"') return false;
        for (i++; i < s.size(); i++) {
            char c = s[i];
            if (c == '"') { i++; return true; }
            if ((unsigned char)c < 0x20) return false;
            if (c == '\\') {
                if (++i >= s.size()) return false;
                char e = s[i];
                if (e == 'u') {
                    if (i + 4 >= s.size()) return false;
                    out->push_back((char)strtol(s.substr(i + 1, 4).c_str(), nullptr, 16));
                    i += 4;
                } else if (strchr("\"\\/bfnrt", e)) {
                    out->push_back(e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == 'b' ? '\b' : e == 'f' ? '\f' : e);
                } else return false;
            } else out->push_back(c);
        }
        return false;
    }
    bool number() {
        size_t start = i;
        if (i < s.size() && s[i] == '-') i++;
        if (i >= s.size() || !isdigit((unsigned char)s[i])) return false;
        if (s[i] == '0') i++;
        else while (i < s.size() && isdigit((unsigned char)s[i])) i++;
        if (i < s.size() && s[i] == '.') {
            i++;
            if (i >= s.size() || !isdigit((unsigned char)s[i])) return false;
            while (i < s.size() && isdigit((unsigned char)s[i])) i++;
        }
        if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
            i++;
            if (i < s.size() && (s[i] == '+' || s[i] == '-')) i++;
            if (i >= s.size() || !isdigit((unsigned char)s[i])) return false;
            while (i < s.size() && isdigit((unsigned char)s[i])) i++;
        }
        return i > start;
    }
    // parses one value; for an object, its members' raw text goes into `members` (when given)
    bool value(std::map<std::string, std::string>* members = nullptr) {
        skip_space();
        if (i >= s.size()) return false;
        if (s[i] == '{') {
            i++;
            skip_space();
            if (i < s.size() && s[i] == '}') { i++; return true; }
            while (true) {
                skip_space();
                std::string key;
                if (!string(&key)) return false;
                skip_space();
                if (i >= s.size() || s[i++] != ':') return false;
                skip_space();
                size_t start = i;
                if (!value()) return false;
                if (members) (*members)[key] = s.substr(start, i - start);
                skip_space();
                if (i < s.size() && s[i] == ',') { i++; continue; }
                if (i < s.size() && s[i] == '}') { i++; return true; }
                return false;
            }
        }
        if (s[i] == '[') {
            i++;
            skip_space();
            if (i < s.size() && s[i] == ']') { i++; return true; }
            while (true) {
                if (!value()) return false;
                skip_space();
                if (i < s.size() && s[i] == ',') { i++; continue; }
                if (i < s.size() && s[i] == ']') { i++; return true; }
                return false;
            }
        }
        if (s[i] == '"') { std::string ignored; return string(&ignored); }
        return literal("true") || literal("false") || literal("null") || number();
    }
};

// One line as a map from member name to its raw JSON text; empty (with *valid false) if it is not an object.
std::map<std::string, std::string> parse_json_object(const std::string& line, bool* valid) {
    std::map<std::string, std::string> members;
    JsonCursor cursor{line};
    *valid = !line.empty() && line[0] == '{' && cursor.value(&members) && cursor.i == line.size();
    return members;
}

std::vector<std::string> read_lines(const std::string& path) {
    std::vector<char> bytes = read_bytes(path);
    std::vector<std::string> lines;
    std::string current;
    for (char c : bytes) {
        if (c == '\n') lines.push_back(current), current.clear();
        else current += c;
    }
    if (!current.empty()) lines.push_back(current + "<no newline>");
    return lines;
}

void test_logger() {
    printf("logger\n");
    JsonCursor probe_bad{"{\"a\": 1,}"};
    check_true("the test's JSON parser rejects a trailing comma", !probe_bad.value());

    std::string dir = test_dir + "/out/nested/run";  // none of these exist yet
    TestFlags t;
    t.parse({"--batch-size", "8"});
    StepStats stats;
    stats.step = 3;
    stats.total_steps = 10;
    stats.loss = 5.25f;
    stats.learning_rate = 3e-4f;
    stats.grad_norm = 1.5f;
    stats.seconds = 0.25;
    stats.tokens = 8192;                     // 32768 tokens/s
    stats.memory_bytes = 3 * 1024 * 1024;    // 3 MiB
    stats.mfu = 0.41;
    {
        // in a child, to see its console output; the file it writes stays behind for the checks below
        auto [status, console] = run_in_child([&] {
            Logger logger(dir);
            logger.config(t.flags);
            logger.step(stats);
            logger.val_loss(3, 4.5f);
        });
        // ETA: 7 steps left x 250 ms (the only step so far is the mean) = 1.75 s, shown rounded as 2s
        std::string expected = "step  3/10 | loss 5.250000 | lr 3.00e-04 | norm 1.5000 | 250.0 ms | 32768 tok/s | 3 MiB | MFU 41.0% | ETA 2s\n"
                               "val loss 4.500000 at step 3\n";
        check_true("console lines", status == 0 && console == expected, "\n" + console);
    }
    check_true("output directory created with its parents (mkdir -p)", file_exists(dir + "/log.jsonl"));
    {
        Logger logger(dir, /*append=*/true);
        StepStats diverged = stats;
        diverged.step = 4;
        diverged.loss = NAN;
        diverged.grad_norm = INFINITY;
        diverged.mfu = -1;
        printf("  (console line of a diverged step on an unknown GPU follows)\n  ");
        logger.step(diverged);
        logger.sample(4, "He said \"hi\"\n\tand left\\");
        logger.checkpoint(4, dir + "/checkpoint_4.bin", 12.5, true);
        logger.write(JsonLine("custom").integer("step", 4).number("value", 0.5).text("note", "ok"));
    }
    std::vector<std::string> lines = read_lines(dir + "/log.jsonl");
    std::vector<std::map<std::string, std::string>> objects;
    bool all_valid = lines.size() == 7;
    for (const std::string& line : lines) {
        bool valid;
        objects.push_back(parse_json_object(line, &valid));
        all_valid = all_valid && valid && objects.back().count("time_s");
        if (!valid) printf("    invalid JSON: %s\n", line.c_str());
    }
    check_true("7 lines (appended), each one valid JSON with time_s", all_valid, std::to_string(lines.size()) + " lines");
    if (!all_valid) return;
    check_true("events in order", objects[0]["event"] == "\"config\"" && objects[1]["event"] == "\"step\"" &&
                                      objects[2]["event"] == "\"val_loss\"" && objects[3]["event"] == "\"step\"" &&
                                      objects[4]["event"] == "\"sample\"" && objects[5]["event"] == "\"checkpoint\"" &&
                                      objects[6]["event"] == "\"custom\"");
    bool valid;
    std::map<std::string, std::string> logged_flags = parse_json_object(objects[0]["flags"], &valid);
    check_true("config line holds the flags", valid && logged_flags["batch-size"] == "8" &&
                                                  logged_flags["lr-schedule"] == "\"cosine\"");
    std::map<std::string, std::string>& step = objects[1];
    check_true("step line numbers", step["step"] == "3" && step["total_steps"] == "10" && step["loss"] == "5.25" &&
                                        step["lr"] == "0.000300000014" && step["grad_norm"] == "1.5" &&
                                        step["ms"] == "250" && step["tokens_per_s"] == "32768" &&
                                        step["memory_mib"] == "3" && step["mfu"] == "0.41" && step["eta_s"] == "1.75",
               lines[1]);
    check_true("val loss line", objects[2]["step"] == "3" && objects[2]["loss"] == "4.5");
    check_true("NaN loss, infinite norm and unknown MFU are null",
               objects[3]["loss"] == "null" && objects[3]["grad_norm"] == "null" && objects[3]["mfu"] == "null", lines[3]);
    check_true("sample text escaped", objects[4]["text"] == "\"He said \\\"hi\\\"\\n\\tand left\\\\\"", lines[4]);
    check_true("checkpoint line names the path, the time the loop was held and the mode",
               objects[5]["path"] == json_quote(dir + "/checkpoint_4.bin") && objects[5]["save_ms"] == "12.5" &&
                   objects[5]["async"] == "true", lines[5]);
    check_true("custom event members", objects[6]["value"] == "0.5" && objects[6]["note"] == "\"ok\"");

    // the ETA: formatting, and the mean step time that leaves the warm-up step out
    check_true("format_duration: 0s, 59s, 1m01s, 4m12s, 1h00m, 1h03m, 26h00m, rounding, unknown",
               format_duration(0) == "0s" && format_duration(59) == "59s" && format_duration(61) == "1m01s" &&
                   format_duration(252) == "4m12s" && format_duration(3600) == "1h00m" &&
                   format_duration(3789) == "1h03m" && format_duration(93600) == "26h00m" &&
                   format_duration(59.6) == "1m00s" && format_duration(-1) == "?" && format_duration(NAN) == "?",
               format_duration(61) + " " + format_duration(3789));
    {
        StepTimer timer;
        check_true("no step yet: ETA 0", timer.remaining_seconds(10) == 0.0);
        timer.add(10.0);  // a slow first step (warm-up)
        bool alone = timer.mean_seconds() == 10.0;  // the only measurement is all there is
        timer.add(1.0);
        timer.add(3.0);
        // mean of the later steps (1 + 3) / 2 = 2 s, not (10 + 1 + 3) / 3; 5 steps left: 10 s; none left: 0
        check_true("mean step time leaves out the first step once others ran", alone && timer.mean_seconds() == 2.0 &&
                       timer.remaining_seconds(5) == 10.0 && timer.remaining_seconds(0) == 0.0,
                   std::to_string(timer.mean_seconds()));
    }
    {
        // a 10 s warm-up step, then 1 s and 3 s steps: ETA 9 x 10 s = 1m30s, then 8 x 1 s, then 7 x (1 + 3) / 2 s
        auto [status, console] = run_in_child([&] {
            Logger logger(test_dir + "/eta");
            StepStats timed = stats;
            timed.mfu = -1;
            for (auto [step, seconds] : std::vector<std::pair<int, double>>{{1, 10.0}, {2, 1.0}, {3, 3.0}}) {
                timed.step = step, timed.seconds = seconds;
                logger.step(timed);
            }
        });
        std::string expected = "step  1/10 | loss 5.250000 | lr 3.00e-04 | norm 1.5000 | 10000.0 ms | 819 tok/s | 3 MiB | ETA 1m30s\n"
                               "step  2/10 | loss 5.250000 | lr 3.00e-04 | norm 1.5000 | 1000.0 ms | 8192 tok/s | 3 MiB | ETA 8s\n"
                               "step  3/10 | loss 5.250000 | lr 3.00e-04 | norm 1.5000 | 3000.0 ms | 2731 tok/s | 3 MiB | ETA 14s\n";
        check_true("console ETA: 1m30s, 8s, 14s (the warm-up step leaves the mean)", status == 0 && console == expected,
                   "\n" + console);
    }
    {
        std::vector<std::string> eta_lines = read_lines(test_dir + "/eta/log.jsonl");
        std::vector<std::string> etas;
        for (const std::string& line : eta_lines) {
            bool line_valid;
            etas.push_back(parse_json_object(line, &line_valid)["eta_s"]);
        }
        check_true("logged eta_s: 90 (9 x 10 s), 8 (8 x 1 s), 14 (7 x 2 s)",
                   etas == std::vector<std::string>{"90", "8", "14"}, eta_lines.empty() ? "no lines" : eta_lines.back());
    }

    {
        Logger fresh(dir);  // append = false starts the file over
    }
    check_true("a new run (no append) starts the log over", file_size(dir + "/log.jsonl") == 0);
    {
        Logger disabled(test_dir + "/never", false, /*enabled=*/false);
        disabled.step(stats);
        disabled.val_loss(1, 1.0f);
    }
    check_true("a disabled logger creates nothing", !file_exists(test_dir + "/never"));
    write_bytes(test_dir + "/a_file", {'x'});
    expect_failure("output dir below a regular file", [&] { Logger l(test_dir + "/a_file/sub"); },
                   "cannot create directory " + test_dir + "/a_file/sub");
    expect_failure("output dir that is a regular file", [&] { Logger l(test_dir + "/a_file"); },
                   "a file with that name is in the way");

    size_t before = device_memory_in_use_bytes();
    void* block = nullptr;
    cudaCheck(cudaMalloc(&block, 1 << 20));
    size_t during = device_memory_in_use_bytes();
    cudaCheck(cudaFree(block));
#ifdef LLMC_CPU
    check_true("memory in use counts a 1 MiB cudaMalloc exactly (CPU build)",
               during - before == (1 << 20) && device_memory_in_use_bytes() == before);
#else
    check_true("memory in use grows with a 1 MiB cudaMalloc", during >= before);
#endif
}

// ----------------------------------------------------------------------------
// MFU

void test_mfu() {
    printf("mfu\n");
    // GPT-2 124M parameters, counted from the model file's tensor shapes (C=768, L=12, Vp=50304, maxT=1024):
    //   wte 50304*768 = 38,633,472   wpe 1024*768 = 786,432   lnf 2*768 = 1,536
    //   per layer: qkvw 3*768*768 = 1,769,472, attprojw 768*768 = 589,824, fcw and fcprojw 4*768*768 =
    //   2,359,296 each, and biases + layernorms 2*768 + 2304 + 768 + 2*768 + 3072 + 768 = 9,984
    //   -> 7,087,872 per layer, 85,054,464 for 12 layers; total 124,475,904.
    long long C = 768, L = 12, Vp = 50304, maxT = 1024;
    long long per_layer = 3 * C * C + C * C + 2 * 4 * C * C + (2 * C + 3 * C + C + 2 * C + 4 * C + C);
    long long N = Vp * C + maxT * C + L * per_layer + 2 * C;
    check_true("GPT-2 124M parameter count from shapes is 124,475,904", N == 124475904LL);
    // 6N = 746,855,424; 12*L*C*T = 12*12*768*1024 = 113,246,208; sum 860,101,632 FLOPs per token
    double per_token = gpt2_flops_per_token(N, 12, 768, 1024);
    check_true("FLOPs per token at T=1024: 860,101,632", per_token == 860101632.0, std::to_string(per_token));

    struct Case { const char* name; const char* precision; double peak; };
    std::vector<Case> cases = {
        {"NVIDIA H100 80GB HBM3", "BF16", 989.4e12}, {"NVIDIA H100 PCIe", "BF16", 756e12},
        {"NVIDIA H100 NVL", "BF16", -1},            {"NVIDIA H200", "BF16", 989.4e12},
        {"NVIDIA GH200 480GB", "BF16", 989.4e12},    {"NVIDIA A100-SXM4-80GB", "BF16", 312e12},
        {"NVIDIA A100 80GB PCIe", "BF16", 312e12},   {"NVIDIA A100-SXM4-40GB", "FP32", 19.5e12},
        {"NVIDIA A10", "BF16", 125e12},              {"NVIDIA A10G", "BF16", -1},
        {"NVIDIA L4", "BF16", 121e12},               {"NVIDIA L40S", "BF16", 362e12},
        {"NVIDIA GeForce RTX 4090", "BF16", 165.2e12}, {"NVIDIA GeForce RTX 3090 Ti", "BF16", -1},
        {"Tesla V100-SXM2-16GB", "BF16", -1},       {"CPU (CUDA emulated on 1 OpenMP threads)", "BF16", -1},
        {"nvidia h100 pcie", "BF16", 756e12},
    };
    bool all = true;
    std::string detail;
    for (const Case& c : cases) {
        double got = peak_flops_per_second(c.name, c.precision);
        if (got != c.peak) all = false, detail += std::string(" ") + c.name + "=" + std::to_string(got);
    }
    check_true("peak table: SXM/PCIe/NVL told apart, A10 vs A10G vs A100, unknown -> -1", all, detail);
    printf("  (this build's device: %s, %s peak %g FLOP/s)\n", device_properties().name, PRECISION_NAME,
           peak_flops_per_second(device_properties().name, PRECISION_NAME));
    // B=8, T=1024: 8192 tokens * 860,101,632 = 7.0459526e12 FLOPs per step; in 20 ms that is 352.3 TFLOP/s,
    // 35.61% of an H100 SXM's 989.4
    double flops_per_step = per_token * 8192;
    double mfu = model_flops_utilization(flops_per_step, 0.020, 989.4e12);
    check_true("MFU of a 20 ms GPT-2 124M step (B=8, T=1024) on an H100 SXM is 35.61%", fabs(mfu - 0.35610) < 1e-4,
               std::to_string(mfu));
    check_true("MFU unknown when the peak is unknown", model_flops_utilization(flops_per_step, 0.02, -1) == -1.0);
    expect_failure("unknown precision", [] { peak_flops_per_second("NVIDIA H100", "FP16"); }, "unknown precision 'FP16'");
}

// ----------------------------------------------------------------------------
// the CPU runtime's counts of host calls, and the matmuls' bounded plan cache

// Each call below adds exactly one to the count named next to it (llmc/cpu/runtime.h), and nothing else.
void test_host_call_counts() {
    cudaStream_t stream;
    cudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t event;
    cudaCheck(cudaEventCreate(&event));
    auto counted = [](const std::string& name, const std::function<void()>& calls, HostCalls expected) {
        const HostCalls start = host_calls_so_far();
        calls();
        const HostCalls c = host_calls_since(start);
        const bool same = c.allocations == expected.allocations && c.frees == expected.frees &&
                          c.device_to_host_copies == expected.device_to_host_copies &&
                          c.synchronizations == expected.synchronizations && c.event_waits == expected.event_waits;
        check_true(name, same, std::to_string(c.allocations) + " " + std::to_string(c.frees) + " " +
                                   std::to_string(c.device_to_host_copies) + " " + std::to_string(c.synchronizations) +
                                   " " + std::to_string(c.event_waits));
    };
    int host[4] = {1, 2, 3, 4};
    int* device = nullptr;
    counted("cudaMalloc is one allocation", [&] { cudaCheck(cudaMalloc(&device, sizeof(host))); }, {1, 0, 0, 0, 0});
    counted("a host-to-device and a device-to-device copy count nothing", [&] {
        cudaCheck(cudaMemcpyAsync(device, host, sizeof(host), cudaMemcpyHostToDevice, stream));
        cudaCheck(cudaMemcpyAsync(device + 2, device, 2 * sizeof(int), cudaMemcpyDeviceToDevice, stream));
    }, {0, 0, 0, 0, 0});
    counted("cudaMemcpyAsync to the host is one copy", [&] {
        cudaCheck(cudaMemcpyAsync(host, device, sizeof(host), cudaMemcpyDeviceToHost, stream));
    }, {0, 0, 1, 0, 0});
    counted("cudaMemcpy2DAsync to the host is one copy, whatever its rows", [&] {
        cudaCheck(cudaMemcpy2DAsync(host, 2 * sizeof(int), device, 2 * sizeof(int), sizeof(int), 2,
                                    cudaMemcpyDeviceToHost, stream));
    }, {0, 0, 1, 0, 0});
    counted("a synchronous cudaMemcpy to the host is a copy and a synchronisation", [&] {
        cudaCheck(cudaMemcpy(host, device, sizeof(host), cudaMemcpyDeviceToHost));
    }, {0, 0, 1, 1, 0});
    counted("stream and device synchronisations", [&] {
        cudaCheck(cudaStreamSynchronize(stream));
        cudaCheck(cudaDeviceSynchronize());
    }, {0, 0, 0, 2, 0});
    counted("cudaEventSynchronize is an event wait", [&] {
        cudaCheck(cudaEventRecord(event, stream));
        cudaCheck(cudaEventSynchronize(event));
    }, {0, 0, 0, 0, 1});
    counted("copy_to_host is a copy and a synchronisation", [&] { copy_to_host(host, device, 4, stream); },
            {0, 0, 1, 1, 0});
    counted("cudaFree is one free; of null, none", [&] {
        cudaCheck(cudaFree(device));
        cudaCheck(cudaFree(nullptr));
    }, {0, 1, 0, 0, 0});
    int* pinned = nullptr;
    counted("cudaMallocHost and cudaFreeHost", [&] {
        cudaCheck(cudaMallocHost(&pinned, sizeof(int)));
        cudaCheck(cudaFreeHost(pinned));
    }, {1, 1, 0, 0, 0});
    // {1, 2, 3, 4} went up, its first two ints over its last two: {1, 2, 1, 2} came back
    check_true("the copies moved the values", host[0] == 1 && host[1] == 2 && host[2] == 1 && host[3] == 2);
    cudaCheck(cudaEventDestroy(event));
    cudaCheck(cudaStreamDestroy(stream));
}

// The cache's order and bound, with ints for plans: the key differs in its row count m, as an expert's does.
void test_matmul_plan_cache() {
    auto key = [](int m) { return MatmulPlanKey{m, 64, 64, false, true, false, false, 256, 256, 256, 0, 4}; };
    MatmulPlanCache<int> cache;
    cache.capacity = 3;
    std::vector<int> destroyed;
    auto destroy = [&](int& plan) { destroyed.push_back(plan); };
    for (int m = 1; m <= 3; m++) cache.insert(key(m), 100 + m, destroy);
    check_true("three plans fit a cache of three", cache.size() == 3 && destroyed.empty());
    const int* found = cache.find(key(1));  // m = 1 is now the most recent; m = 2 the least
    check_true("a cached plan is found", found && *found == 101);
    check_true("an unknown key is not", cache.find(key(7)) == nullptr);
    cache.insert(key(4), 104, destroy);
    check_true("a fourth plan evicts the least recently used (m = 2), and only it",
               cache.size() == 3 && destroyed == std::vector<int>{102} && cache.find(key(2)) == nullptr &&
                   cache.evicted == 1);
    check_true("the others stay", cache.find(key(1)) && cache.find(key(3)) && cache.find(key(4)));
    // a stream of new row counts, as an expert's matmuls make step after step: the cache never passes its bound
    size_t largest = 0;
    for (int m = 5; m < 1000; m++) {
        if (!cache.find(key(m))) cache.insert(key(m), 100 + m, destroy);
        largest = std::max(largest, cache.size());
    }
    check_true("995 new keys later the cache holds 3", largest == 3 && cache.size() == 3 && cache.evicted == 996,
               std::to_string(largest) + " " + std::to_string(cache.evicted));
    check_true("it holds the three most recent", cache.find(key(997)) && cache.find(key(998)) && cache.find(key(999)));
    check_true("the matmuls' cache is bounded by default",
               MatmulPlanCache<MatmulPlan>{}.capacity == MATMUL_PLAN_CACHE_CAPACITY && MATMUL_PLAN_CACHE_CAPACITY > 0);
}

int run(int, char**) {
    char dir_template[] = "/tmp/test_host_XXXXXX";
    if (!mkdtemp(dir_template)) fatal("cannot create a temporary directory: %s", strerror(errno));
    test_dir = dir_template;
    test_checkpoints();
    test_batch_ramp();
    test_schedulers();
    test_logger();
    test_mfu();
    test_host_call_counts();
    test_matmul_plan_cache();
    std::string cleanup = "rm -rf '" + test_dir + "'";
    if (system(cleanup.c_str()) != 0) printf("could not remove %s\n", test_dir.c_str());
    return lab_closing_line();
}
}  // namespace test_host
