//! Generations that fail after their stream started: every stream still ends the way its clients wait for.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::AsyncReadExt;

use crate::common::*;

fn failing(after: usize) -> Script {
    Script {
        fail_after: Some((after, "the device fell over".into())),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_failed_completion_stream_ends_with_stop() {
    let server = TestServer::start(config(), failing(3)).await;
    let r = server
        .post_json(
            "/completion",
            &json!({"prompt": "wxyz", "stream": true, "n_predict": 10}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let events = r.sse_json();
    let (last, pieces) = events.split_last().unwrap();
    assert!(pieces.iter().all(|e| e["stop"] == false && e.get("error").is_none()));
    let content: String = pieces.iter().filter_map(|e| e["content"].as_str()).collect();
    assert_eq!(content, "wxy");
    assert_eq!(last["stop"], true, "{last}");
    assert_eq!(last["stop_type"], "error");
    assert_eq!(last["tokens_predicted"], 3);
    assert_eq!(last["error"]["code"], "internal_error");
    assert_eq!(last["error"]["status"], 500);
    let message = last["error"]["message"].as_str().unwrap();
    assert!(message.contains("the device fell over"), "{message}");

    // Answered whole, the failure is a plain 500.
    let r = server
        .post_json("/completion", &json!({"prompt": "wxyz", "n_predict": 10}))
        .await;
    let e = r.error(500);
    assert!(e["message"].as_str().unwrap().contains("the device fell over"), "{e}");
}

#[tokio::test]
async fn failed_openai_streams_end_with_an_error_then_done() {
    let server = TestServer::start(config(), failing(2)).await;
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "stream": true, "max_tokens": 10});
    let completion = json!({"prompt": "wxyz", "stream": true, "max_tokens": 10});
    for (path, body) in [("/v1/chat/completions", chat), ("/v1/completions", completion)] {
        let r = server.post_json(path, &body).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let events = r.sse();
        assert_eq!(events.last().unwrap(), "[DONE]", "{path}");
        let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
        assert_eq!(error["error"]["code"], "internal_error", "{path}: {error}");
        assert!(error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("the device fell over"));
        // No chunk claims the generation finished normally.
        let chunks = r.sse_json();
        assert!(
            chunks.iter().all(|c| c["choices"][0]["finish_reason"].is_null()),
            "{path}"
        );
    }
}

#[tokio::test]
async fn a_completion_stream_cut_at_shutdown_ends_with_stop() {
    let mut config = config();
    config.shutdown_grace = Duration::from_millis(300);
    let script = Script {
        delay: Duration::from_millis(20),
        ..Default::default()
    };
    let mut server = TestServer::start(config, script).await;
    let body = json!({"prompt": "abcd", "stream": true, "n_predict": 100});
    let (mut socket, mut raw) = stream_until(server.addr, "/completion", &body, 2).await;
    server.signal_shutdown();
    tokio::time::timeout(Duration::from_secs(10), socket.read_to_end(&mut raw))
        .await
        .unwrap()
        .unwrap();
    let events = parse_response(&raw).sse_json();
    let last = events.last().unwrap();
    assert_eq!(last["stop"], true, "{last}");
    assert_eq!(last["error"]["code"], "shutting_down");
    assert_eq!(last["error"]["status"], 503);
}
