// Kernels of the Llama forward pass for the driver's CUDA backend: f32 data throughout, row-major.
// They compute what `model/src/ops.rs` (RMSNorm, RoPE, SwiGLU, causal grouped-query
// attention) and `driver/src/retrieval/softmax.rs` (online-softmax parts and their exact merge)
// compute on the CPU; the GEMMs of the linear layers are cuBLAS's, not here.
// Each kernel is one operation of the `Backend` trait (`model/src/backend.rs`); the order
// in which the host launches them is the layer written once in `model/src/block.rs`, and
// `model/src/cuda/kernels.rs` holds one launch per kernel.
//
// Compiled at run time by NVRTC with default options (no --use_fast_math: `expf`, `sqrtf` and
// division are the precise ones). It includes no header, so that it compiles with NVRTC alone.
//
// Launch configurations are written above each kernel as
//   grid (x, y), block (threads), dynamic shared memory (bytes).
// Element-wise kernels loop grid-stride, so any grid works: ceil(count / 256) blocks of 256
// threads, capped at e.g. 65,535 (or a few per SM), is the suggestion.
//
// Attention layouts (as in ops.rs):
//   q, out      row-major n × (n_heads · hd); query head h of row r at q[r·n_heads·hd + h·hd].
//   k/v cache   n_kv blocks of row-major capacity × hd: position p of KV head g at
//               cache[(g·capacity + p)·hd].
//   GQA         query head h reads KV head g(h) = h / (n_heads / n_kv); n_heads % n_kv == 0.
//   scores      scale · q·k (scale is the host's, 1/sqrt(hd) for Llama); softmax via `expf`.
// Attention kernels need hd % 4 == 0, hd ≤ 128 (LL_MAX_HD), and q, k_cache, v_cache 16-byte
// aligned (they load float4).
//
// Online-softmax parts (`Partial` in softmax.rs): per query head, part_m = largest scaled score
// (−inf for a part of no keys), part_l = Σ exp(s − part_m), part_o = Σ exp(s − part_m) · v
// (hd values, unnormalized). An empty part is (−inf, 0, zeros). Parts merge exactly:
// out = Σ_c exp(m_c − M) o_c / Σ_c exp(m_c − M) l_c with M = max_c m_c, empty parts skipped;
// a head with no keys at all gets zeros.

// Under QK_EMULATION (kernels/emu/llama_emu.cpp), a host harness compiles this file as C++ and
// runs each block's threads as OS threads.

#define LL_WARP 32
#define LL_FULL 0xffffffffu
#define LL_NONE 0xffffffffu
#define LL_NEG_INF __int_as_float(0xff800000)
#define LL_MAX_HD 128

// ---------------------------------------------------------------------------------------------
// Shared pieces
// ---------------------------------------------------------------------------------------------

// Sum / max over the 32 lanes of a warp; every lane gets the same value (xor butterfly: lanes i
// and i^o add the same two values, so they stay equal). All 32 lanes must call it.
__device__ __forceinline__ float ll_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(LL_FULL, v, o);
    return v;
}

__device__ __forceinline__ float ll_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(LL_FULL, v, o));
    return v;
}

// exp(s − m) with exp(−inf − m) = 0 (also when m is −inf: no NaN from −inf − −inf).
__device__ __forceinline__ float ll_exp_shift(float s, float m) {
    return s == LL_NEG_INF ? 0.f : expf(s - m);
}

