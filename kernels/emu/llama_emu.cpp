// Runs kernels/llama.cu on the CPU, as emulate.cpp does for topk.cu: each block's threads are OS
// threads, __syncthreads and __syncwarp are barriers, warp shuffles go through per-warp slots
// between two barriers (all 32 lanes must take part, as on the GPU), `__shared__` is `static`
// (blocks run one after another). Each kernel is compared with a plain C++ reference computed in
// double on random data with awkward sizes. It checks indexing, masks, the online softmax and the
// merge of parts; it cannot check what only hardware shows (memory ordering beyond these
// barriers, speed, NVRTC's code generation).
//
// Build and run: scripts/kernel-emu.sh (g++ -std=c++20 -O2 -pthread).

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

// ---- the CUDA surface llama.cu uses ---------------------------------------------------------
struct Dim3 {
    unsigned x = 1, y = 1, z = 1;
};
thread_local Dim3 threadIdx, blockIdx;
Dim3 blockDim, gridDim;

struct alignas(16) float4 {
    float x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define QK_EMULATION 1

static std::unique_ptr<std::barrier<>> g_block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> g_warp_barriers;
static uint32_t g_slots[32][32];  // [warp][lane], for shuffles

static inline int warp_id() { return threadIdx.x / 32; }
static inline int lane_id() { return threadIdx.x % 32; }

// Laggard mode: warp `g_laggard` (−1: none) sleeps after every __syncthreads, so the other warps
// run ahead to the next block barrier. A barrier missing between a write and another warp's read
// of shared memory then shows as a wrong result instead of a rare interleaving.
static int g_laggard = -1;
static const char* g_suffix = "";
static void __syncthreads() {
    g_block_barrier->arrive_and_wait();
    if (warp_id() == g_laggard) std::this_thread::sleep_for(std::chrono::milliseconds(2));
}
static void __syncwarp(unsigned = 0xffffffffu) { g_warp_barriers[warp_id()]->arrive_and_wait(); }

// Every lane posts its value, the warp meets, each lane reads its source lane, the warp meets
// again (so that the slots are not overwritten while being read).
static uint32_t shfl_bits(uint32_t v, int src) {
    g_slots[warp_id()][lane_id()] = v;
    __syncwarp();
    uint32_t r = g_slots[warp_id()][src & 31];
    __syncwarp();
    return r;
}
static float bits_float(uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
static uint32_t float_bits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}
static float __shfl_xor_sync(unsigned, float v, int mask) {
    return bits_float(shfl_bits(float_bits(v), lane_id() ^ mask));
}
[[maybe_unused]] static float __shfl_sync(unsigned, float v, int src) {
    return bits_float(shfl_bits(float_bits(v), src));
}
[[maybe_unused]] static int __shfl_sync(unsigned, int v, int src) {
    return (int)shfl_bits((uint32_t)v, src);
}

static float __int_as_float(int x) {
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
[[maybe_unused]] static float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
using std::max;
using std::min;

#include "../llama.cu"

// ---- launching ------------------------------------------------------------------------------
// Runs the grid's blocks one after another; in each, `threads` OS threads (a multiple of 32: the
// warp barriers expect full warps, as llama.cu's warp collectives do).
static void launch(Dim3 grid, unsigned threads, const std::function<void()>& body) {
    if (threads % 32 != 0 || threads > 1024) {
        std::printf("bad block size %u\n", threads);
        std::exit(1);
    }
    gridDim = grid;
    blockDim = Dim3{threads, 1, 1};
    for (unsigned by = 0; by < grid.y; ++by)
        for (unsigned bx = 0; bx < grid.x; ++bx) {
            g_block_barrier = std::make_unique<std::barrier<>>(threads);
            g_warp_barriers.clear();
            for (unsigned w = 0; w < threads / 32; ++w)
                g_warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
            std::vector<std::thread> ts;
            ts.reserve(threads);
            for (unsigned t = 0; t < threads; ++t) {
                ts.emplace_back([=, &body] {
                    blockIdx = Dim3{bx, by, 1};
                    threadIdx = Dim3{t, 1, 1};
                    body();
                });
            }
            for (auto& t : ts) t.join();
        }
}
static void launch(unsigned grid, unsigned threads, const std::function<void()>& body) {
    launch(Dim3{grid, 1, 1}, threads, body);
}

// ---- checks ---------------------------------------------------------------------------------
static int failures = 0;

// err: the largest error found; tol: the limit. One line per check.
static void report(const char* name, double err, double tol) {
    bool ok = err <= tol && !std::isnan(err);
    char full[200];
    std::snprintf(full, sizeof full, "%s%s", name, g_suffix);
    std::printf("%-64s %s (max err %.3g, tol %.1g)\n", full, ok ? "ok" : "FAIL", err, tol);
    std::fflush(stdout);
    if (!ok) ++failures;
}

// Largest |a − b| / max(|b|, floor) over the elements; NaN anywhere counts as infinite.
static double rel_err(const std::vector<float>& a, const std::vector<double>& b, double floor) {
    if (a.size() != b.size()) return INFINITY;
    double e = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(a[i])) return INFINITY;
        e = std::max(e, std::fabs(a[i] - b[i]) / std::max(std::fabs(b[i]), floor));
    }
    return e;
}

