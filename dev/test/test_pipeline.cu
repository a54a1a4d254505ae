/*
Tests of the pipeline schedules (llmc/parallel/pipeline_schedule.h), without a model: the action lists, the simulator
that runs them and the groups of messages between them (llmc/parallel/pipeline_simulator.h), the bubble and memory
formulas, the Chrome trace (llmc/parallel/pipeline_timeline.h).

  1. small cases worked out by hand in the comments (action lists, start times, step time, bubble);
  2. every schedule on every layout of a grid (p = 1..8, m = 1..16, V = 1..4 for interleaved where
     p divides m): each rank's list holds every pass of its stages once, forward before backward, in
     microbatch order per stage; the simulation runs to the end; its timeline respects every dependency;
     its peak activations and bubble equal the formulas; the trace parses as JSON with one event per action;
  3. comparisons between schedules (gpipe and 1f1b: same bubble, 1f1b fewer records; interleaved: a
     smaller bubble), and the claims about the interleaved warm-up with and without send time;
  4. broken lists must be caught: an action swapped, dropped or repeated, a timeline moved, bad JSON.
     A checker that accepts everything would fail here.
  5. what the executor (llmc/parallel/pipeline.h) takes from the lists: records, gradient staging buffers, links,
     held chunks (dev/test/test_pipeline_executor.cuh says what and why).
Prints `N passed, M failed` and exits non-zero on any failure.

  build/test_pipeline --trace SCHEDULE P M [V] OUT.json
writes the simulated trace of that layout (forward 1 ms, backward 2 ms per rank's share of the model) for
scripts/pipeline_timeline.py to draw.
*/
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>
#include "../lab/lab.h"
#include "../../llmc/parallel/pipeline_schedule.h"
#include "../../llmc/parallel/pipeline_simulator.h"
#include "../../llmc/parallel/pipeline_timeline.h"