__device__ __forceinline__ float ll_dot4(float4 a, float4 b) {
    return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

// ---------------------------------------------------------------------------------------------
// Embedding, RMSNorm, RoPE, SwiGLU, residual add, KV cache write
// ---------------------------------------------------------------------------------------------

// out[r, :] = table[tokens[r], :] (table: vocab × dim; tokens must be < vocab).
// grid (n) (rows are grid-strided, so fewer blocks also work), block 128 (any), dynamic smem 0.
extern "C" __global__ void embed_gather(const float* __restrict__ table,
                                        const unsigned* __restrict__ tokens, int n, int dim,
                                        float* __restrict__ out) {
    for (int r = blockIdx.x; r < n; r += gridDim.x) {
        const float* src = table + (long long)tokens[r] * dim;
        float* dst = out + (long long)r * dim;
        for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = src[i];
    }
}

// out[r, i] = x[r, i] · (1 / sqrt(mean(x[r, :]²) + eps)) · w[i], as ops::rms_norm.
// `out` may equal `x` (in place). One block per row (rows grid-strided).
// grid (rows), block 256 (any multiple of 32 up to 1024), dynamic smem 0.
extern "C" __global__ void rms_norm(const float* x, const float* __restrict__ w, int rows, int dim,
                                    float eps, float* out) {
    __shared__ float red[32];
    const int lane = threadIdx.x % LL_WARP;
    const int warp = threadIdx.x / LL_WARP;
    const int nwarps = blockDim.x / LL_WARP;
    for (int r = blockIdx.x; r < rows; r += gridDim.x) {
        const float* xr = x + (long long)r * dim;
        float* orow = out + (long long)r * dim;
        float acc = 0.f;
        for (int i = threadIdx.x; i < dim; i += blockDim.x) {
            float v = xr[i];
            acc += v * v;
        }
        acc = ll_warp_sum(acc);
        if (lane == 0) red[warp] = acc;
        __syncthreads();
        float ss = 0.f;
        for (int k = 0; k < nwarps; ++k) ss += red[k];
        const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
        // Each thread rewrites only the elements it read, so out == x is safe.
        for (int i = threadIdx.x; i < dim; i += blockDim.x) orow[i] = xr[i] * scale * w[i];
        __syncthreads();  // `red` is rewritten for the next row
    }
}

// Rotary embedding in place, Hugging Face rotate-half (ops::Rope::apply): x is rows ×
// (n_heads · 2·half), row r at position p = pos0 + r; for each head and i < half,
// (a, b) = (x[i], x[i + half]) becomes (a·cos − b·sin, b·cos + a·sin), cos = cos_t[p·half + i],
// sin = sin_t[p·half + i] (tables: max_pos × half, as Rope::new). Apply to q (n_heads) and to
// k (n_kv heads) with two launches. One thread per (row, head, i).
// grid (ceil(rows·n_heads·half / 256)) (any), block 256 (any), dynamic smem 0.
extern "C" __global__ void rope(float* x, const float* __restrict__ cos_t,
                                const float* __restrict__ sin_t, int rows, int n_heads, int half,
                                int pos0) {
    const long long total = (long long)rows * n_heads * half;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
        const int i = (int)(e % half);
        const long long rh = e / half;  // row · n_heads + head
        const long long p = pos0 + rh / n_heads;
        float* xh = x + rh * 2 * half;
        const float c = cos_t[p * half + i];
        const float s = sin_t[p * half + i];
        const float a = xh[i];
        const float b = xh[i + half];
        xh[i] = a * c - b * s;
        xh[i + half] = b * c + a * s;
    }
}

// gate[i] = gate[i] / (1 + exp(−gate[i])) · up[i] (SiLU(gate) · up, as simd::swiglu), in place.
// grid (ceil(n / 256)) (any), block 256 (any), dynamic smem 0.
extern "C" __global__ void swiglu(float* gate, const float* __restrict__ up, long long n) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// x[i] += h[i] (residual connection).
// grid (ceil(n / 256)) (any), block 256 (any), dynamic smem 0.
extern "C" __global__ void add_inplace(float* x, const float* __restrict__ h, long long n) {
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        x[i] += h[i];
    }
}

// Appends rows × (n_kv · hd) keys and values (positions pos0 .. pos0 + rows) to the caches:
// cache[(g·capacity + pos0 + r)·hd + i] = src[r·n_kv·hd + g·hd + i]. pos0 + rows ≤ capacity.
// grid (ceil(rows·n_kv·hd / 256)) (any), block 256 (any), dynamic smem 0.
extern "C" __global__ void kv_write(const float* __restrict__ k, const float* __restrict__ v,
                                    float* __restrict__ k_cache, float* __restrict__ v_cache,
                                    int rows, int n_kv, int hd, int capacity, int pos0) {
    const int width = n_kv * hd;
    const long long total = (long long)rows * width;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
        const long long r = e / width;
        const int rem = (int)(e % width);
        const int g = rem / hd;
        const int i = rem % hd;
        const long long dst = ((long long)g * capacity + pos0 + r) * hd + i;
        k_cache[dst] = k[e];
        v_cache[dst] = v[e];
    }
}

// ---------------------------------------------------------------------------------------------
// Causal grouped-query attention (prefill; also decode of a few rows)
// ---------------------------------------------------------------------------------------------

