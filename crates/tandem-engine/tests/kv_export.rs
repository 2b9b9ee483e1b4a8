//! A KV export's send buffer on the real Gemma 3 model: a sender that does not keep up holds the
//! engine to the buffer (the prompt's rows wait in its cache, not in copies) while other requests are
//! served, the stream it gets at its own pace installs into a cache that continues in bits like the
//! local one, and a sender that goes away frees the export's sequence and blocks.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tandem_engine::serve::{EngineHandle, Event, KvExport, ServingConfig, ServingEngine};
use tandem_gguf::GgufFile;
use tandem_model::kv::wire::rows_frame_len;
use tandem_model::{LogitRows, Model};
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::UnboundedReceiver;

/// 256 KiB: a 512-row chunk of Gemma 3 270M is 9 MiB of rows (18 layers, 1 KiB a row), so the buffer
/// holds a small part of one.
const LIMIT: usize = 256 << 10;

fn engine() -> ServingEngine {
    let gguf = GgufFile::open(model_path(GEMMA.1)).unwrap();
    let config = ServingConfig {
        kv_send_buffer_bytes: LIMIT,
        ..Default::default()
    };
    ServingEngine::start(Model::from_file(gguf, threads()).unwrap(), config)
}

fn long_prompt() -> Vec<u32> {
    ids(&prompt(&golden(), GEMMA.0, "gpl3-long")["ids"])
}

/// The next event within `within`, `None` when none came.
fn next_event(rx: &mut UnboundedReceiver<Event>, within: Duration) -> Option<Event> {
    let deadline = Instant::now() + within;
    loop {
        match rx.try_recv() {
            Ok(e) => return Some(e),
            Err(TryRecvError::Disconnected) => panic!("the engine dropped the request"),
            Err(TryRecvError::Empty) if Instant::now() > deadline => return None,
            Err(TryRecvError::Empty) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Runs a short generation to its end: the engine serves it whatever the export does.
fn generate(engine: &ServingEngine, prompt: Vec<u32>) {
    let mut rx = engine.submit(greedy_request(prompt, 4, None)).unwrap();
    loop {
        match next_event(&mut rx, Duration::from_secs(30)) {
            Some(Event::Done { .. }) => return,
            Some(Event::Failed(e)) => panic!("the generation failed: {e}"),
            Some(_) => {}
            None => panic!("the generation stalled beside the export"),
        }
    }
}

#[test]
fn a_slow_sender_holds_the_export_within_its_buffer() {
    let tokens = long_prompt();
    let to = tokens.len() - 1;
    let serving = engine();
    let KvExport { mut events, backlog } = serving.export_kv(tokens[..to].to_vec(), 0).unwrap();
    assert_eq!(backlog.limit(), LIMIT);

    // Nobody sends for a while: the engine fills the buffer and stops there, and serves others.
    std::thread::sleep(Duration::from_millis(300));
    generate(&serving, tokens[3..40].to_vec());
    let queued = backlog.queued();
    assert!(queued > 0 && queued <= LIMIT, "{queued} bytes queued, limit {LIMIT}");

    // Then a slow sender: every frame handed on after a pause, the buffer never past its limit.
    let (mut plain, _) = load(GEMMA.1);
    let width = plain.model.config.kv_width();
    let mut remote = plain.new_sequence(tokens.len() + 8);
    let (mut peak, mut frames) = (0, 0);
    loop {
        match next_event(&mut events, Duration::from_secs(60)) {
            Some(Event::KvRows(rows)) => {
                peak = peak.max(backlog.queued());
                assert!(backlog.queued() <= LIMIT, "{} bytes queued", backlog.queued());
                remote.install_rows(&rows, to).unwrap();
                std::thread::sleep(Duration::from_millis(2));
                frames += 1;
                backlog.sent(rows_frame_len(rows.n_rows(width), width));
            }
            Some(Event::Done { .. }) => break,
            Some(Event::Failed(e)) => panic!("the export failed: {e}"),
            Some(_) => {}
            None => panic!("the export stalled with {} bytes queued", backlog.queued()),
        }
    }
    assert_eq!(backlog.queued(), 0);
    // About 9 MiB of rows went through a 256 KiB buffer: many frames, the buffer full at times.
    assert!(frames > 30, "{frames} frames");
    assert!(peak > LIMIT / 2, "the buffer peaked at {peak} bytes");
    assert_eq!(serving.stats().kv_exports_total, 1);
    remote.check_installed(to).unwrap();

    // The installed cache continues like a local read of the prompt, in bits.
    let mut local = plain.new_sequence(tokens.len() + 8);
    plain.prefill(&mut local, &tokens[..to], 512).unwrap();
    for (a, b) in remote.layers.iter().zip(&local.layers) {
        assert_eq!(a.placement, b.placement);
    }
    let a = plain
        .forward(&mut local, &[tokens[to]], LogitRows::Last)
        .unwrap()
        .to_vec();
    let b = plain
        .forward(&mut remote, &[tokens[to]], LogitRows::Last)
        .unwrap()
        .to_vec();
    assert!(
        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
        "logits differ"
    );
}

#[test]
fn a_sender_that_goes_away_frees_the_export() {
    let tokens = long_prompt();
    let serving = engine();
    let KvExport { events, backlog } = serving.export_kv(tokens[..tokens.len() - 1].to_vec(), 0).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while backlog.queued() == 0 {
        assert!(Instant::now() < deadline, "the export queued nothing");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(serving.stats().kv_bytes_reserved > 0);
    // The stalled export's sender goes away (a client that disconnected drops the response body).
    drop(events);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = serving.stats();
        if st.running == 0 && st.kv_bytes_reserved == 0 && st.kv_bytes_used == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the export still holds KV: {st:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(serving.stats().kv_exports_total, 0);
    assert_eq!(serving.stats().kv_accounting_violations, 0);
    generate(&serving, tokens[3..40].to_vec());
}
