/*
Part 5 of dev/test/test_pipeline.cu (included there, after the layouts and checkers it uses): what the executor
(llmc/parallel/pipeline.h) takes from the action lists. On the same grid as part 2: the activation records (each
backward on its forward's record, none shared, a pool of pipeline_peak_activations), the weight records of
the schedules that split the backward, and the last stage's head records; the groups of messages before each action (pipeline_message_groups),
which must complete under NCCL's synchronous point-to-point semantics for every schedule and layout, while
the same operations issued one at a time deadlock 1f1b; and which parameter chunks each rank holds when the
stages differ in size. Each checker is shown a broken case too.
*/
#pragma once

// ----------------------------------------------------------------------------
// 5. what the executor takes from the lists: records, message groups, held chunks

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
        if (a.kind == PipelineAction::Weights) continue;  // W passes use weight records, not these
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

// The head records of the last stage's rank (pipeline_head_assignment): each forward of the last stage takes
// one that no other microbatch holds, its B and W use that same one, and its W (its forward, where the backward
// is whole) frees it; every other action uses none.
std::string check_head_records(const std::vector<PipelineAction>& actions, const std::vector<int>& head, int pool,
                               PipelineSchedule schedule, int rank, int p, int V) {
    const bool split = pipeline_splits_backward(schedule);
    std::vector<int> holder(pool, -1);  // per record: the microbatch whose forward holds it
    for (size_t i = 0; i < actions.size(); i++) {
        const PipelineAction& a = actions[i];
        const std::string label = pipeline_action_label(a, true);
        const bool last = pipeline_model_stage(schedule, rank, a.virtual_stage, p) == p * V - 1;
        const bool uses = last && (split || a.kind == PipelineAction::Forward);
        if (!uses) {
            if (head[i] != -1) return label + " uses head record " + std::to_string(head[i]) + ", it needs none";
            continue;
        }
        const int h = head[i];
        if (h < 0 || h >= pool) return label + " uses head record " + std::to_string(h) + ", outside the pool";
        if (a.kind == PipelineAction::Forward) {
            if (holder[h] != -1)
                return label + " takes head record " + std::to_string(h) + ", which microbatch " +
                       std::to_string(holder[h]) + " holds";
            holder[h] = a.microbatch;
        } else if (holder[h] != a.microbatch) {
            return label + " uses head record " + std::to_string(h) + ", not its forward's";
        }
        if (a.kind == (split ? PipelineAction::Weights : PipelineAction::Forward)) holder[h] = -1;
    }
    return "";
}

