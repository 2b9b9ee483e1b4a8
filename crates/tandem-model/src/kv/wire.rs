//! The KV wire format: a sequence's cache, layer by layer and row range by row range, as a prefill node
//! streams it to a decode node (`docs/KV-WIRE.md` is the reference; this is its one implementation).
//!
//! A stream is the magic `TANDEMKV`, then frames: one `Hello` (version, model fingerprint, shape, the
//! positions `from..to` the stream fills on top of the receiver's `0..from`), `Rows` frames as the prefill produces them, and one `End` (or
//! an `Error` from the sender). Every frame carries the SHA-256 of its kind, length and body; `End`
//! carries how many `Rows` frames came and the SHA-256 over their digests in order, so a frame lost,
//! repeated or reordered is caught as surely as a flipped byte.
//!
//! Rows travel in logical order with the sender's placement after them (`RingPlacement`). A
//! sliding-window layer ships only the rows its ring keeps at `to`; the receiver appends them as a
//! local prefill would, skipping the rows a full ring would have overwritten, so its ring has the same
//! physical placement (for the same capacity) and attention reads the same bits. Placement is never
//! derived from absolute positions.

use half::f16;
use sha2::{Digest, Sha256};

use super::placement::RingPlacement;
use crate::config::ModelConfig;
use crate::ModelError;

/// The first bytes of every stream.
pub const MAGIC: [u8; 8] = *b"TANDEMKV";
/// The format version a `Hello` carries; a receiver refuses any other.
/// Version 2 added `from` (a continued conversation ships only its new rows); version 1 is refused.
pub const VERSION: u32 = 2;
/// Rows one `Rows` frame may carry (senders split longer ranges); bounds what a receiver buffers.
pub const MAX_FRAME_ROWS: usize = 4096;
/// Largest body of a `Hello`, `End` or `Error` frame.
const MAX_SMALL_BODY: usize = 64 << 10;

const KIND_HELLO: u8 = 1;
const KIND_ROWS: u8 = 2;
const KIND_END: u8 = 3;
const KIND_ERROR: u8 = 4;
/// kind (1) + body length (4).
const FRAME_HEAD: usize = 5;
const DIGEST: usize = 32;
/// layer u32, first u64, rows u32, then the placement: capacity, len, origin_logical, origin_physical (u64).
const ROWS_HEAD: usize = 4 + 8 + 4 + 4 * 8;
const HELLO_BODY: usize = 4 + 32 + 4 + 4 + 8 + 8;
const END_BODY: usize = 8 + 32;

/// Identifies a model for KV exchange: SHA-256 over the tag `tandem kv fingerprint v2`, the
/// configuration the engine derived from the GGUF file (architecture, shapes, each layer's window and
/// RoPE settings), the KV dtype (f16) and `file_digest`, the tree hash of the file's bytes (weights,
/// tokenizer and metadata: `file_digest::tree_hash`). Two nodes exchange KV only when theirs are equal.
pub fn fingerprint(config: &ModelConfig, file_digest: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"tandem kv fingerprint v2\n");
    h.update(format!("{config:?}\nkv f16\n").as_bytes());
    h.update(file_digest);
    h.finalize().into()
}

/// The encoded length of a `Rows` frame of `n` rows of `width` values (`Encoder::rows`): what a sender
/// counts against its send buffer before the frame is encoded.
pub fn rows_frame_len(n: usize, width: usize) -> usize {
    FRAME_HEAD + ROWS_HEAD + 4 * n * width + DIGEST
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Rows `first..first + n` of one layer, f16 K and V (`n × width` each, row-major), with the
/// sender's placement of that layer when it sent them (it holds them).
#[derive(Clone, Debug, PartialEq)]
pub struct LayerRows {
    pub layer: usize,
    pub first: usize,
    pub placement: RingPlacement,
    pub k: Vec<f16>,
    pub v: Vec<f16>,
}

impl LayerRows {
    pub fn n_rows(&self, width: usize) -> usize {
        self.k.len() / width.max(1)
    }

    /// Pieces of at most `MAX_FRAME_ROWS` rows (each with the same placement).
    pub fn split(self, width: usize) -> Vec<LayerRows> {
        let n = self.n_rows(width);
        if n <= MAX_FRAME_ROWS {
            return vec![self];
        }
        (0..n)
            .step_by(MAX_FRAME_ROWS)
            .map(|at| {
                let m = MAX_FRAME_ROWS.min(n - at);
                LayerRows {
                    layer: self.layer,
                    first: self.first + at,
                    placement: self.placement,
                    k: self.k[at * width..(at + m) * width].to_vec(),
                    v: self.v[at * width..(at + m) * width].to_vec(),
                }
            })
            .collect()
    }
}

/// What a stream is about, sent first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub version: u32,
    pub fingerprint: [u8; 32],
    pub n_layers: usize,
    /// Values per row (KV heads × head dim).
    pub width: usize,
    /// The stream fills positions `from..to`; the receiver holds `0..from` already.
    pub from: usize,
    pub to: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    Hello(Hello),
    Rows(LayerRows),
    /// Every `Rows` frame came and checked out.
    End,
    /// The sender gave up (its message).
    Error(String),
}

