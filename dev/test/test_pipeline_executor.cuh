/*
Part 5 of dev/test/test_pipeline.cu (included there, after the layouts and checkers it uses): what the executor
(llmc/parallel/pipeline.h) takes from the action lists. On the same grid as part 2: the activation records (each
backward on its forward's record, none shared, a pool of pipeline_peak_activations); the gradients'
staging buffers (none reused while its send is in flight, and no deadlock when a send finishes only once
its receiver has taken the message, where the naive rule of waiting when the record is reused deadlocks
the interleaved schedule); each link's messages in one order at both ends; which parameter chunks each
rank holds. Each checker is shown a broken case too.
*/
#pragma once

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

// What each rank waits for in llmc/parallel/pipeline.h's pipeline_step: before action i, the gradients in the staging
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
