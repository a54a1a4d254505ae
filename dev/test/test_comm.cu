/*
Tests of the communication layer (llmc/parallel/comm.h) and the device mesh (llmc/parallel/mesh.h), run under
mpirun -np 1, 2, 4 ... on the CPU build (MPI), and on one GPU with the GPU build (NCCL).

Every rank fills its buffers with values that depend on its rank and the element index, and computes
the expected result of each collective on its own from the same formulas (no communication involved),
then compares. The values are chosen so that fp32 sums are exact (multiples of 1/64 well inside 2^24),
which makes sums bit-exact; for bf16 the inputs are 1 + k/128 (exactly representable) and their exact
sum needs more bits than bf16 has, so "rounded once at the end" is checked bit for bit. Maxima are exact
in any case; their inputs are permuted among the ranks and half of them negated, so the rank that holds
the maximum, and its sign, change from element to element. Byte counters
are compared with the ring formulas, written out again here. Every mesh layout that fits the world is
built and each group's members are listed (gathered through the group itself) and checked to differ
from this rank only along the group's axes. Layouts and models that cannot work are run in a forked
child (which makes no MPI call) and must stop with one line and a non-zero status. Launcher detection
is a function of the environment: a table of environments (mpirun, srun steps, sbatch scripts, torchrun,
contradictions) is checked against the launcher, ranks and error each must give. On 2 and 4 ranks the world
is also a cp group for grouped-query attention (fewer K/V heads than query heads) through the ring and
Ulysses, against the whole sequences on one rank: the message layouts of llmc/parallel/context_parallel.h
with K/V heads of their own width, which the model's runs (as many K/V heads as query heads) do not reach.
Each rank checks; rank 0 prints the sum over ranks as `N passed, M failed`.
*/
#include <string>
#include <vector>
#include <sys/wait.h>
#include "../lab/lab.h"
#include "../../llmc/parallel/mesh.h"
#include "../../llmc/parallel/context_parallel.h"

namespace test_comm {  // one suite of dev/test/host_suites.cu; dev/test/test_comm_gpu.cu for nvcc

static int world_rank = 0;

// every rank checks; only failures are printed (lab.quiet), named with the rank
static void check(const std::string& name, bool condition, const std::string& detail = "") {
    check_true("rank " + std::to_string(world_rank) + ": " + name, condition, detail);
}

// ----------------------------------------------------------------------------
// device buffers filled from and read back to host vectors

template <typename T>
struct Buffer {
    T* ptr = nullptr;
    size_t count = 0;
    explicit Buffer(size_t n) : count(n) { cudaCheck(cudaMalloc(&ptr, n * sizeof(T))); }
    Buffer(const std::vector<float>& values) : Buffer(values.size()) { upload(values); }
    ~Buffer() { cudaCheck(cudaFree(ptr)); }
    void upload(const std::vector<float>& values) {
        std::vector<T> host(values.size());
        for (size_t i = 0; i < values.size(); i++) host[i] = (T)values[i];
        cudaCheck(cudaMemcpy(ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    }
    std::vector<float> download() const {
        cudaCheck(cudaDeviceSynchronize());
        std::vector<T> host(count);
        cudaCheck(cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
        std::vector<float> values(count);
        for (size_t i = 0; i < count; i++) values[i] = (float)host[i];
        return values;
    }
};

// the value element i of rank r contributes: exact in T, and sums of up to 64 ranks stay exact in fp32
template <typename T>
float contribution(int r, size_t i) {
    if constexpr (std::is_same_v<T, float>) return (float)((r + 1) * 1000 + (int)(i % 97)) / 64.0f;
    else return 1.0f + (float)((r * 37 + (int)i) % 128) / 128.0f;
}

template <typename T>
float round_to(float x) { return (float)(T)x; }

// what element i of rank r (of n) holds for a reduction: for Max the contributions are permuted among the
// ranks, so that the largest sits on a different rank for each element, and negated on odd elements, so
// that a maximum that starts from 0 (or keeps one rank's value) fails
template <typename T>
float reduction_input(Reduction op, int r, int n, size_t i) {
    if (op != Reduction::Max) return contribution<T>(r, i);
    const float value = contribution<T>((r + (int)(i % n)) % n, i);
    return i % 2 ? -value : value;
}

// the expected result for element i: the sum in double (exact for these inputs), rounded once; the mean;
// or the maximum, which is one of the inputs
template <typename T>
float reduction_result(Reduction op, int n, size_t i) {
    double sum = 0.0;
    float max = -INFINITY;
    for (int r = 0; r < n; r++) {
        sum += reduction_input<T>(op, r, n, i);
        max = std::max(max, reduction_input<T>(op, r, n, i));
    }
    if (op == Reduction::Max) return max;
    return round_to<T>(op == Reduction::Sum ? (float)sum : (float)sum / (float)n);
}

static const char* reduction_name(Reduction op) {
    return op == Reduction::Sum ? "sum" : op == Reduction::Average ? "average" : "max";
}

static std::string first_mismatch(const std::vector<float>& got, const std::vector<float>& want) {
    if (got.size() != want.size()) return "size " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
    for (size_t i = 0; i < got.size(); i++)
        if (got[i] != want[i])
            return "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", expected " +
                   std::to_string(want[i]);
    return "";
}
static void check_equal(const std::string& name, const std::vector<float>& got, const std::vector<float>& want) {
    std::string mismatch = first_mismatch(got, want);
    check(name, mismatch.empty(), mismatch);
}

// ----------------------------------------------------------------------------
// every collective on one communicator, for element type T

template <typename T>
void test_collectives(Communicator& comm, const std::string& group_name) {
    const int n = comm.size, me = comm.rank;
    const std::string label = group_name + " (" + std::to_string(n) + " ranks, " +
                              (std::is_same_v<T, float> ? "fp32" : "bf16") + "): ";
    const uint64_t s = sizeof(T);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));

    // all-reduce, sum, average and max; an odd count and a single element
    for (size_t count : {(size_t)1001, (size_t)1}) {
        for (Reduction op : {Reduction::Sum, Reduction::Average, Reduction::Max}) {
            std::vector<float> mine(count), want(count);
            for (size_t i = 0; i < count; i++) {
                mine[i] = reduction_input<T>(op, me, n, i);
                want[i] = reduction_result<T>(op, n, i);
            }
            Buffer<T> data(mine);
            comm.bytes_sent = 0;
            all_reduce(comm, data.ptr, count, op, stream);
            const std::string what = label + "all_reduce " + reduction_name(op) + " of " + std::to_string(count);
            check_equal(what, data.download(), want);
            check(what + " bytes = 2(n-1)/n * buffer", comm.bytes_sent == 2 * (n - 1) * count * s / n);
        }
    }

    // reduce-scatter: block b of the input of rank r holds reduction_input(r, b*count + i)
    {
        const size_t count = 37;
        for (Reduction op : {Reduction::Sum, Reduction::Average, Reduction::Max}) {
            std::vector<float> mine(n * count), want(count);
            for (size_t i = 0; i < n * count; i++) mine[i] = reduction_input<T>(op, me, n, i);
            for (size_t i = 0; i < count; i++) want[i] = reduction_result<T>(op, n, me * count + i);
            Buffer<T> in(mine), out(count);
            comm.bytes_sent = 0;
            reduce_scatter(comm, out.ptr, in.ptr, count, op, stream);
            const std::string what = label + "reduce_scatter " + reduction_name(op);
            check_equal(what, out.download(), want);
            check(what + " bytes = (n-1) * block", comm.bytes_sent == (uint64_t)(n - 1) * count * s);
            // in place: the output is this rank's own block of the input
            in.upload(mine);
            reduce_scatter(comm, in.ptr + me * count, in.ptr, count, op, stream);
            std::vector<float> all = in.download();
            check_equal(what + " in place", std::vector<float>(all.begin() + me * count, all.begin() + (me + 1) * count),
                        want);
        }
    }

    // all-gather, from a separate buffer and in place
    {
        const size_t count = 53;
        std::vector<float> mine(count), want(n * count);
        for (size_t i = 0; i < count; i++) mine[i] = contribution<T>(me, i);
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < count; i++) want[r * count + i] = contribution<T>(r, i);
        Buffer<T> in(mine), out(n * count);
        comm.bytes_sent = 0;
        all_gather(comm, out.ptr, in.ptr, count, stream);
        check_equal(label + "all_gather", out.download(), want);
        check(label + "all_gather bytes = (n-1) * block", comm.bytes_sent == (uint64_t)(n - 1) * count * s);
        std::vector<float> own_block_only(n * count, -7.0f);
        for (size_t i = 0; i < count; i++) own_block_only[me * count + i] = mine[i];
        out.upload(own_block_only);
        all_gather(comm, out.ptr, out.ptr + me * count, count, stream);
        check_equal(label + "all_gather in place", out.download(), want);
    }