/// Why a stream was refused. `cause` names the class for counters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("not a KV stream (bad magic)")]
    Magic,
    #[error("KV wire version {got}, this node speaks {VERSION}")]
    Version { got: u32 },
    #[error("model mismatch: the peer's fingerprint is {theirs}, ours {ours}")]
    Identity { ours: String, theirs: String },
    #[error("frame {index}: checksum mismatch")]
    Checksum { index: u64 },
    #[error("frame {index}: {what}")]
    Malformed { index: u64, what: String },
    #[error("the stream ended after {frames} frames, before its end frame")]
    Truncated { frames: u64 },
    #[error("the peer failed: {0}")]
    Peer(String),
}

impl WireError {
    /// The fallback cause this counts as: `identity`, `checksum`, `protocol`, `dropped` or `refused`.
    pub fn cause(&self) -> &'static str {
        match self {
            WireError::Identity { .. } => "identity",
            WireError::Checksum { .. } => "checksum",
            WireError::Magic | WireError::Version { .. } | WireError::Malformed { .. } => "protocol",
            WireError::Truncated { .. } => "dropped",
            WireError::Peer(_) => "refused",
        }
    }
}

fn frame(kind: u8, body: &[u8]) -> (Vec<u8>, [u8; 32]) {
    let mut out = Vec::with_capacity(FRAME_HEAD + body.len() + DIGEST);
    out.push(kind);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    let digest: [u8; 32] = Sha256::digest(&out).into();
    out.extend_from_slice(&digest);
    (out, digest)
}

/// Writes a stream: `hello` once, `rows` for each range, then `end` (or `error`).
pub struct Encoder {
    width: usize,
    chain: Sha256,
    rows_frames: u64,
}

impl Encoder {
    /// The magic and the `Hello` frame.
    pub fn start(hello: &Hello) -> (Encoder, Vec<u8>) {
        let mut body = Vec::with_capacity(HELLO_BODY);
        body.extend_from_slice(&hello.version.to_le_bytes());
        body.extend_from_slice(&hello.fingerprint);
        body.extend_from_slice(&(hello.n_layers as u32).to_le_bytes());
        body.extend_from_slice(&(hello.width as u32).to_le_bytes());
        body.extend_from_slice(&(hello.from as u64).to_le_bytes());
        body.extend_from_slice(&(hello.to as u64).to_le_bytes());
        let mut out = MAGIC.to_vec();
        out.extend(frame(KIND_HELLO, &body).0);
        let enc = Encoder {
            width: hello.width,
            chain: Sha256::new(),
            rows_frames: 0,
        };
        (enc, out)
    }

    /// One `Rows` frame (`rows` has at most `MAX_FRAME_ROWS` rows: see `LayerRows::split`).
    pub fn rows(&mut self, rows: &LayerRows) -> Vec<u8> {
        let n = rows.n_rows(self.width);
        let mut body = Vec::with_capacity(ROWS_HEAD + 4 * rows.k.len());
        body.extend_from_slice(&(rows.layer as u32).to_le_bytes());
        body.extend_from_slice(&(rows.first as u64).to_le_bytes());
        body.extend_from_slice(&(n as u32).to_le_bytes());
        let p = &rows.placement;
        for x in [p.capacity, p.len, p.origin_logical, p.origin_physical] {
            body.extend_from_slice(&(x as u64).to_le_bytes());
        }
        for plane in [&rows.k, &rows.v] {
            for x in plane.iter() {
                body.extend_from_slice(&x.to_bits().to_le_bytes());
            }
        }
        let (out, digest) = frame(KIND_ROWS, &body);
        self.chain.update(digest);
        self.rows_frames += 1;
        out
    }

