/*
Measuring a pipeline step, and the timeline it gives: what the executor (llmc/parallel/pipeline.h) notes as it
runs, and what rank 0 makes of it.

On the step being measured every rank notes, with the clock, the start and end of each action and of each wait
for a message (pipeline_clock, pipeline_note; on a GPU it then waits for the stream after each action: the
timeline is honest, the overlap slightly lower; the CPU build notes each action's processor time too,
pipeline_work_clock). pipeline_collect_timeline gathers the events to rank 0, which measures the step and each
rank's bubble as the simulator's timelines are measured (llmc/parallel/pipeline_simulator.h's pipeline_measure),
replays the step with a core per rank (pipeline_replay), prints and logs the bubble beside the schedule's
formula, logs the bubble the planner's simulation gives with each stage's measured F, B and W (bubble_planned:
pipeline_measured_stage_ms fed to pipeline_simulator.h's pipeline_simulate_stages; scripts/bench/bench_pipeline_-
bubble.sh sets it beside the measured one), and writes the timeline as a Chrome trace (--trace;
scripts/pipeline_timeline.py draws it, and the simulator's timelines write the same way).

The memory timeline. Beside the actions, the trace holds each pipeline rank's memory over the step as counter
events (scripts/memory_timeline.py draws them as the lectures' profile). Every buffer is allocated before the
first step and none during one, so what the books (llmc/device_memory.h) hold is flat over a step: pipeline_-
begin_measuring reads each rank's books just before the step. pipeline_collect_timeline books the room it
gathers the events through after the step, reads the books again and gathers both through that room; the
trace's last sample is that moment. What moves is what the buffers hold: a stage record holds a microbatch from the start of the forward pass that fills it to the end of the
backward pass that is done with it, and a weight record (split backward passes) from the start of B to the end
of W. So the device's bytes are drawn as
    parameters, gradients, optimizer state, workspace, communication, other   the books, flat
    activations, other    the activation books that are not stage or weight records: head records (the
                          logits), outboxes, token ids and losses
    records               the records' bytes that hold a microbatch: rise through the forward passes, fall
                          through the backward passes
    records, idle         those that hold none at that moment
and add up to the books at every moment. Pinned host memory (offload) is a second counter per rank, drawn
the same way with the host share of each stage record. The peak of the device total is therefore the books of
the step plus the collection's room, and that is the run's peak (memory_totals().peak_total, the memory
report's peak): nothing is allocated in a step, and nothing allocated after one outlives it on top of the
step's books but that room, except the whole model that --save-model gathers at the end of a run over more
than one rank (llmc/parallel/reshard.h's gather_whole_model). scripts/test/test_memory_timeline.sh checks the
equality.
*/
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>
#include "../utils.h"
#include "comm.h"
#include "pipeline_schedule.h"
#include "pipeline_simulator.h"
#include "pipeline.h"
#include "parallel_context.h"
#include "../model/gpt2.cuh"
#include "../io/logger.h"

// ----------------------------------------------------------------------------
// measuring

// Milliseconds since the measured step began (on a GPU, once the stream has done what it was given); 0
// when not measuring.
inline double pipeline_clock(const Pipeline& pipe, GPT2& model) {
    if (!pipe.measuring) return 0.0;
    cudaCheck(cudaStreamSynchronize(model.stream));
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - pipe.origin).count();
}
inline void pipeline_note(Pipeline& pipe, const PipelineAction& action, bool wait, double start, double end,
                          double work_ms = -1) {
    if (pipe.measuring) pipe.events.push_back({action, start, end, wait, work_ms});
}

// Milliseconds of processor time this process has used (the CPU build: its ranks may share cores, and an
// action's wall time then counts the other ranks' turns too); -1 on a GPU, where an action's work is its
// wall time, and when not measuring.
inline double pipeline_work_clock(const Pipeline& pipe) {
#ifdef LLMC_CPU
    timespec now{};
    if (!pipe.measuring || clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now) != 0) return -1.0;
    return now.tv_sec * 1e3 + now.tv_nsec * 1e-6;
#else
    (void)pipe;
    return -1.0;
#endif
}

// The time an action worked: its processor time where measured (the CPU build), else its wall time.
inline double pipeline_event_work_ms(const PipelineEvent& e) { return e.work_ms >= 0 ? e.work_ms : e.end_ms - e.start_ms; }

