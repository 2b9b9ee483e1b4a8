//! The GPU: context, one stream, a cuBLAS handle and the compiled kernels. Every CUDA call returns a
//! `CudaError` naming what failed; nothing here panics on a missing driver or device.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchArgs, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use crate::options::CudaOptions;
use crate::runtime::checked::driver;
use crate::runtime::ledger::KvLedger;
use crate::runtime::nvrtc;
use crate::runtime::programmatic;
use crate::runtime::trace;
use crate::CudaError;

pub struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) blas: CudaBlas,
    pub name: String,
    pub arch: String,
    /// Compute capability major version (9 on Hopper).
    pub major: i32,
    pub total_mem: usize,
    /// Streaming multiprocessors: persistent kernels size their grids by it.
    pub sm_count: u32,
    /// Device bytes of KV caches and checkpoints, and the serving budget that caps them.
    pub(crate) kv_ledger: Arc<KvLedger>,
    functions: HashMap<String, CudaFunction>,
    /// Set while a decode graph is captured with programmatic edges (`programmatic`).
    programmatic_capture: AtomicBool,
    modules: Vec<Arc<CudaModule>>,
    /// The switches this device was opened with, for the kernels and passes that ask.
    pub(crate) options: CudaOptions,
}

/// Lets kernel `name` (`f`) take `bytes` of dynamic shared memory: above 48 KiB a kernel must opt in.
pub(crate) fn allow_dynamic_shared(name: &str, f: &CudaFunction, bytes: usize) -> Result<(), CudaError> {
    driver(
        name,
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes as i32,
        ),
    )
}

