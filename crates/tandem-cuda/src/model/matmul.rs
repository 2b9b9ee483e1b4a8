//! The CUDA backend's matmuls: the route each takes (`routes::matmul_route`), cuBLAS over the f16
//! copy for prefill, the matvec kernel chosen at load for decode, the tensor cores over the quantized
//! weights for decode batches, and one launch for a run of matrices reading the same quantized input.

use cudarc::driver::{CudaSlice, CudaView};
use tandem_model::weights::Matrix;
use tandem_model::ModelError;

use crate::matmul::dqmma::dqmma_group_into;
use crate::matmul::int8::{mmvq_group_into, mmvq_into, quantize_act_into, MmvqTarget};
use crate::matmul::kinds::ActQuant;
use crate::matmul::kinds::DecodeKernel;
use crate::matmul::qmma::qmma_group_into;
use crate::matmul::weights::{stacked_operand, GpuMatrix};
use crate::model::{CudaModel, GpuAct, Mode};
use crate::routes::{self, MatmulRoute};
use crate::runtime::launch::{gemm_f16_into, matvec_into, split_columns_into, splits_into, to_f16_into};
use crate::runtime::pool::DevBuf;
use crate::CudaError;

/// A matmul's shape in the op profile: "rows x cols type, t=rows of activations".
struct MatmulShape {
    rows: usize,
    cols: usize,
    suffix: &'static str,
    t: usize,
}

impl std::fmt::Display for MatmulShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{} {}, t={}", self.rows, self.cols, self.suffix, self.t)
    }
}

impl CudaModel {
    /// `out[t] = W16 · f16(x[t])` through cuBLAS (f32 accumulation). `x` is rounded to f16 once for
    /// all the GEMMs that read it.
    pub(crate) fn gemm(&self, w16: &CudaView<'_, u16>, x: &GpuAct, rows: usize) -> Result<GpuAct, CudaError> {
        let mut out = self.act(x.rows, rows)?;
        self.gemm_into_act(w16, x, &mut out).map(|()| out)
    }

    /// `gemm` into `out` (`x.rows` rows of `out.width`, the rows of `w16`).
    pub(crate) fn gemm_into_act(&self, w16: &CudaView<'_, u16>, x: &GpuAct, out: &mut GpuAct) -> Result<(), CudaError> {
        let (t, cols, rows) = (x.rows, x.width, out.width);
        let x16 = self.f16_operand(x)?;
        let done = gemm_f16_into(&self.gpu, w16, &x16, t, rows, cols, out.buf_mut()?);
        *x.f16.borrow_mut() = Some(x16);
        done
    }

    /// `x` rounded to f16, the GEMMs' operand: the form an earlier GEMM (or the kernel that made `x`)
    /// left in `x.f16`, else converted now. The caller puts it back for the next GEMM reading `x`.
    pub(crate) fn f16_operand(&self, x: &GpuAct) -> Result<DevBuf<u16>, CudaError> {
        if let Some(x16) = x.f16.borrow_mut().take() {
            return Ok(x16);
        }
        let n = x.rows * x.width;
        let mut x16 = self
            .buffers
            .u16_pool
            .take(&self.gpu, n, self.pass.mode.get() == Mode::Normal)?;
        to_f16_into(&self.gpu, &x.buf()?.as_view(), &mut x16, n)?;
        Ok(x16)
    }

    /// Quantizes `x` for integer kernels reading `fmt`, unless an earlier matmul already did.
    pub(crate) fn quantize_once(&self, x: &GpuAct, fmt: ActQuant) -> Result<(), CudaError> {
        if x.int8.borrow().iter().any(|(f, _)| *f == fmt) {
            return Ok(());
        }
        let may_allocate = self.pass.mode.get() == Mode::Normal;
        let mut a = self
            .buffers
            .u8_pool
            .take(&self.gpu, fmt.bytes(x.rows, x.width), may_allocate)?;
        self.profiled(format_args!("quantize {fmt:?} x{}", x.width), || {
            quantize_act_into(&self.gpu, fmt, x.buf()?, x.rows, x.width, &mut a)
        })?;
        x.int8.borrow_mut().push((fmt, a));
        Ok(())
    }

