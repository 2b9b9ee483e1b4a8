//! Kernel sources and their run-time compilation.
//!
//! Each `.cu` file under `kernels/` is compiled on its own with `common.cuh` and its headers prepended
//! (NVRTC gets no include paths and no CUDA headers). NVRTC compiles for the detected architecture straight to a
//! cubin, which is cached on disk under a name made of the sha256 of the assembled source, the target
//! and the options, so a changed kernel or another GPU never reuses a stale binary.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::CudaError;

const COMMON: &str = include_str!("../kernels/common.cuh");

/// A header some kernel files share, after `common.cuh`: its name (for the assembled text) and body.
#[derive(Clone, Copy, Debug)]
pub struct Header {
    pub name: &'static str,
    pub body: &'static str,
}

/// The integer route's shared pieces (activation reads, scale decoding, the float steps), for the
/// matvecs and the tensor-core kernels alike.
pub const INT8: Header = Header {
    name: "int8.cuh",
    body: include_str!("../kernels/int8.cuh"),
};

/// One tile's sums and the in-order merge of a query's tiles, for every attention kernel.
pub const TILES: Header = Header {
    name: "tiles.cuh",
    body: include_str!("../kernels/tiles.cuh"),
};

/// Hopper's warpgroup products (`wgmma`), for files compiled with `arch_features`.
pub const WGMMA: Header = Header {
    name: "wgmma.cuh",
    body: include_str!("../kernels/wgmma.cuh"),
};

/// One compilation unit: a name (for logs and the cache), the headers it takes after `common.cuh`,
/// its body, and whether it uses features of one architecture only (`target`).
#[derive(Clone, Copy, Debug)]
pub struct KernelFile {
    pub name: &'static str,
    pub headers: &'static [Header],
    pub body: &'static str,
    pub arch_features: bool,
}

impl KernelFile {
    /// What NVRTC compiles this file for on a GPU of `arch`: Hopper's arch-specific target
    /// (`sm_90a`, which has `wgmma`) for files that use its features, else `arch` itself. An sm_90a
    /// binary runs only on sm_90 GPUs, which is where it is made.
    pub fn target(&self, arch: &str) -> String {
        if self.arch_features && arch == "sm_90" {
            "sm_90a".to_string()
        } else {
            arch.to_string()
        }
    }
}

pub const QUANT: KernelFile = KernelFile {
    name: "quant.cu",
    headers: &[],
    body: include_str!("../kernels/quant.cu"),
    arch_features: false,
};
pub const OPS: KernelFile = KernelFile {
    name: "ops.cu",
    headers: &[],
    body: include_str!("../kernels/ops.cu"),
    arch_features: false,
};
pub const ATTENTION: KernelFile = KernelFile {
    name: "attention.cu",
    headers: &[TILES],
    body: include_str!("../kernels/attention.cu"),
    arch_features: false,
};

/// The integer matvecs of decode (and of batched rows), their activation quantizers and repacks.
pub const MMVQ: KernelFile = KernelFile {
    name: "mmvq.cu",
    headers: &[INT8],
    body: include_str!("../kernels/mmvq.cu"),
    arch_features: false,
};

/// The integer matvecs' sums on the tensor cores, for deterministic prefill chunks.
pub const MMQ: KernelFile = KernelFile {
    name: "mmq.cu",
    headers: &[INT8],
    body: include_str!("../kernels/mmq.cu"),
    arch_features: false,
};

/// Decode batches on the tensor cores in default mode: the quantized weights read once for every row.
pub const QMMA: KernelFile = KernelFile {
    name: "qmma.cu",
    headers: &[INT8],
    body: include_str!("../kernels/qmma.cu"),
    arch_features: false,
};

/// Decode batches past qmma's rows: the quantized weights dequantized to f16 in registers, once for
/// every row, on the f16 tensor cores.
pub const DQMMA: KernelFile = KernelFile {
    name: "dqmma.cu",
    headers: &[INT8],
    body: include_str!("../kernels/dqmma.cu"),
    arch_features: false,
};

pub const FLASH: KernelFile = KernelFile {
    name: "flash.cu",
    headers: &[WGMMA],
    body: include_str!("../kernels/flash.cu"),
    arch_features: true,
};