#define CA_WARPS 4
#define CA_RPW 4                           // stacked query rows per warp
#define CA_ROWS (CA_WARPS * CA_RPW)        // 16 stacked query rows per block
#define CA_KEYS 32                         // keys per tile: one per lane
#define CA_KSTRIDE (LL_MAX_HD + 4)         // K tile row stride bound (the real stride is hd + 4)

// As ops::attention: query row r (position pos0 + r) sees keys 0 ..= pos0 + r of KV head g(h);
// out = softmax(scale · q·k) · v. Keys/values 0 .. pos0 + n must be in the cache already.
//
// Like ops.rs, a block stacks the query heads of one KV group: stacked row i (of n · group,
// group = n_heads / n_kv) is query row i / group, head g·group + i % group. A work item (b, g)
// is stacked rows 16b .. 16b + 15 of KV head g: the block walks the keys they see in tiles of 32
// (K and V tiles in shared memory, shared by the group's heads); warp w holds rows 4w .. 4w + 3
// with an online softmax, lane j scores key j of the tile, and lanes own output dims lane + 32t.
// Blocks take the ceil(n · group / 16) · n_kv work items grid-strided (flat block index
// blockIdx.y · gridDim.x + blockIdx.x), the last rows (most keys) first, so any grid is correct;
// blocks beyond the work items exit at once.
//
// grid (ceil(n · group / 16) · n_kv) (any: more blocks idle, fewer loop), block 128 (exactly),
// dynamic smem 0 (static ≈ 42.5 KiB).
// Needs hd % 4 == 0, hd ≤ 128, 16-byte aligned q / caches. `out` must not overlap q.
extern "C" __global__ void __launch_bounds__(CA_WARPS * LL_WARP)
attention_causal(const float* __restrict__ q, const float* __restrict__ k_cache,
                 const float* __restrict__ v_cache, float* __restrict__ out, int n, int pos0,
                 int n_heads, int n_kv, int hd, int capacity, float scale) {
    __shared__ __align__(16) float qs[CA_ROWS * LL_MAX_HD];          // stacked rows, stride hd
    __shared__ __align__(16) float ks[CA_KEYS * CA_KSTRIDE];         // stride hd + 4
    __shared__ __align__(16) float vs[CA_KEYS * LL_MAX_HD];          // stride hd
    __shared__ __align__(16) float ps[CA_WARPS * CA_KEYS * CA_RPW];  // [warp][key][row]

    const int warp = threadIdx.x / LL_WARP;
    const int lane = threadIdx.x % LL_WARP;
    const int group = n_heads / n_kv;
    const int width = n_heads * hd;
    const int hd4 = hd / 4;
    const int kst = hd + 4;
    const int stacked = n * group;
    const int row_tiles = (stacked + CA_ROWS - 1) / CA_ROWS;
    const long long items = (long long)row_tiles * n_kv;
    const long long n_blocks = (long long)gridDim.x * gridDim.y;
    for (long long item = (long long)blockIdx.y * gridDim.x + blockIdx.x; item < items;
         item += n_blocks) {
        const int g = (int)(item % n_kv);
        const int i0 = (row_tiles - 1 - (int)(item / n_kv)) * CA_ROWS;
        const int i_last = min(i0 + CA_ROWS, stacked) - 1;
        const int key_end = pos0 + i_last / group + 1;  // keys the block's last row sees
        const float* kh = k_cache + (long long)g * capacity * hd;
        const float* vh = v_cache + (long long)g * capacity * hd;

        // This warp's rows: last visible key (−1: a padding row that sees none).
        int lim[CA_RPW];
        float m[CA_RPW], l[CA_RPW], o[CA_RPW][4];
#pragma unroll
        for (int rr = 0; rr < CA_RPW; ++rr) {
            const int i = i0 + warp * CA_RPW + rr;
            lim[rr] = i < stacked ? pos0 + i / group : -1;
            m[rr] = LL_NEG_INF;
            l[rr] = 0.f;
#pragma unroll
            for (int t = 0; t < 4; ++t) o[rr][t] = 0.f;
        }
        float* pw = ps + warp * CA_KEYS * CA_RPW;

        for (int t0 = 0; t0 < key_end; t0 += CA_KEYS) {
            // Every warp is done with the previous tile (and, at t0 = 0, the previous item).
            __syncthreads();
            if (t0 == 0) {
                // The item's query rows (zeros past the last one).
                for (int e = threadIdx.x; e < CA_ROWS * hd4; e += blockDim.x) {
                    const int row = e / hd4, c = e % hd4;
                    const int i = i0 + row;
                    float4 val = make_float4(0.f, 0.f, 0.f, 0.f);
                    if (i < stacked) {
                        const int r = i / group, h = g * group + i % group;
                        const float* qr = q + (long long)r * width + (long long)h * hd;
                        val = reinterpret_cast<const float4*>(qr)[c];
                    }
                    reinterpret_cast<float4*>(qs + row * hd)[c] = val;
                }
            }
            for (int e = threadIdx.x; e < CA_KEYS * hd4; e += blockDim.x) {
                const int row = e / hd4, c = e % hd4;
                const int key = t0 + row;
                // Zeros past the end (p = 0 there, and 0 · v must not meet NaN garbage).
                float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
                if (key < key_end) {
                    kv = reinterpret_cast<const float4*>(kh + (long long)key * hd)[c];
                    vv = reinterpret_cast<const float4*>(vh + (long long)key * hd)[c];
                }
                reinterpret_cast<float4*>(ks + row * kst)[c] = kv;
                reinterpret_cast<float4*>(vs + row * hd)[c] = vv;
            }
            __syncthreads();

            // Scores of key t0 + lane against the warp's rows.
            float s[CA_RPW];
#pragma unroll
            for (int rr = 0; rr < CA_RPW; ++rr) s[rr] = 0.f;
            const float4* kr = reinterpret_cast<const float4*>(ks + lane * kst);
            const float* qw = qs + warp * CA_RPW * hd;
            for (int c = 0; c < hd4; ++c) {
                const float4 k4 = kr[c];
#pragma unroll
                for (int rr = 0; rr < CA_RPW; ++rr)
                    s[rr] += ll_dot4(reinterpret_cast<const float4*>(qw + rr * hd)[c], k4);
            }
            const int key = t0 + lane;
#pragma unroll
            for (int rr = 0; rr < CA_RPW; ++rr) {
                const float sc = key <= lim[rr] ? s[rr] * scale : LL_NEG_INF;
                const float m_new = fmaxf(m[rr], ll_warp_max(sc));
                const float alpha = ll_exp_shift(m[rr], m_new);  // 0 while the row had no key
                const float p = ll_exp_shift(sc, m_new);
                l[rr] = l[rr] * alpha + ll_warp_sum(p);
                m[rr] = m_new;
#pragma unroll
                for (int t = 0; t < 4; ++t) o[rr][t] *= alpha;
                pw[lane * CA_RPW + rr] = p;
            }
            __syncwarp();
            for (int j = 0; j < CA_KEYS; ++j) {
                const float4 p4 = reinterpret_cast<const float4*>(pw)[j];  // rows 0..3, key j
                const float* vr = vs + j * hd;
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    const int d = lane + LL_WARP * t;
                    if (d < hd) {
                        const float vd = vr[d];
                        o[0][t] += p4.x * vd;
                        o[1][t] += p4.y * vd;
                        o[2][t] += p4.z * vd;
                        o[3][t] += p4.w * vd;
                    }
                }
            }
        }

#pragma unroll
        for (int rr = 0; rr < CA_RPW; ++rr) {
            const int i = i0 + warp * CA_RPW + rr;
            if (i >= stacked) continue;
            const int r = i / group, h = g * group + i % group;
            float* dst = out + (long long)r * width + (long long)h * hd;
            const float inv = 1.0f / l[rr];
#pragma unroll
            for (int t = 0; t < 4; ++t) {
                const int d = lane + LL_WARP * t;
                if (d < hd) dst[d] = o[rr][t] * inv;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Decode: online-softmax parts over key ranges and over key ids, and their merge
// ---------------------------------------------------------------------------------------------

#define PA_WARPS 4

// One warp, one query (qs: hd values in shared memory), one step of up to 32 keys: lane j scores
// the key at position `pos` (−1: none) of one KV head (kh, vh: rows of hd) and the warp's online
// softmax (m, l: same in all lanes; o[t]: output dim lane + 32t) takes them in. `pw`/`pp`: this
// warp's 32-entry shared scratch. All 32 lanes must call it (warp-uniform control flow).
__device__ __forceinline__ void warp_attend_step(const float* qs, const float* kh, const float* vh,
                                                 int hd, float scale, int pos, float* pw, int* pp,
                                                 float& m, float& l, float* o) {
    const int lane = threadIdx.x % LL_WARP;
    float s = LL_NEG_INF;
    if (pos >= 0) {
        const float4* kr = reinterpret_cast<const float4*>(kh + (long long)pos * hd);
        const float4* q4 = reinterpret_cast<const float4*>(qs);
        float acc = 0.f;
        for (int c = 0; c < hd / 4; ++c) acc += ll_dot4(q4[c], kr[c]);
        s = acc * scale;
    }
    const float tmax = ll_warp_max(s);
    if (tmax == LL_NEG_INF) return;  // no key in this step (warp-uniform)
    const float m_new = fmaxf(m, tmax);
    const float alpha = ll_exp_shift(m, m_new);
    const float p = ll_exp_shift(s, m_new);
    l = l * alpha + ll_warp_sum(p);
    m = m_new;
#pragma unroll
    for (int t = 0; t < 4; ++t) o[t] *= alpha;
    pw[lane] = p;
    pp[lane] = pos;
    __syncwarp();
    for (int j = 0; j < LL_WARP; ++j) {
        const int pj = pp[j];
        if (pj < 0) continue;
        const float wj = pw[j];
        const float* vr = vh + (long long)pj * hd;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const int d = lane + LL_WARP * t;
            if (d < hd) o[t] += wj * vr[d];
        }
    }
    __syncwarp();  // pw/pp are rewritten by the next step
}

// Loads one query head into shared memory (hd floats).
__device__ __forceinline__ void load_query(float* qs, const float* q, int hd) {
    for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[d];
}

// Merges the block's per-warp states into one part, written at index `part`.
__device__ void block_write_part(float (*wo)[LL_MAX_HD], float* wm, float* wl, float m, float l,
                                 const float* o, int hd, int part, float* part_m, float* part_l,
                                 float* part_o) {
    const int warp = threadIdx.x / LL_WARP;
    const int lane = threadIdx.x % LL_WARP;
    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const int d = lane + LL_WARP * t;
        if (d < hd) wo[warp][d] = o[t];
    }
    __syncthreads();
    float mx = LL_NEG_INF;
    for (int w = 0; w < PA_WARPS; ++w) mx = fmaxf(mx, wm[w]);
    float scl[PA_WARPS];
    for (int w = 0; w < PA_WARPS; ++w) scl[w] = ll_exp_shift(wm[w], mx);  // 0 for empty warps
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.f;
        for (int w = 0; w < PA_WARPS; ++w)
            if (wm[w] != LL_NEG_INF) acc += scl[w] * wo[w][d];
        part_o[(long long)part * hd + d] = acc;
    }
    if (threadIdx.x == 0) {
        float sum = 0.f;
        for (int w = 0; w < PA_WARPS; ++w)
            if (wm[w] != LL_NEG_INF) sum += scl[w] * wl[w];
        part_m[part] = mx;
        part_l[part] = sum;
    }
}

