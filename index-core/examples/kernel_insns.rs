//! Calls one inner-product kernel of one detected kernel set `reps` times, so that
//! `scripts/arm64-insns.sh` can count the instructions it executes (under `qemu-aarch64
//! -singlestep -d exec` on aarch64, by `gdb` single-stepping on x86). Each call goes through the
//! [`measured`] function (never inlined), whose entry and return mark one call.
//!
//! ```text
//! kernel_insns ISA KERNEL DIM ROWS REPS
//! kernel_insns neon dot_f16 128 1 3
//! ```
//! `ISA` names a set of [`Kernels::available`] (`avx512`, `avx2`, `neon`, `scalar`) or, for the
//! int8 kernels, of [`I8Kernels::available`]; `KERNEL` is one of `dot_f32`, `dot_f16`,
//! `gather_f32`, `gather_f16`, `range_f32`, `range_f16`, `dot_i8`, `dot_q8`; gather and range
//! score `ROWS` rows of `DIM` values (gather in reverse row order). `kernel_insns ISA addrs`
//! prints where the set's function pointers point (offsets from `measured`).

use half::f16;
use qkindex::metric::int8::I8Kernels;
use qkindex::metric::Kernels;
use std::hint::black_box;

/// Which kernel [`measured`] calls.
#[derive(Clone, Copy, Debug)]
enum Which {
    DotF32,
    DotF16,
    GatherF32,
    GatherF16,
    RangeF32,
    RangeF16,
    DotI8,
    DotQ8,
}

/// The inputs of one call.
#[derive(Debug)]
struct Inputs {
    q: Vec<f32>,
    q8: Vec<i8>,
    keys: Vec<f32>,
    keys16: Vec<f16>,
    keys8: Vec<i8>,
    ids: Vec<u32>,
    dim: usize,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() == 2 && args[1] == "addrs" {
        print_addresses(&args[0]);
        return;
    }
    if args.len() != 5 {
        eprintln!("usage: kernel_insns ISA KERNEL DIM ROWS REPS");
        std::process::exit(2);
    }
    let which = match args[1].as_str() {
        "dot_f32" => Which::DotF32,
        "dot_f16" => Which::DotF16,
        "gather_f32" => Which::GatherF32,
        "gather_f16" => Which::GatherF16,
        "range_f32" => Which::RangeF32,
        "range_f16" => Which::RangeF16,
        "dot_i8" => Which::DotI8,
        "dot_q8" => Which::DotQ8,
        other => panic!("unknown kernel {other}"),
    };
    let num = |i: usize| -> usize { args[i].parse().expect("a number") };
    let (dim, rows, reps) = (num(2), num(3), num(4));
    let isa = args[0].as_str();
    let int8 = matches!(which, Which::DotI8 | Which::DotQ8);
    let k = Kernels::available().into_iter().find(|k| k.isa == isa);
    let k8 = I8Kernels::available().into_iter().find(|k| k.isa == isa);
    if (int8 && k8.is_none()) || (!int8 && k.is_none()) {
        eprintln!("kernel set {isa} is not available on this CPU");
        std::process::exit(3);
    }
    let value = |i: usize| ((i * 7919) % 61) as f32 / 61.0 - 0.5;
    let keys: Vec<f32> = (0..dim * rows).map(value).collect();
    let inputs = Inputs {
        q: (0..dim).map(|i| value(i + 17)).collect(),
        q8: (0..dim).map(|i| (i % 255) as i8).collect(),
        keys16: keys.iter().map(|&x| f16::from_f32(x)).collect(),
        keys8: (0..dim * rows).map(|i| ((i * 31) % 255) as i8).collect(),
        keys,
        ids: (0..rows as u32).rev().collect(),
        dim,
    };
    let mut out = vec![0.0f32; rows];
    let mut sum = 0.0f32;
    for _ in 0..reps {
        sum += measured(
            black_box(&k),
            black_box(&k8),
            black_box(which),
            black_box(&inputs),
            black_box(&mut out),
        );
    }
    println!(
        "{} {which:?} dim {dim} rows {rows} reps {reps}: {sum}",
        args[0]
    );
}

/// `kernel_insns ISA addrs`: where each function pointer of the set `ISA` points, as an offset
/// from [`measured`] (so that a script finds the kernel's code in the disassembly even where the
/// kernel was inlined into an unnamed closure shim).
fn print_addresses(isa: &str) {
    let base = measured as *const () as usize as i64;
    let off = |p: usize| p as i64 - base;
    if let Some(k) = Kernels::available().into_iter().find(|k| k.isa == isa) {
        println!("dot_f32 {}", off(k.dot_f32 as usize));
        println!("dot_f16 {}", off(k.dot_f16 as usize));
        println!("gather_f32 {}", off(k.gather_f32 as usize));
        println!("gather_f16 {}", off(k.gather_f16 as usize));
        println!("range_f32 {}", off(k.range_f32 as usize));
        println!("range_f16 {}", off(k.range_f16 as usize));
    }
    if let Some(k) = I8Kernels::available().into_iter().find(|k| k.isa == isa) {
        println!("dot_i8 {}", off(k.dot as usize));
        println!("dot_q8 {}", off(k.dot_q8 as usize));
    }
}

/// One call of the chosen kernel (the unit that the instruction counts measure).
#[inline(never)]
fn measured(
    k: &Option<Kernels>,
    k8: &Option<I8Kernels>,
    which: Which,
    x: &Inputs,
    out: &mut [f32],
) -> f32 {
    let d = x.dim;
    match (which, k, k8) {
        (Which::DotF32, Some(k), _) => (k.dot_f32)(&x.q, &x.keys[..d]),
        (Which::DotF16, Some(k), _) => (k.dot_f16)(&x.q, &x.keys16[..d]),
        (Which::GatherF32, Some(k), _) => {
            (k.gather_f32)(&x.q, &x.keys, d, &x.ids, out);
            out[0]
        }
        (Which::GatherF16, Some(k), _) => {
            (k.gather_f16)(&x.q, &x.keys16, d, &x.ids, out);
            out[0]
        }
        (Which::RangeF32, Some(k), _) => {
            (k.range_f32)(&x.q, &x.keys, d, out);
            out[0]
        }
        (Which::RangeF16, Some(k), _) => {
            (k.range_f16)(&x.q, &x.keys16, d, out);
            out[0]
        }
        (Which::DotI8, _, Some(k8)) => (k8.dot)(&x.q, &x.keys8[..d]),
        (Which::DotQ8, _, Some(k8)) => (k8.dot_q8)(&x.q8, &x.keys8[..d]) as f32,
        _ => 0.0,
    }
}
