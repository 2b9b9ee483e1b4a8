//! Request parameters shared by the routes: sampling settings, `max_tokens`, stop strings, prompt ids.

use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use tandem_engine::spec::{SpecMode, SpecSettings, MAX_DRAFT};
use tandem_engine::SamplingParams;

use crate::config::ServerConfig;
use crate::errors::ApiError;
use crate::AppState;

/// Sampling fields as both APIs spell them (all optional).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct SamplingFields {
    pub temperature: Option<f32>,
    pub top_k: Option<i64>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub repeat_penalty: Option<f32>,
    /// llama.cpp's window for the penalties; -1: the whole context, 0: off.
    pub repeat_last_n: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Absent or negative: a fresh random seed.
    pub seed: Option<i64>,
    pub logit_bias: Option<LogitBias>,
}

/// `logit_bias` as either API writes it.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum LogitBias {
    /// OpenAI: `{"token id": bias}` (llama.cpp takes this too, `false` included).
    Map(BTreeMap<String, BiasValue>),
    /// llama.cpp: `[[id, bias], …]`, `false` for a bias that bans the token.
    Pairs(Vec<(i64, BiasValue)>),
}

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(untagged)]
pub enum BiasValue {
    Bias(f32),
    /// Only `false` (ban) means something; `true` is refused.
    Flag(bool),
}

/// OpenAI's bounds on a bias; beyond them a token is as good as forced or banned anyway.
const MAX_LOGIT_BIAS: f32 = 100.0;

impl LogitBias {
    /// Checks ids against the vocabulary (`n_vocab` 0: unknown, not checked) and biases against the bounds.
    fn resolve(&self, n_vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
        const P: &str = "logit_bias";
        let pairs: Vec<(i64, BiasValue)> = match self {
            LogitBias::Map(m) => m
                .iter()
                .map(|(k, &v)| {
                    k.trim()
                        .parse::<i64>()
                        .map(|id| (id, v))
                        .map_err(|_| ApiError::invalid(P, format!("logit_bias key {k:?} is not a token id")))
                })
                .collect::<Result<_, _>>()?,
            LogitBias::Pairs(v) => v.clone(),
        };
        let mut out = Vec::with_capacity(pairs.len());
        for (id, value) in pairs {
            let in_vocab = u32::try_from(id)
                .ok()
                .filter(|&t| n_vocab == 0 || (t as usize) < n_vocab);
            let Some(token) = in_vocab else {
                return Err(ApiError::invalid(
                    P,
                    format!("logit_bias token id {id} is out of range: the vocabulary has {n_vocab} tokens"),
                ));
            };
            let bias = match value {
                BiasValue::Flag(false) => f32::NEG_INFINITY,
                BiasValue::Flag(true) => {
                    return Err(ApiError::invalid(
                        P,
                        format!("logit_bias for token {id}: only `false` (ban the token) or a number is allowed"),
                    ))
                }
                BiasValue::Bias(b) if b.is_finite() && (-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(&b) => b,
                BiasValue::Bias(b) => {
                    return Err(ApiError::invalid(
                        P,
                        format!("logit_bias for token {id} must be in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}], got {b}"),
                    ))
                }
            };
            out.push((token, bias));
        }
        Ok(out)
    }
}

/// `stop`: one string or a list.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

const MAX_STOP_STRINGS: usize = 16;
const MAX_TOP_LOGPROBS: usize = 20;

pub fn stop_strings(stop: Option<StopField>) -> Result<Vec<String>, ApiError> {
    let stops = match stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s],
        Some(StopField::Many(v)) => v,
    };
    if stops.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "at most {MAX_STOP_STRINGS} stop strings are allowed, got {}",
                stops.len()
            ),
        ));
    }
    Ok(stops)
}

/// Defaults of the OpenAI routes: plain sampling at temperature 1 (as OpenAI and vLLM).
pub fn openai_defaults() -> SamplingParams {
    SamplingParams {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplingParams::default()
    }
}

