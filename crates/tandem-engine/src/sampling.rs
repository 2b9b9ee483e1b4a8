//! Turning logits into the next token: logit bias, penalties, then temperature, top-k, top-p and min-p, then a draw
//! from a seeded generator (the same seed gives the same text). Temperature 0 is greedy.
//! The order follows llama.cpp's default sampler chain: logit bias → penalties → top-k → top-p → min-p → temperature.

use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 → greedy (argmax).
    pub temperature: f32,
    /// 0 → off.
    pub top_k: usize,
    /// 1 → off.
    pub top_p: f32,
    /// 0 → off.
    pub min_p: f32,
    /// Divides positive logits (multiplies negative ones) of recently seen tokens; 1 → off.
    pub repeat_penalty: f32,
    /// Subtracted once from the logit of every token seen in the window; 0 → off.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the window; 0 → off.
    pub frequency_penalty: f32,
    /// How many of the last tokens the penalties look at.
    pub penalty_last_n: usize,
    pub seed: u64,
    /// Added to these tokens' logits before anything else (`f32::NEG_INFINITY` bans a token); ids
    /// beyond the logits are skipped (the HTTP layer refuses them first).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
            logit_bias: Vec::new(),
        }
    }
}

/// A sampler holds its generator, so a sequence's draws are a pure function of its seed and logits.
pub struct Sampler {
    params: SamplingParams,
    state: u64,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        let state = params.seed ^ 0x2545_F491_4F6C_DD1D;
        Sampler { params, state }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    fn next_uniform(&mut self) -> f64 {
        // SplitMix64 step.
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Picks the next token given the logits and the tokens so far (prompt and completion).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let dist = self.distribution(logits, history);
        self.draw(&dist)
    }

    /// The distribution `sample` draws from: after bias, penalties, the truncations and temperature.
    /// Greedy sampling gives all of the mass to the argmax.
    pub fn distribution(&self, logits: &[f32], history: &[u32]) -> Distribution {
        let p = &self.params;
        let mut logits = logits.to_vec();
        for &(id, bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        apply_penalties(&mut logits, history, p);
        if p.temperature <= 0.0 {
            return Distribution::certain(argmax(&logits));
        }
        let mut cands: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
        // Sort by logit, ties by id: a total order, so the result does not depend on the sort algorithm.
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < cands.len() {
            cands.select_nth_unstable_by(p.top_k - 1, by_logit);
            cands.truncate(p.top_k);
        }
        cands.sort_by(by_logit);
        let probs = softmax(&cands.iter().map(|c| c.1).collect::<Vec<_>>(), 1.0);
        let mut keep = cands.len();
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, &pr) in probs.iter().enumerate() {
                cum += pr;
                if cum >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            keep = keep.min(probs.iter().take_while(|&&pr| pr >= floor).count().max(1));
        }
        cands.truncate(keep.max(1));
        let probs = softmax(&cands.iter().map(|c| c.1).collect::<Vec<_>>(), p.temperature);
        Distribution {
            tokens: cands.iter().map(|c| c.0).collect(),
            probs,
            greedy: false,
        }
    }

    /// A draw from `dist`; a greedy choice takes no draw from the generator.
    pub fn draw(&mut self, dist: &Distribution) -> u32 {
        if dist.greedy {
            return dist.tokens[0];
        }
        let r = self.next_uniform();
        let mut cum = 0.0;
        for (&t, pr) in dist.tokens.iter().zip(&dist.probs) {
            cum += pr;
            if r < cum {
                return t;
            }
        }
        dist.tokens.last().copied().unwrap_or(0)
    }

    /// A uniform draw in [0, 1) from the sequence's generator (speculative acceptance draws here too,
    /// so a seed fixes its decisions).
    pub fn uniform(&mut self) -> f64 {
        self.next_uniform()
    }
}

/// The tokens a sampler may draw and their probabilities (summing to 1), most likely first.
#[derive(Clone, Debug, PartialEq)]
pub struct Distribution {
    pub tokens: Vec<u32>,
    pub probs: Vec<f64>,
    /// Temperature 0: all of the mass on the one token, chosen without a draw.
    pub greedy: bool,
}

impl Distribution {
    /// Greedy choice: all of the mass on one token.
    pub fn certain(token: u32) -> Self {
        Distribution {
            tokens: vec![token],
            probs: vec![1.0],
            greedy: true,
        }
    }

    /// The probability of `token` (0 when it cannot be drawn).
    pub fn prob(&self, token: u32) -> f64 {
        self.tokens
            .iter()
            .position(|&t| t == token)
            .map_or(0.0, |i| self.probs[i])
    }
}

pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

fn softmax(logits: &[f32], temperature: f32) -> Vec<f64> {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    let e: Vec<f64> = logits
        .iter()
        .map(|&l| ((l as f64 - max) / temperature as f64).exp())
        .collect();
    let sum: f64 = e.iter().sum();
    e.into_iter().map(|x| x / sum).collect()
}

fn apply_penalties(logits: &mut [f32], history: &[u32], p: &SamplingParams) {
    let off = p.repeat_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0;
    if off || p.penalty_last_n == 0 {
        return;
    }
    let window = &history[history.len().saturating_sub(p.penalty_last_n)..];
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in window {
        *counts.entry(t).or_default() += 1;
    }
    for (&t, &n) in &counts {
        let Some(l) = logits.get_mut(t as usize) else { continue };
        if *l > 0.0 {
            *l /= p.repeat_penalty;
        } else {
            *l *= p.repeat_penalty;
        }
        *l -= n as f32 * p.frequency_penalty + p.presence_penalty;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.5, -1.0, 0.0, 2.9]
    }

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&logits(), &[]), 1);
    }

    #[test]
    fn same_seed_same_draws() {
        let params = SamplingParams {
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 9,
            ..Default::default()
        };
        let draw = |params: &SamplingParams| {
            let mut s = Sampler::new(params.clone());
            (0..50).map(|_| s.sample(&logits(), &[])).collect::<Vec<_>>()
        };
        assert_eq!(draw(&params), draw(&params));
        assert_ne!(
            draw(&params),
            draw(&SamplingParams {
                seed: 10,
                ..params.clone()
            })
        );
        let distinct: std::collections::HashSet<_> = draw(&params).into_iter().collect();
        assert!(distinct.len() > 2, "temperature 1.5 spreads draws");
    }

    #[test]
    fn top_k_and_min_p_restrict_the_draw() {
        let p = SamplingParams {
            temperature: 5.0,
            top_k: 2,
            top_p: 1.0,
            min_p: 0.0,
            seed: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(p);
        for _ in 0..100 {
            assert!([1, 5].contains(&s.sample(&logits(), &[])));
        }
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            seed: 1,
            ..Default::default()
        };
        let mut s = Sampler::new(p);
        for _ in 0..100 {
            assert!(
                [1, 2, 5].contains(&s.sample(&logits(), &[])),
                "min-p 0.5 keeps tokens within ln 2 of the best"
            );
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set() {
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.01,
            min_p: 0.0,
            seed: 3,
            ..Default::default()
        };
        let mut s = Sampler::new(p);
        for _ in 0..20 {
            assert_eq!(s.sample(&logits(), &[]), 1);
        }
    }

    #[test]
    fn penalties_push_repeats_down() {
        let p = SamplingParams {
            repeat_penalty: 2.0,
            ..Default::default()
        };
        let mut s = Sampler::new(p);
        assert_eq!(s.sample(&logits(), &[1]), 5, "3.0 / 2 falls below 2.9");
        let p = SamplingParams {
            presence_penalty: 1.0,
            ..Default::default()
        };
        assert_eq!(Sampler::new(p).sample(&logits(), &[1, 5]), 2);
        let p = SamplingParams {
            frequency_penalty: 0.3,
            ..Default::default()
        };
        assert_eq!(Sampler::new(p).sample(&logits(), &[1, 1]), 5, "3.0 - 0.6 < 2.9");
    }

    #[test]
    fn logit_bias_moves_and_bans_tokens() {
        let biased = |bias: Vec<(u32, f32)>| SamplingParams {
            temperature: 0.0,
            logit_bias: bias,
            ..Default::default()
        };
        assert_eq!(Sampler::new(biased(vec![])).sample(&logits(), &[]), 1);
        assert_eq!(
            Sampler::new(biased(vec![(1, f32::NEG_INFINITY)])).sample(&logits(), &[]),
            5
        );
        assert_eq!(Sampler::new(biased(vec![(0, 10.0)])).sample(&logits(), &[]), 0);
        // An id past the logits changes nothing.
        assert_eq!(Sampler::new(biased(vec![(1_000_000, 50.0)])).sample(&logits(), &[]), 1);
        // Banned tokens are never drawn at any temperature.
        let p = SamplingParams {
            temperature: 5.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            logit_bias: vec![(1, f32::NEG_INFINITY), (5, f32::NEG_INFINITY)],
            ..Default::default()
        };
        let mut s = Sampler::new(p);
        for _ in 0..200 {
            let t = s.sample(&logits(), &[]);
            assert!(t != 1 && t != 5, "drew banned token {t}");
        }
    }
}
