/*
Measuring a pipeline step, and the timeline it gives: what the executor (llmc/parallel/pipeline.h) notes as it
runs, and what rank 0 makes of it.

On the step being measured every rank notes, with the clock, the start and end of each action and of each wait
for a message (pipeline_clock, pipeline_note; on a GPU it then waits for the stream after each action: the
timeline is honest, the overlap slightly lower; the CPU build notes each action's processor time too,
pipeline_work_clock). pipeline_collect_timeline gathers the events to rank 0, which measures the step and each
rank's bubble as the simulator's timelines are measured (llmc/parallel/pipeline_simulator.h's pipeline_measure),
replays the step with a core per rank (pipeline_replay), prints and logs the bubble beside the schedule's
formula, and writes the timeline as a Chrome trace (--trace; scripts/pipeline_timeline.py draws it, and the
simulator's timelines write the same way).
*/
#pragma once

#include <chrono>
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
            durations[r].push_back(e.work_ms >= 0 ? e.work_ms : e.end_ms - e.start_ms);
        }
    if (!synchronous_groups)
        return pipeline_simulate_actions(lists, schedule, measured.m, measured.V, 0, 0, 0, &durations);
    return pipeline_simulate_groups(lists, pipeline_message_groups(lists, schedule, measured.V), schedule, measured.m,
                                    measured.V, durations);
}

// Starts measuring the next pipeline_step: the stages agree on the moment it begins.
inline void pipeline_begin_measuring(Pipeline& pipe, GPT2& model) {
    barrier(*pipe.group, model.stream);
    pipe.measuring = true;
    pipe.events.clear();
    pipe.origin = std::chrono::steady_clock::now();
}

// The measured step's events of every pipeline rank, on pp rank 0 (a collective over the pp axis; the other
// ranks get an empty timeline). Events travel as 7 floats each: kind, microbatch, virtual stage, wait,
// start, end, work.
inline PipelineTimeline pipeline_collect_timeline(Pipeline& pipe, GPT2& model) {
    pipe.measuring = false;
    const size_t capacity = 6 * (size_t)pipe.microbatches * pipe.virtual_stages;  // F, B, W actions and their waits
    if (pipe.events.size() > capacity) fatal("pipeline: %zu events measured, room for %zu", pipe.events.size(), capacity);
    constexpr size_t kFields = 7;
    std::vector<float> mine(kFields * capacity, -1.0f);
    for (size_t i = 0; i < pipe.events.size(); i++) {
        const PipelineEvent& e = pipe.events[i];
        const float fields[kFields] = {(float)e.action.kind, (float)e.action.microbatch, (float)e.action.virtual_stage,
                                       e.wait ? 1.0f : 0.0f, (float)e.start_ms, (float)e.end_ms, (float)e.work_ms};
        std::copy(fields, fields + kFields, mine.begin() + kFields * i);
    }
    float* device = tracked_alloc<float>(mine.size() * pipe.size, MemoryKind::Communication, "pipeline timeline");
    copy_to_device(device + mine.size() * pipe.rank, mine.data(), mine.size(), model.stream);
    all_gather(*pipe.group, device, device + mine.size() * pipe.rank, mine.size(), model.stream);
    std::vector<float> everyone(mine.size() * pipe.size);
    copy_to_host(everyone.data(), device, everyone.size(), model.stream);
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

inline std::string pipeline_chrome_trace(const PipelineTimeline& timeline) {
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
    std::string bubbles, replayed_bubbles, synchronous_bubbles, peaks, peak_formulas, layers;
    for (int r = 0; r < pipe.size; r++) {
        bubbles += (r ? ", " : "") + std::to_string(timeline.bubble_fraction[r]);
        replayed_bubbles += (r ? ", " : "") + std::to_string(replayed.bubble_fraction[r]);
        synchronous_bubbles += (r ? ", " : "") + std::to_string(synchronous.bubble_fraction[r]);
        peaks += (r ? ", " : "") + std::to_string(timeline.peak_activations[r]);
        peak_formulas += (r ? ", " : "") + std::to_string(pipeline_peak_activations(pipe.schedule, r, pipe.size,
                                                                                    pipe.microbatches, pipe.virtual_stages));
    }
    for (size_t s = 0; s < pipe.stage_layers.size(); s++) layers += (s ? ", " : "") + std::to_string(pipe.stage_layers[s]);
    logger.write(JsonLine("pipeline").text("schedule", timeline.schedule).integer("pp", pipe.size)
                     .integer("microbatches", pipe.microbatches).integer("virtual_stages", pipe.virtual_stages)
                     .number("step_ms", timeline.step_ms).raw("bubble", "[" + bubbles + "]")
                     .number("step_ms_replayed", replayed.step_ms).raw("bubble_replayed", "[" + replayed_bubbles + "]")
                     .number("step_ms_replayed_synchronous", synchronous.step_ms)
                     .raw("bubble_replayed_synchronous", "[" + synchronous_bubbles + "]")
                     .number("bubble_formula", pipeline_bubble_fraction(pipe.schedule, pipe.size, pipe.microbatches,
                                                                        pipe.virtual_stages))
                     .raw("peak_records", "[" + peaks + "]").raw("peak_records_formula", "[" + peak_formulas + "]")
                     .raw("stage_layers", "[" + layers + "]"));
    if (!trace_path.empty()) {
        write_text_file(trace_path, pipeline_chrome_trace(timeline));
        printf("wrote %s\n", trace_path.c_str());
    }
}
