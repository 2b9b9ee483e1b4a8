//! What every kernel check shares: the GPU (opened per test, one test on it at a time), the random
//! inputs and their seed, the relative error against an f64 reference, and the rows a check reports.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use tandem_cuda::{CudaError, CudaOptions, Gpu};
use tandem_gguf::GgmlType;

/// A small xorshift generator: fresh seeds each run (printed), reproducible given the seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Roughly normal: the sum of four uniforms, centred and scaled.
    pub fn normal(&mut self) -> f32 {
        let u: f32 = (0..4).map(|_| (self.next() >> 40) as f32 / (1u64 << 24) as f32).sum();
        (u - 2.0) * 1.7
    }
}

pub fn rel_err(out: &[f32], reference: &[f64]) -> f64 {
    let mut num = 0f64;
    let mut den = 0f64;
    for (&o, &r) in out.iter().zip(reference) {
        if !o.is_finite() {
            return f64::INFINITY;
        }
        num += (o as f64 - r).powi(2);
        den += r * r;
    }
    (num / den.max(1e-300)).sqrt()
}

pub fn bits_equal(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// One line of a check's report.
pub struct Row {
    pub check: String,
    pub result: String,
    pub pass: bool,
}

/// Quantized rows of `ty`: 64 distinct random rows, tiled to `rows` (real block contents, no hour of
/// quantizing), as host bytes.
pub fn host_weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Result<Vec<u8>> {
    let row_bytes = ty.row_bytes(cols as u64).context("row size")? as usize;
    let mut tile = vec![0u8; 64 * row_bytes];
    for r in 0..64 {
        let src: Vec<f32> = (0..cols).map(|_| rng.normal() * 0.05).collect();
        tandem_quant::quantize_row(ty, &src, &mut tile[r * row_bytes..(r + 1) * row_bytes])?;
    }
    Ok(tile.iter().copied().cycle().take(rows * row_bytes).collect())
}

/// The environment variable that runs a failed check's inputs again.
const SEED_VAR: &str = "TANDEM_KERNEL_SEED";

/// Held while a test has the GPU: the first test compiles the kernels into the disk cache and the
/// others load them, and no check's launches share the device with another's.
static ON_GPU: Mutex<()> = Mutex::new(());

/// Runs `check` on GPU 0 with a seeded generator, prints its rows, and fails the test if a row fails
/// or the check returns an error; without a GPU (no driver, no device, no NVRTC) it says so and
/// passes, as the crate's other device tests do.
pub fn run(name: &str, check: impl FnOnce(&Gpu, &mut Rng, &mut Vec<Row>) -> Result<()>) {
    let _held = ON_GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let options = CudaOptions::from_env().expect("TANDEM_CUDA_* switches");
    let gpu = match Gpu::new(0, options) {
        Ok(gpu) => gpu,
        Err(CudaError::Unavailable(why)) => {
            eprintln!("no GPU, {name} not run: {why}");
            return;
        }
        Err(e) => panic!("{name}: opening the GPU: {e}"),
    };
    let seed = match std::env::var(SEED_VAR) {
        Ok(s) => s.parse::<u64>().expect("TANDEM_KERNEL_SEED is a number"),
        Err(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    } | 1;
    let again = format!("{SEED_VAR}={seed} runs these inputs again");
    eprintln!("{name} on {} ({}): seed {seed} ({again})", gpu.name, gpu.arch);
    let mut rng = Rng(seed);
    let mut table = Vec::new();
    let outcome = check(&gpu, &mut rng, &mut table);
    println!("\n| check | result | pass |");
    println!("|---|---|---|");
    for r in &table {
        println!("| {} | {} | {} |", r.check, r.result, if r.pass { "yes" } else { "NO" });
    }
    if let Err(e) = outcome {
        panic!("{name}: {e:#} ({again})");
    }
    let failed: Vec<String> = table
        .iter()
        .filter(|r| !r.pass)
        .map(|r| format!("{}: {}", r.check, r.result))
        .collect();
    assert!(
        failed.is_empty(),
        "{name}: {} of {} checks failed ({again}):\n{}",
        failed.len(),
        table.len(),
        failed.join("\n")
    );
}