// Normwise: max |a − b| / max |b| (attention outputs: a few coordinates may be near zero).
static double norm_err(const std::vector<float>& a, const std::vector<double>& b) {
    if (a.size() != b.size()) return INFINITY;
    double e = 0, s = 1e-30;
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(a[i])) return INFINITY;
        e = std::max(e, std::fabs(a[i] - b[i]));
        s = std::max(s, std::fabs(b[i]));
    }
    return e / s;
}

static std::vector<float> randn(size_t n, std::mt19937& rng, float sd = 1.0f) {
    std::normal_distribution<float> g(0, sd);
    std::vector<float> v(n);
    for (auto& x : v) x = g(rng);
    return v;
}

// ---- element-wise kernels -------------------------------------------------------------------
static void check_embed(int vocab, int n, int dim, unsigned grid, unsigned seed) {
    std::mt19937 rng(seed);
    auto table = randn((size_t)vocab * dim, rng);
    std::vector<unsigned> tok(n);
    for (auto& t : tok) t = rng() % vocab;
    tok[0] = vocab - 1;
    std::vector<float> out((size_t)n * dim, NAN);
    launch(grid, 128, [&] { embed_gather(table.data(), tok.data(), n, dim, out.data()); });
    std::vector<double> want(out.size());
    for (int r = 0; r < n; ++r)
        for (int i = 0; i < dim; ++i) want[(size_t)r * dim + i] = table[(size_t)tok[r] * dim + i];
    char name[128];
    std::snprintf(name, sizeof name, "embed_gather n %d dim %d grid %u", n, dim, grid);
    report(name, rel_err(out, want, 1e-30), 0.0);
}

static void check_rms(int rows, int dim, unsigned threads, unsigned grid, bool in_place,
                      unsigned seed) {
    std::mt19937 rng(seed);
    auto x = randn((size_t)rows * dim, rng, 2.0f);
    auto w = randn(dim, rng);
    const float eps = 1e-5f;
    std::vector<double> want(x.size());
    for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int i = 0; i < dim; ++i) ss += (double)x[(size_t)r * dim + i] * x[(size_t)r * dim + i];
        double sc = 1.0 / std::sqrt(ss / dim + eps);
        for (int i = 0; i < dim; ++i)
            want[(size_t)r * dim + i] = x[(size_t)r * dim + i] * sc * w[i];
    }
    std::vector<float> out(x.size(), NAN);
    float* dst = in_place ? x.data() : out.data();
    launch(grid, threads, [&] { rms_norm(x.data(), w.data(), rows, dim, eps, dst); });
    char name[128];
    std::snprintf(name, sizeof name, "rms_norm rows %d dim %d block %u grid %u%s", rows, dim,
                  threads, grid, in_place ? " in place" : "");
    report(name, rel_err(in_place ? x : out, want, 1e-3), 1e-5);
}

