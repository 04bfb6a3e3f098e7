// Exact top-k by inner product on the GPU: queries × keys, f16 inputs, f32 scores.
//
// Compiled at run time by NVRTC (`qkindex-gpu` loads this file with `include_str!`). It includes
// no header, so that it compiles with NVRTC alone: f16 values travel as their 16-bit patterns and
// the tensor-core product is inline PTX.
//
// Every query row keeps a running top-k in global memory, best first: `best_s` (scores, −inf when
// empty) and `best_i` (key ids, 0xFFFFFFFF when empty). New scores are compared with the row's
// current k-th score; those above it are gathered into a per-row candidate buffer in shared
// memory, and a full buffer is merged into the running list by one warp (`warp_merge`). After the
// first few thousand keys almost nothing passes the filter, so the cost is reading the scores.
//
// Two ways to feed the filter:
//   * `topk_select_tile`: scores already computed (a cuBLAS GEMM tile, row-major f32); one warp
//     per query row.
//   * `fused_score_topk`: computes the scores itself with `mma.sync` (m16n8k16, f16 in, f32
//     accumulate) on tiles of 64 queries × 64 keys held in shared memory and filters them in
//     registers, so the score matrix never goes through global memory.
//
// Layout contract (the host pads): queries and keys are row-major with `dp` columns, dp a multiple
// of 16 (zero padding keeps inner products unchanged); for the fused kernel the query rows are
// padded to a multiple of 64 and the key rows to a multiple of 64.

// Under QK_EMULATION (kernels/emu/), a host harness compiles this file as C++ and runs each block's
// threads as OS threads; it supplies the tensor-core product and the dynamic shared memory.
#ifndef QK_EMULATION
#define QK_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

#define WARP 32
#define FULL_MASK 0xffffffffu
#define PAD_ID 0xffffffffu
#define NEG_INF __int_as_float(0xff800000)

// ---------------------------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------------------------

// Sorts `n` (a power of two, ≤ capacity) candidates in shared memory, best first, by one warp.
__device__ void warp_bitonic_sort_desc(float* s, unsigned* id, int n) {
    const int lane = threadIdx.x % WARP;
    for (int size = 2; size <= n; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = lane; i < n; i += WARP) {
                int j = i ^ stride;
                if (j > i) {
                    bool desc = (i & size) == 0;
                    float a = s[i], b = s[j];
                    bool swap = desc ? (a < b) : (a > b);
                    if (swap) {
                        s[i] = b;
                        s[j] = a;
                        unsigned t = id[i];
                        id[i] = id[j];
                        id[j] = t;
                    }
                }
            }
            __syncwarp();
        }
    }
}

