/*
Tests of the pipeline schedules (llmc/pipeline_schedule.h), without a model: the action lists, the simulator that
runs them, the bubble and memory formulas, the Chrome trace.

  1. small cases worked out by hand in the comments (action lists, start times, step time, bubble);
  2. every schedule on every layout of a grid (p = 1..8, m = 1..16, V = 1..4 for interleaved where
     p divides m): each rank's list holds every pass of its stages once, forward before backward, in
     microbatch order per stage; the simulation runs to the end; its timeline respects every dependency;
     its peak activations and bubble equal the formulas; the trace parses as JSON with one event per action;
  3. comparisons between schedules (gpipe and 1f1b: same bubble, 1f1b fewer records; interleaved: a
     smaller bubble), and the claims about the interleaved warm-up with and without send time;
  4. broken lists must be caught: an action swapped, dropped or repeated, a timeline moved, bad JSON.
     A checker that accepts everything would fail here.
  5. what the executor (llmc/pipeline.h) takes from the lists, on the same grid: the activation records
     (each backward on its forward's record, none shared, a pool of pipeline_peak_activations); the
     gradients' staging buffers (none reused while its send is in flight, and no deadlock when a send
     finishes only once its receiver has taken the message, where the naive rule of waiting when the
     record is reused deadlocks the interleaved schedule); each link's messages in one order at both
     ends; which parameter chunks each rank holds. Each checker is shown a broken case too.
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
#include "lab.h"
#include "../llmc/pipeline_schedule.h"

// the time model of the formulas: forward 1, backward 2 (per rank's share of the layers), free sends
constexpr double kForwardMs = 1.0, kBackwardMs = 2.0;
// Unit times divided by V <= 4 and summed over at most 2 m V = 128 actions per rank: every time is a
// multiple of 1/12 that binary floating point rounds at 1e-16 relative; 1e-12 leaves room for the sums.
constexpr double kTimeTolerance = 1e-12;

struct Layout {
    PipelineSchedule schedule;
    int p, m, V;
    std::string name() const {
        return std::string(pipeline_schedule_name(schedule)) + " p=" + std::to_string(p) + " m=" + std::to_string(m) +
               (schedule == PipelineSchedule::Interleaved ? " V=" + std::to_string(V) : "");
    }
};

std::vector<std::vector<PipelineAction>> all_lists(const Layout& l) {
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
    std::vector<int> last_forward(V, -1), last_backward(V, -1);
    for (size_t i = 0; i < actions.size(); i++) {
        const PipelineAction& a = actions[i];
        const std::string label = pipeline_action_label(a, true);
        if (a.microbatch < 0 || a.microbatch >= m || a.virtual_stage < 0 || a.virtual_stage >= V)
            return label + " does not exist";
        if (!seen.emplace(std::make_tuple((int)a.kind, a.microbatch, a.virtual_stage), (int)i).second)
            return label + " appears twice";
        std::vector<int>& last = a.kind == PipelineAction::Forward ? last_forward : last_backward;
        if (a.microbatch < last[a.virtual_stage]) return label + " comes after a later microbatch";
        last[a.virtual_stage] = a.microbatch;
        if (a.kind == PipelineAction::Backward &&
            !seen.count(std::make_tuple((int)PipelineAction::Forward, a.microbatch, a.virtual_stage)))
            return label + " comes before its forward";
    }
    if ((int)actions.size() != 2 * m * V)
        return std::to_string(actions.size()) + " actions, expected " + std::to_string(2 * m * V);
    return "";
}

// The timeline against its lists: each rank ran its list in order, one action at a time, each for its
// duration, and no action started before what it needed had ended.
std::string check_timeline(const PipelineTimeline& t, const std::vector<std::vector<PipelineAction>>& lists) {
    if (!t.problem.empty()) return t.problem;
    const int p = (int)lists.size(), V = t.V, S = p * V;
    std::map<std::tuple<int, int, int>, const PipelineEvent*> by_pass;  // (kind, microbatch, model stage)
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
            const double duration = (a.kind == PipelineAction::Forward ? kForwardMs : kBackwardMs) / V;
            if (std::fabs(e.end_ms - e.start_ms - duration) > kTimeTolerance) return where + ": wrong duration";
            if (i > 0 && e.start_ms < t.ranks[r][i - 1].end_ms - kTimeTolerance)
                return where + ": overlaps the one before";
            by_pass[std::make_tuple((int)a.kind, a.microbatch, pipeline_model_stage(r, a.virtual_stage, p))] = &e;
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
    check_true("names", pipeline_schedule_names() == std::vector<std::string>{"gpipe", "1f1b", "interleaved"} &&
                            pipeline_schedule_from_name("gpipe") == PipelineSchedule::GPipe &&
                            pipeline_schedule_from_name("1f1b") == PipelineSchedule::OneFOneB &&
                            pipeline_schedule_from_name("interleaved") == PipelineSchedule::Interleaved);
    expect_failure(
        "an unknown schedule name", [] { pipeline_schedule_from_name("zb-h1"); }, "'zb-h1': not a schedule");
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
    int first, end;
    pipeline_stage_layers(1, 1, 2, 2, 12, &first, &end);  // model stage 1*2+1 = 3 of 4: layers 9..11
    check_true("virtual stage 1 of rank 1 of 2, V=2, 12 layers: layers [9, 12)", first == 9 && end == 12);

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

std::vector<Layout> grid(PipelineSchedule schedule) {
    std::vector<Layout> layouts;
    for (int p = 1; p <= 8; p++)
        for (int m = 1; m <= 16; m++)
            for (int V = 1; V <= (schedule == PipelineSchedule::Interleaved ? 4 : 1); V++)
                if (schedule != PipelineSchedule::Interleaved || m % p == 0) layouts.push_back({schedule, p, m, V});
    return layouts;
}

void test_grid() {
    for (PipelineSchedule schedule :
         {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::Interleaved}) {
        const int passed_before = lab.passed, failed_before = lab.failed;
        const std::vector<Layout> layouts = grid(schedule);
        for (const Layout& l : layouts) {
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
                const PipelineTimeline t = pipeline_simulate_actions(interleaved_with_warmup(p, m, V, 1), "interleaved",
                                                                     m, V, kForwardMs, kBackwardMs);
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
        const PipelineTimeline shorter = pipeline_simulate_actions(interleaved_with_warmup(4, 16, 2, 1), "interleaved",
                                                                   16, 2, kForwardMs, kBackwardMs, send_ms);
        char detail[96];
        snprintf(detail, sizeof(detail), "standard %.4g ms, shorter warm-up %.4g ms", standard.step_ms,
                 shorter.step_ms);
        check_true("interleaved p=4 m=16 V=2, sends of 0.1 ms: the doubled warm-up is faster (53.9 vs 57.9)",
                   std::fabs(standard.step_ms - 53.9) < 1e-9 && std::fabs(shorter.step_ms - 57.9) < 1e-9, detail);
    }
}

// ----------------------------------------------------------------------------
// 4. broken input must be caught

void test_broken_input_is_caught() {
    printf("broken input is caught\n");
    const Layout l = {PipelineSchedule::OneFOneB, 4, 8, 1};
    auto simulate = [&](const std::vector<std::vector<PipelineAction>>& lists) {
        return pipeline_simulate_actions(lists, "1f1b", l.m, l.V, kForwardMs, kBackwardMs);
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
// 5. what the executor takes from the lists: records, gradient staging buffers, held chunks

using ActionLists = std::vector<std::vector<PipelineAction>>;

// The records of one rank's list (pipeline_record_assignment): each forward takes a record of the pool that
// no other (microbatch, virtual stage) holds, and its backward uses that same record, which is then free.
std::string check_records(const std::vector<PipelineAction>& actions, const std::vector<int>& record, int pool) {
    if (record.size() != actions.size())
        return std::to_string(record.size()) + " records for " + std::to_string(actions.size()) + " actions";
    std::vector<std::string> holder(pool);     // per record: the forward that holds it, "" while free
    std::map<std::pair<int, int>, int> taken;  // (microbatch, virtual stage) -> the record its forward took
    for (size_t i = 0; i < actions.size(); i++) {
        const PipelineAction& a = actions[i];
        const std::string label = pipeline_action_label(a, true);
        const int r = record[i];
        if (r < 0 || r >= pool)
            return label + " uses record " + std::to_string(r) + ", outside the pool of " + std::to_string(pool);
        const std::pair<int, int> key{a.microbatch, a.virtual_stage};
        if (a.kind == PipelineAction::Forward) {
            if (!holder[r].empty())
                return label + " takes record " + std::to_string(r) + ", which " + holder[r] + " holds";
            holder[r] = label;
            taken[key] = r;
        } else {
            const auto forward = taken.find(key);
            if (forward == taken.end()) return label + " has no forward before it";
            if (forward->second != r)
                return label + " uses record " + std::to_string(r) + ", its forward took " +
                       std::to_string(forward->second);
            holder[r].clear();
        }
    }
    return "";
}

// A message between neighbouring stages, named by the pass that sends it: forward (j, s) sends its output to
// stage s + 1, backward (j, s) the gradient of its input to stage s - 1.
struct Messages {
    int m, S;
    int id(PipelineAction::Kind kind, int j, int s) const { return ((int)kind * m + j) * S + s; }
    int count() const { return 2 * m * S; }
    std::string name(int id) const {
        const bool forward = id / (m * S) == PipelineAction::Forward;
        return std::string(forward ? "the output of F" : "the input gradient of B") + std::to_string(id / S % m) +
               " of stage " + std::to_string(id % S);
    }
};

// Per rank, per action (and one more for the end of the list): the messages this rank sent whose sends it
// waits for to finish there.
using SendWaits = std::vector<std::vector<std::vector<int>>>;

// Each rank's staging plan, as the executor makes it (pipeline_create).
std::vector<PipelineGradientSends> staging_plans(const ActionLists& lists, int m, int V) {
    std::vector<PipelineGradientSends> plans;
    for (int r = 0; r < (int)lists.size(); r++) plans.push_back(pipeline_gradient_sends(lists, r, m, V));
    return plans;
}

// What each rank waits for in llmc/pipeline.h's pipeline_step: before action i, the gradients in the staging
// buffers of finish_before[i]; before a forward, the output last sent from the record it takes; at the end,
// every send (pipeline_finish_sends). Without `staging`, the naive rule instead: a gradient is waited for
// before the next forward that takes the record of the backward that sent it (or at the end).
// Walking each list it checks a staging plan on its own: a buffer is handed to a new send only once the rank
// has waited for the one before, a wait names a buffer in flight, only a backward that sends a gradient gets
// a buffer, and none is in flight after the waits at the end.
std::string send_waits(const ActionLists& lists, int m, int V, const std::vector<PipelineGradientSends>* staging,
                       SendWaits* waits) {
    const int p = (int)lists.size(), S = p * V;
    const Messages messages{m, S};
    waits->assign(p, {});
    for (int r = 0; r < p; r++) {
        const std::vector<PipelineAction>& actions = lists[r];
        const size_t n = actions.size();
        std::vector<std::vector<int>>& wait = (*waits)[r];
        wait.assign(n + 1, {});
        int pool = 0;
        const std::vector<int> record = pipeline_record_assignment(actions, &pool);
        std::vector<int> output_of(pool, -1), gradient_of(pool, -1);  // per record: its last send of each kind
        const PipelineGradientSends* plan = staging ? &(*staging)[r] : nullptr;
        std::vector<int> in_buffer;  // per staging buffer: the message in flight from it, or -1
        if (plan) {
            if (plan->buffer.size() != n || plan->finish_before.size() != n + 1)
                return "rank " + std::to_string(r) + ": the plan's sizes do not match the list";
            in_buffer.assign(plan->buffers, -1);
        }
        const std::string rank = "rank " + std::to_string(r) + " ";
        for (size_t i = 0; i <= n; i++) {
            const std::string where = i < n ? "at " + pipeline_action_label(actions[i], true) : "at the end";
            if (plan)
                for (int b : plan->finish_before[i]) {
                    if (b < 0 || b >= plan->buffers || in_buffer[b] < 0)
                        return rank + "waits " + where + " for staging buffer " + std::to_string(b) +
                               ", which has no send in flight";
                    wait[i].push_back(in_buffer[b]);
                    in_buffer[b] = -1;
                }
            if (i == n) break;
            const PipelineAction& a = actions[i];
            const int s = pipeline_model_stage(r, a.virtual_stage, p), R = record[i];
            if (a.kind == PipelineAction::Forward) {
                for (int* last : {&output_of[R], &gradient_of[R]}) {
                    if (*last >= 0) wait[i].push_back(*last);
                    *last = -1;
                }
                if (s < S - 1) output_of[R] = messages.id(PipelineAction::Forward, a.microbatch, s);
                continue;
            }
            const int sent = s > 0 ? messages.id(PipelineAction::Backward, a.microbatch, s) : -1;
            if (!plan) {
                gradient_of[R] = sent;
                continue;
            }
            const int b = plan->buffer[i];
            if (sent < 0 && b != -1)
                return rank + "gives staging buffer " + std::to_string(b) + " " + where + ", which sends no gradient";
            if (sent < 0) continue;
            if (b < 0 || b >= plan->buffers)
                return rank + where + ": staging buffer " + std::to_string(b) + " does not exist";
            if (in_buffer[b] >= 0)
                return rank + "hands staging buffer " + std::to_string(b) + " " + where + " to a new send while " +
                       messages.name(in_buffer[b]) + " is still in flight from it";
            in_buffer[b] = sent;
        }
        for (int b = 0; b < (int)in_buffer.size(); b++)
            if (in_buffer[b] >= 0)
                return rank + "ends with " + messages.name(in_buffer[b]) + " in flight from staging buffer " +
                       std::to_string(b);
        for (int last : output_of) if (last >= 0) wait[n].push_back(last);   // pipeline_finish_sends
        for (int last : gradient_of) if (last >= 0) wait[n].push_back(last);
    }
    return "";
}

// Runs the lists with sends that finish only once their receiver has taken the message: a rank runs its
// next action when every send it waits for there has been taken and the message the action receives has
// been sent (a forward at stage s > 0 receives the output of stage s - 1, a backward at s < S - 1 the input
// gradient of stage s + 1); the action then takes that message and sends its own. A rank is through when it
// has run its list and the waits at the end. Every condition, once true, stays true, so the order in which
// the loop visits the ranks changes nothing. The messages between two ranks over one link are also taken in
// the order they were sent (check_link_order), so sends that queue behind each other on one stream change
// nothing either. Returns "" when every rank gets through, else "deadlock: " and what each stuck rank waits for.
std::string simulate_sends(const ActionLists& lists, int m, int V, const SendWaits& waits) {
    const int p = (int)lists.size(), S = p * V;
    const Messages messages{m, S};
    std::vector<char> sent(messages.count(), 0), taken(messages.count(), 0);
    // the message action a of rank r receives, and the one it sends (-1: none)
    auto receives = [&](int r, const PipelineAction& a) {
        const int s = pipeline_model_stage(r, a.virtual_stage, p);
        if (a.kind == PipelineAction::Forward) return s > 0 ? messages.id(a.kind, a.microbatch, s - 1) : -1;
        return s < S - 1 ? messages.id(a.kind, a.microbatch, s + 1) : -1;
    };
    auto sends = [&](int r, const PipelineAction& a) {
        const int s = pipeline_model_stage(r, a.virtual_stage, p);
        if (a.kind == PipelineAction::Forward) return s < S - 1 ? messages.id(a.kind, a.microbatch, s) : -1;
        return s > 0 ? messages.id(a.kind, a.microbatch, s) : -1;
    };
    std::vector<size_t> next(p, 0);
    std::vector<char> through(p, 0);
    for (bool progressed = true; progressed;) {
        progressed = false;
        for (int r = 0; r < p; r++)
            while (!through[r]) {
                const size_t i = next[r];
                bool ready = true;
                for (int w : waits[r][i]) ready &= taken[w] != 0;
                if (i == lists[r].size()) {
                    if (!ready) break;
                    through[r] = 1;
                    progressed = true;
                    break;
                }
                const PipelineAction& a = lists[r][i];
                const int in = receives(r, a);
                if (!ready || (in >= 0 && !sent[in])) break;
                if (in >= 0) taken[in] = 1;
                const int out = sends(r, a);
                if (out >= 0) sent[out] = 1;
                next[r]++;
                progressed = true;
            }
    }
    std::string stuck;
    for (int r = 0; r < p; r++) {
        if (through[r]) continue;
        const size_t i = next[r];
        std::string what;
        for (int w : waits[r][i])
            if (!taken[w]) what += (what.empty() ? "" : ", ") + messages.name(w) + " to be taken";
        if (i < lists[r].size()) {
            const int in = receives(r, lists[r][i]);
            if (in >= 0 && !sent[in]) what += (what.empty() ? "" : ", ") + messages.name(in) + " to be sent";
        }
        stuck += (stuck.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + " waits " +
                 (i < lists[r].size() ? "at " + pipeline_action_label(lists[r][i], true) : std::string("at the end")) +
                 " for " + what;
    }
    return stuck.empty() ? "" : "deadlock: " + stuck;
}

// NCCL pairs the sends and receives between two ranks over one communicator in the order each side posts
// them (no tags): on each link (activations, gradients), the order in which a rank sends to a neighbour must
// be the order in which the neighbour receives.
std::string check_link_order(const ActionLists& lists, int m, int V) {
    const int p = (int)lists.size(), S = p * V;
    const Messages messages{m, S};
    std::map<std::tuple<int, int, int>, std::vector<int>> sends, receipts;  // (link, from, to) -> messages
    for (int r = 0; r < p; r++)
        for (const PipelineAction& a : lists[r]) {
            const int s = pipeline_model_stage(r, a.virtual_stage, p), j = a.microbatch;
            if (a.kind == PipelineAction::Forward) {
                if (s > 0) receipts[{0, (s - 1) % p, r}].push_back(messages.id(PipelineAction::Forward, j, s - 1));
                if (s < S - 1) sends[{0, r, (s + 1) % p}].push_back(messages.id(PipelineAction::Forward, j, s));
            } else {
                if (s < S - 1) receipts[{1, (s + 1) % p, r}].push_back(messages.id(PipelineAction::Backward, j, s + 1));
                if (s > 0) sends[{1, r, (s - 1) % p}].push_back(messages.id(PipelineAction::Backward, j, s));
            }
        }
    if (sends.size() != receipts.size()) return "a link carries sends without receives, or receives without sends";
    for (const auto& [link, sent] : sends) {
        const auto [kind, from, to] = link;
        const auto received = receipts.find(link);
        if (received == receipts.end() || received->second != sent)
            return std::string(kind == 0 ? "activation" : "gradient") + " link from rank " + std::to_string(from) +
                   " to rank " + std::to_string(to) + ": sent and received in different orders";
    }
    return "";
}

void test_records() {
    printf("activation records (pipeline_record_assignment)\n");
    lab.quiet = true;
    for (PipelineSchedule schedule :
         {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::Interleaved}) {
        const int passed_before = lab.passed, failed_before = lab.failed;
        const std::vector<Layout> layouts = grid(schedule);
        for (const Layout& l : layouts) {
            std::string wrong, pools;
            for (int r = 0; r < l.p; r++) {
                const std::vector<PipelineAction> actions = pipeline_actions(l.schedule, r, l.p, l.m, l.V);
                int pool = 0;
                const std::vector<int> record = pipeline_record_assignment(actions, &pool);
                const std::string problem = check_records(actions, record, pool);
                if (!problem.empty() && wrong.empty()) wrong = "rank " + std::to_string(r) + ": " + problem;
                const int peak = pipeline_peak_activations(l.schedule, r, l.p, l.m, l.V);
                if (pool != peak)
                    pools += " rank " + std::to_string(r) + ": " + std::to_string(pool) + " not " +
                             std::to_string(peak);
            }
            check_true(l.name() + ": each backward uses its forward's record, none used twice at once", wrong.empty(),
                       wrong);
            check_true(l.name() + ": the pool is pipeline_peak_activations records", pools.empty(), pools);
        }
        printf("  %-12s %3zu layouts: %d checks passed, %d failed\n", pipeline_schedule_name(schedule), layouts.size(),
               lab.passed - passed_before, lab.failed - failed_before);
    }
    lab.quiet = false;
    // the checker says no: 1f1b p=4 m=8 rank 0 ("F0 F1 F2 F3 B0 F4 ...") with records 0 and 1 swapped at B0,
    // and with F4 given record 1, which F1 still holds
    const std::vector<PipelineAction> actions = pipeline_actions(PipelineSchedule::OneFOneB, 0, 4, 8, 1);
    int pool = 0;
    std::vector<int> record = pipeline_record_assignment(actions, &pool);
    check_true("1f1b p=4 m=8 rank 0: records 0 1 2 3 0 0, a pool of 4",
               pool == 4 && std::vector<int>(record.begin(), record.begin() + 6) == std::vector<int>{0, 1, 2, 3, 0, 0});
    std::vector<int> swapped = record;
    swapped[4] = 1;
    check_true("the record checker: a backward on another forward's record",
               check_records(actions, swapped, pool) == "B0.0 uses record 1, its forward took 0",
               check_records(actions, swapped, pool));
    std::vector<int> shared = record;
    shared[5] = 1;
    check_true("the record checker: a record taken while held",
               check_records(actions, shared, pool) == "F4.0 takes record 1, which F1.0 holds",
               check_records(actions, shared, pool));
    expect_failure(
        "a backward without its forward",
        [] {
            int ignored;
            pipeline_record_assignment({{PipelineAction::Forward, 0, 0}, {PipelineAction::Backward, 1, 0}}, &ignored);
        },
        "B1.0 has no forward before it");
}

void test_gradient_sends() {
    printf("gradient staging buffers (pipeline_gradient_sends), sends that finish when taken\n");
    lab.quiet = true;
    int interleaved_layouts = 0, naive_deadlocks = 0;
    for (PipelineSchedule schedule :
         {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB, PipelineSchedule::Interleaved}) {
        const int passed_before = lab.passed, failed_before = lab.failed;
        const std::vector<Layout> layouts = grid(schedule);
        for (const Layout& l : layouts) {
            const ActionLists lists = all_lists(l);
            const std::vector<PipelineGradientSends> plans = staging_plans(lists, l.m, l.V);
            SendWaits waits, naive;
            const std::string plan = send_waits(lists, l.m, l.V, &plans, &waits);
            check_true(l.name() + ": no staging buffer reused while its send is in flight", plan.empty(), plan);
            const std::string order = check_link_order(lists, l.m, l.V);
            check_true(l.name() + ": each link's messages in the same order at both ends", order.empty(), order);
            if (!plan.empty()) continue;
            const std::string run = simulate_sends(lists, l.m, l.V, waits);
            check_true(l.name() + ": every rank gets through its list (no deadlock)", run.empty(), run);
            send_waits(lists, l.m, l.V, nullptr, &naive);
            const std::string naive_run = simulate_sends(lists, l.m, l.V, naive);
            if (schedule != PipelineSchedule::Interleaved) {
                check_true(l.name() + ": the naive rule gets through too", naive_run.empty(), naive_run);
            } else {
                interleaved_layouts++;
                naive_deadlocks += !naive_run.empty();
            }
        }
        printf("  %-12s %3zu layouts: %d checks passed, %d failed\n", pipeline_schedule_name(schedule), layouts.size(),
               lab.passed - passed_before, lab.failed - failed_before);
    }
    lab.quiet = false;
    printf("  the naive rule (a gradient's send waited for when its record is taken again) deadlocks %d of the %d "
           "interleaved layouts\n", naive_deadlocks, interleaved_layouts);
    // the claim above pipeline_gradient_sends: the naive rule deadlocks interleaved p=2 m=4 V=2
    {
        const ActionLists lists = all_lists({PipelineSchedule::Interleaved, 2, 4, 2});
        SendWaits naive;
        send_waits(lists, 4, 2, nullptr, &naive);
        const std::string run = simulate_sends(lists, 4, 2, naive);
        check_true("interleaved p=2 m=4 V=2 under the naive rule: deadlock", run.find("deadlock: ") == 0, run);
    }
    // the buffers each rank needs, p=4 m=8, beside its records
    for (const Layout& l : {Layout{PipelineSchedule::GPipe, 4, 8, 1}, Layout{PipelineSchedule::OneFOneB, 4, 8, 1},
                            Layout{PipelineSchedule::Interleaved, 4, 8, 2},
                            Layout{PipelineSchedule::Interleaved, 4, 8, 4}}) {
        const std::vector<PipelineGradientSends> plans = staging_plans(all_lists(l), l.m, l.V);
        std::string staging, records;
        for (int r = 0; r < l.p; r++) {
            staging += " " + std::to_string(plans[r].buffers);
            records += " " + std::to_string(pipeline_peak_activations(l.schedule, r, l.p, l.m, l.V));
        }
        printf("  %-23s staging buffers per rank:%s   (records:%s)\n", l.name().c_str(), staging.c_str(),
               records.c_str());
    }

    // the checkers say no (the simulator's "deadlock" is shown by the naive rule above)
    {
        // 1f1b p=4 m=8 without rank 1's first wait for a gradient: its buffer is handed out again while the
        // send is in flight
        const Layout l = {PipelineSchedule::OneFOneB, 4, 8, 1};
        const ActionLists lists = all_lists(l);
        std::vector<PipelineGradientSends> plans = staging_plans(lists, l.m, l.V);
        std::vector<std::vector<int>>& finish = plans[1].finish_before;
        const auto first =
            std::find_if(finish.begin(), finish.end(), [](const std::vector<int>& b) { return !b.empty(); });
        if (first != finish.end()) first->erase(first->begin());
        SendWaits waits;
        const std::string problem = send_waits(lists, l.m, l.V, &plans, &waits);
        check_true("1f1b p=4 m=8, rank 1 skips its first wait: a buffer reused in flight",
                   problem.find("rank 1 hands staging buffer") == 0, problem);
    }
    {
        // rank 0 sends F1 before F0 while rank 1 receives F0 first
        ActionLists lists = all_lists({PipelineSchedule::GPipe, 2, 2, 1});
        std::swap(lists[0][0], lists[0][1]);
        check_true("the link order checker: F1 sent before F0, F0 received first",
                   !check_link_order(lists, 2, 1).empty(), check_link_order(lists, 2, 1));
    }
}

// Which chunks each rank holds (pipeline_held_chunks), for p <= 8, V <= 4 and L = S, 2S, 3S layers (S = p V
// stages, l = L / S layers each): block b on the rank of stage b / l, the embedding chunk on rank 0 (stage 0)
// and on the last stage's rank, the final layernorm on the last stage's rank only.
void test_held_chunks() {
    printf("held chunks (pipeline_held_chunks)\n");
    std::string wrong;
    int layouts = 0;
    for (int p = 1; p <= 8; p++)
        for (int V = 1; V <= 4; V++)
            for (int per_stage = 1; per_stage <= 3; per_stage++) {
                const int S = p * V, L = S * per_stage, last_rank = (S - 1) % p;
                const std::string at =
                    " p=" + std::to_string(p) + " V=" + std::to_string(V) + " L=" + std::to_string(L);
                std::vector<std::vector<char>> held;
                for (int r = 0; r < p; r++) held.push_back(pipeline_held_chunks(r, p, V, L));
                layouts++;
                for (int r = 0; r < p; r++)
                    if ((int)held[r].size() != L + 2) wrong += at + ": rank " + std::to_string(r) + " has " +
                                                               std::to_string(held[r].size()) + " flags";
                if (!wrong.empty()) continue;
                for (int chunk = 0; chunk < L + 2; chunk++) {
                    std::vector<int> holders;
                    for (int r = 0; r < p; r++)
                        if (held[r][chunk]) holders.push_back(r);
                    std::vector<int> want;
                    if (chunk == 0) want = p > 1 ? std::vector<int>{0, last_rank} : std::vector<int>{0};
                    else if (chunk == L + 1) want = {last_rank};
                    else want = {((chunk - 1) / per_stage) % p};
                    if (holders != want) wrong += at + ": chunk " + std::to_string(chunk) + " held by the wrong ranks";
                }
            }
    check_true("every block on its stage's rank, embeddings on ranks 0 and p-1, final chunk on p-1 (" +
                   std::to_string(layouts) + " layouts)",
               wrong.empty(), wrong.substr(0, 300));
    const std::vector<char> rank1 = pipeline_held_chunks(1, 2, 2, 8);  // stages 1 and 3: blocks 2-3 and 6-7
    check_true("p=2 V=2 L=8, rank 1: embeddings, blocks 2 3 6 7, final",
               rank1 == std::vector<char>{1, 0, 0, 1, 1, 0, 0, 1, 1, 1});
}
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

int main(int argc, char** argv) {
    if (argc > 1 && std::string(argv[1]) == "--trace") return write_trace(argc, argv);
    if (argc > 1) fatal("usage: %s [--trace SCHEDULE P M [V] OUT.json]", argv[0]);
    test_by_hand();
    printf("every layout (failures only)\n");
    lab.quiet = true;
    test_grid();
    lab.quiet = false;
    test_between_schedules();
    test_broken_input_is_caught();
    test_records();
    test_gradient_sends();
    test_held_chunks();
    printf("%d passed, %d failed\n", lab.passed, lab.failed);
    return lab.failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