// The measured step replayed with one core per rank: each action takes the processor time it took and
// starts as soon as its rank is free and its input has come. With free sends (pipeline_simulate_actions) on a
// GPU, or with a core per rank, this is the measured step without the messages' time; on fewer cores than
// ranks it is the step the ranks would take each on a core of their own, which the wall clock cannot show.
// With synchronous groups (pipeline_simulate_groups) each action also waits, as the executor does, until its
// group's peers have posted their side.
inline PipelineTimeline pipeline_replay(const PipelineTimeline& measured, PipelineSchedule schedule,
                                        bool synchronous_groups) {
    std::vector<std::vector<PipelineAction>> lists(measured.p);
    std::vector<std::vector<double>> durations(measured.p);
    for (int r = 0; r < measured.p; r++)
        for (const PipelineEvent& e : measured.ranks[r]) {
            if (e.wait) continue;
            lists[r].push_back(e.action);
            durations[r].push_back(pipeline_event_work_ms(e));
        }
    if (!synchronous_groups)
        return pipeline_simulate_actions(lists, schedule, measured.m, measured.V, 0, 0, 0, &durations);
    return pipeline_simulate_groups(lists, pipeline_message_groups(lists, schedule, measured.V), schedule, measured.m,
                                    measured.V, durations);
}

// Each model stage's F, B and W over the measured step: the mean time its actions of each kind worked (0 for a
// kind the schedule does not run). What the planner needs to know of the passes to plan the bubble.
inline std::vector<std::array<double, 3>> pipeline_measured_stage_ms(const PipelineTimeline& measured,
                                                                     PipelineSchedule schedule) {
    std::vector<std::array<double, 3>> sum(measured.p * measured.V, {0, 0, 0});
    std::vector<std::array<int, 3>> count(sum.size(), {0, 0, 0});
    for (int r = 0; r < measured.p; r++)
        for (const PipelineEvent& e : measured.ranks[r]) {
            if (e.wait) continue;
            const int s = pipeline_model_stage(schedule, r, e.action.virtual_stage, measured.p);
            sum[s][e.action.kind] += pipeline_event_work_ms(e);
            count[s][e.action.kind]++;
        }
    for (size_t s = 0; s < sum.size(); s++)
        for (int kind = 0; kind < 3; kind++) sum[s][kind] /= std::max(count[s][kind], 1);
    return sum;
}

// Events travel as 7 floats each: kind, microbatch, virtual stage, wait, start, end, work; room for a step's F, B
// and W actions and their waits.
constexpr size_t kEventFields = 7;
inline size_t pipeline_event_capacity(const Pipeline& pipe) {
    return 6 * (size_t)pipe.microbatches * pipe.virtual_stages;
}

// One rank's books as the memory timeline reads them, in 64-bit words: device bytes per MemoryKind, host bytes per
// MemoryKind, then the stage records (how many, device bytes each, host bytes each) and the weight records (how
// many, bytes each).
constexpr size_t kMemoryWords = 2 * kNumMemoryKinds + 5;
inline std::vector<uint64_t> pipeline_memory_words(const GPT2& model) {
    const MemoryTotals device = memory_totals(), host = host_memory_totals();
    std::vector<uint64_t> words;
    for (const MemoryTotals* t : {&device, &host})
        for (int k = 0; k < kNumMemoryKinds; k++) words.push_back(t->current[k]);
    for (size_t word : {model.records.size(), model.stage_record_bytes, model.stage_record_host_bytes,
                        model.weight_records.size(), model.weight_record_bytes})
        words.push_back(word);
    return words;
}

// Starts measuring the next pipeline_step: this rank's books are read (the memory timeline's: nothing is
// allocated from here to the step's end), then the stages agree on the moment it begins.
inline void pipeline_begin_measuring(Pipeline& pipe, GPT2& model) {
    pipe.memory = pipeline_memory_words(model);
    barrier(*pipe.group, model.stream);
    pipe.measuring = true;
    pipe.events.clear();
    pipe.origin = std::chrono::steady_clock::now();
}