    /// Runs `f` on `x` quantized as `fmt` (quantizing it unless an earlier matmul did).
    pub(crate) fn with_quantized<T>(
        &self,
        x: &GpuAct,
        fmt: ActQuant,
        f: impl FnOnce(&CudaSlice<u8>) -> Result<T, CudaError>,
    ) -> Result<T, CudaError> {
        self.quantize_once(x, fmt)?;
        let cache = x.int8.borrow();
        let a = cache
            .iter()
            .find(|(f, _)| *f == fmt)
            .map(|(_, a)| a)
            .ok_or_else(|| CudaError::Driver {
                what: format!("activations quantized as {fmt:?}"),
                err: "missing after quantization".into(),
            })?;
        f(a)
    }

    /// The route `t` rows of `g` take (the GEMM only where it has an f16 copy).
    pub(crate) fn route(&self, g: &GpuMatrix, t: usize) -> MatmulRoute {
        match routes::matmul_route(t, self.routes.deterministic, g.decode_cublas, &g.batch) {
            MatmulRoute::Gemm if g.f16.is_none() => MatmulRoute::Matvec,
            r => r,
        }
    }

    /// Whether `t` rows of `g` take a kernel over its quantized weights that reads the activations
    /// as they are or quantized (the matvec, qmma); else one that reads them in f16 (cuBLAS over the
    /// f16 copy, or the dequantizing kernel over the quantized weights).
    pub(crate) fn takes_matvec(&self, g: &GpuMatrix, t: usize) -> bool {
        !matches!(self.route(g, t), MatmulRoute::Gemm | MatmulRoute::DequantMma)
    }

    /// Whether `t` rows of `g` take cuBLAS over its f16 copy.
    pub(crate) fn takes_gemm(&self, g: &GpuMatrix, t: usize) -> bool {
        self.route(g, t) == MatmulRoute::Gemm
    }

    /// `out[t] = W · f16(x[t])` for each matrix of `gs` (of one type and width, `rows` each) in one
    /// launch of the dequantizing tensor-core kernel, over the f16 operand the GEMMs read.
    fn dequant_mma(&self, gs: &[&GpuMatrix], rows: &[usize], x: &GpuAct) -> Result<Vec<GpuAct>, ModelError> {
        let (t, cols) = (x.rows, x.width);
        let mut outs = rows.iter().map(|&r| self.act(t, r)).collect::<Result<Vec<_>, _>>()?;
        let x16 = self.f16_operand(x)?;
        let total: usize = rows.iter().sum();
        let suffix = gs[0].suffix;
        let done = self.profiled(
            format_args!("dqmma {} matrices {total}x{cols} {suffix}, t={t}", gs.len()),
            || -> Result<(), CudaError> {
                let mut targets = gs
                    .iter()
                    .zip(rows)
                    .zip(outs.iter_mut())
                    .map(|((g, &rows), out)| {
                        Ok(MmvqTarget {
                            w: g.quantized.own()?,
                            rows,
                            out: out.buf_mut()?,
                        })
                    })
                    .collect::<Result<Vec<_>, CudaError>>()?;
                let mut scratch = self.buffers.dqmma_scratch.borrow_mut();
                dqmma_group_into(&self.gpu, suffix, &mut targets, &x16, t, cols, &mut scratch)
            },
        );
        *x.f16.borrow_mut() = Some(x16);
        done?;
        Ok(outs)
    }

    /// The quantized form the integer kernel of `reader` wants for `t` rows, when it takes that route
    /// (so the kernel producing its input can write it, saving a launch).
    pub(crate) fn int8_input(&self, reader: &str, t: usize) -> Option<ActQuant> {
        let g = self.weights.matrices.get(reader)?;
        match g.decode {
            DecodeKernel::Int8 { fmt, .. } if self.takes_matvec(g, t) => Some(fmt),
            _ => None,
        }
    }

    /// Whether `reader` takes the GEMM route for `t` rows (so the kernel producing its input can also
    /// write the f16 operand, saving a conversion).
    pub(crate) fn f16_input(&self, reader: &str, t: usize) -> bool {
        self.weights
            .matrices
            .get(reader)
            .is_some_and(|g| !self.takes_matvec(g, t))
    }

