//! The CUDA runtime over cudarc: one context and stream per [`Gpu`], NVRTC modules compiled for
//! the device's own architecture (`compute_90a` on 9.0: [`compile::Target::for_device`]) and cached, and CUDA-event timing ([`timing`]).

pub mod compile;
pub mod graph;
pub mod nvml;
pub mod ptxas;
pub mod timing;
pub mod trace;

use crate::error::Doing;
use crate::{LabError, Result};
use cudarc::driver::sys::CUdevice_attribute as Attr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What the record says about the device: enough to tell two GPUs apart later.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeviceInfo {
    pub name: String,
    pub cc: String,
    pub driver: String,
    pub cuda: String,
    pub nvrtc: String,
    pub sm_count: i32,
    pub l2_bytes: i64,
    pub memory_bytes: i64,
    pub max_smem_per_block_optin: i32,
    /// Form factor, power limit and maximum clocks (from NVML; absent without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub board: Option<nvml::Board>,
}

pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub info: DeviceInfo,
    /// Compute capability as one number: 90 for sm_90.
    pub arch: u32,
    /// Clock readings for the records; `None` where NVML cannot be loaded.
    pub nvml: Option<nvml::Nvml>,
    modules: Mutex<HashMap<String, Arc<CudaModule>>>,
    /// Kernels already looked up, by symbol: ops look theirs up on every call.
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// One cuBLAS handle on our stream, made on first use.
    blas: std::sync::OnceLock<cudarc::cublas::CudaBlas>,
    /// The families whose kernels were looked up since [`Gpu::forget_families`]: what the records
    /// of an experiment say they ran.
    families: Mutex<std::collections::BTreeSet<String>>,
    /// Kernels of the loaded modules that wait for their upstream ([`graph::kernels_that_wait`]).
    waiting: Mutex<std::collections::HashSet<String>>,
}

/// Why no GPU can be used, in plain words; `None` when one can.
pub fn unavailable_reason() -> Option<String> {
    // SAFETY: only probes the dynamic loader.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Some("the CUDA driver library (libcuda.so) is not installed".into());
    }
    match CudaContext::device_count() {
        Ok(0) => Some("the CUDA driver reports no devices".into()),
        Ok(_) => None,
        Err(e) => Some(format!("the CUDA driver failed to initialise ({e:?})")),
    }
}