// One decode query (q: n_heads · hd) over the "static" keys of each head: the positions
// [0, min(sink, n_keys)) ∪ [rest_end, n_keys) of KV head g(h), a union (positions below sink are
// counted once even if rest_end < sink). Element e of that set, in increasing position order, goes
// to chunk e / chunk; block (h, c) writes part h·n_chunks + c (n_chunks = gridDim.y) as described
// at the top: part_m[h·n_chunks + c], part_l[..], part_o[(h·n_chunks + c)·hd ..]. Chunks past the
// end of the set write empty parts. The host must launch n_chunks ≥ ceil(set size / chunk) (at
// least 1), else keys are left out. Full-attention decode: sink = n_keys (or rest_end = 0).
// Warps of a block take 32 set elements each in turn, then merge in shared memory.
// grid (n_heads, n_chunks), block 128 (exactly), dynamic smem 0 (static ≈ 3 KiB).
// Needs hd % 4 == 0, hd ≤ 128, 16-byte aligned q / caches.
extern "C" __global__ void __launch_bounds__(PA_WARPS * LL_WARP)
attention_partial_range(const float* __restrict__ q, const float* __restrict__ k_cache,
                        const float* __restrict__ v_cache, int n_heads, int n_kv, int hd,
                        int capacity, float scale, int sink, int rest_end, int n_keys, int chunk,
                        float* __restrict__ part_m, float* __restrict__ part_l,
                        float* __restrict__ part_o) {
    __shared__ __align__(16) float qs[LL_MAX_HD];
    __shared__ float pw[PA_WARPS][LL_WARP];
    __shared__ int pp[PA_WARPS][LL_WARP];
    __shared__ float wo[PA_WARPS][LL_MAX_HD];
    __shared__ float wm[PA_WARPS], wl[PA_WARPS];

    const int warp = threadIdx.x / LL_WARP;
    const int lane = threadIdx.x % LL_WARP;
    const int h = blockIdx.x;
    const int g = h / (n_heads / n_kv);
    const float* kh = k_cache + (long long)g * capacity * hd;
    const float* vh = v_cache + (long long)g * capacity * hd;
    load_query(qs, q + (long long)h * hd, hd);
    __syncthreads();

    const int s0 = max(0, min(sink, n_keys));             // sink part: positions 0 .. s0
    const int r0 = min(max(rest_end, s0), n_keys);        // window part: r0 .. n_keys
    const int size = s0 + (n_keys - r0);
    const long long e0 = (long long)blockIdx.y * chunk;
    const int e1 = (int)min((long long)size, e0 + chunk);

    float m = LL_NEG_INF, l = 0.f, o[4] = {0.f, 0.f, 0.f, 0.f};
    for (long long base = e0 + warp * LL_WARP; base < e1; base += PA_WARPS * LL_WARP) {
        const int e = (int)base + lane;
        const int pos = e < e1 ? (e < s0 ? e : r0 + (e - s0)) : -1;
        warp_attend_step(qs, kh, vh, hd, scale, pos, pw[warp], pp[warp], m, l, o);
    }
    block_write_part(wo, wm, wl, m, l, o, hd, h * gridDim.y + blockIdx.y, part_m, part_l, part_o);
}

