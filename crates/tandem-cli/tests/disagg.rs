//! Disaggregated prefill with real processes on loopback: a decode node (`--role decode`) reading long
//! prompts from a prefill node (`--role prefill`) gives the same tokens and logprobs, in bits, as a
//! server reading them itself (Gemma 3 past its 768-row rings, a continued conversation, SmolLM2); and
//! every failure — the peer unreachable, another model, slower than the timeout, a flipped byte of the
//! KV stream, the HTTP/2 connection cut mid-transfer, a KV budget the detached cache does not fit —
//! falls back to a local read with the same tokens, counted by cause, with nothing left reserved and
//! the server still serving; and the prefill process killed after its first rows went out.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;

use common::{free_port, serve, Server};

fn start(model: &str, extra: &[String]) -> Server {
    let mut args: Vec<String> = ["-m", model, "--ctx", "2048", "-t", "2"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend_from_slice(extra);
    serve(&args, |port| {
        matches!(request(port, "GET", "/health", ""), Ok((200, _, _)))
    })
}

fn decode_node(model: &str, peer: u16, extra: &[&str]) -> Server {
    let mut args = vec![
        "--role".to_string(),
        "decode".into(),
        "--prefill-peer".into(),
        format!("http://127.0.0.1:{peer}"),
        "--remote-prefill-min-tokens".into(),
        "32".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    start(model, &args)
}

/// (status, x-tandem-prompt header, body).
fn request(port: u16, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let prompt = head
        .lines()
        .find_map(|l| l.strip_prefix("x-tandem-prompt: "))
        .unwrap_or("")
        .to_string();
    Ok((status, prompt, body.to_string()))
}

/// Greedy completion with logprobs: (prompt line, choices).
fn complete(port: u16, prompt: &str) -> (String, Value) {
    let body = json!({"prompt": prompt, "max_tokens": 6, "temperature": 0, "logprobs": 3}).to_string();
    let (status, line, text) = request(port, "POST", "/v1/completions", &body).unwrap();
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    (line, v["choices"].clone())
}

fn metric(port: u16, name: &str) -> u64 {
    let (_, _, text) = request(port, "GET", "/metrics", "").unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no metric {name}"))
        .parse()
        .unwrap()
}

/// Nothing reserved once the requests are done, the books never broken.
fn settled(port: u16) {
    // The engine publishes its books after the step that sent the last token.
    let deadline = Instant::now() + Duration::from_secs(5);
    while metric(port, "tandem_kv_cache_bytes_reserved") != 0 {
        assert!(Instant::now() < deadline, "KV still reserved after the requests ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metric(port, "tandem_kv_accounting_violations_total"), 0);
}

/// About 900 Gemma tokens: past the 512-row window and the 768-row ring.
fn long_prompt(seed: usize) -> String {
    (0..90)
        .map(|i| format!("item{i} costs {} coins.", i * 3 + seed))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Forwards connections to `upstream`, passing the HTTP/2 DATA payload of the responses (the KV stream
/// bytes) through `damage` (stream bytes so far, byte): `Some(b)` sends `b`, `None` cuts the connection
/// there. The response is parsed into HTTP/2 frames (9-byte heads: length u24, type, flags, stream), so
/// a flipped byte lands in the KV stream and not in HTTP/2's own framing, and a cut comes after the
/// response began, mid-body.
fn proxy(upstream: u16, damage: fn(usize, u8) -> Option<u8>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { continue };
            let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut s2);
            });
            let mut at = 0;
            let mut pending = Vec::new();
            let mut buf = [0u8; 1 << 16];
            'relay: while let Ok(n) = server.read(&mut buf) {
                if n == 0 {
                    break;
                }
                pending.extend_from_slice(&buf[..n]);
                // Whole frames only: a DATA frame's payload is the response body.
                while pending.len() >= 9 {
                    let len = u32::from_be_bytes([0, pending[0], pending[1], pending[2]]) as usize;
                    if pending.len() < 9 + len {
                        break;
                    }
                    let mut frame: Vec<u8> = pending.drain(..9 + len).collect();
                    let (kind, flags) = (frame[3], frame[4]);
                    if kind == 0 {
                        // PADDED: a pad length byte first, that many padding bytes last.
                        let (start, end) = match flags & 0x8 {
                            0 => (9, 9 + len),
                            _ => (10, (9 + len).saturating_sub(frame[9] as usize).max(10)),
                        };
                        for byte in &mut frame[start..end] {
                            match damage(at, *byte) {
                                Some(b) => *byte = b,
                                None => break 'relay,
                            }
                            at += 1;
                        }
                    }
                    if client.write_all(&frame).is_err() {
                        break 'relay;
                    }
                }
            }
            let _ = client.shutdown(std::net::Shutdown::Both);
            let _ = server.shutdown(std::net::Shutdown::Both);
        }
    });
    port
}