    // broadcast from the first and from the last rank
    for (int root : {0, n - 1}) {
        const size_t count = 29;
        std::vector<float> mine(count), want(count);
        for (size_t i = 0; i < count; i++) {
            mine[i] = contribution<T>(me, i);
            want[i] = contribution<T>(root, i);
        }
        Buffer<T> data(mine);
        comm.bytes_sent = 0;
        broadcast(comm, data.ptr, count, root, stream);
        check_equal(label + "broadcast from rank " + std::to_string(root), data.download(), want);
        check(label + "broadcast bytes = (n-1)/n * buffer", comm.bytes_sent == (n - 1) * count * s / n);
    }

    // a ring shift with send_recv: receive the block of the rank before
    {
        const size_t count = 31;
        std::vector<float> mine(count), want(count);
        const int next = (me + 1) % n, previous = (me + n - 1) % n;
        for (size_t i = 0; i < count; i++) {
            mine[i] = contribution<T>(me, i);
            want[i] = contribution<T>(previous, i);
        }
        Buffer<T> out(mine), in(count);
        comm.bytes_sent = 0;
        send_recv(comm, out.ptr, next, in.ptr, previous, count, stream);
        check_equal(label + "send_recv ring shift", in.download(), want);
        check(label + "send_recv bytes = the block sent", comm.bytes_sent == count * s);
    }

    // point to point between pairs (0,1), (2,3), ...: each rank sends two blocks and receives the peer's two
    // at the same moment, in one group. The sends are synchronous (complete once the peer receives), so two
    // lone sends would wait for each other; the pairs of a group arrive in the order they were issued.
    if constexpr (std::is_same_v<T, floatX>) {
        if ((me ^ 1) < n) {
            const size_t count = 17;
            const int peer = me ^ 1;
            std::vector<float> mine(2 * count), want(2 * count);
            for (size_t i = 0; i < 2 * count; i++) {
                mine[i] = contribution<T>(me, i);
                want[i] = contribution<T>(peer, i);
            }
            Buffer<T> out(mine), in(2 * count);
            comm.bytes_sent = 0;
            send_and_receive({{PointToPoint::Send, &comm, out.ptr, count, peer},
                      {PointToPoint::Send, &comm, out.ptr + count, count, peer},
                      {PointToPoint::Receive, &comm, in.ptr, count, peer},
                      {PointToPoint::Receive, &comm, in.ptr + count, count, peer}}, stream);
            check_equal(label + "send_and_receive: both ranks send and receive at once, in issue order", in.download(), want);
            check(label + "send_and_receive counts the blocks sent, not those received", comm.bytes_sent == 2 * count * s);
        }
    }

