//! The long public text (Paul Graham's essays, `scripts/get-text.sh`) holds what the 128K runs
//! of issue 44 need: `qkindex demo --model gemma3-270m --context 131072` prefills 131,072 of its
//! tokens and `qkindex tasks --lengths 131072` hides needles in it without repeating it.
//!
//! Without the text or the model the test records a skip and passes, except under CI (`CI`
//! set), where their absence fails.

mod common;

use qkindex_model::{Model, ModelDevice, RopeScaling};

#[test]
fn the_essays_hold_a_gemma3_context_of_131072_tokens() {
    let (Some(text), Some(model)) = (common::pg_essays(), common::gemma3_model()) else {
        return;
    };
    let text = std::fs::read_to_string(&text).expect("essays");
    let m = Model::load(&model, None, ModelDevice::Cpu).expect("model");
    let ids = m.tokenizer.encode(&text).expect("encode");
    assert!(
        ids.len() >= 131_072 + 512,
        "{} tokens: fewer than a 131,072-token prefill and 512 continuation tokens",
        ids.len()
    );
    // The default RoPE scaling for that context, and the positions it makes room for.
    let cfg = &m.llama.cfg;
    let scaling = cfg.default_rope_scaling(131_072 + 512);
    assert_ne!(scaling, RopeScaling::None);
    let scaled = cfg.clone().with_rope_scaling(scaling).expect("scaling");
    assert!(scaled.context_length >= 131_072 + 512);
}