/// Gemma 3 270M's KV: 18 layers of one KV head of 256 (f16 K and V: 1 KiB a row), every sixth global,
/// the others rings of 512 + 256 rows (the window and the engine's ring slack).
const GEMMA_GLOBAL_LAYERS: usize = 3;
const GEMMA_RING_LAYERS: usize = 15;
const GEMMA_RING: usize = 768;
const GEMMA_ROW_BYTES: usize = 4 * 256;

/// Rows a stream of positions `from..to` carries on Gemma 3: every new row of a global layer, at most a
/// ring's worth of a sliding-window one.
fn gemma_stream_rows(from: usize, to: usize) -> usize {
    GEMMA_GLOBAL_LAYERS * (to - from) + GEMMA_RING_LAYERS * (to - from).min(GEMMA_RING)
}

/// (prompt tokens, reused, remote rows) of a `prompt N = R reused + M remote + K read` line.
fn counts(line: &str) -> (usize, usize, usize) {
    let n: Vec<usize> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    (n[0], n[1], n[2])
}

/// A remote prefill of `prompt` on `decode` gives `want`; the stream carried the rows its line names
/// (from the reused prefix to the last token), in as many bytes as those rows take plus the wire's
/// framing. Returns (stream bytes, reused).
fn remote_turn(decode: &Server, prompt: &str, want: &Value) -> (usize, usize) {
    let before = metric(decode.port, "tandem_kv_received_bytes_total") as usize;
    let (line, got) = complete(decode.port, prompt);
    assert!(line.contains("(remote prefill)"), "{line}");
    assert_eq!(&got, want, "remote prefill differs from local: {line}");
    let (n, reused, rows) = counts(&line);
    assert_eq!(reused + rows, n - 1, "{line}");
    let bytes = metric(decode.port, "tandem_kv_received_bytes_total") as usize - before;
    let payload = GEMMA_ROW_BYTES * gemma_stream_rows(reused, n - 1);
    // Frame heads and digests: some 90 bytes a frame, a frame per layer and prefill chunk.
    assert!(
        (payload..payload + 16384).contains(&bytes),
        "{line}: {bytes} bytes for {payload} of rows"
    );
    (bytes, reused)
}

