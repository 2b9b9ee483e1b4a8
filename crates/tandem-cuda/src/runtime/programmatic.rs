//! Programmatic dependent launch for captured decode graphs (sm_90+).
//!
//! A decode step is a chain of about 400 small kernels. Between two of them the GPU drains the first
//! grid, then launches and ramps up the second: a few microseconds each time, with the weights idle.
//! A programmatic edge lets the second grid launch as soon as every block of the first has started
//! (the kernel node's launch-order port); its blocks then sit in `WAIT_PRIOR_GRID()` (`common.cuh`,
//! the first memory-touching statement of every Tandem kernel) until the first grid has finished and
//! its writes are visible. So the work and its order are unchanged, and only the launch overlaps.
//!
//! The edges are made while capturing: just before each of our launches (`Gpu::launch_builder`), the
//! capture's one pending dependency, when it is a kernel, is re-declared as programmatic. A cuBLAS
//! kernel does not wait, so edges into it stay full dependencies. `TANDEM_CUDA_PDL=0` turns it off.

use std::ptr;

use cudarc::driver::sys::{
    self, CUgraphDependencyType, CUgraphEdgeData, CUgraphNode, CUgraphNodeType, CUresult, CUstream,
    CUstreamCaptureStatus, CUstreamUpdateCaptureDependencies_flags,
};

use crate::CudaError;

/// Whether decode graphs get programmatic edges on a GPU of compute capability `major`, with the
/// switch (`CudaOptions::pdl`) at `on`.
pub(crate) fn wanted(major: i32, on: bool) -> bool {
    major >= 9 && on
}

fn check(what: &str, r: CUresult) -> Result<(), CudaError> {
    if r == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver {
            what: what.into(),
            err: format!("{r:?}"),
        })
    }
}

/// The edge data of a programmatic edge leaving a kernel's launch-order port.
fn programmatic_edge() -> CUgraphEdgeData {
    CUgraphEdgeData {
        from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER as u8,
        to_port: 0,
        type_: CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
        reserved: [0; 5],
    }
}

/// Whether the next launch may hang off the capture's pending dependencies programmatically: one
/// dependency, a kernel, joined by a full edge (a memcpy, a memset or a fork stays as captured).
pub(crate) fn may_link(deps: usize, dep_is_kernel: bool, edge: CUgraphEdgeData) -> bool {
    deps == 1 && dep_is_kernel && edge.type_ == CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_DEFAULT as u8
}

