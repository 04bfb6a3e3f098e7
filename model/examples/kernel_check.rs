//! Every quantized matrix of a GGUF file through this CPU's integer matvec kernel against the
//! exact product of its dequantized weights with the same 8-bit activation (f64): the largest
//! error per tensor, relative to the row's Σ|w·x|. `QKINDEX_NO_AVX512=1` checks the AVX2 kernels.
//!
//! `cargo run --release -p qkindex-model --example kernel_check -- models/FILE.gguf`
use std::io::{Read, Seek, SeekFrom};

use qkindex_model::gguf::GgufFile;
use qkindex_model::qdot::{self, Q8Act};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: kernel_check FILE.gguf")?;
    let g = GgufFile::open(std::path::Path::new(&path))?;
    let mut f = std::fs::File::open(&path)?;
    let mut worst = 0f64;
    for t in g.tensors() {
        if t.dims.len() != 2 || !qdot::supported(t.ggml_type) {
            continue;
        }
        let (cols, rows) = (t.dims[0] as usize, t.dims[1] as usize);
        let n = t.n_bytes.ok_or("size")? as usize;
        let mut raw = vec![0u8; n];
        f.seek(SeekFrom::Start(t.start))?;
        f.read_exact(&mut raw)?;
        let wf = g.dequantize(&t.name, &t.dims)?;
        // An activation with a few large outliers, as real hidden states have.
        let x: Vec<f32> = (0..cols)
            .map(|i| {
                let v = ((i * 7919 % 1013) as f32 / 1013.0 - 0.5) * 2.0;
                if i % 97 == 5 {
                    v * 40.0
                } else {
                    v
                }
            })
            .collect();
        let mut a = Q8Act::default();
        a.quantize(&x);
        let mut y = vec![0f32; rows];
        let row_bytes = n / rows;
        assert!(qdot::matvec(t.ggml_type, &raw, row_bytes, &a, &mut y));
        let mut err = 0f64;
        for (r, &yv) in y.iter().enumerate() {
            let w = &wf[r * cols..(r + 1) * cols];
            let (mut want, mut mag) = (0f64, 0f64);
            for (i, &wv) in w.iter().enumerate() {
                let xq = f64::from(a.d[i / 32]) * f64::from(a.qs[i]);
                want += f64::from(wv) * xq;
                mag += (f64::from(wv) * xq).abs();
            }
            err = err.max((f64::from(yv) - want).abs() / mag.max(1e-30));
        }
        worst = worst.max(err);
        println!(
            "{:40} {:?} {rows}x{cols}: max error / Σ|w·x| = {err:.2e}",
            t.name, t.ggml_type
        );
    }
    println!("worst {worst:.2e}");
    Ok(())
}
