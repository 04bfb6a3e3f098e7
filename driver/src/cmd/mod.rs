//! One module per subcommand of the `qkindex` binary.

pub mod bench;
