//! Auth, and every bad input with its status; the server keeps serving after each.

use serde_json::json;
use tandem_engine::serve::SubmitError;

use crate::common::*;

async fn with_key(server: &TestServer, method: &str, path: &str, key: Option<&str>, body: Option<&str>) -> Resp {
    let auth = key.map(|k| format!("Bearer {k}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    request(server.addr, method, path, &headers, body).await
}

#[tokio::test]
async fn auth_with_keys() {
    let mut config = config();
    config.api_keys = vec!["user-key".into()];
    config.admin_keys = vec!["admin-key".into()];
    let server = TestServer::start(config, Script::default()).await;
    let body = r#"{"prompt": "hi", "max_tokens": 2}"#;
    for path in ["/v1/completions", "/completion"] {
        let e = with_key(&server, "POST", path, None, Some(body)).await.error(401);
        assert_eq!(e["type"], "authentication_error");
        with_key(&server, "POST", path, Some("nope"), Some(body))
            .await
            .error(401);
        with_key(&server, "POST", path, Some("user-key-"), Some(body))
            .await
            .error(401);
        assert_eq!(
            with_key(&server, "POST", path, Some("user-key"), Some(body))
                .await
                .status,
            200
        );
        // An admin key is an API key too.
        assert_eq!(
            with_key(&server, "POST", path, Some("admin-key"), Some(body))
                .await
                .status,
            200
        );
    }
    for path in ["/v1/models", "/metrics"] {
        with_key(&server, "GET", path, None, None).await.error(401);
        assert_eq!(with_key(&server, "GET", path, Some("user-key"), None).await.status, 200);
    }
    let r = request(
        server.addr,
        "GET",
        "/v1/models",
        &[("Authorization", "bearer user-key")],
        None,
    )
    .await;
    assert_eq!(r.status, 200, "the scheme is case-insensitive");
    assert_eq!(with_key(&server, "GET", "/health", None, None).await.status, 200);

    // Admin routes: admin key only.
    with_key(&server, "GET", "/slots", None, None).await.error(401);
    with_key(&server, "GET", "/slots", Some("wrong"), None).await.error(401);
    let e = with_key(&server, "GET", "/slots", Some("user-key"), None)
        .await
        .error(403);
    assert_eq!(e["type"], "permission_error");
    let r = with_key(&server, "GET", "/slots", Some("admin-key"), None).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["n_ctx"], N_CTX);
    assert_eq!(r.json()["kv_bytes_budget"], 1 << 20);
    let r = with_key(&server, "POST", "/admin/cache/flush", Some("admin-key"), None).await;
    assert_eq!(r.json(), json!({"flushed": 3}));
    with_key(&server, "POST", "/admin/cache/flush", Some("user-key"), None)
        .await
        .error(403);
}

#[tokio::test]
async fn auth_off() {
    let server = TestServer::open().await;
    assert_eq!(server.get("/v1/models").await.status, 200);
    assert_eq!(server.get("/metrics").await.status, 200);
    assert_eq!(server.post("/v1/completions", r#"{"prompt": "hi"}"#).await.status, 200);
    // No admin key configured: admin routes stay shut, whatever is sent.
    server.get("/slots").await.error(401);
    with_key(&server, "GET", "/slots", Some("anything"), None)
        .await
        .error(403);
    with_key(&server, "POST", "/admin/cache/flush", Some("x"), None)
        .await
        .error(403);
    // An empty key is no key.
    with_key(&server, "POST", "/admin/cache/flush", Some(""), None)
        .await
        .error(401);

    // Admin keys alone: the API is open, admin routes need the key.
    let mut config = config();
    config.admin_keys = vec!["root".into()];
    let server = TestServer::start(config, Script::default()).await;
    assert_eq!(server.get("/v1/models").await.status, 200);
    server.get("/slots").await.error(401);
    assert_eq!(with_key(&server, "GET", "/slots", Some("root"), None).await.status, 200);
}

#[tokio::test]
async fn bad_inputs() {
    let server = TestServer::open().await;
    let chat = "/v1/chat/completions";
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (chat, "{not json".into(), 400, ""),
        (chat, "".into(), 400, ""),
        (chat, r#"{"messages": "hi"}"#.into(), 400, "messages"),
        (
            chat,
            json!({"messages": msgs, "temperature": "hot"}).to_string(),
            400,
            "",
        ),
        (chat, json!({"messages": msgs, "max_tokens": -1}).to_string(), 400, ""),
        (chat, json!({"messages": []}).to_string(), 400, "messages"),
        (
            chat,
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).to_string(),
            400,
            "messages[0].content",
        ),
        (
            chat,
            json!({"messages": msgs, "model": "gpt-4"}).to_string(),
            404,
            "model",
        ),
        (chat, json!({"messages": msgs, "n": 2}).to_string(), 400, "n"),
        (
            chat,
            json!({"messages": msgs, "max_tokens": 101}).to_string(),
            400,
            "max_tokens",
        ),
        (
            chat,
            json!({"messages": msgs, "max_completion_tokens": 0}).to_string(),
            400,
            "max_completion_tokens",
        ),
        (chat, json!({"messages": msgs, "top_p": 1.5}).to_string(), 400, "top_p"),
        (
            chat,
            json!({"messages": msgs, "temperature": 1e40}).to_string(),
            400,
            "temperature",
        ),
        (
            chat,
            json!({"messages": msgs, "top_logprobs": 3}).to_string(),
            400,
            "top_logprobs",
        ),
        (
            chat,
            json!({"messages": msgs, "logprobs": true, "top_logprobs": 21}).to_string(),
            400,
            "top_logprobs",
        ),
        (
            "/v1/completions",
            json!({"prompt": ["a", "b"]}).to_string(),
            400,
            "prompt",
        ),
        ("/v1/completions", json!({"prompt": []}).to_string(), 400, "prompt"),
        (
            "/v1/completions",
            json!({"prompt": [1, 999999]}).to_string(),
            400,
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "echo": true}).to_string(),
            400,
            "echo",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "stop": 5}).to_string(),
            400,
            "",
        ),
        ("/completion", json!({"prompt": 5}).to_string(), 400, ""),
        (
            "/completion",
            json!({"prompt": "x", "n_predict": 1000}).to_string(),
            400,
            "n_predict",
        ),
        ("/tokenize", json!({"text": "x"}).to_string(), 400, ""),
    ];
    for (path, body, status, param) in cases {
        let e = server.post(path, &body).await.error(status);
        if !param.is_empty() {
            assert_eq!(e["param"], param, "{path} {body}: {e}");
        }
        if status == 404 {
            assert_eq!(e["code"], "model_not_found");
        }
    }

    // The prompt is longer than the context: both numbers in the message.
    let long = "x".repeat(N_CTX + 10);
    let e = server
        .post_json("/v1/completions", &json!({"prompt": long}))
        .await
        .error(400);
    let msg = e["message"].as_str().unwrap();
    assert!(
        msg.contains(&(N_CTX + 11).to_string()) && msg.contains(&N_CTX.to_string()),
        "{msg}"
    );
    assert_eq!(e["code"], "context_length_exceeded");

    // Over the body limit.
    let big = json!({"prompt": "y".repeat(5000)}).to_string();
    let e = server.post("/v1/completions", &big).await.error(413);
    assert_eq!(e["type"], "invalid_request_error");

    // Unknown route and wrong method: JSON errors too.
    server.get("/v2/nothing").await.error(404);
    server.get("/v1/chat/completions").await.error(405);

    // The queue is full.
    server.engine.set_script(Script {
        refuse: Some(SubmitError::QueueFull { queued: 8 }),
        ..Default::default()
    });
    let e = server.post_json(chat, &json!({"messages": msgs})).await.error(503);
    assert_eq!(e["code"], "queue_full");

    // And the server still serves.
    server.engine.set_script(Script {
        tokens: Some(server.ids("fine")),
        ..Default::default()
    });
    let r = server.post_json(chat, &json!({"messages": msgs})).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["choices"][0]["message"]["content"], "fine");
}