    // all-to-all: block p of rank r's input is contribution(r, p*count + i), and it lands on rank p
    {
        const size_t count = 11;
        std::vector<float> mine(n * count), want(n * count);
        for (int p = 0; p < n; p++)
            for (size_t i = 0; i < count; i++) {
                mine[p * count + i] = contribution<T>(me, p * count + i);
                want[p * count + i] = contribution<T>(p, me * count + i);
            }
        Buffer<T> in(mine), out(n * count);
        comm.bytes_sent = 0;
        all_to_all(comm, out.ptr, in.ptr, count, stream);
        check_equal(label + "all_to_all", out.download(), want);
        check(label + "all_to_all bytes = (n-1) * block", comm.bytes_sent == (uint64_t)(n - 1) * count * s);
    }

    // all-to-all with blocks of any size (the dispatch of routed tokens): rank r sends (r + 2p) % 5 elements to
    // rank p, some of them none, element i of the block being contribution(r, 100 p + i)
    {
        auto block = [](int from, int to) { return (size_t)((from + 2 * to) % 5); };
        std::vector<size_t> send_counts(n), receive_counts(n);
        std::vector<float> mine, want;
        uint64_t expected_bytes = 0;
        for (int p = 0; p < n; p++) {
            send_counts[p] = block(me, p);
            receive_counts[p] = block(p, me);
            for (size_t i = 0; i < send_counts[p]; i++) mine.push_back(contribution<T>(me, 100 * p + i));
            for (size_t i = 0; i < receive_counts[p]; i++) want.push_back(contribution<T>(p, 100 * me + i));
            if (p != me) expected_bytes += send_counts[p] * s;
        }
        Buffer<T> in(mine), out(want.size());
        comm.bytes_sent = 0;
        all_to_all_v(comm, out.ptr, receive_counts, in.ptr, send_counts, stream);
        check_equal(label + "all_to_all_v: blocks of 0-4 elements", out.download(), want);
        check(label + "all_to_all_v bytes = the blocks sent to the other ranks", comm.bytes_sent == expected_bytes);
    }

