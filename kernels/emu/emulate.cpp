// Runs kernels/topk.cu on the CPU: each block's threads are OS threads, __syncthreads and
// __syncwarp are barriers, warp votes and shuffles go through per-warp slots between two barriers,
// and mma.sync m16n8k16 is computed from the fragment layout of the PTX ISA. It checks the kernels'
// logic (loads, padding, causal masks, filtering, buffering, merging) against a brute-force top-k
// where no GPU is present. It cannot check what only hardware shows (the real fragment layout,
// memory ordering beyond these barriers, speed): `scripts/gpu-check.sh` does, on a GPU.
//
// Build and run: scripts/kernel-emu.sh (g++ -std=c++20 -O2 -pthread).

#include <algorithm>
#include <atomic>
#include <barrier>
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

// ---- the CUDA surface topk.cu uses ----------------------------------------------------------
struct Dim3 {
    unsigned x = 1, y = 1, z = 1;
};
thread_local Dim3 threadIdx, blockIdx;
Dim3 blockDim, gridDim;

struct uint4 {
    unsigned x, y, z, w;
};

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(x)
#define __shared__ static
#define QK_EMULATION 1

static std::unique_ptr<std::barrier<>> g_block_barrier;
static std::vector<std::unique_ptr<std::barrier<>>> g_warp_barriers;
static std::vector<unsigned char> g_dynamic_smem;
static unsigned g_votes[32][32];
static unsigned g_frag[32][32][6];

#define QK_DYNAMIC_SMEM(name) unsigned char* name = g_dynamic_smem.data()

static inline int warp_id() { return threadIdx.x / 32; }
static inline int lane_id() { return threadIdx.x % 32; }

static void __syncthreads() { g_block_barrier->arrive_and_wait(); }
static void __syncwarp(unsigned = 0xffffffffu) { g_warp_barriers[warp_id()]->arrive_and_wait(); }

static unsigned __ballot_sync(unsigned, bool pred) {
    g_votes[warp_id()][lane_id()] = pred ? 1u : 0u;
    __syncwarp();
    unsigned mask = 0;
    for (int l = 0; l < 32; ++l) mask |= g_votes[warp_id()][l] << l;
    __syncwarp();
    return mask;
}

static int __shfl_sync(unsigned, int v, int src) {
    g_votes[warp_id()][lane_id()] = (unsigned)v;
    __syncwarp();
    int r = (int)g_votes[warp_id()][src];
    __syncwarp();
    return r;
}

static int __popc(unsigned x) { return __builtin_popcount(x); }
static float __int_as_float(int x) {
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
static unsigned __float_as_uint(float x) {
    unsigned u;
    std::memcpy(&u, &x, 4);
    return u;
}
static float __uint_as_float(unsigned x) {
    float f;
    std::memcpy(&f, &x, 4);
    return f;
}
static int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
using std::min;

static float half_to_float(unsigned short h) {
    unsigned sign = (h >> 15) & 1, exp = (h >> 10) & 31, man = h & 1023;
    float v;
    if (exp == 0) v = std::ldexp((float)man, -24);
    else if (exp == 31) v = man ? NAN : INFINITY;
    else v = std::ldexp((float)(man | 1024), (int)exp - 25);
    return sign ? -v : v;
}

static unsigned short float_to_half(float f) {
    // Round to nearest even through the bit pattern (normal range only; the tests stay in it).
    unsigned x;
    std::memcpy(&x, &f, 4);
    unsigned sign = (x >> 16) & 0x8000;
    int exp = (int)((x >> 23) & 255) - 127 + 15;
    unsigned man = x & 0x7fffff;
    if (exp <= 0) return (unsigned short)sign;  // flush tiny values (not produced by the tests)
    unsigned h = sign | (exp << 10) | (man >> 13);
    unsigned rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
    return (unsigned short)h;
}

// mma.sync.m16n8k16.row.col f32.f16.f16.f32, per the PTX ISA fragment layout:
// g = lane / 4, t = lane % 4; A (16×16): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..),
// a3 = (g+8, 2t+8..); B (16×8, k × n): b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g);
// C (16×8): c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1).
static void emu_mma_16816(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                          unsigned b0, unsigned b1) {
    int w = warp_id(), l = lane_id();
    unsigned* f = g_frag[w][l];
    f[0] = a0; f[1] = a1; f[2] = a2; f[3] = a3; f[4] = b0; f[5] = b1;
    __syncwarp();
    float A[16][16], B[16][8];
    for (int lane = 0; lane < 32; ++lane) {
        int g = lane / 4, t = lane % 4;
        unsigned* r = g_frag[w][lane];
        auto lo = [](unsigned v) { return half_to_float(v & 0xffff); };
        auto hi = [](unsigned v) { return half_to_float(v >> 16); };
        A[g][2 * t] = lo(r[0]); A[g][2 * t + 1] = hi(r[0]);
        A[g + 8][2 * t] = lo(r[1]); A[g + 8][2 * t + 1] = hi(r[1]);
        A[g][2 * t + 8] = lo(r[2]); A[g][2 * t + 9] = hi(r[2]);
        A[g + 8][2 * t + 8] = lo(r[3]); A[g + 8][2 * t + 9] = hi(r[3]);
        B[2 * t][g] = lo(r[4]); B[2 * t + 1][g] = hi(r[4]);
        B[2 * t + 8][g] = lo(r[5]); B[2 * t + 9][g] = hi(r[5]);
    }
    __syncwarp();
    int g = l / 4, t = l % 4;
    auto dot = [&](int row, int col) {
        float s = 0;
        for (int kk = 0; kk < 16; ++kk) s += A[row][kk] * B[kk][col];
        return s;
    };
    c[0] += dot(g, 2 * t);
    c[1] += dot(g, 2 * t + 1);
    c[2] += dot(g + 8, 2 * t);
    c[3] += dot(g + 8, 2 * t + 1);
}

// scripts/kernel-emu.sh compiles deliberately broken copies of topk.cu through QK_TOPK_SOURCE.
#ifndef QK_TOPK_SOURCE
#define QK_TOPK_SOURCE "../topk.cu"
#endif
#include QK_TOPK_SOURCE

// ---- launching ------------------------------------------------------------------------------
static void launch(unsigned grid, unsigned threads, size_t smem, const std::function<void()>& body) {
    gridDim.x = grid;
    blockDim.x = threads;
    g_dynamic_smem.assign(smem, 0xAB);  // garbage, as on a GPU
    for (unsigned b = 0; b < grid; ++b) {
        g_block_barrier = std::make_unique<std::barrier<>>(threads);
        g_warp_barriers.clear();
        for (unsigned w = 0; w < (threads + 31) / 32; ++w)
            g_warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < threads; ++t) {
            ts.emplace_back([=, &body] {
                blockIdx.x = b;
                threadIdx.x = t;
                body();
            });
        }
        for (auto& t : ts) t.join();
    }
}

