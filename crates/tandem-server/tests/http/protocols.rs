//! HTTP/1.1 and HTTP/2 (h2c with prior knowledge) on the same port: the same routes, keys and answers.

use http_body_util::BodyExt;
use hyper::client::conn::http2;
use hyper::{Request, Version};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;

use crate::common::*;

/// (status, body) of one request over a new HTTP/2 connection, and the version hyper saw answered.
async fn h2(server: &TestServer, path: &str, key: Option<&str>, body: &str) -> (u16, Version, String) {
    let socket = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let (mut sender, conn) = http2::handshake(TokioExecutor::new(), TokioIo::new(socket))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = Request::post(format!("http://{}{path}", server.addr)).header("content-type", "application/json");
    if let Some(k) = key {
        req = req.header("authorization", format!("Bearer {k}"));
    }
    let response = sender.send_request(req.body(body.to_string()).unwrap()).await.unwrap();
    let (status, version) = (response.status().as_u16(), response.version());
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, version, String::from_utf8(bytes.to_vec()).unwrap())
}

#[tokio::test]
async fn http1_and_http2_clients_reach_the_same_server() {
    let mut config = config();
    config.api_keys = vec!["k".into()];
    let server = TestServer::start(config, Script::default()).await;
    let body = json!({"prompt": "hello", "max_tokens": 5, "temperature": 0}).to_string();
    let auth = [("Authorization", "Bearer k")];
    let h1 = request(server.addr, "POST", "/v1/completions", &auth, Some(&body)).await;
    assert_eq!(h1.status, 200, "{}", h1.text());
    let (status, version, text) = h2(&server, "/v1/completions", Some("k"), &body).await;
    assert_eq!((status, version), (200, Version::HTTP_2), "{text}");
    let (a, b): (serde_json::Value, serde_json::Value) = (h1.json(), serde_json::from_str(&text).unwrap());
    assert_eq!(a["choices"], b["choices"], "the same completion over either protocol");
    // The keys hold on HTTP/2 too.
    let (status, _, text) = h2(&server, "/v1/completions", None, &body).await;
    assert_eq!(status, 401, "{text}");
    let h1 = request(server.addr, "POST", "/v1/completions", &[], Some(&body)).await;
    assert_eq!(h1.status, 401);
}