impl Gpu {
    /// Opens GPU `ordinal`, compiling (or loading from the disk cache) every kernel for its arch
    /// (traced when `options.lab.trace` says so).
    pub fn new(ordinal: usize, options: CudaOptions) -> Result<Gpu, CudaError> {
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(CudaError::Unavailable(
                "no NVIDIA driver: libcuda.so was not found (is this a machine with an NVIDIA GPU?)".into(),
            ));
        }
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(CudaError::Unavailable(
                "cuBLAS (libcublas.so) was not found; add the CUDA toolkit's lib directory to LD_LIBRARY_PATH".into(),
            ));
        }
        let count = driver("cuDeviceGetCount", CudaContext::device_count())?;
        if count <= 0 {
            return Err(CudaError::Unavailable("the NVIDIA driver reports no GPU".into()));
        }
        if ordinal >= count as usize {
            return Err(CudaError::Unavailable(format!(
                "GPU {ordinal} asked for, {count} present"
            )));
        }
        let ctx = driver("cuCtxCreate", CudaContext::new(ordinal))?;
        // SAFETY: every buffer is used on this one stream (cuBLAS included) and freed in stream
        // order, so cudarc's per-buffer events (an event record per kernel argument) buy nothing.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own: the legacy default stream cannot be captured into a graph.
        let stream = driver("cuStreamCreate", ctx.new_stream())?;
        let blas = CudaBlas::new(stream.clone()).map_err(|e| CudaError::Blas {
            what: "cublasCreate".into(),
            err: format!("{e:?}"),
        })?;
        let (major, minor) = driver("compute capability", ctx.compute_capability())?;
        let arch = nvrtc::arch_name(major, minor);
        let name = driver("device name", ctx.name())?;
        let total_mem = driver("total memory", ctx.total_mem())?;
        let sm_count = driver(
            "multiprocessor count",
            ctx.attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        )?
        .max(1) as u32;
        let mut functions = HashMap::new();
        let mut modules = Vec::new();
        let trace = options.lab.trace.as_ref();
        for file in nvrtc::ALL {
            let bin = nvrtc::cubin(&file, &file.target(&arch), trace.is_some())?;
            let module = driver(&format!("load {}", file.name), ctx.load_module(Ptx::from_binary(bin)))?;
            for name in kernel_names(file.body) {
                let f = driver(&format!("load kernel {name}"), module.load_function(&name))?;
                functions.insert(name, f);
            }
            modules.push(module);
        }
        Ok(Gpu {
            ctx,
            stream,
            blas,
            name,
            arch,
            major,
            total_mem,
            sm_count,
            kv_ledger: Arc::default(),
            functions,
            programmatic_capture: AtomicBool::new(false),
            modules,
            options,
        })
    }

    /// Writes the kernel timeline where `options.lab.trace` says, when it is set: the path and the
    /// number of launches recorded.
    pub(crate) fn write_trace(&self) -> Option<Result<(PathBuf, usize), CudaError>> {
        let path = self.options.lab.trace.as_ref()?;
        Some(trace::dump(&self.modules, &self.stream, path).map(|n| (path.clone(), n)))
    }

    pub fn function(&self, name: &str) -> Result<&CudaFunction, CudaError> {
        self.functions.get(name).ok_or_else(|| CudaError::Driver {
            what: format!("kernel {name}"),
            err: "not in any compiled module".into(),
        })
    }

    /// A launch builder for our kernel `f` on the stream. During a programmatic capture the kernel
    /// it launches gets a programmatic edge from the kernel captured before it (`programmatic`);
    /// only our kernels start with WAIT_PRIOR_GRID(), so every launch of ours comes through here.
    pub(crate) fn launch_builder<'a>(&'a self, f: &'a CudaFunction) -> Result<LaunchArgs<'a>, CudaError> {
        if self.programmatic_capture.load(Ordering::Relaxed) {
            programmatic::link_next_launch(self.stream.cu_stream())?;
        }
        Ok(self.stream.launch_builder(f))
    }

    pub(crate) fn set_programmatic_capture(&self, on: bool) {
        self.programmatic_capture.store(on, Ordering::Relaxed);
    }

    pub fn alloc<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>, CudaError> {
        driver("cuMemAlloc", self.stream.alloc_zeros::<T>(n.max(1)))
    }

    /// Device memory left uninitialized, for outputs a kernel writes in full (no memset launch; the
    /// kernel checks poison outputs to prove every element is written).
    pub(crate) fn alloc_out<T: DeviceRepr>(&self, n: usize) -> Result<CudaSlice<T>, CudaError> {
        // SAFETY: callers only hand the buffer to kernels that write every element before any read.
        driver("cuMemAllocAsync", unsafe { self.stream.alloc::<T>(n.max(1)) })
    }

    pub fn upload<T: DeviceRepr>(&self, data: &[T]) -> Result<CudaSlice<T>, CudaError> {
        if data.is_empty() {
            return Err(CudaError::Driver {
                what: "upload".into(),
                err: "empty buffer".into(),
            });
        }
        driver("cuMemcpyHtoD", self.stream.clone_htod(data))
    }

    pub fn download<T: DeviceRepr + Default + Clone>(&self, data: &CudaSlice<T>) -> Result<Vec<T>, CudaError> {
        driver("cuMemcpyDtoH", self.stream.clone_dtoh(data))
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        driver("cuStreamSynchronize", self.stream.synchronize())
    }

    /// Free and total device memory, in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), CudaError> {
        driver("cuMemGetInfo", self.ctx.mem_get_info())
    }
}

