//! Row-wise element operations of the layer graph: RMS norm, RoPE, activations. Each works on one row
//! at a time with a fixed operation order, so a row's result never depends on how many rows came with it.

/// Runs `f(row_index, row)` over every `width`-wide row of `data`, rows shared out across the pool in
/// contiguous runs. Each row is processed whole by one call, so the result is the same whatever the
/// split.
pub fn par_rows(
    pool: &super::pool::ThreadPool,
    data: &mut [f32],
    width: usize,
    f: &(dyn Fn(usize, &mut [f32]) + Sync),
) {
    let n_rows = data.len() / width;
    // Below a few rows the hand-off costs more than it saves.
    if n_rows < 4 || pool.n_threads() == 1 {
        data.chunks_exact_mut(width).enumerate().for_each(|(r, row)| f(r, row));
        return;
    }
    let per_task = n_rows.div_ceil(pool.n_threads() * 4);
    let base = RowsPtr(data.as_mut_ptr());
    pool.run(n_rows.div_ceil(per_task), &|task| {
        for r in task * per_task..((task + 1) * per_task).min(n_rows) {
            // SAFETY: each row index belongs to exactly one task, and `data` outlives `run`.
            let row = unsafe { std::slice::from_raw_parts_mut(base.get().add(r * width), width) };
            f(r, row);
        }
    });
}

struct RowsPtr(*mut f32);
// SAFETY: `par_rows` hands each row to one task only.
unsafe impl Sync for RowsPtr {}

impl RowsPtr {
    fn get(&self) -> *mut f32 {
        self.0
    }
}

/// RMS-normalizes each `group`-wide slice of `x` in place and multiplies by `weight` (length `group`).
/// ggml's order: the sum of squares in f64, then one f32 scale.
pub fn rms_norm(x: &mut [f32], group: usize, weight: Option<&[f32]>, eps: f32) {
    for g in x.chunks_exact_mut(group) {
        let sum: f64 = g.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let mean = (sum / group as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        match weight {
            Some(w) => g.iter_mut().zip(w).for_each(|(v, &w)| *v = (*v * scale) * w),
            None => g.iter_mut().for_each(|v| *v *= scale),
        }
    }
}

/// The cos/sin table for one position, `n_rot` rotated dimensions per head (`freq_scale`: linear
/// position scaling, 1 / factor): computed as ggml does (theta multiplied down by a constant ratio in
/// f32, not a fresh `powf` per pair), which keeps Tandem's angles within an ulp of llama.cpp's.
pub fn rope_angles(pos: usize, n_rot: usize, freq_base: f32, freq_scale: f32, out: &mut Vec<(f32, f32)>) {
    out.clear();
    let theta_scale = freq_base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    for _ in 0..n_rot / 2 {
        let t = freq_scale * theta;
        out.push((t.cos(), t.sin()));
        theta *= theta_scale;
    }
}

/// Rotates every head of one row (`n_heads` heads of `head_dim`) by precomputed angles: adjacent pairs
/// (x[2i], x[2i+1]), llama.cpp's "normal" RoPE, or with `neox` halves (x[i], x[i + n_rot/2]).
pub fn rope_row(row: &mut [f32], head_dim: usize, angles: &[(f32, f32)], neox: bool) {
    let n_rot = angles.len() * 2;
    for head in row.chunks_exact_mut(head_dim) {
        match neox {
            false => {
                for (i, &(c, s)) in angles.iter().enumerate() {
                    let (x0, x1) = (head[2 * i], head[2 * i + 1]);
                    head[2 * i] = x0 * c - x1 * s;
                    head[2 * i + 1] = x0 * s + x1 * c;
                }
            }
            true => {
                let half = n_rot / 2;
                for (i, &(c, s)) in angles.iter().enumerate() {
                    let (x0, x1) = (head[i], head[i + half]);
                    head[i] = x0 * c - x1 * s;
                    head[i + half] = x0 * s + x1 * c;
                }
            }
        }
    }
}

/// GELU, tanh approximation, in f32.
pub fn gelu_tanh_f32(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044_715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh())
}

/// GELU as llama.cpp's CPU backend evaluates it (the parity reference): the input rounded to f16 and
/// looked up in a table of f16 results, 0 below -10 and the identity above 10.
pub fn gelu_tanh(x: f32) -> f32 {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let table = TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| half::f16::from_f32(gelu_tanh_f32(half::f16::from_bits(bits).to_f32())).to_f32())
            .collect()
    });
    table[half::f16::from_f32(x).to_bits() as usize]
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `gate[i] = act(gate[i]) * up[i]`: the gated FFN's middle.
pub fn gated(gate: &mut [f32], up: &[f32], act: fn(f32) -> f32) {
    gate.iter_mut().zip(up).for_each(|(g, &u)| *g = act(*g) * u);
}

pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, &b)| *a += b);
}

pub fn scale_in_place(x: &mut [f32], s: f32) {
    x.iter_mut().for_each(|v| *v *= s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_normalizes_each_group() {
        let mut x = vec![3.0, 4.0, 1.0, 1.0];
        rms_norm(&mut x, 2, Some(&[1.0, 2.0]), 0.0);
        let r = (12.5f32).sqrt();
        assert!((x[0] - 3.0 / r).abs() < 1e-6 && (x[1] - 8.0 / r).abs() < 1e-6);
        assert!((x[2] - 1.0).abs() < 1e-6 && (x[3] - 2.0).abs() < 1e-6);
    }

    #[test]
    fn rope_preserves_norm_and_is_identity_at_zero() {
        let mut angles = Vec::new();
        rope_angles(0, 8, 10000.0, 1.0, &mut angles);
        let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.7).collect();
        let mut x = orig.clone();
        rope_row(&mut x, 8, &angles, true);
        assert_eq!(x, orig);
        for neox in [true, false] {
            rope_angles(37, 8, 10000.0, 1.0, &mut angles);
            let mut x = orig.clone();
            rope_row(&mut x, 8, &angles, neox);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = x.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-4, "neox {neox}");
            assert_ne!(x, orig);
        }
    }

    #[test]
    fn rope_rotates_relative_positions() {
        // <rope(q, m), rope(k, n)> depends only on m - n.
        let dot_at = |m: usize, n: usize| {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            rope_angles(m, 4, 100.0, 1.0, &mut a);
            rope_angles(n, 4, 100.0, 1.0, &mut b);
            let mut q = vec![0.3, -1.0, 0.5, 2.0];
            let mut k = vec![1.0, 0.2, -0.4, 0.9];
            rope_row(&mut q, 4, &a, false);
            rope_row(&mut k, 4, &b, false);
            q.iter().zip(&k).map(|(x, y)| x * y).sum::<f32>()
        };
        assert!((dot_at(10, 7) - dot_at(5, 2)).abs() < 1e-4);
    }

    #[test]
    fn activations() {
        assert!((gelu_tanh_f32(1.0) - 0.841_192).abs() < 1e-5);
        assert!(
            (gelu_tanh(1.0) - 0.841_192).abs() < 1e-3,
            "the f16 table is within f16 precision"
        );
        assert_eq!(gelu_tanh(-11.0), 0.0);
        assert_eq!(gelu_tanh(12.5), 12.5);
        assert_eq!(gelu_tanh(0.0), 0.0);
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
    }
}
