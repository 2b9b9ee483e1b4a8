//! The model's tensors: matrices stay in the memory-mapped file (zero-copy), small vectors (norms) are
//! read into f32. Every tensor's presence, type and shape is checked at load, with errors naming it.

use tandem_gguf::{GgmlType, GgufFile, TensorInfo};

use crate::config::ModelConfig;
use crate::ModelError;

/// A weight matrix inside the file: `rows` rows of `cols` elements (ggml dims `[cols, rows]`).
#[derive(Clone, Debug)]
pub struct Matrix {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    offset: usize,
    len: usize,
}

impl Matrix {
    pub fn bytes<'f>(&self, file: &'f GgufFile) -> &'f [u8] {
        &file.bytes()[self.offset..self.offset + self.len]
    }

    pub fn row_bytes(&self) -> usize {
        self.len / self.rows.max(1)
    }

    /// Bytes of its quantized data in the file.
    pub fn bytes_len(&self) -> usize {
        self.len
    }
}

/// A norm's weight vector, read into f32, with the tensor name backends key their copies by.
#[derive(Clone, Debug)]
pub struct Norm {
    pub name: String,
    pub data: Vec<f32>,
}

impl std::ops::Deref for Norm {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.data
    }
}

/// `n_expert` matrices of one shape stored back to back in one 3-D tensor (ggml dims
/// `[cols, rows, n_expert]`): expert e is an ordinary matrix at `e × rows × row_bytes`.
#[derive(Clone, Debug)]
pub struct ExpertMatrices {
    pub name: String,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    /// One matrix a expert, named `<tensor>[e]`.
    pub experts: Vec<Matrix>,
}

impl ExpertMatrices {
    pub fn n_expert(&self) -> usize {
        self.experts.len()
    }

    /// Bytes of one expert's matrix.
    pub fn expert_bytes(&self) -> usize {
        self.experts.first().map_or(0, |m| m.len)
    }
}

/// A mixture-of-experts feed-forward block (`config::MoeConfig` says how it is combined).
pub struct ExpertFfn {
    /// `n_expert` rows: the router's logits for each expert.
    pub router: Matrix,
    pub gate: ExpertMatrices,
    pub up: ExpertMatrices,
    pub down: ExpertMatrices,
}

impl ExpertFfn {
    /// Bytes of one expert's three matrices.
    pub fn expert_bytes(&self) -> usize {
        self.gate.expert_bytes() + self.up.expert_bytes() + self.down.expert_bytes()
    }
}

/// A layer's feed-forward block: one gated MLP, or a routed mixture of them.
pub enum FeedForward {
    Dense { gate: Matrix, up: Matrix, down: Matrix },
    Experts(ExpertFfn),
}

pub struct LayerWeights {
    pub attn_norm: Norm,
    pub wq: Matrix,
    pub wk: Matrix,
    pub wv: Matrix,
    pub wo: Matrix,
    pub q_norm: Option<Norm>,
    pub k_norm: Option<Norm>,
    pub post_attn_norm: Option<Norm>,
    pub ffn_norm: Norm,
    pub ffn: FeedForward,
    pub post_ffn_norm: Option<Norm>,
}

impl LayerWeights {
    /// The attention block's projections of its pre-normed input, in the graph's order.
    pub fn qkv(&self) -> [&Matrix; 3] {
        [&self.wq, &self.wk, &self.wv]
    }

    /// The feed-forward block's products of its pre-normed input, in the graph's order: gate and
    /// up, or the router (whose choice decides which experts read it).
    pub fn ffn_inputs(&self) -> Vec<&Matrix> {
        match &self.ffn {
            FeedForward::Dense { gate, up, .. } => vec![gate, up],
            FeedForward::Experts(e) => vec![&e.router],
        }
    }

