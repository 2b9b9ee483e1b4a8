//! Client disconnects, metrics, graceful shutdown.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::AsyncReadExt;

use crate::common::*;

fn slow(delay_ms: u64) -> Script {
    Script {
        tokens: None,
        delay: Duration::from_millis(delay_ms),
        ..Default::default()
    }
}

/// The value of an unlabelled metric.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn disconnect_cancels_the_sequence() {
    let server = TestServer::start(config(), slow(20)).await;
    for path in ["/v1/chat/completions", "/completion"] {
        let before = server.engine.cancelled();
        let body = json!({"messages": [{"role": "user", "content": "go on"}], "prompt": "go on", "stream": true, "max_tokens": 100});
        let (socket, _) = stream_until(server.addr, path, &body, 3).await;
        drop(socket);
        assert!(
            eventually(5, || server.engine.cancelled() == before + 1).await,
            "{path}: the engine did not see the drop"
        );
    }
    let m = server.get("/metrics").await.text();
    assert_eq!(metric(&m, "tandem_requests_cancelled_total"), 2.0);
    assert!(
        eventually(5, || server.engine.running.load(std::sync::atomic::Ordering::SeqCst)
            == 0)
        .await
    );
}

#[tokio::test]
async fn disconnect_cancels_before_the_first_byte() {
    let server = TestServer::start(config(), slow(20)).await;
    let body = json!({"prompt": "wait", "max_tokens": 100}).to_string();
    // While queued (no response head yet), and while a non-streamed generation runs.
    for queue_delay in [Duration::from_secs(30), Duration::ZERO] {
        server.engine.set_script(Script {
            queue_delay,
            ..slow(20)
        });
        let before = server.engine.cancelled();
        let mut s = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        let req = request_bytes("POST", "/v1/completions", &[], Some(body.as_bytes()));
        tokio::io::AsyncWriteExt::write_all(&mut s, &req).await.unwrap();
        tokio::time::sleep(Duration::from_millis(150)).await;
        drop(s);
        assert!(
            eventually(5, || server.engine.cancelled() == before + 1).await,
            "queue delay {queue_delay:?}: the engine did not see the drop"
        );
    }
}

#[tokio::test]
async fn metrics_move() {
    let server = TestServer::open().await;
    server.engine.set_script(Script {
        tokens: Some(server.ids("12345")),
        delay: Duration::from_millis(2),
        reused: 2,
        ..Default::default()
    });
    let r = server.get("/metrics").await;
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));
    let before = r.text();
    for name in [
        "tandem_time_to_first_token_seconds",
        "tandem_time_per_output_token_seconds",
        "tandem_requests_queued",
        "tandem_requests_running",
        "tandem_kv_cache_bytes_used",
        "tandem_kv_cache_bytes_budget",
        "tandem_cached_sequences",
        "tandem_prompt_tokens_total",
        "tandem_generation_tokens_total",
        "tandem_prefix_cache_hits_total",
        "tandem_prefix_cache_reused_tokens_total",
        "tandem_requests_total",
        "tandem_prefill_tokens_per_second",
        "tandem_decode_tokens_per_second",
    ] {
        assert!(before.contains(&format!("# TYPE {name} ")), "{name} missing");
    }
    assert_eq!(metric(&before, "tandem_requests_total"), 0.0);
    assert_eq!(metric(&before, "tandem_kv_cache_bytes_budget"), (1 << 20) as f64);

    let r = server.post_json("/v1/completions", &json!({"prompt": "abc"})).await;
    assert_eq!(r.status, 200);
    let after = server.get("/metrics").await.text();
    assert_eq!(metric(&after, "tandem_requests_total"), 1.0);
    assert_eq!(metric(&after, "tandem_prompt_tokens_total"), 3.0); // BOS, "ab", "c"
    assert_eq!(metric(&after, "tandem_generation_tokens_total"), 5.0);
    assert_eq!(metric(&after, "tandem_prefix_cache_hits_total"), 1.0);
    assert_eq!(metric(&after, "tandem_prefix_cache_reused_tokens_total"), 2.0);
    assert_eq!(metric(&after, "tandem_time_to_first_token_seconds_count"), 1.0);
    assert_eq!(metric(&after, "tandem_time_per_output_token_seconds_count"), 1.0);
    assert!(after.contains("tandem_time_to_first_token_seconds_bucket{le=\"+Inf\"} 1"));
    assert!(metric(&after, "tandem_decode_tokens_per_second") > 0.0);
    assert!(metric(&after, "tandem_prefill_tokens_per_second") > 0.0);

    // A refused request counts as rejected, not as a request.
    server.engine.set_script(Script {
        refuse: Some(tandem_engine::serve::SubmitError::QueueFull { queued: 1 }),
        ..Default::default()
    });
    server
        .post_json("/v1/completions", &json!({"prompt": "abc"}))
        .await
        .error(503);
    let after = server.get("/metrics").await.text();
    assert_eq!(metric(&after, "tandem_requests_total"), 1.0);
    assert_eq!(metric(&after, "tandem_requests_rejected_total"), 1.0);
}

