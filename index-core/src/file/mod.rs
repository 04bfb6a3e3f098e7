//! The file format's building blocks, one floor below the index kinds (docs/FORMAT.md): each
//! kind's `file.rs` writes and reads its own sections with them, and [`crate::io`] opens,
//! checks and inspects whole files and bundles.
//!
//! | file | job |
//! |---|---|
//! | `format.rs` | header, section table, section kinds, checksum (xxh3-64), [`format::reseal`] |
//! | `writer.rs` | [`writer::FileWriter`] (layout, padding, checksums) and [`writer::write_atomic`] |
//! | `reader.rs` | [`reader::RawFile`]: map, check header and table, typed section views |
//! | `sections.rs` | codecs shared by the kinds: PARAMS JSON, CSR graphs, entry points, key arrays |
//! | `persist.rs` | [`persist::Persist`] and [`persist::Decode`], the traits every kind implements; key sections and references |
//!
//! ```text
//!  write: index ──Persist::writer──► FileWriter (keys inline or KeyRef, kind sections, PARAMS) ──► atomic file
//!  read:  file ──RawFile (header, table, bounds)──► Decode::decode (O(1) checks) ──► index
//!                                                   └─ Decode::deep_check (scans) when verifying
//! ```

pub mod format;
pub mod persist;
pub mod reader;
pub(crate) mod sections;
pub mod writer;