namespace test_pipeline {  // one suite of dev/test/host_suites.cu

// the time model of the formulas: forward 1, backward 2 (per rank's share of the layers), free sends
constexpr double kForwardMs = 1.0, kBackwardMs = 2.0;
// Unit times divided by V <= 4 and summed over at most 2 m V = 128 actions per rank: every time is a
// multiple of 1/12 that binary floating point rounds at 1e-16 relative; 1e-12 leaves room for the sums.
constexpr double kTimeTolerance = 1e-12;

const PipelineSchedule kSchedules[] = {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::Interleaved,
                                      PipelineSchedule::ZeroBubbleH1, PipelineSchedule::ZeroBubbleV};

struct ScheduleLayout {
    PipelineSchedule schedule;
    int p, m, V;
    std::string name() const {
        return std::string(pipeline_schedule_name(schedule)) + " p=" + std::to_string(p) + " m=" + std::to_string(m) +
               (schedule == PipelineSchedule::Interleaved ? " V=" + std::to_string(V) : "");
    }
};

std::vector<std::vector<PipelineAction>> all_lists(const ScheduleLayout& l) {
    std::vector<std::vector<PipelineAction>> lists;
    for (int r = 0; r < l.p; r++) lists.push_back(pipeline_actions(l.schedule, r, l.p, l.m, l.V));
    return lists;
}

// ----------------------------------------------------------------------------
// checkers: each returns what is wrong, or "" when nothing is. They are written from the rules, not from
// the generator or the simulator, and part 4 feeds them broken input to show they can say no.

// Every (kind, microbatch, virtual stage) of the rank exactly once; per stage, the forward before the
// backward, and forwards (and backwards) in microbatch order (so gradients add up in the same order
// under every schedule).
std::string check_list(const std::vector<PipelineAction>& actions, int m, int V) {
    std::map<std::tuple<int, int, int>, int> seen;  // (kind, microbatch, virtual stage) -> position
    std::vector<int> last_forward(V, -1), last_backward(V, -1), last_weights(V, -1);
    bool split = false;  // W passes: each after its B
    for (const PipelineAction& a : actions) split |= a.kind == PipelineAction::Weights;
    for (size_t i = 0; i < actions.size(); i++) {
        const PipelineAction& a = actions[i];
        const std::string label = pipeline_action_label(a, true);
        if (a.microbatch < 0 || a.microbatch >= m || a.virtual_stage < 0 || a.virtual_stage >= V)
            return label + " does not exist";
        if (!seen.emplace(std::make_tuple((int)a.kind, a.microbatch, a.virtual_stage), (int)i).second)
            return label + " appears twice";
        std::vector<int>& last = a.kind == PipelineAction::Forward    ? last_forward
                                 : a.kind == PipelineAction::Backward ? last_backward
                                                                      : last_weights;
        if (a.microbatch < last[a.virtual_stage]) return label + " comes after a later microbatch";
        last[a.virtual_stage] = a.microbatch;
        if (a.kind == PipelineAction::Backward &&
            !seen.count(std::make_tuple((int)PipelineAction::Forward, a.microbatch, a.virtual_stage)))
            return label + " comes before its forward";
        if (a.kind == PipelineAction::Weights &&
            !seen.count(std::make_tuple((int)PipelineAction::Backward, a.microbatch, a.virtual_stage)))
            return label + " comes before its B";
    }
    const int passes = split ? 3 : 2;
    if ((int)actions.size() != passes * m * V)
        return std::to_string(actions.size()) + " actions, expected " + std::to_string(passes * m * V);
    return "";
}

// The timeline against its lists: each rank ran its list in order, one action at a time, each for its
// duration, and no action started before what it needed had ended.
std::string check_timeline(const PipelineTimeline& t, const std::vector<std::vector<PipelineAction>>& lists) {
    if (!t.problem.empty()) return t.problem;
    const PipelineSchedule schedule = pipeline_schedule_from_name(t.schedule);
    const int p = (int)lists.size(), V = t.V, S = p * V;
    std::map<std::tuple<int, int, int>, const PipelineEvent*> by_pass;  // (kind, microbatch, model stage)
    bool split = false;  // B and W take half of the backward each
    for (const auto& list : lists)
        for (const PipelineAction& a : list) split |= a.kind == PipelineAction::Weights;
    for (int r = 0; r < p; r++) {
        if (t.ranks[r].size() != lists[r].size())
            return "rank " + std::to_string(r) + " ran a different number of actions";
        for (size_t i = 0; i < lists[r].size(); i++) {
            const PipelineEvent& e = t.ranks[r][i];
            const PipelineAction& a = lists[r][i];
            const std::string where = "rank " + std::to_string(r) + " " + pipeline_action_label(a, true);
            if (e.action.kind != a.kind || e.action.microbatch != a.microbatch ||
                e.action.virtual_stage != a.virtual_stage)
                return where + ": ran out of its list's order";
            const double duration =
                (a.kind == PipelineAction::Forward ? kForwardMs : split ? kBackwardMs / 2 : kBackwardMs) / V;
            if (std::fabs(e.end_ms - e.start_ms - duration) > kTimeTolerance) return where + ": wrong duration";
            if (i > 0 && e.start_ms < t.ranks[r][i - 1].end_ms - kTimeTolerance)
                return where + ": overlaps the one before";
            by_pass[std::make_tuple((int)a.kind, a.microbatch, pipeline_model_stage(schedule, r, a.virtual_stage, p))] = &e;
        }
    }
    for (const auto& [key, e] : by_pass) {
        const auto [kind, j, s] = key;
        std::vector<std::tuple<int, int, int>> needs;
        if (kind == PipelineAction::Forward && s > 0) needs.push_back({PipelineAction::Forward, j, s - 1});
        if (kind == PipelineAction::Backward) {
            needs.push_back({PipelineAction::Forward, j, s});
            if (s < S - 1) needs.push_back({PipelineAction::Backward, j, s + 1});
        }
        if (kind == PipelineAction::Weights) needs.push_back({PipelineAction::Backward, j, s});
        for (const auto& need : needs) {
            auto found = by_pass.find(need);
            if (found == by_pass.end() || e->start_ms < found->second->end_ms - kTimeTolerance)
                return pipeline_action_label(e->action, true) + " of stage " + std::to_string(s) +
                       " starts before what it needs has ended";
        }
    }
    return "";
}

// ----------------------------------------------------------------------------
// a minimal JSON reader: enough to prove that a trace parses, and to read its events back

struct Json {
    enum Type { Null, Bool, Number, String, Array, Object } type = Null;
    double number = 0;
    std::string text;
    std::vector<Json> items;                            // Array
    std::vector<std::pair<std::string, Json>> members;  // Object
    const Json* get(const std::string& key) const {
        for (const auto& [k, v] : members)
            if (k == key) return &v;
        return nullptr;
    }
};

struct JsonReader {
    const std::string& s;
    size_t i = 0;
    void skip() {
        while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) i++;
    }
    bool literal(const char* word) {
        const size_t n = strlen(word);
        if (s.compare(i, n, word) != 0) return false;
        i += n;
        return true;
    }
    bool string(std::string* out) {
        if (i >= s.size() || s[i] != '"') return false;
        for (i++; i < s.size() && s[i] != '"'; i++) {
            if ((unsigned char)s[i] < 0x20) return false;
            if (s[i] == '\\') {
                if (++i >= s.size() || !strchr("\"\\/bfnrtu", s[i])) return false;  // \uXXXX kept as is
            }
            *out += s[i];
        }
        if (i >= s.size()) return false;
        i++;
        return true;
    }
    bool value(Json* v) {
        skip();
        if (i >= s.size()) return false;
        const char c = s[i];
        if (c == '{' || c == '[') {
            const char close = c == '{' ? '}' : ']';
            v->type = c == '{' ? Json::Object : Json::Array;
            i++;
            skip();
            if (i < s.size() && s[i] == close) {
                i++;
                return true;
            }
            while (true) {
                Json item;
                std::string key;
                if (c == '{') {
                    skip();
                    if (!string(&key)) return false;
                    skip();
                    if (i >= s.size() || s[i++] != ':') return false;
                }
                if (!value(&item)) return false;
                if (c == '{')
                    v->members.push_back({key, item});
                else
                    v->items.push_back(item);
                skip();
                if (i < s.size() && s[i] == ',') {
                    i++;
                    continue;
                }
                if (i < s.size() && s[i] == close) {
                    i++;
                    return true;
                }
                return false;
            }
        }
        if (c == '"') {
            v->type = Json::String;
            return string(&v->text);
        }
        if (literal("true")) {
            v->type = Json::Bool;
            v->number = 1;
            return true;
        }
        if (literal("false")) {
            v->type = Json::Bool;
            return true;
        }
        if (literal("null")) return true;
        // number: -?digits[.digits][e[+-]digits]
        const size_t start = i;
        if (i < s.size() && s[i] == '-') i++;
        size_t digits = i;
        while (i < s.size() && isdigit((unsigned char)s[i])) i++;
        if (i == digits) return false;
        if (i < s.size() && s[i] == '.') {
            digits = ++i;
            while (i < s.size() && isdigit((unsigned char)s[i])) i++;
            if (i == digits) return false;
        }
        if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
            if (++i < s.size() && (s[i] == '+' || s[i] == '-')) i++;
            digits = i;
            while (i < s.size() && isdigit((unsigned char)s[i])) i++;
            if (i == digits) return false;
        }
        v->type = Json::Number;
        v->number = strtod(s.substr(start, i - start).c_str(), nullptr);
        return true;
    }
};

// Parses the whole text as one JSON value; false on any syntax error or trailing text.
bool parse_json(const std::string& text, Json* out) {
    JsonReader reader{text};
    if (!reader.value(out)) return false;
    reader.skip();
    return reader.i == text.size();
}

