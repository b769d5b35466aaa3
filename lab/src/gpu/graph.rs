//! A captured CUDA graph, optionally with programmatic dependent launch (PDL, sm_90) between its
//! kernels: an edge from one kernel node to another becomes programmatic, so the second kernel's
//! blocks launch while the first is still running and wait for it inside (`pdl_wait()` in
//! kernels/pdl.cuh). Only kernels whose PTX holds that wait ([`kernels_that_wait`]) get such an
//! edge; a kernel without it would read its inputs before they are written, so every other edge
//! (into such a kernel, or from or to a copy or memset node) stays a full dependency.

use super::Gpu;
use crate::error::Doing;
use crate::{LabError, Result};
use cudarc::driver::sys::{self, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{result, CudaStream};
use std::sync::Arc;

pub struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    stream: Arc<CudaStream>,
    /// Dependencies between the graph's nodes, and how many of them were made programmatic.
    pub edges: usize,
    pub programmatic: usize,
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: both handles are ours, made in `capture` and destroyed only here.
        unsafe {
            let _ = result::graph::exec_destroy(self.exec);
            let _ = result::graph::destroy(self.graph);
        }
    }
}

impl Graph {
    /// Captures what `body` launches on the GPU's stream; with `programmatic`, then rewrites its
    /// kernel-to-kernel edges as above before instantiating it.
    pub fn capture(gpu: &Gpu, programmatic: bool, body: impl FnOnce() -> Result<()>) -> Result<Graph> {
        gpu.stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).doing("capturing a graph")?;
        let ran = body();
        // SAFETY: the stream is ours and capturing (begun above).
        let graph = unsafe { result::stream::end_capture(gpu.stream.cu_stream()) }.doing("ending a graph capture")?;
        let made = (|| {
            ran?;
            if graph.is_null() {
                return Err(LabError::Invalid("the captured graph is empty".into()));
            }
            let edges = edges(graph)?;
            let programmatic = if programmatic { make_programmatic(gpu, graph, &edges)? } else { 0 };
            let flags = CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
            // SAFETY: a valid graph from the capture above.
            let exec = unsafe { result::graph::instantiate(graph, flags) }.doing("instantiating a captured graph")?;
            Ok(Graph { graph, exec, stream: gpu.stream.clone(), edges: edges.len(), programmatic })
        })();
        if made.is_err() && !graph.is_null() {
            // SAFETY: the graph was not handed to a `Graph`; nothing else holds it.
            let _ = unsafe { result::graph::destroy(graph) };
        }
        made
    }

    /// Uploads the executable graph's resources, so that the first launch pays no setup.
    pub fn upload(&self) -> Result<()> {
        self.stream.context().bind_to_thread().doing("binding the context")?;
        // SAFETY: the executable graph is ours and its stream alive.
        unsafe { result::graph::upload(self.exec, self.stream.cu_stream()) }.doing("uploading a captured graph")
    }

    /// The symbols of the graph's kernel nodes in the order they run (a topological order of
    /// its edges, ties by node order: a captured stream's order); other nodes are left out.
    pub fn kernels(&self) -> Result<Vec<String>> {
        let mut n = 0usize;
        // SAFETY: a null array asks for the count; then an array of that length.
        unsafe { sys::cuGraphGetNodes(self.graph, std::ptr::null_mut(), &mut n) }.result().doing("counting a graph's nodes")?;
        let mut nodes = vec![std::ptr::null_mut(); n];
        unsafe { sys::cuGraphGetNodes(self.graph, nodes.as_mut_ptr(), &mut n) }.result().doing("reading a graph's nodes")?;
        let edges = edges(self.graph)?;
        let at = |node: sys::CUgraphNode| nodes.iter().position(|&m| m == node);
        let mut into = vec![0usize; n];
        for (_, to, _) in &edges {
            if let Some(i) = at(*to) {
                into[i] += 1;
            }
        }
        let (mut out, mut done) = (Vec::new(), vec![false; n]);
        while let Some(i) = (0..n).find(|&i| !done[i] && into[i] == 0) {
            done[i] = true;
            for (_, to, _) in edges.iter().filter(|e| e.0 == nodes[i]) {
                if let Some(j) = at(*to) {
                    into[j] -= 1;
                }
            }
            out.extend(kernel_name(nodes[i])?);
        }
        Ok(out)
    }

    pub fn launch(&self) -> Result<()> {
        self.stream.context().bind_to_thread().doing("binding the context")?;
        // SAFETY: the executable graph is ours and its stream alive.
        unsafe { result::graph::launch(self.exec, self.stream.cu_stream()) }.doing("launching a captured graph")
    }
}

