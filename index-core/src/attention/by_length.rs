//! The kNN chosen by the number of keys ([`AttentionParams::pool_above`]): the exact kNN's cost
//! grows with keys × queries where the prefill's grows about linearly, so past a threshold a
//! build takes the pooled kNN (docs/DECODING.md §10 has the rule and its measurements).

use std::borrow::Cow;

use super::params::{AttentionParams, TrainKnn, TrainOn};

/// Keys per pool of the pooled kNN that [`AttentionParams::pool_above`] switches to: the size
/// of the 128K runs (docs/bench/long/README.md: Gemma 3 at 131,072 keys, builds 0.05× the
/// prefill, recall@100 0.955 at decode).
pub const LONG_POOL: usize = 8000;

impl AttentionParams {
    /// The parameters a build over `n` keys uses: these, or, past [`pool_above`] keys with
    /// the exact kNN asked for, the pooled kNN of [`LONG_POOL`] keys per pool with the causal
    /// lists and their checks off (the pooled kNN has no causal mode).
    ///
    /// [`pool_above`]: AttentionParams::pool_above
    pub fn for_keys(&self, n: usize) -> Cow<'_, AttentionParams> {
        let long = self.pool_above > 0
            && n > self.pool_above
            && self.knn == TrainKnn::Exact
            && self.train_on == TrainOn::Queries;
        if !long {
            return Cow::Borrowed(self);
        }
        Cow::Owned(AttentionParams {
            knn: TrainKnn::Pool {
                size: LONG_POOL.max(self.kq),
            },
            causal: false,
            global_full: None,
            far_check: None,
            ..self.clone()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pool_above`: at or below the threshold the parameters are the ones given; past it the
    /// exact kNN becomes the pooled one with the causal lists and their checks off; a strategy
    /// asked for by name, the key graph and `pool_above = 0` are never changed.
    #[test]
    fn the_knn_is_chosen_by_the_number_of_keys() {
        use std::borrow::Cow;
        let p = AttentionParams {
            causal: true,
            queries_per_key: 1.25,
            global_full: Some(0.1),
            far_check: Some(0.04),
            auto_ef: Some(0.95),
            pool_above: 1000,
            ..AttentionParams::default()
        };
        for n in [1, 999, 1000] {
            assert!(matches!(p.for_keys(n), Cow::Borrowed(_)), "{n}");
        }
        let long = p.for_keys(1001);
        assert_eq!(long.knn, TrainKnn::Pool { size: LONG_POOL });
        assert_eq!(
            (long.causal, long.global_full, long.far_check),
            (false, None, None)
        );
        assert_eq!((long.auto_ef, long.queries_per_key), (Some(0.95), 1.25));
        assert_eq!(long.pool_above, 1000);
        long.validate().expect("the long parameters are valid");
        // A kq above the pool size keeps each list inside its pool.
        let wide = AttentionParams {
            kq: LONG_POOL + 1,
            ..p.clone()
        };
        assert_eq!(
            wide.for_keys(1_000_000).knn,
            TrainKnn::Pool {
                size: LONG_POOL + 1
            }
        );
        for unchanged in [
            AttentionParams {
                pool_above: 0,
                ..p.clone()
            },
            AttentionParams {
                knn: TrainKnn::Probe { lists: 8 },
                causal: false,
                global_full: None,
                far_check: None,
                ..p.clone()
            },
            AttentionParams {
                train_on: TrainOn::Keys,
                ..p.clone()
            },
        ] {
            assert_eq!(*unchanged.for_keys(1_000_000), unchanged);
        }
    }
}