    /// `Backend::matmul`.
    pub(crate) fn matmul_rows(&self, m: &Matrix, x: &GpuAct) -> Result<GpuAct, ModelError> {
        let t = x.rows;
        if self.dry() {
            return Ok(self.act(t, m.rows)?);
        }
        let g = self.matrix(m)?;
        if self.route(g, t) == MatmulRoute::DequantMma {
            let [out] = tandem_model::graph::exactly(self.dequant_mma(&[g], &[m.rows], x)?)?;
            return Ok(out);
        }
        let shape = MatmulShape {
            rows: m.rows,
            cols: m.cols,
            suffix: g.suffix,
            t,
        };
        let out = match (self.takes_matvec(g, t), g.f16_view()?) {
            (false, Some(w16)) => self.profiled(format_args!("gemm {shape}"), || self.gemm(&w16, x, m.rows))?,
            _ => {
                let mut out = self.act(t, m.rows)?;
                match g.decode {
                    DecodeKernel::Float(family) => {
                        let buf = out.buf_mut()?;
                        self.profiled(format_args!("matvec {family:?} {shape}"), || {
                            matvec_into(
                                &self.gpu,
                                family,
                                g.suffix,
                                &g.quantized.view(),
                                x.buf()?,
                                t,
                                m.rows,
                                m.cols,
                                buf,
                            )
                        })?
                    }
                    DecodeKernel::Int8 { fmt, .. } if self.route(g, t) == MatmulRoute::QuantMma => {
                        let mut targets = [MmvqTarget {
                            w: g.quantized.own()?,
                            rows: m.rows,
                            out: out.buf_mut()?,
                        }];
                        self.with_quantized(x, fmt, |a| {
                            self.profiled(format_args!("qmma {shape}"), || {
                                qmma_group_into(&self.gpu, g.suffix, &mut targets, a, t, m.cols)
                            })
                        })?
                    }
                    DecodeKernel::Int8 { fmt, variant } => {
                        let variant = g.batch.matvec_variant(t, variant);
                        let buf = out.buf_mut()?;
                        self.with_quantized(x, fmt, |a| {
                            self.profiled(format_args!("matvec Int8 {shape}"), || {
                                mmvq_into(
                                    &self.gpu,
                                    g.suffix,
                                    variant,
                                    g.quantized.own()?,
                                    a,
                                    t,
                                    m.rows,
                                    m.cols,
                                    buf,
                                )
                            })
                        })?
                    }
                }
                out
            }
        };
        Ok(out)
    }

    /// The products of `ms` (matrices reading `x`) by one GEMM over their stacked f16 copies, cut
    /// into one activation a matrix (`split_columns`), where every member takes the GEMM route and
    /// `routes::stacked_gemm_and_split` picks it for these rows; `None`: take them one by one.
    fn stacked_gemm(&self, ms: &[&Matrix], gs: &[&GpuMatrix], x: &GpuAct) -> Result<Option<Vec<GpuAct>>, ModelError> {
        let t = x.rows;
        let widths: Vec<usize> = ms.iter().map(|m| m.rows).collect();
        let total: usize = widths.iter().sum();
        let Some(w16) = self.stacked_route(ms, gs, t) else {
            return Ok(None);
        };
        let cols = x.width;
        let names: Vec<&str> = ms
            .iter()
            .map(|m| m.name.rsplit('.').nth(1).unwrap_or(&m.name))
            .collect();
        let mut all = self.act(t, total)?;
        self.profiled(
            format_args!("gemm {} stacked {total}x{cols}, t={t}", names.join("+")),
            || self.gemm_into_act(&w16, x, &mut all),
        )?;
        let mut outs = ms.iter().map(|m| self.act(t, m.rows)).collect::<Result<Vec<_>, _>>()?;
        self.profiled("split_columns", || -> Result<(), CudaError> {
            let mut parts = outs
                .iter_mut()
                .zip(ms)
                .map(|(o, m)| Ok((o.buf_mut()?, m.rows)))
                .collect::<Result<Vec<_>, CudaError>>()?;
            split_columns_into(&self.gpu, all.buf()?, t, &mut parts)
        })?;
        Ok(Some(outs))
    }