// The measured step's events of every pipeline rank, on pp rank 0 (a collective over the pp axis; the other
// ranks get an empty timeline), and every rank's books in pipe.memory (the step's) and pipe.memory_collected
// (at pipe.collected_ms, the room for the events booked).
inline PipelineTimeline pipeline_collect_timeline(Pipeline& pipe, GPT2& model) {
    pipe.collected_ms = pipeline_clock(pipe, model);
    pipe.measuring = false;
    const size_t capacity = pipeline_event_capacity(pipe);
    if (pipe.events.size() > capacity) fatal("pipeline: %zu events measured, room for %zu", pipe.events.size(), capacity);
    constexpr size_t kFields = kEventFields;
    std::vector<float> mine(kFields * capacity, -1.0f);
    for (size_t i = 0; i < pipe.events.size(); i++) {
        const PipelineEvent& e = pipe.events[i];
        const float fields[kFields] = {(float)e.action.kind, (float)e.action.microbatch, (float)e.action.virtual_stage,
                                       e.wait ? 1.0f : 0.0f, (float)e.start_ms, (float)e.end_ms, (float)e.work_ms};
        std::copy(fields, fields + kFields, mine.begin() + kFields * i);
    }
    float* device = tracked_alloc<float>(mine.size() * pipe.size, MemoryKind::Communication, "pipeline timeline");
    pipe.memory_collected = pipeline_memory_words(model);
    copy_to_device(device + mine.size() * pipe.rank, mine.data(), mine.size(), model.stream);
    all_gather(*pipe.group, device, device + mine.size() * pipe.rank, mine.size(), model.stream);
    std::vector<float> everyone(mine.size() * pipe.size);
    copy_to_host(everyone.data(), device, everyone.size(), model.stream);
    // then every rank's books, one set at a time, through the same room (which holds a set: 6 events of 7 floats
    // per rank at the least), so that the measuring books nothing more
    static_assert(4 * kMemoryWords * sizeof(__nv_bfloat16) <= 6 * kEventFields * sizeof(float), "room for the books");
    for (std::vector<uint64_t>* books : {&pipe.memory, &pipe.memory_collected})
        *books = all_gather_words(*pipe.group, *books, model.stream, reinterpret_cast<__nv_bfloat16*>(device));
    tracked_free(device);
    if (pipe.rank != 0) return PipelineTimeline{};
    PipelineTimeline timeline = pipeline_timeline_of(pipe.schedule, pipe.size, pipe.microbatches, pipe.virtual_stages);
    for (int r = 0; r < pipe.size; r++)
        for (size_t i = 0; i < capacity; i++) {
            const float* f = everyone.data() + (r * capacity + i) * kFields;
            if (f[0] < 0) break;
            const PipelineAction action{(PipelineAction::Kind)(int)f[0], (int)f[1], (int)f[2]};
            timeline.ranks[r].push_back({action, f[4], f[5], f[3] != 0, f[6]});
        }
    pipeline_measure(timeline);
    return timeline;
}

// ----------------------------------------------------------------------------
// Chrome trace event format (chrome://tracing, https://ui.perfetto.dev, scripts/pipeline_timeline.py): one
// complete event ("ph": "X") per action ("F3", "B3", "W3"; category "work") and per measured wait for a message
// ("wait F3": before F3, category "wait"), thread = pipeline rank, times in microseconds (an action's processor
// time, where measured, as args.work_ms), plus a name for each rank's row and the layout under "otherData".

// The stage and weight records holding a microbatch on one rank, after each moment their count changes (and at
// 0 and at the step's end): a forward pass takes a stage record at its start, a backward pass gives it back at
// its end; with split backward passes B takes a weight record at its start and W gives it back at its end. At
// one moment the records given back count first.
struct RecordsHeld {
    double ms;
    int stage_records, weight_records;
};
inline std::vector<RecordsHeld> pipeline_records_held(const std::vector<PipelineEvent>& events, double step_ms) {
    bool split = false;
    for (const PipelineEvent& e : events) split |= e.action.kind == PipelineAction::Weights;
    struct Change { double ms; int stage, weight; };
    std::vector<Change> changes;
    for (const PipelineEvent& e : events) {
        if (e.wait) continue;
        if (e.action.kind == PipelineAction::Forward) changes.push_back({e.start_ms, +1, 0});
        if (e.action.kind == PipelineAction::Backward) {
            changes.push_back({e.end_ms, -1, 0});
            if (split) changes.push_back({e.start_ms, 0, +1});
        }
        if (e.action.kind == PipelineAction::Weights) changes.push_back({e.end_ms, 0, -1});
    }
    std::stable_sort(changes.begin(), changes.end(), [](const Change& a, const Change& b) {
        return a.ms != b.ms ? a.ms < b.ms : a.stage + a.weight < b.stage + b.weight;
    });
    std::vector<RecordsHeld> held{{0.0, 0, 0}};
    for (const Change& c : changes) {
        RecordsHeld next = held.back();
        next.ms = c.ms;
        next.stage_records += c.stage;
        next.weight_records += c.weight;
        if (next.ms == held.back().ms) held.back() = next;
        else held.push_back(next);
    }
    if (step_ms > held.back().ms) held.push_back({step_ms, held.back().stage_records, held.back().weight_records});
    return held;
}

