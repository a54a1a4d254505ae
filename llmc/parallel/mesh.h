/*
The device mesh: which slice of the work each rank holds, and who it talks to about it.

The world's ranks are laid out on a 5-D integer grid

    world = dp_replicate x dp_shard x pp x cp x tp

with tp varying fastest, then cp, pp, dp_shard and dp_replicate:

    rank = (((dp_replicate_index * dp_shard + dp_shard_index) * pp + pp_index) * cp + cp_index) * tp + tp_index

so the ranks of one tensor-parallel group are neighbours (on one node, where the links are fastest) and
data-parallel replicas are furthest apart. What each axis does:
  dp_replicate  full copies of the model on different data (plain data parallelism, or the replicated
                dimension of hybrid sharding, HSDP)
  dp_shard      ranks on different data that share one copy of the parameters, gradients and optimizer state
                between them (ZeRO / FSDP)
  pp            pipeline stages: each holds a contiguous run of layers
  cp            context parallelism: each holds a slice of the sequence (ring attention or Ulysses)
  tp            tensor parallelism: each holds a slice of every weight matrix (Megatron)

A group "along an axis" is the set of ranks whose coordinates differ only on that axis; there is one
communicator per axis, and this rank's place in it is its coordinate on that axis. Two combined groups
serve the gradient:
  gradient  dp_replicate x dp_shard x cp: every rank holding the same parameters (same pp stage, same tp
            slice). Gradients are summed (or averaged) over exactly this group: the dp ranks saw different
            samples and the cp ranks different parts of the same sequences.
  shard     dp_shard x cp: the ranks that split parameters and optimizer state among themselves under
            ZeRO; cp ranks hold identical parameters, so they can share the shards too. Under HSDP the
            gradient is reduce-scattered over `shard`, then all-reduced over dp_replicate.
and one more the whole model:
  model     pp x tp: the ranks that hold different parts of one copy of the model (their stages, their
            slices); together they hold all of it (model.bin is put together over this group).
In every group, ranks keep their world order, so a combined group's rank is the mixed-radix number formed
by this rank's coordinates on the group's axes.
*/
#pragma once

#include <string>
#include "comm.h"

enum MeshAxis { DP_REPLICATE = 0, DP_SHARD = 1, PP = 2, CP = 3, TP = 4 };
constexpr int kMeshAxes = 5;
inline const char* mesh_axis_name(int axis) {
    static const char* names[kMeshAxes] = {"dp_replicate", "dp_shard", "pp", "cp", "tp"};
    return names[axis];
}

// The shape of the grid, in world-rank order (slowest axis first).
struct MeshLayout {
    int sizes[kMeshAxes] = {1, 1, 1, 1, 1};
};
inline MeshLayout mesh_layout(int dp_replicate, int dp_shard, int pp, int cp, int tp) {
    MeshLayout layout;
    layout.sizes[DP_REPLICATE] = dp_replicate;
    layout.sizes[DP_SHARD] = dp_shard;
    layout.sizes[PP] = pp;
    layout.sizes[CP] = cp;
    layout.sizes[TP] = tp;
    return layout;
}

struct Mesh {
    MeshLayout layout;
    int coords[kMeshAxes];           // this rank's place on each axis
    Communicator world;
    Communicator axis[kMeshAxes];    // the ranks that differ from this one only along that axis
    Communicator gradient;           // dp_replicate x dp_shard x cp
    Communicator shard;              // dp_shard x cp
    Communicator model;              // pp x tp
};

// ----------------------------------------------------------------------------
// grid arithmetic

inline int mesh_world_size(const MeshLayout& layout) {
    int product = 1;
    for (int a = 0; a < kMeshAxes; a++) product *= layout.sizes[a];
    return product;
}

inline void mesh_coords_of(const MeshLayout& layout, int rank, int coords[kMeshAxes]) {
    for (int a = kMeshAxes - 1; a >= 0; a--) {
        coords[a] = rank % layout.sizes[a];
        rank /= layout.sizes[a];
    }
}

inline int mesh_rank_of(const MeshLayout& layout, const int coords[kMeshAxes]) {
    int rank = 0;
    for (int a = 0; a < kMeshAxes; a++) rank = rank * layout.sizes[a] + coords[a];
    return rank;
}

// The rank of the data-parallel replica this rank belongs to, and how many there are: the data loader
// gives each one a different share of the batch (cp and tp ranks of one replica read the same samples).
inline int mesh_data_parallel_rank(const Mesh& mesh) {
    return mesh.coords[DP_REPLICATE] * mesh.layout.sizes[DP_SHARD] + mesh.coords[DP_SHARD];
}
inline int mesh_data_parallel_size(const Mesh& mesh) {
    return mesh.layout.sizes[DP_REPLICATE] * mesh.layout.sizes[DP_SHARD];
}

// ----------------------------------------------------------------------------
// layouts that cannot work: an empty string when fine, else the one line that says why

inline std::string mesh_layout_error(const MeshLayout& layout, int world_size) {
    char text[256];
    for (int a = 0; a < kMeshAxes; a++) {
        if (layout.sizes[a] < 1) {
            snprintf(text, sizeof(text), "mesh axis %s must be at least 1, not %d", mesh_axis_name(a), layout.sizes[a]);
            return text;
        }
    }
    long long product = 1;
    for (int a = 0; a < kMeshAxes; a++) product *= layout.sizes[a];
    if (product != world_size) {
        snprintf(text, sizeof(text), "mesh dp_replicate %d x dp_shard %d x pp %d x cp %d x tp %d = %lld ranks, "
                 "but the world has %d", layout.sizes[DP_REPLICATE], layout.sizes[DP_SHARD], layout.sizes[PP],
                 layout.sizes[CP], layout.sizes[TP], product, world_size);
        return text;
    }
    return "";
}

