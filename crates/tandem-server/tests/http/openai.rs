//! `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

use serde_json::{json, Value};

use crate::common::*;

fn chat_body(extra: Value) -> Value {
    let mut body = json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

#[tokio::test]
async fn chat_completion() {
    let server = TestServer::open().await;
    let tokens = server.script_text("Hello there!", Some(IM_END));
    server.engine.set_script(Script {
        tokens: Some(tokens),
        reused: 4,
        ..Default::default()
    });
    let r = server
        .post_json(
            "/v1/chat/completions",
            &chat_body(json!({"temperature": 0.5, "top_k": 7, "top_p": 0.9, "seed": 42, "max_tokens": 50})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(
        choice["message"],
        json!({"role": "assistant", "content": "Hello there!"})
    );
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(choice["logprobs"], Value::Null);

    // The prompt: the template's BOS, not doubled by the tokenizer's; the sampling as asked.
    let req = server.engine.last_request();
    let expected = server.tokenizer.encode(
        "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
        false,
        true,
    );
    assert_eq!(req.prompt, expected);
    assert_eq!(req.prompt.iter().filter(|&&t| t == BOS).count(), 1);
    assert_eq!(req.max_tokens, 50);
    assert!(req.stop_ids.contains(&IM_END));
    assert_eq!(
        (req.sampling.temperature, req.sampling.top_k, req.sampling.top_p),
        (0.5, 7, 0.9)
    );
    assert_eq!(req.sampling.seed, 42);
    assert_eq!(req.top_logprobs, None);

    let n = req.prompt.len();
    let usage = &v["usage"];
    assert_eq!(usage["prompt_tokens"], n);
    assert_eq!(usage["completion_tokens"], 13);
    assert_eq!(usage["total_tokens"], n + 13);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 4);
    let line = format!("prompt {n} = 4 reused + {} read", n - 4);
    assert_eq!(r.header("x-tandem-prompt"), Some(line.as_str()));
    assert_eq!(v["tandem"]["prompt_cache"], line);
}

#[tokio::test]
async fn chat_stream_with_usage() {
    let server = TestServer::open().await;
    let tokens = server.script_text("Hi, café!", Some(IM_END));
    server.engine.set_script(Script {
        tokens: Some(tokens),
        ..Default::default()
    });
    let r = server
        .post_json(
            "/v1/chat/completions",
            &chat_body(json!({"stream": true, "stream_options": {"include_usage": true}})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
    assert!(r.header("x-tandem-prompt").unwrap().starts_with("prompt "));
    let events = r.sse();
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks = r.sse_json();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    // Byte tokens split "é"; no broken UTF-8 is ever sent.
    assert_eq!(content, "Hi, café!");
    let finish: Vec<&Value> = chunks
        .iter()
        .filter(|c| !c["choices"][0]["finish_reason"].is_null())
        .collect();
    assert_eq!(finish.len(), 1);
    assert_eq!(finish[0]["choices"][0]["finish_reason"], "stop");
    assert!(finish[0]["tandem"]["prompt_cache"].is_string());
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"]["completion_tokens"], 11);
    assert_eq!(last["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert!(chunks[..chunks.len() - 1].iter().all(|c| c["usage"].is_null()));
}

#[tokio::test]
async fn completions_plain_and_streamed() {
    let server = TestServer::open().await;
    server.engine.set_script(Script {
        tokens: Some(server.ids("The quiz is 42.")),
        ..Default::default()
    });
    let r = server
        .post_json("/v1/completions", &json!({"prompt": "Q?", "max_tokens": 5}))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], "The q");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(
        server.engine.last_request().prompt,
        vec![BOS, server.ids("Q")[0], server.ids("?")[0]]
    );

    let r = server
        .post_json(
            "/v1/completions",
            &json!({"prompt": [[5, 6]], "stream": true, "max_tokens": 100}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(server.engine.last_request().prompt, vec![5, 6]);
    assert_eq!(r.sse().last().unwrap(), "[DONE]");
    let chunks = r.sse_json();
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, "The quiz is 42.");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert!(last["tandem"]["prompt_cache"]
        .as_str()
        .unwrap()
        .starts_with("prompt 2 = 0 reused + 2 read"));
}

#[tokio::test]
async fn models_lists_the_served_model() {
    let server = TestServer::open().await;
    let v = server.get("/v1/models").await.json();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], MODEL);
    assert_eq!(v["data"][0]["object"], "model");
    assert_eq!(v["data"][0]["max_model_len"], N_CTX);
}

#[tokio::test]
async fn logprobs_shapes() {
    let server = TestServer::open().await;
    server.engine.set_script(Script {
        tokens: Some(server.script_text("abc", Some(IM_END))),
        ..Default::default()
    });
    let body = chat_body(json!({"logprobs": true, "top_logprobs": 2}));
    let v = server.post_json("/v1/chat/completions", &body).await.json();
    assert_eq!(server.engine.last_request().top_logprobs, Some(2));
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    // "ab" is one merged token, "c" another; the end-of-turn token is not listed.
    assert_eq!(content.len(), 2, "{v}");
    assert_eq!(content[0]["token"], "ab");
    assert_eq!(content[0]["bytes"], json!([97, 98]));
    assert_eq!(content[0]["logprob"], -0.25);
    assert_eq!(content[1]["token"], "c");
    for c in content {
        let top = c["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert!(top[0]["token"].is_string() && top[0]["logprob"].is_number() && top[0]["bytes"].is_array());
    }

    // Streamed: each chunk carries the logprobs of its text.
    let body = chat_body(json!({"logprobs": true, "top_logprobs": 1, "stream": true}));
    let chunks = server.post_json("/v1/chat/completions", &body).await.sse_json();
    let tokens: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .map(|e| e["token"].clone())
        .collect();
    assert_eq!(tokens, vec![json!("ab"), json!("c")]);

    // Completions: the legacy parallel lists.
    let v = server
        .post_json("/v1/completions", &json!({"prompt": "x", "logprobs": 3}))
        .await
        .json();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!(["ab", "c"]));
    assert_eq!(lp["token_logprobs"], json!([-0.25, -0.5]));
    assert_eq!(lp["text_offset"], json!([0, 2]));
    assert_eq!(lp["top_logprobs"].as_array().unwrap().len(), 2);
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 3);
}

#[tokio::test]
async fn stop_strings_across_tokens() {
    let server = TestServer::open().await;
    // Every byte its own token: "STOP" spans four tokens.
    server.engine.set_script(Script {
        tokens: Some(server.ids("Hello STOP world, héllo")),
        delay: std::time::Duration::from_millis(5),
        ..Default::default()
    });
    let body = |stream: bool| chat_body(json!({"stop": ["zzz", "STOP"], "stream": stream}));
    let v = server.post_json("/v1/chat/completions", &body(false)).await.json();
    assert_eq!(v["choices"][0]["message"]["content"], "Hello ");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // The match dropped the receiver: the engine saw the cancellation.
    assert!(eventually(5, || server.engine.cancelled() == 1).await);

    let r = server.post_json("/v1/chat/completions", &body(true)).await;
    let chunks = r.sse_json();
    let deltas: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(deltas.concat(), "Hello ");
    assert!(deltas.iter().all(|d| !d.contains('S')), "{deltas:?}");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "stop");

    // A multi-byte stop string, and a partial match that is released when it fails.
    let v = server
        .post_json(
            "/v1/completions",
            &json!({"prompt": "x", "stop": "é", "max_tokens": 100}),
        )
        .await
        .json();
    assert_eq!(v["choices"][0]["text"], "Hello STOP world, h");
    let v = server
        .post_json(
            "/v1/completions",
            &json!({"prompt": "x", "stop": "STOX", "max_tokens": 100}),
        )
        .await
        .json();
    assert_eq!(v["choices"][0]["text"], "Hello STOP world, héllo");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}