pub const ALL: [KernelFile; 8] = [QUANT, MMVQ, MMQ, QMMA, DQMMA, OPS, ATTENTION, FLASH];

/// NVRTC options besides the architecture (no fast math: kernels round as written).
pub const OPTIONS: [&str; 2] = ["--std=c++17", "--fmad=true"];

/// The text NVRTC compiles for `file`: `common.cuh`, its headers, then its body.
pub fn assemble(file: &KernelFile) -> String {
    let mut text = format!("// ---- common.cuh ----\n{COMMON}\n");
    for h in file.headers {
        text.push_str(&format!("// ---- {} ----\n{}\n", h.name, h.body));
    }
    text.push_str(&format!("// ---- {} ----\n{}\n", file.name, file.body));
    text
}

/// `sm_90` for compute capability (9, 0).
pub fn arch_name(major: i32, minor: i32) -> String {
    format!("sm_{major}{minor}")
}

/// The cache file name of a compiled source: sha256 over source, arch and options.
pub fn cache_key(source: &str, arch: &str) -> String {
    let mut h = Sha256::new();
    h.update(source.as_bytes());
    h.update([0]);
    h.update(arch.as_bytes());
    for o in OPTIONS {
        h.update([0]);
        h.update(o.as_bytes());
    }
    let digest = h.finalize();
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// Where compiled kernels are kept: `$TANDEM_KERNEL_CACHE`, else `~/.cache/tandem/kernels`.
pub fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("TANDEM_KERNEL_CACHE") {
        return Some(PathBuf::from(d));
    }
    std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/tandem/kernels"))
}

/// `assemble` with the kernel timeline compiled in (`trace.rs`).
pub fn assemble_traced(file: &KernelFile) -> String {
    format!("#define TANDEM_TRACE 1\n{}", assemble(file))
}

/// The cubin for `file` on `arch` (with the kernel timeline when `traced`), from the disk cache or
/// compiled now (and then cached).
pub fn cubin(file: &KernelFile, arch: &str, traced: bool) -> Result<Vec<u8>, CudaError> {
    let source = if traced { assemble_traced(file) } else { assemble(file) };
    let key = cache_key(&source, arch);
    let path = cache_dir().map(|d| d.join(format!("{}-{arch}-{key}.cubin", file.name.trim_end_matches(".cu"))));
    if let Some(p) = &path {
        if let Ok(bytes) = std::fs::read(p) {
            if !bytes.is_empty() {
                return Ok(bytes);
            }
        }
    }
    let bin = compile(&source, file.name, arch)?;
    if let Some(p) = &path {
        // A cache that cannot be written only costs a recompile next time.
        if let Some(dir) = p.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        let tmp = p.with_extension("tmp");
        if std::fs::write(&tmp, &bin).is_ok() {
            let _ = std::fs::rename(&tmp, p);
        }
    }
    Ok(bin)
}