// Number of entries of the descending list `s[0..n)` that are strictly greater than `x`.
__device__ __forceinline__ int count_greater(const float* s, int n, float x) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (s[mid] > x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// Number of entries of the descending list `s[0..n)` that are greater than or equal to `x`.
__device__ __forceinline__ int count_greater_equal(const float* s, int n, float x) {
    int lo = 0, hi = n;
    while (lo < hi) {
        int mid = (lo + hi) >> 1;
        if (s[mid] >= x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// Merges `cnt` candidates (shared `cs`/`ci`, capacity `cap` ≥ next power of two of cnt) into the
// running list `rs`/`ri` (global, `k` entries, best first), keeping the best k. Called by all 32
// lanes of one warp; `pos` is shared scratch of `cap` ints. Returns the new k-th score.
//
// A merge of two sorted lists places running entry i at i + #(candidates > it) and candidate j
// (after sorting) at j + #(running entries ≥ it): a permutation of 0..k+cnt, with running entries
// first among equals. Candidate places are computed first (from the old list); running entries
// only move towards the end, so moving them in chunks from the end never overwrites an unread one.
__device__ float warp_merge(float* rs, unsigned* ri, int k, float* cs, unsigned* ci, int* pos,
                            int cnt) {
    const int lane = threadIdx.x % WARP;
    int n = 1;
    while (n < cnt) n <<= 1;
    for (int i = cnt + lane; i < n; i += WARP) {
        cs[i] = NEG_INF;
        ci[i] = PAD_ID;
    }
    __syncwarp();
    warp_bitonic_sort_desc(cs, ci, n);
    for (int j = lane; j < cnt; j += WARP) {
        pos[j] = j + count_greater_equal(rs, k, cs[j]);
    }
    __syncwarp();
    // Running entries, last chunk first. c_i = #(candidates > s_i) grows with i, so once a chunk's
    // first entry does not move, no earlier entry moves either.
    for (int base = ((k - 1) / WARP) * WARP; base >= 0; base -= WARP) {
        int i = base + lane;
        float s = NEG_INF;
        unsigned id = PAD_ID;
        int dst = k;
        if (i < k) {
            s = rs[i];
            id = ri[i];
            dst = i + count_greater(cs, cnt, s);
        }
        int first_moves = __shfl_sync(FULL_MASK, dst != i ? 1 : 0, 0);
        __syncwarp();
        if (i < k && dst != i && dst < k) {
            rs[dst] = s;
            ri[dst] = id;
        }
        __syncwarp();
        if (!first_moves) break;
    }
    for (int j = lane; j < cnt; j += WARP) {
        int p = pos[j];
        if (p < k) {
            rs[p] = cs[j];
            ri[p] = ci[j];
        }
    }
    __syncwarp();
    return rs[k - 1];
}

extern "C" __global__ void topk_init(float* best_s, unsigned* best_i, long long count) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long step = (long long)gridDim.x * blockDim.x;
    for (; i < count; i += step) {
        best_s[i] = NEG_INF;
        best_i[i] = PAD_ID;
    }
}

// ---------------------------------------------------------------------------------------------
// Selection over a score tile (the unfused path)
// ---------------------------------------------------------------------------------------------

#define SEL_WARPS 8
#define SEL_LOADS 4                        // scores read per lane per step
#define SEL_STEP (WARP * SEL_LOADS)        // 128 columns per step
#define SEL_CAP 256                        // candidates buffered per row before a merge

// scores: `rows × cols` row-major with leading dimension `ld` (a GEMM tile): row r is query
// `row0 + r` (its running list at best_s + r * k), column c is key `col0 + c`.
// One warp per row; causal rows skip keys past their own position.
extern "C" __global__ void __launch_bounds__(SEL_WARPS * WARP)
topk_select_tile(const float* __restrict__ scores, long long ld, int rows, int cols,
                 int row0, int col0, int causal, int k, float* best_s, unsigned* best_i) {
    __shared__ float cand_s[SEL_WARPS][SEL_CAP];
    __shared__ unsigned cand_i[SEL_WARPS][SEL_CAP];
    __shared__ int cand_pos[SEL_WARPS][SEL_CAP];
    const int warp = threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    const int r = blockIdx.x * SEL_WARPS + warp;
    if (r >= rows) return;
    float* rs = best_s + (long long)r * k;
    unsigned* ri = best_i + (long long)r * k;
    const float* row = scores + (long long)r * ld;
    int limit = cols;
    if (causal) {
        int visible = row0 + r - col0 + 1;  // keys col0..=row0+r
        if (visible < limit) limit = visible;
    }
    float thr = rs[k - 1];
    int cnt = 0;
    const unsigned below = (1u << lane) - 1u;
    for (int base = 0; base < limit; base += SEL_STEP) {
        float v[SEL_LOADS];
#pragma unroll
        for (int t = 0; t < SEL_LOADS; ++t) {
            int c = base + t * WARP + lane;
            v[t] = c < limit ? row[c] : NEG_INF;
        }
#pragma unroll
        for (int t = 0; t < SEL_LOADS; ++t) {
            bool pass = v[t] > thr;
            unsigned mask = __ballot_sync(FULL_MASK, pass);
            if (pass) {
                int p = cnt + __popc(mask & below);
                cand_s[warp][p] = v[t];
                cand_i[warp][p] = (unsigned)(col0 + base + t * WARP + lane);
            }
            cnt += __popc(mask);
        }
        if (cnt > SEL_CAP - SEL_STEP) {
            __syncwarp();
            thr = warp_merge(rs, ri, k, cand_s[warp], cand_i[warp], cand_pos[warp], cnt);
            cnt = 0;
        }
    }
    if (cnt > 0) {
        __syncwarp();
        warp_merge(rs, ri, k, cand_s[warp], cand_i[warp], cand_pos[warp], cnt);
    }
}

// ---------------------------------------------------------------------------------------------
// Fused scores and selection
// ---------------------------------------------------------------------------------------------

#define FUSED_BM 64                        // query rows per block (16 per warp)
#define FUSED_BN 64                        // keys per step
#define FUSED_WARPS 4
#define FUSED_CAP 128                      // candidates buffered per row (≥ 2 × FUSED_BN)

__device__ __forceinline__ void mma_16816(float* c, unsigned a0, unsigned a1, unsigned a2,
                                          unsigned a3, unsigned b0, unsigned b1) {
#ifdef QK_EMULATION
    emu_mma_16816(c, a0, a1, a2, a3, b0, b1);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// Copies `FUSED_BN` (or FUSED_BM) rows of `dp` halves from global (row stride dp) into shared
// (row stride dp + 8), 16 bytes per thread per step.
__device__ __forceinline__ void load_rows(unsigned short* dst, const unsigned short* src, int dp,
                                          int nrows) {
    const int vecs_per_row = dp / 8;
    const int total = nrows * vecs_per_row;
    const int sstride = dp + 8;
    for (int v = threadIdx.x; v < total; v += blockDim.x) {
        int r = v / vecs_per_row;
        int c = (v % vecs_per_row) * 8;
        uint4 x = *reinterpret_cast<const uint4*>(src + (long long)r * dp + c);
        *reinterpret_cast<uint4*>(dst + r * sstride + c) = x;
    }
}

// Appends a score that beats the row's threshold to the row's candidate buffer.
__device__ __forceinline__ void offer(float s, unsigned id, int row, const float* thr,
                                      float (*cs)[FUSED_CAP], unsigned (*ci)[FUSED_CAP],
                                      int* cnt) {
    if (s > thr[row]) {
        int p = atomicAdd(&cnt[row], 1);
        cs[row][p] = s;
        ci[row][p] = id;
    }
}

// q: m_pad × dp f16 bits; k: n_pad × dp f16 bits; m real queries, n real keys. Block b computes
// rows 64b..64b+63 against every key, keeping each row's running list at best_s + row * k. Row r
// is query `row0 + r` of the whole problem: with `causal` it sees keys 0..=row0 + r only.
// Dynamic shared memory: see `fused_smem_bytes` on the host.
extern "C" __global__ void __launch_bounds__(FUSED_WARPS * WARP)
fused_score_topk(const unsigned short* __restrict__ q, const unsigned short* __restrict__ keys,
                 int m, int n, int dp, int row0, int causal, int k, float* best_s,
                 unsigned* best_i) {
    QK_DYNAMIC_SMEM(smem);
    const int sstride = dp + 8;
    unsigned short* qs = reinterpret_cast<unsigned short*>(smem);
    unsigned short* ks = qs + FUSED_BM * sstride;
    float (*cs)[FUSED_CAP] = reinterpret_cast<float (*)[FUSED_CAP]>(ks + FUSED_BN * sstride);
    unsigned (*ci)[FUSED_CAP] = reinterpret_cast<unsigned (*)[FUSED_CAP]>(cs + FUSED_BM);
    int (*pos)[FUSED_CAP] = reinterpret_cast<int (*)[FUSED_CAP]>(ci + FUSED_BM);
    float* thr = reinterpret_cast<float*>(pos + FUSED_WARPS);
    int* cnt = reinterpret_cast<int*>(thr + FUSED_BM);

    const int warp = threadIdx.x / WARP;
    const int lane = threadIdx.x % WARP;
    const int g = lane >> 2;       // fragment row group
    const int t = lane & 3;        // thread in group
    const int q0 = blockIdx.x * FUSED_BM;

    load_rows(qs, q + (long long)q0 * dp, dp, FUSED_BM);
    for (int r = threadIdx.x; r < FUSED_BM; r += blockDim.x) {
        int row = q0 + r;
        thr[r] = row < m ? best_s[(long long)row * k + k - 1] : NEG_INF;
        cnt[r] = 0;
    }
    int key_end = n;
    if (causal) {
        int last = row0 + q0 + FUSED_BM;  // one past the block's last query position
        if (last < key_end) key_end = last;
    }
    const int wr = warp * 16;      // the warp's first row in the block
    const int row_a = wr + g;      // rows this lane scores: row_a and row_a + 8
    const int row_b = row_a + 8;
    const int ksteps = dp / 16;

    for (int k0 = 0; k0 < key_end; k0 += FUSED_BN) {
        __syncthreads();  // the previous step's keys are no longer read
        load_rows(ks, keys + (long long)k0 * dp, dp, FUSED_BN);
        __syncthreads();

        float acc[FUSED_BN / 8][4];
#pragma unroll
        for (int nt = 0; nt < FUSED_BN / 8; ++nt) {
            acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
        }
        for (int kk = 0; kk < ksteps; ++kk) {
            const int col = kk * 16 + t * 2;
            unsigned a0 = *reinterpret_cast<const unsigned*>(qs + row_a * sstride + col);
            unsigned a1 = *reinterpret_cast<const unsigned*>(qs + row_b * sstride + col);
            unsigned a2 = *reinterpret_cast<const unsigned*>(qs + row_a * sstride + col + 8);
            unsigned a3 = *reinterpret_cast<const unsigned*>(qs + row_b * sstride + col + 8);
#pragma unroll
            for (int nt = 0; nt < FUSED_BN / 8; ++nt) {
                const unsigned short* kr = ks + (nt * 8 + g) * sstride + col;
                unsigned b0 = *reinterpret_cast<const unsigned*>(kr);
                unsigned b1 = *reinterpret_cast<const unsigned*>(kr + 8);
                mma_16816(acc[nt], a0, a1, a2, a3, b0, b1);
            }
        }

        // Filter in registers: acc[nt][0..1] are row_a, keys k0 + nt*8 + 2t + {0,1};
        // acc[nt][2..3] are row_b, the same keys.
        const int ga = q0 + row_a, gb = q0 + row_b;  // rows of this launch
        const int lim_a = causal ? min(key_end, row0 + ga + 1) : key_end;
        const int lim_b = causal ? min(key_end, row0 + gb + 1) : key_end;
        const bool live_a = ga < m, live_b = gb < m;
#pragma unroll
        for (int nt = 0; nt < FUSED_BN / 8; ++nt) {
            const int key = k0 + nt * 8 + t * 2;
            if (live_a && key < lim_a) offer(acc[nt][0], key, row_a, thr, cs, ci, cnt);
            if (live_a && key + 1 < lim_a) offer(acc[nt][1], key + 1, row_a, thr, cs, ci, cnt);
            if (live_b && key < lim_b) offer(acc[nt][2], key, row_b, thr, cs, ci, cnt);
            if (live_b && key + 1 < lim_b) offer(acc[nt][3], key + 1, row_b, thr, cs, ci, cnt);
        }
        __syncwarp();

        // Merge the warp's rows whose buffer could not take another step (or at the end).
        const bool last_step = k0 + FUSED_BN >= key_end;
        for (int rr = 0; rr < 16; ++rr) {
            const int r = wr + rr;
            const int c = cnt[r];
            if (c > 0 && (last_step || c > FUSED_CAP - FUSED_BN)) {
                const int row = q0 + r;
                float kth = warp_merge(best_s + (long long)row * k, best_i + (long long)row * k,
                                       k, cs[r], ci[r], pos[warp], c);
                if (lane == 0) {
                    thr[r] = kth;
                    cnt[r] = 0;
                }
                __syncwarp();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Any k ≤ n: radix select over whole rows of scores, then a sort of the k chosen
// ---------------------------------------------------------------------------------------------
//
// For k beyond what the running lists above are meant for (k > 1,024: a pooled kNN's pools) the
// host computes whole rows of scores (a cuBLAS GEMM over every visible key) and selects in two
// launches, one block per query row:
//
//   1. `radix_select_rows`: every (score, key id) pair is one 64-bit key, `order(score) << 32 |
//      ~id` (`order` maps f32 to u32 monotonically: the CPU's `order_key`, so −0 < +0). Higher
//      is better, and among equal scores the lower id is better, which is the CPU's tie rule; all
//      keys of a row are distinct, so the k-th largest key T is unique and exactly k keys are ≥ T.
//      T is found most significant byte first (RadiK / RTop-K's idea): a 256-bin histogram of the
//      keys that share the bytes decided so far, the bin where the count from the top reaches k,
//      and an early stop once that bin holds exactly the keys still needed (with distinct scores
//      that is after two or three of the eight passes; ties at the threshold go on into the id
//      bytes, which resolves them exactly). The keys ≥ T are then compacted, unordered, into the
//      row's slots of `packed` (`kp` = k rounded up to a power of two per row; the rest is 0,
//      below every real key). A row that sees at most k keys takes them all.
//   2. `sort_rows_desc`: a bitonic sort of each row's `kp` keys, descending (in shared memory
//      when `kp` keys fit, else in place in `packed`), unpacked into `best_s` / `best_i` (k
//      each; 0 keys become PAD_ID / −∞).

#define RADIX_THREADS 256
#define RADIX_BINS 256

__device__ __forceinline__ unsigned order_key(float s) {
    unsigned b = __float_as_uint(s);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float from_order_key(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ unsigned long long pack_key(float s, unsigned id) {
    return ((unsigned long long)order_key(s) << 32) | (unsigned long long)(~id);
}

// scores: `rows × cols` row-major with leading dimension `ld`; column c is key c. Row r is query
// `row0 + r`: with `causal` it sees keys 0..=row0 + r only. packed: `rows × kp`.
extern "C" __global__ void __launch_bounds__(RADIX_THREADS)
radix_select_rows(const float* __restrict__ scores, long long ld, int rows, int cols, int row0,
                  int causal, int k, int kp, unsigned long long* packed) {
    __shared__ int hist[RADIX_BINS];
    __shared__ unsigned long long s_prefix;
    __shared__ int s_need;
    __shared__ int s_done;
    __shared__ int s_count;
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* row = scores + (long long)r * ld;
    unsigned long long* out = packed + (long long)r * kp;
    int limit = cols;
    if (causal) {
        long long visible = (long long)row0 + r + 1;
        if (visible < limit) limit = (int)visible;
    }
    const int take = k < limit ? k : limit;

    // The threshold: keys ≥ lo are the row's top `take` (0 takes every visible key).
    unsigned long long lo = 0;
    if (take < limit) {
        if (threadIdx.x == 0) {
            s_prefix = 0;
            s_need = take;
            s_done = 0;
        }
        for (int shift = 56; shift >= 0; shift -= 8) {
            for (int b = threadIdx.x; b < RADIX_BINS; b += blockDim.x) hist[b] = 0;
            __syncthreads();
            const unsigned long long prefix = s_prefix;
            const unsigned long long high = shift == 56 ? 0ull : ~0ull << (shift + 8);
            for (int c = threadIdx.x; c < limit; c += blockDim.x) {
                unsigned long long key = pack_key(row[c], (unsigned)c);
                if ((key & high) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                int need = s_need, above = 0;
                for (int b = RADIX_BINS - 1; b >= 0; --b) {
                    if (above + hist[b] >= need) {
                        need -= above;
                        s_prefix = prefix | ((unsigned long long)b << shift);
                        s_need = need;
                        s_done = hist[b] == need;  // the whole bin is taken: stop here
                        break;
                    }
                    above += hist[b];
                }
            }
            __syncthreads();
            if (s_done) break;
        }
        lo = s_prefix;
    }
    if (threadIdx.x == 0) s_count = 0;
    __syncthreads();
    for (int c = threadIdx.x; c < limit; c += blockDim.x) {
        unsigned long long key = pack_key(row[c], (unsigned)c);
        if (key >= lo) {
            int p = atomicAdd(&s_count, 1);
            out[p] = key;
        }
    }
    for (int p = take + threadIdx.x; p < kp; p += blockDim.x) out[p] = 0ull;
}

// packed: `rows × kp` keys from `radix_select_rows` (kp a power of two); sorts each row
// descending and writes its first k entries to best_s / best_i (`rows × k`). With `in_smem` the
// row is sorted in dynamic shared memory (kp × 8 bytes), else in place.
extern "C" __global__ void __launch_bounds__(RADIX_THREADS)
sort_rows_desc(unsigned long long* packed, int rows, int kp, int k, int in_smem, float* best_s,
               unsigned* best_i) {
    QK_DYNAMIC_SMEM(smem);
    const int r = blockIdx.x;
    if (r >= rows) return;
    unsigned long long* g = packed + (long long)r * kp;
    unsigned long long* buf = in_smem ? reinterpret_cast<unsigned long long*>(smem) : g;
    if (in_smem) {
        for (int i = threadIdx.x; i < kp; i += blockDim.x) buf[i] = g[i];
        __syncthreads();
    }
    for (int size = 2; size <= kp; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < kp; i += blockDim.x) {
                int j = i ^ stride;
                if (j > i) {
                    bool desc = (i & size) == 0;
                    unsigned long long a = buf[i], b = buf[j];
                    if (desc ? (a < b) : (a > b)) {
                        buf[i] = b;
                        buf[j] = a;
                    }
                }
            }
            __syncthreads();
        }
    }
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        unsigned long long key = buf[j];
        long long o = (long long)r * k + j;
        if (key == 0ull) {
            best_s[o] = NEG_INF;
            best_i[o] = PAD_ID;
        } else {
            best_s[o] = from_order_key((unsigned)(key >> 32));
            best_i[o] = ~(unsigned)key;
        }
    }
}