// One rank's memory at one moment, by the categories the file's header lists (device or host), as the args of a
// counter event: categories that hold nothing on the rank left out, the records always in.
inline std::string pipeline_memory_args(const uint64_t* kinds, uint64_t record_pool, uint64_t records_held) {
    uint64_t rest[kNumMemoryKinds];
    std::copy(kinds, kinds + kNumMemoryKinds, rest);
    // the records' pool out of the activation books (on the host: out of whichever kinds hold it)
    uint64_t pool_left = record_pool;
    for (int k : {(int)MemoryKind::Activations, 0, 1, 2, 4, 5, 6}) {
        const uint64_t taken = std::min(pool_left, rest[k]);
        rest[k] -= taken;
        pool_left -= taken;
    }
    if (pool_left > 0 || records_held > record_pool)
        fatal("memory timeline: the records hold %llu of a pool of %llu bytes, more than the books hold",
              (unsigned long long)records_held, (unsigned long long)record_pool);
    std::string args;
    auto add = [&](const char* name, uint64_t bytes) {
        args += (args.empty() ? "" : ", ") + std::string("\"") + name + "\": " + std::to_string(bytes);
    };
    for (MemoryKind k : {MemoryKind::Parameters, MemoryKind::Gradients, MemoryKind::OptimizerState,
                         MemoryKind::Workspace, MemoryKind::Communication, MemoryKind::Other})
        if (rest[(int)k] > 0) add(memory_kind_name(k), rest[(int)k]);
    if (rest[(int)MemoryKind::Activations] > 0) add("activations, other", rest[(int)MemoryKind::Activations]);
    add("records", records_held);
    add("records, idle", record_pool - records_held);
    return "{" + args + "}";
}

// The counter events ("ph": "C") of every rank's memory over the step: "device memory, rank R" and, where the
// rank holds pinned host memory, "host memory, rank R"; values in bytes. `memory`: the ranks' pipeline_memory_words
// during the step; `collected`: at collected_ms, after it, every record idle (the trace's last sample).
inline std::string pipeline_memory_counters(const PipelineTimeline& timeline, const std::vector<uint64_t>& memory,
                                            const std::vector<uint64_t>& collected, double collected_ms,
                                            const char* separator) {
    if (memory.size() != kMemoryWords * timeline.ranks.size() || collected.size() != memory.size())
        fatal("memory timeline: %zu and %zu words for %zu ranks", memory.size(), collected.size(), timeline.ranks.size());
    std::string json;
    char line[160];
    for (size_t r = 0; r < timeline.ranks.size(); r++) {
        std::vector<RecordsHeld> moments = pipeline_records_held(timeline.ranks[r], timeline.step_ms);
        moments.push_back({std::max(collected_ms, moments.back().ms), 0, 0});
        for (const RecordsHeld& held : moments) {
            const bool last = &held == &moments.back();
            const uint64_t* words = (last ? collected : memory).data() + r * kMemoryWords;
            const uint64_t *device = words, *host = words + kNumMemoryKinds, *records = words + 2 * kNumMemoryKinds;
            const uint64_t stage_records = records[0], stage_bytes = records[1], stage_host_bytes = records[2],
                           weight_records = records[3], weight_bytes = records[4];
            uint64_t host_total = 0;
            for (int k = 0; k < kNumMemoryKinds; k++) host_total += host[k];
            const uint64_t device_held = held.stage_records * stage_bytes + held.weight_records * weight_bytes;
            snprintf(line, sizeof(line), "%s{\"name\": \"device memory, rank %zu\", \"cat\": \"memory\", \"ph\": "
                     "\"C\", \"pid\": 0, \"tid\": %zu, \"ts\": %.3f, \"args\": ", separator, r, r, held.ms * 1000.0);
            json += line + pipeline_memory_args(device, stage_records * stage_bytes + weight_records * weight_bytes,
                                                device_held) + "}";
            separator = ",\n";
            if (host_total == 0) continue;
            snprintf(line, sizeof(line), "%s{\"name\": \"host memory, rank %zu\", \"cat\": \"memory\", \"ph\": "
                     "\"C\", \"pid\": 0, \"tid\": %zu, \"ts\": %.3f, \"args\": ", separator, r, r, held.ms * 1000.0);
            json += line + pipeline_memory_args(host, stage_records * stage_host_bytes,
                                                held.stage_records * stage_host_bytes) + "}";
        }
    }
    return json;
}

