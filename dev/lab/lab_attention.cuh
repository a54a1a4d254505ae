/*
Kernel lab: fused causal attention (llmc/kernels/attention.cuh), forward and backward.

The reference forms each head's full T x T probability matrix in double precision (fine on the host at
these sizes) and follows the textbook formulas, so it shares nothing with the kernels' tiling or online
softmax. With grouped-query attention (fewer K/V heads than query heads) it reads K/V head h / G for query
head h and adds the G heads' terms into the gradient of their shared K/V head, as the chain rule does for
any tensor used G times; the kernels' per-group loop has no counterpart here. The backward pass is checked
on its own: it gets the reference forward's out and lse as inputs (out rounded to floatX, as the kernel
would store it), so a forward error cannot hide or cause a backward one.

Ring attention's kernels (pairs of blocks, the merge, the accumulating pair backward) are checked against
the whole-sequence kernels above, which the reference vouches for: a sequence is cut into query blocks and
key/value blocks, every query block visits every key block (partial forward, merge), and the merged out
and lse must match attention_forward on the whole sequence; then the pair backward, accumulated over all
pairs with D from the merged out, must match attention_backward on the whole sequence given the same
merged out and lse (again so that a forward difference cannot show up as a backward one). Each ring runs
twice: with its key blocks as qkv buffers (key_values_of) and as packed (B, Tk, 2 Ckv) copies of their k and v
columns with a packed dK/dV accumulator (packed_key_values, what context parallelism sends round the ring);
both must match the whole sequence, and each other bit for bit.

Shapes name their heads (NH query heads, KVH key/value heads, HS); the layouts are llmc/kernels/attention.cuh's:
qkv rows of Cq + 2 Ckv columns (Cq = NH HS, Ckv = KVH HS), out and dout rows of Cq, lse (B, NH, T).
*/
#pragma once

#include <memory>
#include "lab.h"
#include "../../llmc/kernels/attention.cuh"

// ----------------------------------------------------------------------------
// reference

// out (B, T, Cq) and lse (B, NH, T) from qkv (B, T, Cq + 2 Ckv); query head h reads K/V head h / G
// magnitude: the sum of the absolute terms behind each output, sum_j P[i][j] |V[j]| (what bounds the error
// of rounding P to bf16 before its product with V)
inline void attention_forward_reference(const std::vector<float>& qkv, int B, int T, const AttentionHeads& heads,
                                        std::vector<double>& out, std::vector<double>& lse,
                                        std::vector<double>& magnitude) {
    const int NH = heads.q_heads, HS = heads.head_size, C = heads.q_columns(), W = heads.qkv_columns();
    const double scale = 1.0 / std::sqrt((double)HS);
    out.assign((size_t)B * T * C, 0.0);
    magnitude.assign((size_t)B * T * C, 0.0);
    lse.assign((size_t)B * NH * T, 0.0);
    std::vector<double> scores(T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < T; i++) {
                const int k_column = C + h / heads.group() * HS, v_column = k_column + heads.kv_columns();
                const float* q = &qkv[((size_t)b * T + i) * W + h * HS];
                double max_score = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    const float* k = &qkv[((size_t)b * T + j) * W + k_column];
                    double dot = 0.0;
                    for (int d = 0; d < HS; d++) dot += (double)q[d] * k[d];
                    scores[j] = scale * dot;
                    max_score = std::max(max_score, scores[j]);
                }
                double sum = 0.0;
                for (int j = 0; j <= i; j++) sum += std::exp(scores[j] - max_score);
                double* o = &out[((size_t)b * T + i) * C + h * HS];
                double* m = &magnitude[((size_t)b * T + i) * C + h * HS];
                for (int j = 0; j <= i; j++) {
                    const double p = std::exp(scores[j] - max_score) / sum;
                    const float* v = &qkv[((size_t)b * T + j) * W + v_column];
                    for (int d = 0; d < HS; d++) {
                        o[d] += p * v[d];
                        m[d] += p * std::fabs(v[d]);
                    }
                }
                lse[((size_t)b * NH + h) * T + i] = max_score + std::log(sum);
            }
}