void test_records() {
    printf("activation records (pipeline_record_assignment)\n");
    lab.quiet = true;
    for (PipelineSchedule schedule : kSchedules) {
        const int passed_before = lab.passed, failed_before = lab.failed;
        const std::vector<ScheduleLayout> layouts = grid(schedule);
        for (const ScheduleLayout& l : layouts) {
            std::string wrong, pools, weight_pools, head_wrong, head_pools;
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
                int weight_pool = 0;
                pipeline_weight_record_assignment(actions, &weight_pool);
                const int weight_peak = pipeline_peak_weight_records(l.schedule, r, l.p, l.m, l.V);
                if (weight_pool != weight_peak)
                    weight_pools += " rank " + std::to_string(r) + ": " + std::to_string(weight_pool) + " not " +
                                    std::to_string(weight_peak);
                int head_pool = 0;
                const std::vector<int> head = pipeline_head_assignment(actions, l.schedule, r, l.p, l.V, &head_pool);
                const std::string head_problem = check_head_records(actions, head, head_pool, l.schedule, r, l.p, l.V);
                if (!head_problem.empty() && head_wrong.empty())
                    head_wrong = "rank " + std::to_string(r) + ": " + head_problem;
                const int head_peak = pipeline_peak_head_records(l.schedule, r, l.p, l.m, l.V);
                if (head_pool != head_peak)
                    head_pools += " rank " + std::to_string(r) + ": " + std::to_string(head_pool) + " not " +
                                  std::to_string(head_peak);
            }
            check_true(l.name() + ": each backward uses its forward's record, none used twice at once", wrong.empty(),
                       wrong);
            check_true(l.name() + ": the pool is pipeline_peak_activations records", pools.empty(), pools);
            check_true(l.name() + ": the weight records are pipeline_peak_weight_records", weight_pools.empty(),
                       weight_pools);
            check_true(l.name() + ": each last-stage pass uses its forward's head record, none shared", head_wrong.empty(),
                       head_wrong);
            check_true(l.name() + ": the head records are pipeline_peak_head_records", head_pools.empty(), head_pools);
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
    // the head checker says no: zb-h1 p=2 m=4 rank 1 ("F0 B0 F1 B1 W0 ...") with F1 given F0's head record
    const std::vector<PipelineAction> last_rank = pipeline_actions(PipelineSchedule::ZeroBubbleH1, 1, 2, 4, 1);
    int heads = 0;
    std::vector<int> head = pipeline_head_assignment(last_rank, PipelineSchedule::ZeroBubbleH1, 1, 2, 1, &heads);
    check_true("zb-h1 p=2 m=4 rank 1: head records 0 0 1 1 0, a pool of 2",
               heads == 2 && std::vector<int>(head.begin(), head.begin() + 5) == std::vector<int>{0, 0, 1, 1, 0},
               pipeline_describe(last_rank));
    head[2] = 0;
    const std::string taken = check_head_records(last_rank, head, heads, PipelineSchedule::ZeroBubbleH1, 1, 2, 1);
    check_true("the head checker: a forward takes a head record held", taken == "F1.0 takes head record 0, which "
               "microbatch 0 holds", taken);
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

// The structure that NCCL deadlocks on, as the executor once issued it: each result sent right after the action
// that made it, each input received right before the action that needs it (the mutation the checker must catch
// when its operations go one at a time).
std::vector<std::vector<std::vector<PipelineMessage>>> eager_message_groups(
    const std::vector<std::vector<PipelineAction>>& lists, PipelineSchedule schedule, int V) {
    const int p = (int)lists.size();
    std::vector<std::vector<std::vector<PipelineMessage>>> groups(p);
    for (int r = 0; r < p; r++) {
        groups[r].resize(lists[r].size() + 1);
        for (size_t i = 0; i < lists[r].size(); i++) {
            std::vector<PipelineMessage> sends, receives;
            pipeline_messages_of(schedule, r, p, p * V, i, lists[r][i], &sends, &receives);
            groups[r][i + 1].insert(groups[r][i + 1].begin(), sends.begin(), sends.end());
            groups[r][i].insert(groups[r][i].end(), receives.begin(), receives.end());
        }
    }
    return groups;
}

// The mutation: every message on the communicator of its neighbour link, as the executor once sent them (a
// two-rank communicator per pair (q, q+1), the wrap-around (p-1, 0) included, and under zbv one per chunk: the
// chunk going down the ranks and the one coming up).
std::vector<std::vector<std::vector<PipelineMessage>>> on_link_communicators(
    std::vector<std::vector<std::vector<PipelineMessage>>> groups, PipelineSchedule schedule) {
    const int p = (int)groups.size();
    for (int r = 0; r < p; r++)
        for (auto& group : groups[r])
            for (PipelineMessage& message : group) {
                const int sender = message.send ? r : message.peer, receiver = message.send ? message.peer : r;
                const int pair = p == 2 ? 0 : receiver == (sender + 1) % p ? sender : receiver;
                const int chunk = schedule == PipelineSchedule::ZeroBubbleV && message.from_stage >= p ? 1 : 0;
                message.communicator = 1 + chunk * p + pair;
            }
    return groups;
}

// Every schedule on p = 2..8 (the grid's layouts) under each order in which NCCL may run a group's
// communicators: the executor's groups (one communicator) must complete under all of them; the groups on the
// old per-link communicators are counted where they deadlock, and must deadlock somewhere.
void test_communicator_orders() {
    printf("groups run one communicator at a time (pipeline_check_message_groups under each order)\n");
    const PipelineCommOrder orders[] = {PipelineCommOrder::Hash, PipelineCommOrder::Reverse, PipelineCommOrder::Issue};
    int old_deadlocks_total = 0;
    for (PipelineSchedule schedule : kSchedules) {
        lab.quiet = true;
        const int failed_before = lab.failed;
        int layouts = 0, deadlocked[3] = {0, 0, 0};
        std::string example;
        for (const ScheduleLayout& l : grid(schedule)) {
            if (l.p < 2) continue;
            layouts++;
            const auto groups = pipeline_message_groups(all_lists(l), l.schedule, l.V);
            const auto old_groups = on_link_communicators(groups, schedule);
            for (int o = 0; o < 3; o++) {
                const std::string order = pipeline_comm_order_name(orders[o]);
                const std::string problem = pipeline_check_message_groups(groups, orders[o]);
                check_true(l.name() + ", " + order + " order: the groups complete", problem.empty(), problem);
                const std::string old = pipeline_check_message_groups(old_groups, orders[o]);
                if (old.find("deadlock") == 0) {
                    deadlocked[o]++;
                    if (example.empty()) example = l.name() + ", " + order + " order: " + old;
                } else {
                    check_true(l.name() + ", per-link communicators, " + order +
                               " order: complete or deadlock, never mispaired", old.empty(), old);
                }
            }
        }
        old_deadlocks_total += deadlocked[0] + deadlocked[1] + deadlocked[2];
        lab.quiet = false;
        printf("  %-12s %3d layouts (p 2..8) complete under hash, reverse and issue order: %s; on per-link "
               "communicators the layouts that deadlock: hash %d, reverse %d, issue %d\n",
               pipeline_schedule_name(schedule), layouts, lab.failed == failed_before ? "yes" : "NO", deadlocked[0],
               deadlocked[1], deadlocked[2]);
        if (!example.empty()) printf("    for example %s\n", example.c_str());
    }
    check_true("the mutation (per-link communicators) deadlocks under some order", old_deadlocks_total > 0);
}

void test_message_groups() {
    printf("groups of sends and receives (pipeline_message_groups) under synchronous semantics\n");
    lab.quiet = true;
    int ungrouped_deadlocks = 0, layouts_seen = 0;
    for (PipelineSchedule schedule : kSchedules) {
        const int passed_before = lab.passed, failed_before = lab.failed;
        for (const ScheduleLayout& l : grid(schedule)) {
            const auto lists = all_lists(l);
            const auto groups = pipeline_message_groups(lists, l.schedule, l.V);
            const std::string problem = pipeline_check_message_groups(groups);
            check_true(l.name() + ": the groups complete, paired in order", problem.empty(), problem);
            std::string late;
            for (int r = 0; r < l.p && late.empty(); r++) {
                int pool = 0;
                const std::vector<int> record_of = pipeline_record_assignment(lists[r], &pool);
                late = pipeline_check_send_buffers(lists[r], groups[r], record_of, l.schedule, r, l.p, l.V);
            }
            check_true(l.name() + ": every send held back still finds its data", late.empty(), late);
            layouts_seen++;
            ungrouped_deadlocks +=
                !pipeline_check_message_groups(eager_message_groups(lists, l.schedule, l.V), PipelineCommOrder::Hash, /*one_at_a_time=*/true)
                     .empty();
        }
        printf("  %-12s %d checks passed, %d failed\n", pipeline_schedule_name(schedule), lab.passed - passed_before,
               lab.failed - failed_before);
    }
    lab.quiet = false;
    printf("  each result sent at once, one operation at a time: %d of the %d layouts deadlock\n", ungrouped_deadlocks,
           layouts_seen);
    // the structure NCCL deadlocks on: 1f1b p=2 m=4, each send and receive alone
    const std::vector<std::vector<std::vector<PipelineMessage>>> one_f_one_b =
        eager_message_groups(all_lists({PipelineSchedule::OneFOneB, 2, 4, 1}), PipelineSchedule::OneFOneB, 1);
    const std::string alone = pipeline_check_message_groups(one_f_one_b, PipelineCommOrder::Hash, /*one_at_a_time=*/true);
    check_true("1f1b p=2 m=4, operations one at a time: both ranks wait in a send",
               alone == "deadlock: rank 0 waits to send the activations of microbatch 1 from stage 0 to 1; rank 1 "
                        "waits to send the gradient of microbatch 0 from stage 1 to 0",
               alone);
    check_true("1f1b p=2 m=4 rank 0: F0's send alone, then F1's send with B0's receive",
               one_f_one_b[0][1].size() == 1 && one_f_one_b[0][1][0].send && one_f_one_b[0][2].size() == 2 &&
                   one_f_one_b[0][2][0].send && !one_f_one_b[0][2][1].send && one_f_one_b[0][2][1].gradient);
    // the checker says no to messages paired out of order: rank 0's first two sends swapped
    std::vector<std::vector<std::vector<PipelineMessage>>> swapped = one_f_one_b;
    std::swap(swapped[0][1][0], swapped[0][2][0]);
    const std::string mispaired = pipeline_check_message_groups(swapped);
    check_true("the pairing checker: sends out of order", mispaired.find("mismatched messages") == 0, mispaired);
}

// Which chunks each rank holds (pipeline_held_chunks) for uneven stages: 9 layers as 3, 2, 2, 2 over p = 4, and
// as 2, 3, 2, 2 over p = 2 x V = 2 (rank 1: stages 1 and 3, layers 2-4 and 7-8, and the last stage's chunks).
void test_held_chunks() {
    printf("held chunks of uneven stages (pipeline_held_chunks)\n");
    auto text = [](const std::vector<char>& held) {
        std::string t;
        for (char c : held) t += c ? '1' : '0';
        return t;
    };
    // chunks: embeddings, blocks 0..8, final layernorm
    auto held = [&](PipelineSchedule schedule, int rank, int p, int V, const std::vector<int>& layers) {
        return text(pipeline_held_chunks(schedule, rank, p, V, layers, /*tied_head=*/true));
    };
    const PipelineSchedule loop = PipelineSchedule::OneFOneB, interleaved = PipelineSchedule::Interleaved,
                           v_shape = PipelineSchedule::ZeroBubbleV;
    check_true("p=4, 3,2,2,2: rank 0", held(loop, 0, 4, 1, {3, 2, 2, 2}) == "11110000000");
    check_true("p=4, 3,2,2,2: rank 1", held(loop, 1, 4, 1, {3, 2, 2, 2}) == "00001100000");
    check_true("p=4, 3,2,2,2: rank 3", held(loop, 3, 4, 1, {3, 2, 2, 2}) == "10000000111");
    check_true("p=2 V=2, 2,3,2,2: rank 0", held(interleaved, 0, 2, 2, {2, 3, 2, 2}) == "11100011000");
    check_true("p=2 V=2, 2,3,2,2: rank 1", held(interleaved, 1, 2, 2, {2, 3, 2, 2}) == "10011100111");
    // zbv: rank 0 holds stages 0 and 3 (the embeddings once, for both), rank 1 the middle stages 1 and 2
    check_true("zbv p=2, 2,3,2,2: rank 0", held(v_shape, 0, 2, 2, {2, 3, 2, 2}) == "11100000111");
    check_true("zbv p=2, 2,3,2,2: rank 1", held(v_shape, 1, 2, 2, {2, 3, 2, 2}) == "00011111000");
}
