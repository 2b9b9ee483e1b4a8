//! Clients that stall: the head, body and idle limits, the connection cap, and streams that outlive them.

use std::time::{Duration, Instant};

use serde_json::json;
use tandem_server::ServerConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::*;

const HEALTH: &[u8] = b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n";

fn limits(head_ms: u64, body_ms: u64, idle_ms: u64) -> ServerConfig {
    ServerConfig {
        head_timeout: Some(Duration::from_millis(head_ms)),
        body_timeout: Some(Duration::from_millis(body_ms)),
        idle_timeout: Some(Duration::from_millis(idle_ms)),
        ..config()
    }
}

/// Waits up to `secs` for the server to close the socket; returns what it sent before.
async fn closed_within(s: &mut TcpStream, secs: u64) -> Vec<u8> {
    let mut raw = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(secs), s.read_to_end(&mut raw)).await;
    assert!(
        read.is_ok(),
        "still open after {secs} s; got {:?}",
        String::from_utf8_lossy(&raw)
    );
    raw
}

/// Reads one response of a keep-alive connection (its body has a Content-Length).
async fn one_response(s: &mut TcpStream) -> Resp {
    let mut raw = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let r = parse_response(&raw);
            let len: usize = r.header("content-length").expect("a Content-Length").parse().unwrap();
            if raw.len() >= end + 4 + len {
                return r;
            }
        }
        let k = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .expect("a response within 5 s")
            .unwrap();
        assert!(
            k > 0,
            "closed before a whole response: {:?}",
            String::from_utf8_lossy(&raw)
        );
        raw.extend_from_slice(&buf[..k]);
    }
}