    /// The `End` frame: how many `Rows` frames were sent and the SHA-256 over their digests.
    pub fn end(self) -> Vec<u8> {
        let mut body = Vec::with_capacity(END_BODY);
        body.extend_from_slice(&self.rows_frames.to_le_bytes());
        body.extend_from_slice(&self.chain.finalize());
        frame(KIND_END, &body).0
    }

    /// An `Error` frame: the sender gives up.
    pub fn error(message: &str) -> Vec<u8> {
        let mut m = message.as_bytes();
        m = &m[..m.len().min(MAX_SMALL_BODY)];
        frame(KIND_ERROR, m).0
    }
}

/// Reads a stream from byte pieces as they arrive, checking every frame.
pub struct Decoder {
    expect: [u8; 32],
    buf: Vec<u8>,
    /// Bytes of `buf` already consumed.
    at: usize,
    magic_seen: bool,
    hello: Option<Hello>,
    chain: Sha256,
    rows_frames: u64,
    frames: u64,
    ended: bool,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

impl Decoder {
    /// A decoder that accepts only streams of the model with fingerprint `expect`.
    pub fn new(expect: [u8; 32]) -> Self {
        Decoder {
            expect,
            buf: Vec::new(),
            at: 0,
            magic_seen: false,
            hello: None,
            chain: Sha256::new(),
            rows_frames: 0,
            frames: 0,
            ended: false,
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        if self.at > 0 && self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    pub fn hello(&self) -> Option<&Hello> {
        self.hello.as_ref()
    }

    fn malformed(&self, what: impl Into<String>) -> WireError {
        WireError::Malformed {
            index: self.frames,
            what: what.into(),
        }
    }

    /// The next whole frame, checked; `None` until more bytes arrive.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, WireError> {
        if !self.magic_seen {
            if self.buf.len() - self.at < MAGIC.len() {
                return Ok(None);
            }
            if self.buf[self.at..self.at + MAGIC.len()] != MAGIC {
                return Err(WireError::Magic);
            }
            self.at += MAGIC.len();
            self.magic_seen = true;
        }
        let avail = &self.buf[self.at..];
        if avail.len() < FRAME_HEAD {
            return Ok(None);
        }
        if self.ended {
            return Err(self.malformed("bytes after the end frame"));
        }
        let kind = avail[0];
        let len = u32_at(avail, 1) as usize;
        let max = match (kind, &self.hello) {
            (KIND_ROWS, Some(h)) => ROWS_HEAD + 4 * MAX_FRAME_ROWS * h.width,
            (KIND_HELLO | KIND_END | KIND_ERROR, _) => MAX_SMALL_BODY,
            (KIND_ROWS, None) => return Err(self.malformed("rows before the hello frame")),
            _ => return Err(self.malformed(format!("unknown frame kind {kind}"))),
        };
        if len > max {
            return Err(self.malformed(format!("a body of {len} bytes, over the limit of {max}")));
        }
        if avail.len() < FRAME_HEAD + len + DIGEST {
            return Ok(None);
        }
        let whole = &avail[..FRAME_HEAD + len];
        let digest: [u8; 32] = Sha256::digest(whole).into();
        if digest[..] != avail[FRAME_HEAD + len..FRAME_HEAD + len + DIGEST] {
            return Err(WireError::Checksum { index: self.frames });
        }
        let body = avail[FRAME_HEAD..FRAME_HEAD + len].to_vec();
        self.at += FRAME_HEAD + len + DIGEST;
        let parsed = self.parse(kind, &body, digest)?;
        self.frames += 1;
        Ok(Some(parsed))
    }

    fn parse(&mut self, kind: u8, body: &[u8], digest: [u8; 32]) -> Result<Frame, WireError> {
        match kind {
            KIND_HELLO => {
                if self.hello.is_some() {
                    return Err(self.malformed("a second hello frame"));
                }
                if body.len() != HELLO_BODY {
                    return Err(self.malformed(format!("a hello of {} bytes", body.len())));
                }
                let version = u32_at(body, 0);
                if version != VERSION {
                    return Err(WireError::Version { got: version });
                }
                let fingerprint: [u8; 32] = body[4..36].try_into().expect("32 bytes");
                if fingerprint != self.expect {
                    return Err(WireError::Identity {
                        ours: hex(&self.expect),
                        theirs: hex(&fingerprint),
                    });
                }
                let hello = Hello {
                    version,
                    fingerprint,
                    n_layers: u32_at(body, 36) as usize,
                    width: u32_at(body, 40) as usize,
                    from: u64_at(body, 44) as usize,
                    to: u64_at(body, 52) as usize,
                };
                if hello.from > hello.to {
                    return Err(self.malformed(format!("a stream from {} to {}", hello.from, hello.to)));
                }
                self.hello = Some(hello.clone());
                Ok(Frame::Hello(hello))
            }
            KIND_ROWS => {
                let h = self.hello.clone().expect("checked when the length was read");
                if body.len() < ROWS_HEAD {
                    return Err(self.malformed("a rows frame shorter than its header"));
                }
                let layer = u32_at(body, 0) as usize;
                let first = u64_at(body, 4) as usize;
                let n = u32_at(body, 12) as usize;
                let p = |i: usize| u64_at(body, 16 + 8 * i) as usize;
                let placement = RingPlacement {
                    capacity: p(0),
                    len: p(1),
                    origin_logical: p(2),
                    origin_physical: p(3),
                };
                if layer >= h.n_layers {
                    return Err(self.malformed(format!("layer {layer} of {}", h.n_layers)));
                }
                if n == 0 || n > MAX_FRAME_ROWS || first < h.from || first.checked_add(n).is_none_or(|e| e > h.to) {
                    return Err(self.malformed(format!("rows {first}+{n} outside {}..{}", h.from, h.to)));
                }
                if body.len() != ROWS_HEAD + 4 * n * h.width {
                    return Err(self.malformed(format!("{} bytes for {n} rows of {}", body.len(), h.width)));
                }
                let plane = |at: usize| -> Vec<f16> {
                    body[at..at + 2 * n * h.width]
                        .chunks_exact(2)
                        .map(|b| f16::from_bits(u16::from_le_bytes([b[0], b[1]])))
                        .collect()
                };
                let k = plane(ROWS_HEAD);
                let v = plane(ROWS_HEAD + 2 * n * h.width);
                self.chain.update(digest);
                self.rows_frames += 1;
                Ok(Frame::Rows(LayerRows {
                    layer,
                    first,
                    placement,
                    k,
                    v,
                }))
            }
            KIND_END => {
                if self.hello.is_none() {
                    return Err(self.malformed("an end frame before the hello frame"));
                }
                if body.len() != END_BODY {
                    return Err(self.malformed(format!("an end frame of {} bytes", body.len())));
                }
                let count = u64_at(body, 0);
                let chain: [u8; 32] = std::mem::take(&mut self.chain).finalize().into();
                if count != self.rows_frames || chain[..] != body[8..] {
                    return Err(self.malformed(format!(
                        "the end frame counts {count} rows frames and their digests, {} arrived (or others)",
                        self.rows_frames
                    )));
                }
                self.ended = true;
                Ok(Frame::End)
            }
            KIND_ERROR => Err(WireError::Peer(String::from_utf8_lossy(body).into_owned())),
            _ => unreachable!("unknown kinds are refused when the length is read"),
        }
    }

    /// Whether the `End` frame came; a stream closed before it was cut short.
    pub fn finish(&self) -> Result<(), WireError> {
        if self.ended && self.at == self.buf.len() {
            Ok(())
        } else if self.ended {
            Err(self.malformed("bytes after the end frame"))
        } else {
            Err(WireError::Truncated { frames: self.frames })
        }
    }
}

/// Checks rows before they are installed into a layer now at `placement` (of a detached cache that a
/// stream fills to `to`). Returns the placement to start from when the rows start past the layer's end:
/// allowed only for a sliding-window layer, whose ring a local prefill would have moved on over the rows
/// in between (a stream ships only what the ring keeps at `to`). The ring then holds rows from
/// `rows.first` on, at the physical row a local prefill would have written it: the skipped rows take
/// their places as if appended. Where they would not all have been evicted by `to`, the ring holds fewer
/// old rows than a local one (never a row that did not arrive); `check_complete` makes sure it still
/// holds every row a query at `to` sees.
pub fn check_install(
    placement: &RingPlacement,
    window: Option<usize>,
    rows: &LayerRows,
    width: usize,
    to: usize,
) -> Result<Option<RingPlacement>, ModelError> {
    let bad = |what: String| Err(ModelError::Kv(format!("layer {}: {what}", rows.layer)));
    if width == 0 || rows.k.len() != rows.v.len() || rows.k.is_empty() || !rows.k.len().is_multiple_of(width) {
        return bad(format!(
            "{} K and {} V values for rows of {width}",
            rows.k.len(),
            rows.v.len()
        ));
    }
    let n = rows.n_rows(width);
    let last = rows.first + n;
    if last > to {
        return bad(format!("rows {}..{last} past the stream's end {to}", rows.first));
    }
    let sent = &rows.placement;
    if sent.len > sent.capacity || sent.end() < last || sent.origin_logical > rows.first {
        return bad(format!(
            "the sender's placement {sent:?} does not hold rows {}..{last}",
            rows.first
        ));
    }
    let end = placement.end();
    if rows.first < end {
        return bad(format!("rows from {} again (installed up to {end})", rows.first));
    }
    if rows.first == end {
        return Ok(None);
    }
    if window.is_none() {
        return bad(format!("a gap: rows from {} after {end}", rows.first));
    }
    let capacity = placement.capacity.max(1);
    let skipped = rows.first - end;
    Ok(Some(RingPlacement {
        capacity: placement.capacity,
        len: 0,
        origin_logical: rows.first,
        origin_physical: (placement.origin_physical + placement.len + skipped % capacity) % capacity,
    }))
}

/// Checks that every layer (`placement`, `window`) of an installed stream ends at `to` and holds every
/// row a query at `to` sees.
pub fn check_complete(
    layers: impl IntoIterator<Item = (RingPlacement, Option<usize>)>,
    to: usize,
) -> Result<(), ModelError> {
    for (i, (p, window)) in layers.into_iter().enumerate() {
        if p.end() != to {
            return Err(ModelError::Kv(format!("layer {i} was filled to {}, not {to}", p.end())));
        }
        if !p.can_truncate(to, window) {
            return Err(ModelError::Kv(format!(
                "layer {i} holds rows from {}, a query at {to} needs more",
                p.origin_logical
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Activation, Arch, LayerSpec, RopeParams, RopeStyle};
    use crate::kv::{KvPool, SequenceKv, StagingBuffers, RING_SLACK};
    use std::sync::Arc;

    /// Gemma 3's pattern at a small width: five sliding-window layers of 64 rows, then a global one.
    fn config() -> ModelConfig {
        let rope = RopeParams {
            style: RopeStyle::Neox,
            n_rot: 8,
            freq_base: 10_000.0,
            freq_scale: 1.0,
        };
        ModelConfig {
            arch: Arch::Gemma3,
            n_vocab: 64,
            d_model: 16,
            n_head: 2,
            n_kv_head: 1,
            head_dim: 8,
            d_ff: 32,
            eps: 1e-6,
            context_length: 4096,
            layers: (0..6)
                .map(|i| LayerSpec {
                    window: (i % 6 != 5).then_some(64),
                    rope,
                })
                .collect(),
            attn_scale: 0.25,
            embed_scale: None,
            activation: Activation::GeluTanh,
            qk_norm: true,
            post_norms: true,
            moe: None,
        }
    }

    /// A cache filled with `chunks`, every value encoding its layer, position and lane.
    fn filled(c: &ModelConfig, pool: &Arc<KvPool>, slack: usize, chunks: &[usize]) -> SequenceKv {
        let mut kv = SequenceKv::new(c, 2048, slack, pool);
        let w = c.kv_width();
        let mut staging = StagingBuffers::default();
        for &t in chunks {
            let start = kv.len();
            for (li, layer) in kv.layers.iter_mut().enumerate() {
                let k: Vec<f32> = (0..t * w)
                    .map(|i| (li * 1000 + (start + i / w) % 997) as f32 + (i % w) as f32 / 16.0)
                    .collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                layer.store_and_attend(&k, &v, t, &mut staging, |_| {}).unwrap();
            }
        }
        kv
    }

    /// The stream a prefill node sends for `kv` (filled to `to`): per layer the rows its ring keeps.
    fn stream(kv: &SequenceKv, fp: [u8; 32], width: usize) -> Vec<u8> {
        stream_from(kv, fp, width, 0)
    }

    /// The stream for a receiver that holds `0..start` already: per layer the rows its ring keeps from
    /// `start` on.
    fn stream_from(kv: &SequenceKv, fp: [u8; 32], width: usize, start: usize) -> Vec<u8> {
        let to = kv.len();
        let (mut enc, mut out) = Encoder::start(&Hello {
            version: VERSION,
            fingerprint: fp,
            n_layers: kv.layers.len(),
            width,
            from: start,
            to,
        });
        for (layer, from) in kv.export_from(to).into_iter().enumerate() {
            let from = from.max(start);
            if from == to {
                continue;
            }
            for piece in kv.export_rows(layer, from, to).unwrap().split(width) {
                let frame = enc.rows(&piece);
                // Senders count this length against their send buffer before encoding.
                assert_eq!(frame.len(), rows_frame_len(piece.n_rows(width), width));
                out.extend(frame);
            }
        }
        out.extend(enc.end());
        out
    }

    /// Decodes `bytes` (fed in pieces of `step`) into a fresh cache; the first error, if any.
    fn install(bytes: &[u8], step: usize, fp: [u8; 32], into: &mut SequenceKv) -> Result<(), String> {
        let mut dec = Decoder::new(fp);
        let mut to = 0;
        for piece in bytes.chunks(step.max(1)) {
            dec.push(piece);
            while let Some(f) = dec.next_frame().map_err(|e| e.to_string())? {
                match f {
                    Frame::Hello(h) => to = h.to,
                    Frame::Rows(r) => into.install_rows(&r, to).map_err(|e| e.to_string())?,
                    Frame::End => into.check_installed(to).map_err(|e| e.to_string())?,
                    Frame::Error(m) => return Err(m),
                }
            }
        }
        dec.finish().map_err(|e| e.to_string())
    }

    /// Every row a query at `kv.len()` may see, per layer, as attention reads them.
    fn visible(kv: &SequenceKv) -> Vec<(RingPlacement, Vec<f16>)> {
        let end = kv.len();
        kv.layers
            .iter()
            .map(|l| {
                let from = l.window.map_or(0, |w| (end + 1).saturating_sub(w));
                let view = l.view();
                let mut rows = Vec::new();
                for p in from..end {
                    rows.extend_from_slice(&view.k_rows(p)[..l.width]);
                    rows.extend_from_slice(&view.v_rows(p)[..l.width]);
                }
                (l.placement, rows)
            })
            .collect()
    }

    use tandem_backend::cpu::attention::KvRows;

    #[test]
    fn a_stream_rebuilds_the_cache_with_its_ring_placement() {
        let c = config();
        let w = c.kv_width();
        let fp = [7u8; 32];
        for chunks in [
            vec![10],
            vec![64],
            vec![65],
            vec![300, 1, 7],
            vec![129, 64, 64, 1],
            vec![1; 90],
        ] {
            let pool = KvPool::new(w, None);
            let local = filled(&c, &pool, RING_SLACK, &chunks);
            let bytes = stream(&local, fp, w);
            let mut remote = SequenceKv::new(&c, 2048, RING_SLACK, &pool);
            install(&bytes, 977, fp, &mut remote).unwrap();
            assert_eq!(remote.len(), local.len());
            // Same capacity: the same physical placement, not only the same visible rows.
            for (a, b) in remote.layers.iter().zip(&local.layers) {
                assert_eq!(a.placement, b.placement, "{chunks:?}");
            }
            assert_eq!(visible(&remote), visible(&local), "{chunks:?}");
            // A receiver whose rings are smaller (no slack) keeps what its windows need.
            let mut small = SequenceKv::new(&c, 2048, 0, &pool);
            install(&bytes, 1 << 20, fp, &mut small).unwrap();
            let (vs, vl) = (visible(&small), visible(&local));
            for ((ps, rs), (_, rl)) in vs.iter().zip(&vl) {
                assert_eq!(rs, rl, "{chunks:?}");
                assert!(ps.len <= 64 || ps.capacity == 2048);
            }
        }
    }

    /// A continued conversation: the receiver holds the conversation's first `start` positions (a copy
    /// of its cache), the stream only the new rows. Its rings end as a local continuation's would, whether
    /// the new rows overflow the 64 + slack rows of a ring or not, wrapped or not.
    #[test]
    fn a_continued_conversation_gets_only_its_new_rows() {
        let c = config();
        let w = c.kv_width();
        let fp = [9u8; 32];
        let ring = 64 + RING_SLACK;
        for (before, after) in [
            (vec![10], vec![20]),
            (vec![40], vec![ring - 5]),
            (vec![300], vec![7, 30]),
            (vec![300], vec![ring + 40]),
            (vec![100, 1, 1], vec![2 * ring + 3]),
            (vec![ring], vec![ring]),
        ] {
            let pool = KvPool::new(w, None);
            let kept = filled(&c, &pool, RING_SLACK, &before);
            let start = kept.len();
            // The sender read the whole conversation (here: as the local reference did, chunk by chunk).
            let chunks: Vec<usize> = before.iter().chain(&after).copied().collect();
            let local = filled(&c, &pool, RING_SLACK, &chunks);
            let bytes = stream_from(&local, fp, w, start);
            let mut remote = kept.try_clone().unwrap();
            install(&bytes, 1000, fp, &mut remote).unwrap();
            for (a, b) in remote.layers.iter().zip(&local.layers) {
                // The same next physical row and every row a query sees; older ones at most dropped.
                assert_eq!(a.placement.end(), b.placement.end(), "{before:?} {after:?}");
                let next = |p: &RingPlacement| (p.origin_physical + p.len) % p.capacity;
                assert_eq!(next(&a.placement), next(&b.placement), "{before:?} {after:?}");
                assert!(a.placement.origin_logical >= b.placement.origin_logical);
            }
            assert_eq!(visible(&remote), visible(&local), "{before:?} {after:?}");
            // Only the new rows travelled: at most a ring of them per sliding-window layer.
            let new = local.len() - start;
            let rows = 5 * new.min(ring) + new;
            assert!(
                bytes.len() < 4 * w * rows + 8192,
                "{} bytes for {rows} rows",
                bytes.len()
            );
            assert!(bytes.len() > 4 * w * rows, "{} bytes for {rows} rows", bytes.len());
        }
        // Rows before the stream's start are refused by the decoder.
        let pool = KvPool::new(w, None);
        let local = filled(&c, &pool, RING_SLACK, &[50]);
        let (mut enc, mut out) = Encoder::start(&Hello {
            version: VERSION,
            fingerprint: fp,
            n_layers: 6,
            width: w,
            from: 20,
            to: 50,
        });
        out.extend(enc.rows(&local.export_rows(5, 10, 50).unwrap()));
        let mut dec = Decoder::new(fp);
        dec.push(&out);
        assert!(matches!(dec.next_frame(), Ok(Some(Frame::Hello(_)))));
        assert_eq!(dec.next_frame().unwrap_err().cause(), "protocol");
    }

    #[test]
    fn a_sliding_layer_ships_only_what_its_ring_keeps() {
        let c = config();
        let w = c.kv_width();
        let pool = KvPool::new(w, None);
        let local = filled(&c, &pool, RING_SLACK, &[1000]);
        let from = local.export_from(1000);
        let ring = 64 + RING_SLACK;
        assert_eq!(
            from,
            vec![1000 - ring, 1000 - ring, 1000 - ring, 1000 - ring, 1000 - ring, 0]
        );
        let rows_bytes = 4 * w * (5 * ring + 1000);
        let len = stream(&local, [0; 32], w).len();
        assert!(
            len > rows_bytes && len < rows_bytes + 4096,
            "{len} bytes for {rows_bytes} of rows"
        );
    }

    #[test]
    fn corrupt_cut_or_foreign_streams_are_refused() {
        let c = config();
        let w = c.kv_width();
        let fp = [3u8; 32];
        let pool = KvPool::new(w, None);
        let local = filled(&c, &pool, RING_SLACK, &[200, 1]);
        let bytes = stream(&local, fp, w);
        let fresh = || SequenceKv::new(&c, 2048, RING_SLACK, &pool);
        // Any one flipped byte: the magic, a header, a row value, a digest, the end frame.
        for at in [0, 9, 12, 20, 300, bytes.len() / 2, bytes.len() - 40, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x10;
            let err = install(&bad, 4096, fp, &mut fresh()).unwrap_err();
            assert!(
                err.contains("checksum") || err.contains("magic") || err.contains("over the limit"),
                "byte {at}: {err}"
            );
        }
        // Another model.
        let err = install(&bytes, 4096, [4u8; 32], &mut fresh()).unwrap_err();
        assert!(err.contains("model mismatch"), "{err}");
        // Cut anywhere before the end frame's last byte.
        for cut in [0, 8, 50, bytes.len() / 3, bytes.len() - 1] {
            let err = install(&bytes[..cut], 4096, fp, &mut fresh()).unwrap_err();
            assert!(err.contains("before its end frame"), "cut at {cut}: {err}");
        }
        // A rows frame dropped: the end frame's count and chain catch it (here the install first sees a
        // gap or an incomplete layer, whichever comes first).
        let to = local.len();
        let (mut enc, mut out) = Encoder::start(&Hello {
            version: VERSION,
            fingerprint: fp,
            n_layers: 6,
            width: w,
            from: 0,
            to,
        });
        let global = local.export_rows(5, 0, to).unwrap();
        let (a, b) = (
            LayerRows {
                k: global.k[..100 * w].to_vec(),
                v: global.v[..100 * w].to_vec(),
                ..global.clone()
            },
            LayerRows {
                first: 100,
                k: global.k[100 * w..].to_vec(),
                v: global.v[100 * w..].to_vec(),
                ..global.clone()
            },
        );
        let _ = enc.rows(&a);
        out.extend(enc.rows(&b));
        out.extend(enc.end());
        let mut dec = Decoder::new(fp);
        dec.push(&out);
        assert!(matches!(dec.next_frame(), Ok(Some(Frame::Hello(_)))));
        assert!(matches!(dec.next_frame(), Ok(Some(Frame::Rows(_)))));
        let err = dec.next_frame().unwrap_err();
        assert_eq!(err.cause(), "protocol", "{err}");
        // The sender's own error.
        let mut dec = Decoder::new(fp);
        let (_, mut start) = Encoder::start(&Hello {
            version: VERSION,
            fingerprint: fp,
            n_layers: 6,
            width: w,
            from: 0,
            to,
        });
        start.extend(Encoder::error("out of memory"));
        dec.push(&start);
        assert!(matches!(dec.next_frame(), Ok(Some(Frame::Hello(_)))));
        assert_eq!(dec.next_frame(), Err(WireError::Peer("out of memory".into())));
        // Rows past the stream's end, rows twice, a global layer with a gap: refused by the install.
        let mut kv = fresh();
        assert!(kv.install_rows(&b, 150).is_err(), "a gap in a global layer");
        kv.install_rows(&a, to).unwrap();
        assert!(kv.install_rows(&a, to).unwrap_err().to_string().contains("again"));
        assert!(kv
            .install_rows(&b, 150)
            .unwrap_err()
            .to_string()
            .contains("past the stream's end"));
        assert!(kv.check_installed(to).is_err(), "layers 0-4 are empty");
        drop(kv);
        assert_eq!(
            pool.bytes_in_use(),
            local.bytes_allocated(),
            "refused caches gave their blocks back"
        );
    }

    #[test]
    fn another_version_is_refused() {
        let (_, mut bytes) = Encoder::start(&Hello {
            version: VERSION + 1,
            fingerprint: [0; 32],
            n_layers: 1,
            width: 8,
            from: 0,
            to: 1,
        });
        bytes.truncate(bytes.len());
        let mut dec = Decoder::new([0; 32]);
        dec.push(&bytes);
        assert_eq!(dec.next_frame(), Err(WireError::Version { got: VERSION + 1 }));
    }
}