// The trace against the timeline: valid JSON, one complete event per action with the right rank, name,
// arguments and times, one row name per rank.
std::string check_trace(const std::string& trace, const PipelineTimeline& t) {
    Json root;
    if (!parse_json(trace, &root)) return "not valid JSON";
    const Json* events = root.get("traceEvents");
    if (!events || events->type != Json::Array) return "no traceEvents array";
    size_t complete = 0, names = 0, actions = 0;
    std::vector<size_t> next(t.ranks.size(), 0);  // events of each rank come in the order it ran them
    for (const auto& rank : t.ranks) actions += rank.size();
    for (const Json& e : events->items) {
        const Json *ph = e.get("ph"), *tid = e.get("tid"), *pid = e.get("pid"), *name = e.get("name");
        if (!ph || !tid || !pid || !name || pid->number != 0 || tid->number < 0 || tid->number >= t.ranks.size())
            return "an event without ph, pid 0, a rank's tid or a name";
        if (ph->text == "M") {
            names++;
            continue;
        }
        if (ph->text != "X") return "an event of phase " + ph->text;
        const size_t r = (size_t)tid->number;
        if (next[r] >= t.ranks[r].size()) return "more events than actions on rank " + std::to_string(r);
        const PipelineEvent& want = t.ranks[r][next[r]++];
        const Json *ts = e.get("ts"), *dur = e.get("dur"), *args = e.get("args");
        const Json* microbatch = args ? args->get("microbatch") : nullptr;
        const Json* virtual_stage = args ? args->get("virtual_stage") : nullptr;
        // times are written in microseconds with 3 decimals: within 0.0005 us of the simulated ones
        if (!ts || !dur || !microbatch || !virtual_stage || name->text != pipeline_action_label(want.action, false) ||
            microbatch->number != want.action.microbatch || virtual_stage->number != want.action.virtual_stage ||
            std::fabs(ts->number - want.start_ms * 1000) > 5e-4 ||
            std::fabs(dur->number - (want.end_ms - want.start_ms) * 1000) > 5e-4)
            return "event " + std::to_string(complete) + " does not match rank " + std::to_string(r) + "'s action";
        complete++;
    }
    if (complete != actions)
        return std::to_string(complete) + " complete events for " + std::to_string(actions) + " actions";
    if (names != t.ranks.size())
        return std::to_string(names) + " row names for " + std::to_string(t.ranks.size()) + " ranks";
    return "";
}

// ----------------------------------------------------------------------------
// 1. worked out by hand