    /// Every matrix of the layer, each once: attention, then the feed-forward block (a mixture's
    /// router, then each expert's gate, up and down).
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut all = vec![&self.wq, &self.wk, &self.wv, &self.wo];
        match &self.ffn {
            FeedForward::Dense { gate, up, down } => all.extend([gate, up, down]),
            FeedForward::Experts(e) => {
                all.push(&e.router);
                for i in 0..e.gate.n_expert() {
                    all.extend([&e.gate.experts[i], &e.up.experts[i], &e.down.experts[i]]);
                }
            }
        }
        all
    }

    /// Bytes of weights one row reads in this layer: every matrix, or for a mixture the router and
    /// `used` experts.
    fn bytes_per_row(&self, used: usize) -> usize {
        let attn = [&self.wq, &self.wk, &self.wv, &self.wo]
            .iter()
            .map(|m| m.len)
            .sum::<usize>();
        attn + match &self.ffn {
            FeedForward::Dense { gate, up, down } => gate.len + up.len + down.len,
            FeedForward::Experts(e) => e.router.len + used * e.expert_bytes(),
        }
    }
}

pub struct Weights {
    pub token_embd: Matrix,
    /// The output projection; the token embedding itself when the model ties them.
    pub output: Matrix,
    pub output_norm: Norm,
    pub layers: Vec<LayerWeights>,
}

fn info<'f>(file: &'f GgufFile, name: &str) -> Result<&'f TensorInfo, ModelError> {
    file.tensor_info(name).ok_or_else(|| ModelError::Tensor {
        name: name.into(),
        reason: "missing".into(),
    })
}

fn matrix(file: &GgufFile, name: &str, cols: usize, rows: usize) -> Result<Matrix, ModelError> {
    let t = info(file, name)?;
    if t.dims != [cols as u64, rows as u64] {
        return Err(ModelError::Tensor {
            name: name.into(),
            reason: format!("shape {:?}, expected [{cols}, {rows}]", t.dims),
        });
    }
    if tandem_backend::WeightClass::of(t.ty).is_none() {
        return Err(ModelError::Tensor {
            name: name.into(),
            reason: format!("type {} has no CPU kernel", t.ty),
        });
    }
    Ok(Matrix {
        name: name.into(),
        ty: t.ty,
        rows,
        cols,
        offset: (file.data_offset + t.offset) as usize,
        len: t.size as usize,
    })
}

/// A 3-D expert tensor of `n_expert` matrices of `rows × cols`.
fn experts(
    file: &GgufFile,
    name: &str,
    cols: usize,
    rows: usize,
    n_expert: usize,
) -> Result<ExpertMatrices, ModelError> {
    let t = info(file, name)?;
    if t.dims != [cols as u64, rows as u64, n_expert as u64] {
        return Err(ModelError::Tensor {
            name: name.into(),
            reason: format!("shape {:?}, expected [{cols}, {rows}, {n_expert}]", t.dims),
        });
    }
    if tandem_backend::WeightClass::of(t.ty).is_none() {
        return Err(ModelError::Tensor {
            name: name.into(),
            reason: format!("type {} has no CPU kernel", t.ty),
        });
    }
    let len = t.size as usize / n_expert.max(1);
    if len * n_expert != t.size as usize {
        return Err(ModelError::Tensor {
            name: name.into(),
            reason: format!("{} bytes do not split into {n_expert} experts", t.size),
        });
    }
    let base = (file.data_offset + t.offset) as usize;
    Ok(ExpertMatrices {
        name: name.into(),
        ty: t.ty,
        rows,
        cols,
        experts: (0..n_expert)
            .map(|e| Matrix {
                name: format!("{name}[{e}]"),
                ty: t.ty,
                rows,
                cols,
                offset: base + e * len,
                len,
            })
            .collect(),
    })
}

fn vector(file: &GgufFile, name: &str, len: usize) -> Result<Norm, ModelError> {
    let t = info(file, name)?;
    if t.dims != [len as u64] {
        return Err(ModelError::Tensor {
            name: name.into(),
            reason: format!("shape {:?}, expected [{len}]", t.dims),
        });
    }
    let data = tandem_quant::dequantize(t.ty, file.tensor_data(t)).map_err(|e| ModelError::Tensor {
        name: name.into(),
        reason: e.to_string(),
    })?;
    Ok(Norm {
        name: name.into(),
        data,
    })
}