// The peak of one rank's device memory over the measured step and its collection: the sum of its books then.
inline uint64_t pipeline_memory_peak(const Pipeline& pipe, int rank) {
    uint64_t step = 0, collected = 0;
    for (int k = 0; k < kNumMemoryKinds; k++) {
        step += pipe.memory.at(rank * kMemoryWords + k);
        collected += pipe.memory_collected.at(rank * kMemoryWords + k);
    }
    return std::max(step, collected);
}

// `pipe` (the measured step's, or null): each rank's memory counters too.
inline std::string pipeline_chrome_trace(const PipelineTimeline& timeline, const Pipeline* pipe = nullptr) {
    std::string json = "{\"otherData\": {\"schedule\": \"" + timeline.schedule + "\", \"pipeline_ranks\": " +
                       std::to_string(timeline.p) + ", \"microbatches\": " + std::to_string(timeline.m) +
                       ", \"virtual_stages\": " + std::to_string(timeline.V) + "},\n\"traceEvents\": [";
    char line[320];
    const char* separator = "\n";
    for (size_t r = 0; r < timeline.ranks.size(); r++) {
        snprintf(line, sizeof(line), "%s{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": %zu, "
                 "\"args\": {\"name\": \"rank %zu\"}}", separator, r, r);
        json += line;
        separator = ",\n";
    }
    for (size_t r = 0; r < timeline.ranks.size(); r++)
        for (const PipelineEvent& e : timeline.ranks[r]) {
            char work[48] = "";  // the action's processor time, where it was measured (the CPU build)
            if (!e.wait && e.work_ms >= 0) snprintf(work, sizeof(work), ", \"work_ms\": %.3f", e.work_ms);
            snprintf(line, sizeof(line),
                     "%s{\"name\": \"%s%c%d\", \"cat\": \"%s\", \"ph\": \"X\", \"pid\": 0, \"tid\": %zu, \"ts\": %.3f, "
                     "\"dur\": %.3f, \"args\": {\"microbatch\": %d, \"virtual_stage\": %d%s}}",
                     separator, e.wait ? "wait " : "", e.action.kind == PipelineAction::Forward ? 'F' : e.action.kind == PipelineAction::Backward ? 'B' : 'W',
                     e.action.microbatch, e.wait ? "wait" : "work", r,
                     e.start_ms * 1000.0, (e.end_ms - e.start_ms) * 1000.0, e.action.microbatch,
                     e.action.virtual_stage, work);
            json += line;
            separator = ",\n";
        }
    if (pipe) json += pipeline_memory_counters(timeline, pipe->memory, pipe->memory_collected, pipe->collected_ms, separator);
    json += "\n]}\n";
    return json;
}

// ----------------------------------------------------------------------------
// the report

// Rank 0's report of a measured step: each stage's bubble, measured and replayed with a core per rank (free
// sends; synchronous groups), beside the schedule's formula, and its peak of records in flight beside the
// schedule's.
inline void pipeline_print_timeline(const PipelineTimeline& t, const PipelineTimeline& replayed,
                                    const PipelineTimeline& synchronous, PipelineSchedule schedule) {
    printf("pipeline %s, p %d, m %d, V %d: the measured step took %.1f ms (replayed with a core per rank: %.1f with "
           "free sends, %.1f with synchronous groups); the formula's bubble %.3f\n", t.schedule.c_str(), t.p, t.m,
           t.V, t.step_ms, replayed.step_ms, synchronous.step_ms, pipeline_bubble_fraction(schedule, t.p, t.m, t.V));
    for (int r = 0; r < t.p; r++)
        printf("  pp rank %d: bubble %.3f measured, %.3f and %.3f replayed; records in flight at the peak %d "
               "(formula %d)\n", r, t.bubble_fraction[r], replayed.bubble_fraction[r],
               synchronous.bubble_fraction[r], t.peak_activations[r],
               pipeline_peak_activations(schedule, r, t.p, t.m, t.V));
}