#[tokio::test]
async fn messages_state_the_rule() {
    let server = TestServer::open().await;
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let cases = [
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "temperature": -1}),
            "temperature",
            "temperature must be >= 0, got -1",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "top_p": 1.5}),
            "top_p",
            "top_p must be in [0, 1], got 1.5",
        ),
        (
            "/completion",
            json!({"prompt": "x", "repeat_penalty": 0}),
            "repeat_penalty",
            "repeat_penalty must be > 0, got 0",
        ),
        (
            "/completion",
            json!({"prompt": "x", "repeat_last_n": -2}),
            "repeat_last_n",
            "repeat_last_n must be >= -1, got -2",
        ),
    ];
    for (path, body, param, message) in cases {
        let e = server.post_json(path, &body).await.error(400);
        assert_eq!(e["param"], param, "{path} {body}: {e}");
        assert_eq!(e["message"], message, "{path} {body}");
    }
}

#[tokio::test]
async fn logit_bias_ids_must_be_in_the_vocabulary() {
    let server = TestServer::open().await;
    let n_vocab = server.tokenizer.n_vocab();
    let msgs = json!([{"role": "user", "content": "hi"}]);
    let out_of_vocab = [
        (
            "/v1/chat/completions",
            json!({"messages": msgs, "logit_bias": {"1000000000": 5}}),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logit_bias": {"1000000000": -5}}),
        ),
        ("/completion", json!({"prompt": "x", "logit_bias": [[1000000000, 1.0]]})),
        (
            "/completion",
            json!({"prompt": "x", "logit_bias": {"1000000000": false}}),
        ),
    ];
    for (path, body) in out_of_vocab {
        let e = server.post_json(path, &body).await.error(400);
        assert_eq!(e["param"], "logit_bias", "{path}: {e}");
        let message = e["message"].as_str().unwrap();
        assert!(
            message.contains("1000000000") && message.contains(&format!("{n_vocab} tokens")),
            "{path}: {message}"
        );
    }
    let e = server
        .post_json(
            "/v1/completions",
            &json!({"prompt": "x", "logit_bias": {(n_vocab).to_string(): 1}}),
        )
        .await
        .error(400);
    assert!(e["message"].as_str().unwrap().contains(&n_vocab.to_string()), "{e}");
    for bad in [
        json!({"65": 101}),
        json!({"x": 1}),
        json!({"-1": 1}),
        json!([[65, true]]),
    ] {
        let e = server
            .post_json("/v1/completions", &json!({"prompt": "x", "logit_bias": bad}))
            .await
            .error(400);
        assert_eq!(e["param"], "logit_bias", "{bad}: {e}");
    }
    assert_eq!(server.engine.submitted.lock().unwrap().len(), 0);

    // Ids in the vocabulary reach the engine, `false` as a ban.
    let last = n_vocab - 1;
    let r = server
        .post_json(
            "/v1/chat/completions",
            &json!({"messages": msgs, "logit_bias": {"65": -100, last.to_string(): 2.5}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let mut got = server.engine.last_request().sampling.logit_bias;
    got.sort_by_key(|&(id, _)| id);
    assert_eq!(got, vec![(65, -100.0), (last as u32, 2.5)]);
    let r = server
        .post_json(
            "/completion",
            &json!({"prompt": "x", "logit_bias": [[65, false], [66, 1.5]]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        server.engine.last_request().sampling.logit_bias,
        vec![(65, f32::NEG_INFINITY), (66, 1.5)]
    );
}