static void check_rope(int rows, int n_heads, int half, int pos0, unsigned grid, unsigned seed) {
    std::mt19937 rng(seed);
    const int max_pos = pos0 + rows + 3, hd = 2 * half, width = n_heads * hd;
    std::vector<float> ct((size_t)max_pos * half), st(ct.size());
    for (int p = 0; p < max_pos; ++p)
        for (int i = 0; i < half; ++i) {
            double a = p * std::pow(10000.0, -2.0 * i / hd);
            ct[(size_t)p * half + i] = (float)std::cos(a);
            st[(size_t)p * half + i] = (float)std::sin(a);
        }
    auto x = randn((size_t)rows * width, rng);
    std::vector<double> want(x.size());
    for (int r = 0; r < rows; ++r)
        for (int h = 0; h < n_heads; ++h)
            for (int i = 0; i < half; ++i) {
                size_t o = (size_t)r * width + (size_t)h * hd;
                size_t t = (size_t)(pos0 + r) * half + i;
                double a = x[o + i], b = x[o + i + half];
                want[o + i] = a * ct[t] - b * st[t];
                want[o + i + half] = b * ct[t] + a * st[t];
            }
    launch(grid, 256, [&] { rope(x.data(), ct.data(), st.data(), rows, n_heads, half, pos0); });
    char name[128];
    std::snprintf(name, sizeof name, "rope rows %d heads %d half %d pos0 %d grid %u", rows,
                  n_heads, half, pos0, grid);
    report(name, rel_err(x, want, 1.0), 1e-6);
}

static void check_swiglu_add(long long n, unsigned grid, unsigned seed) {
    std::mt19937 rng(seed);
    auto gate = randn(n, rng, 4.0f), up = randn(n, rng);
    gate[0] = -200.0f;  // exp(200) overflows to inf: silu gives -0, not NaN
    gate[1] = 120.0f;
    std::vector<double> want(n);
    for (long long i = 0; i < n; ++i)
        want[i] = gate[i] / (1.0 + std::exp(-(double)gate[i])) * up[i];
    launch(grid, 256, [&] { swiglu(gate.data(), up.data(), n); });
    char name[128];
    std::snprintf(name, sizeof name, "swiglu n %lld grid %u", n, grid);
    report(name, rel_err(gate, want, 1.0), 1e-6);

    auto x = randn(n, rng), h = randn(n, rng);
    std::vector<double> want2(n);
    for (long long i = 0; i < n; ++i) want2[i] = (double)x[i] + h[i];
    launch(grid, 256, [&] { add_inplace(x.data(), h.data(), n); });
    std::snprintf(name, sizeof name, "add_inplace n %lld grid %u", n, grid);
    report(name, rel_err(x, want2, 1.0), 1e-7);
}

static void check_kv_write(int rows, int n_kv, int hd, int capacity, int pos0, unsigned grid,
                           unsigned seed) {
    std::mt19937 rng(seed);
    auto k = randn((size_t)rows * n_kv * hd, rng), v = randn(k.size(), rng);
    std::vector<float> kc((size_t)n_kv * capacity * hd, 7.0f), vc(kc.size(), -7.0f);
    std::vector<double> wk(kc.begin(), kc.end()), wv(vc.begin(), vc.end());
    for (int r = 0; r < rows; ++r)
        for (int g = 0; g < n_kv; ++g)
            for (int i = 0; i < hd; ++i) {
                size_t dst = ((size_t)g * capacity + pos0 + r) * hd + i;
                size_t src = (size_t)r * n_kv * hd + (size_t)g * hd + i;
                wk[dst] = k[src];
                wv[dst] = v[src];
            }
    launch(grid, 256, [&] {
        kv_write(k.data(), v.data(), kc.data(), vc.data(), rows, n_kv, hd, capacity, pos0);
    });
    char name[128];
    std::snprintf(name, sizeof name, "kv_write rows %d n_kv %d hd %d cap %d pos0 %d", rows, n_kv,
                  hd, capacity, pos0);
    report(name, std::max(rel_err(kc, wk, 1e-30), rel_err(vc, wv, 1e-30)), 0.0);
}