// After the measured step: rank 0 prints each stage's bubble and records in flight beside the formulas, logs
// them, and writes the timeline as a Chrome trace if asked (the gathering is a collective over the pp axis).
inline void pipeline_report_timeline(ParallelContext& par, GPT2& model, Logger& logger, const std::string& trace_path) {
    Pipeline& pipe = par.pipe;
    const PipelineTimeline timeline = pipeline_collect_timeline(pipe, model);
    if (!par.main_rank) return;
    const PipelineTimeline replayed = pipeline_replay(timeline, pipe.schedule, false),
                           synchronous = pipeline_replay(timeline, pipe.schedule, true);
    for (const PipelineTimeline* t : {&replayed, &synchronous})
        if (!t->problem.empty()) fatal("pipeline: the measured step does not replay: %s", t->problem.c_str());
    pipeline_print_timeline(timeline, replayed, synchronous, pipe.schedule);
    // the bubble the planner's simulation gives with each stage's measured passes (the bench's check)
    const std::vector<std::array<double, 3>> stage_ms = pipeline_measured_stage_ms(timeline, pipe.schedule);
    const PipelineTimeline planned = pipeline_simulate_stages(pipe.schedule, pipe.size, pipe.microbatches,
                                                              pipe.virtual_stages, stage_ms);
    std::string bubbles, replayed_bubbles, synchronous_bubbles, planned_bubbles, passes, peaks, peak_formulas, layers;
    for (int r = 0; r < pipe.size; r++) {
        bubbles += (r ? ", " : "") + std::to_string(timeline.bubble_fraction[r]);
        replayed_bubbles += (r ? ", " : "") + std::to_string(replayed.bubble_fraction[r]);
        synchronous_bubbles += (r ? ", " : "") + std::to_string(synchronous.bubble_fraction[r]);
        planned_bubbles += (r ? ", " : "") + std::to_string(planned.bubble_fraction[r]);
        peaks += (r ? ", " : "") + std::to_string(timeline.peak_activations[r]);
        peak_formulas += (r ? ", " : "") + std::to_string(pipeline_peak_activations(pipe.schedule, r, pipe.size,
                                                                                    pipe.microbatches, pipe.virtual_stages));
    }
    for (size_t s = 0; s < pipe.stage_layers.size(); s++) layers += (s ? ", " : "") + std::to_string(pipe.stage_layers[s]);
    for (size_t s = 0; s < stage_ms.size(); s++)
        passes += (s ? ", [" : "[") + std::to_string(stage_ms[s][0]) + ", " + std::to_string(stage_ms[s][1]) + ", " +
                  std::to_string(stage_ms[s][2]) + "]";
    logger.write(JsonLine("pipeline").text("schedule", timeline.schedule).integer("pp", pipe.size)
                     .integer("microbatches", pipe.microbatches).integer("virtual_stages", pipe.virtual_stages)
                     .number("step_ms", timeline.step_ms).raw("bubble", "[" + bubbles + "]")
                     .number("step_ms_replayed", replayed.step_ms).raw("bubble_replayed", "[" + replayed_bubbles + "]")
                     .number("step_ms_replayed_synchronous", synchronous.step_ms)
                     .raw("bubble_replayed_synchronous", "[" + synchronous_bubbles + "]")
                     .raw("stage_pass_ms", "[" + passes + "]").number("step_ms_planned", planned.step_ms)
                     .raw("bubble_planned", "[" + planned_bubbles + "]")
                     .number("bubble_formula", pipeline_bubble_fraction(pipe.schedule, pipe.size, pipe.microbatches,
                                                                        pipe.virtual_stages))
                     .raw("peak_records", "[" + peaks + "]").raw("peak_records_formula", "[" + peak_formulas + "]")
                     .raw("stage_layers", "[" + layers + "]"));
    if (!trace_path.empty()) {
        write_text_file(trace_path, pipeline_chrome_trace(timeline, &pipe));
        printf("wrote %s (with each rank's memory over the step; its peak, device:", trace_path.c_str());
        for (int r = 0; r < pipe.size; r++)
            printf("%s pp rank %d %s", r ? "," : "", r, format_bytes((double)pipeline_memory_peak(pipe, r)).c_str());
        printf(")\n");
    }
}
