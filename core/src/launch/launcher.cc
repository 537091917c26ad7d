// anychip._launcher: builds AnychipKernelCall descriptors from Python and runs a kernel.
//
// A host device (Paddle's CPU) runs the kernel right here on the calling thread. Any other
// device runs it through its Paddle bridge's `anychip_bridge_launch`, which orders it on the
// device's stream with exactly the tensors' memory ranges open, and returns when it is done.
// The GIL is released while the kernel runs.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "anychip/kernel.h"

namespace py = pybind11;

namespace {

using BridgeLaunch = int (*)(int device, void* stream, AnychipHostFunction fn, void* user_data,
                             const AnychipMemoryRange* ranges, int num_ranges, char* error,
                             size_t error_size);

size_t element_size(int32_t dtype) {
  switch (dtype) {
    case ANYCHIP_DTYPE_FLOAT64:
    case ANYCHIP_DTYPE_INT64: return 8;
    case ANYCHIP_DTYPE_FLOAT32:
    case ANYCHIP_DTYPE_INT32: return 4;
    case ANYCHIP_DTYPE_FLOAT16:
    case ANYCHIP_DTYPE_BFLOAT16:
    case ANYCHIP_DTYPE_INT16: return 2;
    case ANYCHIP_DTYPE_INT8:
    case ANYCHIP_DTYPE_UINT8:
    case ANYCHIP_DTYPE_BOOL: return 1;
    default: throw std::invalid_argument("unknown AnychipDtype " + std::to_string(dtype));
  }
}

// A descriptor from (data_ptr, dtype, shape, strides, device); also returns its byte range.
AnychipTensor describe(const py::handle& desc, AnychipMemoryRange* range) {
  auto t = desc.cast<py::tuple>();
  if (t.size() != 5) throw std::invalid_argument("tensor descriptor must be (ptr, dtype, shape, strides, device)");
  AnychipTensor out{};
  out.data = reinterpret_cast<void*>(t[0].cast<uintptr_t>());
  out.dtype = t[1].cast<int32_t>();
  auto shape = t[2].cast<std::vector<int64_t>>();
  auto strides = t[3].cast<std::vector<int64_t>>();
  if (shape.size() > ANYCHIP_MAX_RANK || strides.size() != shape.size()) {
    throw std::invalid_argument("tensor rank above ANYCHIP_MAX_RANK or strides/shape length differ");
  }
  out.rank = static_cast<int32_t>(shape.size());
  int64_t last = 0;
  bool empty = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    out.shape[i] = shape[i];
    out.strides[i] = strides[i];
    if (shape[i] == 0) empty = true;
    last += (shape[i] - 1) * strides[i];
  }
  out.device = t[4].cast<int32_t>();
  range->ptr = out.data;
  range->size = empty ? 0 : static_cast<size_t>(last + 1) * element_size(out.dtype);
  return out;
}

struct Launch {
  AnychipKernelFn kernel;
  AnychipKernelCall call;
};

AnychipStatus run_kernel(void* user_data) {
  auto* launch = static_cast<Launch*>(user_data);
  return launch->kernel(&launch->call);
}

void launch(uintptr_t kernel, const py::sequence& inputs, const py::sequence& outputs,
            const std::vector<double>& attrs, uintptr_t bridge, int device, uintptr_t stream,
            int num_threads) {
  if (kernel == 0) throw std::invalid_argument("kernel address is 0");
  std::vector<AnychipTensor> ins, outs;
  std::vector<AnychipMemoryRange> ranges(inputs.size() + outputs.size());
  size_t r = 0;
  for (const auto& d : inputs) ins.push_back(describe(d, &ranges[r++]));
  for (const auto& d : outputs) outs.push_back(describe(d, &ranges[r++]));

  char error[1024] = "";
  Launch l{reinterpret_cast<AnychipKernelFn>(kernel), AnychipKernelCall{}};
  l.call.struct_size = sizeof(AnychipKernelCall);
  l.call.inputs = ins.data();
  l.call.num_inputs = static_cast<int32_t>(ins.size());
  l.call.outputs = outs.data();
  l.call.num_outputs = static_cast<int32_t>(outs.size());
  l.call.attrs = attrs.data();
  l.call.num_attrs = static_cast<int32_t>(attrs.size());
  l.call.num_threads = num_threads;
  l.call.stream = reinterpret_cast<AnychipStream>(stream);
  l.call.error = error;
  l.call.error_size = sizeof(error);

  int status;
  char bridge_error[1024] = "";
  {
    py::gil_scoped_release unlocked;
    if (bridge == 0) {
      status = run_kernel(&l);
    } else {
      status = reinterpret_cast<BridgeLaunch>(bridge)(device, reinterpret_cast<void*>(stream), run_kernel, &l,
                                                      ranges.data(), static_cast<int>(ranges.size()),
                                                      bridge_error, sizeof(bridge_error));
    }
  }
  if (status != ANYCHIP_OK) {
    // The kernel's own message says more than the runtime's "host function failed".
    std::string message = error[0] != '\0' ? error : bridge_error;
    if (message.empty()) message = "kernel failed with status " + std::to_string(status);
    throw std::runtime_error(std::to_string(status) + ":" + message);
  }
}

}  // namespace

PYBIND11_MODULE(_launcher, m) {
  m.doc() = "Runs anychip kernels (anychip/kernel.h) on tensor descriptors";
  m.def("launch", &launch, py::arg("kernel"), py::arg("inputs"), py::arg("outputs"), py::arg("attrs"),
        py::arg("bridge") = 0, py::arg("device") = 0, py::arg("stream") = 0, py::arg("num_threads") = 0,
        "Runs the AnychipKernelFn at address `kernel`. Descriptors are (ptr, dtype, shape, strides, "
        "device). `bridge` is the address of anychip_bridge_launch for a non-host device, else 0. "
        "Raises RuntimeError('<status>:<message>') on failure.");
  m.attr("KERNEL_ABI_VERSION") = ANYCHIP_KERNEL_ABI_VERSION;
}