// ---- attention ------------------------------------------------------------------------------
struct Attn {
    int n_heads, n_kv, hd, capacity;
    std::vector<float> k, v;  // caches: n_kv × capacity × hd
    float scale;
    // Positions `filled` .. cap hold NaN: a kernel that reads a key it should not (even with
    // weight 0: 0 · NaN = NaN) shows.
    Attn(int nh, int nkv, int d, int filled, int cap, std::mt19937& rng)
        : n_heads(nh), n_kv(nkv), hd(d), capacity(cap) {
        k = randn((size_t)nkv * cap * d, rng);
        v = randn(k.size(), rng);
        for (int g = 0; g < nkv; ++g)
            for (int p = filled; p < cap; ++p)
                for (int i = 0; i < d; ++i) {
                    k[((size_t)g * cap + p) * d + i] = NAN;
                    v[((size_t)g * cap + p) * d + i] = NAN;
                }
        scale = 1.0f / std::sqrt((float)d);
    }
    int kv_of(int h) const { return h / (n_heads / n_kv); }
    const float* krow(int g, int p) const { return &k[((size_t)g * capacity + p) * hd]; }
    const float* vrow(int g, int p) const { return &v[((size_t)g * capacity + p) * hd]; }
    // Softmax over `positions` of head h's KV head, in double; writes hd values (zeros if none).
    void reference(const float* qh, int h, const std::vector<int>& positions, double* out) const {
        int g = kv_of(h);
        std::fill(out, out + hd, 0.0);
        if (positions.empty()) return;
        std::vector<double> s(positions.size());
        double m = -INFINITY;
        for (size_t j = 0; j < positions.size(); ++j) {
            double acc = 0;
            const float* kr = krow(g, positions[j]);
            for (int i = 0; i < hd; ++i) acc += (double)qh[i] * kr[i];
            s[j] = acc * scale;
            m = std::max(m, s[j]);
        }
        double z = 0;
        for (size_t j = 0; j < positions.size(); ++j) {
            double w = std::exp(s[j] - m);
            z += w;
            const float* vr = vrow(g, positions[j]);
            for (int i = 0; i < hd; ++i) out[i] += w * vr[i];
        }
        for (int i = 0; i < hd; ++i) out[i] /= z;
    }
};

// Grids for attention_causal: the work-item count, one block per 4 (row, head) pairs (more
// blocks than items), or a small 2-D grid (blocks loop over several items).
enum CausalGrid { EXACT, PER_4_HEADS, SMALL_2D };

static void check_causal(int n, int pos0, int n_heads, int n_kv, int hd, unsigned seed,
                         CausalGrid how = EXACT) {
    std::mt19937 rng(seed);
    Attn a(n_heads, n_kv, hd, pos0 + n, pos0 + n + 40, rng);
    const int width = n_heads * hd;
    auto q = randn((size_t)n * width, rng, 2.0f);
    std::vector<float> out((size_t)n * width, NAN);
    const int group = n_heads / n_kv;
    const unsigned items = (unsigned)((n * group + CA_ROWS - 1) / CA_ROWS * n_kv);
    Dim3 grid{items, 1, 1};
    if (how == PER_4_HEADS) grid.x = (unsigned)((n * n_heads + 3) / 4);
    if (how == SMALL_2D) grid = Dim3{3, 2, 1};
    launch(grid, CA_WARPS * 32, [&] {
        attention_causal(q.data(), a.k.data(), a.v.data(), out.data(), n, pos0, n_heads, n_kv, hd,
                         a.capacity, a.scale);
    });
    std::vector<double> want(out.size());
    for (int r = 0; r < n; ++r) {
        std::vector<int> pos(pos0 + r + 1);
        for (int p = 0; p <= pos0 + r; ++p) pos[p] = p;
        for (int h = 0; h < n_heads; ++h)
            a.reference(&q[(size_t)r * width + (size_t)h * hd], h, pos,
                        &want[(size_t)r * width + (size_t)h * hd]);
    }
    char name[128];
    std::snprintf(name, sizeof name, "attention_causal n %d pos0 %d heads %d/%d hd %d grid %ux%u",
                  n, pos0, n_heads, n_kv, hd, grid.x, grid.y);
    report(name, norm_err(out, want), 1e-4);
}

// Parts of one head in host memory.
struct Parts {
    std::vector<float> m, l, o;
};

// The static set of attention_partial_range, as the brief defines it: a set of positions.
static std::vector<int> static_set(int sink, int rest_end, int n_keys) {
    std::vector<char> in(n_keys, 0);
    for (int p = 0; p < std::min(sink, n_keys); ++p) in[p] = 1;
    for (int p = std::max(rest_end, 0); p < n_keys; ++p) in[p] = 1;
    std::vector<int> s;
    for (int p = 0; p < n_keys; ++p)
        if (in[p]) s.push_back(p);
    return s;
}