#[tokio::test]
async fn graceful_shutdown_lets_streams_finish() {
    let mut server = TestServer::start(config(), slow(30)).await;
    let body = json!({"prompt": "wxyz", "stream": true, "max_tokens": 12});
    let (mut socket, mut raw) = stream_until(server.addr, "/v1/completions", &body, 2).await;
    let t0 = Instant::now();
    server.signal_shutdown();
    // The running stream goes on to its end.
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let r = parse_response(&raw);
    assert_eq!(r.sse().last().unwrap(), "[DONE]");
    let chunks = r.sse_json();
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, "wxyzwxyzwxyz");
    // Then serve returns, well within the grace, and shuts the engine down.
    let result = tokio::time::timeout(Duration::from_secs(10), &mut server.task).await;
    assert!(matches!(result, Ok(Ok(Ok(())))), "{result:?}");
    assert!(t0.elapsed() < Duration::from_secs(4));
    assert!(server.engine.shutdown_called.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(server.engine.cancelled(), 0);
    // No longer listening.
    assert!(tokio::net::TcpStream::connect(server.addr).await.is_err());
}

#[tokio::test]
async fn shutdown_grace_cuts_long_streams() {
    let mut config = config();
    config.shutdown_grace = Duration::from_millis(300);
    let mut server = TestServer::start(config, slow(20)).await;
    let body = json!({"prompt": "abcd", "stream": true, "max_tokens": 100});
    let (mut socket, mut raw) = stream_until(server.addr, "/v1/completions", &body, 2).await;
    let t0 = Instant::now();
    server.signal_shutdown();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let r = parse_response(&raw);
    let events = r.sse();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let last: serde_json::Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(last["error"]["code"], "shutting_down");
    let result = tokio::time::timeout(Duration::from_secs(10), &mut server.task).await;
    assert!(matches!(result, Ok(Ok(Ok(())))), "{result:?}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert!(server.engine.shutdown_called.load(std::sync::atomic::Ordering::SeqCst));
    assert!(eventually(5, || server.engine.cancelled() == 1).await);
}

/// The engine's speculation counters, and the acceptance rate and tokens per step made from them.
#[tokio::test]
async fn speculation_metrics() {
    let server = TestServer::open().await;
    let m = server.get("/metrics").await.text();
    assert_eq!(metric(&m, "tandem_spec_drafted_tokens_total"), 12.0);
    assert_eq!(metric(&m, "tandem_spec_accepted_tokens_total"), 9.0);
    assert_eq!(metric(&m, "tandem_spec_verify_steps_total"), 4.0);
    assert_eq!(metric(&m, "tandem_spec_decode_steps_total"), 10.0);
    assert_eq!(metric(&m, "tandem_spec_emitted_tokens_total"), 19.0);
    assert_eq!(metric(&m, "tandem_spec_acceptance_rate"), 0.75);
    assert_eq!(metric(&m, "tandem_spec_tokens_per_step"), 1.9);
}