// ---- checks ---------------------------------------------------------------------------------
static int failures = 0;

// Brute-force top-k of each row of `scores` (m × n) with visibility `vis(r, c)`; compares with
// the kernel's lists (ids best first). Differences must be ties within `tol`.
static void compare_lists(const char* name, int m, int n, int k,
                          const std::function<float(int, int)>& score,
                          const std::function<bool(int, int)>& vis, const std::vector<float>& bs,
                          const std::vector<unsigned>& bi, float tol) {
    int bad = 0;
    for (int r = 0; r < m; ++r) {
        std::vector<std::pair<float, int>> all;
        for (int c = 0; c < n; ++c)
            if (vis(r, c)) all.push_back({score(r, c), c});
        std::sort(all.begin(), all.end(), [](auto a, auto b) { return a.first > b.first; });
        int valid = std::min<int>(k, all.size());
        float kth = valid ? all[valid - 1].first : -INFINITY;
        for (int j = 0; j < k; ++j) {
            float s = bs[(size_t)r * k + j];
            unsigned id = bi[(size_t)r * k + j];
            if (j >= valid) {
                if (id != 0xffffffffu || !std::isinf(s)) ++bad;
                continue;
            }
            if (id >= (unsigned)n || !vis(r, id)) { ++bad; continue; }
            if (std::fabs(score(r, id) - s) > tol) ++bad;  // reported score is the id's score
            if (s < kth - tol) ++bad;                        // and it belongs in the top k
            if (j > 0 && s > bs[(size_t)r * k + j - 1] + tol) ++bad;  // best first
            for (int j2 = 0; j2 < j; ++j2)
                if (bi[(size_t)r * k + j2] == id) ++bad;  // no duplicates
        }
    }
    std::printf("%-44s %s (%d problems)\n", name, bad ? "FAIL" : "ok", bad);
    if (bad) ++failures;
}

static void init_lists(std::vector<float>& bs, std::vector<unsigned>& bi) {
    long long count = bs.size();
    float* ps = bs.data();
    unsigned* pi = bi.data();
    launch((unsigned)((count + 255) / 256 > 4 ? 4 : (count + 255) / 256), 256, 0,
           [&] { topk_init(ps, pi, count); });
}