// Checks every part against its definition (max, Σ exp(s − max), Σ exp(s − max)·v over the
// part's positions), relative to the part's l and |o|.
static double part_err(const Attn& a, const float* q, int h, const std::vector<int>& positions,
                       float pm, float pl, const float* po) {
    const int hd = a.hd, g = a.kv_of(h);
    if (positions.empty()) {
        double e = (pm == -INFINITY) ? 0 : INFINITY;
        e = std::max(e, (double)std::fabs(pl));
        for (int i = 0; i < hd; ++i) e = std::max(e, (double)std::fabs(po[i]));
        if (std::isnan(pl)) e = INFINITY;
        return e;
    }
    std::vector<double> s(positions.size());
    double m = -INFINITY;
    for (size_t j = 0; j < positions.size(); ++j) {
        double acc = 0;
        for (int i = 0; i < hd; ++i) acc += (double)q[i] * a.krow(g, positions[j])[i];
        s[j] = acc * a.scale;
        m = std::max(m, s[j]);
    }
    double l = 0;
    std::vector<double> o(hd, 0);
    for (size_t j = 0; j < positions.size(); ++j) {
        double w = std::exp(s[j] - m);
        l += w;
        for (int i = 0; i < hd; ++i) o[i] += w * a.vrow(g, positions[j])[i];
    }
    if (std::isnan(pm) || std::isnan(pl)) return INFINITY;
    double e = std::fabs(pm - m) / std::max(1.0, std::fabs(m));
    e = std::max(e, std::fabs(pl - l) / l);
    double on = 1e-30;
    for (int i = 0; i < hd; ++i) on = std::max(on, std::fabs(o[i]));
    for (int i = 0; i < hd; ++i) {
        if (std::isnan(po[i])) return INFINITY;
        e = std::max(e, std::fabs(po[i] - o[i]) / on);
    }
    return e;
}

static Parts run_range(const Attn& a, const std::vector<float>& q, int sink, int rest_end,
                       int n_keys, int chunk, int n_chunks) {
    Parts p;
    p.m.assign((size_t)a.n_heads * n_chunks, NAN);
    p.l.assign(p.m.size(), NAN);
    p.o.assign(p.m.size() * a.hd, NAN);
    launch(Dim3{(unsigned)a.n_heads, (unsigned)n_chunks, 1}, PA_WARPS * 32, [&] {
        attention_partial_range(q.data(), a.k.data(), a.v.data(), a.n_heads, a.n_kv, a.hd,
                                a.capacity, a.scale, sink, rest_end, n_keys, chunk, p.m.data(),
                                p.l.data(), p.o.data());
    });
    return p;
}

static Parts run_ids(const Attn& a, const std::vector<float>& q, const std::vector<unsigned>& ids,
                     int ids_per_head, int splits) {
    Parts p;
    p.m.assign((size_t)a.n_heads * splits, NAN);
    p.l.assign(p.m.size(), NAN);
    p.o.assign(p.m.size() * a.hd, NAN);
    launch(Dim3{(unsigned)a.n_heads, (unsigned)splits, 1}, PA_WARPS * 32, [&] {
        attention_partial_ids(q.data(), a.k.data(), a.v.data(), a.n_heads, a.n_kv, a.hd,
                              a.capacity, a.scale, ids.data(), ids_per_head, p.m.data(),
                              p.l.data(), p.o.data());
    });
    return p;
}

// Random ids per head: distinct positions outside `exclude` below n_keys, some entries none
// (0xFFFFFFFF); head `all_none` has no valid id at all.
static std::vector<unsigned> make_ids(int n_heads, int ids_per_head, int n_keys,
                                      const std::vector<int>& exclude, int all_none,
                                      std::mt19937& rng) {
    std::vector<int> cand;
    std::vector<char> ex(n_keys, 0);
    for (int p : exclude) ex[p] = 1;
    for (int p = 0; p < n_keys; ++p)
        if (!ex[p]) cand.push_back(p);
    std::vector<unsigned> ids((size_t)n_heads * ids_per_head, 0xFFFFFFFFu);
    for (int h = 0; h < n_heads; ++h) {
        if (h == all_none) continue;
        std::shuffle(cand.begin(), cand.end(), rng);
        for (int j = 0; j < ids_per_head; ++j) {
            if (j < (int)cand.size() && rng() % 5 != 0) ids[(size_t)h * ids_per_head + j] = cand[j];
        }
    }
    return ids;
}