/// The kernels an instantiation line `MACRO(args)` of `quant.cu` or `mmvq.cu` defines (`None` for any
/// other line; macro bodies end in a backslash, not a parenthesis).
fn instantiated(l: &str) -> Option<Vec<String>> {
    let (mac, rest) = l.split_once('(')?;
    let args: Vec<&str> = rest.strip_suffix(')')?.split(", ").collect();
    let pair = |single: &str, batched: &str, tail: String| vec![format!("{single}{tail}"), format!("{batched}{tail}")];
    Some(match (mac, &args[..]) {
        ("MATVEC", [t]) => ["matvec_", "matvecb_", "dequant_f16_", "embed_"]
            .iter()
            .map(|p| format!("{p}{t}"))
            .collect(),
        // MATVEC2_16(type, is_bf16): the warp-per-row family's streaming 16-bit kernels.
        ("MATVEC2", [t]) | ("MATVEC2_16", [t, _]) => pair("matvec2_", "matvec2b_", t.to_string()),
        ("MATVEC3", [t]) => pair("matvec3_", "matvec3b_", t.to_string()),
        // MMVQ(type, unroll, rows per group, warps per group): the integer kernels, one row, a batch
        // and routed experts' pairs, for each variant.
        ("MMVQ", [t, u, r, w]) => ["mmvq_", "mmvqb_", "mmvq_ids_"]
            .iter()
            .map(|p| format!("{p}{t}_u{u}_r{r}_s{w}"))
            .collect(),
        // MMVQ_STAGED(type, shared layout, unroll, rows per group): the staged one-row kernel and the
        // staged batch kernels of 2, 4 and 8 rows.
        ("MMVQ_STAGED", [t, _, u, r]) => ["p", "pb2", "pb4", "pb8"]
            .iter()
            .map(|k| format!("mmvq{k}_{t}_u{u}_r{r}_s1"))
            .collect(),
        // ATTEND_TILES(head size, blocks a multiprocessor): the tile attention kernels for one head
        // size, over the cache and with a decode step's own row fused in (one row, or a row of each
        // sequence of a batched step).
        ("ATTEND_TILES", [d, _]) => vec![
            format!("attend_tiles_d{d}"),
            format!("attend_rope_d{d}"),
            format!("attend_rope_rows_d{d}"),
        ],
        // ATTEND_ROPE_HEADS(head size, query heads a block): the fused decode kernel over several heads
        // of a group in a deep context, one row or a batch.
        ("ATTEND_ROPE_HEADS", [d, nh]) => vec![
            format!("attend_rope_h{nh}_d{d}"),
            format!("attend_rope_rows_h{nh}_d{d}"),
        ],
        // QMMA_Q4_K(batch tiles): the default mode's decode batches on the tensor cores.
        ("QMMA_Q4_K", [b]) => vec![format!("qmma_q4_k_b{b}")],
        // DQMMA_Q4_K(n-tiles, blocks a multiprocessor): decode batches past qmma's rows, f16 products over dequantized weights.
        ("DQMMA_Q4_K", [n, _]) => vec![format!("dqmma_q4_k_n{n}")],
        // FLASH_ENTRY(head size, key tile, m-tiles, r|s): the prefill attention variants.
        ("FLASH_ENTRY", [d, k, m, q]) => vec![format!("flash_prefill_d{d}_k{k}_m{m}_{q}")],
        // FLASH_WG_ENTRY(head size, key tile, warpgroups): the warpgroup variants (sm_90).
        ("FLASH_WG_ENTRY", [d, k, g]) => vec![format!("flash_prefill_d{d}_k{k}_m{g}_w")],
        _ => return None,
    })
}

/// The `extern "C" __global__` kernel names a source defines, with the macro instantiations expanded.
pub fn kernel_names(body: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in body.lines() {
        let l = line.trim_start();
        if let Some(kernels) = instantiated(l) {
            names.extend(kernels);
            continue;
        }
        // Macro bodies (continued lines) are templates, not kernels.
        if !l.starts_with("extern \"C\" __global__") || l.trim_end().ends_with('\\') {
            continue;
        }
        // The name is the identifier just before the first '(' once launch bounds are cut out.
        let l = match (l.find("__launch_bounds__("), l.find(") ")) {
            (Some(a), Some(b)) if b > a => format!("{}{}", &l[..a], &l[b + 1..]),
            _ => l.to_string(),
        };
        if let Some(open) = l.find('(') {
            let head = &l[..open];
            if let Some(name) = head.split_whitespace().last() {
                names.push(name.to_string());
            }
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_gpu_is_a_clear_error_not_a_panic() {
        // On CI (no driver) this must be `Unavailable`; on a GPU machine it opens the device.
        match Gpu::new(0, CudaOptions::default()) {
            Ok(g) => assert!(!g.name.is_empty()),
            Err(CudaError::Unavailable(why)) => assert!(!why.is_empty()),
            Err(e) => panic!("unexpected error kind: {e}"),
        }
    }
}