// dqkv (B, T, Cq + 2 Ckv) from dout (B, T, Cq); `out` is the forward output as the backward kernel sees it
// (floatX), used only for D = dout . out, exactly like the kernel. magnitude: the sums of absolute terms
// behind each gradient (scale sum |dS| |K| for dQ, scale sum |dS| |Q| for dK, sum P |dO| for dV; for a K/V
// head, over the query heads of its group too).
inline void attention_backward_reference(const std::vector<float>& qkv, const std::vector<float>& dout,
                                         const std::vector<float>& out, int B, int T, const AttentionHeads& heads,
                                         std::vector<double>& dqkv, std::vector<double>& magnitude) {
    const int NH = heads.q_heads, HS = heads.head_size, C = heads.q_columns(), W = heads.qkv_columns();
    const double scale = 1.0 / std::sqrt((double)HS);
    dqkv.assign((size_t)B * T * W, 0.0);
    magnitude.assign((size_t)B * T * W, 0.0);
    std::vector<double> P((size_t)T * T), dS((size_t)T * T);
    auto q_at = [&](int b, int t) { return &qkv[((size_t)b * T + t) * W]; };
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            // q columns of query head h; k and v columns of its K/V head h / G (both at k_head + a column
            // offset: k_head for K, k_head + Ckv for V)
            const int head = h * HS;
            const int k_head = C + h / heads.group() * HS, v_head = k_head + heads.kv_columns();
            // P, the full causal softmax matrix of this head
            for (int i = 0; i < T; i++) {
                double max_score = -INFINITY;
                for (int j = 0; j <= i; j++) {
                    double dot = 0.0;
                    for (int d = 0; d < HS; d++) dot += (double)q_at(b, i)[head + d] * q_at(b, j)[k_head + d];
                    P[(size_t)i * T + j] = scale * dot;
                    max_score = std::max(max_score, scale * dot);
                }
                double sum = 0.0;
                for (int j = 0; j <= i; j++) sum += std::exp(P[(size_t)i * T + j] - max_score);
                for (int j = 0; j <= i; j++) P[(size_t)i * T + j] = std::exp(P[(size_t)i * T + j] - max_score) / sum;
            }
            // dS = P * (dP - D), with dP = dO V^T and D = dO . O
            for (int i = 0; i < T; i++) {
                const float* g = &dout[((size_t)b * T + i) * C + head];
                const float* o = &out[((size_t)b * T + i) * C + head];
                double D = 0.0;
                for (int d = 0; d < HS; d++) D += (double)g[d] * o[d];
                for (int j = 0; j <= i; j++) {
                    double dP = 0.0;
                    for (int d = 0; d < HS; d++) dP += (double)g[d] * q_at(b, j)[v_head + d];
                    dS[(size_t)i * T + j] = P[(size_t)i * T + j] * (dP - D);
                }
            }
            // dQ = scale dS K, dK += scale dS^T Q, dV += P^T dO (+=: the K/V head's gradient sums its group's)
            for (int i = 0; i < T; i++)
                for (int j = 0; j <= i; j++) {
                    const double p = P[(size_t)i * T + j], ds = dS[(size_t)i * T + j];
                    const float* g = &dout[((size_t)b * T + i) * C + head];
                    double* dq = &dqkv[((size_t)b * T + i) * W + head];
                    double* dk = &dqkv[((size_t)b * T + j) * W + k_head];
                    double* dv = &dqkv[((size_t)b * T + j) * W + v_head];
                    double* mq = &magnitude[((size_t)b * T + i) * W + head];
                    double* mk = &magnitude[((size_t)b * T + j) * W + k_head];
                    double* mv = &magnitude[((size_t)b * T + j) * W + v_head];
                    for (int d = 0; d < HS; d++) {
                        dq[d] += scale * ds * q_at(b, j)[k_head + d];
                        dk[d] += scale * ds * q_at(b, i)[head + d];
                        dv[d] += p * g[d];
                        mq[d] += scale * std::fabs(ds * q_at(b, j)[k_head + d]);
                        mk[d] += scale * std::fabs(ds * q_at(b, i)[head + d]);
                        mv[d] += p * std::fabs(g[d]);
                    }
                }
        }
}

// where part 0 = q, 1 = k, 2 = v starts in a qkv row, and how many columns it has
inline int attention_part_start(const AttentionHeads& heads, int part) {
    return part == 0 ? 0 : heads.q_columns() + (part - 1) * heads.kv_columns();
}
inline int attention_part_width(const AttentionHeads& heads, int part) {
    return part == 0 ? heads.q_columns() : heads.kv_columns();
}

// the columns of one part (0 = q, 1 = k, 2 = v) of a (rows, Cq + 2 Ckv) matrix
template <class T>
std::vector<T> attention_qkv_part(const std::vector<T>& qkv, const AttentionHeads& heads, int part) {
    const size_t W = heads.qkv_columns(), rows = qkv.size() / W;
    const int start = attention_part_start(heads, part), width = attention_part_width(heads, part);
    std::vector<T> slice(rows * width);
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < width; c++) slice[r * width + c] = qkv[r * W + start + c];
    return slice;
}

// qkv with q and k in [-3, 3] (scaled scores with a standard deviation of about 3, so the softmax is peaked
// and the running maximum really moves from tile to tile) and v in [-1, 1]; rounded to floatX
inline std::vector<float> attention_random_qkv(int B, int T, const AttentionHeads& heads) {
    const size_t W = heads.qkv_columns();
    std::vector<float> qkv = random_floats((size_t)B * T * W);
    for (size_t r = 0; r < (size_t)B * T; r++)
        for (int c = 0; c < heads.q_columns() + heads.kv_columns(); c++) qkv[r * W + c] *= 3.0f;
    return round_to_floatX(qkv);
}

// "(B=2 T=37 NH=4 KVH=2 HS=64)"
inline std::string attention_shape_name(int B, int T, const AttentionHeads& heads) {
    char text[96];
    snprintf(text, sizeof(text), "(B=%d T=%d NH=%d KVH=%d HS=%d)", B, T, heads.q_heads, heads.kv_heads,
             heads.head_size);
    return text;
}

// ----------------------------------------------------------------------------
// checks