/// Makes the edge into the next node captured on `stream` (one of our kernels) programmatic, where
/// `may_link` allows; outside a capture it does nothing.
pub(crate) fn link_next_launch(stream: CUstream) -> Result<(), CudaError> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut deps: *const CUgraphNode = ptr::null();
    let mut data: *const CUgraphEdgeData = ptr::null();
    let mut n = 0usize;
    // SAFETY: out-pointers to locals; the arrays returned stay valid until the next capture call on
    // this stream, and are read before it.
    unsafe {
        check(
            "cuStreamGetCaptureInfo",
            sys::cuStreamGetCaptureInfo_v3(
                stream,
                &mut status,
                ptr::null_mut(),
                ptr::null_mut(),
                &mut deps,
                &mut data,
                &mut n,
            ),
        )?;
        if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE || n != 1 || deps.is_null() {
            return Ok(());
        }
        let mut dep = *deps;
        let edge = if data.is_null() { std::mem::zeroed() } else { *data };
        let mut ty = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
        check("cuGraphNodeGetType", sys::cuGraphNodeGetType(dep, &mut ty))?;
        if !may_link(n, ty == CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL, edge) {
            return Ok(());
        }
        let linked = programmatic_edge();
        check(
            "cuStreamUpdateCaptureDependencies (programmatic)",
            sys::cuStreamUpdateCaptureDependencies_v2(
                stream,
                &mut dep,
                &linked,
                1,
                CUstreamUpdateCaptureDependencies_flags::CU_STREAM_SET_CAPTURE_DEPENDENCIES as u32,
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lone_kernel_dependency_joined_by_a_full_edge_is_linked() {
        let full: CUgraphEdgeData = unsafe { std::mem::zeroed() };
        assert!(may_link(1, true, full));
        assert!(!may_link(1, false, full), "a memcpy or memset before");
        assert!(!may_link(2, true, full), "a join of two branches");
        assert!(!may_link(0, true, full), "the capture's first node");
        assert!(!may_link(1, true, programmatic_edge()), "already linked");
    }

    #[test]
    fn the_linked_edge_leaves_the_launch_order_port() {
        let e = programmatic_edge();
        assert_eq!(e.from_port as u32, sys::CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER);
        assert_eq!(
            e.type_,
            CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8
        );
    }

    /// Device functions that are a whole kernel's body and wait inside, after their row target and
    /// first weight loads; the statements allowed before their WAIT_PRIOR_GRID(): declarations,
    /// register arithmetic, and loads of weights (which no kernel writes).
    const WAITING_BODIES: [(&str, &[&str]); 5] = [
        (
            // The routed experts' products: nothing but registers before the wait, since the expert
            // ids (so which weights) are the kernel before's output.
            "void mmvq_ids(",
            &[
                "int p = blockIdx.y;",
                "WarpRow<1> m[R];",
                "m[0].lane = threadIdx.x & 31;",
                "m[0].r = blockIdx.x * 4 + (threadIdx.x >> 5);",
                "m[0].acc[0] = 0.f;",
                "int group = S == 1 ? m[0].r : blockIdx.x;",
            ],
        ),
        (
            "void mmvq_unstaged(",
            &[
                "WarpRow<NB> m[R];",
                "const u8* W = W0;",
                "float* Y = Y0;",
                "int rows;",
                "bool mine = mmvq_target<NB, R, S>(",
                "Step st;",
                "int base = 0;",
                "if (mine) {",
                "st.template at_rows<NB>(m, W, rows, cols);",
                "base = st.first(",
                "if (st.live(base)) st.issue(base);",
                "}",
            ],
        ),
        (
            "void mmvq_staged(",
            &[
                "extern __shared__ int4 staged_act[];",
                "int warps = blockDim.x >> 5;",
                "int groups = ",
                "int group = ",
                "WarpRow<NB> m[R];",
                "m[0].",
                "#pragma unroll",
                "for (int t = 0; t < NB; t++) m[0].acc[t] = 0.f;",
                "const u8* W = W0;",
                "float* Y = Y0;",
                "int rows = rows0;",
                "Step st;",
                "int base = lane >> 2;",
                "if (group < groups) {",
                "mmvq_resolve<NB, R>(",
                "st.template at_rows<NB>(m, W, rows, cols);",
                "st.issue(base);",
                "}",
            ],
        ),
        (
            "void dqmma_q4_k(",
            &[
                "extern __shared__ __align__(16) u32 dq_ilv[];",
                "__shared__ unsigned ticket;",
                "int lane = threadIdx.x & 31, warp = ",
                "int gr0 = blockIdx.x * DQ_BLOCK_ROWS, r0 = gr0;",
                "const u8* W = W0;",
                "float* Y = Y0;",
                "int rows = rows0;",
                "if (r0 >= rows0) {",
                "r0 -= rows0, W = W1, Y = Y1, rows = rows1;",
                "if (r0 >= rows1) r0 -= rows1, W = W2, Y = Y2, rows = rows2;",
                "}",
                "int nsb = cols / 256, splits = gridDim.y, split = blockIdx.y;",
                "int sb0 = ",
                "int t0 = ",
                "size_t row_bytes = ",
                "const u8* wwarp = W + ",
                "u8* wst = (u8*)(dq_ilv + ",
                "int h = i >> 1, cbase = ",
                "auto stage_w = [&](int sb, int st) {",
                "if (sb < sb1) {",
                "u8* dst = wst + ",
                "#pragma unroll",
                "for (int m = 0; m < 5; m++) {",
                "int p = lane + 32 * m, rr = p / 9, k = p % 9;",
                "if (p < 144) {",
                "const u8* row = wwarp + ",
                "const u8* row = wrow + ",
                "const u8* src = k < 4",
                ": k < 8 ? row + ",
                ": row + nsb * 128 + sb * 16;",
                "cp_async16(smem_u32(dst + ",
                "}",
                "cp_async_commit();",
                "};",
                "constexpr bool STAGED = ",
                "size_t qoff = ",
                "const u8* wrow = wwarp + ",
                "auto load_w = [&](int sb, DqWeights& w) {",
                "for (int r = 0; r < 2; r++) {",
                "w.q[r][0] = ld_weights16(",
                "w.q[r][1] = ld_weights16(",
                "w.head[r] = ld_weights16(",
                "float acc[NT][4];",
                "for (int b = 0; b < NT; b++)",
                "for (int e = 0; e < 4; e++) acc[b][e] = 0.f;",
                "DqWeights wa, wb;",
                "if constexpr (STAGED) {",
                "for (int st = 0; st < DQ_W_STAGES - 1; st++) stage_w(sb0 + st, st);",
                "} else {",
                "if (sb0 < sb1) load_w(sb0, wa);",
            ],
        ),
        (
            "void qmma_q4_k(",
            &[
                "int nsb = p.nsb, i = p.i;",
                "size_t row_bytes = ",
                "const u8* row = p.W + ",
                "const u8* qrow = row + ",
                "const signed char* qs = act_qs(",
                "const float* dd = act_d(",
                "auto load = [&](int sb, QmmaQ4kLoad& l) {",
                "#pragma unroll",
                "for (int h = 0; h < 2; h++) {",
                "size_t rh = 8 * h * row_bytes;",
                "for (int c = 0; c < 4; c++) l.q[h][c] = ld_weights8(",
                "l.head[h] = ld_weights16_l1(",
                "}",
                "};",
                "float acc[BT][4];",
                "for (int b = 0; b < BT; b++)",
                "for (int e = 0; e < 4; e++) acc[b][e] = 0.f;",
                "QmmaQ4kLoad cur, next;",
                "if (p.warp < nsb) load(p.warp, cur);",
            ],
        ),
    ];

    /// Kernels that load the model's own vectors (or a parameter the host wrote before the launch, or,
    /// the fused decode kernel, KV cache rows of earlier steps) before their WAIT_PRIOR_GRID(), and the
    /// statements allowed there.
    const WAITING_KERNELS: [(&str, &[&str]); 3] = [
        (
            " add_norm_to(",
            &[
                "bool in_regs = width <= RN_IN_REGS * RN_THREADS && width % 4 == 0;",
                "NormWeights nw;",
                "if (in_regs) nw = norm_weights(post, weight, width, flags);",
            ],
        ),
        (" attend_tiles_d##D(", &["Placement pl = read_placement(meta, pos);"]),
        (
            "__launch_bounds__(ATT_THREADS, MIN_BLOCKS) NAME(",
            &[
                "Placement pl = read_placement(meta, pos);",
                "int d_row = cache_row[0];",
                "float2 cs = rope_pair_angle(pl.p, n_rot, base, freq_scale);",
                "__shared__ float head_norms[2 * D];",
                "load_head_norms<D>(qn, kn, head_norms);",
                // The first tile's K and V rows: earlier steps' rows, which no kernel of this step
                // writes but this one (whose row it takes from shared memory; `load_first_tile`).
                "DecodeShare sh = decode_share<NH>(pl);",
                "FirstTile<D> ft;",
                "load_first_tile<D>(ft, sh, pl, window, kc, vc, capacity, kv_width, n_head, n_kv_head);",
                // The batched form (`attend_rope_rows_*`): its row's cache buffers and placement,
                // from tables the host wrote before the launch (a sequence's buffer table is written
                // once, when the sequence is made).
                "int r = blockIdx.z;",
                "const int* row = rows + r * ROW_INTS;",
                "u16* kc = seqs[r][2 * layer];",
                "u16* vc = seqs[r][2 * layer + 1];",
                "int capacity = row[0], d_row = row[6];",
                "Placement pl{row[1], row[2], row[3], row[4], row[5]};",
            ],
        ),
    ];

    /// The lines of `body` from just after `open` (a '{') up to the next WAIT_PRIOR_GRID().
    fn before_wait(body: &str, open: usize) -> Vec<&str> {
        let wait = open + body[open..].find("WAIT_PRIOR_GRID();").expect("a wait");
        body[open + 1..wait]
            .lines()
            .map(|l| l.trim().trim_end_matches('\\').trim())
            .filter(|l| !l.is_empty() && !l.starts_with("//"))
            .collect()
    }

    #[test]
    fn every_kernel_waits_for_its_predecessor_before_touching_memory() {
        // A kernel that read an earlier kernel's output before WAIT_PRIOR_GRID() would race it in a
        // graph: each kernel starts with the wait, or is one call to a body listed in WAITING_BODIES.
        for file in crate::runtime::nvrtc::ALL {
            let body = file.body;
            let mut kernels = 0;
            let mut from = 0;
            while let Some(at) = body[from..].find("__global__").map(|i| from + i) {
                from = at + 1;
                let line = &body[body[..at].rfind('\n').map_or(0, |i| i + 1)..at];
                if line.trim_start().starts_with("//") {
                    continue;
                }
                let open = at + body[at..].find('{').expect("kernel body");
                let first = body[open + 1..]
                    .lines()
                    .map(|l| l.trim().trim_end_matches('\\').trim())
                    .find(|l| !l.is_empty())
                    .expect("a statement");
                let delegated = WAITING_BODIES
                    .iter()
                    .any(|(name, _)| first.starts_with(&name["void ".len()..name.len() - 1]));
                let header = &body[at..open];
                let early = WAITING_KERNELS.iter().find(|(name, _)| header.contains(name));
                if let Some((name, allowed)) = early {
                    for stmt in before_wait(body, open) {
                        assert!(
                            allowed.contains(&stmt),
                            "`{stmt}` runs before WAIT_PRIOR_GRID() in{name}"
                        );
                    }
                }
                assert!(
                    first == "WAIT_PRIOR_GRID();" || delegated || early.is_some(),
                    "{}: a kernel starts with `{first}`",
                    file.name
                );
                kernels += 1;
            }
            assert!(kernels > 0, "{}", file.name);
        }
        for (name, allowed) in WAITING_BODIES {
            let body = crate::runtime::nvrtc::ALL
                .iter()
                .map(|f| f.body)
                .find(|b| b.contains(name))
                .unwrap_or_else(|| panic!("{name} in a kernel file"));
            let at = body.find(name).expect("found above");
            let open = at + body[at..].find(") {").expect("body") + 2;
            for stmt in before_wait(body, open) {
                assert!(
                    allowed.iter().any(|a| stmt.starts_with(a)),
                    "`{stmt}` runs before WAIT_PRIOR_GRID() in {name}"
                );
            }
        }
    }
}
