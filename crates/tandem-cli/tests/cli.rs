//! The `tandem` binary end to end: synth, inspect, tokenize, detokenize, pull (cached), errors.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn tandem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args(args)
        .output()
        .expect("run tandem")
}

fn ok(args: &[&str]) -> String {
    let out = tandem(args);
    assert!(
        out.status.success(),
        "tandem {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tandem-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn synth(dir: &Path, arch: &str, quant: &str, seed: u64, extra: &[&str]) -> PathBuf {
    let p = dir.join(format!("{arch}-{quant}-{seed}{}.gguf", extra.join("")));
    let seed = seed.to_string();
    let mut args = vec![
        "synth", "--arch", arch, "--shape", "tiny", "--quant", quant, "--seed", &seed, "-o",
    ];
    args.push(p.to_str().unwrap());
    args.extend_from_slice(extra);
    ok(&args);
    p
}

#[test]
fn synth_is_deterministic_and_loadable() {
    let dir = temp_dir("synth");
    for (arch, quant) in [
        ("llama", "q4_k_m"),
        ("gemma3", "q8_0"),
        ("llama", "f16"),
        ("gemma3", "q4_0"),
    ] {
        let a = synth(&dir, arch, quant, 7, &[]);
        let b_path = dir.join("again.gguf");
        ok(&[
            "synth",
            "--arch",
            arch,
            "--shape",
            "tiny",
            "--quant",
            quant,
            "--seed",
            "7",
            "-o",
            b_path.to_str().unwrap(),
        ]);
        let (bytes_a, bytes_b) = (std::fs::read(&a).unwrap(), std::fs::read(&b_path).unwrap());
        assert!(bytes_a == bytes_b, "{arch} {quant}: same seed, different bytes");
        let c = synth(&dir, arch, quant, 8, &[]);
        assert!(std::fs::read(&c).unwrap() != bytes_a, "{arch} {quant}: seed ignored");

        let file = tandem_gguf::GgufFile::open(&a).unwrap();
        assert_eq!(file.architecture().unwrap(), arch);
        let tok = tandem_tokenizer::Tokenizer::from_gguf(&file).unwrap();
        let ids = tok.encode("héllo", true, false);
        assert_eq!(tok.decode(&ids, false), "héllo");
        let info = ok(&["inspect", a.to_str().unwrap()]);
        assert!(
            info.contains("general.architecture") && info.contains("totals per type"),
            "{info}"
        );
    }
    // Norms near 1, matrices centred on 0.
    let file = tandem_gguf::GgufFile::open(synth(&dir, "gemma3", "f32", 1, &[])).unwrap();
    let (_, norm) = file.tensor("blk.0.attn_norm.weight").unwrap();
    let norm = tandem_quant::dequantize(tandem_gguf::GgmlType::F32, norm).unwrap();
    let mean = norm.iter().sum::<f32>() / norm.len() as f32;
    assert!((mean - 1.0).abs() < 0.05, "norm mean {mean}");
    let no_vocab = synth(&dir, "llama", "q8_0", 1, &["--no-vocab"]);
    let file = tandem_gguf::GgufFile::open(&no_vocab).unwrap();
    assert_eq!(file.get_str("tokenizer.ggml.model").unwrap(), Some("none"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_inputs_are_clear_errors() {
    let dir = temp_dir("errors");
    let junk = dir.join("junk.gguf");
    std::fs::write(&junk, b"GGUF\x03\0\0\0\xff\xff\xff\xff\xff\xff\xff\xff").unwrap();
    let out = tandem(&["inspect", junk.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("junk.gguf") && err.contains("kv_count at byte 16"),
        "{err}"
    );

    let out = tandem(&["inspect", "no-such-model"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("known"));
    let out = tandem(&["synth", "--arch", "llama", "--shape", "gemma3-27b", "-o", "/dev/null"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no shape"));
    let out = tandem(&[
        "synth",
        "--arch",
        "llama",
        "--shape",
        "tiny",
        "--quant",
        "q9_9",
        "-o",
        "/dev/null",
    ]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("unknown quantization"));
    std::fs::remove_dir_all(&dir).ok();
}

/// `--device cuda` on a machine without an NVIDIA driver (CI) is a one-line error and a non-zero exit,
/// never a panic from the dynamic loader; with a driver the tiny model runs.
#[test]
fn cuda_device_without_a_gpu_is_a_clear_error() {
    let dir = temp_dir("cuda");
    let model = synth(&dir, "llama", "q8_0", 5, &[]);
    let out = tandem(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "--device",
        "cuda",
        "-n",
        "2",
        "hi",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        assert!(err.contains("--device cuda: CUDA unavailable"), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // gpu-check prints its table whatever happens; a check it could not run (no GPU) is a failed row,
    // and any failed row makes the exit non-zero.
    let m = model.to_str().unwrap();
    let out = tandem(&[
        "gpu-check",
        "-m",
        m,
        "--prompt",
        "16",
        "--gen",
        "4",
        "--hash-prompt",
        "16",
    ]);
    let (table, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(table.contains("| check | result | pass |"), "{table}");
    assert!(!err.contains("panicked"), "{err}");
    if !out.status.success() {
        assert!(
            table.contains("| NO |") && err.contains("GPU checks failed"),
            "{table}\n{err}"
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `serve --device cuda` loads the model on the engine's thread; without a GPU the load error still
/// reaches the command line: one line, a non-zero exit, no panic. With a GPU it serves, and is stopped.
#[test]
fn serve_on_cuda_without_a_gpu_is_a_clear_error() {
    let dir = temp_dir("serve-cuda");
    let model = synth(&dir, "gemma3", "q8_0", 5, &[]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_tandem"))
        .args([
            "serve",
            "-m",
            model.to_str().unwrap(),
            "--device",
            "cuda",
            "--port",
            "0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tandem");
    let deadline = Instant::now() + Duration::from_secs(60);
    let exited = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(!err.contains("panicked"), "{err}");
    match exited {
        Some(status) => {
            assert!(!status.success(), "{err}");
            assert!(err.contains("tandem: error: --device cuda: CUDA unavailable"), "{err}");
            assert_eq!(err.trim().lines().count(), 1, "{err}");
        }
        // Still running at the deadline: only a GPU machine gets that far.
        None => assert!(err.contains("tandem: serving"), "neither served nor failed: {err}"),
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn tokenize_and_detokenize_the_real_models() {
    // `pull` of a cached model is instant (the README's test command pulled both already).
    let start = Instant::now();
    ok(&["pull", "gemma3-270m"]);
    ok(&["pull", "smollm2-135m"]);
    assert!(
        start.elapsed().as_secs_f64() < 5.0,
        "cached pull took {:?}",
        start.elapsed()
    );

    let ids = ok(&[
        "tokenize",
        "--model",
        "gemma3-270m",
        "--json",
        "The capital of France is",
    ]);
    assert_eq!(ids.trim(), "[2,818,5279,529,7001,563]");
    let ids = ok(&[
        "tokenize",
        "--model",
        "gemma3-270m",
        "--json",
        "--no-bos",
        "Hello world",
    ]);
    assert_eq!(ids.trim(), "[9259,1902]");
    let ids = ok(&[
        "tokenize",
        "--model",
        "smollm2-135m",
        "--json",
        "The capital of France is",
    ]);
    assert_eq!(ids.trim(), "[504,3575,282,4649,314]");
    let special = ok(&[
        "tokenize",
        "--model",
        "smollm2-135m",
        "--json",
        "--special",
        "<|im_start|>user",
    ]);
    assert!(special.trim().starts_with("[1,"), "{special}");
    let text = ok(&["detokenize", "--model", "gemma3-270m", "9259", "1902"]);
    assert_eq!(text.trim_end_matches('\n'), "Hello world");
    let out = tandem(&["detokenize", "--model", "gemma3-270m", "999999999"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("outside the vocabulary"));
}

/// `tandem bench` reports pp and tg rows as JSON; a prompt longer than `--ubatch` is read in several
/// forward passes, and an ubatch larger than the prompt is one pass.
#[test]
fn bench_reports_pp_and_tg_in_micro_batches() {
    let dir = temp_dir("bench");
    let model = synth(&dir, "llama", "q8_0", 3, &[]);
    let m = model.to_str().unwrap();
    for ubatch in ["16", "4096"] {
        let out = ok(&[
            "bench",
            "-m",
            m,
            "-p",
            "40",
            "-n",
            "3",
            "-r",
            "1",
            "--ubatch",
            ubatch,
            "--output-format",
            "json",
        ]);
        let rows: serde_json::Value = serde_json::from_str(&out).expect("bench prints JSON");
        let tests: Vec<&str> = rows
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["test"].as_str().unwrap())
            .collect();
        assert_eq!(tests, ["pp40", "tg3"], "{out}");
        assert!(rows[0]["tok_s"].as_f64().unwrap() > 0.0, "{out}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `tandem score` gives the same logits, bit for bit, at every CPU instruction-set level
/// (`TANDEM_CPU_ISA` caps the level; the default is the best this CPU has): on the two real models
/// and on synthesized ones of the other weight types, so a model's output does not depend on the
/// machine it runs on.
#[test]
fn score_has_the_same_bits_at_every_cpu_level() {
    let dir = temp_dir("levels");
    let prompt = dir.join("prompt.txt");
    std::fs::write(
        &prompt,
        "The capital of France is Paris. In 1905, Einstein published four papers",
    )
    .unwrap();
    let mut models = vec!["gemma3-270m".to_string(), "smollm2-135m".to_string()];
    for (arch, quant) in [
        ("llama", "q4_0"),
        ("gemma3", "q5_1"),
        ("llama", "q4_k_m"),
        ("gemma3", "f16"),
    ] {
        models.push(synth(&dir, arch, quant, 4, &[]).to_str().unwrap().to_string());
    }
    let score = |model: &str, level: Option<&str>| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tandem"));
        cmd.args([
            "score",
            "--model",
            model,
            "--prompt-file",
            prompt.to_str().unwrap(),
            "--json",
        ]);
        match level {
            Some(level) => cmd.env("TANDEM_CPU_ISA", level),
            None => cmd.env_remove("TANDEM_CPU_ISA"),
        };
        let out = cmd.output().expect("run tandem");
        assert!(
            out.status.success(),
            "score {model} at {level:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("score json");
        json["logits_sha256"].as_str().expect("logits_sha256").to_string()
    };
    for model in &models {
        let best = score(model, None);
        for level in ["avx2", "scalar"] {
            assert_eq!(
                score(model, Some(level)),
                best,
                "{model}: {level} against the best level"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `--spec` on `run` and `bench`: lookup and a draft model (the file drafting for itself) give the
/// same completion as no drafts, on a llama and a Gemma 3 (rings) file; `bench --prompt-file` reports
/// the acceptance; wrong combinations are clear errors.
#[test]
fn speculative_flags_keep_the_output() {
    let dir = temp_dir("spec");
    let prompt = dir.join("prompt.txt");
    std::fs::write(
        &prompt,
        "one two three four one two three four one two three four one two",
    )
    .unwrap();
    let p = prompt.to_str().unwrap();
    for arch in ["llama", "gemma3"] {
        let model = synth(&dir, arch, "q8_0", 5, &[]);
        let m = model.to_str().unwrap();
        let run = |extra: &[&str]| -> serde_json::Value {
            let mut args = vec![
                "run",
                "-m",
                m,
                "-n",
                "24",
                "--prompt-file",
                p,
                "--output-format",
                "json",
            ];
            args.extend_from_slice(extra);
            serde_json::from_str(ok(&args).trim()).expect("run prints JSON")
        };
        let plain = run(&[]);
        assert!(plain["speculative"].is_null());
        for extra in [
            &["--spec", "lookup"][..],
            &["--spec", "lookup", "--draft-max", "3", "--draft-fixed"],
            &["--spec", "draft", "--draft-model", m, "--draft-max", "4"],
        ] {
            let got = run(extra);
            assert_eq!(got["completion_ids"], plain["completion_ids"], "{arch} {extra:?}");
            assert!(got["speculative"]["steps"].as_u64().unwrap() > 0, "{got}");
        }
        let self_draft = run(&[
            "--spec",
            "draft",
            "--draft-model",
            m,
            "--draft-fixed",
            "--draft-max",
            "4",
        ]);
        assert_eq!(
            self_draft["speculative"]["acceptance"], 1.0,
            "{arch}: a model agrees with itself: {self_draft}"
        );
        let out = ok(&[
            "bench",
            "-m",
            m,
            "-p",
            "0",
            "-n",
            "16",
            "-r",
            "1",
            "--prompt-file",
            p,
            "--spec",
            "lookup",
            "--output-format",
            "json",
        ]);
        let rows: serde_json::Value = serde_json::from_str(&out).expect("bench prints JSON");
        assert_eq!(rows[0]["test"], "tg16 @ prompt.txt spec lookup", "{out}");
        assert!(rows[0]["tokens_per_step"].as_f64().unwrap() >= 1.0, "{out}");
    }
    let m = synth(&dir, "llama", "q8_0", 5, &[]);
    let m = m.to_str().unwrap();
    for (args, says) in [
        (vec!["run", "-m", m, "--spec", "draft", "x"], "--draft-model"),
        (vec!["run", "-m", m, "--draft-model", m, "x"], "--spec draft"),
        (
            vec!["run", "-m", m, "--spec", "lookup", "--draft-max", "0", "x"],
            "draft length",
        ),
        (
            vec!["run", "-m", m, "--spec", "guess", "x"],
            "expected off, lookup or draft",
        ),
        (vec!["bench", "-m", m, "--spec", "lookup"], "--prompt-file"),
    ] {
        let out = tandem(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{args:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}
