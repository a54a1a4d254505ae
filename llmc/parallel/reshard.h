/*
Parameters across layouts. A rank holds its part of the model: the chunks of its pipeline stages, its tp
slices of them, and of those its ZeRO shard. Two things need the parts of one layout as another layout's:
a checkpoint saved on one layout and resumed on another, and the whole model (tp 1, every chunk, the
model file's) put together from every rank's part. Both walk pairs of ParameterLayouts with
for_each_common_run (llmc/model/parameters.h), which says which elements of one layout's tp slice are which
elements of the other's.

Checkpoints of the sharded state. A checkpoint of S shards at tensor-parallel size T, expert-parallel size
X and P pipeline ranks is P*T*X*S files, numbered by shard_file (llmc/io/checkpoint.h): file
((p T + t) X + x) S + k holds, for every chunk pipeline rank p holds, shard k of tp rank t's parameters
(with ep rank x's experts), fp32 master weights and two moments, as laid out for S shards, T slices and X
expert groups (llmc/model/parameters.h pads each chunk to a multiple of 128 S). The embedding chunk is in
the files of the first and of the last stage: the two copies are equal, and a reader takes either. The
ranks of the first replica group write them: rank 0 writes file 0, the main file, together with everything
that is not sharded (step, data position, ...), after a barrier that guarantees the other files are
complete, so a checkpoint whose main file exists is whole. Reading does not need the same layout: each
rank copies, from every saved file, the elements that fall in the shards it holds now (zero_write_shard
and zero_read_shards, llmc/parallel/zero.h). A run saved on 4 ranks at ZeRO-1 can continue on 2 ranks at
ZeRO-3, and one saved at tp 2 or pp 2 on 1 rank, or at tp 4 or pp 4.
*/
#pragma once

#include <algorithm>
#include <chrono>
#include <cstring>
#include <unistd.h>
#include <string>
#include <thread>
#include <vector>
#include "../utils.h"
#include "../rand.h"
#include "../cpu/faults.h"
#include "../io/checkpoint.h"
#include "../io/dataloader.h"
#include "../model/gpt2.cuh"
#include "parallel_context.h"

// The grid of files of this layout's checkpoints (llmc/io/checkpoint.h), and which of them this rank's shard
// goes to.
inline ShardFileGrid checkpoint_grid(const ParallelContext& par) {
    return ShardFileGrid{par.pipe.size, par.tp.size, par.ep.size, par.zero.shards};
}
inline int checkpoint_file_of(const ParallelContext& par) {
    return shard_file(checkpoint_grid(par), ShardOwner{par.pipe.rank, par.tp.rank, par.ep.rank, par.zero.shard_rank});
}

// The pipeline a checkpoint was written by: which ranks held which layers.
struct SavedPipeline {
    PipelineSchedule schedule = PipelineSchedule::OneFOneB;  // where the stages sat (zbv: in a V)
    int pp = 1, virtual_stages = 1;
    std::vector<int> stage_layers;  // layers of each model stage
};

// What each file of a checkpoint saved on `grid` and `pipeline` holds: which shard of which rank's part of
// the model (its pipeline stages' chunks, its tp slice, its ep group's experts), in file order.
inline std::vector<SavedShard> saved_shards(const GPT2Config& config, const ShardFileGrid& grid,
                                            const SavedPipeline& pipeline) {
    std::vector<SavedShard> files;
    for (int file = 0; file < grid.files(); file++) {
        const ShardOwner owner = shard_file_owner(grid, file);
        const std::vector<char> held = pipeline_held_chunks(pipeline.schedule, owner.pp_rank, pipeline.pp,
                                                            pipeline.virtual_stages, pipeline.stage_layers,
                                                            config.tied_head());
        files.push_back(SavedShard{ParameterLayout(config, grid.shards, grid.tp, owner.tp_rank, held, grid.ep,
                                                   owner.ep_rank),
                                   owner.shard});
    }
    return files;
}

