// The ATen ops that only move metadata or memory (tensor creation, views, resizing, scalars),
// the CPU fallback for every op without a device kernel, and the choice of anychip's attention
// kernel for scaled_dot_product_attention. Every op that computes is registered from Python
// (anychip.frontends.torch.aten), where anychip's kernel registry lives.
#include <ATen/EmptyTensor.h>
#include <ATen/SDPBackend.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "device.h"
#include "storage.h"

namespace anychip::torch_bridge {

void resize_bytes(c10::StorageImpl* storage, size_t nbytes) {
  TORCH_CHECK(storage->resizable(), "anychip: trying to resize a storage that is not resizable");
  c10::Allocator* allocator = storage->allocator();
  TORCH_CHECK(allocator != nullptr, "anychip: trying to resize a storage without an allocator");
  c10::DeviceGuard guard(storage->device());
  c10::DataPtr fresh = allocator->allocate(nbytes);
  size_t keep = std::min(nbytes, storage->nbytes());
  if (keep > 0 && storage->data() != nullptr) {
    ANYCHIP_CALL(memcpy_d2d, storage->device().index(), fresh.get(), storage->data(), keep);
  }
  storage->set_data_ptr_noswap(std::move(fresh));
  storage->set_nbytes(nbytes);
}

namespace {

constexpr c10::DispatchKeySet kKeys(c10::DispatchKey::PrivateUse1);

c10::Device device_of(std::optional<c10::Device> device) {
  c10::Device d = c10::device_or_default(device);
  TORCH_CHECK(d.is_privateuseone(), "anychip: expected an anychip device, got ", d);
  return d.has_index() ? d : c10::Device(d.type(), current_device());
}

void check_options(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "anychip: only strided tensors are supported, got layout ", c10::layout_or_default(layout));
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "anychip: pin_memory applies to CPU tensors only");
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  check_options(layout, pin_memory);
  c10::Device d = device_of(device);
  check_device(d.index());
  c10::DeviceGuard guard(d);
  return at::detail::empty_generic(size, c10::GetAllocator(c10::DeviceType::PrivateUse1), kKeys,
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  check_options(layout, pin_memory);
  c10::Device d = device_of(device);
  check_device(d.index());
  c10::DeviceGuard guard(d);
  return at::detail::empty_strided_generic(size, stride, c10::GetAllocator(c10::DeviceType::PrivateUse1), kKeys,
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_strided(const at::Tensor& self, c10::IntArrayRef size, c10::IntArrayRef stride,
                      std::optional<int64_t> storage_offset) {
  return at::native::as_strided_tensorimpl(self, size, stride, storage_offset);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

// Sets sizes (contiguous, or `memory_format`) and grows the storage on the device when it is
// too small; the CPU version would memcpy device memory on the host.
const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size_sym,
                         std::optional<c10::MemoryFormat> memory_format) {
  c10::IntArrayRef size = C10_AS_INTARRAYREF_SLOW(size_sym);
  for (int64_t extent : size) TORCH_CHECK(extent >= 0, "anychip resize_: negative size ", size);
  auto* impl = self.unsafeGetTensorImpl();
  if (impl->sizes() != size) impl->set_sizes_contiguous(size);
  int64_t numel = impl->numel();
  size_t needed = numel == 0 ? 0 : static_cast<size_t>((impl->storage_offset() + numel) * impl->dtype().itemsize());
  c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
  if (needed > storage->nbytes()) resize_bytes(storage, needed);
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve, "anychip resize_: memory format Preserve is not valid");
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor& set_tensor(at::Tensor& self, const at::Tensor& source) { return at::native::set_tensor_(self, source); }

at::Tensor& set_storage(at::Tensor& self, c10::Storage source) {
  size_t itemsize = self.dtype().itemsize();
  int64_t numel = static_cast<int64_t>(source.nbytes() / itemsize);
  return self.set_(source, 0, {numel}, {1});
}

at::Tensor& set_storage_offset(at::Tensor& self, c10::Storage storage, c10::SymInt offset, c10::SymIntArrayRef size,
                               c10::SymIntArrayRef stride) {
  auto* impl = self.unsafeGetTensorImpl();
  if (!impl->storage().is_alias_of(storage)) impl->set_storage_keep_dtype(storage);
  impl->set_sizes_and_strides(C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                              offset.expect_int());
  return self;
}

// .item(): the element comes to the host by a device-to-host copy, then reads as on the CPU.
at::Scalar local_scalar_dense(const at::Tensor& self) {
  TORCH_CHECK(self.numel() == 1, "anychip: a Tensor with ", self.numel(), " elements cannot be converted to Scalar");
  at::Tensor host = at::empty({}, self.options().device(c10::kCPU));
  ANYCHIP_CALL(memcpy_d2h, self.device().index(), host.data_ptr(), self.const_data_ptr(), self.dtype().itemsize());
  return at::native::_local_scalar_dense_cpu(host);
}

// Called for every op without a device kernel, before it runs on the CPU: counts it in
// anychip.fallback (named as the dispatcher names it, with its first tensor's dtype); a nonzero
// return (strict mode) refuses it with `message`.
using FallbackHook = int (*)(const char* op, const char* dtype, char* message, size_t size);
FallbackHook g_fallback_hook = nullptr;

std::string first_dtype(const c10::OperatorHandle& op, const torch::jit::Stack* stack) {
  size_t n = op.schema().arguments().size();
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor() && v.toTensor().defined()) return c10::toString(v.toTensor().scalar_type());
    if (v.isTensorList() && v.toTensorList().size() > 0) return c10::toString(v.toTensorList().get(0).scalar_type());
  }
  return "-";
}

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& name = op.schema().operator_name();
  std::string label = name.name + (name.overload_name.empty() ? "" : "." + name.overload_name);
  if (g_fallback_hook != nullptr) {
    char message[1024] = "";
    if (g_fallback_hook(label.c_str(), first_dtype(op, stack).c_str(), message, sizeof(message)) != 0) {
      TORCH_CHECK_NOT_IMPLEMENTED(false, message);
    }
  }
  at::native::cpu_fallback(op, stack);
}

