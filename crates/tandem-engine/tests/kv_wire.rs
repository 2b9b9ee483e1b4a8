//! The KV wire format on real models: a prompt prefilled here, exported through the wire format (every
//! frame encoded, checksummed, decoded) and installed into a fresh sequence, continues with the same
//! logits, in bits, as the sequence it came from: on Gemma 3 past its 512-row rings (five layers of six
//! ship only their ring) and on SmolLM2.

mod common;

use common::*;
use tandem_model::kv::wire::{Decoder, Encoder, Frame, Hello, VERSION};
use tandem_model::LogitRows;

fn check_model((key, file): (&str, &str)) {
    let golden = golden();
    let tokens = ids(&prompt(&golden, key, "gpl3-long")["ids"]);
    let (mut engine, _) = load(file);
    let fingerprint = engine.model.fingerprint(None);
    let to = tokens.len() - 1;
    let mut local = engine.new_sequence(tokens.len() + 8);
    engine.prefill(&mut local, &tokens[..to], 512).unwrap();

    let width = engine.model.config.kv_width();
    let (mut enc, mut bytes) = Encoder::start(&Hello {
        version: VERSION,
        fingerprint,
        n_layers: local.layers.len(),
        width,
        from: 0,
        to,
    });
    let mut shipped = 0;
    for (layer, from) in local.export_from(to).into_iter().enumerate() {
        shipped += to - from;
        for piece in local.export_rows(layer, from, to).unwrap().split(width) {
            bytes.extend(enc.rows(&piece));
        }
    }
    bytes.extend(enc.end());
    // A global layer ships every row, a sliding-window one what its ring keeps (its window: no slack).
    let expected: usize = engine
        .model
        .config
        .layers
        .iter()
        .map(|l| l.window.map_or(to, |w| w.min(to)))
        .sum();
    assert_eq!(shipped, expected, "{key}: rows shipped");

    let mut remote = engine.new_sequence(tokens.len() + 8);
    let mut dec = Decoder::new(fingerprint);
    for piece in bytes.chunks(64 << 10) {
        dec.push(piece);
        while let Some(frame) = dec.next_frame().unwrap() {
            match frame {
                Frame::Rows(rows) => remote.install_rows(&rows, to).unwrap(),
                Frame::End => remote.check_installed(to).unwrap(),
                Frame::Hello(_) | Frame::Error(_) => {}
            }
        }
    }
    dec.finish().unwrap();
    for (a, b) in remote.layers.iter().zip(&local.layers) {
        assert_eq!(a.placement, b.placement, "{key}: the ring placement travelled");
    }

    // The last prompt token, then greedy steps: every logit the same bits.
    let mut next = tokens[to];
    for step in 0..4 {
        let a = engine.forward(&mut local, &[next], LogitRows::Last).unwrap();
        let b = engine.forward(&mut remote, &[next], LogitRows::Last).unwrap();
        let (a, b) = (a.to_vec(), b.to_vec());
        assert!(
            a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{key}: logits differ at step {step}"
        );
        next = (0..a.len()).max_by(|&i, &j| a[i].total_cmp(&a[j])).unwrap() as u32;
    }
    eprintln!("{key}: {shipped} rows over {} bytes, logits equal in bits", bytes.len());
}

#[test]
fn gemma3_continues_from_installed_kv_in_bits() {
    check_model(GEMMA);
}

#[test]
fn smollm2_continues_from_installed_kv_in_bits() {
    check_model(SMOLLM);
}