// ----------------------------------------------------------------------------
// the whole model, from its parts

// The ranks that together hold one whole copy of the model: pp x tp, and under expert parallelism the ep
// ranks of a group too (ep x pp x tp).
inline Communicator& whole_model_group(ParallelContext& par) {
    return par.ep.size > 1 ? par.ep.whole_model : par.mesh.model;
}

// The whole model's parameters (host, the model file's layout: tp = 1, every chunk) from every rank's part
// `mine` (host, in `layout`): a collective over whole_model_group (numbered (ep rank x pp + pp rank) x tp +
// tp rank). Stops if two ranks' copies of a parameter differ (tp-replicated tensors, the first and last
// stage's embeddings), which would mean the copies drifted apart.
inline std::vector<float> gather_whole_model(Communicator& model_group, const Layout& parallel,
                                             const ParameterLayout& layout, const std::vector<float>& mine,
                                             cudaStream_t stream) {
    const ParameterLayout whole(layout.config);
    const std::vector<int> stage_layers = pipeline_stage_split(layout.config, parallel);
    std::vector<ParameterLayout> parts;  // each member's
    size_t largest = 0;                  // the all-gather moves equal blocks: the largest part's size
    for (int member = 0; member < model_group.size; member++) {
        const std::vector<char> held = pipeline_held_chunks(parallel.schedule, member / layout.tp % parallel.pp,
                                                            parallel.pp, parallel.pp_virtual, stage_layers,
                                                            layout.config.tied_head());
        parts.emplace_back(layout.config, layout.shards, layout.tp, member % layout.tp, held, layout.ep,
                           member / (layout.tp * parallel.pp));
        largest = std::max(largest, parts.back().total);
    }
    std::vector<float> everyone = mine;
    if (model_group.size > 1) {
        float* device = tracked_alloc<float>(largest * model_group.size, MemoryKind::Communication, "whole model");
        copy_to_device(device + model_group.rank * largest, mine.data(), mine.size(), stream);
        all_gather(model_group, device, device + model_group.rank * largest, largest, stream);
        everyone.resize(largest * model_group.size);
        copy_to_host(everyone.data(), device, everyone.size(), stream);
        tracked_free(device);
    }
    std::vector<float> values(whole.total, 0.0f);
    std::vector<char> written(whole.total, 0);
    for (int member = 0; member < model_group.size; member++) {
        const float* from = everyone.data() + member * largest;
        for_each_common_run(parts[member], whole, [&](size_t at, size_t to, size_t count) {
            if (written[to] && memcmp(&values[to], from + at, count * sizeof(float)) != 0)
                fatal("rank %d of the model group (pp rank %d, tp rank %d) holds a copy of a parameter that differs "
                      "from another rank's", member, member / layout.tp % parallel.pp, member % layout.tp);
            std::copy(from + at, from + at + count, values.begin() + to);
            std::fill(written.begin() + to, written.begin() + to + count, 1);
        });
    }
    return values;
}

// ----------------------------------------------------------------------------
// a training checkpoint: everything needed to continue bit for bit