#[tokio::test]
async fn a_head_sent_a_byte_at_a_time_is_cut() {
    let server = TestServer::start(limits(300, 10_000, 10_000), Script::default()).await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let t0 = Instant::now();
    let head = b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let (mut rd, mut wr) = s.split();
    let drip = async {
        for b in head {
            if wr.write_all(&[*b]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        // Dripped for over 2 s without being cut.
        std::future::pending::<()>().await;
    };
    let mut raw = Vec::new();
    tokio::select! {
        _ = drip => unreachable!(),
        r = tokio::time::timeout(Duration::from_secs(2), rd.read_to_end(&mut raw)) => {
            assert!(r.is_ok(), "the slow head was not cut within 2 s");
        }
    }
    assert!(t0.elapsed() >= Duration::from_millis(250), "{:?}", t0.elapsed());
    assert!(raw.is_empty(), "{:?}", String::from_utf8_lossy(&raw));

    // A client that connects and sends nothing is a slow head too.
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let t0 = Instant::now();
    closed_within(&mut s, 2).await;
    assert!(t0.elapsed() >= Duration::from_millis(250));
}

#[tokio::test]
async fn a_body_shorter_than_its_length_gets_408() {
    let server = TestServer::start(limits(10_000, 300, 10_000), Script::default()).await;
    for path in ["/v1/completions", "/completion", "/tokenize"] {
        let mut s = TcpStream::connect(server.addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{{\""
        );
        s.write_all(head.as_bytes()).await.unwrap();
        let t0 = Instant::now();
        let raw = closed_within(&mut s, 3).await;
        assert!(t0.elapsed() >= Duration::from_millis(250), "{path}: {:?}", t0.elapsed());
        let e = parse_response(&raw).error(408);
        assert_eq!(e["code"], "request_timeout", "{path}: {e}");
        assert!(e["message"].as_str().unwrap().contains("300ms"), "{e}");
    }
    // A body that does arrive, slowly but within the limit, is served.
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    let body = br#"{"content": "ab"}"#;
    let head = format!(
        "POST /tokenize HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    for part in body.chunks(6) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        s.write_all(part).await.unwrap();
    }
    let r = parse_response(&closed_within(&mut s, 3).await);
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed() {
    // Idle (1.2 s) is longer than the head limit (300 ms): waiting between requests is not a slow head.
    let server = TestServer::start(limits(300, 10_000, 1200), Script::default()).await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(HEALTH).await.unwrap();
    assert_eq!(one_response(&mut s).await.status, 200);
    tokio::time::sleep(Duration::from_millis(700)).await;
    s.write_all(HEALTH).await.unwrap();
    assert_eq!(one_response(&mut s).await.status, 200);
    let t0 = Instant::now();
    let raw = closed_within(&mut s, 4).await;
    assert!(raw.is_empty());
    let idle = t0.elapsed();
    assert!(idle >= Duration::from_millis(1100), "closed after {idle:?}");

    // After a response, the next head's first byte starts the head limit.
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(HEALTH).await.unwrap();
    assert_eq!(one_response(&mut s).await.status, 200);
    s.write_all(b"GET /hea").await.unwrap();
    let t0 = Instant::now();
    closed_within(&mut s, 3).await;
    assert!(t0.elapsed() < Duration::from_millis(1000), "{:?}", t0.elapsed());
}

#[tokio::test]
async fn connections_over_the_cap_wait_for_a_free_one() {
    let cfg = ServerConfig {
        max_connections: Some(2),
        ..limits(10_000, 10_000, 10_000)
    };
    let server = TestServer::start(cfg, Script::default()).await;
    let mut first = TcpStream::connect(server.addr).await.unwrap();
    let mut second = TcpStream::connect(server.addr).await.unwrap();
    for s in [&mut first, &mut second] {
        s.write_all(HEALTH).await.unwrap();
        assert_eq!(one_response(s).await.status, 200);
    }
    // The third connects (the kernel's backlog holds it) but is not served while both are open.
    let mut third = TcpStream::connect(server.addr).await.unwrap();
    third.write_all(HEALTH).await.unwrap();
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(Duration::from_millis(400), third.read(&mut buf)).await;
    assert!(early.is_err(), "served over the cap: {early:?}");
    drop(first);
    assert_eq!(one_response(&mut third).await.status, 200);
    // The second is still served, on its own connection.
    second.write_all(HEALTH).await.unwrap();
    assert_eq!(one_response(&mut second).await.status, 200);
}

#[tokio::test]
async fn slow_streams_outlive_every_limit() {
    let script = Script {
        tokens: None,
        delay: Duration::from_millis(100),
        ..Default::default()
    };
    let server = TestServer::start(limits(200, 200, 200), script).await;
    let t0 = Instant::now();
    let body = json!({"prompt": "wxyz", "stream": true, "max_tokens": 8});
    let r = server.post_json("/v1/completions", &body).await;
    assert_eq!(r.status, 200);
    assert!(t0.elapsed() >= Duration::from_millis(700), "{:?}", t0.elapsed());
    assert_eq!(r.sse().last().unwrap(), "[DONE]");
    let chunks = r.sse_json();
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, "wxyzwxyz");

    let r = server.post_json("/completion", &body).await;
    let events = r.sse_json();
    assert_eq!(events.last().unwrap()["stop"], true);
    assert_eq!(events.last().unwrap()["stop_type"], "limit");

    // A slow generation answered whole is in flight too.
    let body = json!({"prompt": "wxyz", "max_tokens": 8});
    let r = server.post_json("/v1/completions", &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["text"], "wxyzwxyz");
}

#[tokio::test]
async fn shutdown_does_not_wait_for_idle_connections() {
    let mut server = TestServer::start(limits(10_000, 10_000, 60_000), Script::default()).await;
    let mut s = TcpStream::connect(server.addr).await.unwrap();
    s.write_all(HEALTH).await.unwrap();
    assert_eq!(one_response(&mut s).await.status, 200);
    let t0 = Instant::now();
    server.signal_shutdown();
    let result = tokio::time::timeout(Duration::from_secs(4), &mut server.task).await;
    assert!(matches!(result, Ok(Ok(Ok(())))), "{result:?}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    closed_within(&mut s, 2).await;
}