type Edge = (sys::CUgraphNode, sys::CUgraphNode, sys::CUgraphEdgeData);

fn edges(graph: sys::CUgraph) -> Result<Vec<Edge>> {
    let mut n = 0usize;
    // SAFETY: null arrays ask for the count only; then arrays of that length.
    unsafe { sys::cuGraphGetEdges_v2(graph, std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), &mut n) }.result().doing("counting a graph's edges")?;
    // A graph of one node has none, and the driver takes empty arrays for invalid (a one-kernel
    // timing capture failed that way on an H100).
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut from = vec![std::ptr::null_mut(); n];
    let mut to = vec![std::ptr::null_mut(); n];
    let mut data = vec![sys::CUgraphEdgeData { from_port: 0, to_port: 0, type_: 0, reserved: [0; 5] }; n];
    // SAFETY: as above.
    unsafe { sys::cuGraphGetEdges_v2(graph, from.as_mut_ptr(), to.as_mut_ptr(), data.as_mut_ptr(), &mut n) }.result().doing("reading a graph's edges")?;
    Ok((0..n).map(|i| (from[i], to[i], data[i])).collect())
}

/// The kernel a node launches, by symbol; `None` for other nodes (copies, memsets) and for
/// kernels launched by handle rather than function (libraries).
fn kernel_name(node: sys::CUgraphNode) -> Result<Option<String>> {
    let mut ty = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: a node of a live graph; out-parameters.
    unsafe { sys::cuGraphNodeGetType(node, &mut ty) }.result().doing("reading a graph node's type")?;
    if ty != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
        return Ok(None);
    }
    // SAFETY: a kernel node; the struct is plain data the call fills.
    let mut p: sys::CUDA_KERNEL_NODE_PARAMS = unsafe { std::mem::zeroed() };
    unsafe { sys::cuGraphKernelNodeGetParams_v2(node, &mut p) }.result().doing("reading a kernel node")?;
    if p.func.is_null() {
        return Ok(None);
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: a loaded function; the driver owns the returned string.
    unsafe { sys::cuFuncGetName(&mut name, p.func) }.result().doing("reading a kernel's name")?;
    // SAFETY: a NUL-terminated string from the driver, copied at once.
    Ok((!name.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy().into_owned()))
}

fn make_programmatic(gpu: &Gpu, graph: sys::CUgraph, edges: &[Edge]) -> Result<usize> {
    let mut made = 0;
    for (from, to, data) in edges {
        if kernel_name(*from)?.is_none() || !kernel_name(*to)?.is_some_and(|k| gpu.waits_for_upstream(&k)) {
            continue;
        }
        let edge = sys::CUgraphEdgeData {
            from_port: sys::CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC as u8,
            to_port: 0,
            type_: sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8,
            reserved: [0; 5],
        };
        // SAFETY: an edge of this graph, replaced by the same pair with other edge data.
        unsafe {
            sys::cuGraphRemoveDependencies_v2(graph, from, to, data, 1).result().doing("removing a graph edge")?;
            sys::cuGraphAddDependencies_v2(graph, from, to, &edge, 1).result().doing("adding a programmatic graph edge")?;
        }
        made += 1;
    }
    Ok(made)
}

/// The entry points of a PTX module whose bodies hold `griddepcontrol.wait`: the kernels that
/// wait for their upstream (kernels/pdl.cuh) and so may take a programmatic edge.
pub fn kernels_that_wait(ptx: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut current: Option<&str> = None;
    for line in ptx.lines().map(str::trim_start) {
        if let Some(rest) = line.strip_prefix(".visible .entry ").or_else(|| line.strip_prefix(".entry ")) {
            current = rest.split('(').next().map(str::trim);
        } else if line.starts_with('.') && line.contains(".func") {
            current = None;
        } else if line.starts_with("griddepcontrol.wait") {
            if let Some(name) = current.take() {
                out.push(name.to_string());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::kernels_that_wait;

    #[test]
    fn finds_the_entries_that_wait_and_only_those() {
        let ptx = "
.weak .func helper()
{
\tgriddepcontrol.wait;
}
.visible .entry waits(
\t.param .u64 waits_param_0
)
{
\tld.param.u64 %rd1, [waits_param_0];
\tgriddepcontrol.wait;
\tgriddepcontrol.launch_dependents;
}
.visible .entry plain(
)
{
\tret;
}
.entry also_waits()
{
\tgriddepcontrol.wait;
}
";
        assert_eq!(kernels_that_wait(ptx), ["waits", "also_waits"]);
        assert!(kernels_that_wait(&ptx.replace("griddepcontrol.wait", "bar.sync 0")).is_empty());
    }
}