inline void lab_attention_shape(int B, int T, AttentionHeads heads, bool check_determinism) {
    const int NH = heads.q_heads, C = heads.q_columns(), W = heads.qkv_columns();
    const std::string shape = attention_shape_name(B, T, heads);

    const std::vector<float> qkv = attention_random_qkv(B, T, heads);
    const std::vector<float> dout = round_to_floatX(random_floats((size_t)B * T * C));
    std::vector<double> out_ref, lse_ref, dqkv_ref, out_magnitude, dqkv_magnitude;
    attention_forward_reference(qkv, B, T, heads, out_ref, lse_ref, out_magnitude);
    // what the backward kernel gets as its forward inputs: out stored as floatX, lse as fp32
    std::vector<float> out_seen(out_ref.begin(), out_ref.end());
    out_seen = round_to_floatX(out_seen);
    const std::vector<float> lse_seen(lse_ref.begin(), lse_ref.end());
    attention_backward_reference(qkv, dout, out_seen, B, T, heads, dqkv_ref, dqkv_magnitude);

    DeviceBuffer<floatX> qkv_d((size_t)B * T * W), out_d((size_t)B * T * C), dout_d((size_t)B * T * C);
    DeviceBuffer<floatX> dqkv_d((size_t)B * T * W);
    DeviceBuffer<float> lse_d((size_t)B * NH * T), workspace_d((size_t)B * NH * T);
    qkv_d.upload(qkv);
    dout_d.upload(dout);

    // Tolerances. FP32 (llmc/kernels/attention_cuda_cores.cuh): everything is fp32; scores, exp and sums over at most
    // T = 256 terms of size ~1 lose a few units of 2^-24 each, i.e. ~1e-6 absolute on outputs and gradients of
    // size ~1 (the exp of a score near 10 amplifies its relative error by 10): 2e-5 absolute + 1e-4 relative.
    // BF16 (llmc/kernels/attention_tensor_cores.cuh): the reference sees the same rounded inputs, and two roundings
    // remain. The result is stored in bf16 (8 mantissa bits: up to 2^-9 = 2e-3 relative; 4e-3 leaves a factor
    // 2). And P (or dS) is rounded to bf16 before its tensor-core product, which moves each term of the sum
    // by up to 2^-9 of its size: the output can be off by 2^-9 times the sum of the absolute terms (the
    // reference's magnitude), which can exceed the output itself when terms cancel. We allow 2^-8 times
    // that sum. lse stays fp32 in both builds: 2e-5 absolute + 1e-5 relative.
    const double atol = by_precision(2e-5, 2e-5), rtol = by_precision(1e-4, 4e-3);
    const double rounded_terms_tol = by_precision(0.0, 1.0 / 256);
    auto allowance = [&](const std::vector<double>& magnitude) {
        std::vector<double> allowed(magnitude.size());
        for (size_t i = 0; i < magnitude.size(); i++) allowed[i] = rounded_terms_tol * magnitude[i];
        return allowed;
    };

    // forward
    out_d.poison();
    lse_d.poison();
    attention_forward(out_d.ptr, lse_d.ptr, qkv_d.ptr, B, T, heads, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> out_got = out_d.download();
    check_close(std::string("attention_forward out ") + shape, out_got, out_ref, atol, rtol, allowance(out_magnitude));
    check_close(std::string("attention_forward lse ") + shape, lse_d.download(), lse_ref, 2e-5, 1e-5);
    if (check_determinism) {
        out_d.poison();
        attention_forward(out_d.ptr, lse_d.ptr, qkv_d.ptr, B, T, heads, 0);
        cudaCheck(cudaDeviceSynchronize());
        const std::vector<float> again = out_d.download();
        check_true(std::string("attention_forward deterministic ") + shape,
                   memcmp(again.data(), out_got.data(), again.size() * sizeof(float)) == 0, "two runs, same bits");
    }

    // backward, on the reference forward's out and lse
    out_d.upload(out_seen);
    lse_d.upload(lse_seen);
    dqkv_d.poison();
    workspace_d.poison();
    attention_backward(dqkv_d.ptr, workspace_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr, B, T, heads, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> dqkv_got = dqkv_d.download();
    const char* part_names[3] = {"dq", "dk", "dv"};
    const std::vector<double> dqkv_allowed = allowance(dqkv_magnitude);
    for (int part = 0; part < 3; part++)
        check_close(std::string("attention_backward ") + part_names[part] + " " + shape,
                    attention_qkv_part(dqkv_got, heads, part), attention_qkv_part(dqkv_ref, heads, part), atol,
                    rtol, attention_qkv_part(dqkv_allowed, heads, part));
    if (check_determinism) {
        dqkv_d.poison();
        workspace_d.poison();
        attention_backward(dqkv_d.ptr, workspace_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr, B, T, heads, 0);
        cudaCheck(cudaDeviceSynchronize());
        const std::vector<float> again = dqkv_d.download();
        check_true(std::string("attention_backward deterministic ") + shape,
                   memcmp(again.data(), dqkv_got.data(), again.size() * sizeof(float)) == 0, "two runs, same bits");
    }
}

// ----------------------------------------------------------------------------
// ring attention: pairs of blocks

// How a sequence is cut for ring attention: query blocks and key/value blocks (first position, length), and
// for each query block the order in which it meets the key blocks (the order of the ring's steps).
struct RingSplit {
    std::string name;
    std::vector<std::pair<int, int>> query_blocks, key_blocks;
    std::vector<std::vector<int>> visits;  // per query block: indices into key_blocks
};

// 2 cp chunks of `chunk` rows, rank r holds chunks r and 2cp-1-r (zigzag: every rank gets the same share of
// the causal work) or, contiguous, cp chunks with rank r holding chunk r. A query chunk of rank r meets at
// step s the chunks of rank (r - s) mod cp, its own first.
inline RingSplit ring_split(int cp, int chunk, bool zigzag) {
    RingSplit split;
    split.name = std::string(zigzag ? "zigzag" : "contiguous") + " cp=" + std::to_string(cp);
    const int chunks = zigzag ? 2 * cp : cp;
    for (int c = 0; c < chunks; c++) {
        split.query_blocks.push_back({c * chunk, chunk});
        split.key_blocks.push_back({c * chunk, chunk});
    }
    auto held = [&](int rank) {
        return zigzag ? std::vector<int>{rank, 2 * cp - 1 - rank} : std::vector<int>{rank};
    };
    split.visits.resize(chunks);
    for (int rank = 0; rank < cp; rank++)
        for (int query_chunk : held(rank))
            for (int step = 0; step < cp; step++)
                for (int key_chunk : held((rank - step + cp) % cp)) split.visits[query_chunk].push_back(key_chunk);
    return split;
}

// Query and key blocks cut at different places (lengths query_rows and key_rows, the last ones shorter):
// pairs with any offset, partly masked tiles off the diagonal, rows that see nothing of a pair.
inline RingSplit uneven_split(int T, int query_rows, int key_rows) {
    RingSplit split;
    split.name = "uneven q" + std::to_string(query_rows) + " k" + std::to_string(key_rows);
    for (int start = 0; start < T; start += query_rows) split.query_blocks.push_back({start, std::min(query_rows, T - start)});
    for (int start = 0; start < T; start += key_rows) split.key_blocks.push_back({start, std::min(key_rows, T - start)});
    std::vector<int> all_keys;  // last block first, so merges also meet a running row that has seen nothing
    for (int k = (int)split.key_blocks.size() - 1; k >= 0; k--) all_keys.push_back(k);
    split.visits.assign(split.query_blocks.size(), all_keys);
    return split;
}

// rows first .. first+rows-1 of each batch of a (B, T, width) matrix, and back
inline std::vector<float> sequence_rows(const std::vector<float>& whole, int B, int T, int width, int first, int rows) {
    std::vector<float> part((size_t)B * rows * width);
    for (int b = 0; b < B; b++)
        std::copy_n(&whole[((size_t)b * T + first) * width], (size_t)rows * width, &part[(size_t)b * rows * width]);
    return part;
}
inline void place_sequence_rows(std::vector<float>& whole, const std::vector<float>& part, int B, int T, int width,
                                int first, int rows) {
    for (int b = 0; b < B; b++)
        std::copy_n(&part[(size_t)b * rows * width], (size_t)rows * width, &whole[((size_t)b * T + first) * width]);
}
// the same for an lse-shaped (B, NH, T) array: rows are its last axis
inline void place_lse_rows(std::vector<float>& whole, const std::vector<float>& part, int B, int NH, int T, int first,
                           int rows) {
    for (int bh = 0; bh < B * NH; bh++)
        std::copy_n(&part[(size_t)bh * rows], rows, &whole[(size_t)bh * T + first]);
}
// copies the columns of `parts` (0 = q, 1 = k, 2 = v) of a block's qkv-layout rows into the whole sequence's
inline void place_qkv_parts(std::vector<float>& whole, const std::vector<float>& block, int B, int T,
                            const AttentionHeads& heads, int first, int rows, std::initializer_list<int> parts) {
    const size_t W = heads.qkv_columns();
    for (int b = 0; b < B; b++)
        for (int r = 0; r < rows; r++)
            for (int part : parts) {
                const int start = attention_part_start(heads, part);
                std::copy_n(&block[((size_t)b * rows + r) * W + start], attention_part_width(heads, part),
                            &whole[((size_t)b * T + first + r) * W + start]);
            }
}
// qkv-layout rows with the columns of the parts not in `kept` (0 = q, 1 = k, 2 = v) replaced by `fill`
inline std::vector<float> with_parts_filled(std::vector<float> rows, const AttentionHeads& heads,
                                            std::initializer_list<int> kept, float fill) {
    const size_t W = heads.qkv_columns();
    for (size_t r = 0; r < rows.size() / W; r++)
        for (int part = 0; part < 3; part++)
            if (std::find(kept.begin(), kept.end(), part) == kept.end())
                std::fill_n(&rows[r * W + attention_part_start(heads, part)], attention_part_width(heads, part), fill);
    return rows;
}

// the k and v columns of qkv-layout rows: the packed (rows, 2 Ckv) keys and values that a ring sends
inline std::vector<float> packed_key_value_rows(const std::vector<float>& qkv_rows, const AttentionHeads& heads) {
    const size_t W = heads.qkv_columns(), rows = qkv_rows.size() / W, packed_width = 2 * heads.kv_columns();
    std::vector<float> packed(rows * packed_width);
    for (size_t r = 0; r < rows; r++)
        std::copy_n(&qkv_rows[r * W + heads.q_columns()], packed_width, &packed[r * packed_width]);
    return packed;
}
// the reverse: packed (rows, 2 Ckv) rows as qkv-layout rows, with `fill` in their q columns
inline std::vector<float> qkv_rows_of_packed(const std::vector<float>& packed, const AttentionHeads& heads,
                                             float fill) {
    const size_t W = heads.qkv_columns(), packed_width = 2 * heads.kv_columns(), rows = packed.size() / packed_width;
    std::vector<float> qkv_rows(rows * W, fill);
    for (size_t r = 0; r < rows; r++)
        std::copy_n(&packed[r * packed_width], packed_width, &qkv_rows[r * W + heads.q_columns()]);
    return qkv_rows;
}

// What a ring computed, placed into whole-sequence arrays: the merged out (B, T, Cq) and lse (B, NH, T), and
// dqkv (B, T, Cq + 2 Ckv) as the pair backward accumulated it.
struct RingResult {
    std::vector<float> out, lse, dqkv;
};

// Runs the split's ring on qkv and dout: every query block meets every key block (partial forward, merge),
// then D from each merged block and the pair backward of every pair. With packed_keys the key blocks are
// (B, Tk, 2 Ckv) copies of their k and v columns and their dK, dV accumulate in that layout (what context
// parallelism sends round the ring); otherwise the key blocks are qkv buffers and dK, dV go to the k and v
// columns of a dqkv buffer. Checks on the way that pairs which see nothing say so and that the pair backward
// writes only where it should.
inline RingResult run_ring(const RingSplit& split, const std::vector<float>& qkv, const std::vector<float>& dout,
                           int B, int T, const AttentionHeads& heads, bool packed_keys, const std::string& shape) {
    const int NH = heads.q_heads, C = heads.q_columns(), W = heads.qkv_columns();
    const float nan = NAN;
    const size_t nq = split.query_blocks.size(), nk = split.key_blocks.size();
    const int key_width = packed_keys ? 2 * heads.kv_columns() : W;  // a key row's columns in either layout

    // The blocks on the device. Queries carry NaN in their k and v columns and keys (qkv layout) in their q
    // columns, so a kernel that read the wrong columns would show it; the gradient targets hold zeros where
    // the pair backward adds and NaN where it must not write.
    std::vector<std::unique_ptr<DeviceBuffer<floatX>>> q_qkv, out, partial_out, block_dout, dq, keys, dkv;
    std::vector<std::unique_ptr<DeviceBuffer<float>>> lse, partial_lse, D;
    for (const auto& [first, rows] : split.query_blocks) {
        q_qkv.emplace_back(new DeviceBuffer<floatX>((size_t)B * rows * W));
        q_qkv.back()->upload(with_parts_filled(sequence_rows(qkv, B, T, W, first, rows), heads, {0}, nan));
        out.emplace_back(new DeviceBuffer<floatX>((size_t)B * rows * C));
        out.back()->poison();
        partial_out.emplace_back(new DeviceBuffer<floatX>((size_t)B * rows * C));
        lse.emplace_back(new DeviceBuffer<float>((size_t)B * NH * rows));
        lse.back()->upload(std::vector<float>((size_t)B * NH * rows, -INFINITY));  // nothing seen yet
        partial_lse.emplace_back(new DeviceBuffer<float>((size_t)B * NH * rows));
        block_dout.emplace_back(new DeviceBuffer<floatX>((size_t)B * rows * C));
        block_dout.back()->upload(sequence_rows(dout, B, T, C, first, rows));
        D.emplace_back(new DeviceBuffer<float>((size_t)B * NH * rows));
        D.back()->poison();
        dq.emplace_back(new DeviceBuffer<floatX>((size_t)B * rows * W));
        dq.back()->upload(with_parts_filled(std::vector<float>((size_t)B * rows * W, 0.0f), heads, {0}, nan));
    }
    for (const auto& [first, rows] : split.key_blocks) {
        const std::vector<float> key_rows =
            with_parts_filled(sequence_rows(qkv, B, T, W, first, rows), heads, {1, 2}, nan);
        keys.emplace_back(new DeviceBuffer<floatX>((size_t)B * rows * key_width));
        keys.back()->upload(packed_keys ? packed_key_value_rows(key_rows, heads) : key_rows);
        dkv.emplace_back(new DeviceBuffer<floatX>((size_t)B * rows * key_width));
        if (packed_keys) dkv.back()->zero();
        else dkv.back()->upload(with_parts_filled(std::vector<float>((size_t)B * rows * W, 0.0f), heads, {1, 2}, nan));
    }
    auto query_block = [&](size_t i) {
        return AttentionBlock{q_qkv[i]->ptr, split.query_blocks[i].second, split.query_blocks[i].first};
    };
    auto key_block = [&](size_t j) {
        const auto [first, rows] = split.key_blocks[j];
        return packed_keys ? packed_key_values(keys[j]->ptr, rows, first, heads)
                           : key_values_of(AttentionBlock{keys[j]->ptr, rows, first}, heads);
    };
    // dK, dV of key block j go where its keys are: the packed buffer as it is, or the k columns of dqkv
    auto dkv_target = [&](size_t j) { return packed_keys ? dkv[j]->ptr : dkv[j]->ptr + heads.q_columns(); };

    // forward: each query block meets every key block and merges; a pair that sees nothing must say so
    bool empty_rows_ok = true;
    int empty_pairs = 0;
    for (size_t i = 0; i < nq; i++)
        for (int j : split.visits[i]) {
            partial_out[i]->poison();
            partial_lse[i]->poison();
            attention_forward_pair(partial_out[i]->ptr, partial_lse[i]->ptr, query_block(i), key_block(j), B, heads, 0);
            if (split.key_blocks[j].first > split.query_blocks[i].first + split.query_blocks[i].second - 1) {
                cudaCheck(cudaDeviceSynchronize());
                empty_pairs++;
                for (float v : partial_out[i]->download()) empty_rows_ok = empty_rows_ok && v == 0.0f;
                for (float v : partial_lse[i]->download()) empty_rows_ok = empty_rows_ok && v == -INFINITY;
            }
            attention_merge(out[i]->ptr, lse[i]->ptr, partial_out[i]->ptr, partial_lse[i]->ptr, B,
                            split.query_blocks[i].second, heads, 0);
        }
    cudaCheck(cudaDeviceSynchronize());
    if (empty_pairs > 0)
        check_true(std::string("attention_forward_pair masked pairs ") + shape, empty_rows_ok,
                   std::to_string(empty_pairs) + " pairs: out 0, lse -inf");
    RingResult result{std::vector<float>((size_t)B * T * C), std::vector<float>((size_t)B * NH * T),
                      std::vector<float>((size_t)B * T * W)};
    for (size_t i = 0; i < nq; i++) {
        const auto [first, rows] = split.query_blocks[i];
        place_sequence_rows(result.out, out[i]->download(), B, T, C, first, rows);
        place_lse_rows(result.lse, lse[i]->download(), B, NH, T, first, rows);
    }

    // backward: D from each merged block, every pair adds its dQ, dK, dV
    for (size_t i = 0; i < nq; i++) {
        attention_backward_preprocess(D[i]->ptr, block_dout[i]->ptr, out[i]->ptr, B, split.query_blocks[i].second,
                                      heads, 0);
        for (int j : split.visits[i])
            attention_backward_pair(dq[i]->ptr, dkv_target(j), D[i]->ptr, block_dout[i]->ptr, lse[i]->ptr,
                                    query_block(i), key_block(j), B, heads, 0);
    }
    cudaCheck(cudaDeviceSynchronize());
    bool other_columns_untouched = true;
    auto untouched = [&](const std::vector<float>& rows, std::initializer_list<int> parts) {
        for (int part : parts)
            for (float v : attention_qkv_part(rows, heads, part))
                other_columns_untouched = other_columns_untouched && std::isnan(v);
    };
    for (size_t i = 0; i < nq; i++) {
        const auto [first, rows] = split.query_blocks[i];
        const std::vector<float> got = dq[i]->download();
        untouched(got, {1, 2});
        place_qkv_parts(result.dqkv, got, B, T, heads, first, rows, {0});
    }
    for (size_t j = 0; j < nk; j++) {
        const auto [first, rows] = split.key_blocks[j];
        const std::vector<float> got =
            packed_keys ? qkv_rows_of_packed(dkv[j]->download(), heads, nan) : dkv[j]->download();
        if (!packed_keys) untouched(got, {0});  // (a packed buffer has no other columns)
        place_qkv_parts(result.dqkv, got, B, T, heads, first, rows, {1, 2});
    }
    check_true(std::string("attention_backward_pair writes only its columns ") + shape, other_columns_untouched,
               packed_keys ? "dq: q columns" : "dq: q columns, dkv: k and v columns");
    return result;
}

// The ring with key blocks as qkv buffers and again with packed key blocks, each against the whole sequence's
// forward and backward; and the two rings against each other: they compute the same products in the same
// order, so they must agree bit for bit.
inline void lab_attention_ring(const RingSplit& split, int B, int T, AttentionHeads heads) {
    const int NH = heads.q_heads, C = heads.q_columns(), W = heads.qkv_columns();
    const std::string dims = attention_shape_name(B, T, heads);
    const std::string shape = split.name + " " + dims, packed_shape = split.name + " packed kv " + dims;
    const std::vector<float> qkv = attention_random_qkv(B, T, heads);
    const std::vector<float> dout = round_to_floatX(random_floats((size_t)B * T * C));
    const size_t blocks = std::max(split.query_blocks.size(), split.key_blocks.size());

    const RingResult ring = run_ring(split, qkv, dout, B, T, heads, false, shape);
    const RingResult packed = run_ring(split, qkv, dout, B, T, heads, true, packed_shape);

    // the whole sequence
    DeviceBuffer<floatX> qkv_d((size_t)B * T * W), out_d((size_t)B * T * C), dout_d((size_t)B * T * C);
    DeviceBuffer<floatX> dqkv_d((size_t)B * T * W);
    DeviceBuffer<float> lse_d((size_t)B * NH * T), workspace_d((size_t)B * NH * T);
    qkv_d.upload(qkv);
    dout_d.upload(dout);
    out_d.poison();
    lse_d.poison();
    attention_forward(out_d.ptr, lse_d.ptr, qkv_d.ptr, B, T, heads, 0);
    cudaCheck(cudaDeviceSynchronize());
    const std::vector<float> whole_out = out_d.download(), whole_lse = lse_d.download();

    // Tolerances: ring and whole-sequence results are both checked against truth, so |ring - whole| is at most
    // the sum of their errors. FP32: as in lab_attention_shape (2e-5 + 1e-4 relative); the merges and the
    // accumulation of the pairs add a few fp32 roundings. BF16: each rounding to bf16 moves a value by up to
    // 2^-9 of its size, and every value rounded on the way is bounded by the sum of absolute terms behind
    // the final result (the reference's magnitude M): the whole-sequence result carries 2 such roundings
    // (P or dS before its product, the stored result); the ring result the same 2 for each pair (P or dS,
    // the stored partial) plus one per merge or per accumulation into a bf16 target, at most one per block
    // met. So |ring - whole| <= 2^-9 (4 + blocks) M; we allow 2^-8 (4 + blocks) M. lse is fp32 in both
    // builds: 2e-5 + 1e-5 relative.
    const double atol = 2e-5, rtol = by_precision(1e-4, 0.0);
    // the ring's result against the whole sequence's: forward as it is, backward given the ring's merged
    // out and lse (so that a forward difference cannot show up as a backward one)
    auto compare_with_whole = [&](const RingResult& result, const std::string& label) {
        std::vector<double> out_allowed(result.out.size(), 0.0), dqkv_allowed(result.dqkv.size(), 0.0);
        if (kBF16) {
            const double per_magnitude = (4.0 + (double)blocks) / 256.0;
            std::vector<double> out_ref, lse_ref, dqkv_ref, out_magnitude, dqkv_magnitude;
            attention_forward_reference(qkv, B, T, heads, out_ref, lse_ref, out_magnitude);
            attention_backward_reference(qkv, dout, result.out, B, T, heads, dqkv_ref, dqkv_magnitude);
            for (size_t i = 0; i < out_allowed.size(); i++) out_allowed[i] = per_magnitude * out_magnitude[i];
            for (size_t i = 0; i < dqkv_allowed.size(); i++) dqkv_allowed[i] = per_magnitude * dqkv_magnitude[i];
        }
        out_d.upload(result.out);
        lse_d.upload(result.lse);
        dqkv_d.poison();
        workspace_d.poison();
        attention_backward(dqkv_d.ptr, workspace_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr, B, T, heads, 0);
        cudaCheck(cudaDeviceSynchronize());
        const std::vector<float> whole_dqkv = dqkv_d.download();
        check_close("ring attention out " + label, result.out, to_double(whole_out), atol, rtol, out_allowed);
        check_close("ring attention lse " + label, result.lse, to_double(whole_lse), 2e-5, 1e-5);
        const char* part_names[3] = {"dq", "dk", "dv"};
        for (int part = 0; part < 3; part++)
            check_close(std::string("ring attention ") + part_names[part] + " " + label,
                        attention_qkv_part(result.dqkv, heads, part),
                        to_double(attention_qkv_part(whole_dqkv, heads, part)), atol, rtol,
                        attention_qkv_part(dqkv_allowed, heads, part));
    };
    compare_with_whole(ring, shape);
    compare_with_whole(packed, packed_shape);

    auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    check_true("ring attention packed kv = qkv-layout kv " + shape,
               same_bits(packed.out, ring.out) && same_bits(packed.lse, ring.lse) && same_bits(packed.dqkv, ring.dqkv),
               "out, lse, dq, dk, dv: same bits");
}

inline void lab_attention_bench(int B, int T, AttentionHeads heads, const char* label) {
    const int NH = heads.q_heads, HS = heads.head_size, C = heads.q_columns(), W = heads.qkv_columns();
    DeviceBuffer<floatX> qkv_d((size_t)B * T * W), out_d((size_t)B * T * C), dout_d((size_t)B * T * C);
    DeviceBuffer<floatX> dqkv_d((size_t)B * T * W);
    DeviceBuffer<float> lse_d((size_t)B * NH * T), workspace_d((size_t)B * NH * T);
    qkv_d.upload(attention_random_qkv(B, T, heads));
    dout_d.upload(random_floats((size_t)B * T * C));
    // causal: half of the T x T scores of each query head, two matmuls (QK^T and PV) of 2*HS flops per score
    const double forward_flops = 4.0 * B * NH * (double)T * T * HS / 2;
    // backward counted as 2.5x the forward (the usual convention: 5 matmuls against the forward's 2; the
    // recomputation of S and dP in the dQ pass is not counted as useful work)
    const double backward_flops = 2.5 * forward_flops;
    char name[96];
    snprintf(name, sizeof(name), "attention_forward %s", label);
    report_bench(name, time_ms([&] { attention_forward(out_d.ptr, lse_d.ptr, qkv_d.ptr, B, T, heads, 0); }), 0,
                 forward_flops);
    snprintf(name, sizeof(name), "attention_backward %s", label);
    report_bench(name, time_ms([&] {
                     attention_backward(dqkv_d.ptr, workspace_d.ptr, dout_d.ptr, qkv_d.ptr, out_d.ptr, lse_d.ptr,
                                        B, T, heads, 0);
                 }),
                 0, backward_flops);
}

// multi-head attention: as many K/V heads as query heads
inline AttentionHeads mha(int heads, int head_size) { return AttentionHeads{heads, heads, head_size}; }

void lab_attention() {
    if (!family_selected("attention")) return;
    // T = 1; T not a multiple of the tile (32 rows on the CUDA cores, 64 on the tensor cores) and T exactly
    // one or two tiles; every head size the launchers accept (16 .. 128; the larger ones need more than
    // 48 KiB of shared memory in some kernel), 32, 64 and 128 across several tiles; one larger shape that
    // walks 4 to 8 tiles and also checks that two runs give the same bits
    lab_attention_shape(1, 1, mha(1, 32), false);
    lab_attention_shape(2, 37, mha(3, 64), false);
    lab_attention_shape(1, 64, mha(2, 16), false);
    lab_attention_shape(1, 50, mha(2, 128), false);
    lab_attention_shape(2, 33, mha(2, 48), false);
    lab_attention_shape(1, 40, mha(1, 80), false);    // the remaining head sizes of the dispatch, one head each
    lab_attention_shape(1, 70, mha(1, 96), false);
    lab_attention_shape(1, 45, mha(1, 112), false);
    lab_attention_shape(1, 97, mha(2, 32), false);    // 32, 64 and 128 over tiles that end past T
    lab_attention_shape(1, 130, mha(1, 128), false);
    lab_attention_shape(2, 128, mha(2, 64), false);
    lab_attention_shape(2, 256, mha(4, 64), true);
    // ring attention: zigzag and contiguous splits over 2 and 4 ranks, chunks of 24 and 40 rows (not
    // multiples of either tile size), head sizes 32 and 64; and query and key blocks cut at different places
    lab_attention_ring(ring_split(2, 24, true), 2, 2 * 2 * 24, mha(2, 32));
    lab_attention_ring(ring_split(2, 40, true), 1, 2 * 2 * 40, mha(3, 64));
    lab_attention_ring(ring_split(4, 24, true), 2, 2 * 4 * 24, mha(2, 64));
    lab_attention_ring(ring_split(4, 40, true), 1, 2 * 4 * 40, mha(2, 32));
    lab_attention_ring(ring_split(2, 48, false), 2, 2 * 48, mha(2, 64));
    lab_attention_ring(ring_split(4, 80, false), 1, 4 * 80, mha(2, 32));
    lab_attention_ring(uneven_split(150, 37, 29), 2, 150, mha(2, 64));
    lab_attention_ring(uneven_split(150, 70, 23), 1, 150, mha(3, 32));

    // grouped-query attention: groups of 2, 3 and 4 query heads and one K/V head for all (multi-query); T
    // past the tiles, head sizes 32 to 128, and the multi-tile shape again with its determinism check (the
    // dK/dV blocks now walk several query heads into one accumulator). Then rings with grouped heads, whose
    // packed key blocks are 2 Ckv columns wide.
    lab_attention_shape(2, 37, AttentionHeads{4, 2, 64}, false);
    lab_attention_shape(1, 97, AttentionHeads{4, 1, 32}, false);
    lab_attention_shape(2, 70, AttentionHeads{6, 2, 48}, false);
    lab_attention_shape(1, 130, AttentionHeads{8, 2, 128}, false);
    lab_attention_shape(2, 256, AttentionHeads{4, 1, 64}, true);
    lab_attention_ring(ring_split(2, 24, true), 2, 2 * 2 * 24, AttentionHeads{4, 2, 32});
    lab_attention_ring(ring_split(4, 40, true), 1, 2 * 4 * 40, AttentionHeads{4, 1, 64});
    lab_attention_ring(ring_split(2, 48, false), 2, 2 * 48, AttentionHeads{6, 2, 32});
    lab_attention_ring(uneven_split(150, 37, 29), 2, 150, AttentionHeads{4, 2, 64});

    // head geometries the kernels cannot run: one line, a non-zero exit
    expect_failure("attention refuses 0 K/V heads", [] { attention_heads(4, 0, 64); },
                   "at least one query head and one key/value head");
    expect_failure("attention refuses 6 query heads over 4 K/V heads", [] { attention_heads(6, 4, 64); },
                   "divide into groups");
    expect_failure("attention refuses head size 40", [] { attention_heads(4, 2, 40); }, "head sizes");
    expect_failure("attention_forward refuses 4 query heads over 3",
                   [] { attention_forward(nullptr, nullptr, nullptr, 1, 8, AttentionHeads{4, 3, 32}, 0); },
                   "divide into groups");

    if (lab.bench) {
#ifdef LLMC_CPU
        lab_attention_bench(1, 256, mha(4, 64), "(CPU: B=1 T=256 NH=4 HS=64)");
        // what one layer of a small GPT-2 124M training run on the CPU sees (batch 4, sequence 64)
        lab_attention_bench(4, 64, mha(12, 64), "(CPU: B=4 T=64 NH=12 HS=64)");
#else
        lab_attention_bench(8, 1024, mha(12, 64), "(B=8 T=1024 NH=12 HS=64)");
#endif
    }
}