/// Compiles `source` to a cubin for `arch` with NVRTC.
pub fn compile(source: &str, name: &str, arch: &str) -> Result<Vec<u8>, CudaError> {
    use cudarc::nvrtc::{result, sys};
    use std::ffi::{CStr, CString};

    if !unsafe { sys::is_culib_present() } {
        return Err(CudaError::Unavailable(
            "NVRTC (libnvrtc.so) was not found; install the CUDA toolkit or add its lib directory to LD_LIBRARY_PATH"
                .into(),
        ));
    }
    let src = CString::new(source).map_err(|_| CudaError::Compile {
        file: name.into(),
        log: "source holds a NUL byte".into(),
    })?;
    let cname = CString::new(name).expect("kernel file names have no NUL");
    let prog = result::create_program(&src, Some(&cname)).map_err(|e| CudaError::Compile {
        file: name.into(),
        log: format!("nvrtcCreateProgram: {e:?}"),
    })?;
    let mut opts: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    opts.push(format!("--gpu-architecture={arch}"));
    let outcome = unsafe { result::compile_program(prog, &opts) };
    let out = match outcome {
        Ok(()) => unsafe {
            let mut size = 0usize;
            let r = sys::nvrtcGetCUBINSize(prog, &mut size);
            if r != sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                Err(CudaError::Compile {
                    file: name.into(),
                    log: format!("nvrtcGetCUBINSize: {r:?} (is {arch} a real architecture?)"),
                })
            } else {
                let mut buf = vec![0u8; size];
                let r = sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _);
                if r == sys::nvrtcResult::NVRTC_SUCCESS {
                    Ok(buf)
                } else {
                    Err(CudaError::Compile {
                        file: name.into(),
                        log: format!("nvrtcGetCUBIN: {r:?}"),
                    })
                }
            }
        },
        Err(e) => {
            let log = unsafe { result::get_program_log(prog) }
                .map(|raw| unsafe { CStr::from_ptr(raw.as_ptr()) }.to_string_lossy().into_owned())
                .unwrap_or_default();
            Err(CudaError::Compile {
                file: name.into(),
                log: format!("{e:?}\n{log}"),
            })
        }
    };
    let _ = unsafe { result::destroy_program(prog) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_is_assembled_with_the_common_header_first() {
        for f in ALL {
            let s = assemble(&f);
            let common_at = s.find("__device__ __forceinline__ float h2f").unwrap();
            let body_at = s.find(&f.body[..40]).unwrap();
            assert!(common_at < body_at, "{}", f.name);
            // Its headers in between.
            for h in f.headers {
                let at = s.find(&h.body[..40]).unwrap();
                assert!(common_at < at && at < body_at, "{} in {}", h.name, f.name);
            }
        }
        // The integer-route files share the header that holds the float steps of their sums.
        for f in [MMVQ, MMQ, QMMA] {
            assert!(assemble(&f).contains("float q4k_fold("), "{}", f.name);
        }
    }

    #[test]
    fn every_supported_weight_type_has_its_kernels() {
        for t in [
            "f32", "f16", "bf16", "q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q5_k", "q6_k",
        ] {
            assert!(QUANT.body.contains(&format!("MATVEC({t})")), "{t}");
            assert!(QUANT.body.contains(&format!("unit_{t}(")), "{t}");
        }
    }

    #[test]
    fn cache_key_changes_with_source_and_arch() {
        let s = assemble(&OPS);
        let k = cache_key(&s, "sm_90");
        assert_eq!(k, cache_key(&s, "sm_90"));
        assert_ne!(k, cache_key(&s, "sm_89"));
        assert_ne!(k, cache_key(&format!("{s} "), "sm_90"));
        assert_ne!(k, cache_key(&assemble_traced(&OPS), "sm_90"));
        assert_eq!(k.len(), 32);
    }

    #[test]
    fn arch_names_follow_compute_capability() {
        assert_eq!(arch_name(9, 0), "sm_90");
        assert_eq!(arch_name(8, 6), "sm_86");
    }

    #[test]
    fn only_files_with_arch_features_take_hopper_s_arch_specific_target() {
        assert_eq!(FLASH.target("sm_90"), "sm_90a");
        assert_eq!(FLASH.target("sm_89"), "sm_89");
        assert_eq!(OPS.target("sm_90"), "sm_90");
        // The warpgroup kernels are compiled only where their header's guard holds.
        assert!(assemble(&FLASH).contains("__CUDA_ARCH_FEAT_SM90_ALL"));
    }
}

/// Compiles every kernel file for sm_90 wherever NVRTC can be loaded (it needs no GPU). CI installs it
/// from PyPI and sets `TANDEM_REQUIRE_NVRTC`, so there a missing NVRTC fails; elsewhere the test says
/// so and checks that the error is the clear one.
#[cfg(test)]
mod compile_tests {
    use super::*;

    #[test]
    fn every_kernel_file_compiles_for_hopper() {
        for (f, source) in ALL.iter().flat_map(|f| [(f, assemble(f)), (f, assemble_traced(f))]) {
            match compile(&source, f.name, &f.target("sm_90")) {
                Ok(bin) => assert!(bin.len() > 1000, "{}: cubin of {} bytes", f.name, bin.len()),
                Err(CudaError::Unavailable(why)) => {
                    assert!(std::env::var_os("TANDEM_REQUIRE_NVRTC").is_none(), "{why}");
                    eprintln!("NVRTC not installed here, kernels not compiled: {why}");
                    assert!(why.contains("libnvrtc"));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
}
