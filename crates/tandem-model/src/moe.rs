//! Mixture-of-experts routing: which experts each row of a chunk reads, with what weights, and the
//! chunk's rows grouped by expert so that each expert's matrices are read once for all its rows.
//!
//! A row's routing depends only on its own router logits, and its output is the weighted sum of its
//! experts' outputs in slot order (most probable first), so a row's result does not depend on the
//! rows it shares a chunk or a batch with (given row-exact matrix products, which every backend has).

use crate::config::MoeConfig;
use crate::ModelError;

/// Each row's chosen experts (`k` slots, most probable first; ties to the lower expert index) and
/// their weights, as llama.cpp's `build_moe_ffn` computes them with softmax gating: the softmax over
/// all of a row's router logits, the chosen experts' probabilities, renormalised to sum 1 when the
/// model says so.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    pub k: usize,
    pub n_expert: usize,
    /// `rows × k` expert ids, row-major.
    pub experts: Vec<u32>,
    /// `rows × k` weights, matching `experts`.
    pub weights: Vec<f32>,
}

/// The rows one expert reads: `pairs[i]` is the index into `Routing::experts` (row × k + slot) of
/// its i-th row, rows ascending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertRows {
    pub expert: usize,
    pub pairs: Vec<usize>,
}

impl ExpertRows {
    /// The chunk rows in order.
    pub fn rows(&self, k: usize) -> impl Iterator<Item = usize> + '_ {
        self.pairs.iter().map(move |p| p / k)
    }
}

/// The smallest sum the renormalisation divides by (llama.cpp's clamp, the smallest normal f16).
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

impl Routing {
    /// Routes every row of `logits` (`rows × n_expert`, row-major).
    pub fn from_logits(logits: &[f32], moe: &MoeConfig) -> Result<Routing, ModelError> {
        let (n, k) = (moe.n_expert, moe.n_expert_used);
        if n == 0 || k == 0 || k > n || !logits.len().is_multiple_of(n) {
            return Err(ModelError::Kernel(format!(
                "{} router logits for {n} experts, {k} used",
                logits.len()
            )));
        }
        let rows = logits.len() / n;
        let mut experts = Vec::with_capacity(rows * k);
        let mut weights = Vec::with_capacity(rows * k);
        let mut probs = vec![0f32; n];
        let mut taken = vec![false; n];
        for row in logits.chunks_exact(n) {
            softmax(row, &mut probs);
            taken.iter_mut().for_each(|t| *t = false);
            let first = weights.len();
            for _ in 0..k {
                let mut best = usize::MAX;
                for (e, &p) in probs.iter().enumerate() {
                    // The first untaken expert starts the search, so a slot is filled even by NaNs.
                    if !taken[e] && (best == usize::MAX || p > probs[best]) {
                        best = e;
                    }
                }
                taken[best] = true;
                experts.push(best as u32);
                weights.push(probs[best]);
            }
            if moe.norm_weights {
                let mine = &mut weights[first..];
                let sum = mine.iter().fold(0f32, |s, &w| s + w).max(MIN_WEIGHT_SUM);
                mine.iter_mut().for_each(|w| *w /= sum);
            }
        }
        Ok(Routing {
            k,
            n_expert: n,
            experts,
            weights,
        })
    }

    pub fn rows(&self) -> usize {
        self.experts.len() / self.k.max(1)
    }

    /// The experts at least one row reads, ascending, each with its rows.
    pub fn by_expert(&self) -> Vec<ExpertRows> {
        group_by_expert(&self.experts, self.n_expert)
    }

    /// Whether any row reads each expert.
    pub fn routed(&self) -> Vec<bool> {
        let mut routed = vec![false; self.n_expert];
        for &e in &self.experts {
            routed[e as usize] = true;
        }
        routed
    }
}

/// The experts at least one of `experts` (`rows × k` ids, row-major, each below `n_expert`) names,
/// ascending, each with its rows: the grouping alone, for a backend that routed on its own and holds
/// only the ids.
pub fn group_by_expert(experts: &[u32], n_expert: usize) -> Vec<ExpertRows> {
    let mut pairs: Vec<Vec<usize>> = vec![Vec::new(); n_expert];
    for (p, &e) in experts.iter().enumerate() {
        pairs[e as usize].push(p);
    }
    pairs
        .into_iter()
        .enumerate()
        .filter(|(_, p)| !p.is_empty())
        .map(|(expert, pairs)| ExpertRows { expert, pairs })
        .collect()
}

/// `probs = softmax(logits)`: the maximum subtracted, the exponentials summed in f64.
fn softmax(logits: &[f32], probs: &mut [f32]) {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    let mut sum = 0f64;
    for (p, &x) in probs.iter_mut().zip(logits) {
        *p = (x - max).exp();
        sum += *p as f64;
    }
    let inv = (1.0 / sum) as f32;
    probs.iter_mut().for_each(|p| *p *= inv);
}

