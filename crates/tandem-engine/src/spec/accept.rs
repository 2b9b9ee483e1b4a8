//! Which drafted tokens the target keeps.
//!
//! Row `i` of the verify pass holds the target's logits after the drafts `0..i`. Draft `i` is judged
//! against the distribution the sequence's sampler would draw from there (bias, penalties over the
//! history including the earlier drafts, truncations, temperature):
//! - greedy: kept when it is that distribution's one token; the first one that is not is replaced by it;
//! - sampled: kept with probability `min(1, p(x) / q(x))` (`q`: the proposer's probability of `x`, 1 for
//!   a certain draft); the first rejected one is replaced by a draw from `max(0, p - q)` renormalised.
//!   This is the rule of Leviathan et al. and Chen et al. (2023): the kept and replaced tokens together
//!   are distributed exactly as draws from `p` would be.
//!
//! When every draft is kept, the last row gives one more token (drawn from `p` as usual).

use crate::sampling::{Distribution, Sampler};

/// The outcome of one verify pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// Drafts kept, from the first.
    pub accepted: usize,
    /// The tokens the step produces: the kept drafts, then the replacement or the bonus token.
    pub tokens: Vec<u32>,
}

/// Judges `drafts` against the target's logits `rows` (`drafts.len() + 1` rows of `n_vocab`).
/// `history` is the sequence so far (the drafts not included); `dists` the proposer's distributions
/// when it sampled.
pub fn verify(
    sampler: &mut Sampler,
    rows: &[f32],
    n_vocab: usize,
    history: &[u32],
    drafts: &[u32],
    dists: Option<&[Distribution]>,
) -> Verdict {
    debug_assert_eq!(rows.len(), (drafts.len() + 1) * n_vocab);
    let mut seen = history.to_vec();
    let mut tokens = Vec::with_capacity(drafts.len() + 1);
    for (i, &d) in drafts.iter().enumerate() {
        let target = sampler.distribution(&rows[i * n_vocab..(i + 1) * n_vocab], &seen);
        let proposal = dists.and_then(|q| q.get(i));
        match judge(sampler, &target, d, proposal) {
            None => {
                tokens.push(d);
                seen.push(d);
            }
            Some(replacement) => {
                tokens.push(replacement);
                return Verdict { accepted: i, tokens };
            }
        }
    }
    let k = drafts.len();
    let last = sampler.distribution(&rows[k * n_vocab..(k + 1) * n_vocab], &seen);
    tokens.push(sampler.draw(&last));
    Verdict { accepted: k, tokens }
}

/// `None` keeps `draft`; `Some(t)`: rejected, `t` takes its place.
fn judge(sampler: &mut Sampler, target: &Distribution, draft: u32, proposal: Option<&Distribution>) -> Option<u32> {
    if target.greedy {
        let best = target.tokens[0];
        return (best != draft).then_some(best);
    }
    let p = target.prob(draft);
    let q = proposal.map_or(1.0, |q| q.prob(draft));
    // q = 0 cannot happen for a token the proposer drew; treat it as a certain draft.
    let ratio = if q > 0.0 { p / q } else { p };
    if p > 0.0 && sampler.uniform() < ratio {
        return None;
    }
    Some(sampler.draw(&residual(target, draft, proposal)))
}