static void check_select(int rows, int cols_total, int tile, int k, bool causal, int row0,
                         unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> s((size_t)rows * cols_total);
    for (auto& v : s) v = std::round(u(rng) * 4096) / 4096;  // some exact ties
    std::vector<float> bs((size_t)rows * k);
    std::vector<unsigned> bi((size_t)rows * k);
    init_lists(bs, bi);
    for (int col0 = 0; col0 < cols_total; col0 += tile) {
        int cols = std::min(tile, cols_total - col0);
        std::vector<float> t((size_t)rows * cols);
        for (int r = 0; r < rows; ++r)
            for (int c = 0; c < cols; ++c) t[(size_t)r * cols + c] = s[(size_t)r * cols_total + col0 + c];
        launch((rows + SEL_WARPS - 1) / SEL_WARPS, SEL_WARPS * 32, 0, [&] {
            topk_select_tile(t.data(), cols, rows, cols, row0, col0, causal, k, bs.data(), bi.data());
        });
    }
    char name[128];
    std::snprintf(name, sizeof name, "select rows %d keys %d tile %d k %d%s", rows, cols_total, tile,
                  k, causal ? " causal" : "");
    compare_lists(name, rows, cols_total, k, [&](int r, int c) { return s[(size_t)r * cols_total + c]; },
                  [&](int r, int c) { return !causal || c <= row0 + r; }, bs, bi, 0.0f);
}

static size_t fused_smem(int dp) {
    return (size_t)(FUSED_BM + FUSED_BN) * (dp + 8) * 2 + (size_t)FUSED_BM * FUSED_CAP * 8 +
           4 * FUSED_CAP * 4 + FUSED_BM * 8;
}

static void check_fused(int m, int n, int d, int k, bool causal, int row0, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0, 1);
    int dp = (d + 15) / 16 * 16;
    int m_pad = (m + 63) / 64 * 64, n_pad = (n + 63) / 64 * 64;
    std::vector<unsigned short> q((size_t)m_pad * dp, 0), kk((size_t)n_pad * dp, 0);
    std::vector<float> qf((size_t)m * d), kf((size_t)n * d);
    for (int i = 0; i < m; ++i)
        for (int j = 0; j < d; ++j) {
            q[(size_t)i * dp + j] = float_to_half(g(rng));
            qf[(size_t)i * d + j] = half_to_float(q[(size_t)i * dp + j]);
        }
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < d; ++j) {
            kk[(size_t)i * dp + j] = float_to_half(g(rng));
            kf[(size_t)i * d + j] = half_to_float(kk[(size_t)i * dp + j]);
        }
    std::vector<float> bs((size_t)m * k);
    std::vector<unsigned> bi((size_t)m * k);
    init_lists(bs, bi);
    launch(m_pad / 64, FUSED_WARPS * 32, fused_smem(dp), [&] {
        fused_score_topk(q.data(), kk.data(), m, n, dp, row0, causal, k, bs.data(), bi.data());
    });
    auto score = [&](int r, int c) {
        double s = 0;
        for (int j = 0; j < d; ++j) s += (double)qf[(size_t)r * d + j] * kf[(size_t)c * d + j];
        return (float)s;
    };
    char name[128];
    std::snprintf(name, sizeof name, "fused m %d n %d d %d k %d%s", m, n, d, k,
                  causal ? " causal" : "");
    compare_lists(name, m, n, k, score, [&](int r, int c) { return !causal || c <= row0 + r; }, bs,
                  bi, 1e-3f * d);
}


