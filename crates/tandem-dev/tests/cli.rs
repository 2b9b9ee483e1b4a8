//! The `tandem-dev` binary as a developer runs it.

use std::process::{Command, Output};

fn tandem_dev(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tandem-dev"))
        .args(args)
        .output()
        .expect("run tandem-dev")
}

#[test]
fn bench_lists_what_it_times() {
    let out = tandem_dev(&["bench", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for what in [
        "kernels", "matvec", "flash", "gemm", "qmma", "dqmma", "l2", "handover", "latency",
    ] {
        assert!(help.contains(what), "{what} in {help}");
    }
    // Something must be asked for.
    assert!(!tandem_dev(&["bench"]).status.success());
}

/// Without a GPU a probe is a clear error and a non-zero exit, not a panic; with one it prints its
/// table.
#[test]
fn a_probe_without_a_gpu_is_a_clear_error() {
    let out = tandem_dev(&["bench", "handover"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    if out.status.success() {
        assert!(String::from_utf8_lossy(&out.stdout).contains("hand-over a step"));
    } else {
        assert!(err.contains("tandem-dev: error: CUDA unavailable"), "{err}");
    }
}