/// Each row's output: the sum over its slots, in slot order, of the slot's weight times its expert's
/// output row. `expert_out[g]` holds group `groups[g]`'s output rows (`width` wide) in its order.
pub fn combine(
    routing: &Routing,
    groups: &[ExpertRows],
    expert_out: &[Vec<f32>],
    width: usize,
) -> Result<Vec<f32>, ModelError> {
    let k = routing.k;
    // Where each (row, slot) pair's expert output lives: (group, index in group).
    let mut at = vec![(usize::MAX, 0usize); routing.experts.len()];
    for (g, (group, out)) in groups.iter().zip(expert_out).enumerate() {
        if out.len() != group.pairs.len() * width {
            return Err(ModelError::Kernel(format!(
                "expert {}: {} outputs for {} rows of {width}",
                group.expert,
                out.len(),
                group.pairs.len()
            )));
        }
        for (i, &p) in group.pairs.iter().enumerate() {
            at[p] = (g, i);
        }
    }
    let mut out = vec![0f32; routing.rows() * width];
    for (r, dst) in out.chunks_exact_mut(width).enumerate() {
        for slot in 0..k {
            let p = r * k + slot;
            let (g, i) = at[p];
            let src = expert_out
                .get(g)
                .map(|o| &o[i * width..(i + 1) * width])
                .ok_or_else(|| ModelError::Kernel(format!("row {r} slot {slot}: no expert output")))?;
            let w = routing.weights[p];
            if slot == 0 {
                dst.iter_mut().zip(src).for_each(|(d, &s)| *d = w * s);
            } else {
                dst.iter_mut().zip(src).for_each(|(d, &s)| *d += w * s);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moe(n_expert: usize, k: usize, norm: bool) -> MoeConfig {
        MoeConfig {
            n_expert,
            n_expert_used: k,
            d_ff_expert: 8,
            norm_weights: norm,
        }
    }

    #[test]
    fn the_most_probable_experts_in_order_with_renormalised_weights() {
        let logits = [0.0, 3.0, 1.0, 3.0, -1.0, 2.0, 0.5, 0.5];
        let r = Routing::from_logits(&logits, &moe(4, 2, true)).unwrap();
        // Row 0: experts 1 and 3 tie; the lower index comes first. Row 1: 1 then 2 (0.5 ties at 2, 3).
        assert_eq!(r.experts, vec![1, 3, 1, 2]);
        assert!((r.weights[0] - 0.5).abs() < 1e-7 && (r.weights[1] - 0.5).abs() < 1e-7);
        let (a, b) = (2f32.exp(), 0.5f32.exp());
        assert!((r.weights[2] - a / (a + b)).abs() < 1e-6, "{:?}", r.weights);
        assert!((r.weights[2] + r.weights[3] - 1.0).abs() < 1e-6);
    }

    #[test]
    fn without_renormalisation_the_weights_are_softmax_probabilities() {
        let logits = [1.0, 2.0, 3.0];
        let r = Routing::from_logits(&logits, &moe(3, 1, false)).unwrap();
        let z: f32 = logits.iter().map(|x| x.exp()).sum();
        assert_eq!(r.experts, vec![2]);
        assert!((r.weights[0] - 3f32.exp() / z).abs() < 1e-6);
    }

    #[test]
    fn rows_grouped_by_expert_and_combined_in_slot_order() {
        let logits = [5.0, 4.0, 0.0, 0.0, 0.0, 5.0, 4.0, 0.0, 4.0, 0.0, 0.0, 5.0];
        let r = Routing::from_logits(&logits, &moe(4, 2, false)).unwrap();
        assert_eq!(r.experts, vec![0, 1, 1, 2, 3, 0]);
        let groups = r.by_expert();
        let got: Vec<(usize, Vec<usize>)> = groups.iter().map(|g| (g.expert, g.rows(2).collect())).collect();
        assert_eq!(got, vec![(0, vec![0, 2]), (1, vec![0, 1]), (2, vec![1]), (3, vec![2])]);
        assert_eq!(r.routed(), vec![true; 4]);
        // Expert e's output for any row is the constant e + 1 (width 2).
        let outs: Vec<Vec<f32>> = groups
            .iter()
            .map(|g| vec![g.expert as f32 + 1.0; 2 * g.pairs.len()])
            .collect();
        let out = combine(&r, &groups, &outs, 2).unwrap();
        for row in 0..3 {
            let want: f32 = (0..2)
                .map(|s| r.weights[row * 2 + s] * (r.experts[row * 2 + s] as f32 + 1.0))
                .sum();
            assert!((out[row * 2] - want).abs() < 1e-6);
        }
    }

    #[test]
    fn a_row_routes_the_same_alone_or_in_a_chunk() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % 1000) as f32 / 100.0 - 5.0
        };
        let logits: Vec<f32> = (0..64 * 16).map(|_| next()).collect();
        let cfg = moe(16, 4, true);
        let all = Routing::from_logits(&logits, &cfg).unwrap();
        for (r, row) in logits.chunks_exact(16).enumerate() {
            let one = Routing::from_logits(row, &cfg).unwrap();
            assert_eq!(one.experts, all.experts[r * 4..(r + 1) * 4]);
            assert_eq!(one.weights, all.weights[r * 4..(r + 1) * 4]);
        }
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(Routing::from_logits(&[0.0; 5], &moe(4, 2, true)).is_err());
        assert!(Routing::from_logits(&[0.0; 4], &moe(4, 5, true)).is_err());
        let r = Routing::from_logits(&[0.0; 4], &moe(4, 1, true)).unwrap();
        let groups = r.by_expert();
        assert!(combine(&r, &groups, &[vec![0.0; 3]], 2).is_err());
    }
}