// What the main file holds besides the shard files' list and rank 0's shard: everything that is not sharded (the
// data position, the tokens seen, which say where in a batch ramp the run stands, the layout that saved it, ...),
// taken at the save, so that an asynchronous save writes what a synchronous one would. `noise`: the noise
// scale's moving averages (llmc/noise_scale.h), when measured.
struct MainFileValues {
    GPT2Config config;
    DataLoaderState data;
    Rng sample_rng;
    long long tokens_seen = 0;
    bool measured_noise = false;
    NoiseScaleState noise;
    int shards = 1, tp = 1, ep = 1, pp = 1, pp_virtual = 1, pp_schedule = 0;
    std::vector<int> stage_layers;
};
inline MainFileValues main_file_values(const GPT2& model, const ParallelContext& par, int step,
                                       const DataLoaderState& data, const Rng& sample_rng,
                                       const NoiseScaleState* noise) {
    MainFileValues v;  // (the structs' bytes, padding included, as the file stores them)
    memcpy(&v.config, &model.config, sizeof(v.config));
    memcpy(&v.data, &data, sizeof(v.data));
    memcpy(&v.sample_rng, &sample_rng, sizeof(v.sample_rng));
    v.tokens_seen = batch_ramp_tokens_after(par.ramp, step);
    v.measured_noise = noise != nullptr;
    if (noise) memcpy(&v.noise, noise, sizeof(v.noise));
    v.shards = par.zero.shards, v.tp = par.tp.size, v.ep = par.ep.size, v.pp = par.pipe.size;
    v.pp_virtual = par.pipe.virtual_stages, v.pp_schedule = (int)par.pipe.schedule;
    v.stage_layers = par.pipe.stage_layers;
    return v;
}
// The main file's sections up to rank 0's shard, in file order.
inline void add_main_file_sections(CheckpointWriter& writer, uint64_t id, long long step,
                                   const std::vector<ShardFileEntry>& shard_files, const MainFileValues& v) {
    add_checkpoint_identity(writer, id, step);
    writer.add("shard_files", shard_files.data(), shard_files.size() * sizeof(ShardFileEntry));
    writer.add_value("config", v.config);
    writer.add_value("precision_bytes", (int)sizeof(floatX));
    writer.add_value("train_data", v.data);
    writer.add_value("sample_rng", v.sample_rng);
    writer.add_value("tokens_seen", v.tokens_seen);
    if (v.measured_noise) writer.add_value("noise_scale", v.noise);
    writer.add_value("shards", v.shards);
    writer.add_value("tensor_parallel", v.tp);
    writer.add_value("expert_parallel", v.ep);
    writer.add_value("pipeline", v.pp);
    writer.add_value("pipeline_virtual", v.pp_virtual);
    writer.add_value("pipeline_schedule", v.pp_schedule);
    writer.add("pipeline_stage_layers", v.stage_layers.data(), v.stage_layers.size() * sizeof(int));
}

// One id for every file of the checkpoint, drawn by rank 0 from its clock and address space (a collective).
inline uint64_t draw_checkpoint_id(ParallelContext& par, cudaStream_t stream) {
    uint64_t id = par.main_rank ? mix64((uint64_t)std::chrono::steady_clock::now().time_since_epoch().count() ^
                                        (uint64_t)(uintptr_t)&id ^ ((uint64_t)getpid() << 32))
                                : 0;
    broadcast_word(par.world, &id, 0, stream);
    return id;
}
// Whether this rank writes a shard file of its own (rank 0's shard goes into the main file).
inline bool writes_shard_file(const ParallelContext& par) {
    return !par.main_rank && zero_writes_shard(par.zero) && checkpoint_file_of(par) > 0;
}

// The entries of shard files 1 .. files-1 of the checkpoint whose main file is `path`, each read back. With
// `wait`, a file not yet there (or one a run abandoned at the same step, with another id) is waited for: an
// asynchronous save's writers commit theirs while rank 0's runs.
inline std::vector<ShardFileEntry> shard_file_entries(const std::string& path, int files, uint64_t id,
                                                      long long step, bool wait) {
    std::vector<ShardFileEntry> entries;
    for (int f = 1; f < files; f++) {
        const std::string shard = shard_path(path, f);
        while (wait && !(file_exists(shard) && CheckpointReader(shard).read_value<uint64_t>("checkpoint_id") == id))
            usleep(2000);
        CheckpointReader reader(shard);
        const ShardFileEntry entry{(uint64_t)f, id, reader.table_checksum()};
        check_shard_file(reader, shard, path, entry, step);  // what the writer just committed
        entries.push_back(entry);
    }
    return entries;
}