// Decode with a static set (sink ∪ window) in chunks plus indexed ids: every part against its
// definition, then the merge (partial_merge2, and partial_merge over the parts interleaved into
// one array) against the softmax over the union of the positions.
static void check_decode(int n_heads, int n_kv, int hd, int n_keys, int sink, int rest_end,
                         int chunk, int extra_chunks, int ids_per_head, int id_splits,
                         int all_none, unsigned seed) {
    std::mt19937 rng(seed);
    Attn a(n_heads, n_kv, hd, n_keys, n_keys + 3, rng);
    auto q = randn((size_t)n_heads * hd, rng, 3.0f);
    auto set = static_set(sink, rest_end, n_keys);
    const int n_chunks = std::max<int>(1, ((int)set.size() + chunk - 1) / chunk) + extra_chunks;
    Parts pr = run_range(a, q, sink, rest_end, n_keys, chunk, n_chunks);
    double e_range = 0;
    for (int h = 0; h < n_heads; ++h)
        for (int c = 0; c < n_chunks; ++c) {
            std::vector<int> pos;
            for (size_t e = (size_t)c * chunk; e < set.size() && e < (size_t)(c + 1) * chunk; ++e)
                pos.push_back(set[e]);
            size_t pi = (size_t)h * n_chunks + c;
            e_range = std::max(e_range, part_err(a, &q[(size_t)h * hd], h, pos, pr.m[pi], pr.l[pi],
                                                 &pr.o[pi * hd]));
        }
    char name[160];
    std::snprintf(name, sizeof name,
                  "partial_range heads %d/%d hd %d keys %d sink %d rest %d chunk %d x%d", n_heads,
                  n_kv, hd, n_keys, sink, rest_end, chunk, n_chunks);
    report(name, e_range, 1e-5);

    auto ids = make_ids(n_heads, ids_per_head, n_keys, set, all_none, rng);
    Parts pi = run_ids(a, q, ids, ids_per_head, id_splits);
    const int per = (ids_per_head + id_splits - 1) / id_splits;
    double e_ids = 0;
    for (int h = 0; h < n_heads; ++h)
        for (int c = 0; c < id_splits; ++c) {
            std::vector<int> pos;
            for (int j = c * per; j < std::min(ids_per_head, (c + 1) * per); ++j) {
                unsigned id = ids[(size_t)h * ids_per_head + j];
                if (id != 0xFFFFFFFFu) pos.push_back((int)id);
            }
            size_t x = (size_t)h * id_splits + c;
            e_ids = std::max(e_ids, part_err(a, &q[(size_t)h * hd], h, pos, pi.m[x], pi.l[x],
                                             &pi.o[x * hd]));
        }
    std::snprintf(name, sizeof name, "partial_ids heads %d/%d hd %d ids %d splits %d none-head %d",
                  n_heads, n_kv, hd, ids_per_head, id_splits, all_none);
    report(name, e_ids, 1e-5);

    // Softmax over the union, per head.
    std::vector<double> want((size_t)n_heads * hd);
    for (int h = 0; h < n_heads; ++h) {
        std::vector<int> uni = set;
        for (int j = 0; j < ids_per_head; ++j) {
            unsigned id = ids[(size_t)h * ids_per_head + j];
            if (id != 0xFFFFFFFFu) uni.push_back((int)id);
        }
        a.reference(&q[(size_t)h * hd], h, uni, &want[(size_t)h * hd]);
    }
    std::vector<float> out((size_t)n_heads * hd, NAN);
    launch(n_heads, 128, [&] {
        partial_merge2(pr.m.data(), pr.l.data(), pr.o.data(), n_chunks, pi.m.data(), pi.l.data(),
                       pi.o.data(), id_splits, n_heads, hd, out.data());
    });
    std::snprintf(name, sizeof name, "merge2 range x%d + ids x%d == softmax over union", n_chunks,
                  id_splits);
    report(name, norm_err(out, want), 1e-4);

    // The same parts interleaved into one array (head h: n_chunks range parts, then id parts).
    const int pph = n_chunks + id_splits;
    Parts all;
    all.m.resize((size_t)n_heads * pph);
    all.l.resize(all.m.size());
    all.o.resize(all.m.size() * hd);
    for (int h = 0; h < n_heads; ++h)
        for (int c = 0; c < pph; ++c) {
            const Parts& src = c < n_chunks ? pr : pi;
            size_t from = c < n_chunks ? (size_t)h * n_chunks + c
                                       : (size_t)h * id_splits + (c - n_chunks);
            size_t to = (size_t)h * pph + c;
            all.m[to] = src.m[from];
            all.l[to] = src.l[from];
            std::copy_n(&src.o[from * hd], hd, &all.o[to * hd]);
        }
    std::vector<float> out1((size_t)n_heads * hd, NAN);
    launch(3, 64, [&] {  // fewer blocks than heads: grid-strided
        partial_merge(all.m.data(), all.l.data(), all.o.data(), n_heads, pph, hd, out1.data());
    });
    std::snprintf(name, sizeof name, "merge stacked %d parts/head == softmax over union", pph);
    report(name, norm_err(out1, want), 1e-4);
}

