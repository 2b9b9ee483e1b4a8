//! What the tests on synthesized models share: `tandem synth` and the llama.cpp reference made from
//! its files (`tests/data/synthetic-parity.json`, by `scripts/synthetic_reference.py`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

pub fn reference() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/synthetic-parity.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("reference json")
}

/// One synthesized model of the reference, by name.
pub fn reference_model(name: &str) -> Value {
    reference()["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("no reference for {name}"))
        .clone()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The `tandem synth` arguments a reference model was made with.
pub fn synth_args(model: &Value) -> Vec<String> {
    model["synth"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

pub fn synth(args: &[String], out: &Path) {
    let status = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .arg("synth")
        .args(args)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", String::from_utf8_lossy(&status.stderr));
}

/// A scratch folder of this test process, for synthesized files.
pub fn scratch(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tandem-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A `tandem serve` child process on a loopback port, killed on drop.
pub struct Server {
    pub child: std::process::Child,
    pub port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `tandem serve --port <free port> <args…>` and waits until `up(port)` says it serves.
///
/// Up means answering HTTP, not merely accepting TCP: a bare connect can succeed before the server
/// serves (or, rarely, connect the probe to itself), and the first real request then fails.
pub fn serve(args: &[String], up: impl Fn(u16) -> bool) -> Server {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .arg("serve")
        .arg("--port")
        .arg(port.to_string())
        .args(args)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let server = Server { child, port };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !up(port) {
        assert!(std::time::Instant::now() < deadline, "the server did not come up");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    server
}