// A checkpoint of step `step` (llmc/io/checkpoint.h): every rank of the first replica group that holds a
// shard writes it to its own file; after a barrier, rank 0 reads back every shard file's identity and
// table checksum, lists them in the main file with its own shard and everything that is not sharded, and
// commits it, which completes the checkpoint. Only then are old checkpoints beyond the newest keep_last
// removed, so a crash at any moment leaves a complete checkpoint behind. `noise`: the noise scale's moving
// averages (llmc/noise_scale.h), when measured (null: not).
inline void save_checkpoint(const std::string& output_dir, int step, int keep_last, GPT2& model,
                            ParallelContext& par, const DataLoaderState& data, const Rng& sample_rng,
                            const NoiseScaleState* noise = nullptr) {
    watchdog_phase("checkpoint of step", step);
    Zero& optimizer = par.zero;
    const std::string path = checkpoint_path(output_dir, step);
    const uint64_t id = draw_checkpoint_id(par, model.stream);
    if (writes_shard_file(par)) {
        CheckpointWriter writer(shard_path(path, checkpoint_file_of(par)));
        add_checkpoint_identity(writer, id, step);
        zero_write_shard(optimizer, model, writer);
        writer.commit();
    }
    barrier(par.world, model.stream);  // every shard file is complete before the main file appears
    fault_point("before-main-file", par.world.rank, step);
    if (!par.main_rank) return;
    const std::vector<ShardFileEntry> shard_files = shard_file_entries(path, checkpoint_grid(par).files(), id, step,
                                                                       /*wait=*/false);
    CheckpointWriter writer(path);
    add_main_file_sections(writer, id, step, shard_files, main_file_values(model, par, step, data, sample_rng, noise));
    zero_write_shard(optimizer, model, writer);
    writer.commit();
    remove_old_checkpoints(output_dir, keep_last, step);
}

// ----------------------------------------------------------------------------
// asynchronous checkpoints (--checkpoint-async)
//
// The same files as save_checkpoint, with the same ids, in the same order, but written by a thread of the rank's
// own while training goes on. At the save each writing rank copies its shard's sections into pinned host memory
// (one device-to-host copy each, waited for once: the step after it may change the parameters) and rank 0 takes
// the main file's values; the loop continues, and the thread writes the shard file, or on rank 0 waits for every
// shard file to be committed (it polls the directory: the thread makes no collective, so it cannot meet the
// training loop's on a communicator) and then writes and commits the main file, last, and removes old
// checkpoints. The next save, and the end of the run, first waits for the thread: one save in flight at most, and
// the id's broadcast at the next save holds every rank until rank 0's write is done. A rank killed during the
// write leaves a shard file or the main file uncommitted (a .tmp), so the previous checkpoint stays the newest
// complete one. What the loop still pays: the copies to host memory, and a write that outlasts the steps between
// two saves (README, "Asynchronous checkpoints").
struct AsyncCheckpoint {
    std::vector<void*> sections;  // pinned host copies of this rank's shard, by kShardSections (null: absent)
    std::thread writer;           // the save in flight (joinable until waited for)
};

inline void wait_for_checkpoint(AsyncCheckpoint& async) {
    if (async.writer.joinable()) async.writer.join();
}
inline void async_checkpoint_free(AsyncCheckpoint& async) {
    wait_for_checkpoint(async);
    for (void* section : async.sections) tracked_free(section);
    async.sections.clear();
}

