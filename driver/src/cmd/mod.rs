//! One module per subcommand of the `qkindex` binary.

pub mod bench;
pub mod build;
pub mod dump;
pub mod generate;
pub mod inspect;
pub mod model_args;
pub mod ppl;
pub mod report;
pub mod scaling;
pub mod verify;
