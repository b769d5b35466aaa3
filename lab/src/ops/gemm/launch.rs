//! Launching a gemm kernel: looking it up with its shared memory raised, and its arguments by
//! kind (pointers, tensor maps, the split workspace). Reached through [`super::gemm`], which
//! validates the tensors first.

use super::plan::{self, Split};
use super::tma::tensor_maps;
use super::variants::{Config, Kind};
use super::{Dims, FAMILY};
use crate::error::Doing;
use crate::gpu::Gpu;
use crate::kernels::{symbol, DType};
use crate::ops::variant::{Requires, Variant};
use crate::ops::Elem;
use crate::{LabError, Result};
use cudarc::driver::sys::CUdevice_attribute as DevAttr;
use cudarc::driver::sys::CUfunction_attribute_enum as FnAttr;
use cudarc::driver::{CudaFunction, CudaSlice, PushKernelArg};

/// A gemm kernel, ready to launch: `v` must take `dtype` and run on this device, and its dynamic
/// shared memory limit is raised to what its config asks for.
pub fn kernel(gpu: &Gpu, v: &Variant<Config>, dtype: DType) -> Result<CudaFunction> {
    if !v.dtypes.contains(&dtype) || !v.requires.on_gpu() {
        return Err(LabError::Invalid(format!("gemm variant `{}` has no {} kernel", v.name, dtype.name())));
    }
    if v.requires == Requires::Sm90a && gpu.arch != 90 {
        return Err(LabError::Invalid(format!(
            "gemm variant `{}` uses sm_90a instructions (TMA, mbarriers, wgmma) and runs on compute capability 9.0 only; this device is {}",
            v.name, gpu.info.cc
        )));
    }
    let optin = gpu.info.max_smem_per_block_optin as usize;
    if v.config.smem > optin {
        return Err(LabError::Invalid(format!("gemm variant `{}` needs {} bytes of shared memory per block; this device allows {optin}", v.name, v.config.smem)));
    }
    let f = gpu.function(FAMILY, &symbol(FAMILY, v.name, dtype))?;
    raise_dynamic_smem(&f, v.config.smem)?;
    Ok(f)
}

/// Lets `f` launch with `smem` bytes of dynamic shared memory: the limit is raised to it (the
/// default 48 KiB counts static shared memory too) and the whole carveout preferred as shared
/// memory (so that, e.g., mma_warp64's two 64 KiB blocks per SM fit). Without dynamic shared
/// memory, nothing to do.
pub fn raise_dynamic_smem(f: &CudaFunction, smem: usize) -> Result<()> {
    set_dynamic_smem(f, smem, 100)
}

/// [`raise_dynamic_smem`] for a kernel that runs `blocks` blocks per SM and reads other data
/// through L1: the carveout preferred is only what those blocks need (dynamic and static shared
/// memory, plus the 1 KiB the system reserves per block), so that the rest of the SM's unified
/// L1/shared memory stays L1.
pub fn fit_dynamic_smem(gpu: &Gpu, f: &CudaFunction, smem: usize, blocks: usize) -> Result<()> {
    if smem == 0 {
        return Ok(());
    }
    let per_sm = gpu.ctx.attribute(DevAttr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR).doing("reading shared memory per SM")? as usize;
    let static_smem = f.get_attribute(FnAttr::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES).doing("reading the kernel's static shared memory")? as usize;
    let need = blocks * (smem + static_smem + 1024);
    set_dynamic_smem(f, smem, (100 * need).div_ceil(per_sm).min(100) as i32)
}

fn set_dynamic_smem(f: &CudaFunction, smem: usize, carveout_percent: i32) -> Result<()> {
    if smem > 0 {
        f.set_attribute(FnAttr::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem as i32)
            .doing("raising the kernel's dynamic shared memory limit")?;
        f.set_attribute(FnAttr::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, carveout_percent)
            .doing("preferring a shared-memory carveout")?;
    }
    Ok(())
}

/// C = alpha A B + beta C with `v` on buffers that [`super::validate`] accepted for `d` and
/// [`super::variants::refusal`] did not refuse.
pub(super) fn launch<T: Elem>(
    gpu: &Gpu,
    v: &Variant<Config>,
    d: Dims,
    (alpha, beta): (f32, f32),
    a: &CudaSlice<T>,
    b: &CudaSlice<T>,
    c: &mut CudaSlice<T>,
) -> Result<()> {
    let f = kernel(gpu, v, T::DTYPE)?;
    let mut cfg = v.config.launch_config(d.m, d.n);
    let split = plan::workspace(gpu, &v.config, d)?;
    let maps = if v.config.uses_tma() { Some(tensor_maps(gpu, &v.config, d, a, b)?) } else { None };
    let (m, n, k) = (d.m as i32, d.n as i32, d.k as i32);
    let (lda, ldb, ldc) = (d.lda as i32, d.ldb as i32, d.ldc as i32);
    // mma_warp64_tail_split adds its split blocks to the grid and takes the plan's two numbers.
    let tail = match split.as_ref().map(|w| w.split) {
        Some(Split::Tail(plan)) => Some((plan.blocks() as u32, plan.dp_tiles as i32, plan.slices as i32)),
        _ => None,
    };
    let mut l = gpu.stream.launch_builder(&f);
    match &maps {
        Some(maps) => l.arg(&maps.a).arg(&maps.b).arg(c).arg(&m).arg(&n).arg(&k).arg(&ldc).arg(&alpha).arg(&beta),
        None => l.arg(a).arg(b).arg(c).arg(&m).arg(&n).arg(&k).arg(&lda).arg(&ldb).arg(&ldc).arg(&alpha).arg(&beta),
    };
    if let (Kind::MmaTma | Kind::TailSplit, Some(maps)) = (v.config.kind, &maps) {
        l.arg(&maps.b_rank);
    }
    if let Some((blocks, dp_tiles, slices)) = &tail {
        cfg.grid_dim.0 = *blocks;
        l.arg(dp_tiles).arg(slices);
    }
    if let Some(w) = &split {
        if let Split::K { slices } = w.split {
            cfg.grid_dim.1 = slices as u32;
        }
        l.arg(&w.ws).arg(&w.done);
    }
    // SAFETY: validate() checked A (m x lda), B (k x ldb) and C (m x ldc) against M, N, K and the
    // buffers' lengths; every kernel bounds its loads and stores by M, N, K and the leading
    // dimensions. The TMA rungs' maps describe A (M x K) and B (K x N) inside their buffers (TMA
    // never reads outside the described tensor; B's 3D map only where every column block lies
    // within a row) and they predicate every C store on M, N and ldc. cfg is the launch shape and
    // dynamic smem each kernel is written for. The split rungs' workspace was made for this
    // split and shape (mma_splitk: grid.y x M x N floats when grid.y > 1 and a counter per tile;
    // mma_warp64_tail_split: a 128x256 slot per split block and a counter per split tile; zero
    // at rest), and launches on one stream never overlap in it.
    unsafe { l.launch(cfg) }.map(|_| ()).doing(&format!("launching gemm {}", v.name))
}
