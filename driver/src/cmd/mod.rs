//! One module per subcommand of the `qkindex` binary.

pub mod bench;
pub mod build;
pub mod decode_bench;
pub mod demo;
pub mod dump;
pub mod eval;
pub mod generate;
pub mod gpu_check;
pub mod inspect;
pub mod model_args;
pub mod passkey;
pub mod policy_args;
pub mod ppl;
pub mod report;
pub mod scaling;
pub mod verify;