inline std::string mesh_model_error(const MeshLayout& layout, int num_layers, int num_heads) {
    const int tp = layout.sizes[TP], pp = layout.sizes[PP];
    char text[256];
    text[0] = '\0';
    if (num_heads % tp != 0) {
        snprintf(text, sizeof(text), "%d attention heads cannot be split over tp %d: heads must be a multiple of tp",
                 num_heads, tp);
    } else if (num_layers < pp) {
        snprintf(text, sizeof(text), "%d layers cannot be split into pp %d pipeline stages: each needs a layer",
                 num_layers, pp);
    }
    return text;
}

// Stops with one line if this model cannot be laid out on this mesh.
inline void mesh_check_model(const Mesh& mesh, int num_layers, int num_heads) {
    std::string error = mesh_model_error(mesh.layout, num_layers, num_heads);
    if (!error.empty()) fatal("%s", error.c_str());
}

// ----------------------------------------------------------------------------
// creating the communicators

// The group of ranks that agree with this one on every axis NOT in `member_axes` (a bit per axis).
// Ranks are keyed by world rank, so the group keeps world order.
// Its name (for the watchdog's error line) lists the axes after what the group is for: "tp",
// "shard (dp_shard x cp)".
inline Communicator mesh_group(Communicator& world, const MeshLayout& layout, const int coords[kMeshAxes],
                               unsigned member_axes, const std::string& purpose = "") {
    int color = 0;  // the mixed-radix number of the coordinates the group's members share
    std::string name;
    for (int a = 0; a < kMeshAxes; a++) {
        if (!(member_axes & (1u << a))) color = color * layout.sizes[a] + coords[a];
        else name += (name.empty() ? "" : " x ") + std::string(mesh_axis_name(a));
    }
    return comm_split(world, color, world.rank, purpose.empty() ? name : purpose + " (" + name + ")");
}

// Every rank calls this together. Stops with one line (on every rank) if the layout does not fit the world.
inline Mesh mesh_create(const Communicator& world, const MeshLayout& layout) {
    std::string error = mesh_layout_error(layout, world.size);
    if (!error.empty()) fatal("%s", error.c_str());
    Mesh mesh;
    mesh.layout = layout;
    mesh.world = world;
    mesh.world.bytes_sent = 0;
    mesh_coords_of(layout, world.rank, mesh.coords);
    for (int a = 0; a < kMeshAxes; a++) mesh.axis[a] = mesh_group(mesh.world, layout, mesh.coords, 1u << a);
    mesh.gradient = mesh_group(mesh.world, layout, mesh.coords, (1u << DP_REPLICATE) | (1u << DP_SHARD) | (1u << CP),
                               "gradient");
    mesh.shard = mesh_group(mesh.world, layout, mesh.coords, (1u << DP_SHARD) | (1u << CP), "shard");
    mesh.model = mesh_group(mesh.world, layout, mesh.coords, (1u << PP) | (1u << TP), "model");
    return mesh;
}

// The mesh shares the world's handle with the caller; this frees only the groups it made.
inline void mesh_destroy(Mesh& mesh) {
    for (int a = 0; a < kMeshAxes; a++) comm_destroy(mesh.axis[a]);
    comm_destroy(mesh.gradient);
    comm_destroy(mesh.shard);
    comm_destroy(mesh.model);
}

// ----------------------------------------------------------------------------
// traffic, for the per-step log: bytes this rank sent over all of the mesh's groups

inline uint64_t mesh_bytes_sent(const Mesh& mesh) {
    uint64_t total = mesh.world.bytes_sent + mesh.gradient.bytes_sent + mesh.shard.bytes_sent + mesh.model.bytes_sent;
    for (int a = 0; a < kMeshAxes; a++) total += mesh.axis[a].bytes_sent;
    return total;
}
inline void mesh_reset_bytes(Mesh& mesh) {
    mesh.world.bytes_sent = mesh.gradient.bytes_sent = mesh.shard.bytes_sent = mesh.model.bytes_sent = 0;
    for (int a = 0; a < kMeshAxes; a++) mesh.axis[a].bytes_sent = 0;
}

// ----------------------------------------------------------------------------
// the layout, as printed at startup: the sizes, and for small worlds which rank sits where

inline std::string mesh_describe(const MeshLayout& layout) {
    std::string text = "mesh: " + std::to_string(mesh_world_size(layout)) + " ranks =";
    for (int a = 0; a < kMeshAxes; a++)
        text += std::string(a ? " x " : " ") + mesh_axis_name(a) + " " + std::to_string(layout.sizes[a]);
    text += " (tp varies fastest)\n";
    const int world_size = mesh_world_size(layout);
    if (world_size > 64) return text;
    text += "  rank";
    for (int a = 0; a < kMeshAxes; a++) text += std::string("  ") + mesh_axis_name(a);
    text += "\n";
    for (int rank = 0; rank < world_size; rank++) {
        int coords[kMeshAxes];
        mesh_coords_of(layout, rank, coords);
        char cell[64];
        snprintf(cell, sizeof(cell), "  %4d", rank);
        text += cell;
        for (int a = 0; a < kMeshAxes; a++) {
            snprintf(cell, sizeof(cell), "  %*d", (int)strlen(mesh_axis_name(a)), coords[a]);
            text += cell;
        }
        text += "\n";
    }
    return text;
}

inline void mesh_print(const Mesh& mesh) {
    if (mesh.world.rank == 0) printf("%s", mesh_describe(mesh.layout).c_str());
}