#[test]
fn remote_prefill_gives_local_bits_and_fails_closed() {
    let prefill = start("gemma3-270m", &["--role".into(), "prefill".into()]);
    let local = start("gemma3-270m", &[]);
    let decode = decode_node("gemma3-270m", prefill.port, &[]);
    let first = long_prompt(0);
    // A version-1 request (no `from`: a whole-prompt stream) is refused naming both versions, and so is
    // a stream that would carry no row.
    for (body, what) in [
        (
            json!({"version": 1, "fingerprint": "00", "tokens": [2, 3]}),
            "KV wire version 1, this node speaks only 2",
        ),
        (
            json!({"version": 2, "fingerprint": "00", "tokens": [2, 3], "from": 2}),
            "nothing to send",
        ),
    ] {
        let (status, _, text) = request(prefill.port, "POST", "/v1/kv/prefill", &body.to_string()).unwrap();
        assert_eq!(status, 400, "{text}");
        assert!(text.contains(what), "{text}");
    }

    // A fresh long prompt, then a conversation continuing it by more than a ring, then by less than a
    // ring, then a short prompt.
    let (line, want) = complete(local.port, &first);
    assert!(line.ends_with("read"), "{line}");
    let (_, reused) = remote_turn(&decode, &first, &want);
    assert_eq!(reused, 0);
    let text = want[0]["text"].as_str().unwrap();
    let next = format!("{first}{text} {}", long_prompt(7));
    let (line, want_next) = complete(local.port, &next);
    let (n, ..) = counts(&line);
    let (bytes, reused) = remote_turn(&decode, &next, &want_next);
    assert!(reused > 800, "the first turn is reused: {reused}");
    let whole = GEMMA_ROW_BYTES * gemma_stream_rows(0, n - 1);
    assert!(bytes < whole, "{bytes} bytes, a whole-prompt stream {whole}");
    let text = want_next[0]["text"].as_str().unwrap();
    let more = (0..6)
        .map(|i| format!("item{} costs {} coins.", 100 + i, i))
        .collect::<Vec<_>>()
        .join(" ");
    let third = format!("{next}{text} {more}");
    let (line, want_third) = complete(local.port, &third);
    let (n, ..) = counts(&line);
    let (bytes, reused) = remote_turn(&decode, &third, &want_third);
    assert!(n - reused < GEMMA_RING, "{n} tokens, {reused} reused");
    // Fewer new rows than a ring holds: they alone travel, not the rings' whole windows.
    let whole = GEMMA_ROW_BYTES * gemma_stream_rows(0, n - 1);
    assert!(bytes * 10 < whole, "{bytes} bytes, a whole-prompt stream {whole}");
    let (line, _) = complete(decode.port, "The capital of France is");
    assert!(line.ends_with("(local: short)"), "{line}");
    assert_eq!(metric(decode.port, "tandem_remote_prefill_total"), 3);
    assert_eq!(metric(decode.port, "tandem_remote_prefill_short_total"), 1);
    settled(decode.port);
    settled(prefill.port);
    drop(decode);

    // Each failure falls back, with the same tokens; `prompt` differs per case so no cache helps.
    let fallback = |node: &Server, cause: &str, seed: usize| {
        let prompt = long_prompt(seed);
        let (_, want) = complete(local.port, &prompt);
        let (line, got) = complete(node.port, &prompt);
        assert!(line.ends_with(&format!("(local: fallback {cause})")), "{cause}: {line}");
        assert_eq!(got, want, "{cause}: the fallback differs from local");
        let counted = format!("tandem_remote_prefill_fallback_total{{cause=\"{cause}\"}}");
        assert_eq!(metric(node.port, &counted), 1, "{cause}");
        settled(node.port);
        // Still serving, and a short prompt never goes out.
        let (line, _) = complete(node.port, "Hello there");
        assert!(line.ends_with("(local: short)"), "{line}");
    };
    let nobody = free_port();
    fallback(&decode_node("gemma3-270m", nobody, &[]), "unreachable", 1);
    let other_model = start("smollm2-135m", &["--role".into(), "prefill".into()]);
    fallback(&decode_node("gemma3-270m", other_model.port, &[]), "identity", 2);
    fallback(
        &decode_node("gemma3-270m", prefill.port, &["--prefill-timeout", "0.02"]),
        "timeout",
        3,
    );
    let flipped = proxy(prefill.port, |at, b| Some(if at == 6000 { b ^ 0x04 } else { b }));
    fallback(&decode_node("gemma3-270m", flipped, &[]), "checksum", 4);
    let cut = proxy(prefill.port, |at, b| (at < 6000).then_some(b));
    fallback(&decode_node("gemma3-270m", cut, &[]), "dropped", 5);
    // One sequence fits the budget; a conversation continued remotely needs it twice (the detached
    // copy beside the conversation kept for the fallback), so it is read here: about 17 MB each for
    // `next` (3 global layers of 1800 rows and 15 rings of 768, 18 KiB a position).
    let tight = decode_node(
        "gemma3-270m",
        prefill.port,
        &["--kv-budget", "20M", "--cache-budget", "20M"],
    );
    let (line, got) = complete(tight.port, &first);
    assert!(line.contains("(remote prefill)"), "{line}");
    assert_eq!(got, want);
    let (line, got) = complete(tight.port, &next);
    assert!(line.ends_with("(local: fallback kv_budget)"), "{line}");
    assert_eq!(got, want_next);
    settled(tight.port);
    settled(prefill.port);
}

#[test]
fn remote_prefill_gives_local_bits_on_smollm2() {
    let prefill = start("smollm2-135m", &["--role".into(), "prefill".into()]);
    let local = start("smollm2-135m", &[]);
    let decode = decode_node("smollm2-135m", prefill.port, &[]);
    let prompt = long_prompt(11);
    let (_, want) = complete(local.port, &prompt);
    let (line, got) = complete(decode.port, &prompt);
    assert!(line.contains("(remote prefill)"), "{line}");
    assert_eq!(got, want, "remote prefill differs from local");
    settled(decode.port);
}

/// The prefill node killed after it sent its first rows: the decode node reads the prompt itself,
/// then keeps serving with its peer gone.
#[test]
fn a_peer_killed_mid_transfer_falls_back() {
    let mut prefill = start("gemma3-270m", &["--role".into(), "prefill".into()]);
    let local = start("gemma3-270m", &[]);
    let decode = decode_node("gemma3-270m", prefill.port, &[]);
    let prompt = long_prompt(21);
    let (_, want) = complete(local.port, &prompt);
    let port = decode.port;
    let asked = prompt.clone();
    let client = std::thread::spawn(move || complete(port, &asked));
    // The first chunk's rows are out when the prefill node counts them; the second chunk is still to come.
    let deadline = Instant::now() + Duration::from_secs(30);
    while metric(prefill.port, "tandem_kv_exported_rows_total") == 0 {
        assert!(Instant::now() < deadline, "the prefill node exported nothing");
        std::thread::sleep(Duration::from_millis(2));
    }
    prefill.child.kill().unwrap();
    let _ = prefill.child.wait();
    let (line, got) = client.join().unwrap();
    assert!(line.ends_with("(local: fallback dropped)"), "{line}");
    assert_eq!(got, want, "the fallback differs from local");
    settled(decode.port);
    let (line, got) = complete(decode.port, &long_prompt(22));
    assert!(line.ends_with("(local: fallback unreachable)"), "{line}");
    assert_eq!(got, complete(local.port, &long_prompt(22)).1);
    settled(decode.port);
}

