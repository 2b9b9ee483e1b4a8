//! Which of a mixture's experts the GPU holds under a byte budget (GPU-free, unit-tested).
//!
//! Every mixture layer keeps the same number of experts resident, its lowest-numbered ones (an
//! expert's number says nothing of its popularity, and an even split lets a streamed chunk's copies
//! overlap every layer's compute alike); bytes left over give one more expert to the first layers
//! that fit one. The rest live in host memory and pass through the device's slots when used.

use crate::options::ExpertBudget;

/// How many experts, the lowest-numbered, each layer keeps on the device (`None`: a dense layer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Residency {
    resident: Vec<Option<usize>>,
    n_expert: usize,
}

impl Residency {
    /// `layers[l]`: layer l's expert bytes (one expert's three matrices), or `None` for a dense layer;
    /// `budget_bytes`: `None` keeps every expert resident.
    pub fn plan(layers: &[Option<u64>], n_expert: usize, budget_bytes: Option<u64>) -> Self {
        let Some(budget) = budget_bytes else {
            return Residency {
                resident: layers.iter().map(|l| l.map(|_| n_expert)).collect(),
                n_expert,
            };
        };
        let per_round: u64 = layers.iter().flatten().sum();
        // The same count in every layer, as many as fit.
        let even = match per_round {
            0 => n_expert as u64,
            b => (budget / b).min(n_expert as u64),
        };
        let mut left = budget - even * per_round;
        let resident = layers
            .iter()
            .map(|l| {
                l.map(|bytes| {
                    let mut n = even as usize;
                    if n < n_expert && bytes <= left {
                        left -= bytes;
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        Residency { resident, n_expert }
    }

    pub fn n_expert(&self) -> usize {
        self.n_expert
    }

    /// Whether `layer`'s `expert` is on the device (a dense layer's "experts" always are).
    pub fn is_resident(&self, layer: usize, expert: usize) -> bool {
        self.resident.get(layer).copied().flatten().is_none_or(|n| expert < n)
    }

    /// Whether every expert of every layer is resident.
    pub fn all_resident(&self) -> bool {
        self.resident.iter().flatten().all(|&n| n == self.n_expert)
    }

    /// Experts resident in `layer` (`None` for a dense layer or one past the model).
    pub fn resident_in(&self, layer: usize) -> Option<usize> {
        self.resident.get(layer).copied().flatten()
    }

    /// The layers' non-resident experts, layer after layer.
    pub fn non_resident(&self) -> usize {
        self.resident.iter().flatten().map(|&n| self.n_expert - n).sum()
    }
}

/// The budget a `--gpu-expert-budget` asks for, in bytes: `None` for every expert. `Auto` takes the
/// device's `total` memory less `dense` (the weights that always stay), `slots` and a reserve for KV
/// caches and activations (a tenth of the device, at least 4 GiB).
pub fn budget_bytes(budget: ExpertBudget, total: u64, dense: u64, slots: u64) -> Option<u64> {
    match budget {
        ExpertBudget::All => None,
        ExpertBudget::Bytes(b) => Some(b),
        ExpertBudget::Auto => {
            let reserve = (total / 10).max(4 << 30);
            Some(total.saturating_sub(dense + slots + reserve))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_expert_stays_without_a_budget() {
        let r = Residency::plan(&[Some(10), None, Some(12)], 8, None);
        assert!(r.all_resident());
        assert_eq!(r.non_resident(), 0);
        assert!(r.is_resident(0, 7) && r.is_resident(1, 100) && r.is_resident(2, 7));
        assert_eq!(r.resident_in(1), None);
    }

    #[test]
    fn layers_share_the_budget_evenly_then_the_first_take_the_rest() {
        // Three mixture layers of 10, 10 and 12 bytes an expert, one dense.
        let layers = [Some(10), None, Some(10), Some(12)];
        // 2 a layer is 64 bytes; 21 more give one to layers 0 and 2 (10 + 10), not to 3.
        let r = Residency::plan(&layers, 4, Some(85));
        assert_eq!(
            (0..4).map(|l| r.resident_in(l)).collect::<Vec<_>>(),
            [Some(3), None, Some(3), Some(2)]
        );
        assert!(r.is_resident(0, 2) && !r.is_resident(0, 3));
        assert!(r.is_resident(3, 1) && !r.is_resident(3, 2));
        assert_eq!(r.non_resident(), 1 + 1 + 2);
        // Nothing resident at 0; everything at or past the whole.
        let none = Residency::plan(&layers, 4, Some(0));
        assert_eq!(none.non_resident(), 12);
        assert!(!none.is_resident(0, 0));
        let whole = Residency::plan(&layers, 4, Some(4 * 32 + 1000));
        assert!(whole.all_resident());
    }

    #[test]
    fn the_plan_never_exceeds_its_budget() {
        let layers: Vec<Option<u64>> = (0..7).map(|l| Some(100 + 37 * l as u64)).collect();
        for budget in (0..6000).step_by(97) {
            let r = Residency::plan(&layers, 16, Some(budget));
            let used: u64 = layers
                .iter()
                .enumerate()
                .map(|(l, b)| b.unwrap() * r.resident_in(l).unwrap() as u64)
                .sum();
            assert!(used <= budget, "{used} > {budget}");
            // Layers differ by one expert at most, and none could take one more in what is left.
            let counts: Vec<usize> = (0..7).map(|l| r.resident_in(l).unwrap()).collect();
            let (lo, hi) = (*counts.iter().min().unwrap(), *counts.iter().max().unwrap());
            assert!(hi - lo <= 1, "{counts:?}");
            let left = budget - used;
            if lo < 16 {
                let lo_layers = layers.iter().zip(&counts).filter(|(_, &c)| c == lo);
                assert!(
                    lo_layers.clone().all(|(b, _)| b.unwrap() > left),
                    "{counts:?} with {left} left"
                );
            }
        }
    }

    #[test]
    fn auto_leaves_a_reserve() {
        let gib = 1u64 << 30;
        assert_eq!(budget_bytes(ExpertBudget::All, 80 * gib, 0, 0), None);
        assert_eq!(budget_bytes(ExpertBudget::Bytes(5), 80 * gib, 0, 0), Some(5));
        assert_eq!(
            budget_bytes(ExpertBudget::Auto, 80 * gib, 10 * gib, gib),
            Some(61 * gib)
        );
        assert_eq!(budget_bytes(ExpertBudget::Auto, 8 * gib, 10 * gib, gib), Some(0));
    }
}
