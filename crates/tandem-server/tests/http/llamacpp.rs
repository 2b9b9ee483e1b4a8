//! `/completion`, `/tokenize`, `/detokenize`, `/health`.

use serde_json::json;

use crate::common::*;

#[tokio::test]
async fn completion_plain() {
    let server = TestServer::open().await;
    server.engine.set_script(Script {
        tokens: Some(server.ids("one two\nthree")),
        reused: 1,
        ..Default::default()
    });
    let r = server
        .post_json(
            "/completion",
            &json!({"prompt": "Count:", "n_predict": 7, "temperature": 0.2, "top_k": 5, "repeat_penalty": 1.1, "repeat_last_n": -1}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["content"], "one two");
    assert_eq!(v["stop"], true);
    assert_eq!(v["stop_type"], "limit");
    assert_eq!(v["tokens_predicted"], 7);
    assert_eq!(v["tokens_evaluated"], 7); // BOS + "Count:"
    assert_eq!(v["timings"]["predicted_n"], 7);
    assert_eq!(v["timings"]["prompt_n"], 6);
    assert_eq!(v["timings"]["cache_n"], 1);
    assert!(v["timings"]["prompt_ms"].is_number() && v["timings"]["predicted_per_second"].is_number());
    assert_eq!(v["generation_settings"]["top_k"], 5);
    assert_eq!(v["tandem"]["prompt_cache"], "prompt 7 = 1 reused + 6 read");
    assert_eq!(r.header("x-tandem-prompt"), Some("prompt 7 = 1 reused + 6 read"));
    let req = server.engine.last_request();
    assert_eq!((req.sampling.temperature, req.sampling.top_k), (0.2, 5));
    assert_eq!(req.sampling.repeat_penalty, 1.1);
    assert_eq!(req.sampling.penalty_last_n, N_CTX);

    // A token-array prompt goes through as is; a stop word ends it.
    let r = server
        .post_json(
            "/completion",
            &json!({"prompt": [7, 8, 9], "stop": ["two"], "n_predict": -1}),
        )
        .await;
    let v = r.json();
    assert_eq!(server.engine.last_request().prompt, vec![7, 8, 9]);
    assert_eq!(server.engine.last_request().max_tokens, 100);
    assert_eq!(v["content"], "one ");
    assert_eq!(v["stop_type"], "word");
    assert_eq!(v["stopping_word"], "two");
}

#[tokio::test]
async fn completion_stream() {
    let server = TestServer::open().await;
    server.engine.set_script(Script {
        tokens: Some(server.ids("ñandú")),
        ..Default::default()
    });
    let r = server
        .post_json("/completion", &json!({"prompt": "x", "stream": true, "n_probs": 2}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(!r.sse().contains(&"[DONE]".to_string()));
    let chunks = r.sse_json();
    let (last, pieces) = chunks.split_last().unwrap();
    assert!(pieces.iter().all(|c| c["stop"] == false));
    let content: String = chunks.iter().filter_map(|c| c["content"].as_str()).collect();
    assert_eq!(content, "ñandú");
    assert!(pieces
        .iter()
        .all(|c| !c["content"].as_str().unwrap().contains('\u{fffd}')));
    let probs: Vec<_> = pieces
        .iter()
        .flat_map(|c| c["completion_probabilities"].as_array().unwrap().clone())
        .collect();
    assert_eq!(probs.len(), 7); // two-byte characters are two tokens each
    assert_eq!(probs[0]["top_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(last["stop"], true);
    assert_eq!(last["stop_type"], "eos");
    assert_eq!(last["tokens_predicted"], 7);
    assert!(last["timings"].is_object());
}

#[tokio::test]
async fn tokenize_and_detokenize() {
    let server = TestServer::open().await;
    let v = server.post_json("/tokenize", &json!({"content": "ab c"})).await.json();
    let ids: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
    assert_eq!(ids, server.ids("ab c"));
    let v = server
        .post_json("/tokenize", &json!({"content": "<|im_start|>x", "add_special": true}))
        .await
        .json();
    assert_eq!(v["tokens"], json!([BOS, 1, server.ids("x")[0]]));
    let v = server
        .post_json("/tokenize", &json!({"content": "é", "with_pieces": true}))
        .await
        .json();
    // Each byte of "é" is a token; neither is valid UTF-8 on its own.
    assert_eq!(v["tokens"][0]["piece"], json!([0xC3]));

    let v = server.post_json("/detokenize", &json!({"tokens": ids})).await.json();
    assert_eq!(v["content"], "ab c");
    let e = server
        .post_json("/detokenize", &json!({"tokens": [1, 100000]}))
        .await
        .error(400);
    assert!(e["message"].as_str().unwrap().contains("100000"));
    server
        .post_json("/detokenize", &json!({"tokens": [-1]}))
        .await
        .error(400);

    // A long text is encoded off the runtime's workers, with the same result.
    let mut config = config();
    config.max_body_bytes = 1 << 20;
    let server = TestServer::start(config, Script::default()).await;
    let long = "xy ".repeat(10_000);
    let v = server.post_json("/tokenize", &json!({"content": long})).await.json();
    assert_eq!(v["tokens"].as_array().unwrap().len(), server.ids(&long).len());
}

#[tokio::test]
async fn health_is_open_even_with_keys() {
    let mut config = config();
    config.api_keys = vec!["secret".into()];
    let server = TestServer::start(config, Script::default()).await;
    let r = server.get("/health").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"status": "ok"}));
}

/// Per-request speculative settings: tandem's `speculative` object on both routes and llama.cpp's
/// `speculative.n_max`, filled in from the server's; bad values are 400s naming the field.
#[tokio::test]
async fn speculative_settings_reach_the_engine() {
    use tandem_engine::spec::{SpecMode, SpecSettings};
    let server = TestServer::open().await;
    let lookup = |draft_max, adaptive| {
        Some(SpecSettings {
            mode: SpecMode::Lookup,
            draft_max,
            adaptive,
        })
    };
    server
        .post_json("/completion", &json!({"prompt": "Count:", "n_predict": 2}))
        .await;
    assert_eq!(
        server.engine.last_request().speculative,
        None,
        "not asked: the server's"
    );
    server
        .post_json(
            "/completion",
            &json!({"prompt": "Count:", "n_predict": 2, "speculative.n_max": 5}),
        )
        .await;
    assert_eq!(server.engine.last_request().speculative, lookup(5, true));
    server
        .post_json(
            "/completion",
            &json!({"prompt": "Count:", "n_predict": 2, "speculative.n_max": 0}),
        )
        .await;
    assert_eq!(
        server.engine.last_request().speculative.map(|s| s.mode),
        Some(SpecMode::Off)
    );
    let r = server
        .post_json(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                    "speculative": {"mode": "lookup", "n_max": 12, "adaptive": false}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(server.engine.last_request().speculative, lookup(12, false));
    server
        .post_json(
            "/v1/completions",
            &json!({"prompt": "Count:", "max_tokens": 2, "speculative": {}}),
        )
        .await;
    assert_eq!(
        server.engine.last_request().speculative,
        lookup(8, true),
        "the defaults"
    );

    for (route, body, param) in [
        (
            "/v1/completions",
            json!({"prompt": "x", "speculative": {"mode": "psychic"}}),
            "speculative.mode",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "speculative": {"n_max": 1000}}),
            "speculative.n_max",
        ),
        (
            "/completion",
            json!({"prompt": "x", "speculative.n_max": -1}),
            "speculative.n_max",
        ),
    ] {
        let e = server.post_json(route, &body).await.error(400);
        assert_eq!(e["param"], param, "{body}");
    }
    let e = server
        .post_json("/v1/completions", &json!({"prompt": "x", "speculative": {"draft": 3}}))
        .await
        .error(400);
    assert!(e["message"].as_str().unwrap().contains("draft"), "{e}");
}
