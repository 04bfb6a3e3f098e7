//! One module per subcommand of the `qkindex` binary; `model_args.rs` and `policy_args.rs` hold
//! the arguments several subcommands share, and this file the text they share.

pub mod batch;
pub mod bench;
pub mod build;
pub mod decode_bench;
pub mod demo;
pub mod dump;
pub mod eval;
pub mod generate;
pub mod gpu_check;
pub mod inspect;
pub mod longctx;
pub mod model_args;
pub mod passkey;
pub mod policy_args;
pub mod ppl;
pub mod progress;
pub mod report;
pub mod scaling;
pub mod tasks;
pub mod texts;
pub mod verify;

/// Permissive license texts from Debian's `/usr/share/common-licenses` (MPL-2.0, Apache-2.0,
/// MPL-1.1, Artistic, GPL-3), concatenated: the text `demo` and `eval` read by default.
pub const BUNDLED_TEXT: &str = include_str!("../../assets/texts/licenses.txt");

/// Time to the first token with retrieval attention, split into the prefill and the index
/// builds that must finish before the first decode step (issue 27).
pub fn ttft_line(prefill_s: f64, build_s: f64) -> String {
    format!(
        "== time to first token: {:.1} s = prefill {prefill_s:.1} s + index build {build_s:.1} s \
         (build/prefill {:.2})",
        prefill_s + build_s,
        build_s / prefill_s.max(f64::MIN_POSITIVE)
    )
}