// Full-attention decode through the split-K path: static set = all keys (sink ≥ n_keys), chunks,
// merged, against attention_causal with n = 1 and against the reference.
static void check_decode_full(int n_heads, int n_kv, int hd, int n_keys, int chunk, unsigned seed) {
    std::mt19937 rng(seed);
    Attn a(n_heads, n_kv, hd, n_keys, n_keys + 40, rng);
    auto q = randn((size_t)n_heads * hd, rng, 3.0f);
    const int n_chunks = (n_keys + chunk - 1) / chunk;
    Parts pr = run_range(a, q, n_keys, n_keys, n_keys, chunk, n_chunks);
    std::vector<float> out((size_t)n_heads * hd, NAN), out_c(out.size(), NAN);
    launch(n_heads, 128, [&] {
        partial_merge(pr.m.data(), pr.l.data(), pr.o.data(), n_heads, n_chunks, hd, out.data());
    });
    const int group = n_heads / n_kv;
    launch((unsigned)((group + CA_ROWS - 1) / CA_ROWS) * n_kv, CA_WARPS * 32, [&] {
        attention_causal(q.data(), a.k.data(), a.v.data(), out_c.data(), 1, n_keys - 1, n_heads,
                         n_kv, hd, a.capacity, a.scale);
    });
    std::vector<double> want((size_t)n_heads * hd);
    std::vector<int> all(n_keys);
    for (int p = 0; p < n_keys; ++p) all[p] = p;
    for (int h = 0; h < n_heads; ++h)
        a.reference(&q[(size_t)h * hd], h, all, &want[(size_t)h * hd]);
    char name[160];
    std::snprintf(name, sizeof name, "decode split-K heads %d/%d hd %d keys %d chunk %d", n_heads,
                  n_kv, hd, n_keys, chunk);
    report(name, norm_err(out, want), 1e-4);
    std::snprintf(name, sizeof name, "decode causal n 1 heads %d/%d hd %d keys %d", n_heads, n_kv,
                  hd, n_keys);
    report(name, norm_err(out_c, want), 1e-4);
}

// Merging parts that are all empty gives zeros, not NaN (also a head with no parts at all).
static void check_merge_empty() {
    const int n_heads = 3, hd = 32, pph = 4;
    std::vector<float> m((size_t)n_heads * pph, -INFINITY), l(m.size(), 0.0f),
        o(m.size() * hd, 0.0f);
    std::mt19937 rng(99);
    // Head 1 has one real part (m = 0.5, l = 2, o = 2·x): its output is x.
    auto x = randn(hd, rng);
    m[1 * pph + 2] = 0.5f;
    l[1 * pph + 2] = 2.0f;
    for (int i = 0; i < hd; ++i) o[(size_t)(1 * pph + 2) * hd + i] = 2 * x[i];
    std::vector<float> out((size_t)n_heads * hd, NAN), out0(out.size(), NAN);
    launch(n_heads, 32, [&] {
        partial_merge(m.data(), l.data(), o.data(), n_heads, pph, hd, out.data());
    });
    launch(n_heads, 96, [&] {
        partial_merge2(m.data(), l.data(), o.data(), 0, m.data(), l.data(), o.data(), 0, n_heads,
                       hd, out0.data());
    });
    std::vector<double> want(out.size(), 0.0);
    for (int i = 0; i < hd; ++i) want[hd + i] = x[i];
    report("merge all-empty heads -> zeros, one part -> o/l", rel_err(out, want, 1.0), 1e-7);
    std::vector<double> zeros(out0.size(), 0.0);
    report("merge2 with no parts -> zeros", rel_err(out0, zeros, 1.0), 0.0);
}