/// Defaults of `/completion`: llama.cpp server's.
pub fn llamacpp_defaults() -> SamplingParams {
    SamplingParams {
        temperature: 0.8,
        ..SamplingParams::default()
    }
}

fn finite(name: &str, v: f32) -> Result<f32, ApiError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(ApiError::invalid(name, format!("{name} must be a finite number")))
    }
}

/// A value in `[lo, hi]`.
fn in_range(name: &str, v: f32, lo: f32, hi: f32) -> Result<f32, ApiError> {
    if finite(name, v)? < lo || v > hi {
        return Err(ApiError::invalid(
            name,
            format!("{name} must be in [{lo}, {hi}], got {v}"),
        ));
    }
    Ok(v)
}

/// A value of `lo` or more (a range open above says only its one rule).
fn at_least(name: &str, v: f32, lo: f32) -> Result<f32, ApiError> {
    if finite(name, v)? < lo {
        return Err(ApiError::invalid(name, format!("{name} must be >= {lo}, got {v}")));
    }
    Ok(v)
}

impl SamplingFields {
    /// Checks the fields and fills the rest from `defaults`; `n_ctx()` stands in for `repeat_last_n = -1`;
    /// `logit_bias` ids must be below `n_vocab`.
    pub fn resolve(
        &self,
        defaults: SamplingParams,
        n_ctx: impl FnOnce() -> usize,
        n_vocab: usize,
    ) -> Result<SamplingParams, ApiError> {
        let mut p = defaults;
        if let Some(t) = self.temperature {
            p.temperature = at_least("temperature", t, 0.0)?;
        }
        if let Some(k) = self.top_k {
            // vLLM's -1 and llama.cpp's 0 both mean off.
            p.top_k = usize::try_from(k).unwrap_or(0);
        }
        if let Some(v) = self.top_p {
            p.top_p = in_range("top_p", v, 0.0, 1.0)?;
        }
        if let Some(v) = self.min_p {
            p.min_p = in_range("min_p", v, 0.0, 1.0)?;
        }
        if let Some(v) = self.repeat_penalty {
            if finite("repeat_penalty", v)? <= 0.0 {
                return Err(ApiError::invalid(
                    "repeat_penalty",
                    format!("repeat_penalty must be > 0, got {v}"),
                ));
            }
            p.repeat_penalty = v;
        }
        if let Some(v) = self.presence_penalty {
            p.presence_penalty = finite("presence_penalty", v)?;
        }
        if let Some(v) = self.frequency_penalty {
            p.frequency_penalty = finite("frequency_penalty", v)?;
        }
        match self.repeat_last_n {
            None => {}
            Some(-1) => p.penalty_last_n = n_ctx(),
            Some(n) => {
                p.penalty_last_n = usize::try_from(n)
                    .map_err(|_| ApiError::invalid("repeat_last_n", format!("repeat_last_n must be >= -1, got {n}")))?
            }
        }
        if let Some(bias) = &self.logit_bias {
            p.logit_bias = bias.resolve(n_vocab)?;
        }
        p.seed = match self.seed {
            Some(s) if s >= 0 => s as u64,
            _ => random_u64(),
        };
        Ok(p)
    }
}

/// `max_tokens` as asked (`param` names the field), else the default; 400 when 0 or over the limit.
pub fn max_tokens(config: &ServerConfig, requested: Option<u64>, param: &str) -> Result<usize, ApiError> {
    let limit = config.max_tokens_limit;
    match requested {
        None => Ok(config.default_max_tokens.min(limit).max(1)),
        Some(0) => Err(ApiError::invalid(param, format!("{param} must be at least 1"))),
        Some(n) if n > limit as u64 => Err(ApiError::invalid(
            param,
            format!("{param} {n} is over the limit of {limit}"),
        )),
        Some(n) => Ok(n as usize),
    }
}

/// `top_logprobs` checked against the limit OpenAI sets (20).
pub fn top_logprobs(n: usize, param: &str) -> Result<usize, ApiError> {
    if n > MAX_TOP_LOGPROBS {
        return Err(ApiError::invalid(
            param,
            format!("{param} must be at most {MAX_TOP_LOGPROBS}, got {n}"),
        ));
    }
    Ok(n)
}