/// `max(0, p - q)` renormalised: what a rejection draws from (`q` a point mass on `draft` when the
/// proposer gave no distribution).
fn residual(target: &Distribution, draft: u32, proposal: Option<&Distribution>) -> Distribution {
    let mut tokens = Vec::with_capacity(target.tokens.len());
    let mut probs = Vec::with_capacity(target.tokens.len());
    for (&t, &p) in target.tokens.iter().zip(&target.probs) {
        let q = match proposal {
            Some(q) => q.prob(t),
            None => f64::from(u8::from(t == draft)),
        };
        let r = p - q;
        if r > 0.0 {
            tokens.push(t);
            probs.push(r);
        }
    }
    let sum: f64 = probs.iter().sum();
    if tokens.is_empty() || sum <= 0.0 {
        // p <= q everywhere: p equals q, and a rejection had probability 0; fall back to p itself.
        return target.clone();
    }
    probs.iter_mut().for_each(|p| *p /= sum);
    Distribution {
        tokens,
        probs,
        greedy: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;

    const V: usize = 6;

    fn rows(n: usize, seed: f32) -> Vec<f32> {
        (0..n * V).map(|i| (i as f32 * 0.77 + seed).sin() * 3.0).collect()
    }

    fn greedy() -> Sampler {
        Sampler::new(SamplingParams::default())
    }

    #[test]
    fn greedy_keeps_drafts_up_to_the_first_disagreement() {
        let r = rows(4, 0.3);
        let best: Vec<u32> = (0..4)
            .map(|i| crate::sampling::argmax(&r[i * V..(i + 1) * V]))
            .collect();
        // All three right: three kept and the fourth row's token on top.
        let v = verify(&mut greedy(), &r, V, &[], &best[..3], None);
        assert_eq!(
            v,
            Verdict {
                accepted: 3,
                tokens: best.clone()
            }
        );
        // The second wrong: one kept, then the target's token in its place.
        let wrong = (best[1] + 1) % V as u32;
        let v = verify(&mut greedy(), &r, V, &[], &[best[0], wrong, best[2]], None);
        assert_eq!(
            v,
            Verdict {
                accepted: 1,
                tokens: best[..2].to_vec()
            }
        );
        // No drafts: the one row's token, as a plain step.
        let v = verify(&mut greedy(), &r[..V], V, &[], &[], None);
        assert_eq!(v.tokens, vec![best[0]]);
    }

    #[test]
    fn greedy_sees_penalties_over_the_earlier_drafts() {
        // Row 1's best token is penalised once draft 0 is in the history.
        let logits = [0.0, 3.0, 2.9, 0.0, 0.0, 0.0];
        let r: Vec<f32> = logits.iter().chain(&logits).copied().collect();
        let mut s = Sampler::new(SamplingParams {
            repeat_penalty: 2.0,
            ..Default::default()
        });
        let v = verify(&mut s, &r, V, &[], &[1], None);
        assert_eq!(
            v,
            Verdict {
                accepted: 1,
                tokens: vec![1, 2]
            }
        );
    }

    /// Chi-square statistic of observed counts against expected probabilities.
    fn chi_square(counts: &[u64], expected: &[f64]) -> f64 {
        let n: u64 = counts.iter().sum();
        counts
            .iter()
            .zip(expected)
            .filter(|(_, &e)| e > 0.0)
            .map(|(&c, &e)| {
                let e = e * n as f64;
                (c as f64 - e).powi(2) / e
            })
            .sum()
    }

    fn sampled(seed: u64) -> Sampler {
        Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..Default::default()
        })
    }

    /// The first token a step produces, over many steps, follows the target's distribution whatever
    /// the proposal: a certain draft of each token, and a sampled draft from a distribution unlike the
    /// target's. 5 degrees of freedom: the 0.999 quantile of chi-square is 20.5.
    #[test]
    fn sampled_acceptance_keeps_the_target_distribution() {
        let logits = [1.0f32, 0.2, -0.5, 2.0, 0.7, -1.5];
        let r: Vec<f32> = logits.iter().chain(&logits).copied().collect();
        let target = sampled(0).distribution(&logits, &[]);
        let expected: Vec<f64> = (0..V as u32).map(|t| target.prob(t)).collect();
        let trials = 40_000;
        for draft in 0..V as u32 {
            let mut s = sampled(7 + draft as u64);
            let mut counts = [0u64; V];
            for _ in 0..trials {
                counts[verify(&mut s, &r, V, &[], &[draft], None).tokens[0] as usize] += 1;
            }
            let chi = chi_square(&counts, &expected);
            assert!(
                chi < 20.5,
                "certain draft {draft}: chi-square {chi:.1}, counts {counts:?}"
            );
        }
        // A proposer with its own (different) distribution, drawing its drafts from it.
        let q_logits = [-1.0f32, 1.5, 0.5, 0.0, -0.3, 1.0];
        let mut proposer = sampled(99);
        let q = proposer.distribution(&q_logits, &[]);
        let mut s = sampled(3);
        let mut counts = [0u64; V];
        let mut kept = 0;
        for _ in 0..trials {
            let d = proposer.draw(&q);
            let v = verify(&mut s, &r, V, &[], &[d], Some(std::slice::from_ref(&q)));
            kept += v.accepted;
            counts[v.tokens[0] as usize] += 1;
        }
        let chi = chi_square(&counts, &expected);
        assert!(chi < 20.5, "sampled draft: chi-square {chi:.1}, counts {counts:?}");
        // The expected acceptance is the overlap sum(min(p, q)).
        let overlap: f64 = (0..V as u32).map(|t| target.prob(t).min(q.prob(t))).sum();
        let rate = kept as f64 / trials as f64;
        assert!(
            (rate - overlap).abs() < 0.02,
            "acceptance {rate:.3}, overlap {overlap:.3}"
        );
    }

    /// The pair (first, second) of a two-draft step is distributed as two draws from the target:
    /// rejection sampling holds past the first position too.
    #[test]
    fn two_drafts_keep_the_joint_distribution() {
        let l0 = [0.5f32, 1.0, -0.2, 0.0, 0.3, -1.0];
        let l1 = [1.2f32, -0.4, 0.1, 0.9, -2.0, 0.0];
        let r: Vec<f32> = l0.iter().chain(&l1).chain(&l1).copied().collect();
        let p0 = sampled(0).distribution(&l0, &[]);
        let p1 = sampled(0).distribution(&l1, &[]);
        let mut expected = vec![0.0; V * V];
        for a in 0..V {
            for b in 0..V {
                expected[a * V + b] = p0.prob(a as u32) * p1.prob(b as u32);
            }
        }
        let mut s = sampled(11);
        let mut counts = vec![0u64; V * V];
        let trials = 200_000;
        let mut pairs = 0;
        while pairs < trials {
            let v = verify(&mut s, &r, V, &[], &[3, 0], None);
            let first = v.tokens[0] as usize;
            let second = if v.tokens.len() >= 2 {
                v.tokens[1] as usize
            } else {
                // The step stopped at the first token: the next step's first token follows row 1's
                // distribution, as a plain step would draw it.
                let row1 = &r[V..2 * V];
                s.sample(row1, &[first as u32]) as usize
            };
            counts[first * V + second] += 1;
            pairs += 1;
        }
        // 35 degrees of freedom: the 0.999 quantile of chi-square is 66.6.
        let chi = chi_square(&counts, &expected);
        assert!(chi < 66.6, "chi-square {chi:.1}");
    }
}
