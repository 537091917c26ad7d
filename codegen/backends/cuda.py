"""The ``cuda`` backend: CUDA C for NVIDIA GPUs. Elementwise and gather kernels run one thread
per output element (a grid-stride loop), row kernels one block per row with shared-memory
reductions; ``col_sum`` outputs (dweight) go through a per-row scratch summed per column in row
order, scatter-adds one thread per column adding the index's rows in order, and contractions a
shared-memory tiled product per batch into a float32 scratch, batches added in order; so results
do not depend on the launch shape. Indices are checked on the device; a bad one fails the call. The exported ``AnychipKernelFn`` enqueues on
``call->stream`` and returns (host_code=False). Built with ``nvcc -arch=sm_90``."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

from .. import ir
from .c import (_attrs, _axis, _contraction_operands, _ctype, _dense_inputs_outputs, _ids, _reductions,
                _template_params, header_digest, include_dir, symbol)
from .c_prelude import PRELUDE
from .expr_c import CExpr, storage_type

SCHEDULES = ({"block": 256}, {"block": 128}, {"block": 512})
CONTRACTION_SCHEDULES = ({"tile": 16}, {"tile": 32})

CUDA_PRELUDE = r"""
#define ACG_HD __host__ __device__
#include <cuda_runtime.h>
""" + PRELUDE + r"""
namespace acg {
struct Dims { int64_t v[ANYCHIP_MAX_RANK]; };
inline Dims dims(const int64_t* s) { Dims d; for (int i = 0; i < ANYCHIP_MAX_RANK; ++i) d.v[i] = s[i]; return d; }

// The block's reduction of v (blockDim.x a power of two); every thread gets the result.
template <bool kMax>
__device__ float block_reduce(float v, float* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      shared[threadIdx.x] = kMax ? vmax(shared[threadIdx.x], shared[threadIdx.x + s])
                                 : shared[threadIdx.x] + shared[threadIdx.x + s];
    }
    __syncthreads();
  }
  const float r = shared[0];
  __syncthreads();
  return r;
}

// out[c] = sum over rows of scratch[r, c], in row order.
template <class S>
__global__ void column_sum(const float* scratch, int64_t rows, int64_t len, S* out) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= len) return;
  float s = 0.0f;
  for (int64_t r = 0; r < rows; ++r) s += scratch[r * len + c];
  out[c] = store<S>(s);
}

inline AnychipStatus launched(const AnychipKernelCall* call, const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? ANYCHIP_OK : fail(call, kernel, cudaGetErrorString(e));
}

// The first bad index a kernel met (-1: none); per library, reset before each indexed launch.
static __device__ long long bad_index_seen;
__device__ inline bool index_ok(int64_t g, int64_t limit) {
  if (g >= 0 && g < limit) return true;
  atomicCAS(reinterpret_cast<unsigned long long*>(&bad_index_seen), static_cast<unsigned long long>(-1LL),
            static_cast<unsigned long long>(g));
  return false;
}
inline void reset_bad_index(cudaStream_t s) {
  const long long none = -1;
  cudaMemcpyToSymbolAsync(bad_index_seen, &none, sizeof none, 0, cudaMemcpyHostToDevice, s);
}
// Waits for the stream (an index check cannot be answered before the kernel ran).
inline AnychipStatus index_checked(const AnychipKernelCall* call, const char* kernel, cudaStream_t s, int64_t limit) {
  long long seen = -1;
  cudaMemcpyFromSymbolAsync(&seen, bad_index_seen, sizeof seen, 0, cudaMemcpyDeviceToHost, s);
  if (cudaStreamSynchronize(s) != cudaSuccess) return launched(call, kernel);
  if (seen < 0) return launched(call, kernel);
  static thread_local char msg[160];
  std::snprintf(msg, sizeof msg, "index %lld is outside [0, %lld)", seen, static_cast<long long>(limit));
  return fail(call, kernel, msg);
}