/// `n` (choices per request): only 1 is served.
pub fn check_n(n: Option<u64>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) => Err(ApiError::invalid("n", format!("only n = 1 is supported, got {n}"))),
    }
}

/// `model` must be absent (or empty) or the served model.
pub fn check_model(state: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        None | Some("") => Ok(()),
        Some(m) if m == state.config.model_name => Ok(()),
        Some(m) => Err(ApiError::model_not_found(m)),
    }
}

/// Token ids must be in the vocabulary.
pub fn check_ids(state: &AppState, ids: &[u32], param: &str) -> Result<(), ApiError> {
    let n_vocab = state.tokenizer.n_vocab();
    match ids.iter().find(|&&id| n_vocab > 0 && id as usize >= n_vocab) {
        Some(id) => Err(ApiError::invalid(
            param,
            format!("token id {id} is out of range: the vocabulary has {n_vocab} tokens"),
        )),
        None => Ok(()),
    }
}

/// Texts longer than this are encoded on the blocking pool, not on a runtime worker.
const INLINE_ENCODE_BYTES: usize = 16 << 10;

/// Text to ids (`add_bos`: the model's BOS as it asks; `parse_special`: special-token texts become those
/// tokens, what llama.cpp and vLLM do for prompts).
pub async fn encode(
    state: &AppState,
    text: String,
    add_bos: bool,
    parse_special: bool,
    param: &str,
) -> Result<Vec<u32>, ApiError> {
    let tok = state.tokenizer.clone();
    let long = text.len() > INLINE_ENCODE_BYTES;
    let run = move || tok.try_encode(&text, add_bos, parse_special);
    let result = if long {
        tokio::task::spawn_blocking(run)
            .await
            .map_err(|_| ApiError::internal("the tokenizer failed"))?
    } else {
        run()
    };
    result.map_err(|e| ApiError::invalid(param, format!("this model cannot encode text: {e}")))
}

pub fn unix_time() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A random number for seeds and ids (std's randomly keyed hasher; no cryptographic claim).
pub fn random_u64() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.finish()
}

/// A response id such as `chatcmpl-3f2a…`.
pub fn response_id(prefix: &str) -> String {
    format!("{prefix}-{:016x}{:08x}", random_u64(), random_u64() as u32)
}

/// A request's `speculative` object (both routes): `{"mode": "off" | "lookup" | "draft", "n_max": K,
/// "adaptive": bool}`, each field optional (`draft` needs a server started with `--draft-model`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeField {
    pub mode: Option<String>,
    pub n_max: Option<i64>,
    pub adaptive: Option<bool>,
}

/// The request's speculative settings, filled in from the server's (`None`: the request did not ask,
/// and the server's apply). `flat_n_max` is llama.cpp's `speculative.n_max`. A mode left out is the
/// server's when it speculates, else `lookup`; `n_max` 0 turns speculation off.
pub fn speculative(
    field: Option<SpeculativeField>,
    flat_n_max: Option<i64>,
    server: SpecSettings,
) -> Result<Option<SpecSettings>, ApiError> {
    if field.is_none() && flat_n_max.is_none() {
        return Ok(None);
    }
    let field = field.unwrap_or_default();
    let mode = match field.mode.as_deref() {
        Some(m) => m
            .parse::<SpecMode>()
            .map_err(|e| ApiError::invalid("speculative.mode", e))?,
        None if server.mode != SpecMode::Off => server.mode,
        None => SpecMode::Lookup,
    };
    let n_max = match field.n_max.or(flat_n_max) {
        None => server.draft_max,
        Some(n) if (0..=MAX_DRAFT as i64).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(
                "speculative.n_max",
                format!("speculative.n_max {n} is outside 0..={MAX_DRAFT}"),
            ))
        }
    };
    let settings = SpecSettings {
        mode: if n_max == 0 { SpecMode::Off } else { mode },
        draft_max: n_max.max(1),
        adaptive: field.adaptive.unwrap_or(server.adaptive),
    };
    Ok(Some(settings))
}