impl Gpu {
    /// Opens device `ordinal`, or says plainly why it cannot.
    pub fn new(ordinal: usize) -> Result<Arc<Self>> {
        if let Some(why) = unavailable_reason() {
            return Err(LabError::NoGpu(why));
        }
        let ctx = CudaContext::new(ordinal).doing("creating the CUDA context")?;
        // One non-default stream for everything: CUDA graphs cannot capture the legacy default
        // stream, and with a single stream cudarc's cross-stream event tracking only costs time.
        // SAFETY: no other stream ever touches our buffers.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().doing("creating a stream")?;
        let (major, minor) = ctx.compute_capability().doing("reading the compute capability")?;
        let attr = |a| ctx.attribute(a).doing("reading a device attribute");
        let mut driver = 0;
        // SAFETY: plain out-parameter; the driver is loaded (the context exists).
        unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut driver) }
            .result()
            .doing("reading the driver version")?;
        let nvrtc = compile::nvrtc_version()
            .map(|(a, b)| format!("{a}.{b}"))
            .unwrap_or_else(|_| "missing".into());
        let name = ctx.name().doing("reading the device name")?;
        let bus = format!(
            "{:08X}:{:02X}:{:02X}.0",
            attr(Attr::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
            attr(Attr::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
            attr(Attr::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
        );
        let nvml = nvml::Nvml::open(&bus);
        let info = DeviceInfo {
            board: nvml.as_ref().map(|n| n.board(&name)),
            name,
            cc: format!("{major}.{minor}"),
            driver: driver_release().unwrap_or_else(|| format!("cuda-api {driver}")),
            cuda: format!("{}.{}", driver / 1000, (driver % 1000) / 10),
            nvrtc,
            sm_count: attr(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            l2_bytes: attr(Attr::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as i64,
            memory_bytes: ctx.total_mem().doing("reading total memory")? as i64,
            max_smem_per_block_optin: attr(
                Attr::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )?,
        };
        Ok(Arc::new(Gpu {
            ctx,
            stream,
            info,
            arch: (major * 10 + minor) as u32,
            nvml,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
            blas: std::sync::OnceLock::new(),
            families: Mutex::new(Default::default()),
            waiting: Mutex::new(Default::default()),
        }))
    }

    /// A kernel by family, variant and dtype; the family's module is compiled once per context.
    pub fn function(&self, family: &str, symbol: &str) -> Result<CudaFunction> {
        {
            let mut used = self.families.lock().expect("family set poisoned");
            if !used.contains(family) {
                used.insert(family.to_string());
            }
        }
        if let Some(f) = self.functions.lock().expect("function cache poisoned").get(symbol) {
            return Ok(f.clone());
        }
        let module = {
            let mut modules = self.modules.lock().expect("module cache poisoned");
            match modules.get(family) {
                Some(m) => m.clone(),
                None => {
                    let ptx = compile::compile_family(family, compile::Target::for_device(self.arch))?;
                    self.waiting.lock().expect("waiting set poisoned").extend(graph::kernels_that_wait(&ptx));
                    let m = self
                        .ctx
                        .load_module(cudarc::nvrtc::Ptx::from_src(ptx))
                        .doing(&format!("loading the `{family}` module"))?;
                    modules.insert(family.to_string(), m.clone());
                    m
                }
            }
        };
        let f = module.load_function(symbol).doing(&format!("finding kernel `{symbol}`"))?;
        self.functions.lock().expect("function cache poisoned").insert(symbol.to_string(), f.clone());
        Ok(f)
    }

    /// Whether kernel `symbol` (of a module already loaded) waits for the kernel before it, so a
    /// graph may launch it early ([`graph::Graph::capture`]).
    pub fn waits_for_upstream(&self, symbol: &str) -> bool {
        self.waiting.lock().expect("waiting set poisoned").contains(symbol)
    }

    /// The families whose kernels were looked up since the last [`Gpu::forget_families`].
    pub fn families(&self) -> std::collections::BTreeSet<String> {
        self.families.lock().expect("family set poisoned").clone()
    }

    pub fn forget_families(&self) {
        self.families.lock().expect("family set poisoned").clear();
    }

    /// The context's cuBLAS handle (on [`Gpu::stream`]), created on first use.
    pub fn blas(&self) -> Result<&cudarc::cublas::CudaBlas> {
        // cuBLAS runs on the thread's current context, which cudarc's GEMM calls do not set: a
        // thread driving several GPUs (a tensor-parallel group) may have left another current
        // (CUBLAS_STATUS_INTERNAL_ERROR on 4 GPUs).
        self.ctx.bind_to_thread().doing("making the GPU's context current for cuBLAS")?;
        if let Some(b) = self.blas.get() {
            return Ok(b);
        }
        let b = cudarc::cublas::CudaBlas::new(self.stream.clone()).doing("creating the cuBLAS handle")?;
        Ok(self.blas.get_or_init(|| b))
    }

    pub fn upload<T: DeviceRepr>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        self.stream.clone_htod(host).doing("copying to the device")
    }

    pub fn download<T: DeviceRepr + Default + Clone>(&self, dev: &CudaSlice<T>) -> Result<Vec<T>> {
        self.stream.clone_dtoh(dev).doing("copying from the device")
    }

    /// Fills a buffer with 0xFF bytes (NaN in f32, bf16 and f16) so an unwritten output shows.
    pub fn poison<T: DeviceRepr>(&self, dev: &mut CudaSlice<T>) -> Result<()> {
        use cudarc::driver::DevicePtrMut;
        let bytes = dev.num_bytes();
        let (ptr, _sync) = dev.device_ptr_mut(&self.stream);
        // SAFETY: ptr covers `bytes` bytes of this allocation, on our stream.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0xFF, bytes, self.stream.cu_stream()) }
            .doing("poisoning an output buffer")
    }

    /// Points the step timeline of every loaded module that keeps one (`lab_trace`, kernels/llama.cu)
    /// at `buf`, or turns it off (None); returns how many modules keep one. The buffer is
    /// [`trace::SLOTS`] slots of (start, wait) after a count, as [`trace::Timeline`] reads it.
    pub fn set_trace(&self, buf: Option<&CudaSlice<u64>>) -> Result<usize> {
        use cudarc::driver::DevicePtr;
        let ptr = match buf {
            Some(b) if b.len() < 1 + 2 * trace::SLOTS => return Err(crate::LabError::Invalid(format!("a trace buffer of {} words: it takes {}", b.len(), 1 + 2 * trace::SLOTS))),
            Some(b) => b.device_ptr(&self.stream).0,
            None => 0,
        };
        let modules: Vec<Arc<CudaModule>> = self.modules.lock().expect("module cache poisoned").values().cloned().collect();
        let mut set = 0;
        for m in modules {
            // A module without the symbol keeps no timeline.
            let Ok(mut global) = m.get_global("lab_trace", &self.stream) else { continue };
            // SAFETY: lab_trace is one 8-byte pointer; the view covers exactly it.
            let mut word = unsafe { global.transmute_mut::<u64>(1) }.ok_or_else(|| crate::LabError::Invalid("lab_trace is not one pointer".into()))?;
            self.stream.memcpy_htod(&[ptr], &mut word).doing("setting a module's trace buffer")?;
            set += 1;
        }
        Ok(set)
    }

    /// Waits for the stream and surfaces any asynchronous kernel error.
    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize().doing("waiting for the stream (a kernel may have faulted)")
    }
}

/// The kernel driver's release ("580.159.04"), as the proc file reports it.
fn driver_release() -> Option<String> {
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    // "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build ..."
    text.lines().next()?.split_whitespace().find(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.')).map(str::to_string)
}
