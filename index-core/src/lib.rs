//! # qkindex
//!
//! Approximate top-k maximum-inner-product search over the keys of transformer attention heads,
//! built for the queries that decode steps ask (out of the keys' distribution).
//!
//! | module | job |
//! |---|---|
//! | [`store`] | f16/f32/int8 key storage shared by GQA heads, and its scorers |
//! | [`metric`] | SIMD inner-product kernels chosen at run time |
//! | [`knn`] | exact batched top-k ([`knn::KnnBackend`], CPU implementation) |
//! | [`search`] | the one search interface ([`AnnIndex`]), params, stats |
//! | [`many`] | [`search_many`]: many indexes, each with its own queries, in one parallel call |
//! | [`spec`] | [`IndexSpec`]: one string per kind and build parameters (`"ivf:nlist=361"`), and its build |
//! | [`scratch`] | per-thread search buffers |
//! | [`cancel`] | cooperative cancellation of long builds |
//! | [`graph`] | the graph toolkit: CSR adjacency, beam search, reachability, repair, pruning |
//! | [`attention`] | [`AttentionIndex`], the query-aware projected graph |
//! | [`hnsw`] | [`HnswIndex`], HNSW (inner product or the MIPS→L2 reduction) |
//! | [`ivf`] | [`IvfIndex`], the inverted-file baseline (k-means lists) |
//! | [`vamana`] | [`VamanaIndex`], DiskANN's graph and OOD-DiskANN's RobustStitch |
//! | [`flat`] | [`FlatIndex`], the exact scan |
//! | [`retopk`] | [`ReTopK`], reuse of similar past queries' top-k sets, with an index as the exact path |
//! | [`io`] | versioned, checksummed, memory-mapped index files and bundles |
//! | [`eval`] | recall and attention-mass metrics |
//! | [`dump`], [`npy`] | the dump layout of Q/K/V tensors |
//! | [`synth`] | a small synthetic OOD generator for tests |
//!
//! ```
//! use qkindex::{AnnIndex, AttentionIndex, AttentionParams, CpuKnn, FlatIndex, KeyStore, SearchParams};
//! use std::sync::Arc;
//!
//! let data = qkindex::synth::ood(2000, 8, 32, 7);
//! let keys = Arc::new(KeyStore::from_f32(data.keys.clone(), 32)?);
//! let index = AttentionIndex::build(keys.clone(), &data.train_queries, &AttentionParams::default(), &CpuKnn)?;
//! let flat = FlatIndex::new(keys);
//! let mut scratch = index.new_scratch();
//! let q = &data.test_queries[..32];
//! let found = index.search(q, 10, &SearchParams::with_ef(64), &mut scratch)?;
//! let exact = flat.search(q, 10, &SearchParams::default(), &mut scratch)?;
//! println!("recall@10 = {}", qkindex::eval::recall(&found.ids, &exact.ids));
//! assert!(found.stats.distance_computations < 2000);
//! # Ok::<(), qkindex::Error>(())
//! ```

pub mod attention;
pub mod cancel;
pub mod cluster;
pub mod codes;
pub mod dump;
pub mod error;
pub mod eval;
pub mod file;
pub mod flat;
pub mod graph;
pub mod hnsw;
pub mod io;
pub mod ivf;
pub mod knn;
pub mod many;
pub mod metric;
pub mod npy;
pub mod retopk;
pub mod scratch;
pub mod search;
pub mod spec;
pub mod store;
pub mod synth;
pub mod vamana;

pub use attention::{AttentionIndex, AttentionParams};
pub use cancel::Cancel;
pub use error::{Error, Result};
pub use flat::{FlatIndex, FlatParams};
pub use hnsw::{HnswIndex, HnswParams};
pub use ivf::{IvfIndex, IvfParams};
pub use knn::{CpuKnn, KnnBackend, KnnOptions, KnnResult};
pub use many::{search_many, search_many_into, ManyOutput, ManyScratch};
pub use retopk::{ReTopK, ReTopKParams, StepPath, StepStats};
pub use scratch::Scratch;
pub use search::{
    search_batch, AnnIndex, IndexKind, Patience, SearchOutput, SearchParams, SearchStats,
};
pub use spec::IndexSpec;
pub use store::{Dtype, KeyStore};
pub use vamana::{VamanaIndex, VamanaParams};