    /// The stacked f16 operand of `gs` (matrices `ms` reading one input) when `t` rows of them take one
    /// GEMM whose product `split_columns` can cut: every member on the GEMM route, their operands
    /// adjacent, `routes::stacked_gemm_and_split` choosing it for these rows.
    pub(crate) fn stacked_route<'a>(
        &self,
        ms: &[&Matrix],
        gs: &[&'a GpuMatrix],
        t: usize,
    ) -> Option<CudaView<'a, u16>> {
        let widths: Vec<usize> = ms.iter().map(|m| m.rows).collect();
        if !splits_into(&widths) || !routes::stacked_gemm_and_split(t, self.routes.stacked_split_max_rows) {
            return None;
        }
        if !gs.iter().all(|g| self.takes_gemm(g, t)) {
            return None;
        }
        stacked_operand(gs)
    }

    /// `Backend::matmuls`.
    pub(crate) fn matmul_group(&self, ms: &[&Matrix], x: &GpuAct) -> Result<Vec<GpuAct>, ModelError> {
        let t = x.rows;
        if self.dry() || ms.len() < 2 {
            return ms.iter().map(|m| self.matmul_rows(m, x)).collect();
        }
        let gs = ms.iter().map(|m| self.matrix(m)).collect::<Result<Vec<_>, _>>()?;
        if let Some(outs) = self.stacked_gemm(ms, &gs, x)? {
            return Ok(outs);
        }
        // Members on the integer matvec route with one kernel, type and width share a launch; so do
        // members of one type and width on either tensor-core kernel over the quantized weights
        // (`None` in the key: any variant).
        let key = |j: usize| match (gs[j].decode, self.route(gs[j], t)) {
            (DecodeKernel::Int8 { fmt, .. }, r @ (MatmulRoute::QuantMma | MatmulRoute::DequantMma)) => {
                Some((r, fmt, None, gs[j].suffix, ms[j].cols))
            }
            (DecodeKernel::Int8 { fmt, variant }, MatmulRoute::Matvec) => Some((
                MatmulRoute::Matvec,
                fmt,
                Some(gs[j].batch.matvec_variant(t, variant)),
                gs[j].suffix,
                ms[j].cols,
            )),
            _ => None,
        };
        let mut outs: Vec<Option<GpuAct>> = ms.iter().map(|_| None).collect();
        for i in 0..ms.len() {
            if outs[i].is_some() {
                continue;
            }
            let members: Vec<usize> = match key(i) {
                Some(k) => (i..ms.len())
                    .filter(|&j| outs[j].is_none() && key(j) == Some(k))
                    .take(3)
                    .collect(),
                None => vec![i],
            };
            let Some((route, fmt, variant, suffix, cols)) = key(i).filter(|_| members.len() > 1) else {
                outs[i] = Some(self.matmul_rows(ms[i], x)?);
                continue;
            };
            if route == MatmulRoute::DequantMma {
                let member_gs: Vec<&GpuMatrix> = members.iter().map(|&j| gs[j]).collect();
                let rows: Vec<usize> = members.iter().map(|&j| ms[j].rows).collect();
                for (j, act) in members.into_iter().zip(self.dequant_mma(&member_gs, &rows, x)?) {
                    outs[j] = Some(act);
                }
                continue;
            }
            let mut acts = members
                .iter()
                .map(|&j| self.act(t, ms[j].rows))
                .collect::<Result<Vec<_>, _>>()?;
            let total: usize = members.iter().map(|&j| ms[j].rows).sum();
            self.with_quantized(x, fmt, |a| {
                let mut targets = members
                    .iter()
                    .zip(acts.iter_mut())
                    .map(|(&j, act)| {
                        Ok(MmvqTarget {
                            w: gs[j].quantized.own()?,
                            rows: ms[j].rows,
                            out: act.buf_mut()?,
                        })
                    })
                    .collect::<Result<Vec<_>, CudaError>>()?;
                let n = members.len();
                match variant {
                    Some(variant) => self.profiled(
                        format_args!("matvec Int8 {n} matrices {total}x{cols} {suffix}, t={t}"),
                        || mmvq_group_into(&self.gpu, suffix, variant, &mut targets, a, t, cols),
                    ),
                    None => self.profiled(format_args!("qmma {n} matrices {total}x{cols} {suffix}, t={t}"), || {
                        qmma_group_into(&self.gpu, suffix, &mut targets, a, t, cols)
                    }),
                }
            })?;
            for (j, act) in members.into_iter().zip(acts) {
                outs[j] = Some(act);
            }
        }
        outs.into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ModelError::Kernel("a grouped matmul left a product unmade".into()))
    }
}
