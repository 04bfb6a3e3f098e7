//! Checks shared by the kinds' [`AnnIndex::search_into`](crate::AnnIndex::search_into):
//! what a graph search verifies before it walks.

use crate::error::{Error, Result};
use crate::search::{check_beam, check_query, SearchParams};
use crate::store::KeyStore;

/// The checks a graph search starts with: the query against `keys` ([`check_query`]), the
/// candidate list size (`params.ef`, else `default_ef.max(k)`; at least `k`) and the beam width
/// ([`check_beam`]). Returns the list size `ef`.
pub(crate) fn graph_search_ef(
    query: &[f32],
    keys: &KeyStore,
    k: usize,
    params: &SearchParams,
    default_ef: usize,
) -> Result<usize> {
    check_query(query, keys.dim(), k, keys.len())?;
    let ef = params.ef.unwrap_or(default_ef.max(k));
    if ef < k {
        return Err(Error::invalid_param(
            "ef",
            ef,
            format!("must be at least k = {k}"),
        ));
    }
    check_beam(params)?;
    Ok(ef)
}