fn optional_vector(file: &GgufFile, name: &str, len: usize, wanted: bool) -> Result<Option<Norm>, ModelError> {
    if wanted {
        vector(file, name, len).map(Some)
    } else {
        Ok(None)
    }
}

impl Weights {
    pub fn load(file: &GgufFile, c: &ModelConfig) -> Result<Self, ModelError> {
        let d = c.d_model;
        let token_embd = matrix(file, "token_embd.weight", d, c.n_vocab)?;
        let output = match file.tensor_info("output.weight") {
            Some(_) => matrix(file, "output.weight", d, c.n_vocab)?,
            None => token_embd.clone(),
        };
        let output_norm = vector(file, "output_norm.weight", d)?;
        let mut layers = Vec::with_capacity(c.n_layer());
        for i in 0..c.n_layer() {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            layers.push(LayerWeights {
                attn_norm: vector(file, &n("attn_norm"), d)?,
                wq: matrix(file, &n("attn_q"), d, c.q_width())?,
                wk: matrix(file, &n("attn_k"), d, c.kv_width())?,
                wv: matrix(file, &n("attn_v"), d, c.kv_width())?,
                wo: matrix(file, &n("attn_output"), c.q_width(), d)?,
                q_norm: optional_vector(file, &n("attn_q_norm"), c.head_dim, c.qk_norm)?,
                k_norm: optional_vector(file, &n("attn_k_norm"), c.head_dim, c.qk_norm)?,
                post_attn_norm: optional_vector(file, &n("post_attention_norm"), d, c.post_norms)?,
                ffn_norm: vector(file, &n("ffn_norm"), d)?,
                ffn: match c.moe {
                    None => FeedForward::Dense {
                        gate: matrix(file, &n("ffn_gate"), d, c.d_ff)?,
                        up: matrix(file, &n("ffn_up"), d, c.d_ff)?,
                        down: matrix(file, &n("ffn_down"), c.d_ff, d)?,
                    },
                    Some(m) => FeedForward::Experts(ExpertFfn {
                        router: matrix(file, &n("ffn_gate_inp"), d, m.n_expert)?,
                        gate: experts(file, &n("ffn_gate_exps"), d, m.d_ff_expert, m.n_expert)?,
                        up: experts(file, &n("ffn_up_exps"), d, m.d_ff_expert, m.n_expert)?,
                        down: experts(file, &n("ffn_down_exps"), m.d_ff_expert, d, m.n_expert)?,
                    }),
                },
                post_ffn_norm: optional_vector(file, &n("post_ffw_norm"), d, c.post_norms)?,
            });
        }
        Ok(Weights {
            token_embd,
            output,
            output_norm,
            layers,
        })
    }

    /// Every weight matrix, each once (a tied output is the embedding table).
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut all = vec![&self.token_embd];
        if self.output.name != self.token_embd.name {
            all.push(&self.output);
        }
        for l in &self.layers {
            all.extend(l.matrices());
        }
        all
    }

    /// Matrices that multiply the same input, in the order the graph applies them (per layer: q, k
    /// and v; gate and up): a backend may run each group as one launch.
    pub fn input_groups(&self) -> Vec<Vec<&Matrix>> {
        let mut all = Vec::with_capacity(2 * self.layers.len());
        for l in &self.layers {
            all.push(l.qkv().to_vec());
            all.push(l.ffn_inputs());
        }
        all
    }

    /// Every norm vector.
    pub fn norms(&self) -> Vec<&Norm> {
        let mut all = vec![&self.output_norm];
        for l in &self.layers {
            all.extend([&l.attn_norm, &l.ffn_norm]);
            all.extend(
                [&l.q_norm, &l.k_norm, &l.post_attn_norm, &l.post_ffn_norm]
                    .into_iter()
                    .flatten(),
            );
        }
        all
    }

    /// Bytes of weights one decode step streams: every layer matrix (of a mixture, the router and
    /// the `experts_used` experts a row routes to) and the output projection.
    pub fn decode_bytes(&self, experts_used: usize) -> usize {
        let layer: usize = self.layers.iter().map(|l| l.bytes_per_row(experts_used)).sum();
        layer + self.output.len
    }
}