int main() {
    // A watchdog: a warp collective that not all lanes reach deadlocks the emulation.
    std::thread([] {
        std::this_thread::sleep_for(std::chrono::seconds(300));
        std::printf("TIMEOUT: emulation stuck (a barrier or warp collective not reached by all)\n");
        std::fflush(stdout);
        std::_Exit(1);
    }).detach();
    auto t0 = std::chrono::steady_clock::now();

    check_embed(50, 13, 576, 13, 1);
    check_embed(9, 5, 7, 2, 2);  // fewer blocks than rows
    check_rms(5, 576, 256, 5, false, 3);
    check_rms(4, 576, 96, 2, true, 4);  // in place, block not a power of two, rows grid-strided
    check_rms(3, 7, 32, 3, false, 5);
    check_rope(7, 9, 32, 5, 4, 6);
    check_rope(3, 3, 3, 0, 1, 7);
    check_rope(5, 3, 32, 100, 2, 8);
    check_swiglu_add(1000, 3, 9);
    check_swiglu_add(5, 1, 10);
    check_kv_write(5, 3, 64, 40, 17, 2, 11);
    check_kv_write(3, 1, 4, 3, 0, 1, 12);

    // Causal prefill: GQA 9/3 with pos0 > 0, rows not a multiple of the block's 16 stacked rows;
    // hd 32 from position 0; group 1; a group larger than a block (MQA); hd 128; decode n = 1.
    check_causal(37, 20, 9, 3, 64, 13);
    check_causal(19, 0, 9, 3, 32, 14, PER_4_HEADS);
    check_causal(70, 0, 9, 3, 64, 25);  // several key tiles, the smollm shape
    check_causal(45, 7, 9, 3, 64, 29, SMALL_2D);
    check_causal(11, 3, 4, 4, 128, 15, SMALL_2D);
    check_causal(6, 40, 18, 1, 32, 16);
    check_causal(1, 99, 9, 3, 64, 17, PER_4_HEADS);

    // Decode parts: sink + window in uneven chunks, plus ids (with nones, one all-none head).
    check_decode(9, 3, 64, 300, 4, 260, 16, 0, 50, 1, 4, 18);
    // Chunks past the end of the set (empty parts), ids split in 3 runs.
    check_decode(9, 3, 32, 200, 10, 150, 64, 1, 70, 3, 0, 19);
    // sink > n_keys (the whole range is static), so every id is none (nothing left to index).
    check_decode(9, 3, 64, 77, 500, 77, 20, 0, 8, 1, 8, 20);
    // rest_end == n_keys: empty window, only the sink is static.
    check_decode(9, 3, 64, 150, 10, 150, 7, 0, 40, 2, 2, 21);
    // rest_end < sink: the union counts positions once.
    check_decode(6, 2, 32, 120, 40, 30, 32, 0, 33, 1, 5, 22);
    // No static key at all (sink 0, rest_end == n_keys): the ids alone; an all-none head gives
    // zeros through the merge.
    check_decode(9, 3, 32, 90, 0, 90, 16, 0, 45, 1, 7, 23);
    // Long chunks and id lists: each warp takes several steps of 32 keys (rescaled running state).
    check_decode(9, 3, 64, 1100, 16, 500, 300, 0, 333, 1, 1, 26);
    check_decode(4, 2, 128, 600, 3, 400, 150, 0, 290, 2, 3, 27);
    // Full-attention decode through split-K and through attention_causal n = 1.
    check_decode_full(9, 3, 64, 700, 128, 24);
    check_decode_full(9, 3, 64, 1000, 512, 28);
    check_merge_empty();

    // The kernels whose blocks loop (rows, work items) or share shared memory between warps,
    // again with a laggard warp (first, then last).
    for (int lag : {0, 2}) {
        g_laggard = lag;
        g_suffix = lag == 0 ? " [lag w0]" : " [lag w2]";
        check_rms(4, 576, 96, 2, true, 4);
        check_causal(45, 7, 9, 3, 64, 29, SMALL_2D);
        check_decode(9, 3, 64, 1100, 16, 500, 300, 0, 333, 1, 1, 26);
    }
    g_laggard = -1;
    g_suffix = "";

    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (failures) {
        std::printf("%d check(s) failed (%.1f s)\n", failures, secs);
        return 1;
    }
    std::printf("all llama kernel emulation checks passed (%.1f s)\n", secs);
    return 0;
}