// The indexed attention of one decode query: head h reads only the key/value rows at positions
// ids[h·ids_per_head + j] (j < ids_per_head) of KV head g(h), in place in the caches (no gather);
// an id of 0xFFFFFFFF means none and is skipped. Ids must be < capacity (filled positions) and
// should not repeat, nor overlap the static set merged with them (a repeated key counts twice).
// With gridDim.y == 1, one part per head: part_m[h], part_l[h], part_o[h·hd ..]. With gridDim.y
// = S > 1, each head's ids are split into S runs of ceil(ids_per_head / S) and block (h, c)
// writes part h·S + c (more blocks for long id lists); merge them as S parts per head.
// A head with no valid id writes an empty part.
// grid (n_heads, S = 1 or more), block 128 (exactly), dynamic smem 0 (static ≈ 3 KiB).
// Needs hd % 4 == 0, hd ≤ 128, 16-byte aligned q / caches.
extern "C" __global__ void __launch_bounds__(PA_WARPS * LL_WARP)
attention_partial_ids(const float* __restrict__ q, const float* __restrict__ k_cache,
                      const float* __restrict__ v_cache, int n_heads, int n_kv, int hd,
                      int capacity, float scale, const unsigned* __restrict__ ids,
                      int ids_per_head, float* __restrict__ part_m, float* __restrict__ part_l,
                      float* __restrict__ part_o) {
    __shared__ __align__(16) float qs[LL_MAX_HD];
    __shared__ float pw[PA_WARPS][LL_WARP];
    __shared__ int pp[PA_WARPS][LL_WARP];
    __shared__ float wo[PA_WARPS][LL_MAX_HD];
    __shared__ float wm[PA_WARPS], wl[PA_WARPS];

    const int warp = threadIdx.x / LL_WARP;
    const int lane = threadIdx.x % LL_WARP;
    const int h = blockIdx.x;
    const int g = h / (n_heads / n_kv);
    const float* kh = k_cache + (long long)g * capacity * hd;
    const float* vh = v_cache + (long long)g * capacity * hd;
    const unsigned* hid = ids + (long long)h * ids_per_head;
    load_query(qs, q + (long long)h * hd, hd);
    __syncthreads();

    const int per = (ids_per_head + gridDim.y - 1) / gridDim.y;
    const int j0 = min(ids_per_head, (int)blockIdx.y * per);
    const int j1 = min(ids_per_head, j0 + per);

    float m = LL_NEG_INF, l = 0.f, o[4] = {0.f, 0.f, 0.f, 0.f};
    for (int base = j0 + warp * LL_WARP; base < j1; base += PA_WARPS * LL_WARP) {
        const int j = base + lane;
        int pos = -1;
        if (j < j1) {
            const unsigned id = hid[j];
            if (id != LL_NONE) pos = (int)id;
        }
        warp_attend_step(qs, kh, vh, hd, scale, pos, pw[warp], pp[warp], m, l, o);
    }
    block_write_part(wo, wm, wl, m, l, o, hd, h * gridDim.y + blockIdx.y, part_m, part_l, part_o);
}

