//! Where a model runs: the device choice, made here once for every command that loads a model.
//!
//! A model file is first read into the CPU [`Model`] (its tokenizer, template and shape come from the
//! same mapping). [`DeviceModel::place`] then keeps it on the CPU or uploads it to a GPU
//! ([`load_cuda`], the one place a [`CudaModel`] is made). [`AnyEngine`] with [`on_engine!`] drives an
//! [`Engine`] on either; [`start_serving`] starts the serving engine on either.
//!
//! The crate sits above the engine and the backends (`tandem-engine` does not know `tandem-cuda`):
//! model, engine, cuda → runtime → cli.

use tandem_cuda::{CudaError, CudaModel, CudaOptions, ExpertOffload};
use tandem_engine::serve::{ServingConfig, ServingEngine};
use tandem_engine::Engine;
use tandem_model::{Model, ServingBackend};

/// Where a model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The CPU backend (the model's own thread pool).
    Cpu,
    /// GPU `gpu` through the CUDA backend. `deterministic`: the matvec route for every matmul, so
    /// logits are bit-identical across chunk sizes and batches (the CPU always is), with kernels fixed
    /// by weight type rather than by timings taken at load. `offload`: where a mixture's experts live
    /// (`--gpu-expert-budget` and the streaming flags).
    Cuda {
        gpu: usize,
        deterministic: bool,
        offload: ExpertOffload,
    },
}

/// Uploads `model`'s weights to GPU `gpu`, calling `progress(done, total)` (bytes) as it goes; the
/// CUDA model keeps `model` as its CPU oracle. The backend's switches (`CudaOptions`) are read from the
/// environment once, here, with the expert placement the command line gave (`offload`). A machine
/// without a GPU gets `CudaError::Unavailable`. The one place a `CudaModel` is made.
pub fn load_cuda(
    model: Model,
    gpu: usize,
    deterministic: bool,
    offload: ExpertOffload,
    progress: impl FnMut(usize, usize),
) -> Result<CudaModel, CudaError> {
    let options = CudaOptions {
        offload,
        ..CudaOptions::from_env()?
    };
    CudaModel::load(model, gpu, deterministic, options, progress)
}

/// A model on its device.
pub enum DeviceModel {
    Cpu(Box<Model>),
    Cuda(Box<CudaModel>),
}

impl DeviceModel {
    /// Puts `model` on `device`: as it is on the CPU, its weights uploaded on CUDA (`progress` is
    /// called only there). A GPU's context belongs to the thread that places the model on it.
    pub fn place(model: Model, device: Device, progress: impl FnMut(usize, usize)) -> Result<Self, CudaError> {
        Ok(match device {
            Device::Cpu => DeviceModel::Cpu(Box::new(model)),
            Device::Cuda {
                gpu,
                deterministic,
                offload,
            } => DeviceModel::Cuda(Box::new(load_cuda(model, gpu, deterministic, offload, progress)?)),
        })
    }

    /// The model as loaded from its file (the CUDA model keeps it as its CPU oracle).
    pub fn cpu_model(&self) -> &Model {
        match self {
            DeviceModel::Cpu(m) => m,
            DeviceModel::Cuda(m) => &m.cpu,
        }
    }

    /// An engine over the model, with fresh scratch.
    pub fn into_engine(self) -> AnyEngine {
        match self {
            DeviceModel::Cpu(m) => AnyEngine::Cpu(Box::new(Engine::new(*m))),
            DeviceModel::Cuda(m) => AnyEngine::Cuda(Box::new(Engine::new(*m))),
        }
    }
}

/// An engine on whichever device its model was placed.
pub enum AnyEngine {
    Cpu(Box<Engine>),
    Cuda(Box<Engine<CudaModel>>),
}

impl AnyEngine {
    /// The model as loaded from its file (the CUDA model keeps it as its CPU oracle).
    pub fn cpu_model(&self) -> &Model {
        match self {
            AnyEngine::Cpu(e) => &e.model,
            AnyEngine::Cuda(e) => &e.model.cpu,
        }
    }
}