/// A prefill node with `--kv-send-rate` gives the same bits as a local read, no sooner than its capped
/// link could carry them, and both ends count the same stream bytes. Other roles refuse the cap.
#[test]
fn a_capped_kv_stream_gives_local_bits() {
    const BITS_PER_SECOND: f64 = 20e6;
    let prefill = start(
        "smollm2-135m",
        &[
            "--role".into(),
            "prefill".into(),
            "--kv-send-rate".into(),
            "20mbit".into(),
        ],
    );
    let local = start("smollm2-135m", &[]);
    let decode = decode_node("smollm2-135m", prefill.port, &[]);
    // About 70 SmolLM2 tokens, some 1.6 MB of KV: most of a second at 20 Mbit/s.
    let prompt = (0..8)
        .map(|i| format!("item{i} costs {} coins.", i * 5 + 1))
        .collect::<Vec<_>>()
        .join(" ");
    let (_, want) = complete(local.port, &prompt);
    let t0 = Instant::now();
    let (line, got) = complete(decode.port, &prompt);
    let took = t0.elapsed().as_secs_f64();
    assert!(line.contains("(remote prefill)"), "{line}");
    assert_eq!(got, want, "a capped remote prefill differs from local");
    let sent = metric(prefill.port, "tandem_kv_sent_bytes_total");
    assert_eq!(metric(decode.port, "tandem_kv_received_bytes_total"), sent);
    assert!(sent > 1_000_000, "{sent} bytes");
    // The pacer banks at most a few milliseconds of its rate.
    let floor = sent as f64 * 8.0 / BITS_PER_SECOND - 0.01;
    assert!(took >= floor, "{sent} bytes in {took:.3} s: faster than 20 Mbit/s");
    settled(decode.port);

    for args in [
        &["--kv-send-rate", "1gbit"][..],
        &[
            "--role",
            "decode",
            "--prefill-peer",
            "http://127.0.0.1:9",
            "--kv-send-rate",
            "1gbit",
        ],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
            .arg("serve")
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains("--kv-send-rate is for --role prefill"), "{args:?}: {err}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(["serve", "--role", "prefill", "--kv-send-rate", "fast"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a rate"));
}

/// A decode node of several peers tries the next when one fails before it sent any rows: the first
/// peer down and the second live gives a remote prefill after one retry, in the same bits; both down
/// falls back as one peer down does, the retry counted as well.
#[test]
fn a_peer_down_gives_way_to_the_next() {
    let prefill = start("gemma3-270m", &["--role".into(), "prefill".into()]);
    let local = start("gemma3-270m", &[]);
    let node = |peers: &[u16]| {
        let mut args: Vec<String> = ["--role", "decode", "--remote-prefill-min-tokens", "32"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for port in peers {
            args.push("--prefill-peer".into());
            args.push(format!("http://127.0.0.1:{port}"));
        }
        start("gemma3-270m", &args)
    };
    // Peers are taken in turn from the first: a transfer starts at the peer that is down.
    let down = free_port();
    let decode = node(&[down, prefill.port]);
    let prompt = long_prompt(31);
    let (_, want) = complete(local.port, &prompt);
    let (line, got) = complete(decode.port, &prompt);
    assert!(line.ends_with("read after 1 retry (remote prefill)"), "{line}");
    assert_eq!(got, want, "remote prefill after a retry differs from local");
    assert_eq!(metric(decode.port, "tandem_remote_prefill_retries_total"), 1);
    assert_eq!(metric(decode.port, "tandem_remote_prefill_total"), 1);
    assert_eq!(
        metric(
            decode.port,
            "tandem_remote_prefill_fallback_total{cause=\"unreachable\"}"
        ),
        0
    );
    settled(decode.port);

    let both = node(&[down, free_port()]);
    let prompt = long_prompt(32);
    let (_, want) = complete(local.port, &prompt);
    let (line, got) = complete(both.port, &prompt);
    assert!(
        line.ends_with("read after 1 retry (local: fallback unreachable)"),
        "{line}"
    );
    assert_eq!(got, want, "the fallback differs from local");
    assert_eq!(metric(both.port, "tandem_remote_prefill_retries_total"), 1);
    assert_eq!(
        metric(both.port, "tandem_remote_prefill_fallback_total{cause=\"unreachable\"}"),
        1
    );
    settled(both.port);
}