// The radix path (`radix_select_rows` + `sort_rows_desc`) must equal the CPU's top-k exactly:
// scores descending with −0 below +0 (f32 `total_cmp`), equal scores by ascending id, the same
// ids and score bits; rows that see fewer than k keys padded with PAD_ID / −∞. `grid` > 0 rounds
// the scores to multiples of 1/grid (many exact ties, also at the threshold), < 0 makes them all
// equal; `zeros` mixes −0
// and +0. A guard after the `packed` buffer catches writes past a row's slots.
static void check_radix(int rows, int cols, int k, bool causal, int row0, int grid, bool zeros,
                        bool in_smem, unsigned seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0, 1);
    std::vector<float> s((size_t)rows * cols);
    for (auto& v : s) {
        v = g(rng) * 100.0f;
        if (grid > 0) v = std::round(v / 100.0f * grid) / grid;
        if (grid < 0) v = 1.5f;
        if (zeros && rng() % 4 == 0) v = (rng() % 2) ? 0.0f : -0.0f;
    }
    int kp = 1;
    while (kp < k) kp <<= 1;
    const size_t guard = 4096;
    const unsigned long long guard_value = 0x5a5a5a5a5a5a5a5aull;
    std::vector<unsigned long long> packed((size_t)rows * kp + guard, guard_value);
    std::vector<float> bs((size_t)rows * k, 1.0f);
    std::vector<unsigned> bi((size_t)rows * k, 7u);
    launch(rows, RADIX_THREADS, 0, [&] {
        radix_select_rows(s.data(), cols, rows, cols, row0, causal, k, kp, packed.data());
    });
    int bad = 0;
    for (size_t i = (size_t)rows * kp; i < packed.size(); ++i)
        if (packed[i] != guard_value) ++bad;
    launch(rows, RADIX_THREADS, in_smem ? (size_t)kp * 8 : 0, [&] {
        sort_rows_desc(packed.data(), rows, kp, k, in_smem, bs.data(), bi.data());
    });
    auto better = [](std::pair<float, int> a, std::pair<float, int> b) {
        if (a.first != b.first) return a.first > b.first;
        if (std::signbit(a.first) != std::signbit(b.first)) return std::signbit(b.first);
        return a.second < b.second;
    };
    for (int r = 0; r < rows; ++r) {
        std::vector<std::pair<float, int>> all;
        int visible = causal ? std::min(cols, row0 + r + 1) : cols;
        for (int c = 0; c < visible; ++c) all.push_back({s[(size_t)r * cols + c], c});
        std::sort(all.begin(), all.end(), better);
        for (int j = 0; j < k; ++j) {
            float got_s = bs[(size_t)r * k + j];
            unsigned got_i = bi[(size_t)r * k + j];
            if (j >= (int)all.size()) {
                if (got_i != 0xffffffffu || !(std::isinf(got_s) && got_s < 0)) ++bad;
                continue;
            }
            if (got_i != (unsigned)all[j].second ||
                __float_as_uint(got_s) != __float_as_uint(all[j].first))
                ++bad;
        }
    }
    char name[128];
    std::snprintf(name, sizeof name, "radix rows %d keys %d k %d%s%s%s%s", rows, cols, k,
                  causal ? " causal" : "", grid > 0 ? " ties" : "", zeros ? " ±0" : "",
                  in_smem ? " smem" : "");
    std::printf("%-44s %s (%d problems)\n", name, bad ? "FAIL" : "ok", bad);
    if (bad) ++failures;
}

static void radix_checks() {
    check_radix(3, 1000, 1, false, 0, 0, false, true, 21);      // k = 1
    check_radix(3, 777, 777, false, 0, 0, false, true, 22);     // k = n: every key, sorted
    check_radix(4, 3000, 2000, false, 0, 0, false, false, 23);  // k > 1,024, sorted in place
    check_radix(4, 3000, 1500, false, 0, 4, false, true, 24);   // ties at the threshold
    check_radix(2, 2048, 700, false, 0, 1, true, false, 25);    // few values, ±0 mixed
    check_radix(3, 500, 300, false, 0, -1, false, true, 26);    // all equal: lowest ids win
    check_radix(9, 1500, 1100, true, 0, 8, false, true, 27);    // causal: rows see < k keys
    check_radix(6, 2500, 1200, true, 1000, 0, false, false, 28);  // causal with an offset
    check_radix(2, 20000, 16000, false, 0, 64, false, false, 29);  // a pooled kNN's k
}

int main(int argc, char** argv) {
    // `kernel-emu radix`: only the radix path (the deliberate-bug runs of kernel-emu.sh).
    if (argc > 1 && std::strcmp(argv[1], "radix") == 0) {
        radix_checks();
        std::printf(failures ? "%d check(s) failed\n" : "radix checks passed\n", failures);
        return failures ? 1 : 0;
    }
    // Selection over GEMM tiles: several tiles, k below and above a merge buffer, causal rows
    // (including rows that see fewer than k keys), row counts not a multiple of the block.
    check_select(13, 1000, 1000, 10, false, 0, 1);
    check_select(11, 3000, 700, 100, false, 0, 2);
    check_select(9, 2500, 1024, 300, false, 0, 3);
    check_select(20, 900, 256, 50, true, 0, 4);
    check_select(17, 1200, 512, 64, true, 600, 5);
    check_select(5, 2000, 2000, 1, false, 0, 6);
    check_select(3, 3000, 1024, 1024, false, 0, 13);  // the largest k: lists longer than a buffer
    check_select(9, 1500, 700, 1024, true, 0, 14);    // causal rows with fewer than k keys
    // Fused scores and selection: padding of rows, keys and dimension; causal with an offset.
    check_fused(70, 300, 64, 10, false, 0, 7);
    check_fused(64, 500, 40, 100, false, 0, 8);
    check_fused(100, 200, 32, 150, false, 0, 9);
    check_fused(90, 256, 64, 20, true, 0, 10);
    check_fused(64, 400, 16, 30, true, 300, 11);
    check_fused(64, 130, 128, 1, false, 0, 12);
    check_fused(64, 1100, 16, 1024, false, 0, 15);
    check_fused(70, 1300, 16, 1024, true, 200, 16);
    // Any k ≤ n: radix select over whole rows, then the sort.
    radix_checks();
    if (failures) {
        std::printf("%d check(s) failed\n", failures);
        return 1;
    }
    std::printf("all kernel emulation checks passed\n");
    return 0;
}