// Exact merge of one head's parts: parts 0 .. na from (am, al, ao) at index h·na + c, then parts
// 0 .. nb from (bm, bl, bo) at index h·nb + c. Thread-strided over the hd outputs.
__device__ void merge_head(const float* am, const float* al, const float* ao, int na,
                           const float* bm, const float* bl, const float* bo, int nb, int h,
                           int hd, float* out) {
    float mx = LL_NEG_INF;
    for (int c = 0; c < na; ++c) mx = fmaxf(mx, am[(long long)h * na + c]);
    for (int c = 0; c < nb; ++c) mx = fmaxf(mx, bm[(long long)h * nb + c]);
    float* dst = out + (long long)h * hd;
    if (mx == LL_NEG_INF) {  // no key in any part
        for (int d = threadIdx.x; d < hd; d += blockDim.x) dst[d] = 0.f;
        return;
    }
    float sum = 0.f;
    for (int c = 0; c < na; ++c) {
        const long long p = (long long)h * na + c;
        if (am[p] != LL_NEG_INF) sum += expf(am[p] - mx) * al[p];
    }
    for (int c = 0; c < nb; ++c) {
        const long long p = (long long)h * nb + c;
        if (bm[p] != LL_NEG_INF) sum += expf(bm[p] - mx) * bl[p];
    }
    const float inv = 1.0f / sum;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float acc = 0.f;
        for (int c = 0; c < na; ++c) {
            const long long p = (long long)h * na + c;
            if (am[p] != LL_NEG_INF) acc += expf(am[p] - mx) * ao[p * hd + d];
        }
        for (int c = 0; c < nb; ++c) {
            const long long p = (long long)h * nb + c;
            if (bm[p] != LL_NEG_INF) acc += expf(bm[p] - mx) * bo[p * hd + d];
        }
        dst[d] = acc * inv;
    }
}