// Starts the save of step `step` and returns once the state is in host memory (a collective, like save_checkpoint).
inline void save_checkpoint_async(AsyncCheckpoint& async, const std::string& output_dir, int step, int keep_last,
                                  GPT2& model, ParallelContext& par, const DataLoaderState& data,
                                  const Rng& sample_rng, const NoiseScaleState* noise = nullptr) {
    watchdog_phase("checkpoint of step", step);
    wait_for_checkpoint(async);
    const uint64_t id = draw_checkpoint_id(par, model.stream);
    const bool shard_writer = writes_shard_file(par);
    if (!shard_writer && !par.main_rank) return;
    Zero& z = par.zero;
    if (async.sections.empty())  // zeroed once: the places of chunks this rank does not hold stay zero
        for (ShardSection section : kShardSections) {
            const size_t bytes = zero_has_shard_section(z, section) ? zero_shard_section_bytes(z, model, section) : 0;
            char* host = tracked_host_alloc<char>(bytes, MemoryKind::Other, "checkpoint snapshot");
            if (host) memset(host, 0, bytes);
            async.sections.push_back(host);
        }
    struct Section {
        const char* name;
        const void* data;
        size_t bytes;
    };
    std::vector<Section> shard;
    for (ShardSection section : kShardSections) {
        void* host = async.sections[(int)section];
        if (!host) continue;
        zero_copy_shard_section(z, model, section, host);
        shard.push_back({shard_section_name(section), host, zero_shard_section_bytes(z, model, section)});
    }
    cudaCheck(cudaStreamSynchronize(model.stream));  // the snapshot is in host memory
    // the thread gets copies of everything it uses: the loop goes on changing the originals
    const std::string path = checkpoint_path(output_dir, step);
    const bool main_rank = par.main_rank;
    const int rank = par.world.rank, files = checkpoint_grid(par).files();
    const std::string file_path = shard_path(path, main_rank ? 0 : checkpoint_file_of(par));
    MainFileValues values;
    if (main_rank) values = main_file_values(model, par, step, data, sample_rng, noise);
    async.writer = std::thread([=, values = std::move(values), shard = std::move(shard)] {
        std::vector<ShardFileEntry> shard_files;
        if (main_rank) shard_files = shard_file_entries(path, files, id, step, /*wait=*/true);
        CheckpointWriter writer(file_path);
        if (main_rank) add_main_file_sections(writer, id, step, shard_files, values);
        else add_checkpoint_identity(writer, id, step);
        for (const Section& section : shard) writer.add(section.name, section.data, section.bytes);
        fault_point("in-async-save", rank, step);  // the tests' kill: this file written, not committed
        writer.commit();
        if (main_rank) remove_old_checkpoints(output_dir, keep_last, step);
    });
}

// The step of the newest complete checkpoint in `output_dir` (-1: none), the same on every rank: rank 0 looks
// at the files (saying which newer ones are incomplete; stopping at a file that does not belong) and tells the
// others, so the directory is read once, not once per rank. load_checkpoint then checks each file it reads.
inline long long agreed_latest_checkpoint(ParallelContext& par, const std::string& output_dir, cudaStream_t stream) {
    uint64_t step_plus_one = par.main_rank ? (uint64_t)(latest_checkpoint_step(output_dir, true) + 1) : 0;
    broadcast_word(par.world, &step_plus_one, 0, stream);
    return (long long)step_plus_one - 1;
}