// acc [m, n] (+)= A B for one batch: 2-D tiles of TILE x TILE, K walked in tiles through shared memory.
template <int TILE, class T>
__global__ void gemm_tile(const T* a, Mat am, const T* b, Mat bm, float* acc, int64_t m, int64_t n, int64_t len,
                          bool first) {
  __shared__ float as[TILE][TILE + 1], bs[TILE][TILE + 1];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row = blockIdx.y * static_cast<int64_t>(TILE) + ty, col = blockIdx.x * static_cast<int64_t>(TILE) + tx;
  float s = 0.0f;
  for (int64_t k0 = 0; k0 < len; k0 += TILE) {
    as[ty][tx] = row < m && k0 + tx < len ? load(a[row * am.rs + (k0 + tx) * am.cs]) : 0.0f;
    bs[ty][tx] = k0 + ty < len && col < n ? load(b[(k0 + ty) * bm.rs + col * bm.cs]) : 0.0f;
    __syncthreads();
    for (int k = 0; k < TILE; ++k) s += as[ty][k] * bs[k][tx];
    __syncthreads();
  }
  if (row < m && col < n) acc[row * n + col] = first ? s : acc[row * n + col] + s;
}

// C (an [m, n] view at c) = acc, rounded to C's dtype.
template <class T>
__global__ void store_matrix(const float* acc, int64_t m, int64_t n, T* c, Mat cm) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < m * n; e += step)
    c[(e / n) * cm.rs + (e % n) * cm.cs] = store<T>(acc[e]);
}

template <class T>
__global__ void store_all(const float* acc, int64_t count, T* out) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < count; e += step)
    out[e] = store<T>(acc[e]);
}