void test_by_hand() {
    printf("worked out by hand\n");
    check_true("names", pipeline_schedule_names() == std::vector<std::string>{"gpipe", "1f1b", "interleaved", "zb-h1",
                                                                              "zbv"} &&
                            pipeline_schedule_from_name("zb-h1") == PipelineSchedule::ZeroBubbleH1 &&
                            pipeline_schedule_from_name("zbv") == PipelineSchedule::ZeroBubbleV &&
                            pipeline_schedule_from_name("gpipe") == PipelineSchedule::GPipe &&
                            pipeline_schedule_from_name("1f1b") == PipelineSchedule::OneFOneB &&
                            pipeline_schedule_from_name("interleaved") == PipelineSchedule::Interleaved);
    expect_failure(
        "an unknown schedule name", [] { pipeline_schedule_from_name("zb-h2"); }, "'zb-h2': not a schedule");
    expect_failure(
        "interleaved with m not a multiple of p", [] { pipeline_actions(PipelineSchedule::Interleaved, 0, 4, 6, 2); },
        "6 microbatches are not a multiple of the 4 pipeline ranks");
    expect_failure(
        "1f1b with virtual stages", [] { pipeline_actions(PipelineSchedule::OneFOneB, 0, 4, 8, 2); },
        "only the interleaved schedule");
    expect_failure(
        "no pipeline ranks", [] { pipeline_simulate(PipelineSchedule::OneFOneB, 0, 8, 1, 1, 2); },
        "p 0, m 8, V 1 must all be at least 1");
    expect_failure(
        "a rank outside the pipeline", [] { pipeline_actions(PipelineSchedule::GPipe, 4, 4, 8, 1); },
        "rank 4 is not one of the 4");

    // the weight-gradient pass is labelled W; only zb-h1 and zbv split the backward
    check_true("labels F B W",
               pipeline_describe({{PipelineAction::Forward, 3, 0}, {PipelineAction::Backward, 3, 0},
                                  {PipelineAction::Weights, 3, 1}}) == "F3.0 B3.0 W3.1");
    check_true("only zb-h1 and zbv split the backward",
               !pipeline_splits_backward(PipelineSchedule::GPipe) &&
                   !pipeline_splits_backward(PipelineSchedule::OneFOneB) &&
                   !pipeline_splits_backward(PipelineSchedule::Interleaved) &&
                   pipeline_splits_backward(PipelineSchedule::ZeroBubbleH1) &&
                   pipeline_splits_backward(PipelineSchedule::ZeroBubbleV));
    // zb-h1 p=3 m=4: rank r holds back its first r W passes
    check_true("zb-h1 p=3 m=4 rank 0", pipeline_describe(pipeline_actions(PipelineSchedule::ZeroBubbleH1, 0, 3, 4, 1)) ==
                                           "F0 F1 F2 B0 W0 F3 B1 W1 B2 W2 B3 W3");
    check_true("zb-h1 p=3 m=4 rank 2", pipeline_describe(pipeline_actions(PipelineSchedule::ZeroBubbleH1, 2, 3, 4, 1)) ==
                                           "F0 B0 F1 B1 F2 B2 W0 F3 B3 W1 W2 W3");
    expect_failure(
        "zb-h1 with fewer microbatches than ranks", [] { pipeline_actions(PipelineSchedule::ZeroBubbleH1, 0, 4, 3, 1); },
        "3 microbatches are fewer than the 4 pipeline ranks");
    // zbv p=2 m=3 (stages 0 and 3 on rank 0, 1 and 2 on rank 1; ".0" is chunk 0, ".1" chunk 1). Rank 0: three
    // chunk-0 forwards, no pairs, then twice F B W on chunk 1, the steady state, the cool-down's B W on
    // chunk 0 twice. Rank 1: one chunk-0 forward, one pair (F0.1 F1.0), once F B W on chunk 1, the steady
    // state, a B on each chunk with their W held back, one B W on chunk 0, then the two W's held back. With
    // every pass 1 unit: T = 6 m + p - 1 = 19.
    check_true("zbv p=2 m=3 rank 0", pipeline_describe(pipeline_actions(PipelineSchedule::ZeroBubbleV, 0, 2, 3, 2)) ==
                                         "F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 B0.0 W0.0 F2.1 B2.1 W2.1 "
                                         "B1.0 W1.0 B2.0 W2.0",
               pipeline_describe(pipeline_actions(PipelineSchedule::ZeroBubbleV, 0, 2, 3, 2)));
    check_true("zbv p=2 m=3 rank 1", pipeline_describe(pipeline_actions(PipelineSchedule::ZeroBubbleV, 1, 2, 3, 2)) ==
                                         "F0.0 F0.1 F1.0 F1.1 B0.1 W0.1 F2.0 B0.0 W0.0 F2.1 B1.1 W1.1 B1.0 B2.1 "
                                         "B2.0 W1.0 W2.1 W2.0",
               pipeline_describe(pipeline_actions(PipelineSchedule::ZeroBubbleV, 1, 2, 3, 2)));
    {
        const PipelineTimeline t = pipeline_simulate(PipelineSchedule::ZeroBubbleV, 2, 3, 2, kForwardMs, kBackwardMs);
        // a pass through one of the rank's two stages: F = kForwardMs / 2 = 0.5, B = W = kBackwardMs / 4 = 0.5
        check_true("zbv p=2 m=3: step 19 passes of 0.5", t.problem.empty() && std::fabs(t.step_ms - 9.5) < kTimeTolerance,
                   t.problem.empty() ? std::to_string(t.step_ms) : t.problem);
    }
    expect_failure(
        "zbv with fewer than 2p - 1 microbatches", [] { pipeline_actions(PipelineSchedule::ZeroBubbleV, 0, 4, 6, 2); },
        "6 microbatches are fewer than 2 p - 1 = 7");
    expect_failure(
        "zbv with other than two stages per rank", [] { pipeline_actions(PipelineSchedule::ZeroBubbleV, 0, 4, 8, 1); },
        "the V holds 2");

    // a split backward: B takes the lowest free W record, its W frees it; activation records as before
    {
        const std::vector<PipelineAction> split = {
            {PipelineAction::Forward, 0, 0},  {PipelineAction::Forward, 1, 0}, {PipelineAction::Backward, 0, 0},
            {PipelineAction::Backward, 1, 0}, {PipelineAction::Weights, 0, 0}, {PipelineAction::Forward, 2, 0},
            {PipelineAction::Backward, 2, 0}, {PipelineAction::Weights, 2, 0}, {PipelineAction::Weights, 1, 0}};
        int activations = 0, weights = 0;
        const std::vector<int> records = pipeline_record_assignment(split, &activations);
        const std::vector<int> weight_records = pipeline_weight_record_assignment(split, &weights);
        check_true("activation records with a split backward",
                   records == std::vector<int>{0, 1, 0, 1, -1, 0, 0, -1, -1} && activations == 2);
        check_true("weight records", weight_records == std::vector<int>{-1, -1, 0, 1, 0, -1, 0, 0, 1} && weights == 2);
        int none = -1;
        check_true("no weight records without the split",
                   pipeline_weight_record_assignment(pipeline_actions(PipelineSchedule::OneFOneB, 0, 4, 8, 1), &none) ==
                           std::vector<int>(16, -1) &&
                       none == 0);
        expect_failure(
            "weights before their backward",
            [] {
                int pool;
                pipeline_weight_record_assignment({{PipelineAction::Weights, 0, 0}}, &pool);
            },
            "W0.0 has no backward before it");
    }

    // gpipe: every forward, then every backward, in microbatch order
    check_true("gpipe m=3",
               pipeline_describe(pipeline_actions(PipelineSchedule::GPipe, 1, 2, 3, 1)) == "F0 F1 F2 B0 B1 B2");
    // 1f1b, p=4 m=8: rank 0 warms up with p-0-1 = 3 forwards, then F3 B0, ..., F7 B4, and cools down B5 B6 B7;
    // the last rank has no warm-up; with m=2 < p, rank 0's warm-up is cut to m = 2 and there is no steady state
    const std::string rank0 = pipeline_describe(pipeline_actions(PipelineSchedule::OneFOneB, 0, 4, 8, 1));
    const std::string rank3 = pipeline_describe(pipeline_actions(PipelineSchedule::OneFOneB, 3, 4, 8, 1));
    check_true("1f1b p=4 m=8 rank 0", rank0 == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7", rank0);
    check_true("1f1b p=4 m=8 rank 3", rank3 == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7", rank3);
    check_true("1f1b p=4 m=2 rank 0",
               pipeline_describe(pipeline_actions(PipelineSchedule::OneFOneB, 0, 4, 2, 1)) == "F0 F1 B0 B1");
    // interleaved, p=2 m=4 V=2. Forwards in rounds of p V = 4: F0.0 F1.0 F0.1 F1.1 | F2.0 F3.0 F2.1 F3.1;
    // backwards the same from virtual stage 1: B0.1 B1.1 B0.0 B1.0 | B2.1 B3.1 B2.0 B3.0.
    // Rank 0 warms up with (2-0-1)*2 + (2-1)*2 = 4 forwards, rank 1 with 0 + 2 = 2.
    const std::string interleaved0 = pipeline_describe(pipeline_actions(PipelineSchedule::Interleaved, 0, 2, 4, 2));
    const std::string interleaved1 = pipeline_describe(pipeline_actions(PipelineSchedule::Interleaved, 1, 2, 4, 2));
    check_true("interleaved p=2 m=4 V=2 rank 0",
               interleaved0 == "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0",
               interleaved0);
    check_true("interleaved p=2 m=4 V=2 rank 1",
               interleaved1 == "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0",
               interleaved1);
    check_true("interleaved: virtual stage 1 of rank 1 of 2 is model stage 3, on rank 1",
               pipeline_model_stage(PipelineSchedule::Interleaved, 1, 1, 2) == 3 &&
                   pipeline_stage_rank(PipelineSchedule::Interleaved, 3, 2) == 1);
    {
        // zbv, p = 4: ranks 0..3 hold stages 0..3 and 7..4
        bool v_shape = true;
        for (int r = 0; r < 4; r++)
            v_shape &= pipeline_model_stage(PipelineSchedule::ZeroBubbleV, r, 0, 4) == r &&
                       pipeline_model_stage(PipelineSchedule::ZeroBubbleV, r, 1, 4) == 7 - r &&
                       pipeline_stage_rank(PipelineSchedule::ZeroBubbleV, r, 4) == r &&
                       pipeline_stage_rank(PipelineSchedule::ZeroBubbleV, 7 - r, 4) == r;
        check_true("zbv p=4: rank r holds stages r and 7 - r", v_shape);
    }

    // 1f1b p=2 m=3, forward 1, backward 2. Rank 0 "F0 F1 B0 F2 B1 B2", rank 1 "F0 B0 F1 B1 F2 B2":
    //   rank 0: F0 0-1, F1 1-2, B0 waits for rank 1's B0 (2-4): 4-6, F2 6-7, B1 waits for rank 1's (5-7): 7-9,
    //           B2 waits for rank 1's (8-10): 10-12
    //   rank 1: F0 1-2, B0 2-4, F1 4-5 (rank 0's F1 ended at 2), B1 5-7, F2 waits for rank 0's (6-7): 7-8, B2 8-10
    // T = 12 = (m + p - 1)(f + b); each rank works 9: bubble 3/12 = 1/4 = (p - 1)/(m + p - 1)
    {
        PipelineTimeline t = pipeline_simulate(PipelineSchedule::OneFOneB, 2, 3, 1, kForwardMs, kBackwardMs);
        const std::vector<double> starts0 = {0, 1, 4, 6, 7, 10}, starts1 = {1, 2, 4, 5, 7, 8};
        bool same = t.problem.empty() && t.ranks[0].size() == 6 && t.ranks[1].size() == 6;
        for (int i = 0; same && i < 6; i++)
            same = t.ranks[0][i].start_ms == starts0[i] && t.ranks[1][i].start_ms == starts1[i];
        check_true("1f1b p=2 m=3: start times", same, t.problem);
        check_true("1f1b p=2 m=3: step 12, bubble 1/4, peaks 2 and 1",
                   same && t.step_ms == 12 && t.bubble_fraction[0] == 0.25 && t.bubble_fraction[1] == 0.25 &&
                       t.peak_activations == std::vector<int>{2, 1});
    }
    // interleaved p=2 m=2 V=2 (m = p: rank 0's warm-up min(2 + 2, 4) is everything). Actions take 0.5 and 1:
    //   rank 0: F0.0 0-.5  F1.0 .5-1  F0.1 1-1.5 (after rank 1's F0.0 .5-1)  F1.1 1.5-2 (rank 1's F1.0 1-1.5)
    //           B0.1 3-4 (rank 1's B0.1 2-3)  B1.1 4.5-5.5 (rank 1's B1.1 3.5-4.5)  B0.0 5.5-6.5  B1.0 6.5-7.5
    //   rank 1: F0.0 .5-1  F1.0 1-1.5  F0.1 1.5-2  B0.1 2-3  F1.1 3-3.5  B1.1 3.5-4.5  B0.0 4.5-5.5 (rank 0's
    //           B0.1 ended at 4)  B1.0 5.5-6.5 (rank 0's B1.1 at 5.5)
    // T = 7.5 = m (f + b) + (p - 1)(f + b) / V = 6 + 1.5: bubble 1.5 / 7.5 = 1/5 = (p - 1)/(V m + p - 1)
    {
        PipelineTimeline t = pipeline_simulate(PipelineSchedule::Interleaved, 2, 2, 2, kForwardMs, kBackwardMs);
        const std::vector<double> starts0 = {0, .5, 1, 1.5, 3, 4.5, 5.5, 6.5},
                                  starts1 = {.5, 1, 1.5, 2, 3, 3.5, 4.5, 5.5};
        bool same = t.problem.empty() && t.ranks[0].size() == 8 && t.ranks[1].size() == 8;
        for (int i = 0; same && i < 8; i++)
            same = t.ranks[0][i].start_ms == starts0[i] && t.ranks[1][i].start_ms == starts1[i];
        check_true("interleaved p=2 m=2 V=2: start times", same, t.problem);
        check_true(
            "interleaved p=2 m=2 V=2: step 7.5, bubble 1/5, peaks 4 and 3",
            same && t.step_ms == 7.5 && t.bubble_fraction[0] == 0.2 && t.peak_activations == std::vector<int>{4, 3});
    }
    // the report's numbers: p=4 m=8 under gpipe and 1f1b, T = 11 * 3 = 33, bubble 9/33 = 3/11
    for (PipelineSchedule schedule : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB}) {
        PipelineTimeline t = pipeline_simulate(schedule, 4, 8, 1, kForwardMs, kBackwardMs);
        char detail[160] = "";
        if (t.problem.empty())
            snprintf(detail, sizeof(detail), "step %.6g ms, bubble %.6f, peak activations %d %d %d %d", t.step_ms,
                     t.bubble_fraction[0], t.peak_activations[0], t.peak_activations[1], t.peak_activations[2],
                     t.peak_activations[3]);
        check_true(
            std::string(pipeline_schedule_name(schedule)) + " p=4 m=8: step 33, bubble 3/11",
            t.problem.empty() && t.step_ms == 33 && std::fabs(t.bubble_fraction[0] - 3.0 / 11.0) < kTimeTolerance,
            t.problem.empty() ? detail : t.problem);
    }
}

// ----------------------------------------------------------------------------
// 2. the grid

std::vector<ScheduleLayout> grid(PipelineSchedule schedule) {
    std::vector<ScheduleLayout> layouts;
    for (int p = 1; p <= 8; p++)
        for (int m = 1; m <= 16; m++)
            for (int V = 1; V <= (schedule == PipelineSchedule::Interleaved ? 4 : 1); V++)
                if (schedule == PipelineSchedule::ZeroBubbleV) {
                    if (V == 1 && m >= 2 * p - 1) layouts.push_back({schedule, p, m, 2});
                } else if ((schedule != PipelineSchedule::Interleaved || m % p == 0) &&
                           (schedule != PipelineSchedule::ZeroBubbleH1 || m >= p))
                    layouts.push_back({schedule, p, m, V});
    return layouts;
}

void test_grid() {
    for (PipelineSchedule schedule : kSchedules) {
        const int passed_before = lab.passed, failed_before = lab.failed;
        const std::vector<ScheduleLayout> layouts = grid(schedule);
        for (const ScheduleLayout& l : layouts) {
            const std::string name = l.name();
            const auto lists = all_lists(l);
            std::string wrong;
            for (int r = 0; r < l.p && wrong.empty(); r++) {
                wrong = check_list(lists[r], l.m, l.V);
                if (!wrong.empty()) wrong = "rank " + std::to_string(r) + ": " + wrong;
            }
            check_true(name + ": every pass once, forward first, microbatch order", wrong.empty(), wrong);
            const PipelineTimeline t = pipeline_simulate(l.schedule, l.p, l.m, l.V, kForwardMs, kBackwardMs);
            check_true(name + ": the simulation runs to the end", t.problem.empty(), t.problem);
            const std::string order = check_timeline(t, lists);
            check_true(name + ": the timeline keeps every dependency", order.empty(), order);
            if (!t.problem.empty()) continue;
            std::string peaks, bubbles;
            const double bubble = pipeline_bubble_fraction(l.schedule, l.p, l.m, l.V);
            for (int r = 0; r < l.p; r++) {
                const int want = pipeline_peak_activations(l.schedule, r, l.p, l.m, l.V);
                if (t.peak_activations[r] != want)
                    peaks += " rank " + std::to_string(r) + ": " + std::to_string(t.peak_activations[r]) + " not " +
                             std::to_string(want);
                if (std::fabs(t.bubble_fraction[r] - bubble) > kTimeTolerance)
                    bubbles += " rank " + std::to_string(r) + ": " + std::to_string(t.bubble_fraction[r]) + " not " +
                               std::to_string(bubble);
            }
            check_true(name + ": peak activations as the formula", peaks.empty(), peaks);
            check_true(name + ": bubble as the formula", bubbles.empty(), bubbles);
            const std::string trace = check_trace(pipeline_chrome_trace(t), t);
            check_true(name + ": the trace is JSON, one event per action", trace.empty(), trace);
        }
        printf("  %-12s %3zu layouts: %d checks passed, %d failed\n", pipeline_schedule_name(schedule), layouts.size(),
               lab.passed - passed_before, lab.failed - failed_before);
    }
}

// ----------------------------------------------------------------------------
// 3. between schedules

// Interleaved lists with a warm-up of `extra` * (p - r - 1) + (V - 1) p forwards (the standard has extra = 2).
std::vector<std::vector<PipelineAction>> interleaved_with_warmup(int p, int m, int V, int extra) {
    std::vector<std::vector<PipelineAction>> lists(p);
    for (int r = 0; r < p; r++) {
        const int total = m * V, warmup = std::min((p - r - 1) * extra + (V - 1) * p, total);
        int forwards = 0, backwards = 0;
        for (; forwards < warmup; forwards++)
            lists[r].push_back(interleaved_action(PipelineAction::Forward, forwards, p, V));
        while (forwards < total) {
            lists[r].push_back(interleaved_action(PipelineAction::Forward, forwards++, p, V));
            lists[r].push_back(interleaved_action(PipelineAction::Backward, backwards++, p, V));
        }
        while (backwards < total) lists[r].push_back(interleaved_action(PipelineAction::Backward, backwards++, p, V));
    }
    return lists;
}

void test_between_schedules() {
    // zb-h1 at p = 4, m = 8 (F = B = W): 3/27 against 1f1b's 3/11, at most half; zbv 3/51, less than zb-h1's
    {
        const double zbv = pipeline_simulate(PipelineSchedule::ZeroBubbleV, 4, 8, 2, kForwardMs, kBackwardMs)
                               .bubble_fraction[0];
        const double zb_h1 = pipeline_simulate(PipelineSchedule::ZeroBubbleH1, 4, 8, 1, kForwardMs, kBackwardMs)
                                 .bubble_fraction[0];
        check_true("zbv's bubble at p=4 m=8 is 3/51, below zb-h1's 3/27 (" + std::to_string(zbv) + ")",
                   std::fabs(zbv - 3.0 / 51.0) < kTimeTolerance && zbv < zb_h1);
    }
    {
        const double one_f_one_b = pipeline_simulate(PipelineSchedule::OneFOneB, 4, 8, 1, kForwardMs, kBackwardMs)
                                       .bubble_fraction[0];
        const double zero_bubble = pipeline_simulate(PipelineSchedule::ZeroBubbleH1, 4, 8, 1, kForwardMs, kBackwardMs)
                                       .bubble_fraction[0];
        check_true("zb-h1's bubble at p=4 m=8 is at most half of 1f1b's (" + std::to_string(zero_bubble) + " vs " +
                       std::to_string(one_f_one_b) + ")",
                   zero_bubble <= 0.5 * one_f_one_b);
    }
    printf("between schedules\n");
    std::string same_bubble, fewer_records, smaller_bubble;
    for (int p = 1; p <= 8; p++)
        for (int m = 1; m <= 16; m++) {
            const PipelineTimeline gpipe = pipeline_simulate(PipelineSchedule::GPipe, p, m, 1, kForwardMs, kBackwardMs);
            const PipelineTimeline one_f_one_b =
                pipeline_simulate(PipelineSchedule::OneFOneB, p, m, 1, kForwardMs, kBackwardMs);
            const std::string at = " p=" + std::to_string(p) + " m=" + std::to_string(m);
            if (!gpipe.problem.empty() || !one_f_one_b.problem.empty()) {  // the grid says why
                same_bubble += at, fewer_records += at;
                continue;
            }
            if (std::fabs(gpipe.step_ms - one_f_one_b.step_ms) > kTimeTolerance) same_bubble += at;
            for (int r = 0; r < p && m > p; r++)
                if (one_f_one_b.peak_activations[r] >= gpipe.peak_activations[r])
                    fewer_records += at + " rank " + std::to_string(r);
            if (m % p != 0 || p == 1) continue;
            for (int V = 2; V <= 4; V++) {
                const PipelineTimeline interleaved =
                    pipeline_simulate(PipelineSchedule::Interleaved, p, m, V, kForwardMs, kBackwardMs);
                if (!interleaved.problem.empty() || interleaved.step_ms >= one_f_one_b.step_ms)
                    smaller_bubble += at + " V=" + std::to_string(V);
            }
        }
    check_true("gpipe and 1f1b: the same step time, so the same bubble (p <= 8, m <= 16)", same_bubble.empty(),
               same_bubble);
    check_true("1f1b holds fewer records than gpipe on every rank when m > p", fewer_records.empty(), fewer_records);
    check_true("interleaved V = 2..4: a shorter step than 1f1b (p > 1)", smaller_bubble.empty(), smaller_bubble);

    // The interleaved warm-up: with free sends, (p - r - 1) + (V - 1) p forwards already give the formula's
    // bubble; with send time, the standard doubled (p - r - 1) wins (pipeline_schedule.h's comment quotes these).
    std::string shorter_is_enough;
    for (int p = 1; p <= 8; p++)
        for (int m = p; m <= 16; m += p)
            for (int V = 1; V <= 4; V++) {
                const PipelineTimeline t = pipeline_simulate_actions(
                    interleaved_with_warmup(p, m, V, 1), PipelineSchedule::Interleaved, m, V, kForwardMs, kBackwardMs);
                if (!t.problem.empty() ||
                    std::fabs(t.bubble_fraction[0] - pipeline_bubble_fraction(PipelineSchedule::Interleaved, p, m, V)) >
                        kTimeTolerance)
                    shorter_is_enough +=
                        " p=" + std::to_string(p) + " m=" + std::to_string(m) + " V=" + std::to_string(V);
            }
    check_true("interleaved, free sends: warm-up (p-r-1) + (V-1)p gives the same bubble", shorter_is_enough.empty(),
               shorter_is_enough);
    {
        const double send_ms = 0.1;
        const PipelineTimeline standard =
            pipeline_simulate(PipelineSchedule::Interleaved, 4, 16, 2, kForwardMs, kBackwardMs, send_ms);
        const PipelineTimeline shorter = pipeline_simulate_actions(
            interleaved_with_warmup(4, 16, 2, 1), PipelineSchedule::Interleaved, 16, 2, kForwardMs, kBackwardMs, send_ms);
        char detail[96];
        snprintf(detail, sizeof(detail), "standard %.4g ms, shorter warm-up %.4g ms", standard.step_ms,
                 shorter.step_ms);
        check_true("interleaved p=4 m=16 V=2, sends of 0.1 ms: the doubled warm-up is faster (53.9 vs 57.9)",
                   std::fabs(standard.step_ms - 53.9) < 1e-9 && std::fabs(shorter.step_ms - 57.9) < 1e-9, detail);
    }
}

// The executor's synchronous groups, timed (pipeline_simulate_groups): a rank waits before each action until
// its group's peers have posted. That can only lengthen the free-send step. With each send placed where its
// receiver already waits (pipeline_message_groups), it costs gpipe, 1f1b, zb-h1 and zbv nothing on any layout
// here; interleaved loses a little on some (printed at p = 4, m = 8).
void test_synchronous_groups_timed() {
    printf("synchronous groups, timed\n");
    for (PipelineSchedule schedule : kSchedules) {
        std::string faster, slower;
        for (const ScheduleLayout& l : grid(schedule)) {
            const auto lists = all_lists(l);
            const bool split = pipeline_splits_backward(schedule);
            std::vector<std::vector<double>> durations(l.p);
            for (int r = 0; r < l.p; r++)
                for (const PipelineAction& a : lists[r])
                    durations[r].push_back(
                        (a.kind == PipelineAction::Forward ? kForwardMs : split ? kBackwardMs / 2 : kBackwardMs) / l.V);
            const PipelineTimeline free = pipeline_simulate_actions(lists, schedule, l.m, l.V, kForwardMs, kBackwardMs);
            const PipelineTimeline synchronous = pipeline_simulate_groups(
                lists, pipeline_message_groups(lists, schedule, l.V), schedule, l.m, l.V, durations);
            if (!synchronous.problem.empty() || synchronous.step_ms < free.step_ms - kTimeTolerance)
                faster += " " + l.name() + synchronous.problem;
            else if (synchronous.step_ms > free.step_ms + kTimeTolerance)
                slower += " " + l.name();
            if (l.p == 4 && l.m == 8 && synchronous.problem.empty())
                printf("  %-22s step %.4g with free sends, %.4g with synchronous groups (bubble %.3f, %.3f)\n",
                       l.name().c_str(), free.step_ms, synchronous.step_ms, free.bubble_fraction[0],
                       synchronous.bubble_fraction[0]);
        }
        check_true(std::string(pipeline_schedule_name(schedule)) + ": synchronous groups run, never faster than free sends",
                   faster.empty(), faster);
        if (schedule != PipelineSchedule::Interleaved)
            check_true(std::string(pipeline_schedule_name(schedule)) + ": synchronous groups cost nothing (p <= 8, m <= 16)",
                       slower.empty(), slower);
    }
}

// ----------------------------------------------------------------------------
// 4. broken input must be caught

void test_broken_input_is_caught() {
    printf("broken input is caught\n");
    const ScheduleLayout l = {PipelineSchedule::OneFOneB, 4, 8, 1};
    auto simulate = [&](const std::vector<std::vector<PipelineAction>>& lists) {
        return pipeline_simulate_actions(lists, PipelineSchedule::OneFOneB, l.m, l.V, kForwardMs, kBackwardMs);
    };
    // rank 0 swaps F1 and B0: "F0 B0 F2 F3 F1 ...". It waits at B0, which needs rank 1's B0, which needs
    // rank 1's F1, which needs rank 0's F1: a deadlock.
    {
        auto lists = all_lists(l);
        std::swap(lists[0][1], lists[0][4]);
        const PipelineTimeline t = simulate(lists);
        check_true("1f1b p=4 m=8, rank 0 swaps F1 and B0: deadlock",
                   t.problem.find("deadlock") == 0 && t.problem.find("rank 0 waits at B0") != std::string::npos &&
                       t.problem.find("rank 1 waits at F1 for F1 of stage 0") != std::string::npos,
                   t.problem);
        check_true("  ... and the timeline checker refuses it", !check_timeline(t, lists).empty());
    }
    // the last rank swaps F0 and B0: its backward comes before its own forward
    {
        auto lists = all_lists(l);
        std::swap(lists[3][0], lists[3][1]);
        const PipelineTimeline t = simulate(lists);
        check_true("1f1b p=4 m=8, rank 3 runs B0 before F0: deadlock, the list checker refuses it",
                   t.problem.find("rank 3 waits at B0 for F0 of stage 3") != std::string::npos &&
                       check_list(lists[3], l.m, l.V) == "B0.0 comes before its forward",
                   t.problem);
    }
    // rank 0 swaps its adjacent F3 and B0 ("F0 F1 F2 B0 F3 F4 B1 ..."): it still runs, but rank 0 now waits
    // for B0 before sending F3 on, and the whole pipeline pays: the step takes 36 instead of 33, a bubble
    // of 1/3 instead of 3/11 (as simulated), which the grid's bubble check would refuse
    {
        auto lists = all_lists(l);
        std::swap(lists[0][3], lists[0][4]);
        const PipelineTimeline t = simulate(lists);
        check_true(
            "1f1b p=4 m=8, rank 0 swaps F3 and B0: runs, but the step takes 36, not 33",
            t.problem.empty() && t.step_ms == 36 &&
                std::fabs(t.bubble_fraction[0] - pipeline_bubble_fraction(l.schedule, l.p, l.m, l.V)) > kTimeTolerance,
            "step " + std::to_string(t.step_ms) + " ms, bubble " +
                std::to_string(t.problem.empty() ? t.bubble_fraction[0] : -1.0));
    }
    // backwards out of microbatch order on one rank: runs, but the list checker refuses it
    {
        auto lists = all_lists(l);
        std::swap(lists[3][1], lists[3][3]);  // rank 3: F0 B1 F1 B0 ...
        check_true("rank 3's backwards out of order: deadlock and refused by the list checker",
                   simulate(lists).problem.find("deadlock") == 0 && !check_list(lists[3], l.m, l.V).empty());
    }
    {
        auto lists = all_lists(l);
        lists[2].pop_back();  // rank 2 never runs B7
        const PipelineTimeline t = simulate(lists);
        check_true("a dropped action: the simulator and the list checker see it",
                   t.problem.find("rank 1 waits at B7 for B7 of stage 2 (rank 2)") != std::string::npos &&
                       !check_list(lists[2], l.m, l.V).empty(),
                   t.problem);
    }
    {
        auto lists = all_lists(l);
        lists[2].push_back(lists[2].back());
        const PipelineTimeline t = simulate(lists);
        check_true("a repeated action: the simulator and the list checker see it",
                   t.problem == "rank 2 runs B7 of stage 2 (rank 2) twice" &&
                       check_list(lists[2], l.m, l.V) == "B7.0 appears twice",
                   t.problem);
    }
    {
        auto lists = all_lists(l);
        lists[1][0].microbatch = 8;
        check_true("a microbatch that does not exist",
                   simulate(lists).problem == "rank 1 has F8.0: no such microbatch or virtual stage");
    }
    // a timeline edited to start an action before its input arrived, or on top of the one before
    {
        const auto lists = all_lists(l);
        PipelineTimeline t = simulate(lists);
        if (!check_true("the unbroken 1f1b p=4 m=8 runs", t.problem.empty(), t.problem)) return;
        t.ranks[2][0].start_ms -= 0.5;  // rank 2's F0 starts before rank 1's F0 has ended
        t.ranks[2][0].end_ms -= 0.5;
        check_true("the timeline checker: an action before its input", !check_timeline(t, lists).empty(),
                   check_timeline(t, lists));
        PipelineTimeline u = simulate(lists);
        u.ranks[0][5].start_ms = u.ranks[0][4].start_ms;
        u.ranks[0][5].end_ms = u.ranks[0][5].start_ms + kForwardMs;
        check_true("the timeline checker: two actions at once", !check_timeline(u, lists).empty(),
                   check_timeline(u, lists));
    }
    // the trace reader says no to broken JSON and to a trace that lost an event
    {
        const PipelineTimeline t = simulate(all_lists(l));
        std::string trace = pipeline_chrome_trace(t);
        Json ignored;
        check_true("the JSON reader accepts JSON",
                   parse_json("{\"a\": [1, -2.5e3, true, null, \"x\\\"y\"], \"b\": {}}", &ignored));
        bool all_refused = true;
        for (const std::string bad :
             {"{\"a\": 1,}", "{\"a\" 1}", "[1 2]", "{\"a\": 01x}", "{\"a\": \"open}", "{} {}", ""})
            all_refused &= !parse_json(bad, &ignored);
        check_true("the JSON reader refuses broken JSON", all_refused);
        check_true("the trace checker: a trace cut short", !check_trace(trace.substr(0, trace.size() - 4), t).empty());
        const size_t event = trace.find("{\"name\": \"B3\"");
        const size_t event_end = trace.find('\n', event);
        std::string missing = trace;
        missing.erase(event, event_end - event + 1);
        check_true("the trace checker: a trace without one event", !check_trace(missing, t).empty(),
                   check_trace(missing, t));
    }
}

// ----------------------------------------------------------------------------
// 5. what the executor takes from the lists

#include "test_pipeline_executor.cuh"

// ----------------------------------------------------------------------------

int write_trace(int argc, char** argv) {
    if (argc != 6 && argc != 7) fatal("usage: %s --trace SCHEDULE P M [V] OUT.json", argv[0]);
    const PipelineSchedule schedule = pipeline_schedule_from_name(argv[2]);
    const int p = atoi(argv[3]), m = atoi(argv[4]), V = argc == 7 ? atoi(argv[5]) : 1;
    const std::string path = argv[argc - 1];
    for (int r = 0; r < p; r++)
        printf("rank %d: %s\n", r, pipeline_describe(pipeline_actions(schedule, r, p, m, V)).c_str());
    const PipelineTimeline t = pipeline_simulate(schedule, p, m, V, kForwardMs, kBackwardMs);
    if (!t.problem.empty()) fatal("%s", t.problem.c_str());
    write_text_file(path, pipeline_chrome_trace(t));
    printf("%s p=%d m=%d V=%d: step %.4g ms, bubble %.6f (formula %.6f), peak activations on rank 0: %d -> %s\n",
           argv[2], p, m, V, t.step_ms, t.bubble_fraction[0], pipeline_bubble_fraction(schedule, p, m, V),
           t.peak_activations[0], path.c_str());
    return EXIT_SUCCESS;
}

int run(int argc, char** argv) {
    if (argc > 1 && std::string(argv[1]) == "--trace") return write_trace(argc, argv);
    if (argc > 1) fatal("usage: %s [--trace SCHEDULE P M [V] OUT.json]", argv[0]);
    test_by_hand();
    printf("every layout (failures only)\n");
    lab.quiet = true;
    test_grid();
    lab.quiet = false;
    test_between_schedules();
    test_synchronous_groups_timed();
    test_broken_input_is_caught();
    test_records();
    test_message_groups();
    test_communicator_orders();
    test_held_chunks();
    return lab_closing_line();
}
}  // namespace test_pipeline