// out[h·hd + i] = the exact merge of head h's parts (softmax.rs Partial::merge): parts of head h
// are at index h·parts_per_head + c (c < parts_per_head) of part_m / part_l, and at
// (h·parts_per_head + c)·hd of part_o. Empty parts (m = −inf) are skipped; a head whose parts
// are all empty gets zeros. This is the layout attention_partial_range writes with
// parts_per_head = n_chunks (and attention_partial_ids with parts_per_head = gridDim.y); to merge
// the parts of both kernels, use partial_merge2 (or interleave them into one such array).
// grid (n_heads), block 128 (any; hd ≤ blockDim.x is not required), dynamic smem 0.
extern "C" __global__ void partial_merge(const float* __restrict__ part_m,
                                         const float* __restrict__ part_l,
                                         const float* __restrict__ part_o, int n_heads,
                                         int parts_per_head, int hd, float* __restrict__ out) {
    for (int h = blockIdx.x; h < n_heads; h += gridDim.x)
        merge_head(part_m, part_l, part_o, parts_per_head, part_m, part_l, part_o, 0, h, hd, out);
}

// As partial_merge over the union of two part arrays, each in partial_merge's layout: head h
// merges parts a[h·a_parts + c] (c < a_parts) and b[h·b_parts + c] (c < b_parts) — e.g. a from
// attention_partial_range (a_parts = n_chunks) and b from attention_partial_ids (b_parts =
// its gridDim.y), without copying them into one array. Either count may be 0.
// grid (n_heads), block 128 (any), dynamic smem 0.
extern "C" __global__ void partial_merge2(const float* __restrict__ a_m,
                                          const float* __restrict__ a_l,
                                          const float* __restrict__ a_o, int a_parts,
                                          const float* __restrict__ b_m,
                                          const float* __restrict__ b_l,
                                          const float* __restrict__ b_o, int b_parts, int n_heads,
                                          int hd, float* __restrict__ out) {
    for (int h = blockIdx.x; h < n_heads; h += gridDim.x)
        merge_head(a_m, a_l, a_o, a_parts, b_m, b_l, b_o, b_parts, h, hd, out);
}