/// A backend an [`AnyEngine`] can hold: generic code running on one (through [`on_engine!`]) takes a
/// second engine of the same backend out of an `AnyEngine` with it (a draft model beside its target).
pub trait EngineBackend: ServingBackend + Sized {
    /// The engine inside `engine` when it runs on this backend, else `engine` back.
    fn take_engine(engine: AnyEngine) -> Result<Engine<Self>, AnyEngine>;
}

impl EngineBackend for Model {
    fn take_engine(engine: AnyEngine) -> Result<Engine<Model>, AnyEngine> {
        match engine {
            AnyEngine::Cpu(e) => Ok(*e),
            other => Err(other),
        }
    }
}

impl EngineBackend for CudaModel {
    fn take_engine(engine: AnyEngine) -> Result<Engine<CudaModel>, AnyEngine> {
        match engine {
            AnyEngine::Cuda(e) => Ok(*e),
            other => Err(other),
        }
    }
}

/// Runs `$body` with `$e` bound to the `&mut Engine<_>` inside an `&mut AnyEngine`, whichever backend
/// it runs on (`$body` is compiled once per backend, so it may call generic code).
#[macro_export]
macro_rules! on_engine {
    ($engine:expr, |$e:ident| $body:expr) => {
        match $engine {
            $crate::AnyEngine::Cpu($e) => {
                let $e = &mut **$e;
                $body
            }
            $crate::AnyEngine::Cuda($e) => {
                let $e = &mut **$e;
                $body
            }
        }
    };
}

/// Runs `$body` with `$m` bound to the backend (`&Model` or `&CudaModel`) inside a `&DeviceModel`.
#[macro_export]
macro_rules! on_model {
    ($model:expr, |$m:ident| $body:expr) => {
        match $model {
            $crate::DeviceModel::Cpu($m) => {
                let $m = &**$m;
                $body
            }
            $crate::DeviceModel::Cuda($m) => {
                let $m = &**$m;
                $body
            }
        }
    };
}

/// `start_serving`'s `load` placed the model on another kind of device than it was asked for: a
/// caller's bug (the loop's backend type is chosen before the model exists), reported as an error.
#[derive(Debug)]
pub struct Misplaced {
    pub asked: Device,
}

impl std::fmt::Display for Misplaced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the model was placed on another device than {:?}", self.asked)
    }
}

impl std::error::Error for Misplaced {}

/// Starts the serving engine for `device`. Its loop thread runs `load`, which places the model
/// (`DeviceModel::place` with this `device`: a GPU's context belongs to the thread that made it) and
/// may check or warm it up; a load error, or a model placed elsewhere (`Misplaced`), comes back here.
pub fn start_serving<E: From<Misplaced> + Send + 'static>(
    device: Device,
    load: impl FnOnce() -> Result<DeviceModel, E> + Send + 'static,
    config: ServingConfig,
) -> Result<ServingEngine, E> {
    start_serving_with_draft(device, move || Ok((load()?, None)), false, config)
}

/// `start_serving`, where `load` also places a draft model on the same device (`has_draft`: it will)
/// for requests that speculate with one.
pub fn start_serving_with_draft<E: From<Misplaced> + Send + 'static>(
    device: Device,
    load: impl FnOnce() -> Result<(DeviceModel, Option<DeviceModel>), E> + Send + 'static,
    has_draft: bool,
    config: ServingConfig,
) -> Result<ServingEngine, E> {
    let misplaced = move || E::from(Misplaced { asked: device });
    match device {
        Device::Cpu => ServingEngine::start_with_draft(
            move || {
                let cpu = |m: DeviceModel| match m {
                    DeviceModel::Cpu(m) => Ok(*m),
                    DeviceModel::Cuda(_) => Err(misplaced()),
                };
                let (model, draft) = load()?;
                Ok((cpu(model)?, draft.map(cpu).transpose()?))
            },
            has_draft,
            config,
        ),
        Device::Cuda { .. } => ServingEngine::start_with_draft(
            move || {
                let cuda = |m: DeviceModel| match m {
                    DeviceModel::Cuda(m) => Ok(*m),
                    DeviceModel::Cpu(_) => Err(misplaced()),
                };
                let (model, draft) = load()?;
                Ok((cuda(model)?, draft.map(cuda).transpose()?))
            },
            has_draft,
            config,
        ),
    }
}