inline unsigned grid_for(int64_t count, int block) {
  const int64_t blocks = (count + block - 1) / block;
  return static_cast<unsigned>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}
}  // namespace acg
"""


def nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    default = "/usr/local/cuda/bin/nvcc"
    return default if os.path.exists(default) else None


@functools.lru_cache(maxsize=None)
def nvcc_version(path: str) -> str:
    done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    return done.stdout.strip().splitlines()[-1] if done.stdout else path


class CudaBackend:
    name = "cuda"
    source_suffix = ".cu"
    host_code = False

    def __init__(self, arch: str = "sm_90"):
        self.arch = arch

    def render(self, kernel) -> str:
        return f"// generated by anychip_codegen (cuda backend): {kernel.name}\n{CUDA_PRELUDE}\n{render_kernel(kernel)}"

    def _nvcc(self) -> str:
        path = nvcc()
        if path is None:
            raise FileNotFoundError("nvcc is not installed (looked on PATH and in /usr/local/cuda/bin)")
        return path

    def compile_command(self, source_path: str, output_path: str) -> list[str]:
        return [self._nvcc(), f"-arch={self.arch}", "-O2", "-std=c++17", "-Xcompiler", "-fPIC",
                f"-I{include_dir()}", "-c", source_path, "-o", output_path]

    def link_command(self, object_paths: list[str], output_path: str) -> list[str]:
        return [self._nvcc(), f"-arch={self.arch}", "-shared", *object_paths, "-o", output_path]

    def load(self, library_path: str, kernels) -> dict:
        from anychip.kernels import NativeKernel

        return {f"{k.name}.{dtype}": NativeKernel(library_path, symbol(k.name, dtype), host_code=False)
                for k in kernels for dtype in k.dtypes}

    def schedules(self, kernel) -> tuple[dict, ...]:
        return CONTRACTION_SCHEDULES if isinstance(kernel, ir.Contraction) else SCHEDULES

    def toolchain(self) -> str:
        path = nvcc()
        return f"{nvcc_version(path) if path else 'no nvcc'} {self.arch} {header_digest()}"


# ---- rendering ----------------------------------------------------------------------------


def _template_names(kernel, fn: str) -> tuple[str, str, str]:
    """The template head of ``fn``'s kernel and host function, its argument list, and the name
    of its launch-arguments struct."""
    params, _ = _template_params(kernel)
    return f"template <{', '.join('class ' + p for p in params)}>", ", ".join(params), f"A_{fn}"


def _args_struct(kernel, name: str, extra: list[str]) -> list[str]:
    fields = []
    for i, a in enumerate(kernel.inputs):
        fields.append(f"  const {_ctype(a.dtype)}* p{i};")
    for k, o in enumerate(kernel.outputs):
        fields.append(f"  {_ctype(o.dtype, k)}* q{k};")
    for line in _attrs(kernel):  # "  const float a0 = ...;" -> a field
        decl = line.split("=")[0].replace("const ", "").rstrip()
        fields.append(f"{decl};")
    return [_template_names(kernel, "")[0], f"struct {name} {{", *fields, *extra, "};"]


def _unpack(kernel) -> list[str]:
    lines = [f"  const auto p{i} = A.p{i};" for i in range(len(kernel.inputs))]
    lines += [f"  const auto q{k} = A.q{k};" for k in range(len(kernel.outputs))]
    for line in _attrs(kernel):
        var = line.split("=")[0].split()[-1]
        lines.append(f"  const auto {var} = A.{var};")
    return lines


def _host_fill(kernel) -> list[str]:
    lines = [f"  A.p{i} = static_cast<decltype(A.p{i})>(call->inputs[{i}].data);" for i in range(len(kernel.inputs))]
    lines += [f"  A.q{k} = static_cast<decltype(A.q{k})>(call->outputs[{k}].data);" for k in range(len(kernel.outputs))]
    for line in _attrs(kernel):
        var, value = line.split("=", 1)
        lines.append(f"  A.{var.split()[-1]} ={value}")
    return lines


def render_elementwise(kernel: ir.Elementwise, fn: str) -> str:
    n_in, n_out = len(kernel.inputs), len(kernel.outputs)
    nt = n_in + n_out
    block = kernel.knob("block", SCHEDULES[0]["block"])
    tparams, targs, struct = _template_names(kernel, fn)
    cx = CExpr(load=lambda i: f"acg::load(p{i}[off[{i}]])", position="i")
    body = [f"    int64_t off[{nt}];",
            "    if (L.flat) {",
            *[f"      off[{t}] = i;" for t in range(nt)],
            "    } else {",
            "      const int64_t inner = L.shape[L.rank - 1];",
            "      L.offsets(i / inner, off);",
            *[f"      off[{t}] += (i % inner) * L.strides[{t}][L.rank - 1];" for t in range(nt)],
            "    }",
            *cx.preload([o.expr for o in kernel.outputs], "    "),
            *[f"    q{k}[off[{n_in + k}]] = acg::store<{_ctype(o.dtype, k)}>({cx.render(o.expr)});"
              for k, o in enumerate(kernel.outputs)]]
    tensors = ", ".join([f"&call->inputs[{i}]" for i in range(n_in)] + [f"&call->outputs[{k}]" for k in range(n_out)])
    lines = [*_args_struct(kernel, struct, [f"  acg::Loop<{nt}> L;"]),
             tparams,
             f"__global__ void g_{fn}({struct}<{targs}> A) {{",
             "  const auto& L = A.L;",
             *_unpack(kernel),
             "  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;",
             "  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < L.n; i += step) {",
             *body,
             "  }",
             "}",
             tparams,
             f"AnychipStatus {fn}(const AnychipKernelCall* call) {{",
             f"  static const int32_t ids[] = {{{_ids(kernel)}}};",
             f"  if (const char* e = acg::check(call, {n_in}, {n_out}, ids)) return acg::fail(call, \"{kernel.name}\", e);",
             f"  const AnychipTensor* ts[{nt}] = {{{tensors}}};",
             f"  {struct}<{targs}> A;",
             f"  if (const char* e = acg::make_loop<{nt}>(ts, call->outputs[0], &A.L)) return acg::fail(call, \"{kernel.name}\", e);",
             "  if (A.L.n == 0) return ANYCHIP_OK;",
             *_host_fill(kernel),
             f"  const int64_t blocks = (A.L.n + {block} - 1) / {block};",
             f"  g_{fn}<{targs}><<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), {block}, 0, "
             "reinterpret_cast<cudaStream_t>(call->stream)>>>(A);",
             f"  return acg::launched(call, \"{kernel.name}\");",
             "}"]
    return "\n".join(lines)


def render_rows(kernel: ir.Rows, fn: str) -> str:
    ins, outs = kernel.inputs, kernel.outputs
    block = kernel.knob("block", SCHEDULES[0]["block"])
    tparams, targs, struct = _template_names(kernel, fn)
    name = kernel.name
    row_in = [i for i, a in enumerate(ins) if a.role == "row"]
    row_out = [k for k, o in enumerate(outs) if o.role == "row"]
    col_sums = [k for k, o in enumerate(outs) if o.role == "col_sum"]
    extra = ["  acg::Rows R;", "  float row_len;", "  float* scratch;",
             *[f"  acg::Dims st{i};" for i in row_in], *[f"  acg::Dims su{k};" for k in row_out]]

    def element(i, pos, out=False):
        st = f"A.su{i}.v" if out else f"A.st{i}.v"
        return f"(F ? ({pos}) * R.step({st}) : R.position_offset({st}, {pos}))"

    def load(i):
        role = ins[i].role
        if role == "row":
            return f"acg::load(p{i}[b{i} + {element(i, 'c')}])"
        return f"acg::load(p{i}[c])" if role == "col" else f"acg::load(p{i}[r])"

    def row_at(i, pos):
        return (f"[&](int64_t at) {{ return at >= 0 && at < len ? acg::load(p{i}[b{i} + {element(i, 'at')}]) "
                f": decltype(acg::load(p{i}[0]))(0); }}({pos})")

    body = [f"__shared__ float shared[{block}];",
            "const auto& R = A.R;", *_unpack(kernel),
            "const int64_t r = blockIdx.x, len = R.len;",
            "const float row_len = A.row_len;",
            "const bool F = R.row_rank <= 1;",
            *[f"const int64_t b{i} = R.row_offset(A.st{i}.v, r);" for i in row_in],
            *[f"const int64_t c{k} = R.row_offset(A.su{k}.v, r);" for k in row_out]]
    computed: dict = {}
    for lv, reds in enumerate(_reductions(kernel)):
        cx = CExpr(load=load, reduced=dict(computed), row_at=row_at)
        names = {red: f"red{lv}_{j}" for j, red in enumerate(reds)}
        body += [f"float {nm} = {'0.0f' if red.op == 'sum' else '-INFINITY'};" for red, nm in names.items()]
        body.append("for (int64_t c = threadIdx.x; c < len; c += blockDim.x) {")
        body += cx.preload([red.x for red in reds], "  ")
        for red, nm in names.items():
            value = cx.render(red.x)
            body.append(f"  {nm} = {nm} + ({value});" if red.op == "sum" else f"  {nm} = acg::vmax({nm}, static_cast<float>({value}));")
        body.append("}")
        body += [f"{nm} = acg::block_reduce<{'true' if red.op == 'max' else 'false'}>({nm}, shared);"
                 for red, nm in names.items()]
        computed.update(names)
    cx = CExpr(load=load, reduced=computed, row_at=row_at)
    per_element = [(k, o) for k, o in enumerate(outs) if o.role in ("row", "col_sum")]
    if per_element:
        body.append("for (int64_t c = threadIdx.x; c < len; c += blockDim.x) {")
        body += cx.preload([o.expr for _k, o in per_element], "  ")
        for k, o in per_element:
            value = cx.render(o.expr)
            if o.role == "row":
                body.append(f"  q{k}[c{k} + {element(k, 'c', out=True)}] = acg::store<{_ctype(o.dtype, k)}>({value});")
            else:
                body.append(f"  A.scratch[({col_sums.index(k)} * R.rows + r) * len + c] = static_cast<float>({value});")
        body.append("}")
    for k, o in enumerate(outs):
        if o.role == "per_row":
            body += ["if (threadIdx.x == 0) {", *cx.preload([o.expr], "  "),
                     f"  q{k}[r] = acg::store<{_ctype(o.dtype, k)}>({cx.render(o.expr)});", "}"]
    rows_of = {"last": "acg::row_dims_last(x, in_row)",
               "attr_axis": f"acg::row_dims_axis(call, {kernel.rows.attr}, x, in_row)",
               "attr_axes": f"acg::row_dims_axes(call, {kernel.rows.attr}, x, in_row)"}[kernel.rows.kind]
    host = [tparams, f"AnychipStatus {fn}(const AnychipKernelCall* call) {{",
            f"  static const int32_t ids[] = {{{_ids(kernel)}}};",
            f"  if (const char* e = acg::check(call, {len(ins)}, {len(outs)}, ids)) return acg::fail(call, \"{name}\", e);",
            f"  const AnychipTensor& x = call->inputs[{row_in[0]}];",
            "  bool in_row[ANYCHIP_MAX_RANK];",
            f"  if (const char* e = {rows_of}) return acg::fail(call, \"{name}\", e);",
            f"  {struct}<{targs}> A;",
            "  acg::make_rows(x, in_row, &A.R);",
            "  A.row_len = static_cast<float>(A.R.len);",
            "  A.scratch = nullptr;",
            *[f"  A.st{i} = acg::dims(call->inputs[{i}].strides);" for i in row_in],
            *[f"  A.su{k} = acg::dims(call->outputs[{k}].strides);" for k in row_out],
            *_host_fill(kernel),
            "  cudaStream_t stream = reinterpret_cast<cudaStream_t>(call->stream);"]
    if col_sums:
        host += [f"  if (cudaMallocAsync(reinterpret_cast<void**>(&A.scratch), sizeof(float) * {len(col_sums)} * "
                 "(A.R.rows > 0 ? A.R.rows : 1) * (A.R.len > 0 ? A.R.len : 1), stream) != cudaSuccess)",
                 f"    return acg::fail(call, \"{name}\", \"out of device memory for the column sums\");"]
    host += [f"  if (A.R.rows > 0) g_{fn}<{targs}><<<static_cast<unsigned>(A.R.rows), {block}, 0, stream>>>(A);"]
    for j, k in enumerate(col_sums):
        host.append(f"  acg::column_sum<<<static_cast<unsigned>((A.R.len + 255) / 256), 256, 0, stream>>>("
                    f"A.scratch + {j} * A.R.rows * A.R.len, A.R.rows, A.R.len, A.q{k});")
    if col_sums:
        host.append("  cudaFreeAsync(A.scratch, stream);")
    host += [f"  return acg::launched(call, \"{name}\");", "}"]
    lines = [*_args_struct(kernel, struct, extra), tparams, f"__global__ void g_{fn}({struct}<{targs}> A) {{",
             *("  " + b for b in body), "}", *host]
    return "\n".join(lines)


def _host_head(kernel, fn: str, tparams: str) -> list[str]:
    n_in, n_out = len(kernel.inputs), len(kernel.outputs)
    return [tparams, f"AnychipStatus {fn}(const AnychipKernelCall* call) {{",
            f"  static const int32_t ids[] = {{{_ids(kernel)}}};",
            f"  if (const char* e = acg::check(call, {n_in}, {n_out}, ids)) return acg::fail(call, \"{kernel.name}\", e);",
            *_dense_inputs_outputs(kernel),
            "  cudaStream_t stream = reinterpret_cast<cudaStream_t>(call->stream);"]


def render_gather(kernel: ir.Gather, fn: str) -> str:
    block = kernel.knob("block", SCHEDULES[0]["block"])
    t, x = kernel.table, kernel.index
    tparams, targs, struct = _template_names(kernel, fn)
    cx = CExpr(load=lambda i: f"acg::load(p{i}[src])" if i == t else "g")
    lines = [*_args_struct(kernel, struct, ["  int64_t n, pre, post, span;"]), tparams,
             f"__global__ void g_{fn}({struct}<{targs}> A) {{", *_unpack(kernel),
             "  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;",
             "  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < A.pre * A.n * A.post; e += step) {",
             "    const int64_t r = e / A.post, c = e % A.post;",
             f"    const int64_t g = p{x}[r % A.n];",
             "    if (!acg::index_ok(g, A.span)) continue;",
             "    const int64_t src = ((r / A.n) * A.span + g) * A.post + c;",
             *cx.preload([o.expr for o in kernel.outputs], "    "),
             *[f"    q{k}[e] = acg::store<{_ctype(o.dtype, k)}>({cx.render(o.expr)});" for k, o in enumerate(kernel.outputs)],
             "  }", "}",
             *_host_head(kernel, fn, tparams),
             f"  const AnychipTensor& tab = call->inputs[{t}];", *_axis(kernel),
             f"  {struct}<{targs}> A;",
             f"  A.n = acg::count(call->inputs[{x}]);",
             "  A.pre = 1, A.post = 1;",
             "  for (int d = 0; d < tab.rank; ++d) (d < axis ? A.pre : A.post) *= d == axis ? 1 : tab.shape[d];",
             "  A.span = tab.rank > 0 ? tab.shape[axis] : 1;",
             *[f"  if (acg::count(call->outputs[{k}]) != A.pre * A.n * A.post) return acg::fail(call, \"{kernel.name}\", "
               f"\"output {k} must have the table's shape with the index's dims at the axis\");" for k in range(len(kernel.outputs))],
             "  if (A.pre * A.n * A.post == 0) return ANYCHIP_OK;",
             *_host_fill(kernel),
             "  acg::reset_bad_index(stream);",
             f"  g_{fn}<{targs}><<<acg::grid_for(A.pre * A.n * A.post, {block}), {block}, 0, stream>>>(A);",
             f"  return acg::index_checked(call, \"{kernel.name}\", stream, A.span);", "}"]
    return "\n".join(lines)


def render_scatter_add(kernel: ir.ScatterAdd, fn: str) -> str:
    block = kernel.knob("block", SCHEDULES[0]["block"])
    s, x = kernel.source, kernel.index
    tparams, targs, struct = _template_names(kernel, fn)
    cx = CExpr(load=lambda i: f"acg::load(p{i}[i * A.post + c])" if i == s else "g")
    n_out = len(kernel.outputs)
    lines = [*_args_struct(kernel, struct, ["  int64_t n, rows, post;", f"  float* acc[{n_out}];"]), tparams,
             f"__global__ void g_{fn}({struct}<{targs}> A) {{", *_unpack(kernel),
             "  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;",
             "  if (c >= A.post) return;",
             "  for (int64_t i = 0; i < A.n; ++i) {",
             f"    const int64_t g = p{x}[i];",
             "    if (!acg::index_ok(g, A.rows)) continue;",
             *cx.preload([o.expr for o in kernel.outputs], "    "),
             *[f"    A.acc[{k}][g * A.post + c] += static_cast<float>({cx.render(o.expr)});" for k, o in enumerate(kernel.outputs)],
             "  }", "}",
             *_host_head(kernel, fn, tparams),
             "  const AnychipTensor& out = call->outputs[0];",
             f"  if (out.rank < 1) return acg::fail(call, \"{kernel.name}\", \"output 0 must have at least one dim\");",
             f"  {struct}<{targs}> A;",
             f"  A.n = acg::count(call->inputs[{x}]);",
             "  A.rows = out.shape[0];",
             "  A.post = A.rows > 0 ? acg::count(out) / A.rows : 0;",
             f"  if (acg::count(call->inputs[{s}]) != A.n * A.post) return acg::fail(call, \"{kernel.name}\", "
             f"\"input {s} must have the index's dims followed by the output's after its first\");",
             *_host_fill(kernel),
             "  const int64_t count = A.rows * A.post;",
             "  if (count == 0) return ANYCHIP_OK;"]
    # float32 outputs are summed in place; others in a float32 scratch rounded at the end
    for k, o in enumerate(kernel.outputs):
        ct = _ctype(o.dtype, k)
        lines += [f"  A.acc[{k}] = reinterpret_cast<float*>(A.q{k});",
                  f"  if (!std::is_same<{ct}, float>::value && cudaMallocAsync(reinterpret_cast<void**>(&A.acc[{k}]), "
                  "sizeof(float) * count, stream) != cudaSuccess)",
                  f"    return acg::fail(call, \"{kernel.name}\", \"out of device memory for the sums\");",
                  f"  cudaMemsetAsync(A.acc[{k}], 0, sizeof(float) * count, stream);"]
    lines += ["  acg::reset_bad_index(stream);",
              f"  g_{fn}<{targs}><<<acg::grid_for(A.post, {block}), {block}, 0, stream>>>(A);"]
    for k, o in enumerate(kernel.outputs):
        ct = _ctype(o.dtype, k)
        lines += [f"  if (!std::is_same<{ct}, float>::value) {{",
                  f"    acg::store_all<<<acg::grid_for(count, 256), 256, 0, stream>>>(A.acc[{k}], count, A.q{k});",
                  f"    cudaFreeAsync(A.acc[{k}], stream);", "  }"]
    lines += [f"  return acg::index_checked(call, \"{kernel.name}\", stream, A.rows);", "}"]
    return "\n".join(lines)


def render_contraction(kernel: ir.Contraction, fn: str) -> str:
    tile = kernel.knob("tile", CONTRACTION_SCHEDULES[0]["tile"])
    n_in, n_out = len(kernel.inputs), len(kernel.outputs)
    name = kernel.name
    product = [
        "template <class T>",
        f"AnychipStatus {fn}_product(const AnychipKernelCall* call, cudaStream_t stream, const acg::Batch& B,",
        "                          const AnychipTensor& ta, acg::Mat a, const AnychipTensor& tb, acg::Mat b,",
        "                          const AnychipTensor& tc, acg::Mat c) {",
        "  const int64_t m = c.rows, n = c.cols, len = a.cols;",
        "  if (m == 0 || n == 0) return ANYCHIP_OK;",
        "  std::vector<int64_t> keys;",
        "  std::vector<std::vector<int64_t>> groups;",
        "  B.groups(tc, &keys, &groups);",
        "  float* acc = nullptr;",
        "  if (cudaMallocAsync(reinterpret_cast<void**>(&acc), sizeof(float) * m * n, stream) != cudaSuccess)",
        f"    return acg::fail(call, \"{name}\", \"out of device memory for the product\");",
        f"  const dim3 threads({tile}, {tile}), grid(static_cast<unsigned>((n + {tile - 1}) / {tile}), "
        f"static_cast<unsigned>((m + {tile - 1}) / {tile}));",
        "  for (size_t g = 0; g < groups.size(); ++g) {",
        "    if (len == 0) cudaMemsetAsync(acc, 0, sizeof(float) * m * n, stream);",
        "    for (size_t j = 0; j < groups[g].size() && len > 0; ++j) {",
        "      const int64_t bt = groups[g][j];",
        f"      acg::gemm_tile<{tile}><<<grid, threads, 0, stream>>>(static_cast<const T*>(ta.data) + B.offset(ta, bt), a,",
        "          static_cast<const T*>(tb.data) + B.offset(tb, bt), b, acc, m, n, len, j == 0);",
        "    }",
        "    acg::store_matrix<<<acg::grid_for(m * n, 256), 256, 0, stream>>>(acc, m, n, static_cast<T*>(tc.data) + keys[g], c);",
        "  }",
        "  cudaFreeAsync(acc, stream);",
        f"  return acg::launched(call, \"{name}\");",
        "}"]
    lines = [*product, "template <class T>", f"AnychipStatus {fn}(const AnychipKernelCall* call) {{",
             f"  static const int32_t ids[] = {{{_ids(kernel)}}};",
             f"  if (const char* e = acg::check(call, {n_in}, {n_out}, ids)) return acg::fail(call, \"{name}\", e);",
             *_contraction_operands(kernel),
             "  cudaStream_t stream = reinterpret_cast<cudaStream_t>(call->stream);"]
    for k, o in enumerate(kernel.outputs):
        pr = o.expr
        lines += [f"  if (AnychipStatus s = {fn}_product<T>(call, stream, B, call->inputs[{pr.a}], a{k}, "
                  f"call->inputs[{pr.b}], b{k}, call->outputs[{k}], c{k}); s != ANYCHIP_OK) return s;"]
    lines += ["  return ANYCHIP_OK;", "}"]
    return "\n".join(lines)


RENDERERS = {ir.Rows: render_rows, ir.Elementwise: render_elementwise, ir.Gather: render_gather,
             ir.ScatterAdd: render_scatter_add, ir.Contraction: render_contraction}


def _render_one(kernel, fn: str) -> str:
    render = RENDERERS.get(type(kernel))
    if render is None:
        raise TypeError(f"kernel {kernel.name!r}: the cuda backend has no renderer for {type(kernel).__name__}")
    return render(kernel, fn)


def render_kernel(kernel) -> str:
    from .c import _export

    parts = ["namespace {"]
    subs = kernel.by_inputs if isinstance(kernel, ir.Variants) else ((None, kernel),)
    for n, sub in subs:
        parts.append(_render_one(sub, f"k_{kernel.name}" + (f"_{n}" if n is not None else "")))
    parts.append("}  // namespace\n")
    for dtype in kernel.dtypes:
        if isinstance(kernel, ir.Variants):
            t = storage_type(dtype)
            lines = [f'extern "C" AnychipStatus {symbol(kernel.name, dtype)}(const AnychipKernelCall* call) {{',
                     "  switch (call->num_inputs) {",
                     *[f"    case {n}: return k_{kernel.name}_{n}<{t}>(call);" for n, _ in kernel.by_inputs],
                     f'    default: return acg::fail(call, "{kernel.name}", "unexpected number of inputs");', "  }", "}"]
        else:
            lines = _export(kernel, dtype, lambda args: f"k_{kernel.name}<{', '.join(args)}>(call)")
        parts.append("\n".join(lines))
    return "#include <type_traits>\n" + "\n\n".join(parts) + "\n"