// scaled_dot_product_attention's choice: anychip's attention kernel (the "overrideable" backend,
// registered from Python) for what kernel.h's `attention` computes; PyTorch's math otherwise.
int64_t choose_sdp(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::optional<at::Tensor>& mask, double dropout_p, bool is_causal, std::optional<double>,
                   bool enable_gqa) {
  auto math = static_cast<int64_t>(at::SDPBackend::math);
  bool floats = q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type() &&
                (q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf);
  if (!floats || dropout_p != 0.0 || q.dim() != 4 || k.dim() != 4 || v.dim() != 4) return math;
  if (mask.has_value() && mask->defined() && (mask->scalar_type() != at::kBool || mask->dim() != 4)) return math;
  int64_t hq = q.size(1), hk = k.size(1);
  if (k.size(3) != q.size(3) || v.size(3) != q.size(3) || v.size(1) != hk || hk == 0 || hq % hk != 0) return math;
  if (hq != hk && !enable_gqa) return math;  // PyTorch's own error for mismatched heads
  if (is_causal && q.size(2) != k.size(2)) return math;  // PyTorch's causal mask is top-left aligned
  return static_cast<int64_t>(at::SDPBackend::overrideable);
}

// Whether `from` may replace `self`'s data in place (param.data = ...): between dense CPU and
// anychip tensors, yes. Module.to("anychip") then keeps each Parameter object, so weights tied
// by identity (a shared embedding and output head) stay tied.
bool compatible_shallow_copy(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == c10::kStrided && (t.device().is_cpu() || t.device().is_privateuseone());
  };
  return dense(self) && dense(from);
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_has_compatible_shallow_copy_type", compatible_shallow_copy);
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("view", view);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("resize_", resize);
  m.impl("set_.source_Tensor", set_tensor);
  m.impl("set_.source_Storage", set_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage_offset);
  m.impl("_local_scalar_dense", local_scalar_dense);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) { m.fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>()); }

}  // namespace
}  // namespace anychip::torch_bridge

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &anychip::torch_bridge::choose_sdp)
}

extern "C" __attribute__((visibility("default"))) void anychip_torch_set_fallback_hook(
    anychip::torch_bridge::FallbackHook hook) {
  anychip::torch_bridge::g_fallback_hook = hook;
}
