//! Progress bars of the long steps, on stderr (indicatif hides them when stderr is not a
//! terminal, so logs and pipes get none).

use indicatif::{ProgressBar, ProgressStyle};

/// A bar over the `tokens` positions of a prefill (a 128K prefill takes tens of minutes on a
/// CPU; `decode::prefill_with` ticks it once per chunk).
pub fn prefill_bar(tokens: usize) -> ProgressBar {
    let bar = ProgressBar::new(tokens as u64);
    if let Ok(style) = ProgressStyle::with_template(
        "   prefill {bar:30} {pos}/{len} tokens [{elapsed}<{eta}, {per_sec}]",
    ) {
        bar.set_style(style);
    }
    bar
}
