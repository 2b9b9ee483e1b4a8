//! How many tokens to draft. With acceptance rate `a` per draft, a step drafting `k` tokens yields on
//! average `(1 - a^(k+1)) / (1 - a)` tokens, and costs a one-row step plus what its `k` extra rows
//! add. Both are measured as decoding goes: `a` as a moving average over drafted tokens, the costs as
//! moving averages of the passes' times: of one-row steps, of the extra seconds a drafted row adds
//! (over every verify pass), and of each draft width's own passes. A width's own average, once it has
//! one, wins over the per-row figure, since the cost of a wider pass is far from linear in its rows on
//! a GPU (the 8B shape on an H100: a 9-row pass costs 1.9x a one-row step, a 17-row one 2.2x; where the
//! deterministic matvecs take 8 rows a launch, 9 rows cost what 8 and 1 do). A width's first pass is
//! left out of its own average: it may have paid for a warm-up (a GPU captures a graph) that no later
//! pass pays, and a width that looked dear would never run again to show otherwise. The length chosen
//! maximises tokens per second; when no length beats a plain step, none is drafted, so text where
//! drafts fail decodes at the plain speed.
//!
//! A rate estimated low would stop drafting for good, and with it the measurements that could raise it,
//! so after a number of plain steps one token is drafted as a probe; each failed probe doubles the wait
//! before the next (up to `MAX_BACKOFF` steps), which bounds what probing costs on text where drafts
//! never hold.

use tandem_model::ServingCache;

/// The running estimates behind the draft length.
#[derive(Clone, Debug)]
pub struct DraftLength {
    max: usize,
    adaptive: bool,
    /// Estimated probability that a draft token is accepted.
    acceptance: f64,
    /// Seconds of a one-row step, and extra seconds per drafted row in a verify pass.
    step_seconds: Option<f64>,
    row_seconds: Option<f64>,
    /// Seconds of a verify pass by its drafted rows (index 0 unused), from its second pass on; and
    /// which widths have run at all.
    width_seconds: Vec<Option<f64>>,
    width_ran: Vec<bool>,
    /// Plain steps since the last drafted one, and how many to wait before probing.
    plain_steps: usize,
    backoff: usize,
    probing: bool,
}

/// Weight of the newest observation in the moving averages.
const WEIGHT: f64 = 0.15;
/// Where the acceptance estimate starts and drifts back to while nothing is drafted.
const PRIOR: f64 = 0.6;
/// Plain steps before the first probe, and the longest wait between probes.
const FIRST_BACKOFF: usize = 8;
const MAX_BACKOFF: usize = 256;
/// Extra cost of a drafted row relative to a one-row step, until a drafted pass is measured.
const ROW_COST_PRIOR: f64 = 0.15;

impl DraftLength {
    pub fn new(max: usize, adaptive: bool) -> Self {
        DraftLength {
            max,
            adaptive,
            acceptance: PRIOR,
            step_seconds: None,
            row_seconds: None,
            width_seconds: vec![None; max + 1],
            width_ran: vec![false; max + 1],
            plain_steps: 0,
            backoff: FIRST_BACKOFF,
            probing: false,
        }
    }

    /// The estimated acceptance rate.
    pub fn acceptance(&self) -> f64 {
        self.acceptance
    }

    /// Tokens to draft in a step that may still send `tokens_left` tokens (the fed token's successor
    /// and the drafts' among them) on `kv`: the chosen length, capped so the step stays within
    /// `max_tokens`, its rows within the context, and the cache can be cut back past them
    /// (`ServingCache::rewind_room`).
    pub fn choose_within<K: ServingCache>(&mut self, tokens_left: usize, kv: &K) -> usize {
        let room = kv.n_ctx().saturating_sub(kv.len() + 1);
        self.choose()
            .min(tokens_left.saturating_sub(1))
            .min(room)
            .min(kv.rewind_room())
    }

    /// Tokens to draft in the next step (0: a plain step).
    pub fn choose(&mut self) -> usize {
        if !self.adaptive {
            return self.max;
        }
        let k = self.best();
        self.probing = k == 0 && self.plain_steps >= self.backoff;
        if self.probing {
            1
        } else {
            k
        }
    }

    /// The estimated cost of a pass drafting `k` rows, relative to a plain step.
    fn relative_cost(&self, k: usize) -> f64 {
        let Some(step) = self.step_seconds.filter(|&s| s > 0.0) else {
            return 1.0 + ROW_COST_PRIOR * k as f64;
        };
        if let Some(own) = self.width_seconds.get(k).copied().flatten() {
            return own / step;
        }
        let row = self.row_seconds.map_or(ROW_COST_PRIOR, |r| (r / step).max(0.0));
        1.0 + row * k as f64
    }

    /// The length the estimates favour.
    fn best(&self) -> usize {
        let a = self.acceptance.clamp(0.0, 0.999);
        let mut best = (1.0, 0);
        for k in 1..=self.max {
            let tokens = (1.0 - a.powi(k as i32 + 1)) / (1.0 - a);
            let rate = tokens / self.relative_cost(k).max(f64::MIN_POSITIVE);
            // Only a clear gain justifies the wider pass (the estimates are noisy).
            if rate > best.0 * 1.02 && rate > best.0 {
                best = (rate, k);
            }
        }
        best.1
    }