// Restores the model and optimizer, whatever layout the checkpoint was written with; returns its step. Where in
// a batch ramp it stands (the tokens seen; a checkpoint from before they were recorded: step x the batch) must
// be where this run's ramp puts that step, so that the run goes on bit for bit. `noise` (null: not
// measured) gets the noise scale's averages, or starts afresh from a checkpoint that has none.
inline int load_checkpoint(const std::string& path, long long step, GPT2& model, ParallelContext& par,
                           DataLoaderState* data, Rng* sample_rng, NoiseScaleState* noise = nullptr) {
    CheckpointReader reader(path);
    const std::vector<ShardFileEntry> shard_files = listed_shard_files(reader, path, step);
    const GPT2Config saved = reader.read_value<GPT2Config>("config");
    if (!same_shape(saved, model.config))
        fatal("%s holds a model of another shape (%s, layers %d, heads %d, K/V heads %d, channels %d, hidden %d, "
              "vocab %d) than --model asks for", path.c_str(), saved.arch == Arch::Llama ? "llama" : "gpt2",
              saved.num_layers, saved.num_heads, saved.kv_heads, saved.channels, (int)saved.hidden(), saved.vocab_size);
    if (reader.read_value<int>("precision_bytes") != (int)sizeof(floatX))
        fatal("%s was written by a build of another precision than this %s build", path.c_str(), PRECISION_NAME);
    const int shards = reader.read_value<int>("shards");
    if (shards < 1 || shards > 1 << 20) fatal("%s: implausible shard count %d", path.c_str(), shards);
    const int saved_tp = reader.read_value<int>("tensor_parallel");
    if (saved_tp < 1 || saved_tp > 1 << 12) fatal("%s: implausible tensor-parallel size %d", path.c_str(), saved_tp);
    // (a checkpoint without experts split over ranks may not say so)
    const int saved_ep = reader.has("expert_parallel") ? reader.read_value<int>("expert_parallel") : 1;
    if (saved_ep < 1 || (saved.experts == 0 ? saved_ep != 1 : saved.experts % saved_ep != 0))
        fatal("%s: implausible expert-parallel size %d for %d experts", path.c_str(), saved_ep, saved.experts);
    SavedPipeline pipeline;
    pipeline.pp = reader.read_value<int>("pipeline");
    pipeline.virtual_stages = reader.read_value<int>("pipeline_virtual");
    const int schedule = reader.read_value<int>("pipeline_schedule");
    if (schedule < 0 || schedule >= (int)pipeline_schedule_names().size())
        fatal("%s: unknown pipeline schedule %d", path.c_str(), schedule);
    pipeline.schedule = (PipelineSchedule)schedule;
    if (pipeline.schedule == PipelineSchedule::ZeroBubbleV && pipeline.virtual_stages != 2)
        fatal("%s: a zbv pipeline of %d stages per rank (the V holds 2)", path.c_str(), pipeline.virtual_stages);
    if (pipeline.pp < 1 || pipeline.virtual_stages < 1 || pipeline.pp * pipeline.virtual_stages > saved.num_layers)
        fatal("%s: implausible pipeline of %d ranks x %d virtual stages for %d layers", path.c_str(), pipeline.pp,
              pipeline.virtual_stages, saved.num_layers);
    pipeline.stage_layers.resize(pipeline.pp * pipeline.virtual_stages);
    reader.read("pipeline_stage_layers", pipeline.stage_layers.data(), pipeline.stage_layers.size() * sizeof(int));
    const std::string split_error = pipeline_split_error(pipeline.stage_layers, saved.num_layers,
                                                         (int)pipeline.stage_layers.size());
    if (!split_error.empty()) fatal("%s: %s", path.c_str(), split_error.c_str());
    const ShardFileGrid grid{pipeline.pp, saved_tp, saved_ep, shards};
    if (shard_files.size() + 1 != (size_t)grid.files())
        fatal("%s lists %zu shard files; its layout (pp %d x tp %d x ep %d x %d shards) has %d", path.c_str(),
              shard_files.size(), grid.pp, grid.tp, grid.ep, grid.shards, grid.files() - 1);
    zero_read_shards(par.zero, model, path, shard_files, step, saved_shards(model.config, grid, pipeline));
    *data = reader.read_value<DataLoaderState>("train_data");
    *sample_rng = reader.read_value<Rng>("sample_rng");
    const long long tokens_seen = reader.has("tokens_seen") ? reader.read_value<long long>("tokens_seen")
                                                            : step * par.ramp.phases[0].tokens;
    if (tokens_seen != batch_ramp_tokens_after(par.ramp, step))
        fatal("--resume: %s stands at %lld tokens seen after %lld steps; this run's batch (--batch-ramp, "
              "--total-batch-size) puts step %lld at %lld", path.c_str(), tokens_seen, step, step,
              batch_ramp_tokens_after(par.ramp, step));
    if (noise) *noise = reader.has("noise_scale") ? reader.read_value<NoiseScaleState>("noise_scale") : NoiseScaleState{};
    return (int)step;
}