    comm.bytes_sent = 0;
    barrier(comm, stream);
    check(label + "barrier sends nothing", comm.bytes_sent == 0);
    cudaCheck(cudaStreamDestroy(stream));
}

// In bf16, summing in fp32 and rounding once differs from rounding after every addition: show that the
// inputs above do tell the two apart (otherwise the bf16 checks would not prove the single rounding).
static void test_rounding_is_visible(int n) {
    if (n < 3 || sizeof(floatX) != 2) return;
    int differ = 0;
    for (size_t i = 0; i < 1001; i++) {
        float stepwise = round_to<floatX>(contribution<floatX>(0, i));
        double exact = contribution<floatX>(0, i);
        for (int r = 1; r < n; r++) {
            stepwise = round_to<floatX>(stepwise + contribution<floatX>(r, i));
            exact += contribution<floatX>(r, i);
        }
        differ += stepwise != round_to<floatX>((float)exact);
    }
    check("bf16 inputs tell one rounding from rounding per step", differ > 0, std::to_string(differ) + " differ");
}

// ----------------------------------------------------------------------------
// the mesh

// members of a group, by world rank, in group order: gathered through the group itself
static std::vector<int> group_members(Communicator& group) {
    Buffer<float> mine(std::vector<float>{(float)world_rank}), all(group.size);
    all_gather(group, all.ptr, mine.ptr, 1, nullptr);
    std::vector<float> values = all.download();
    return std::vector<int>(values.begin(), values.end());
}

// the members must be exactly the ranks that agree with this one off `member_axes`, in world order
static void check_group(const Mesh& mesh, Communicator& group, unsigned member_axes, const std::string& name) {
    const MeshLayout& layout = mesh.layout;
    std::vector<int> expected;
    for (int r = 0; r < mesh_world_size(layout); r++) {
        // decompose independently of mesh_coords_of: tp fastest, then cp, pp, dp_shard, dp_replicate
        int c[kMeshAxes], rest = r;
        c[TP] = rest % layout.sizes[TP]; rest /= layout.sizes[TP];
        c[CP] = rest % layout.sizes[CP]; rest /= layout.sizes[CP];
        c[PP] = rest % layout.sizes[PP]; rest /= layout.sizes[PP];
        c[DP_SHARD] = rest % layout.sizes[DP_SHARD]; rest /= layout.sizes[DP_SHARD];
        c[DP_REPLICATE] = rest;
        bool same_elsewhere = true;
        for (int a = 0; a < kMeshAxes; a++)
            if (!(member_axes & (1u << a)) && c[a] != mesh.coords[a]) same_elsewhere = false;
        if (same_elsewhere) expected.push_back(r);
    }
    std::vector<int> members = group_members(group);
    bool ok = members == expected && group.size == (int)expected.size() && members[group.rank] == world_rank;
    std::string listed;
    for (int m : members) listed += std::to_string(m) + " ";
    check(name, ok, "members " + listed);
}

static void test_layout(Communicator& world, const MeshLayout& layout) {
    Mesh mesh = mesh_create(world, layout);
    std::string name = "mesh";
    for (int a = 0; a < kMeshAxes; a++) name += " " + std::to_string(layout.sizes[a]);
    int coords[kMeshAxes], rest = world_rank;
    for (int a = kMeshAxes - 1; a >= 0; a--) coords[a] = rest % layout.sizes[a], rest /= layout.sizes[a];
    bool coords_ok = true;
    for (int a = 0; a < kMeshAxes; a++) coords_ok &= mesh.coords[a] == coords[a];
    check(name + ": coordinates", coords_ok && mesh_rank_of(layout, mesh.coords) == world_rank);
    for (int a = 0; a < kMeshAxes; a++) {
        check(name + ": " + mesh_axis_name(a) + " group rank is the coordinate",
              mesh.axis[a].size == layout.sizes[a] && mesh.axis[a].rank == mesh.coords[a]);
        check_group(mesh, mesh.axis[a], 1u << a, name + ": " + mesh_axis_name(a) + " group members");
    }
    check_group(mesh, mesh.gradient, (1u << DP_REPLICATE) | (1u << DP_SHARD) | (1u << CP), name + ": gradient group");
    check(name + ": gradient group size", mesh.gradient.size == layout.sizes[DP_REPLICATE] *
                                                                 layout.sizes[DP_SHARD] * layout.sizes[CP]);
    check_group(mesh, mesh.shard, (1u << DP_SHARD) | (1u << CP), name + ": shard group");
    check_group(mesh, mesh.model, (1u << PP) | (1u << TP), name + ": model group");
    check(name + ": model group rank", mesh.model.rank == coords[PP] * layout.sizes[TP] + coords[TP]);
    check(name + ": data-parallel rank", mesh_data_parallel_rank(mesh) ==
                                             coords[DP_REPLICATE] * layout.sizes[DP_SHARD] + coords[DP_SHARD] &&
                                         mesh_data_parallel_size(mesh) ==
                                             layout.sizes[DP_REPLICATE] * layout.sizes[DP_SHARD]);
    // traffic adds up over the groups, and resets
    const uint64_t before = mesh_bytes_sent(mesh);
    Buffer<float> data(std::vector<float>(10, 1.0f));
    all_reduce(mesh.gradient, data.ptr, 10, Reduction::Sum, nullptr);
    check(name + ": mesh traffic adds the gradient all-reduce",
          mesh_bytes_sent(mesh) - before == 2 * (uint64_t)(mesh.gradient.size - 1) * 40 / mesh.gradient.size);
    mesh_reset_bytes(mesh);
    check(name + ": mesh traffic resets", mesh_bytes_sent(mesh) == 0);
    mesh_destroy(mesh);
}

// every way of writing the world size as a product of five axis sizes
static std::vector<MeshLayout> all_layouts(int world_size) {
    std::vector<MeshLayout> layouts;
    std::vector<int> d;
    for (int k = 1; k <= world_size; k++) if (world_size % k == 0) d.push_back(k);
    for (int a : d) for (int b : d) for (int c : d) for (int e : d) {
        long long partial = (long long)a * b * c * e;
        if (world_size % partial != 0) continue;
        layouts.push_back(mesh_layout(a, b, c, e, (int)(world_size / partial)));
    }
    return layouts;
}

// ----------------------------------------------------------------------------
// launcher detection: a pure function of the environment, checked over a table of environments

struct LaunchCase {
    const char* name;
    std::vector<std::pair<const char*, const char*>> environment;
    Launcher launcher;
    int rank, size, local_rank;
    const char* error;  // nullptr: must succeed; else a part of the expected message
};

static void test_launcher_detection() {
    // what Slurm sets around a program: a job of 8 tasks; srun adds the step's variables
    const std::vector<std::pair<const char*, const char*>> job = {
        {"SLURM_JOB_ID", "4242"}, {"SLURM_NTASKS", "8"}, {"SLURM_NPROCS", "8"}, {"SLURM_PROCID", "0"},
        {"SLURM_LOCALID", "0"}};
    auto in_job = [&](std::vector<std::pair<const char*, const char*>> extra) {
        std::vector<std::pair<const char*, const char*>> all = job;
        for (auto& variable : extra) {
            bool replaced = false;
            for (auto& existing : all)
                if (strcmp(existing.first, variable.first) == 0) existing.second = variable.second, replaced = true;
            if (!replaced) all.push_back(variable);
        }
        return all;
    };
    const std::vector<std::pair<const char*, const char*>> srun_step_of_4 = in_job(
        {{"SLURM_STEP_ID", "0"}, {"SLURM_STEPID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"}, {"SLURM_NTASKS", "4"},
         {"SLURM_PROCID", "3"}, {"SLURM_LOCALID", "1"}});
    auto with = [](std::vector<std::pair<const char*, const char*>> base,
                   std::vector<std::pair<const char*, const char*>> extra) {
        base.insert(base.end(), extra.begin(), extra.end());
        return base;
    };
    const std::vector<LaunchCase> cases = {
        {"nothing: one process", {}, Launcher::Single, 0, 1, 0, nullptr},
        {"mpirun -np 4", {{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "2"}}, Launcher::Mpi, 2, 4, 0,
         nullptr},
        {"mpirun -np 1", {{"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "0"}}, Launcher::Mpi, 0, 1, 0,
         nullptr},
        {"srun step of 4 tasks", srun_step_of_4, Launcher::Srun, 3, 4, 1, nullptr},
        {"srun step, old SLURM_STEPID only",
         {{"SLURM_STEPID", "2"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "1"}}, Launcher::Srun, 1, 2, 0,
         nullptr},
        {"sbatch script with SLURM_NTASKS=8, no step: one process", job, Launcher::Single, 0, 1, 0, nullptr},
        {"salloc's interactive step (a Slurm step id): one process",
         in_job({{"SLURM_STEP_ID", "4294967290"}, {"SLURM_STEP_NUM_TASKS", "2"}}), Launcher::Single, 0, 1, 0,
         nullptr},
        {"torchrun", {{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}},
         Launcher::Torchrun, 5, 8, 1, nullptr},
        {"torchrun started by srun (one per node)",
         with(in_job({{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_PROCID", "1"}}),
              {{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}}),
         Launcher::Torchrun, 5, 8, 1, nullptr},
        {"mpirun -np 4 inside a one-task srun step",
         with(in_job({{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "1"}}), {{"OMPI_COMM_WORLD_SIZE", "4"}}),
         Launcher::Mpi, 0, 4, 0, nullptr},
        {"srun --mpi=pmi2, 4 tasks", with(srun_step_of_4, {{"PMI_SIZE", "4"}, {"PMI_RANK", "3"}}), Launcher::Mpi,
         3, 4, 0, nullptr},
        {"srun --mpi=pmix, 4 tasks: MPI, the step's size expected", with(srun_step_of_4, {{"PMIX_RANK", "3"}}),
         Launcher::Mpi, 3, 4, 0, nullptr},
        {"PMIx alone: MPI, size from MPI_Init", {{"PMIX_RANK", "0"}}, Launcher::Mpi, 0, 0, 0, nullptr},
        {"an MPI world of 1 does not hide srun's 4", with(srun_step_of_4, {{"PMI_SIZE", "1"}}), Launcher::Srun, 3,
         4, 1, nullptr},
        // contradictions and bad values
        {"srun -n 2 mpirun -np 4", with(in_job({{"SLURM_STEP_ID", "1"}, {"SLURM_STEP_NUM_TASKS", "2"}}),
                                        {{"OMPI_COMM_WORLD_SIZE", "4"}}),
         Launcher::Mpi, 0, 0, 0, "contradictory launchers: MPI announces 4 ranks and srun"},
        {"MPI and torchrun of different sizes", {{"OMPI_COMM_WORLD_SIZE", "4"}, {"RANK", "0"}, {"WORLD_SIZE", "8"}},
         Launcher::Mpi, 0, 0, 0, "contradictory launchers"},
        {"RANK outside WORLD_SIZE", {{"RANK", "2"}, {"WORLD_SIZE", "2"}}, Launcher::Torchrun, 0, 0, 0,
         "RANK=2 of WORLD_SIZE=2"},
        {"WORLD_SIZE=0", {{"RANK", "0"}, {"WORLD_SIZE", "0"}}, Launcher::Torchrun, 0, 0, 0, "WORLD_SIZE=0 must be"},
        {"WORLD_SIZE without RANK", {{"WORLD_SIZE", "2"}}, Launcher::Single, 0, 0, 0, "WORLD_SIZE is set but RANK"},
        {"RANK that is not a number", {{"RANK", "one"}, {"WORLD_SIZE", "2"}}, Launcher::Single, 0, 0, 0,
         "RANK=one is not a count"},
        {"LOCAL_RANK outside LOCAL_WORLD_SIZE",
         {{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "4"}, {"LOCAL_WORLD_SIZE", "4"}}, Launcher::Torchrun, 0,
         0, 0, "LOCAL_RANK=4 of LOCAL_WORLD_SIZE=4"},
        {"SLURM_PROCID outside the step", in_job({{"SLURM_STEP_ID", "0"}, {"SLURM_STEP_NUM_TASKS", "4"},
                                                  {"SLURM_PROCID", "4"}}),
         Launcher::Srun, 0, 0, 0, "SLURM_PROCID=4 of SLURM_STEP_NUM_TASKS=4"},
        {"a step id without the step's task count", {{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "0"}},
         Launcher::Single, 0, 0, 0, "SLURM_STEP_NUM_TASKS is not"},
    };
    for (const LaunchCase& c : cases) {
        auto lookup = [&](const char* name) -> const char* {
            for (const auto& variable : c.environment)
                if (strcmp(variable.first, name) == 0) return variable.second;
            return nullptr;
        };
        const LaunchInfo info = detect_launcher(lookup);
        const std::string got = std::string(launcher_name(info.launcher)) + " rank " + std::to_string(info.rank) +
                                " of " + std::to_string(info.size) + ", local " + std::to_string(info.local_rank) +
                                (info.error.empty() ? "" : ", error: " + info.error);
        bool ok;
        if (c.error) {
            ok = info.error.find(c.error) != std::string::npos;
        } else {
            ok = info.error.empty() && info.launcher == c.launcher && info.rank == c.rank && info.size == c.size &&
                 info.local_rank == c.local_rank;
        }
        check(std::string("launcher: ") + c.name, ok, got);
    }
}

// ----------------------------------------------------------------------------
// failures that must stop the program with one line: run in a forked child that makes no MPI call

static Communicator* failing_world = nullptr;

static void create_oversized_mesh() { mesh_create(*failing_world, mesh_layout(1, 1, 1, 1, failing_world->size + 1)); }
static void create_mesh_with_zero_axis() { mesh_create(*failing_world, mesh_layout(failing_world->size, 1, 0, 1, 1)); }
static Mesh model_mesh(const MeshLayout& layout) {  // a mesh value for the model checks: no communicators needed
    Mesh mesh;
    mesh.layout = layout;
    return mesh;
}
static void heads_not_divisible_by_tp() { mesh_check_model(model_mesh(mesh_layout(1, 1, 1, 1, 5)), 12, 12); }
static void fewer_layers_than_pp() { mesh_check_model(model_mesh(mesh_layout(1, 1, 5, 1, 1)), 4, 12); }
// the cp axis's checks (llmc/parallel/context_parallel.h): cp, mode, split, seq_len, heads, tp
static void sequence_not_divisible_for_zigzag() {
    cp_check_layout(4, ContextParallelMode::Ring, SequenceSplit::Zigzag, 1020, 12, 1);
}
static void sequence_not_divisible_for_contiguous() {
    cp_check_layout(8, ContextParallelMode::Ulysses, SequenceSplit::Contiguous, 1020, 16, 1);
}
static void heads_not_divisible_for_ulysses() {
    cp_check_layout(4, ContextParallelMode::Ulysses, SequenceSplit::Zigzag, 1024, 12, 2);
}
static void wait_for_missing_id() {
    char id[128];
    share_through_file("/tmp/llmc_test_comm_never_written_" + std::to_string(getpid()), 1, id, sizeof(id), 0.2);
}
static std::string leftover_path;
static void publish_over_leftover() {
    char id[128] = {};
    share_through_file(leftover_path, 0, id, sizeof(id), 1.0);
}

static void test_failures(Communicator& world) {
    failing_world = &world;
    expect_failure("a mesh larger than the world is refused", create_oversized_mesh, "but the world has");
    expect_failure("a mesh axis of 0 is refused", create_mesh_with_zero_axis, "mesh axis pp must be at least 1");
    expect_failure("12 heads over tp 5 are refused", heads_not_divisible_by_tp, "multiple of tp");
    expect_failure("4 layers over pp 5 are refused", fewer_layers_than_pp, "each needs a layer");
    expect_failure("T=1020 over zigzag cp 4 is refused", sequence_not_divisible_for_zigzag, "multiple of 2*cp = 8");
    expect_failure("T=1020 over contiguous cp 8 is refused", sequence_not_divisible_for_contiguous,
                   "multiple of cp = 8");
    expect_failure("6 heads per tp rank over Ulysses cp 4 are refused", heads_not_divisible_for_ulysses,
                   "multiple of cp");
    check("a model that fits passes the checks",
          mesh_model_error(mesh_layout(2, 2, 4, 2, 2), 12, 12).empty() &&
          cp_layout_error(2, ContextParallelMode::Ring, SequenceSplit::Zigzag, 1024, 12, 2).empty() &&
          mesh_model_error(mesh_layout(1, 1, 2, 3, 2), 12, 12).empty() && mesh_model_error(mesh_layout(1, 1, 5, 1, 1), 12, 12).empty() &&
          cp_layout_error(3, ContextParallelMode::Ulysses, SequenceSplit::Contiguous, 1023, 12, 2).empty());
    expect_failure("a bootstrap file that never comes times out", wait_for_missing_id, "waited 0 s for");
    leftover_path = "/tmp/llmc_test_comm_leftover_" + std::to_string(getpid());
    FILE* file = open_file(leftover_path, "wb");
    close_file(file, leftover_path);
    expect_failure("rank 0 refuses a bootstrap file left by an earlier run", publish_over_leftover, "already exists");
    remove(leftover_path.c_str());
}

// rank 0 publishes 128 bytes through a file; every rank must read the same bytes
static void test_file_bootstrap(Communicator& world) {
    Buffer<float> token(std::vector<float>{(float)getpid()});  // rank 0's pid names the file for everyone
    broadcast(world, token.ptr, 1, 0, nullptr);
    const long owner = (long)token.download()[0];
    const std::string path = "/tmp/llmc_test_comm_id_" + std::to_string(owner);
    unsigned char id[128], expected[128];
    for (int i = 0; i < 128; i++) expected[i] = (unsigned char)((owner * 31 + i * 7) & 0xff);
    if (world.rank == 0) memcpy(id, expected, sizeof(id));
    else memset(id, 0, sizeof(id));
    share_through_file(path, world.rank, id, sizeof(id), 30.0);
    check("every rank reads rank 0's bytes through the file", memcmp(id, expected, sizeof(id)) == 0);
    barrier(world, nullptr);
    if (world.rank == 0) remove(path.c_str());
}

// ----------------------------------------------------------------------------
// grouped-query attention over the cp axis (llmc/parallel/context_parallel.h): every rank holds the same whole
// sequences and computes attention on them alone, then each runs its rows through the ring or Ulysses with
// fewer K/V heads than query heads. Ulysses runs the same kernels per head on whole sequences, so its out and
// dqkv rows must equal the whole-sequence ones bit for bit; the ring merges partial results (rounded to
// floatX in a BF16 build), so its rows must agree within 2% of the largest value of each part, far below
// what reading another head's keys or values would give.

// rows of a batch of B sequences of T rows (width values each) that this cp rank holds, chunk-major
static std::vector<float> cp_rows_of(const ContextParallel& cp, const std::vector<float>& whole, int B, int T,
                                     int width) {
    const int T_local = T / cp.size;
    std::vector<float> local((size_t)B * T_local * width);
    for (const SequenceChunk& chunk : cp_sequence_chunks(cp, B, T_local))
        for (int b = 0; b < B; b++)
            std::copy_n(&whole[((size_t)b * T + chunk.position) * width], (size_t)chunk.T * width,
                        &local[((size_t)chunk.first_row + (size_t)b * chunk.T) * width]);
    return local;
}

// the largest |got - want| over the columns [first, first + width) of rows `row_width` wide, relative to the
// largest |want| there
static double relative_difference(const std::vector<float>& got, const std::vector<float>& want, int row_width,
                                  int first, int width) {
    double difference = 0.0, largest = 0.0;
    for (size_t r = 0; r < got.size() / row_width; r++)
        for (int c = first; c < first + width; c++) {
            const size_t i = r * row_width + c;
            difference = std::max(difference, std::fabs((double)got[i] - want[i]));
            largest = std::max(largest, std::fabs((double)want[i]));
        }
    return largest > 0.0 ? difference / largest : difference;
}

static void test_grouped_attention(Communicator& world, ContextParallelMode mode, SequenceSplit split,
                                   AttentionHeads heads) {
    const int B = 2, T = 2 * world.size * 24;  // zigzag chunks of 24 rows (not a multiple of either tile)
    const int W = heads.qkv_columns(), Cq = heads.q_columns();
    const std::string name = std::string(cp_mode_name(mode)) + " " + cp_split_name(split) + " cp " +
                             std::to_string(world.size) + ", " + std::to_string(heads.q_heads) + " query heads over " +
                             std::to_string(heads.kv_heads) + " K/V heads";
    lab.seed = 20250;  // the same sequences on every rank
    std::vector<float> qkv = random_floats((size_t)B * T * W);
    for (size_t r = 0; r < (size_t)B * T; r++)
        for (int c = 0; c < Cq + heads.kv_columns(); c++) qkv[r * W + c] *= 3.0f;  // peaked softmax, as the lab's
    qkv = round_to_floatX(qkv);
    const std::vector<float> dout = round_to_floatX(random_floats((size_t)B * T * Cq));

    // the whole sequences on this rank alone
    Buffer<floatX> qkv_d(qkv), dout_d(dout), out_d((size_t)B * T * Cq), dqkv_d((size_t)B * T * W);
    Buffer<float> lse_d((size_t)B * heads.q_heads * T), D_d((size_t)B * heads.q_heads * T);
    attention_forward(out_d.ptr, lse_d.ptr, qkv_d.ptr, B, T, heads, nullptr);
    attention_backward(dqkv_d.ptr, D_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr, B, T, heads, nullptr);

    // this rank's rows over the cp axis
    ContextParallel cp;
    cp.size = world.size;
    cp.rank = world.rank;
    cp.mode = mode;
    cp.split = split;
    cp.group = &world;
    const int T_local = T / cp.size;
    const size_t N = (size_t)B * T_local;
    cp_create(cp, B, T_local, heads);
    const std::vector<float> want_out = cp_rows_of(cp, out_d.download(), B, T, Cq);
    const std::vector<float> want_dqkv = cp_rows_of(cp, dqkv_d.download(), B, T, W);
    Buffer<floatX> local_qkv(cp_rows_of(cp, qkv, B, T, W)), local_dout(cp_rows_of(cp, dout, B, T, Cq));
    Buffer<floatX> local_out(N * Cq), local_dqkv(N * W);
    Buffer<float> local_lse(N * heads.q_heads), local_D(N * heads.q_heads);
    cp_attention_forward(cp, local_out.ptr, local_lse.ptr, local_qkv.ptr, B, T_local, heads, nullptr);
    cp_attention_backward(cp, local_dqkv.ptr, local_D.ptr, local_dout.ptr, local_qkv.ptr, local_out.ptr,
                          local_lse.ptr, B, T_local, heads, nullptr);
    const std::vector<float> got_out = local_out.download(), got_dqkv = local_dqkv.download();
    cp_destroy(cp);

    if (mode == ContextParallelMode::Ulysses) {
        check_equal("grouped attention out, " + name, got_out, want_out);
        check_equal("grouped attention dqkv, " + name, got_dqkv, want_dqkv);
        return;
    }
    const double tolerance = 2e-2;
    const struct { const char* part; const std::vector<float>& got; const std::vector<float>& want; int row, first,
                   width; } parts[] = {
        {"out", got_out, want_out, Cq, 0, Cq},
        {"dq", got_dqkv, want_dqkv, W, 0, Cq},
        {"dk", got_dqkv, want_dqkv, W, Cq, heads.kv_columns()},
        {"dv", got_dqkv, want_dqkv, W, Cq + heads.kv_columns(), heads.kv_columns()},
    };
    for (const auto& p : parts) {
        const double difference = relative_difference(p.got, p.want, p.row, p.first, p.width);
        check(std::string("grouped attention ") + p.part + ", " + name, difference <= tolerance,
              "largest difference " + std::to_string(difference) + " of the largest value (tolerance 2%)");
    }
}

#ifdef LLMC_CPU
// NCCL's rules in the CPU build (llmc/parallel/cpu_nccl_rules.h, "The CPU build is as strict as NCCL"), on pairs of ranks
// (2q, 2q+1) and two communicators that join each pair, as zbv's two chunk links once did: the order in
// which a group's communicators run, that order in force, and the first uses of links and collectives.
static void test_strict_rules(Communicator& world) {
    if (world.size < 2) return;
    if (world.rank == 0) printf("NCCL's rules: a group runs one communicator at a time (%s order), first uses\n",
                                getenv("LLMC_CPU_GROUP_ORDER") ? getenv("LLMC_CPU_GROUP_ORDER") : "hash");
    const bool paired = world.rank / 2 * 2 + 1 < world.size;  // an odd world leaves its last rank out
    const int pair = paired ? world.rank / 2 : kNotInGroup;
    Communicator a = comm_split(world, pair, world.rank, "pair, first"), b = comm_split(world, pair, world.rank, "pair, second"),
                 c = comm_split(world, pair, world.rank, "pair, third");
    if (!paired) {
        for (Communicator* comm : {&a, &b, &c}) comm_destroy(*comm);
        return;
    }
    const int peer = 1 - a.rank;
    // both ends compute each communicator's identity alike, and the two differ
    const std::vector<uint64_t> identities = all_gather_words(a, {a.identity, b.identity}, nullptr);
    check("both ends of a pair compute the same identities", identities[0] == identities[2] && identities[1] == identities[3]);
    check("two communicators with the same members differ in identity", identities[0] != identities[1]);
    const std::vector<PointToPoint> group = {{PointToPoint::Send, &a, nullptr, 1, peer},
                                             {PointToPoint::Receive, &b, nullptr, 1, peer},
                                             {PointToPoint::Send, &a, nullptr, 1, peer}};
    const bool a_first = a.identity < b.identity;
    const std::vector<std::vector<PointToPoint>> hash = sub_groups(group, GroupOrder::Hash),
                                                 reverse = sub_groups(group, GroupOrder::Reverse),
                                                 issue = sub_groups(group, GroupOrder::Issue);
    check("hash order: one sub-group per communicator, by identity, in issue order within",
          hash.size() == 2 && hash[0][0].comm == (a_first ? &a : &b) && hash[a_first ? 0 : 1].size() == 2);
    check("reverse order: the other way round", reverse.size() == 2 && reverse[0][0].comm == hash[1][0].comm);
    check("issue order: as the group first names them", issue.size() == 2 && issue[0][0].comm == &a);
    // A structure that completes only when the sender's first communicator runs first: the even end sends x
    // on `first` and receives y on `second` in one group; the odd end receives x, and only then, in a group
    // of its own, sends y. Run the other way round, the even end would wait for y, which the odd end sends
    // only after receiving x (that deadlock is the pipeline's test with LLMC_FAULT_PER_LINK_P2P).
    const std::vector<std::vector<PointToPoint>> order = sub_groups(
        {{PointToPoint::Send, &a, nullptr, 1, peer}, {PointToPoint::Receive, &b, nullptr, 1, peer}}, cpu_group_order());
    Communicator& first = *order[0][0].comm;
    Communicator& second = *order[1][0].comm;
    const size_t count = 5;
    Buffer<floatX> x(std::vector<float>(count, 3.0f + world.rank)), y(std::vector<float>(count, 7.0f + world.rank));
    Buffer<floatX> got(count);
    if (a.rank == 0) {
        send_and_receive({{PointToPoint::Send, &first, x.ptr, count, peer},
                          {PointToPoint::Receive, &second, got.ptr, count, peer}}, nullptr);
        check("a group over two communicators, run in order, completes", got.download() == std::vector<float>(count, 7.0f + world.rank + 1));
    } else {
        send_and_receive({{PointToPoint::Receive, &first, got.ptr, count, peer}}, nullptr);
        check("the first communicator's message arrives", got.download() == std::vector<float>(count, 3.0f + world.rank - 1));
        send_and_receive({{PointToPoint::Send, &second, y.ptr, count, peer}}, nullptr);
    }
    check("after the first use the links are connected", !first_use(first.mpi, peer) && !first_use(second.mpi, peer));
    // the first use of a collective on a fresh communicator, and first uses that come late: the odd end
    // starts 0.2 s after the even one, which waits at its first use (a barrier, then a token each way)
    if (c.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    Buffer<float> sum(std::vector<float>{(float)c.rank + 1});
    all_reduce(c, sum.ptr, 1, Reduction::Sum, nullptr);
    check("the first collective on a new communicator waits for both and sums", sum.download() == std::vector<float>{3.0f});
    Buffer<floatX> back(count);
    if (c.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    send_recv(c, x.ptr, peer, back.ptr, peer, count, nullptr);
    check("send_recv's first use connects and exchanges", back.download() == std::vector<float>(count, 3.0f + world.rank + (peer > a.rank ? 1 : -1)));
    for (Communicator* comm : {&a, &b, &c}) comm_destroy(*comm);
}
#endif

int run(int, char**) {
    Communicator world = comm_init_world();
    world_rank = world.rank;
    lab.quiet = true;  // thousands of checks per rank: print failures only
    if (world.rank == 0) printf("test_comm: %d rank(s), %s build\n", world.size, PRECISION_NAME);

    if (world.rank == 0) printf("collectives over the world\n");
    test_collectives<float>(world, "world");
    test_collectives<floatX>(world, "world");
    test_rounding_is_visible(world.size);

    if (world.rank == 0) printf("mesh layouts\n");
    std::vector<MeshLayout> layouts = all_layouts(world.size);
    for (const MeshLayout& layout : layouts) test_layout(world, layout);
    check("layouts of the world enumerated", !layouts.empty());

    // collectives inside subgroups: a 2x2 hybrid-sharded mesh and tp 2 x dp 2 on 4 ranks, 2x2x2 on 8
    std::vector<MeshLayout> with_groups;
    if (world.size == 4) with_groups = {mesh_layout(2, 2, 1, 1, 1), mesh_layout(2, 1, 1, 1, 2)};
    if (world.size == 8) with_groups = {mesh_layout(2, 2, 1, 1, 2)};
    {
        for (const MeshLayout& layout : with_groups) {
            Mesh mesh = mesh_create(world, layout);
            mesh_print(mesh);
            for (int a = 0; a < kMeshAxes; a++) {
                if (layout.sizes[a] == 1) continue;
                test_collectives<float>(mesh.axis[a], mesh_axis_name(a));
                test_collectives<floatX>(mesh.axis[a], mesh_axis_name(a));
            }
            test_collectives<floatX>(mesh.gradient, "gradient");
            mesh_destroy(mesh);
        }
    }
    // a split that leaves ranks out: the even ranks form a group, the odd ones get none
    {
        Communicator evens = comm_split(world, world.rank % 2 == 0 ? 0 : kNotInGroup, world.rank, "even ranks");
        if (world.rank % 2 == 0) {
            check("a split's members form a group of the even ranks",
                  evens.size == (world.size + 1) / 2 && evens.rank == world.rank / 2);
            test_collectives<float>(evens, "even ranks");
        } else {
            check("a rank outside every group of a split gets no communicator",
                  evens.size == 0 && evens.mpi == MPI_COMM_NULL);
        }
        comm_destroy(evens);
    }
    // grouped-query attention over the cp axis: the world as one cp group
    if (world.size == 2 || world.size == 4) {
        if (world.rank == 0) printf("grouped-query attention over cp %d (ring, Ulysses)\n", world.size);
        const int cp = world.size;
        test_grouped_attention(world, ContextParallelMode::Ring, SequenceSplit::Zigzag, AttentionHeads{4, 1, 16});
        test_grouped_attention(world, ContextParallelMode::Ring, SequenceSplit::Contiguous, AttentionHeads{4, 2, 32});
        test_grouped_attention(world, ContextParallelMode::Ulysses, SequenceSplit::Zigzag,
                               AttentionHeads{4 * cp, cp, 16});
        test_grouped_attention(world, ContextParallelMode::Ulysses, SequenceSplit::Contiguous,
                               AttentionHeads{2 * cp, cp, 32});
    }
    std::string table = mesh_describe(mesh_layout(1, 2, 1, 1, 2));
    check("the printed layout lists every rank's coordinates",
          table.find("4 ranks = dp_replicate 1 x dp_shard 2 x pp 1 x cp 1 x tp 2") != std::string::npos &&
          table.find("     3             0         1   0   0   1") != std::string::npos, table);

#ifdef LLMC_CPU
    test_strict_rules(world);
#endif
    if (world.rank == 0) printf("launcher detection, bootstrap through a file, and failures\n");
    test_launcher_detection();
    test_file_bootstrap(world);
    test_failures(world);

    // the verdict, summed over ranks through the layer under test
    Buffer<float> counts(std::vector<float>{(float)lab.passed, (float)lab.failed});
    all_reduce(world, counts.ptr, 2, Reduction::Sum, nullptr);
    std::vector<float> totals = counts.download();
    if (world.rank == 0) printf("%d passed, %d failed\n", (int)totals[0], (int)totals[1]);
    const bool all_passed = totals[1] == 0.0f;
    comm_destroy(world);
    comm_finalize();
    return all_passed ? EXIT_SUCCESS : EXIT_FAILURE;
}
}  // namespace test_comm