    /// Records a step: `drafted` tokens proposed (0: a plain step), `accepted` of them kept, `seconds`
    /// the forward pass took.
    pub fn record(&mut self, drafted: usize, accepted: usize, seconds: f64) {
        if drafted == 0 {
            self.step_seconds = Some(blend(self.step_seconds, seconds));
            self.plain_steps += 1;
            return;
        }
        self.plain_steps = 0;
        if self.probing {
            self.backoff = if accepted == 0 {
                (self.backoff * 2).min(MAX_BACKOFF)
            } else {
                FIRST_BACKOFF
            };
            self.probing = false;
        }
        // Each draft token is an observation; later ones count only if the earlier were kept, so
        // `accepted` kept and at most one rejected are what this step says about the rate.
        let observed = (accepted + usize::from(accepted < drafted)) as f64;
        let rate = accepted as f64 / observed.max(1.0);
        let w = 1.0 - (1.0 - WEIGHT).powf(observed);
        self.acceptance += (rate - self.acceptance) * w;
        if let Some(step) = self.step_seconds {
            let extra = (seconds - step) / drafted as f64;
            self.row_seconds = Some(blend(self.row_seconds, extra));
        }
        // (Widths past `max`, which `choose` never asks for, get no average of their own.)
        if let (Some(ran), Some(own)) = (self.width_ran.get_mut(drafted), self.width_seconds.get_mut(drafted)) {
            if std::mem::replace(ran, true) {
                *own = Some(blend(*own, seconds));
            }
        }
    }
}

fn blend(old: Option<f64>, new: f64) -> f64 {
    match old {
        Some(o) => o + (new - o) * WEIGHT,
        None => new,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_length_when_not_adaptive() {
        let mut l = DraftLength::new(5, false);
        l.record(5, 0, 1.0);
        assert_eq!(l.choose(), 5);
    }

    #[test]
    fn drafts_more_as_drafts_are_kept_and_stop_when_they_fail() {
        let mut l = DraftLength::new(8, true);
        l.record(0, 0, 0.010);
        let start = l.choose();
        assert!(start > 0, "the prior drafts");
        for _ in 0..40 {
            let k = l.choose().max(1);
            l.record(k, k, 0.012);
        }
        assert!(l.choose() >= start, "all kept: {} vs {start}", l.choose());
        for _ in 0..40 {
            l.record(4, 0, 0.013);
        }
        assert_eq!(l.choose(), 0, "nothing kept: plain steps");
        // After plain steps one token is drafted as a probe; failed probes come ever more rarely.
        let mut waits = Vec::new();
        for _ in 0..6 {
            let mut plain = 0;
            while l.choose() == 0 {
                l.record(0, 0, 0.010);
                plain += 1;
                assert!(plain <= MAX_BACKOFF, "never probes");
            }
            l.record(1, 0, 0.011);
            waits.push(plain);
        }
        assert_eq!(waits, vec![8, 16, 32, 64, 128, 256]);
        // A probe that holds brings drafting back.
        while l.choose() == 0 {
            l.record(0, 0, 0.010);
        }
        l.record(1, 1, 0.011);
        assert!(l.choose() > 0);
    }

    #[test]
    fn costly_rows_shorten_the_draft() {
        let mut cheap = DraftLength::new(8, true);
        let mut dear = DraftLength::new(8, true);
        for _ in 0..20 {
            cheap.record(0, 0, 0.010);
            dear.record(0, 0, 0.010);
            cheap.record(4, 3, 0.0104);
            dear.record(4, 3, 0.018);
        }
        assert!(
            cheap.choose() > dear.choose(),
            "{} vs {}",
            cheap.choose(),
            dear.choose()
        );
    }

    /// Runs steps of every width from 0 to `max`, each kept whole, timed by `cost`.
    fn measured(max: usize, cost: impl Fn(usize) -> f64) -> DraftLength {
        let mut l = DraftLength::new(max, true);
        for _ in 0..3 {
            for k in 0..=max {
                l.record(k, k, cost(k));
            }
        }
        l
    }

    #[test]
    fn cheap_wide_passes_take_long_drafts_though_the_first_rows_are_dear() {
        // A GPU's concave costs (the 8B shape: 2.9 ms for one row, 3.7 for two, 5.5 for nine): the
        // first drafted row is dear, the rest nearly free.
        let l = measured(8, |k| {
            if k == 0 {
                2.9e-3
            } else {
                3.7e-3 + 0.23e-3 * (k - 1) as f64
            }
        });
        assert_eq!(l.best(), 8);
    }

    #[test]
    fn a_width_that_costs_a_second_launch_is_passed_over() {
        // Eight rows a launch: the ninth row (a draft of 8) costs a second one.
        let l = measured(8, |k| if k < 8 { 3.0e-3 + 0.3e-3 * k as f64 } else { 8.0e-3 });
        assert_eq!(l.best(), 7);
    }

    #[test]
    fn widths_not_yet_run_twice_cost_the_per_row_average() {
        let mut l = DraftLength::new(8, true);
        l.record(0, 0, 1.0);
        for _ in 0..2 {
            l.record(2, 2, 1.2);
        }
        l.record(6, 6, 1.6);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(l.relative_cost(2), 1.2), "its own passes");
        assert!(close(l.relative_cost(1), 1.1), "{}", l.relative_cost(1));
        assert!(
            close(l.relative_cost(6), 1.6),
            "one pass: the per-row average, which it agrees with"
        );
    }

    #[test]
    fn the_first_pass_of_a_width_is_left_out_of_its_own_average() {
        let mut l = DraftLength::new(4, true);
        l.record(0, 0, 0.010);
        // A warm-up: the first 4-draft pass took a second; later ones 14 ms.
        l.record(4, 4, 1.0);
        for _ in 0..40 {
            l.record(0, 0, 0.010);
            l.record(4, 4, 0.014);
        }
        assert!((l.relative_cost(4) - 1.4).abs() < 1e-6, "{}", l.relative_cost(4));
        assert_eq!(l.choose(), 4);
    }
}
