// Paddle kernel signatures over anychip's base ops (anychip/kernel.h conventions, base-op ABI).
//
// Each template has the signature of the Paddle kernel it stands for (paddle/phi/kernels/*.h)
// and is instantiated only where the generated source registers it with
// PD_REGISTER_PLUGIN_KERNEL, for the dtypes the plugin's base kernels declare.
// Outputs are allocated with dev_ctx.Alloc on the device; inputs are passed as Paddle holds
// them (their strides), broadcast inputs as stride-0 descriptors of the output's shape.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <set>
#include <tuple>

#include "glue.h"
#include "paddle/phi/core/generator.h"
#include "paddle/phi/core/tensor_utils.h"

namespace anychip_pk {

using phi::DenseTensor;

template <typename T>
phi::DataType dtype_of() {
  return phi::CppTypeToDataType<T>::Type();
}

template <typename T, typename Context>
DenseTensor temporary(const Context& c, const phi::DDim& dims) {
  DenseTensor t;
  t.Resize(dims);
  c.template Alloc<T>(&t);
  return t;
}

// A temporary of any dtype (casts, index conversions, contiguous copies).
template <typename Context>
DenseTensor temporary(const Context& c, const phi::DDim& dims, phi::DataType dtype) {
  DenseTensor t;
  t.Resize(dims);
  c.Alloc(&t, dtype);
  return t;
}

// Row-major with no gaps (size-1 dimensions may have any stride).
inline bool is_dense(const AnychipTensor& d) {
  int64_t dense = 1;
  for (int i = d.rank - 1; i >= 0; --i) {
    if (d.shape[i] != 1 && d.strides[i] != dense) return false;
    dense *= d.shape[i];
  }
  return true;
}

// `t` as a dense descriptor: itself when it is dense, else a dense copy made in `storage`
// (the base ops other than the elementwise ones and the reductions take dense inputs).
template <typename Context>
AnychipTensor dense(const Context& c, const DenseTensor& t, DenseTensor* storage) {
  AnychipTensor d = describe(t);
  if (is_dense(d)) return d;
  *storage = temporary(c, t.dims(), t.dtype());
  AnychipTensor copy = describe(*storage);
  launch(c, "copy", t.dtype(), {d}, {copy});
  return copy;
}

// An int64 descriptor of index tensor `t` (int64 as it is, int32 cast into `storage`), dense.
template <typename Context>
AnychipTensor int64_index(const Context& c, const DenseTensor& t, DenseTensor* storage) {
  if (t.dtype() == phi::DataType::INT64) return dense(c, t, storage);
  if (t.dtype() != phi::DataType::INT32) {
    fail("an index must be int64 or int32, got " + phi::DataTypeToString(t.dtype()));
  }
  *storage = temporary(c, t.dims(), phi::DataType::INT64);
  launch(c, "cast", t.dtype(), {describe(t)}, {describe(*storage)});
  return describe(*storage);
}

// `axis` (negative counts from the end) as an index into `rank` dimensions.
inline int normalized(int64_t axis, int rank, const char* what) {
  int64_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= std::max(rank, 1)) {
    fail(std::string(what) + " axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
  }
  return static_cast<int>(a);
}

// The view of `d` that holds `length` elements of dimension `axis` from `start` on.
inline AnychipTensor narrow(AnychipTensor d, int axis, int64_t start, int64_t length) {
  d.data = static_cast<char*>(d.data) + start * d.strides[axis] * static_cast<int64_t>(element_size(d.dtype));
  d.shape[axis] = length;
  return d;
}

// A dense descriptor of `t`'s memory with shape `shape` (same element count; e.g. with the
// reduced dimensions kept as 1). `t` must be dense: a view cannot be reshaped in place.
inline AnychipTensor reshaped(const DenseTensor& t, const std::vector<int64_t>& shape) {
  AnychipTensor d = describe(t);
  if (!is_dense(d)) fail("cannot reshape a strided tensor of shape " + t.dims().to_str() + " in place");
  d.rank = static_cast<int32_t>(shape.size());
  int64_t dense = 1;
  for (int i = d.rank - 1; i >= 0; --i) {
    d.shape[i] = shape[i];
    d.strides[i] = dense;
    dense *= shape[i];
  }
  return d;
}

// A dense descriptor seen with another shape of the same element count.
inline AnychipTensor reshaped(AnychipTensor d, const std::vector<int64_t>& shape) {
  if (!is_dense(d)) fail("cannot reshape a strided view in place");
  d.rank = static_cast<int32_t>(shape.size());
  int64_t dense = 1;
  for (int i = d.rank - 1; i >= 0; --i) {
    d.shape[i] = shape[i];
    d.strides[i] = dense;
    dense *= shape[i];
  }
  return d;
}

// ---- elementwise ----

template <typename T, typename Context>
void binary(const Context& c, const char* op, const DenseTensor& x, const DenseTensor& y, DenseTensor* out) {
  c.template Alloc<T>(out);
  launch(c, op, dtype_of<T>(), {broadcast(x, out->dims()), broadcast(y, out->dims())}, {describe(*out)});
}

template <typename T, typename Context>
void unary(const Context& c, const char* op, const DenseTensor& x, DenseTensor* out,
           const std::vector<double>& attrs = {}) {
  c.template Alloc<T>(out);
  launch(c, op, dtype_of<T>(), {broadcast(x, out->dims())}, {describe(*out)}, attrs);
}

#define ANYCHIP_PK_BINARY(Name, op)                                                           \
  template <typename T, typename Context>                                                     \
  void Name(const Context& c, const DenseTensor& x, const DenseTensor& y, DenseTensor* out) { \
    binary<T>(c, op, x, y, out);                                                              \
  }
ANYCHIP_PK_BINARY(AddKernel, "add")
ANYCHIP_PK_BINARY(SubtractKernel, "subtract")
ANYCHIP_PK_BINARY(MultiplyKernel, "multiply")
ANYCHIP_PK_BINARY(DivideKernel, "divide")
ANYCHIP_PK_BINARY(MaximumKernel, "maximum")
ANYCHIP_PK_BINARY(MinimumKernel, "minimum")
ANYCHIP_PK_BINARY(ElementwisePowKernel, "elementwise_pow")
#undef ANYCHIP_PK_BINARY

// Comparisons: registered for the inputs' dtype, the output is bool (set at registration).
#define ANYCHIP_PK_COMPARE(Name, op)                                                          \
  template <typename T, typename Context>                                                     \
  void Name(const Context& c, const DenseTensor& x, const DenseTensor& y, DenseTensor* out) { \
    c.template Alloc<bool>(out);                                                              \
    launch(c, op, dtype_of<T>(), {broadcast(x, out->dims()), broadcast(y, out->dims())},      \
           {describe(*out)});                                                                 \
  }
ANYCHIP_PK_COMPARE(EqualKernel, "equal")
ANYCHIP_PK_COMPARE(NotEqualKernel, "not_equal")
ANYCHIP_PK_COMPARE(LessThanKernel, "less_than")
ANYCHIP_PK_COMPARE(LessEqualKernel, "less_equal")
ANYCHIP_PK_COMPARE(GreaterThanKernel, "greater_than")
ANYCHIP_PK_COMPARE(GreaterEqualKernel, "greater_equal")
#undef ANYCHIP_PK_COMPARE

#define ANYCHIP_PK_UNARY(Name, op)                                         \
  template <typename T, typename Context>                                  \
  void Name(const Context& c, const DenseTensor& x, DenseTensor* out) {    \
    unary<T>(c, op, x, out);                                               \
  }
ANYCHIP_PK_UNARY(ExpKernel, "exp")
ANYCHIP_PK_UNARY(LogKernel, "log")
ANYCHIP_PK_UNARY(SqrtKernel, "sqrt")
ANYCHIP_PK_UNARY(RsqrtKernel, "rsqrt")
ANYCHIP_PK_UNARY(SiluKernel, "silu")
ANYCHIP_PK_UNARY(SigmoidKernel, "sigmoid")
ANYCHIP_PK_UNARY(TanhKernel, "tanh")
ANYCHIP_PK_UNARY(AbsKernel, "abs")
ANYCHIP_PK_UNARY(SinKernel, "sin")
ANYCHIP_PK_UNARY(CosKernel, "cos")
#undef ANYCHIP_PK_UNARY

// Slots: wrappers of Paddle's attribute-free elementwise kernels for ops the plugins define
// (anychip_register_ops). Which Paddle kernel a slot stands for and which op it launches, the
// device's config says (loader.cc fills g_slot_ops), so that such an op reaches Paddle without
// a rebuild of this library. kernel_table.py has one row per slot (SLOT_KINDS x SLOTS).
inline const char* slot_op(const char* row) {
  auto found = g_slot_ops.find(row);
  if (found == g_slot_ops.end()) fail(std::string("slot ") + row + " has no op in the config");
  return found->second.c_str();
}

#define ANYCHIP_PK_SLOT(N)                                                                          \
  template <typename T, typename Context>                                                           \
  void UnarySlot##N##Kernel(const Context& c, const DenseTensor& x, DenseTensor* out) {             \
    unary<T>(c, slot_op("anychip_unary_slot_" #N), x, out);                                         \
  }                                                                                                 \
  template <typename T, typename Context>                                                           \
  void BinarySlot##N##Kernel(const Context& c, const DenseTensor& x, const DenseTensor& y, DenseTensor* out) { \
    binary<T>(c, slot_op("anychip_binary_slot_" #N), x, y, out);                                    \
  }
ANYCHIP_PK_SLOT(0)
ANYCHIP_PK_SLOT(1)
ANYCHIP_PK_SLOT(2)
ANYCHIP_PK_SLOT(3)
ANYCHIP_PK_SLOT(4)
ANYCHIP_PK_SLOT(5)
ANYCHIP_PK_SLOT(6)
ANYCHIP_PK_SLOT(7)
#undef ANYCHIP_PK_SLOT

template <typename T, typename Context>
void ScaleKernel(const Context& c, const DenseTensor& x, const phi::Scalar& scale,
                 const phi::Scalar& bias, bool bias_after_scale, DenseTensor* out) {
  unary<T>(c, "scale", x, out, {scale.to<double>(), bias.to<double>(), bias_after_scale ? 1.0 : 0.0});
}

template <typename T, typename Context>
void PowKernel(const Context& c, const DenseTensor& x, const phi::Scalar& factor, DenseTensor* out) {
  unary<T>(c, "pow", x, out, {factor.to<double>()});
}

// Registered for the input's dtype (the base-op rule); the output carries the target dtype.
template <typename T, typename Context>
void CastKernel(const Context& c, const DenseTensor& x, phi::DataType out_dtype, DenseTensor* out) {
  c.Alloc(out, out_dtype);
  launch(c, "cast", dtype_of<T>(), {describe(x)}, {describe(*out)});
}

template <typename T, typename Context>
void WhereKernel(const Context& c, const DenseTensor& condition, const DenseTensor& x,
                 const DenseTensor& y, DenseTensor* out) {
  c.template Alloc<T>(out);
  const phi::DDim& dims = out->dims();
  launch(c, "where", dtype_of<T>(), {broadcast(condition, dims), broadcast(x, dims), broadcast(y, dims)},
         {describe(*out)});
}

template <typename T, typename Context>
void fill(const Context& c, const phi::Scalar& value, DenseTensor* out) {
  c.template Alloc<T>(out);
  launch(c, "fill", dtype_of<T>(), {}, {describe(*out)}, {value.to<double>()});
}

template <typename T, typename Context>
void FullKernel(const Context& c, const phi::IntArray& shape, const phi::Scalar& value,
                phi::DataType, DenseTensor* out) {
  out->Resize(common::make_ddim(shape.GetData()));
  fill<T>(c, value, out);
}

template <typename T, typename Context>
void FullLikeKernel(const Context& c, const DenseTensor&, const phi::Scalar& value, phi::DataType,
                    DenseTensor* out) {
  fill<T>(c, value, out);
}

// ---- reductions ----

// attrs [keepdim, n, axes...] of the base reductions; no axes (or all of them) reduces all.
inline std::vector<double> reduce_attrs(const phi::IntArray& dims, int rank, bool keep_dim) {
  std::set<int64_t> axes;
  for (int64_t a : dims.GetData()) {
    int64_t axis = a < 0 ? a + rank : a;
    if (axis < 0 || axis >= std::max(rank, 1)) {
      fail("reduction axis " + std::to_string(a) + " is out of range for rank " + std::to_string(rank));
    }
    if (rank > 0) axes.insert(axis);
  }
  std::vector<double> attrs{keep_dim ? 1.0 : 0.0, 0.0};
  if (static_cast<int>(axes.size()) == rank) return attrs;
  attrs[1] = static_cast<double>(axes.size());
  for (int64_t a : axes) attrs.push_back(static_cast<double>(a));
  return attrs;
}

template <typename T, typename Context>
void reduce(const Context& c, const char* op, const DenseTensor& x, const phi::IntArray& dims,
            bool keep_dim, DenseTensor* out) {
  c.template Alloc<T>(out);
  launch(c, op, dtype_of<T>(), {describe(x)}, {describe(*out)}, reduce_attrs(dims, x.dims().size(), keep_dim));
}

template <typename T, typename Context>
void SumKernel(const Context& c, const DenseTensor& x, const phi::IntArray& dims, phi::DataType out_dtype,
               bool keep_dim, DenseTensor* out) {
  if (out_dtype != phi::DataType::UNDEFINED && out_dtype != x.dtype()) {
    fail("sum to another dtype (" + phi::DataTypeToString(x.dtype()) + " -> " +
         phi::DataTypeToString(out_dtype) + ") has no base kernel");
  }
  reduce<T>(c, "sum", x, dims, keep_dim, out);
}

template <typename T, typename Context>
void MeanKernel(const Context& c, const DenseTensor& x, const phi::IntArray& dims, bool keep_dim,
                DenseTensor* out) {
  reduce<T>(c, "mean", x, dims, keep_dim, out);
}

template <typename T, typename Context>
void MaxKernel(const Context& c, const DenseTensor& x, const phi::IntArray& dims, bool keep_dim,
               DenseTensor* out) {
  reduce<T>(c, "max", x, dims, keep_dim, out);
}

// ---- softmax ----

inline double normalized_axis(int axis, int rank) {
  return static_cast<double>(axis < 0 ? axis + rank : axis);
}

template <typename T, typename Context>
void SoftmaxKernel(const Context& c, const DenseTensor& x, int axis, DenseTensor* out) {
  c.template Alloc<T>(out);
  launch(c, "softmax", dtype_of<T>(), {describe(x)}, {describe(*out)}, {normalized_axis(axis, x.dims().size())});
}

template <typename T, typename Context>
void SoftmaxGradKernel(const Context& c, const DenseTensor& out, const DenseTensor& dout, int axis,
                       DenseTensor* dx) {
  c.template Alloc<T>(dx);
  launch(c, "softmax_grad", dtype_of<T>(), {describe(out), describe(dout)}, {describe(*dx)},
         {normalized_axis(axis, out.dims().size())});
}

// ---- matmul ----

// Paddle's matmul treats a 1-D x as a row [1, K] and a 1-D y as a column [K, 1] (their
// transpose flags ignored). The base op takes x and y with the output's batch rank (leading 1s
// added), a broadcast batch dimension as size 1 with stride 0, and the output as
// [batch..., M, N]; matmul_grad's dx and dy then have exactly x's and y's descriptor shapes.
struct MatmulShapes {
  AnychipTensor x, y, out;
  bool transpose_x, transpose_y;
};

inline AnychipTensor as_matrix(const DenseTensor& t, bool row) {
  AnychipTensor d = describe(t);
  if (d.rank >= 2) return d;
  if (d.rank != 1) fail("matmul of a rank-0 tensor");
  int64_t n = d.shape[0], s = d.strides[0];
  d.rank = 2;
  d.shape[0] = row ? 1 : n;
  d.shape[1] = row ? n : 1;
  d.strides[0] = row ? n * s : s;
  d.strides[1] = row ? s : 1;
  return d;
}

// `m` (a matrix or a batch of them) at batch rank `rank`: leading 1s, stride 0 on size 1.
inline AnychipTensor with_batch(const AnychipTensor& m, int rank) {
  AnychipTensor d = m;
  int own = m.rank - 2;
  d.rank = rank + 2;
  for (int i = 0; i < rank; ++i) {
    int j = i - (rank - own);
    d.shape[i] = j < 0 ? 1 : m.shape[j];
    d.strides[i] = d.shape[i] == 1 ? 0 : m.strides[j];
  }
  for (int k = 0; k < 2; ++k) {
    d.shape[rank + k] = m.shape[own + k];
    d.strides[rank + k] = m.strides[own + k];
  }
  return d;
}

inline MatmulShapes matmul_shapes(const DenseTensor& x, const DenseTensor& y, bool tx, bool ty,
                                  const DenseTensor& out) {
  MatmulShapes s;
  s.transpose_x = x.dims().size() >= 2 && tx;
  s.transpose_y = y.dims().size() >= 2 && ty;
  AnychipTensor xm = as_matrix(x, true), ym = as_matrix(y, false);
  int xb = xm.rank - 2, yb = ym.rank - 2, rank = std::max(xb, yb);
  std::vector<int64_t> batch(rank);
  for (int i = 0; i < rank; ++i) {
    int64_t a = i - (rank - xb) >= 0 ? xm.shape[i - (rank - xb)] : 1;
    int64_t b = i - (rank - yb) >= 0 ? ym.shape[i - (rank - yb)] : 1;
    if (a != b && a != 1 && b != 1) fail("matmul batch dimensions do not broadcast");
    batch[i] = std::max(a, b);
  }
  s.x = with_batch(xm, rank);
  s.y = with_batch(ym, rank);
  int64_t m = s.transpose_x ? xm.shape[xm.rank - 1] : xm.shape[xm.rank - 2];
  int64_t n = s.transpose_y ? ym.shape[ym.rank - 2] : ym.shape[ym.rank - 1];
  std::vector<int64_t> out_shape(batch);
  out_shape.push_back(m);
  out_shape.push_back(n);
  s.out = reshaped(out, out_shape);
  return s;
}

template <typename T, typename Context>
void MatmulKernel(const Context& c, const DenseTensor& x, const DenseTensor& y, bool transpose_x,
                  bool transpose_y, DenseTensor* out) {
  c.template Alloc<T>(out);
  MatmulShapes s = matmul_shapes(x, y, transpose_x, transpose_y, *out);
  launch(c, "matmul", dtype_of<T>(), {s.x, s.y}, {s.out},
         {s.transpose_x ? 1.0 : 0.0, s.transpose_y ? 1.0 : 0.0});
}

// dx and dy are given with x's and y's descriptor shapes (their own shapes with leading 1s,
// as_matrix's 1-D promotion included); the kernel sums the output batches that land on one
// of their batches (the base-op rule for matmul_grad).
template <typename T, typename Context>
void MatmulGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& y, const DenseTensor& dout,
                      bool transpose_x, bool transpose_y, DenseTensor* dx, DenseTensor* dy) {
  DenseTensor dx_unused, dy_unused;  // the base op writes both gradients
  if (dx == nullptr) { dx_unused = temporary<T>(c, x.dims()); dx = &dx_unused; }
  if (dy == nullptr) { dy_unused = temporary<T>(c, y.dims()); dy = &dy_unused; }
  c.template Alloc<T>(dx);
  c.template Alloc<T>(dy);
  MatmulShapes s = matmul_shapes(x, y, transpose_x, transpose_y, dout);
  auto shape = [](const AnychipTensor& d) { return std::vector<int64_t>(d.shape, d.shape + d.rank); };
  launch(c, "matmul_grad", dtype_of<T>(), {s.x, s.y, s.out}, {reshaped(*dx, shape(s.x)), reshaped(*dy, shape(s.y))},
         {s.transpose_x ? 1.0 : 0.0, s.transpose_y ? 1.0 : 0.0});
}

// ---- gradients of the broadcasting binary ops ----
// Paddle hands them un-broadcast x and y and the full-shape dout. Each gradient is computed at
// the output's shape with the base elementwise kernels, then summed over the dimensions its
// input was broadcast along (`sum` with keepdim, written straight into the gradient's memory),
// or copied when it was not broadcast.

template <typename T, typename Context>
void reduce_to(const Context& c, const AnychipTensor& full, DenseTensor* grad) {
  if (grad == nullptr) return;
  c.template Alloc<T>(grad);
  std::vector<int64_t> kept(full.rank);
  std::vector<double> attrs{1.0, 0.0};
  int lead = full.rank - grad->dims().size();
  for (int i = 0; i < full.rank; ++i) {
    int64_t own = i < lead ? 1 : grad->dims()[i - lead];
    kept[i] = own;
    if (own != full.shape[i]) attrs.push_back(i);
  }
  if (attrs.size() == 2) {
    launch(c, "copy", dtype_of<T>(), {full}, {reshaped(*grad, kept)});  // the ABI's copy: equal shapes
    return;
  }
  attrs[1] = static_cast<double>(attrs.size() - 2);
  launch(c, "sum", dtype_of<T>(), {full}, {reshaped(*grad, kept)}, attrs);
}

template <typename T, typename Context>
void AddGradKernel(const Context& c, const DenseTensor&, const DenseTensor&, const DenseTensor& dout,
                   int, DenseTensor* dx, DenseTensor* dy) {
  reduce_to<T>(c, describe(dout), dx);
  reduce_to<T>(c, describe(dout), dy);
}

template <typename T, typename Context>
void SubtractGradKernel(const Context& c, const DenseTensor&, const DenseTensor&, const DenseTensor& dout,
                        int, DenseTensor* dx, DenseTensor* dy) {
  reduce_to<T>(c, describe(dout), dx);
  if (dy == nullptr) return;
  DenseTensor neg = temporary<T>(c, dout.dims());
  launch(c, "scale", dtype_of<T>(), {describe(dout)}, {describe(neg)}, {-1.0, 0.0, 1.0});
  reduce_to<T>(c, describe(neg), dy);
}

template <typename T, typename Context>
void MultiplyGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& y, const DenseTensor& dout,
                        int, DenseTensor* dx, DenseTensor* dy) {
  const phi::DDim& dims = dout.dims();
  for (auto [grad, other] : {std::make_pair(dx, &y), std::make_pair(dy, &x)}) {
    if (grad == nullptr) continue;
    DenseTensor full = temporary<T>(c, dims);
    launch(c, "multiply", dtype_of<T>(), {describe(dout), broadcast(*other, dims)}, {describe(full)});
    reduce_to<T>(c, describe(full), grad);
  }
}

// dx = dout / y; dy = -dout * out / y = -(dout / y) * out.
template <typename T, typename Context>
void DivideGradKernel(const Context& c, const DenseTensor&, const DenseTensor& y, const DenseTensor& out,
                      const DenseTensor& dout, int, DenseTensor* dx, DenseTensor* dy) {
  const phi::DDim& dims = dout.dims();
  DenseTensor quotient = temporary<T>(c, dims);
  launch(c, "divide", dtype_of<T>(), {describe(dout), broadcast(y, dims)}, {describe(quotient)});
  reduce_to<T>(c, describe(quotient), dx);
  if (dy == nullptr) return;
  DenseTensor product = temporary<T>(c, dims);
  launch(c, "multiply", dtype_of<T>(), {describe(quotient), broadcast(out, dims)}, {describe(product)});
  DenseTensor negated = temporary<T>(c, dims);
  launch(c, "scale", dtype_of<T>(), {describe(product)}, {describe(negated)}, {-1.0, 0.0, 1.0});
  reduce_to<T>(c, describe(negated), dy);
}

// dx = dout / scale (the division itself, not a multiplication by 1 / scale, so results match
// Paddle's CPU kernel bit for bit): a rank-0 tensor holding scale, broadcast.
template <typename T, typename Context>
void DivScaleKernel(const Context& c, const DenseTensor& x, const phi::Scalar& scale, DenseTensor* out) {
  c.template Alloc<T>(out);
  DenseTensor divisor = temporary<T>(c, common::make_ddim({}));
  launch(c, "fill", dtype_of<T>(), {}, {describe(divisor)}, {scale.to<double>()});
  launch(c, "divide", dtype_of<T>(), {broadcast(x, out->dims()), broadcast(divisor, out->dims())}, {describe(*out)});
}

// dx = dout broadcast back over the reduced dimensions (a copy with stride 0 there).
template <typename T, typename Context>
void SumGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& out_grad, const phi::IntArray& dims,
                   bool keep_dim, bool reduce_all, DenseTensor* x_grad) {
  c.template Alloc<T>(x_grad);
  int rank = x.dims().size();
  std::vector<double> attrs = reduce_attrs(dims, rank, true);
  std::vector<bool> reduced(rank, reduce_all || attrs[1] == 0);
  for (size_t k = 2; k < attrs.size(); ++k) reduced[static_cast<int>(attrs[k])] = true;
  std::vector<int64_t> kept(rank);
  for (int i = 0; i < rank; ++i) kept[i] = reduced[i] ? 1 : x.dims()[i];
  DenseTensor storage;
  AnychipTensor g = dense(c, out_grad, &storage);
  g.rank = rank;
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {  // out_grad's dense memory seen at x's rank
    g.shape[i] = x.dims()[i];
    g.strides[i] = reduced[i] ? 0 : stride;
    stride *= kept[i];
  }
  launch(c, "copy", dtype_of<T>(), {g}, {describe(*x_grad)});
}

// ---- copies: views of the input or of the output moved by the base `copy` kernel ----

template <typename T, typename Context>
void split_along(const Context& c, const DenseTensor& x, const phi::Scalar& axis, const std::vector<DenseTensor*>& out) {
  AnychipTensor from = describe(x);
  int a = normalized(axis.to<int64_t>(), from.rank, "split");
  int64_t start = 0;
  for (DenseTensor* o : out) {
    c.template Alloc<T>(o);
    int64_t length = o->dims()[a];
    launch(c, "copy", dtype_of<T>(), {narrow(from, a, start, length)}, {describe(*o)});
    start += length;
  }
}

template <typename T, typename Context>
void SplitKernel(const Context& c, const DenseTensor& x, const phi::IntArray&, const phi::Scalar& axis,
                 std::vector<DenseTensor*> out) {
  split_along<T>(c, x, axis, out);  // the sections are the outputs' sizes, inferred already
}

template <typename T, typename Context>
void SplitWithNumKernel(const Context& c, const DenseTensor& x, int, const phi::Scalar& axis,
                        std::vector<DenseTensor*> out) {
  split_along<T>(c, x, axis, out);
}

// Each input is copied into its slice of the output (copy's output may be a strided view).
template <typename T, typename Context>
void ConcatKernel(const Context& c, const std::vector<const DenseTensor*>& x, const phi::Scalar& axis,
                  DenseTensor* out) {
  c.template Alloc<T>(out);
  AnychipTensor to = describe(*out);
  int a = normalized(axis.to<int64_t>(), to.rank, "concat");
  int64_t start = 0;
  for (const DenseTensor* t : x) {
    if (t->numel() == 0) continue;  // Paddle lets empty tensors of any shape join
    int64_t length = t->dims()[a];
    launch(c, "copy", dtype_of<T>(), {describe(*t)}, {narrow(to, a, start, length)});
    start += length;
  }
}

// out = x broadcast to out's shape (inferred from `shape`, -1 entries resolved).
template <typename T, typename Context>
void ExpandKernel(const Context& c, const DenseTensor& x, const phi::IntArray&, DenseTensor* out) {
  c.template Alloc<T>(out);
  launch(c, "copy", dtype_of<T>(), {broadcast(x, out->dims())}, {describe(*out)});
}

// out = x with its dimensions permuted: out dim i is x dim axis[i].
template <typename T, typename Context>
void permute(const Context& c, const DenseTensor& x, const std::vector<int>& axis, DenseTensor* out) {
  c.template Alloc<T>(out);
  AnychipTensor from = describe(x), view = from;
  if (static_cast<int>(axis.size()) != from.rank) fail("transpose needs one axis per dimension of x");
  for (int i = 0; i < from.rank; ++i) {
    int a = normalized(axis[i], from.rank, "transpose");
    view.shape[i] = from.shape[a];
    view.strides[i] = from.strides[a];
  }
  launch(c, "copy", dtype_of<T>(), {view}, {describe(*out)});
}

template <typename T, typename Context>
void TransposeKernel(const Context& c, const DenseTensor& x, const std::vector<int>& axis, DenseTensor* out) {
  permute<T>(c, x, axis, out);
}

template <typename T, typename Context>
void TransposeGradKernel(const Context& c, const DenseTensor& out_grad, const std::vector<int>& axis,
                         DenseTensor* x_grad) {
  std::vector<int> inverse(axis.size());
  for (size_t i = 0; i < axis.size(); ++i) inverse[normalized(axis[i], static_cast<int>(axis.size()), "transpose")] = i;
  permute<T>(c, out_grad, inverse, x_grad);
}

// x's memory seen as the slice [starts, ends) with `steps` along `axes` (Python's rules for
// negative and out-of-range bounds, as Paddle's slicing applies them).
inline AnychipTensor sliced(AnychipTensor d, const std::vector<int64_t>& axes, const std::vector<int64_t>& starts,
                            const std::vector<int64_t>& ends, const std::vector<int64_t>& steps) {
  if (starts.size() != axes.size() || ends.size() != axes.size() || (!steps.empty() && steps.size() != axes.size())) {
    fail("slice needs one start, end (and step) per axis");
  }
  for (size_t k = 0; k < axes.size(); ++k) {
    int a = normalized(axes[k], d.rank, "slice");
    int64_t n = d.shape[a], step = steps.empty() ? 1 : steps[k];
    if (step == 0) fail("slice step must not be 0");
    int64_t start = starts[k] < 0 ? starts[k] + n : starts[k];
    int64_t end = ends[k] < 0 ? ends[k] + n : ends[k];
    int64_t count;
    if (step > 0) {
      start = std::clamp<int64_t>(start, 0, n);
      end = std::clamp<int64_t>(end, 0, n);
      count = end > start ? (end - start + step - 1) / step : 0;
    } else {
      start = std::clamp<int64_t>(start, -1, n - 1);
      end = std::clamp<int64_t>(end, -1, n - 1);
      count = start > end ? (start - end - step - 1) / -step : 0;
    }
    d = narrow(d, a, count > 0 ? start : 0, count);
    d.strides[a] *= step;
  }
  return d;
}

template <typename T, typename Context>
void SliceKernel(const Context& c, const DenseTensor& input, const std::vector<int64_t>& axes,
                 const phi::IntArray& starts, const phi::IntArray& ends, const std::vector<int64_t>&,
                 const std::vector<int64_t>&, DenseTensor* out) {
  c.template Alloc<T>(out);
  AnychipTensor view = sliced(describe(input), axes, starts.GetData(), ends.GetData(), {});
  // out has the slice's elements in the same order (decrease_axis only drops size-1 dims)
  launch(c, "copy", dtype_of<T>(), {view}, {reshaped(*out, std::vector<int64_t>(view.shape, view.shape + view.rank))});
}

// A copy into out's shape (the same elements in the same order): unsqueeze and the like.
template <typename T, typename Context>
void UnsqueezeKernel(const Context& c, const DenseTensor& x, const phi::IntArray&, DenseTensor* out) {
  c.template Alloc<T>(out);
  launch(c, "copy", dtype_of<T>(), {describe(x)}, {reshaped(*out, common::vectorize<int64_t>(x.dims()))});
}

// out = x with the slice (starts, ends, steps along axes) set to value, broadcast. Paddle's
// rule: value broadcasts to the slice's shape without decrease_axes and with a 1 at none_axes.
template <typename T, typename Context>
void SetTensorValueKernel(const Context& c, const DenseTensor& x, const DenseTensor& value,
                          const phi::IntArray& starts, const phi::IntArray& ends, const phi::IntArray& steps,
                          const std::vector<int64_t>& axes, const std::vector<int64_t>& decrease_axes,
                          const std::vector<int64_t>& none_axes, DenseTensor* out) {
  c.template Alloc<T>(out);
  if (out->data() != x.data()) launch(c, "copy", dtype_of<T>(), {describe(x)}, {describe(*out)});  // not in place
  AnychipTensor view = sliced(describe(*out), axes, starts.GetData(), ends.GetData(), steps.GetData());
  std::vector<int64_t> target;
  std::vector<int> dim_of;  // the view's dimension of each target dimension; -1 at a none axis
  for (int i = 0; i < view.rank; ++i) {
    if (std::find(decrease_axes.begin(), decrease_axes.end(), i) != decrease_axes.end()) continue;
    target.push_back(view.shape[i]);
    dim_of.push_back(i);
  }
  for (int64_t n : none_axes) {
    int64_t at = std::clamp<int64_t>(n, 0, static_cast<int64_t>(target.size()));
    target.insert(target.begin() + at, 1);
    dim_of.insert(dim_of.begin() + at, -1);
  }
  AnychipTensor v = broadcast(value, common::make_ddim(target)), from = view;
  from.data = v.data;
  from.dtype = v.dtype;
  for (int i = 0; i < view.rank; ++i) from.strides[i] = 0;  // the decreased dims (size 1)
  for (size_t j = 0; j < target.size(); ++j) {
    if (dim_of[j] >= 0) from.strides[dim_of[j]] = v.strides[j];
  }
  launch(c, "copy", dtype_of<T>(), {from}, {view});
}

// dx_i = dout's slice along axis where x_i landed (gradients not asked for are skipped).
template <typename T, typename Context>
void ConcatGradKernel(const Context& c, const std::vector<const DenseTensor*>& x, const DenseTensor& out_grad,
                      const phi::Scalar& axis, std::vector<DenseTensor*> x_grad) {
  AnychipTensor from = describe(out_grad);
  int a = normalized(axis.to<int64_t>(), from.rank, "concat_grad");
  int64_t start = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i]->numel() == 0) continue;
    int64_t length = x[i]->dims()[a];
    if (i < x_grad.size() && x_grad[i] != nullptr) {
      c.template Alloc<T>(x_grad[i]);
      launch(c, "copy", dtype_of<T>(), {narrow(from, a, start, length)}, {describe(*x_grad[i])});
    }
    start += length;
  }
}

// ---- gathers ----

// out = x's slices at `index` along `axis` (index_select). A rank-0 index drops the axis.
template <typename T, typename Context>
void select(const Context& c, const DenseTensor& x, const DenseTensor& index, int64_t axis, DenseTensor* out) {
  c.template Alloc<T>(out);
  int rank = x.dims().size();
  int a = normalized(axis, rank, "gather");
  DenseTensor x_storage, index_storage;
  AnychipTensor xd = dense(c, x, &x_storage);
  AnychipTensor id = int64_index(c, index, &index_storage);
  if (id.rank > 1) fail("the index must be 1-D, got shape " + index.dims().to_str());
  int64_t n = id.rank == 0 ? 1 : id.shape[0];
  id.rank = 1;
  id.shape[0] = n;
  id.strides[0] = 1;
  std::vector<int64_t> shape(x.dims().Get(), x.dims().Get() + rank);
  shape[a] = n;
  launch(c, "index_select", dtype_of<T>(), {xd, id}, {reshaped(*out, shape)}, {static_cast<double>(a)});
}

template <typename T, typename Context>
void GatherKernel(const Context& c, const DenseTensor& x, const DenseTensor& index, const phi::Scalar& axis,
                  DenseTensor* out) {
  select<T>(c, x, index, axis.to<int64_t>(), out);
}

template <typename T, typename Context>
void IndexSelectKernel(const Context& c, const DenseTensor& x, const DenseTensor& index, int dim, DenseTensor* out) {
  select<T>(c, x, index, dim, out);
}

// dx = scatter-add of dout's slices at `index` along `axis`, as embedding_grad does for rows:
// per position of the dimensions before `axis`, dout's [n, rest] block lands on dx's [N, rest].
template <typename T, typename Context>
void scatter_add(const Context& c, const DenseTensor& index, const DenseTensor& out_grad, int64_t axis,
                 DenseTensor* x_grad) {
  c.template Alloc<T>(x_grad);
  const phi::DDim& dims = x_grad->dims();
  int a = normalized(axis, dims.size(), "gather_grad");
  DenseTensor index_storage, grad_storage;
  AnychipTensor id = int64_index(c, index, &index_storage);
  int64_t n = id.rank == 0 ? 1 : id.shape[0];
  id.rank = 1;
  id.shape[0] = n;
  id.strides[0] = 1;
  AnychipTensor g = dense(c, out_grad, &grad_storage);
  int64_t outer = 1, rest = 1;
  for (int i = 0; i < a; ++i) outer *= dims[i];
  for (int i = a + 1; i < dims.size(); ++i) rest *= dims[i];
  AnychipTensor dx = reshaped(*x_grad, {outer, dims[a], rest});
  g.rank = 3;
  g.shape[0] = outer, g.shape[1] = n, g.shape[2] = rest;
  g.strides[0] = n * rest, g.strides[1] = rest, g.strides[2] = 1;
  for (int64_t o = 0; o < outer; ++o) {
    AnychipTensor dout = narrow(g, 0, o, 1), dweight = narrow(dx, 0, o, 1);
    for (AnychipTensor* d : {&dout, &dweight}) {  // drop the leading 1: [n, rest] and [N, rest]
      d->rank = 2;
      d->shape[0] = d->shape[1], d->shape[1] = d->shape[2];
      d->strides[0] = d->strides[1], d->strides[1] = 1;
    }
    launch(c, "embedding_grad", dtype_of<T>(), {id, dout}, {dweight}, {-1.0});
  }
}

template <typename T, typename Context>
void GatherGradKernel(const Context& c, const DenseTensor&, const DenseTensor& index, const DenseTensor& out_grad,
                      const phi::Scalar& axis, DenseTensor* x_grad) {
  scatter_add<T>(c, index, out_grad, axis.to<int64_t>(), x_grad);
}

template <typename T, typename Context>
void IndexSelectGradKernel(const Context& c, const DenseTensor&, const DenseTensor& index,
                           const DenseTensor& out_grad, int dim, DenseTensor* x_grad) {
  scatter_add<T>(c, index, out_grad, dim, x_grad);
}

template <typename T, typename Context>
void EmbeddingKernel(const Context& c, const DenseTensor& ids, const DenseTensor& weight, int64_t padding_idx,
                     DenseTensor* out) {
  c.template Alloc<T>(out);
  DenseTensor ids_storage, weight_storage;
  AnychipTensor id = int64_index(c, ids, &ids_storage);
  launch(c, "embedding", dtype_of<T>(), {id, dense(c, weight, &weight_storage)}, {describe(*out)},
         {static_cast<double>(padding_idx)});
}

template <typename T, typename Context>
void EmbeddingGradKernel(const Context& c, const DenseTensor& ids, const DenseTensor&, const DenseTensor& out_grad,
                         int64_t padding_idx, DenseTensor* weight_grad) {
  c.template Alloc<T>(weight_grad);
  DenseTensor ids_storage, grad_storage;
  AnychipTensor id = int64_index(c, ids, &ids_storage);
  launch(c, "embedding_grad", dtype_of<T>(), {id, dense(c, out_grad, &grad_storage)}, {describe(*weight_grad)},
         {static_cast<double>(padding_idx)});
}

// ---- cross-entropy over softmax: hard int labels [..., 1] on the last axis ----

inline void require_hard_last_axis(const char* op, bool soft_label, bool use_softmax, int axis, int rank) {
  if (soft_label) fail(std::string(op) + ": soft labels have no base kernel (hard int64 labels only)");
  if (!use_softmax) fail(std::string(op) + ": use_softmax=False has no base kernel");
  if (normalized(axis, rank, op) != rank - 1) {
    fail(std::string(op) + ": axis " + std::to_string(axis) + " has no base kernel (the last axis only)");
  }
}

template <typename T, typename Context>
void CrossEntropyWithSoftmaxKernel(const Context& c, const DenseTensor& logits, const DenseTensor& label,
                                   bool soft_label, bool use_softmax, bool, int ignore_index, int axis,
                                   DenseTensor* softmax, DenseTensor* loss) {
  require_hard_last_axis("cross_entropy_with_softmax", soft_label, use_softmax, axis, logits.dims().size());
  c.template Alloc<T>(softmax);
  c.template Alloc<T>(loss);
  DenseTensor logits_storage, label_storage;
  launch(c, "cross_entropy_with_softmax", dtype_of<T>(),
         {dense(c, logits, &logits_storage), int64_index(c, label, &label_storage)},
         {describe(*softmax), describe(*loss)}, {static_cast<double>(ignore_index)});
}

template <typename T, typename Context>
void CrossEntropyWithSoftmaxGradKernel(const Context& c, const DenseTensor& label, const DenseTensor& softmax,
                                       const DenseTensor& loss_grad, bool soft_label, bool use_softmax, bool,
                                       int ignore_index, int axis, DenseTensor* logits_grad) {
  require_hard_last_axis("cross_entropy_with_softmax_grad", soft_label, use_softmax, axis, softmax.dims().size());
  c.template Alloc<T>(logits_grad);
  DenseTensor label_storage, softmax_storage, grad_storage;
  launch(c, "cross_entropy_with_softmax_grad", dtype_of<T>(),
         {int64_index(c, label, &label_storage), dense(c, softmax, &softmax_storage),
          dense(c, loss_grad, &grad_storage)},
         {describe(*logits_grad)}, {static_cast<double>(ignore_index)});
}

// out[p] = x[p with its `axis` coordinate replaced by index[p]], as an embedding lookup of x's
// elements (a [numel, 1] table) at the linear offsets index[p] * stride(axis) + the offset of
// p's other coordinates, built in int64 with arange, multiply and add.
template <typename T, typename Context>
void TakeAlongAxisKernel(const Context& c, const DenseTensor& x, const DenseTensor& index, int axis,
                         DenseTensor* out) {
  c.template Alloc<T>(out);
  const phi::DataType i64 = phi::DataType::INT64;
  DenseTensor x_storage, index_storage;
  AnychipTensor table = dense(c, x, &x_storage);
  AnychipTensor id = int64_index(c, index, &index_storage);
  int rank = table.rank, a = normalized(axis, rank, "take_along_axis");
  if (id.rank != rank) fail("take_along_axis: index must have x's rank");
  const phi::DDim& dims = index.dims();
  DenseTensor stride = temporary(c, common::make_ddim({}), i64);
  DenseTensor offsets = temporary(c, dims, i64), next = temporary(c, dims, i64);  // no in-place launches
  launch(c, "fill", i64, {}, {describe(stride)}, {static_cast<double>(table.strides[a])});
  launch(c, "multiply", i64, {id, broadcast(stride, dims)}, {describe(offsets)});
  for (int d = 0; d < rank; ++d) {
    if (d == a || dims[d] == 1) continue;
    if (dims[d] > table.shape[d]) fail("take_along_axis: index is larger than x along dimension " + std::to_string(d));
    DenseTensor steps = temporary(c, common::make_ddim({dims[d]}), i64);
    launch(c, "arange", i64, {}, {describe(steps)}, {0.0, static_cast<double>(table.strides[d])});
    AnychipTensor along = describe(steps);  // [n] seen along dimension d of index's shape
    along.rank = rank;
    for (int k = 0; k < rank; ++k) along.shape[k] = dims[k], along.strides[k] = 0;
    along.strides[d] = 1;
    launch(c, "add", i64, {describe(offsets), along}, {describe(next)});
    std::swap(offsets, next);
  }
  int64_t numel = 1;
  for (int k = 0; k < rank; ++k) numel *= table.shape[k];
  std::vector<int64_t> out_shape = common::vectorize<int64_t>(dims);
  out_shape.push_back(1);
  AnychipTensor rows = table;
  rows.rank = 2, rows.shape[0] = numel, rows.shape[1] = 1, rows.strides[0] = 1, rows.strides[1] = 1;
  launch(c, "embedding", dtype_of<T>(), {describe(offsets), rows}, {reshaped(*out, out_shape)}, {-1.0});
}


// ==== issue 37 part 2: the kernels PaddleNLP's model families and their training reach ====
// Everything below composes the base ops above (no arithmetic on T in a wrapper: each one is
// instantiated for every dtype of CPP_TYPES). Scratch values are temporaries of the launch's
// dtype; a rank-0 `constant` broadcasts as a stride-0 input.

constexpr phi::DataType kF32 = phi::DataType::FLOAT32;
constexpr phi::DataType kI64 = phi::DataType::INT64;
constexpr phi::DataType kBool = phi::DataType::BOOL;

inline phi::DDim scalar_dims() { return common::make_ddim(std::vector<int64_t>{}); }

// A rank-0 tensor of `dtype` holding `value` (the fill rule: cast to the dtype).
template <typename Context>
DenseTensor constant(const Context& c, double value, phi::DataType dtype) {
  DenseTensor t = temporary(c, scalar_dims(), dtype);
  launch(c, "fill", dtype, {}, {describe(t)}, {value});
  return t;
}

// A fresh temporary of `out_dtype` and shape `dims` holding elementwise base op `op` (keyed by
// `key`) of `ins` (descriptors already at `dims`: see broadcast()).
template <typename Context>
DenseTensor apply(const Context& c, const char* op, phi::DataType key, const std::vector<AnychipTensor>& ins,
                  const phi::DDim& dims, phi::DataType out_dtype, const std::vector<double>& attrs = {}) {
  DenseTensor t = temporary(c, dims, out_dtype);
  launch(c, op, key, ins, {describe(t)}, attrs);
  return t;
}

// `d` with the size-1 dimension `axis` removed (a stack slice seen at the inputs' rank).
inline AnychipTensor drop_dim(AnychipTensor d, int axis) {
  for (int i = axis; i + 1 < d.rank; ++i) d.shape[i] = d.shape[i + 1], d.strides[i] = d.strides[i + 1];
  d.rank -= 1;
  return d;
}

// `d` with dimension `axis` moved last (the others keep their order).
inline AnychipTensor axis_last(AnychipTensor d, int axis) {
  int64_t n = d.shape[axis], s = d.strides[axis];
  for (int i = axis; i + 1 < d.rank; ++i) d.shape[i] = d.shape[i + 1], d.strides[i] = d.strides[i + 1];
  d.shape[d.rank - 1] = n, d.strides[d.rank - 1] = s;
  return d;
}

inline std::vector<int64_t> shape_of(const AnychipTensor& d) { return std::vector<int64_t>(d.shape, d.shape + d.rank); }

inline int64_t numel_of(const AnychipTensor& d) {
  int64_t n = 1;
  for (int i = 0; i < d.rank; ++i) n *= d.shape[i];
  return n;
}

// out gets x's elements in the same order (squeeze, reshape, flatten and their grads).
template <typename T, typename Context>
void same_elements(const Context& c, const DenseTensor& x, DenseTensor* out) {
  c.template Alloc<T>(out);
  if (x.numel() != out->numel()) {
    fail("cannot copy " + x.dims().to_str() + " into " + out->dims().to_str() + ": element counts differ");
  }
  launch(c, "copy", dtype_of<T>(), {describe(x)}, {reshaped(*out, common::vectorize<int64_t>(x.dims()))});
}

template <typename T, typename Context>
void SqueezeKernel(const Context& c, const DenseTensor& x, const phi::IntArray&, DenseTensor* out) {
  same_elements<T>(c, x, out);
}

template <typename T, typename Context>
void SqueezeGradKernel(const Context& c, const DenseTensor&, const DenseTensor& dout, const phi::IntArray&,
                       DenseTensor* dx) {
  same_elements<T>(c, dout, dx);
}

template <typename T, typename Context>
void UnsqueezeGradKernel(const Context& c, const DenseTensor&, const DenseTensor& dout, DenseTensor* dx) {
  same_elements<T>(c, dout, dx);
}

template <typename T, typename Context>
void ReshapeKernel(const Context& c, const DenseTensor& x, const phi::IntArray&, DenseTensor* out) {
  same_elements<T>(c, x, out);
}

template <typename T, typename Context>
void ReshapeGradKernel(const Context& c, const DenseTensor&, const DenseTensor& out_grad, DenseTensor* x_grad) {
  same_elements<T>(c, out_grad, x_grad);
}

template <typename T, typename Context>
void FlattenKernel(const Context& c, const DenseTensor& x, int, int, DenseTensor* out) {
  same_elements<T>(c, x, out);
}

template <typename T, typename Context>
void FlattenGradKernel(const Context& c, const DenseTensor&, const DenseTensor& out_grad, DenseTensor* x_grad) {
  same_elements<T>(c, out_grad, x_grad);
}

template <typename T, typename Context>
void AssignKernel(const Context& c, const DenseTensor& x, DenseTensor* out) {
  same_elements<T>(c, x, out);
}

// A dense copy of a strided view: what Paddle calls before a kernel that needs dense memory.
template <typename T, typename Context>
void ContiguousKernel(const Context& c, const DenseTensor& input, DenseTensor* out) {
  phi::DenseTensorMeta meta = input.meta();
  meta.strides = meta.calc_strides(meta.dims);
  meta.offset = 0;
  out->set_meta(meta);
  c.template Alloc<T>(out);
  launch(c, "copy", dtype_of<T>(), {describe(input)}, {describe(*out)});
}

// input copied into out's storage seen with `dims`, `out_stride` and byte `offset` (Paddle's
// writes through a strided view: out already holds the storage).
template <typename T, typename Context>
void StridedCopyKernel(const Context& c, const DenseTensor& input, const std::vector<int64_t>& dims,
                       const std::vector<int64_t>& out_stride, int64_t offset, DenseTensor* out) {
  if (dims.size() != out_stride.size()) fail("strided_copy: dims and out_stride have different lengths");
  phi::DenseTensorMeta meta = input.meta();
  meta.dims = common::make_ddim(dims);
  meta.strides = common::make_ddim(out_stride);
  meta.offset = offset;
  out->set_meta(meta);
  c.template Alloc<T>(out);
  AnychipTensor from = describe(input);
  if (shape_of(from) != dims) {
    if (!is_dense(from)) fail("strided_copy: a strided input of shape " + input.dims().to_str() + " into " +
                              out->dims().to_str());
    from = reshaped(input, dims);
  }
  launch(c, "copy", dtype_of<T>(), {from}, {describe(*out)});
}

template <typename T, typename Context>
void FillKernel(const Context& c, const DenseTensor&, const phi::Scalar& value, DenseTensor* out) {
  fill<T>(c, value, out);
}

// out (rank R) seen as [repeat_0, x_0, repeat_1, x_1, ...]: x is read with stride 0 along
// the repeats. Dimensions of size 1 are left out so that rank 2R fits ANYCHIP_MAX_RANK.
template <typename T, typename Context>
void TileKernel(const Context& c, const DenseTensor& x, const phi::IntArray&, DenseTensor* out) {
  c.template Alloc<T>(out);
  AnychipTensor to = describe(*out), from = describe(x);
  AnychipTensor src = from, dst = to;
  src.rank = dst.rank = 0;
  int lead = to.rank - from.rank;
  if (lead < 0) fail("tile: the output has a lower rank than x");
  for (int i = 0; i < to.rank; ++i) {
    int64_t own = i < lead ? 1 : from.shape[i - lead];
    int64_t own_stride = i < lead ? 0 : from.strides[i - lead];
    int64_t repeat = own == 0 ? 0 : to.shape[i] / own;
    if (dst.rank + 2 > ANYCHIP_MAX_RANK) fail("tile: rank " + std::to_string(to.rank) + " is too large");
    if (repeat != 1) {
      dst.shape[dst.rank] = repeat, dst.strides[dst.rank] = own * to.strides[i];
      src.shape[src.rank] = repeat, src.strides[src.rank] = 0;
      ++dst.rank, ++src.rank;
    }
    dst.shape[dst.rank] = own, dst.strides[dst.rank] = to.strides[i];
    src.shape[src.rank] = own, src.strides[src.rank] = own_stride;
    ++dst.rank, ++src.rank;
  }
  launch(c, "copy", dtype_of<T>(), {src}, {dst});
}

// x_grad = out_grad seen as [repeat_0, x_0, ...] summed over the repeats.
template <typename T, typename Context>
void TileGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& out_grad, const phi::IntArray&,
                    DenseTensor* x_grad) {
  c.template Alloc<T>(x_grad);
  AnychipTensor g = describe(out_grad), view = g;
  view.rank = 0;
  std::vector<int64_t> kept;
  std::vector<double> attrs{1.0, 0.0};
  int lead = g.rank - x.dims().size();
  if (lead < 0) fail("tile_grad: out_grad has a lower rank than x");
  for (int i = 0; i < g.rank; ++i) {
    int64_t own = i < lead ? 1 : x.dims()[i - lead];
    int64_t repeat = own == 0 ? 0 : g.shape[i] / own;
    if (view.rank + 2 > ANYCHIP_MAX_RANK) fail("tile_grad: rank " + std::to_string(g.rank) + " is too large");
    if (repeat != 1) {
      attrs.push_back(view.rank);
      kept.push_back(1);
      view.shape[view.rank] = repeat, view.strides[view.rank] = own * g.strides[i], ++view.rank;
    }
    kept.push_back(own);
    view.shape[view.rank] = own, view.strides[view.rank] = g.strides[i], ++view.rank;
  }
  if (attrs.size() == 2) {  // nothing repeated
    launch(c, "copy", dtype_of<T>(), {view}, {reshaped(*x_grad, kept)});
    return;
  }
  attrs[1] = static_cast<double>(attrs.size() - 2);
  launch(c, "sum", dtype_of<T>(), {view}, {reshaped(*x_grad, kept)}, attrs);
}

// x read backwards along `axis`: the view starts at the last element with negated strides.
template <typename T, typename Context>
void FlipKernel(const Context& c, const DenseTensor& x, const std::vector<int>& axis, DenseTensor* out) {
  c.template Alloc<T>(out);
  AnychipTensor view = describe(x);
  std::set<int> flipped;
  for (int a : axis) flipped.insert(normalized(a, view.rank, "flip"));
  for (int a : flipped) {
    if (view.shape[a] == 0) continue;
    view.data = static_cast<char*>(view.data) +
                (view.shape[a] - 1) * view.strides[a] * static_cast<int64_t>(element_size(view.dtype));
    view.strides[a] = -view.strides[a];
  }
  launch(c, "copy", dtype_of<T>(), {view}, {describe(*out)});
}

// out[(i + shift) mod n] = x[i] along each axis in turn (a flat roll when `axis` is empty):
// two copies per axis, through a temporary between axes.
template <typename T, typename Context>
void roll(const Context& c, const DenseTensor& x, const std::vector<int64_t>& shifts, const std::vector<int64_t>& axis,
          int sign, DenseTensor* out) {
  c.template Alloc<T>(out);
  DenseTensor x_storage;
  AnychipTensor from = describe(x), to = describe(*out);
  std::vector<int64_t> axes = axis;
  if (axes.empty()) {  // Paddle rolls the flattened tensor
    from = dense(c, x, &x_storage);
    from = reshaped(from, {numel_of(from)});
    to = reshaped(*out, {out->numel()});
    axes = {0};
  }
  if (shifts.size() != axes.size()) fail("roll needs one shift per axis");
  std::vector<DenseTensor> steps;
  for (size_t k = 0; k < axes.size(); ++k) {
    int a = normalized(axes[k], from.rank, "roll");
    AnychipTensor dst = to;
    if (k + 1 < axes.size()) {
      steps.push_back(temporary<T>(c, common::make_ddim(shape_of(from))));
      dst = describe(steps.back());
    }
    int64_t n = from.shape[a];
    int64_t s = n == 0 ? 0 : ((sign * shifts[k]) % n + n) % n;
    launch(c, "copy", dtype_of<T>(), {narrow(from, a, 0, n - s)}, {narrow(dst, a, s, n - s)});
    if (s > 0) launch(c, "copy", dtype_of<T>(), {narrow(from, a, n - s, s)}, {narrow(dst, a, 0, s)});
    from = dst;
  }
}

template <typename T, typename Context>
void RollKernel(const Context& c, const DenseTensor& x, const phi::IntArray& shifts, const std::vector<int64_t>& axis,
                DenseTensor* out) {
  roll<T>(c, x, shifts.GetData(), axis, 1, out);
}

template <typename T, typename Context>
void RollGradKernel(const Context& c, const DenseTensor&, const DenseTensor& out_grad, const phi::IntArray& shifts,
                    const std::vector<int64_t>& axis, DenseTensor* x_grad) {
  roll<T>(c, out_grad, shifts.GetData(), axis, -1, x_grad);
}

template <typename T, typename Context>
void StackKernel(const Context& c, const std::vector<const DenseTensor*>& x, int axis, DenseTensor* out) {
  c.template Alloc<T>(out);
  AnychipTensor to = describe(*out);
  int a = normalized(axis, to.rank, "stack");
  for (size_t i = 0; i < x.size(); ++i) {
    launch(c, "copy", dtype_of<T>(), {describe(*x[i])}, {drop_dim(narrow(to, a, static_cast<int64_t>(i), 1), a)});
  }
}

template <typename T, typename Context>
void StackGradKernel(const Context& c, const DenseTensor& out_grad, int axis, std::vector<DenseTensor*> x_grad) {
  AnychipTensor from = describe(out_grad);
  int a = normalized(axis, from.rank, "stack_grad");
  for (size_t i = 0; i < x_grad.size(); ++i) {
    if (x_grad[i] == nullptr) continue;
    c.template Alloc<T>(x_grad[i]);
    launch(c, "copy", dtype_of<T>(), {drop_dim(narrow(from, a, static_cast<int64_t>(i), 1), a)},
           {describe(*x_grad[i])});
  }
}

template <typename T, typename Context>
void ExpandGradKernel(const Context& c, const DenseTensor&, const DenseTensor& out_grad, const phi::IntArray&,
                      DenseTensor* in_grad) {
  reduce_to<T>(c, describe(out_grad), in_grad);
}

template <typename T, typename Context>
void ExpandAsKernel(const Context& c, const DenseTensor& x, const paddle::optional<DenseTensor>&,
                    const std::vector<int64_t>&, DenseTensor* out) {
  c.template Alloc<T>(out);
  launch(c, "copy", dtype_of<T>(), {broadcast(x, out->dims())}, {describe(*out)});
}

template <typename T, typename Context>
void ExpandAsGradKernel(const Context& c, const DenseTensor&, const DenseTensor& out_grad, const std::vector<int64_t>&,
                        DenseTensor* in_grad) {
  reduce_to<T>(c, describe(out_grad), in_grad);
}

// input_grad = zeros with out_grad written into the slice the forward read.
template <typename T, typename Context>
void SliceGradKernel(const Context& c, const DenseTensor&, const DenseTensor& out_grad,
                     const std::vector<int64_t>& axes, const phi::IntArray& starts, const phi::IntArray& ends,
                     const std::vector<int64_t>&, const std::vector<int64_t>&, DenseTensor* input_grad) {
  fill<T>(c, phi::Scalar(0.0), input_grad);
  AnychipTensor view = sliced(describe(*input_grad), axes, starts.GetData(), ends.GetData(), {});
  DenseTensor storage;
  launch(c, "copy", dtype_of<T>(), {reshaped(dense(c, out_grad, &storage), shape_of(view))}, {view});
}

// ---- masks built from positions (int64 arange, compare) ----

// bool [rows, cols]: keep (i, j) where j - i <= diagonal (lower) or >= diagonal (upper).
template <typename Context>
DenseTensor triangle(const Context& c, int64_t rows, int64_t cols, int64_t diagonal, bool lower) {
  phi::DDim dims = common::make_ddim({rows, cols});
  DenseTensor i = temporary(c, common::make_ddim({rows}), kI64), j = temporary(c, common::make_ddim({cols}), kI64);
  launch(c, "arange", kI64, {}, {describe(i)}, {0.0, 1.0});
  launch(c, "arange", kI64, {}, {describe(j)}, {0.0, 1.0});
  AnychipTensor di = describe(i), dj = describe(j);
  di.rank = dj.rank = 2;
  di.shape[0] = rows, di.shape[1] = cols, di.strides[0] = 1, di.strides[1] = 0;
  dj.shape[0] = rows, dj.shape[1] = cols, dj.strides[0] = 0, dj.strides[1] = 1;
  DenseTensor diff = apply(c, "subtract", kI64, {dj, di}, dims, kI64);
  DenseTensor d = constant(c, static_cast<double>(diagonal), kI64);
  return apply(c, lower ? "less_equal" : "greater_equal", kI64, {describe(diff), broadcast(d, dims)}, dims, kBool);
}

// out = x where the triangle mask of its last two dimensions holds, else 0.
template <typename T, typename Context>
void triangular(const Context& c, const DenseTensor& x, int diagonal, bool lower, DenseTensor* out) {
  c.template Alloc<T>(out);
  const phi::DDim& dims = out->dims();
  if (dims.size() < 2) fail(std::string(lower ? "tril" : "triu") + " needs a tensor of rank 2 or more");
  DenseTensor mask = triangle(c, dims[dims.size() - 2], dims[dims.size() - 1], diagonal, lower);
  DenseTensor zero = constant(c, 0.0, dtype_of<T>());
  launch(c, "where", dtype_of<T>(), {broadcast(mask, dims), broadcast(x, dims), broadcast(zero, dims)}, {describe(*out)});
}

template <typename T, typename Context>
void TrilKernel(const Context& c, const DenseTensor& x, int diagonal, DenseTensor* out) {
  triangular<T>(c, x, diagonal, true, out);
}

template <typename T, typename Context>
void TriuKernel(const Context& c, const DenseTensor& x, int diagonal, DenseTensor* out) {
  triangular<T>(c, x, diagonal, false, out);
}

template <typename T, typename Context>
void TrilGradKernel(const Context& c, const DenseTensor& out_grad, int diagonal, DenseTensor* x_grad) {
  triangular<T>(c, out_grad, diagonal, true, x_grad);
}

template <typename T, typename Context>
void TriuGradKernel(const Context& c, const DenseTensor& out_grad, int diagonal, DenseTensor* x_grad) {
  triangular<T>(c, out_grad, diagonal, false, x_grad);
}

template <typename T, typename Context>
void EyeKernel(const Context& c, const phi::Scalar& num_rows, const phi::Scalar& num_columns, phi::DataType,
               DenseTensor* out) {
  int64_t rows = num_rows.to<int64_t>(), cols = num_columns.to<int64_t>();
  if (cols == -1) cols = rows;
  if (rows < 0 || cols < 0) fail("eye: num_rows and num_columns must be >= 0");
  out->Resize(common::make_ddim({rows, cols}));
  c.template Alloc<T>(out);
  const phi::DDim& dims = out->dims();
  DenseTensor lower = triangle(c, rows, cols, 0, true);
  DenseTensor one = constant(c, 1.0, dtype_of<T>()), zero = constant(c, 0.0, dtype_of<T>());
  DenseTensor band = apply(c, "where", dtype_of<T>(), {describe(lower), broadcast(one, dims), broadcast(zero, dims)},
                           dims, dtype_of<T>());
  DenseTensor upper = triangle(c, rows, cols, 0, false);
  launch(c, "where", dtype_of<T>(), {describe(upper), describe(band), broadcast(zero, dims)}, {describe(*out)});
}

// out float32 [..., depth] = (x[...] == j), from the ids in int64.
template <typename T, typename Context>
void OneHotKernel(const Context& c, const DenseTensor& x, const phi::Scalar& num_classes, DenseTensor* out) {
  int64_t depth = num_classes.to<int64_t>();
  std::vector<int64_t> shape = common::vectorize<int64_t>(x.dims());
  shape.push_back(depth);
  out->Resize(common::make_ddim(shape));
  c.Alloc(out, kF32);
  DenseTensor ids_storage;
  AnychipTensor ids = int64_index(c, x, &ids_storage);
  DenseTensor classes = temporary(c, common::make_ddim({depth}), kI64);
  launch(c, "arange", kI64, {}, {describe(classes)}, {0.0, 1.0});
  AnychipTensor id = ids, cls = describe(classes);
  int r = static_cast<int>(shape.size());
  id.rank = cls.rank = r;
  for (int i = 0; i < r; ++i) {
    id.shape[i] = cls.shape[i] = shape[i];
    id.strides[i] = i + 1 < r ? ids.strides[i] : 0;
    cls.strides[i] = i + 1 < r ? 0 : 1;
  }
  DenseTensor hit = apply(c, "equal", kI64, {id, cls}, out->dims(), kBool);
  launch(c, "cast", kBool, {describe(hit)}, {describe(*out)});
}

// ---- elementwise predicates and logic ----

template <typename T, typename Context>
void IsnanKernel(const Context& c, const DenseTensor& x, DenseTensor* out) {
  c.template Alloc<bool>(out);
  launch(c, "not_equal", dtype_of<T>(), {describe(x), describe(x)}, {describe(*out)});  // only NaN != itself
}

template <typename T, typename Context>
void IsinfKernel(const Context& c, const DenseTensor& x, DenseTensor* out) {
  c.template Alloc<bool>(out);
  DenseTensor magnitude = apply(c, "abs", dtype_of<T>(), {describe(x)}, x.dims(), dtype_of<T>());
  DenseTensor inf = constant(c, HUGE_VAL, dtype_of<T>());
  launch(c, "equal", dtype_of<T>(), {describe(magnitude), broadcast(inf, x.dims())}, {describe(*out)});
}

// x - x is 0 exactly for finite x, NaN for infinities and NaN.
template <typename T, typename Context>
void IsfiniteKernel(const Context& c, const DenseTensor& x, DenseTensor* out) {
  c.template Alloc<bool>(out);
  DenseTensor diff = apply(c, "subtract", dtype_of<T>(), {describe(x), describe(x)}, x.dims(), dtype_of<T>());
  DenseTensor zero = constant(c, 0.0, dtype_of<T>());
  launch(c, "equal", dtype_of<T>(), {describe(diff), broadcast(zero, x.dims())}, {describe(*out)});
}

// x as bool at shape `dims` (nonzero is true: the cast rule).
template <typename T, typename Context>
DenseTensor truth(const Context& c, const DenseTensor& x, const phi::DDim& dims) {
  return apply(c, "cast", dtype_of<T>(), {broadcast(x, dims)}, dims, kBool);
}

template <typename Context>
void select_bool(const Context& c, const AnychipTensor& cond, const AnychipTensor& a, const AnychipTensor& b,
                 DenseTensor* out) {
  c.Alloc(out, kBool);
  launch(c, "where", kBool, {cond, a, b}, {describe(*out)});
}

template <typename T, typename Context>
void LogicalAndKernel(const Context& c, const DenseTensor& x, const DenseTensor& y, DenseTensor* out) {
  const phi::DDim& dims = out->dims();
  DenseTensor a = truth<T>(c, x, dims), b = truth<T>(c, y, dims), no = constant(c, 0.0, kBool);
  select_bool(c, describe(a), describe(b), broadcast(no, dims), out);
}

template <typename T, typename Context>
void LogicalOrKernel(const Context& c, const DenseTensor& x, const DenseTensor& y, DenseTensor* out) {
  const phi::DDim& dims = out->dims();
  DenseTensor a = truth<T>(c, x, dims), b = truth<T>(c, y, dims), yes = constant(c, 1.0, kBool);
  select_bool(c, describe(a), broadcast(yes, dims), describe(b), out);
}

template <typename T, typename Context>
void LogicalXorKernel(const Context& c, const DenseTensor& x, const DenseTensor& y, DenseTensor* out) {
  const phi::DDim& dims = out->dims();
  DenseTensor a = truth<T>(c, x, dims), b = truth<T>(c, y, dims);
  DenseTensor yes = constant(c, 1.0, kBool), no = constant(c, 0.0, kBool);
  DenseTensor not_b = apply(c, "where", kBool, {describe(b), broadcast(no, dims), broadcast(yes, dims)}, dims, kBool);
  select_bool(c, describe(a), describe(not_b), describe(b), out);
}

template <typename T, typename Context>
void LogicalNotKernel(const Context& c, const DenseTensor& x, DenseTensor* out) {
  const phi::DDim& dims = out->dims();
  DenseTensor a = truth<T>(c, x, dims), yes = constant(c, 1.0, kBool), no = constant(c, 0.0, kBool);
  select_bool(c, describe(a), broadcast(no, dims), broadcast(yes, dims), out);
}

// ---- activations and their gradients, in the order of Paddle's CPU functors ----

template <typename T, typename Context>
DenseTensor scaled(const Context& c, const AnychipTensor& x, const phi::DDim& dims, double scale, double bias) {
  return apply(c, "scale", dtype_of<T>(), {x}, dims, dtype_of<T>(), {scale, bias, 1.0});
}

template <typename T, typename Context>
DenseTensor times(const Context& c, const AnychipTensor& a, const AnychipTensor& b, const phi::DDim& dims) {
  return apply(c, "multiply", dtype_of<T>(), {a, b}, dims, dtype_of<T>());
}

// dx = dout * out (exp)
template <typename T, typename Context>
void ExpGradKernel(const Context& c, const DenseTensor& out, const DenseTensor& dout, DenseTensor* dx) {
  binary<T>(c, "multiply", dout, out, dx);
}

// dx = dout * (1 - out * out)
template <typename T, typename Context>
void TanhGradKernel(const Context& c, const DenseTensor& out, const DenseTensor& dout, DenseTensor* dx) {
  const phi::DDim& dims = dout.dims();
  DenseTensor square = times<T>(c, describe(out), describe(out), dims);
  DenseTensor rest = scaled<T>(c, describe(square), dims, -1.0, 1.0);
  binary<T>(c, "multiply", dout, rest, dx);
}

// dx = dout * out * (1 - out)
template <typename T, typename Context>
void SigmoidGradKernel(const Context& c, const DenseTensor& out, const DenseTensor& dout, DenseTensor* dx) {
  const phi::DDim& dims = dout.dims();
  DenseTensor a = times<T>(c, describe(dout), describe(out), dims);
  DenseTensor rest = scaled<T>(c, describe(out), dims, -1.0, 1.0);
  binary<T>(c, "multiply", a, rest, dx);
}

// dx = 0.5 * dout / out
template <typename T, typename Context>
void SqrtGradKernel(const Context& c, const DenseTensor& out, const DenseTensor& dout, DenseTensor* dx) {
  DenseTensor half = scaled<T>(c, describe(dout), dout.dims(), 0.5, 0.0);
  binary<T>(c, "divide", half, out, dx);
}

// dx = -0.5 * dout * out * out * out
template <typename T, typename Context>
void RsqrtGradKernel(const Context& c, const DenseTensor& out, const DenseTensor& dout, DenseTensor* dx) {
  const phi::DDim& dims = dout.dims();
  DenseTensor a = scaled<T>(c, describe(dout), dims, -0.5, 0.0);
  DenseTensor b = times<T>(c, describe(a), describe(out), dims);
  DenseTensor d = times<T>(c, describe(b), describe(out), dims);
  binary<T>(c, "multiply", d, out, dx);
}

// dx = dout * (1 / x)
template <typename T, typename Context>
void LogGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& dout, DenseTensor* dx) {
  const phi::DDim& dims = dout.dims();
  DenseTensor one = constant(c, 1.0, dtype_of<T>());
  DenseTensor inverse = apply(c, "divide", dtype_of<T>(), {broadcast(one, dims), describe(x)}, dims, dtype_of<T>());
  binary<T>(c, "multiply", dout, inverse, dx);
}

// dout where pick, else `otherwise` (dout's dims).
template <typename T, typename Context>
DenseTensor masked(const Context& c, const DenseTensor& pick, const AnychipTensor& dout, const AnychipTensor& otherwise,
                   const phi::DDim& dims) {
  return apply(c, "where", dtype_of<T>(), {broadcast(pick, dims), dout, otherwise}, dims, dtype_of<T>());
}

template <typename T, typename Context>
DenseTensor compare(const Context& c, const char* op, const AnychipTensor& a, const AnychipTensor& b,
                    const phi::DDim& dims) {
  return apply(c, op, dtype_of<T>(), {a, b}, dims, kBool);
}

// dx = dout * sign(x): dout for x > 0, -dout for x < 0, 0 at 0
template <typename T, typename Context>
void AbsGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& dout, DenseTensor* dx) {
  c.template Alloc<T>(dx);
  const phi::DDim& dims = dout.dims();
  DenseTensor zero = constant(c, 0.0, dtype_of<T>());
  AnychipTensor z = broadcast(zero, dims);
  DenseTensor neg = scaled<T>(c, describe(dout), dims, -1.0, 0.0);
  DenseTensor below = compare<T>(c, "less_than", describe(x), z, dims);
  DenseTensor above = compare<T>(c, "greater_than", describe(x), z, dims);
  DenseTensor rest = masked<T>(c, below, describe(neg), z, dims);
  launch(c, "where", dtype_of<T>(), {describe(above), describe(dout), describe(rest)}, {describe(*dx)});
}

// dx = dout * s * (1 + x * (1 - s)), s = sigmoid(x)
template <typename T, typename Context>
void SiluGradKernel(const Context& c, const DenseTensor& x, const DenseTensor&, const DenseTensor& dout,
                    DenseTensor* dx) {
  const phi::DDim& dims = dout.dims();
  DenseTensor s = apply(c, "sigmoid", dtype_of<T>(), {describe(x)}, dims, dtype_of<T>());
  DenseTensor rest = scaled<T>(c, describe(s), dims, -1.0, 1.0);
  DenseTensor xr = times<T>(c, describe(x), describe(rest), dims);
  DenseTensor factor = scaled<T>(c, describe(xr), dims, 1.0, 1.0);
  DenseTensor ds = times<T>(c, describe(dout), describe(s), dims);
  binary<T>(c, "multiply", ds, factor, dx);
}

// dx = dout * factor * x^(factor - 1)
template <typename T, typename Context>
void PowGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& dout, const phi::Scalar& factor,
                   DenseTensor* dx) {
  const phi::DDim& dims = dout.dims();
  double f = factor.to<double>();
  DenseTensor a = scaled<T>(c, describe(dout), dims, f, 0.0);
  DenseTensor p = apply(c, "pow", dtype_of<T>(), {describe(x)}, dims, dtype_of<T>(), {f - 1.0});
  binary<T>(c, "multiply", a, p, dx);
}

template <typename T, typename Context>
void SquareKernel(const Context& c, const DenseTensor& x, DenseTensor* out) {
  binary<T>(c, "multiply", x, x, out);
}

// dx = dout * 2 * x
template <typename T, typename Context>
void SquareGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& dout, DenseTensor* dx) {
  DenseTensor twice = scaled<T>(c, describe(dout), dout.dims(), 2.0, 0.0);
  binary<T>(c, "multiply", twice, x, dx);
}

template <typename T, typename Context>
void ReciprocalKernel(const Context& c, const DenseTensor& x, DenseTensor* out) {
  c.template Alloc<T>(out);
  DenseTensor one = constant(c, 1.0, dtype_of<T>());
  launch(c, "divide", dtype_of<T>(), {broadcast(one, x.dims()), describe(x)}, {describe(*out)});
}

// dx = -dout * out * out
template <typename T, typename Context>
void ReciprocalGradKernel(const Context& c, const DenseTensor& out, const DenseTensor& dout, DenseTensor* dx) {
  const phi::DDim& dims = dout.dims();
  DenseTensor neg = scaled<T>(c, describe(dout), dims, -1.0, 0.0);
  DenseTensor a = times<T>(c, describe(neg), describe(out), dims);
  binary<T>(c, "multiply", a, out, dx);
}

// sign(x): 1, -1 or 0
template <typename T, typename Context>
void SignKernel(const Context& c, const DenseTensor& x, DenseTensor* out) {
  c.template Alloc<T>(out);
  const phi::DDim& dims = x.dims();
  DenseTensor zero = constant(c, 0.0, dtype_of<T>()), one = constant(c, 1.0, dtype_of<T>()),
              minus = constant(c, -1.0, dtype_of<T>());
  AnychipTensor z = broadcast(zero, dims);
  DenseTensor below = compare<T>(c, "less_than", describe(x), z, dims);
  DenseTensor above = compare<T>(c, "greater_than", describe(x), z, dims);
  DenseTensor rest = masked<T>(c, below, broadcast(minus, dims), z, dims);
  launch(c, "where", dtype_of<T>(), {describe(above), broadcast(one, dims), describe(rest)}, {describe(*out)});
}

// relu(x) = x > 0 ? x : 0
template <typename T, typename Context>
void ReluKernel(const Context& c, const DenseTensor& x, DenseTensor* out) {
  c.template Alloc<T>(out);
  const phi::DDim& dims = x.dims();
  DenseTensor zero = constant(c, 0.0, dtype_of<T>());
  DenseTensor above = compare<T>(c, "greater_than", describe(x), broadcast(zero, dims), dims);
  launch(c, "where", dtype_of<T>(), {describe(above), describe(x), broadcast(zero, dims)}, {describe(*out)});
}

template <typename T, typename Context>
void ReluGradKernel(const Context& c, const DenseTensor& out, const DenseTensor& dout, DenseTensor* dx) {
  c.template Alloc<T>(dx);
  const phi::DDim& dims = dout.dims();
  DenseTensor zero = constant(c, 0.0, dtype_of<T>());
  DenseTensor above = compare<T>(c, "greater_than", describe(out), broadcast(zero, dims), dims);
  launch(c, "where", dtype_of<T>(), {describe(above), describe(dout), broadcast(zero, dims)}, {describe(*dx)});
}

template <typename T, typename Context>
void LeakyReluKernel(const Context& c, const DenseTensor& x, double alpha, DenseTensor* out) {
  c.template Alloc<T>(out);
  const phi::DDim& dims = x.dims();
  DenseTensor zero = constant(c, 0.0, dtype_of<T>());
  DenseTensor above = compare<T>(c, "greater_than", describe(x), broadcast(zero, dims), dims);
  DenseTensor leak = scaled<T>(c, describe(x), dims, alpha, 0.0);
  launch(c, "where", dtype_of<T>(), {describe(above), describe(x), describe(leak)}, {describe(*out)});
}

template <typename T, typename Context>
void LeakyReluGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& dout, double alpha,
                         DenseTensor* dx) {
  c.template Alloc<T>(dx);
  const phi::DDim& dims = dout.dims();
  DenseTensor zero = constant(c, 0.0, dtype_of<T>());
  DenseTensor above = compare<T>(c, "greater_than", describe(x), broadcast(zero, dims), dims);
  DenseTensor leak = scaled<T>(c, describe(dout), dims, alpha, 0.0);
  launch(c, "where", dtype_of<T>(), {describe(above), describe(dout), describe(leak)}, {describe(*dx)});
}

// gelu: the tanh form 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), or the erf form
// 0.5 x (1 + erf(x / sqrt 2)) with erf from its complement's Chebyshev fit (Numerical
// Recipes' erfcc: relative error below 1.2e-7 everywhere), as no base op has erf.
constexpr double kSqrt2OverPi = 0.79788456080286535588, kGeluCubic = 0.044715, kRsqrt2 = 0.70710678118654752440;

// erf(z) elementwise (float math in T's kernels), z dense of dims.
template <typename T, typename Context>
DenseTensor erf_of(const Context& c, const DenseTensor& z, const phi::DDim& dims) {
  static const double kCoef[] = {-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806,
                                 0.27886807, -1.13520398, 1.48851587, -0.82215223, 0.17087277};
  DenseTensor a = apply(c, "abs", dtype_of<T>(), {describe(z)}, dims, dtype_of<T>());
  DenseTensor d = scaled<T>(c, describe(a), dims, 0.5, 1.0);
  DenseTensor one = constant(c, 1.0, dtype_of<T>());
  DenseTensor t = apply(c, "divide", dtype_of<T>(), {broadcast(one, dims), describe(d)}, dims, dtype_of<T>());
  DenseTensor poly = constant(c, kCoef[9], dtype_of<T>());
  AnychipTensor acc = broadcast(poly, dims);
  DenseTensor step;
  for (int k = 8; k >= 0; --k) {  // Horner: acc = acc * t + coef_k
    DenseTensor m = times<T>(c, acc, describe(t), dims);
    step = scaled<T>(c, describe(m), dims, 1.0, kCoef[k]);
    acc = describe(step);
  }
  DenseTensor a2 = times<T>(c, describe(a), describe(a), dims);
  DenseTensor e = apply(c, "subtract", dtype_of<T>(), {acc, describe(a2)}, dims, dtype_of<T>());
  DenseTensor ex = apply(c, "exp", dtype_of<T>(), {describe(e)}, dims, dtype_of<T>());
  DenseTensor erfc = times<T>(c, describe(t), describe(ex), dims);  // erfc(|z|)
  DenseTensor pos = scaled<T>(c, describe(erfc), dims, -1.0, 1.0);  // erf(|z|)
  DenseTensor neg = scaled<T>(c, describe(pos), dims, -1.0, 0.0);
  DenseTensor zero = constant(c, 0.0, dtype_of<T>());
  DenseTensor below = compare<T>(c, "less_than", describe(z), broadcast(zero, dims), dims);
  return masked<T>(c, below, describe(neg), describe(pos), dims);
}

// inner = sqrt(2/pi) (x + 0.044715 x^3) and its tanh.
template <typename T, typename Context>
DenseTensor gelu_tanh(const Context& c, const DenseTensor& x, const phi::DDim& dims) {
  DenseTensor x2 = times<T>(c, describe(x), describe(x), dims);
  DenseTensor x3 = times<T>(c, describe(x2), describe(x), dims);
  DenseTensor cubic = scaled<T>(c, describe(x3), dims, kGeluCubic, 0.0);
  DenseTensor sum = apply(c, "add", dtype_of<T>(), {describe(x), describe(cubic)}, dims, dtype_of<T>());
  DenseTensor inner = scaled<T>(c, describe(sum), dims, kSqrt2OverPi, 0.0);
  return apply(c, "tanh", dtype_of<T>(), {describe(inner)}, dims, dtype_of<T>());
}

// 0.5 (1 + tanh(...)) or 0.5 (1 + erf(x / sqrt 2)): the gelu's "cdf" factor.
template <typename T, typename Context>
DenseTensor gelu_cdf(const Context& c, const DenseTensor& x, bool approximate, const phi::DDim& dims) {
  DenseTensor g;
  if (approximate) {
    g = gelu_tanh<T>(c, x, dims);
  } else {
    DenseTensor z = scaled<T>(c, describe(x), dims, kRsqrt2, 0.0);
    g = erf_of<T>(c, z, dims);
  }
  return scaled<T>(c, describe(g), dims, 0.5, 0.5);
}

template <typename T, typename Context>
void GeluKernel(const Context& c, const DenseTensor& x, bool approximate, DenseTensor* out) {
  const DenseTensor& xd = x;  // the elementwise base ops read strided inputs
  DenseTensor cdf = gelu_cdf<T>(c, xd, approximate, x.dims());
  binary<T>(c, "multiply", xd, cdf, out);
}

// d gelu / dx = cdf + x * pdf', with pdf' = exp(-x^2 / 2) / sqrt(2 pi) (erf form) or
// 0.5 (1 - tanh^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2) (tanh form).
template <typename T, typename Context>
void GeluGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& out_grad, bool approximate,
                    DenseTensor* x_grad) {
  const phi::DDim& dims = x.dims();
  const DenseTensor& xd = x;
  DenseTensor cdf = gelu_cdf<T>(c, xd, approximate, dims);
  DenseTensor x2 = times<T>(c, describe(xd), describe(xd), dims);
  DenseTensor slope;
  if (approximate) {
    DenseTensor th = gelu_tanh<T>(c, xd, dims);
    DenseTensor th2 = times<T>(c, describe(th), describe(th), dims);
    DenseTensor sech2 = scaled<T>(c, describe(th2), dims, -1.0, 1.0);
    DenseTensor poly = scaled<T>(c, describe(x2), dims, 3.0 * kGeluCubic * kSqrt2OverPi, kSqrt2OverPi);
    DenseTensor prod = times<T>(c, describe(sech2), describe(poly), dims);
    slope = scaled<T>(c, describe(prod), dims, 0.5, 0.0);
  } else {
    DenseTensor e = scaled<T>(c, describe(x2), dims, -0.5, 0.0);
    DenseTensor ex = apply(c, "exp", dtype_of<T>(), {describe(e)}, dims, dtype_of<T>());
    slope = scaled<T>(c, describe(ex), dims, 0.5 * M_2_SQRTPI * kRsqrt2, 0.0);  // 1 / sqrt(2 pi)
  }
  DenseTensor xs = times<T>(c, describe(xd), describe(slope), dims);
  DenseTensor d = apply(c, "add", dtype_of<T>(), {describe(cdf), describe(xs)}, dims, dtype_of<T>());
  binary<T>(c, "multiply", out_grad, d, x_grad);
}

// ---- binary-op gradients ----

// maximum: dx = dout where x > y, dout / 2 where x == y (Paddle splits ties), else 0; dy mirrors.
template <typename T, typename Context>
void extremum_grad(const Context& c, const DenseTensor& x, const DenseTensor& y, const DenseTensor& dout,
                   const char* wins, DenseTensor* dx, DenseTensor* dy) {
  const phi::DDim& dims = dout.dims();
  AnychipTensor xb = broadcast(x, dims), yb = broadcast(y, dims);
  DenseTensor zero = constant(c, 0.0, dtype_of<T>());
  DenseTensor half = scaled<T>(c, describe(dout), dims, 0.5, 0.0);
  DenseTensor tie = compare<T>(c, "equal", xb, yb, dims);
  DenseTensor tied = masked<T>(c, tie, describe(half), broadcast(zero, dims), dims);
  for (auto [grad, a, b] : {std::make_tuple(dx, xb, yb), std::make_tuple(dy, yb, xb)}) {
    if (grad == nullptr) continue;
    DenseTensor win = compare<T>(c, wins, a, b, dims);
    DenseTensor full = masked<T>(c, win, describe(dout), describe(tied), dims);
    reduce_to<T>(c, describe(full), grad);
  }
}

template <typename T, typename Context>
void MaximumGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& y, const DenseTensor& dout,
                       DenseTensor* dx, DenseTensor* dy) {
  extremum_grad<T>(c, x, y, dout, "greater_than", dx, dy);
}

template <typename T, typename Context>
void MinimumGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& y, const DenseTensor& dout,
                       DenseTensor* dx, DenseTensor* dy) {
  extremum_grad<T>(c, x, y, dout, "less_than", dx, dy);
}

template <typename T, typename Context>
void WhereGradKernel(const Context& c, const DenseTensor& condition, const DenseTensor&, const DenseTensor&,
                     const DenseTensor& out_grad, DenseTensor* x_grad, DenseTensor* y_grad) {
  const phi::DDim& dims = out_grad.dims();
  DenseTensor zero = constant(c, 0.0, dtype_of<T>());
  AnychipTensor z = broadcast(zero, dims), g = describe(out_grad);
  if (x_grad != nullptr) reduce_to<T>(c, describe(masked<T>(c, condition, g, z, dims)), x_grad);
  if (y_grad != nullptr) reduce_to<T>(c, describe(masked<T>(c, condition, z, g, dims)), y_grad);
}

// clip: min(max(x, lo), hi); NaN stays NaN (maximum propagates it, as Paddle's x < lo test does)
template <typename T, typename Context>
void ClipKernel(const Context& c, const DenseTensor& x, const phi::Scalar& min, const phi::Scalar& max,
                DenseTensor* out) {
  c.template Alloc<T>(out);
  const phi::DDim& dims = x.dims();
  DenseTensor lo = constant(c, min.to<double>(), dtype_of<T>()), hi = constant(c, max.to<double>(), dtype_of<T>());
  DenseTensor low = apply(c, "maximum", dtype_of<T>(), {describe(x), broadcast(lo, dims)}, dims, dtype_of<T>());
  launch(c, "minimum", dtype_of<T>(), {describe(low), broadcast(hi, dims)}, {describe(*out)});
}

// dx = dout where lo <= x <= hi (Paddle's CPU passes the gradient at the bounds), else 0
template <typename T, typename Context>
void ClipGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& out_grad, const phi::Scalar& min,
                    const phi::Scalar& max, DenseTensor* x_grad) {
  c.template Alloc<T>(x_grad);
  const phi::DDim& dims = x.dims();
  DenseTensor lo = constant(c, min.to<double>(), dtype_of<T>()), hi = constant(c, max.to<double>(), dtype_of<T>());
  DenseTensor zero = constant(c, 0.0, dtype_of<T>());
  DenseTensor above = compare<T>(c, "greater_equal", describe(x), broadcast(lo, dims), dims);
  DenseTensor below = compare<T>(c, "less_equal", describe(x), broadcast(hi, dims), dims);
  DenseTensor inner = masked<T>(c, below, describe(out_grad), broadcast(zero, dims), dims);
  launch(c, "where", dtype_of<T>(), {describe(above), describe(inner), broadcast(zero, dims)}, {describe(*x_grad)});
}

// ---- reductions ----

template <typename T, typename Context>
void MeanAllKernel(const Context& c, const DenseTensor& x, DenseTensor* out) {
  c.template Alloc<T>(out);
  launch(c, "mean", dtype_of<T>(), {describe(x)}, {describe(*out)}, {0.0, 0.0});
}

// out_grad (its reduced dims as stride 0 at x's rank) / count, the division Paddle's CPU does.
template <typename T, typename Context>
void mean_grad(const Context& c, const DenseTensor& x, const DenseTensor& out_grad, const std::vector<bool>& reduced,
               DenseTensor* x_grad) {
  c.template Alloc<T>(x_grad);
  int rank = x.dims().size();
  int64_t count = 1;
  DenseTensor storage;
  AnychipTensor g = dense(c, out_grad, &storage);
  g.rank = rank;
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    g.shape[i] = x.dims()[i];
    g.strides[i] = reduced[i] ? 0 : stride;
    if (reduced[i]) count *= x.dims()[i]; else stride *= x.dims()[i];
  }
  DenseTensor n = constant(c, static_cast<double>(count), dtype_of<T>());
  launch(c, "divide", dtype_of<T>(), {g, broadcast(n, x.dims())}, {describe(*x_grad)});
}

template <typename T, typename Context>
void MeanAllGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& out_grad, DenseTensor* x_grad) {
  mean_grad<T>(c, x, out_grad, std::vector<bool>(x.dims().size(), true), x_grad);
}

template <typename T, typename Context>
void MeanGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& out_grad, const phi::IntArray& dims,
                    bool, bool reduce_all, DenseTensor* x_grad) {
  int rank = x.dims().size();
  std::vector<double> attrs = reduce_attrs(dims, rank, true);
  std::vector<bool> reduced(rank, reduce_all || attrs[1] == 0);
  for (size_t k = 2; k < attrs.size(); ++k) reduced[static_cast<int>(attrs[k])] = true;
  mean_grad<T>(c, x, out_grad, reduced, x_grad);
}

// min = -max(-x): negation is exact.
template <typename T, typename Context>
void MinKernel(const Context& c, const DenseTensor& x, const phi::IntArray& dims, bool keep_dim, DenseTensor* out) {
  c.template Alloc<T>(out);
  DenseTensor neg = scaled<T>(c, describe(x), x.dims(), -1.0, 0.0);
  DenseTensor top = temporary<T>(c, out->dims());
  launch(c, "max", dtype_of<T>(), {describe(neg)}, {describe(top)}, reduce_attrs(dims, x.dims().size(), keep_dim));
  launch(c, "scale", dtype_of<T>(), {describe(top)}, {describe(*out)}, {-1.0, 0.0, 1.0});
}

// x's dims with the reduced ones kept as 1, and the reduction attrs with keepdim set.
inline std::vector<int64_t> kept_shape(const phi::DDim& dims, const std::vector<double>& attrs) {
  std::vector<int64_t> kept = common::vectorize<int64_t>(dims);
  if (attrs[1] == 0) std::fill(kept.begin(), kept.end(), 1);
  for (size_t k = 2; k < attrs.size(); ++k) kept[static_cast<int>(attrs[k])] = 1;
  return kept;
}

// logsumexp = max + log(sum(exp(x - max))) over the axes.
template <typename T, typename Context>
void LogsumexpKernel(const Context& c, const DenseTensor& x, const std::vector<int>& axis, bool keepdim, bool reduce_all,
                     DenseTensor* out) {
  c.template Alloc<T>(out);
  std::vector<int64_t> axes(axis.begin(), axis.end());
  if (reduce_all) axes.clear();
  std::vector<double> attrs = reduce_attrs(phi::IntArray(axes), x.dims().size(), true);
  phi::DDim kept = common::make_ddim(kept_shape(x.dims(), attrs));
  DenseTensor m = temporary<T>(c, kept);
  launch(c, "max", dtype_of<T>(), {describe(x)}, {describe(m)}, attrs);
  DenseTensor d = apply(c, "subtract", dtype_of<T>(), {describe(x), broadcast(m, x.dims())}, x.dims(), dtype_of<T>());
  DenseTensor e = apply(c, "exp", dtype_of<T>(), {describe(d)}, x.dims(), dtype_of<T>());
  DenseTensor s = temporary<T>(c, kept);
  launch(c, "sum", dtype_of<T>(), {describe(e)}, {describe(s)}, attrs);
  DenseTensor l = apply(c, "log", dtype_of<T>(), {describe(s)}, kept, dtype_of<T>());
  std::vector<int64_t> out_shape = common::vectorize<int64_t>(out->dims());
  launch(c, "add", dtype_of<T>(), {reshaped(l, out_shape), reshaped(m, out_shape)}, {describe(*out)});
}

// any / all: x != 0 as float32 0/1, then max (any) or -max(-v) (all), cast to bool.
template <typename T, typename Context>
void boolean_reduce(const Context& c, const DenseTensor& x, const std::vector<int64_t>& dims, bool keep_dim, bool all,
                    DenseTensor* out) {
  c.Alloc(out, kBool);
  const phi::DDim& xd = x.dims();
  DenseTensor f = apply(c, "cast", dtype_of<T>(), {describe(x)}, xd, kF32);
  DenseTensor zero = constant(c, 0.0, kF32);
  DenseTensor nz = apply(c, "not_equal", kF32, {describe(f), broadcast(zero, xd)}, xd, kBool);
  DenseTensor v = apply(c, "cast", kBool, {describe(nz)}, xd, kF32);
  if (all) v = apply(c, "scale", kF32, {describe(v)}, xd, kF32, {-1.0, 0.0, 1.0});
  DenseTensor r = temporary(c, out->dims(), kF32);
  launch(c, "max", kF32, {describe(v)}, {describe(r)}, reduce_attrs(phi::IntArray(dims), xd.size(), keep_dim));
  if (all) r = apply(c, "scale", kF32, {describe(r)}, out->dims(), kF32, {-1.0, 0.0, 1.0});
  launch(c, "cast", kF32, {describe(r)}, {describe(*out)});
}

template <typename T, typename Context>
void AnyKernel(const Context& c, const DenseTensor& x, const std::vector<int64_t>& dims, bool keep_dim,
               DenseTensor* out) {
  boolean_reduce<T>(c, x, dims, keep_dim, false, out);
}

template <typename T, typename Context>
void AllKernel(const Context& c, const DenseTensor& x, const std::vector<int64_t>& dims, bool keep_dim,
               DenseTensor* out) {
  boolean_reduce<T>(c, x, dims, keep_dim, true, out);
}

// ---- log_softmax ----

template <typename T, typename Context>
void LogSoftmaxKernel(const Context& c, const DenseTensor& x, int axis, DenseTensor* out) {
  const phi::DDim& dims = x.dims();
  int rank = dims.size();
  if (rank == 0) {  // a single element: log(1)
    fill<T>(c, phi::Scalar(0.0), out);
    return;
  }
  std::vector<double> attrs{1.0, 1.0, static_cast<double>(normalized(axis, rank, "log_softmax"))};
  phi::DDim kept = common::make_ddim(kept_shape(dims, attrs));
  DenseTensor m = temporary<T>(c, kept);
  launch(c, "max", dtype_of<T>(), {describe(x)}, {describe(m)}, attrs);
  DenseTensor d = apply(c, "subtract", dtype_of<T>(), {describe(x), broadcast(m, dims)}, dims, dtype_of<T>());
  DenseTensor e = apply(c, "exp", dtype_of<T>(), {describe(d)}, dims, dtype_of<T>());
  DenseTensor s = temporary<T>(c, kept);
  launch(c, "sum", dtype_of<T>(), {describe(e)}, {describe(s)}, attrs);
  DenseTensor l = apply(c, "log", dtype_of<T>(), {describe(s)}, kept, dtype_of<T>());
  binary<T>(c, "subtract", d, l, out);
}

// dx = dout - exp(out) * sum(dout, axis)
template <typename T, typename Context>
void LogSoftmaxGradKernel(const Context& c, const DenseTensor& out, const DenseTensor& out_grad, int axis,
                          DenseTensor* x_grad) {
  const phi::DDim& dims = out.dims();
  int rank = dims.size();
  if (rank == 0) {
    fill<T>(c, phi::Scalar(0.0), x_grad);
    return;
  }
  std::vector<double> attrs{1.0, 1.0, static_cast<double>(normalized(axis, rank, "log_softmax_grad"))};
  phi::DDim kept = common::make_ddim(kept_shape(dims, attrs));
  DenseTensor s = temporary<T>(c, kept);
  launch(c, "sum", dtype_of<T>(), {describe(out_grad)}, {describe(s)}, attrs);
  DenseTensor e = apply(c, "exp", dtype_of<T>(), {describe(out)}, dims, dtype_of<T>());
  DenseTensor p = times<T>(c, describe(e), broadcast(s, dims), dims);
  binary<T>(c, "subtract", out_grad, p, x_grad);
}

// ---- layer_norm over the dimensions from begin_norm_axis on: rows [R, C] ----

struct NormRows {
  int64_t rows, cols;
};

inline NormRows norm_rows(const phi::DDim& dims, int begin_norm_axis) {
  int a = normalized(begin_norm_axis, dims.size(), "layer_norm begin_norm_axis");
  NormRows r{1, 1};
  for (int i = 0; i < dims.size(); ++i) (i < a ? r.rows : r.cols) *= dims[i];
  return r;
}

// scale (or 1) and bias (or 0) as [1, C] descriptors broadcast to [R, C].
template <typename T, typename Context>
AnychipTensor row_param(const Context& c, const paddle::optional<DenseTensor>& p, double missing, NormRows r,
                        DenseTensor* storage) {
  phi::DDim dims = common::make_ddim({r.rows, r.cols});
  if (p.get_ptr() == nullptr) {
    *storage = constant(c, missing, dtype_of<T>());
    return broadcast(*storage, dims);
  }
  if (p->numel() != r.cols) fail("layer_norm: scale and bias need " + std::to_string(r.cols) + " elements");
  AnychipTensor d = reshaped(dense(c, *p, storage), {1, r.cols});
  d.shape[0] = r.rows;
  d.strides[0] = 0;  // the same [C] for every row
  return d;
}

// y = (x - mean) * rsqrt(var + eps) * scale + bias; mean and variance (biased) per row.
template <typename T, typename Context>
void LayerNormKernel(const Context& c, const DenseTensor& x, const paddle::optional<DenseTensor>& scale,
                     const paddle::optional<DenseTensor>& bias, float epsilon, int begin_norm_axis, DenseTensor* out,
                     DenseTensor* mean, DenseTensor* variance) {
  NormRows r = norm_rows(x.dims(), begin_norm_axis);
  phi::DDim dims = common::make_ddim({r.rows, r.cols}), col = common::make_ddim({r.rows, 1});
  c.template Alloc<T>(out);
  DenseTensor x_storage;
  AnychipTensor xv = reshaped(dense(c, x, &x_storage), {r.rows, r.cols});
  DenseTensor mu = temporary<T>(c, col);
  launch(c, "mean", dtype_of<T>(), {xv}, {describe(mu)}, {1.0, 1.0, 1.0});
  DenseTensor centered = apply(c, "subtract", dtype_of<T>(), {xv, broadcast(mu, dims)}, dims, dtype_of<T>());
  DenseTensor sq = times<T>(c, describe(centered), describe(centered), dims);
  DenseTensor var = temporary<T>(c, col);
  launch(c, "mean", dtype_of<T>(), {describe(sq)}, {describe(var)}, {1.0, 1.0, 1.0});
  DenseTensor shifted = scaled<T>(c, describe(var), col, 1.0, static_cast<double>(epsilon));
  DenseTensor inv = apply(c, "rsqrt", dtype_of<T>(), {describe(shifted)}, col, dtype_of<T>());
  DenseTensor normed = times<T>(c, describe(centered), broadcast(inv, dims), dims);
  DenseTensor ws, bs;
  AnychipTensor w = row_param<T>(c, scale, 1.0, r, &ws), b = row_param<T>(c, bias, 0.0, r, &bs);
  DenseTensor weighted = times<T>(c, describe(normed), w, dims);
  launch(c, "add", dtype_of<T>(), {describe(weighted), b}, {reshaped(*out, {r.rows, r.cols})});
  // Paddle keeps mean and variance in float32 for 16-bit x (its LayerNormParamType)
  for (auto [dst, src] : {std::make_pair(mean, &mu), std::make_pair(variance, &var)}) {
    if (dst == nullptr) continue;
    c.Alloc(dst, dst->dtype() == phi::DataType::UNDEFINED ? dtype_of<T>() : dst->dtype());
    launch(c, "cast", dtype_of<T>(), {reshaped(*src, {r.rows})}, {reshaped(*dst, {r.rows})});
  }
}

// xhat = (x - mean) * inv; dbias = sum_rows(dy); dscale = sum_rows(dy * xhat);
// dx = inv * (g - mean_cols(g) - xhat * mean_cols(g * xhat)), g = dy * scale.
template <typename T, typename Context>
void LayerNormGradKernel(const Context& c, const DenseTensor& x, const paddle::optional<DenseTensor>& scale,
                         const paddle::optional<DenseTensor>& bias, const DenseTensor& mean,
                         const DenseTensor& variance, const DenseTensor& out_grad, float epsilon, int begin_norm_axis,
                         DenseTensor* x_grad, DenseTensor* scale_grad, DenseTensor* bias_grad) {
  NormRows r = norm_rows(x.dims(), begin_norm_axis);
  phi::DDim dims = common::make_ddim({r.rows, r.cols}), col = common::make_ddim({r.rows, 1});
  DenseTensor x_storage, g_storage;
  AnychipTensor xv = reshaped(dense(c, x, &x_storage), {r.rows, r.cols});
  AnychipTensor dy = reshaped(dense(c, out_grad, &g_storage), {r.rows, r.cols});
  DenseTensor mu = temporary<T>(c, col), var = temporary<T>(c, col);
  launch(c, "cast", mean.dtype(), {reshaped(mean, {r.rows, 1})}, {describe(mu)});
  launch(c, "cast", variance.dtype(), {reshaped(variance, {r.rows, 1})}, {describe(var)});
  DenseTensor shifted = scaled<T>(c, describe(var), col, 1.0, static_cast<double>(epsilon));
  DenseTensor inv = apply(c, "rsqrt", dtype_of<T>(), {describe(shifted)}, col, dtype_of<T>());
  DenseTensor centered = apply(c, "subtract", dtype_of<T>(), {xv, broadcast(mu, dims)}, dims, dtype_of<T>());
  DenseTensor xhat = times<T>(c, describe(centered), broadcast(inv, dims), dims);
  std::vector<double> over_rows{1.0, 1.0, 0.0}, over_cols{1.0, 1.0, 1.0};
  if (bias_grad != nullptr) {
    c.template Alloc<T>(bias_grad);
    launch(c, "sum", dtype_of<T>(), {dy}, {reshaped(*bias_grad, {1, r.cols})}, over_rows);
  }
  if (scale_grad != nullptr) {
    c.template Alloc<T>(scale_grad);
    DenseTensor p = times<T>(c, dy, describe(xhat), dims);
    launch(c, "sum", dtype_of<T>(), {describe(p)}, {reshaped(*scale_grad, {1, r.cols})}, over_rows);
  }
  if (x_grad == nullptr) return;
  c.template Alloc<T>(x_grad);
  DenseTensor ws;
  AnychipTensor w = row_param<T>(c, scale, 1.0, r, &ws);
  DenseTensor g = times<T>(c, dy, w, dims);
  DenseTensor gm = temporary<T>(c, col);
  launch(c, "mean", dtype_of<T>(), {describe(g)}, {describe(gm)}, over_cols);
  DenseTensor gx = times<T>(c, describe(g), describe(xhat), dims);
  DenseTensor gxm = temporary<T>(c, col);
  launch(c, "mean", dtype_of<T>(), {describe(gx)}, {describe(gxm)}, over_cols);
  DenseTensor a = apply(c, "subtract", dtype_of<T>(), {describe(g), broadcast(gm, dims)}, dims, dtype_of<T>());
  DenseTensor b = times<T>(c, describe(xhat), broadcast(gxm, dims), dims);
  DenseTensor d = apply(c, "subtract", dtype_of<T>(), {describe(a), describe(b)}, dims, dtype_of<T>());
  launch(c, "multiply", dtype_of<T>(), {describe(d), broadcast(inv, dims)}, {reshaped(*x_grad, {r.rows, r.cols})});
}

// ---- host <-> device: Paddle's own copy through the device's memcpy ----

// `bytes` of host memory as a device tensor of `dtype` and `dims` in `dst`.
template <typename Context>
void upload(const Context& c, const void* host, phi::DataType dtype, const phi::DDim& dims, DenseTensor* dst) {
  DenseTensor src(std::make_shared<phi::Allocation>(const_cast<void*>(host), common::product(dims) *
                                                        phi::SizeOf(dtype), phi::CPUPlace()),
                  phi::DenseTensorMeta(dtype, dims));
  phi::Copy(c, src, c.GetPlace(), true, dst);
}

// The value of a one-element tensor, as a double, wherever it lives.
template <typename Context>
double scalar_value(const Context& c, const DenseTensor& t, const char* what) {
  if (t.numel() != 1) fail(std::string(what) + " must hold one element, got shape " + t.dims().to_str());
  DenseTensor host;
  const DenseTensor* h = &t;
  if (t.place().GetType() != phi::AllocationType::CPU) {
    phi::Copy(c, t, phi::CPUPlace(), true, &host);
    h = &host;
  }
  switch (h->dtype()) {
    case phi::DataType::FLOAT32: return *h->data<float>();
    case phi::DataType::FLOAT64: return *h->data<double>();
    case phi::DataType::FLOAT16: return static_cast<float>(*h->data<phi::dtype::float16>());
    case phi::DataType::BFLOAT16: return static_cast<float>(*h->data<phi::dtype::bfloat16>());
    case phi::DataType::INT32: return *h->data<int32_t>();
    case phi::DataType::INT64: return static_cast<double>(*h->data<int64_t>());
    case phi::DataType::BOOL: return *h->data<bool>() ? 1.0 : 0.0;
    default: fail(std::string(what) + ": dtype " + phi::DataTypeToString(h->dtype()) + " is not supported");
  }
}

template <typename T, typename Context>
void ArangeTensorKernel(const Context& c, const DenseTensor& start, const DenseTensor& end, const DenseTensor& step,
                        DenseTensor* out) {
  double a = scalar_value(c, start, "arange start"), b = scalar_value(c, end, "arange end"),
         s = scalar_value(c, step, "arange step");
  if (s == 0) fail("arange: step must not be 0");
  bool integral = dtype_of<T>() == kI64 || dtype_of<T>() == phi::DataType::INT32;
  double span = integral ? (std::abs(b - a) + std::abs(s) - 1) / std::abs(s) : std::ceil(std::abs((b - a) / s));
  int64_t n = static_cast<int64_t>(integral ? std::floor(span) : span);
  out->Resize(common::make_ddim({std::max<int64_t>(n, 0)}));
  c.template Alloc<T>(out);
  launch(c, "arange", dtype_of<T>(), {}, {describe(*out)}, {a, s});
}

// ---- random numbers: Paddle's seed semantics ----
// The device generator Paddle passes (dev_ctx.GetGenerator(), seeded by paddle.seed like the
// CPU's) holds a host mt19937_64 engine; the draws are the ones Paddle's CPU kernels make, from
// the same distributions, so a program seeded alike gets the CPU's numbers. The engine lives in
// host memory, so it is advanced on the host; the values go to the device with Paddle's copy and
// the affine part runs as the device's scale.

template <typename Context>
std::shared_ptr<std::mt19937_64> engine_for(const Context& c, int64_t seed) {
  if (seed != 0) return std::make_shared<std::mt19937_64>(static_cast<uint64_t>(seed));
  auto* generator = c.GetGenerator();
  if (generator == nullptr) fail("the device context has no random generator");
  return generator->GetCPUEngine();
}

// float32 values into out (any float T): scale by `mul`, add `add` on the device, cast to T.
template <typename T, typename Context>
void place_floats(const Context& c, const std::vector<float>& values, double mul, double add, DenseTensor* out) {
  c.template Alloc<T>(out);
  if (values.empty()) return;
  DenseTensor raw, shaped = temporary(c, out->dims(), kF32);
  upload(c, values.data(), kF32, out->dims(), &raw);
  launch(c, "scale", kF32, {describe(raw)}, {describe(shaped)}, {mul, add, 1.0});
  launch(c, "cast", kF32, {describe(shaped)}, {describe(*out)});
}

template <typename T>
void require_float(const char* op) {
  phi::DataType d = dtype_of<T>();
  if (d != kF32 && d != phi::DataType::FLOAT16 && d != phi::DataType::BFLOAT16 && d != phi::DataType::FLOAT64) {
    fail(std::string(op) + ": dtype " + phi::DataTypeToString(d) + " is not a floating-point dtype");
  }
}

// uniform_real_distribution<float>(min, max) = canonical * (max - min) + min
template <typename T, typename Context>
void UniformKernel(const Context& c, const phi::IntArray& shape, phi::DataType, const phi::Scalar& min,
                   const phi::Scalar& max, int seed, DenseTensor* out) {
  require_float<T>("uniform");
  out->Resize(common::make_ddim(shape.GetData()));
  auto engine = engine_for(c, seed);
  std::vector<float> canonical(static_cast<size_t>(out->numel()));
  for (float& v : canonical) v = std::generate_canonical<float, std::numeric_limits<float>::digits>(*engine);
  float lo = min.to<float>(), hi = max.to<float>();
  place_floats<T>(c, canonical, static_cast<double>(hi - lo), static_cast<double>(lo), out);
}

// normal_distribution<float>(mean, std) = its standard draw * std + mean
template <typename T, typename Context>
void GaussianKernel(const Context& c, const phi::IntArray& shape, float mean, float std, int seed, phi::DataType,
                    DenseTensor* out) {
  require_float<T>("gaussian");
  out->Resize(common::make_ddim(shape.GetData()));
  auto engine = engine_for(c, seed);
  std::normal_distribution<float> standard(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(out->numel()));
  for (float& v : values) v = standard(*engine);
  place_floats<T>(c, values, static_cast<double>(std), static_cast<double>(mean), out);
}

template <typename I, typename Context>
void uniform_ints(const Context& c, int low, int high, DenseTensor* out) {
  auto engine = engine_for(c, 0);
  std::uniform_int_distribution<I> dist(low, high - 1);
  std::vector<I> values(static_cast<size_t>(out->numel()));
  for (I& v : values) v = dist(*engine);
  DenseTensor raw;
  upload(c, values.data(), phi::CppTypeToDataType<I>::Type(), out->dims(), &raw);
  launch(c, "copy", raw.dtype(), {describe(raw)}, {describe(*out)});
}

// uniform_int_distribution<int32 or int64>(low, high - 1), as Paddle's CPU kernel draws
template <typename T, typename Context>
void RandintKernel(const Context& c, int low, int high, const phi::IntArray& shape, phi::DataType,
                   DenseTensor* out) {
  if (low >= high) fail("randint: high (" + std::to_string(high) + ") must be greater than low (" + std::to_string(low) + ")");
  out->Resize(common::make_ddim(shape.GetData()));
  c.template Alloc<T>(out);
  if (out->numel() == 0) return;
  if (dtype_of<T>() == kI64) {
    uniform_ints<int64_t>(c, low, high, out);
  } else if (dtype_of<T>() == phi::DataType::INT32) {
    uniform_ints<int32_t>(c, low, high, out);
  } else {
    fail("randint: dtype " + phi::DataTypeToString(dtype_of<T>()) + " is not int32 or int64");
  }
}

// The uint8 mask seen as bool (the same bytes, 0 or 1): where()'s condition.
inline AnychipTensor mask_condition(const DenseTensor& mask) {
  AnychipTensor d = describe(mask);
  d.dtype = ANYCHIP_DTYPE_BOOL;
  return d;
}

// Training: keep where uniform_real_distribution<float>(0, 1) draws >= p, with the CPU's draw
// order; kept values are x / (1 - p) (upscale_in_train) or x. Inference: x or x * (1 - p).
template <typename T, typename Context>
void DropoutRawKernel(const Context& c, const DenseTensor& x, const paddle::optional<DenseTensor>& seed_tensor,
                      const phi::Scalar& p, bool is_test, const std::string& mode, int seed, bool fix_seed,
                      DenseTensor* out, DenseTensor* mask) {
  if (mode != "upscale_in_train" && mode != "downgrade_in_infer") fail("dropout: unknown mode '" + mode + "'");
  float prob = p.to<float>();
  bool upscale = mode == "upscale_in_train";
  c.template Alloc<T>(out);
  const phi::DDim& dims = x.dims();
  DenseTensor keep_scale = constant(c, static_cast<double>(1.0f - prob), dtype_of<T>());
  if (is_test || mask == nullptr) {
    if (upscale) {
      launch(c, "copy", dtype_of<T>(), {describe(x)}, {describe(*out)});
    } else {
      launch(c, "multiply", dtype_of<T>(), {describe(x), broadcast(keep_scale, dims)}, {describe(*out)});
    }
    return;
  }
  mask->Resize(dims);
  c.template Alloc<uint8_t>(mask);
  std::vector<uint8_t> keep(static_cast<size_t>(x.numel()), 0);
  if (prob != 1.0f) {
    int64_t seed_value = seed_tensor.get_ptr() != nullptr ? static_cast<int64_t>(scalar_value(c, *seed_tensor, "seed"))
                                                          : (fix_seed ? seed : 0);
    auto engine = engine_for(c, seed_value);
    std::uniform_real_distribution<float> dist(0.0f, 1.0f);
    for (uint8_t& k : keep) k = dist(*engine) < prob ? 0 : 1;
  }
  if (!keep.empty()) {
    DenseTensor uploaded;
    upload(c, keep.data(), phi::DataType::UINT8, dims, &uploaded);
    launch(c, "copy", kBool, {mask_condition(uploaded)}, {mask_condition(*mask)});
  }
  DenseTensor zero = constant(c, 0.0, dtype_of<T>());
  AnychipTensor kept = describe(x);
  DenseTensor quotient;
  if (upscale) {
    quotient = apply(c, "divide", dtype_of<T>(), {describe(x), broadcast(keep_scale, dims)}, dims, dtype_of<T>());
    kept = describe(quotient);
  }
  launch(c, "where", dtype_of<T>(), {mask_condition(*mask), kept, broadcast(zero, dims)}, {describe(*out)});
}

// dx = dout * mask / (1 - p) (upscale_in_train) or dout * mask; inference: dout or dout * (1 - p)
template <typename T, typename Context>
void DropoutGradRawKernel(const Context& c, const DenseTensor& mask, const DenseTensor& out_grad, const phi::Scalar& p,
                          bool is_test, const std::string& mode, DenseTensor* x_grad) {
  float prob = p.to<float>();
  bool upscale = mode == "upscale_in_train";
  c.template Alloc<T>(x_grad);
  const phi::DDim& dims = out_grad.dims();
  DenseTensor keep_scale = constant(c, static_cast<double>(1.0f - prob), dtype_of<T>());
  if (is_test) {
    if (upscale) {
      launch(c, "copy", dtype_of<T>(), {describe(out_grad)}, {describe(*x_grad)});
    } else {
      launch(c, "multiply", dtype_of<T>(), {describe(out_grad), broadcast(keep_scale, dims)}, {describe(*x_grad)});
    }
    return;
  }
  DenseTensor zero = constant(c, 0.0, dtype_of<T>());
  if (upscale && prob == 1.0f) {
    launch(c, "copy", dtype_of<T>(), {broadcast(zero, dims)}, {describe(*x_grad)});
    return;
  }
  AnychipTensor kept = describe(out_grad);
  DenseTensor quotient;
  if (upscale) {
    quotient = apply(c, "divide", dtype_of<T>(), {kept, broadcast(keep_scale, dims)}, dims, dtype_of<T>());
    kept = describe(quotient);
  }
  launch(c, "where", dtype_of<T>(), {mask_condition(mask), kept, broadcast(zero, dims)}, {describe(*x_grad)});
}

// ---- positions along an axis: argmax/argmin, topk, argsort, cumsum and their grads ----

// x's `axis` moved last, as a dense [rows, n] temporary of T (negated when `negate`).
template <typename T, typename Context>
DenseTensor rows_along(const Context& c, const DenseTensor& x, int axis, bool negate, int64_t* rows, int64_t* n) {
  AnychipTensor moved = axis_last(describe(x), axis);
  *n = moved.rank == 0 ? 1 : moved.shape[moved.rank - 1];
  *rows = *n == 0 ? 0 : numel_of(moved) / *n;
  if (moved.rank == 0) moved.rank = 1, moved.shape[0] = 1, moved.strides[0] = 1;
  DenseTensor work = temporary<T>(c, common::make_ddim(shape_of(moved)));
  launch(c, negate ? "scale" : "copy", dtype_of<T>(), {moved}, {describe(work)},
         negate ? std::vector<double>{-1.0, 0.0, 1.0} : std::vector<double>{});
  work.Resize(common::make_ddim({*rows, *n}));
  return work;
}

// Per row of work [rows, n]: its max [rows, 1] (T) and the first position holding it
// [rows, 1] (float32: exact below 2^24).
template <typename T, typename Context>
std::pair<DenseTensor, DenseTensor> first_max(const Context& c, const DenseTensor& work, const DenseTensor& positions) {
  const phi::DDim& dims = work.dims();
  phi::DDim col = common::make_ddim({dims[0], 1});
  std::vector<double> last{1.0, 1.0, 1.0};
  DenseTensor m = temporary<T>(c, col);
  launch(c, "max", dtype_of<T>(), {describe(work)}, {describe(m)}, last);
  DenseTensor hit = compare<T>(c, "equal", describe(work), broadcast(m, dims), dims);
  DenseTensor beyond = constant(c, static_cast<double>(dims[1]), kF32);
  DenseTensor where_hit = apply(c, "where", kF32, {describe(hit), broadcast(positions, dims), broadcast(beyond, dims)},
                                dims, kF32);
  DenseTensor neg = apply(c, "scale", kF32, {describe(where_hit)}, dims, kF32, {-1.0, 0.0, 1.0});
  DenseTensor top = temporary(c, col, kF32);
  launch(c, "max", kF32, {describe(neg)}, {describe(top)}, last);
  DenseTensor first = apply(c, "scale", kF32, {describe(top)}, col, kF32, {-1.0, 0.0, 1.0});
  return {m, first};
}

template <typename Context>
DenseTensor positions_f32(const Context& c, int64_t n) {
  if (n >= (int64_t{1} << 24)) fail("an axis of " + std::to_string(n) + " elements is too long (at most 2^24)");
  DenseTensor p = temporary(c, common::make_ddim({n}), kF32);
  launch(c, "arange", kF32, {}, {describe(p)}, {0.0, 1.0});
  return p;
}

// The k largest of each row (ties: the lower position first), by k rounds of first_max, each
// masking its winner with -inf. values [rows, k] of T, indices [rows, k] int64.
template <typename T, typename Context>
void top_rows(const Context& c, DenseTensor work, int64_t k, bool negated, const AnychipTensor& values,
              const AnychipTensor& indices) {
  const phi::DDim dims = work.dims();
  DenseTensor positions = positions_f32(c, dims[1]);
  DenseTensor floor_value = constant(c, -HUGE_VAL, dtype_of<T>());
  for (int64_t j = 0; j < k; ++j) {
    auto [m, first] = first_max<T>(c, work, positions);
    AnychipTensor v = narrow(values, values.rank - 1, j, 1), i = narrow(indices, indices.rank - 1, j, 1);
    launch(c, negated ? "scale" : "copy", dtype_of<T>(), {reshaped(m, shape_of(v))}, {v},
           negated ? std::vector<double>{-1.0, 0.0, 1.0} : std::vector<double>{});
    launch(c, "cast", kF32, {reshaped(first, shape_of(i))}, {i});
    if (j + 1 == k) break;
    DenseTensor won = apply(c, "equal", kF32, {broadcast(positions, dims), broadcast(first, dims)}, dims, kBool);
    work = apply(c, "where", dtype_of<T>(), {describe(won), broadcast(floor_value, dims), describe(work)}, dims,
                 dtype_of<T>());
  }
}

// values/indices outputs (axis of size k) seen as [rows..., k] in the order of rows_along.
inline AnychipTensor moved_output(const DenseTensor& t, int axis) {
  AnychipTensor d = axis_last(describe(t), axis);
  if (d.rank == 0) d.rank = 1, d.shape[0] = 1, d.strides[0] = 1;
  return d;
}

template <typename T, typename Context>
void sorted_top(const Context& c, const DenseTensor& x, int64_t k, int axis, bool largest, DenseTensor* out,
                DenseTensor* indices) {
  int rank = x.dims().size();
  int a = rank == 0 ? 0 : normalized(axis, rank, "topk");
  c.template Alloc<T>(out);
  c.template Alloc<int64_t>(indices);
  int64_t rows, n;
  DenseTensor work = rows_along<T>(c, x, a, !largest, &rows, &n);
  if (k < 0 || k > n) fail("topk: k = " + std::to_string(k) + " is outside [0, " + std::to_string(n) + "]");
  if (rows == 0 || k == 0) return;
  top_rows<T>(c, work, k, !largest, moved_output(*out, a), moved_output(*indices, a));
}

template <typename T, typename Context>
void TopkKernel(const Context& c, const DenseTensor& x, const phi::Scalar& k_scalar, int axis, bool largest, bool,
                DenseTensor* out, DenseTensor* indices) {
  sorted_top<T>(c, x, k_scalar.to<int64_t>(), axis, largest, out, indices);
}

template <typename T, typename Context>
void ArgsortKernel(const Context& c, const DenseTensor& input, int axis, bool descending, bool, DenseTensor* output,
                   DenseTensor* indices) {
  int rank = input.dims().size();
  int64_t n = rank == 0 ? 1 : input.dims()[normalized(axis, rank, "argsort")];
  sorted_top<T>(c, input, n, axis, descending, output, indices);
}

// argmax / argmin: the first extreme position along axis (or of the flattened x), as int64 or int32.
template <typename T, typename Context>
void arg_extreme(const Context& c, const DenseTensor& x, const phi::Scalar& axis, bool flatten, bool largest,
                 phi::DataType dtype, DenseTensor* out) {
  c.Alloc(out, dtype == phi::DataType::INT32 ? dtype : kI64);
  int64_t rows, n;
  DenseTensor work;
  if (flatten || x.dims().size() == 0) {
    DenseTensor flat_storage;
    AnychipTensor flat = reshaped(dense(c, x, &flat_storage), {1, x.numel()});
    DenseTensor whole = temporary<T>(c, common::make_ddim({1, x.numel()}));
    launch(c, largest ? "copy" : "scale", dtype_of<T>(), {flat}, {describe(whole)},
           largest ? std::vector<double>{} : std::vector<double>{-1.0, 0.0, 1.0});
    work = whole, rows = 1, n = x.numel();
  } else {
    work = rows_along<T>(c, x, normalized(axis.to<int64_t>(), x.dims().size(), "argmax"), !largest, &rows, &n);
  }
  if (n == 0) fail("argmax/argmin of an empty axis");
  DenseTensor positions = positions_f32(c, n);
  DenseTensor first = first_max<T>(c, work, positions).second;
  launch(c, "cast", kF32, {reshaped(first, {rows})}, {reshaped(*out, {rows})});
}

template <typename T, typename Context>
void ArgMaxKernel(const Context& c, const DenseTensor& x, const phi::Scalar& axis, bool, bool flatten,
                  phi::DataType dtype, DenseTensor* out) {
  arg_extreme<T>(c, x, axis, flatten, true, dtype, out);
}

template <typename T, typename Context>
void ArgMinKernel(const Context& c, const DenseTensor& x, const phi::Scalar& axis, bool, bool flatten,
                  phi::DataType dtype, DenseTensor* out) {
  arg_extreme<T>(c, x, axis, flatten, false, dtype, out);
}

// Linear offsets (int64, index's shape) of index's positions with coordinate `axis` replaced by
// the index value, in a dense tensor of shape `target`.
template <typename Context>
DenseTensor along_axis_offsets(const Context& c, const DenseTensor& index, const phi::DDim& target, int axis) {
  DenseTensor index_storage;
  AnychipTensor id = int64_index(c, index, &index_storage);
  const phi::DDim& dims = index.dims();
  int rank = target.size();
  if (id.rank != rank) fail("the index must have the rank of the tensor it indexes");
  std::vector<int64_t> strides(rank, 1);
  for (int d = rank - 2; d >= 0; --d) strides[d] = strides[d + 1] * target[d + 1];
  DenseTensor stride = constant(c, static_cast<double>(strides[axis]), kI64);
  DenseTensor offsets = apply(c, "multiply", kI64, {id, broadcast(stride, dims)}, dims, kI64);
  for (int d = 0; d < rank; ++d) {
    if (d == axis || dims[d] == 1) continue;
    if (dims[d] > target[d]) fail("the index is larger than the tensor along dimension " + std::to_string(d));
    DenseTensor steps = temporary(c, common::make_ddim({dims[d]}), kI64);
    launch(c, "arange", kI64, {}, {describe(steps)}, {0.0, static_cast<double>(strides[d])});
    AnychipTensor along = describe(steps);
    along.rank = rank;
    for (int k = 0; k < rank; ++k) along.shape[k] = dims[k], along.strides[k] = 0;
    along.strides[d] = 1;
    offsets = apply(c, "add", kI64, {describe(offsets), along}, dims, kI64);
  }
  return offsets;
}

// x_grad (x's shape) = zeros plus out_grad's elements added at the offsets: embedding_grad's
// scatter-add over x_grad's elements as a [numel, 1] table.
template <typename T, typename Context>
void scatter_along_axis(const Context& c, const DenseTensor& index, const DenseTensor& out_grad, int axis,
                        DenseTensor* x_grad) {
  c.template Alloc<T>(x_grad);
  const phi::DDim& target = x_grad->dims();
  int a = target.size() == 0 ? 0 : normalized(axis, target.size(), "scatter along axis");
  if (target.size() == 0 || out_grad.numel() == 0) {
    fill<T>(c, phi::Scalar(0.0), x_grad);
    if (target.size() == 0 && out_grad.numel() != 0) launch(c, "copy", dtype_of<T>(), {describe(out_grad)}, {describe(*x_grad)});
    return;
  }
  DenseTensor offsets = along_axis_offsets(c, index, target, a);
  DenseTensor grad_storage;
  AnychipTensor rows = reshaped(dense(c, out_grad, &grad_storage), {out_grad.numel(), 1});
  launch(c, "embedding_grad", dtype_of<T>(), {reshaped(offsets, {out_grad.numel()}), rows},
         {reshaped(*x_grad, {x_grad->numel(), 1})}, {-1.0});
}

template <typename T, typename Context>
void TakeAlongAxisGradKernel(const Context& c, const DenseTensor&, const DenseTensor& index, const DenseTensor& out_grad,
                             int axis, DenseTensor* x_grad) {
  scatter_along_axis<T>(c, index, out_grad, axis, x_grad);
}

template <typename T, typename Context>
void TopkGradKernel(const Context& c, const DenseTensor&, const DenseTensor& indices, const DenseTensor& out_grad,
                    const phi::Scalar&, int axis, bool, bool, DenseTensor* x_grad) {
  scatter_along_axis<T>(c, indices, out_grad, axis, x_grad);
}

template <typename T, typename Context>
void ArgsortGradKernel(const Context& c, const DenseTensor& indices, const DenseTensor&, const DenseTensor& out_grad,
                       int axis, bool, bool, DenseTensor* in_grad) {
  scatter_along_axis<T>(c, indices, out_grad, axis, in_grad);
}

// cumsum along axis as a product with a triangular 0/1 matrix: out[.., j] = sum_i x[.., i] M[i, j]
// with M[i, j] = i <= j (i < j exclusive; >= and > when reversed). O(n^2) per row: fine for the
// sequence and class axes it sees in these models, slow over a long flattened tensor.
template <typename T, typename Context>
void cumulative(const Context& c, const DenseTensor& x, const phi::Scalar& axis, bool flatten, bool exclusive,
                bool reverse, DenseTensor* out) {
  c.template Alloc<T>(out);
  int64_t rows, n;
  DenseTensor work;
  AnychipTensor to;
  if (flatten || x.dims().size() == 0) {
    DenseTensor flat_storage;
    work = temporary<T>(c, common::make_ddim({1, x.numel()}));
    launch(c, "copy", dtype_of<T>(), {reshaped(dense(c, x, &flat_storage), {1, x.numel()})}, {describe(work)});
    rows = 1, n = x.numel();
    to = reshaped(*out, {1, x.numel()});
  } else {
    int a = normalized(axis.to<int64_t>(), x.dims().size(), "cumsum");
    work = rows_along<T>(c, x, a, false, &rows, &n);
    to = moved_output(*out, a);
  }
  if (rows == 0 || n == 0) return;
  // upper (i <= j): j - i >= 0; exclusive: j - i >= 1; reversed: j - i <= 0 / <= -1
  DenseTensor mask = triangle(c, n, n, reverse ? (exclusive ? -1 : 0) : (exclusive ? 1 : 0), reverse);
  phi::DDim square = common::make_ddim({n, n});
  DenseTensor one = constant(c, 1.0, dtype_of<T>()), zero = constant(c, 0.0, dtype_of<T>());
  DenseTensor m = apply(c, "where", dtype_of<T>(), {describe(mask), broadcast(one, square), broadcast(zero, square)},
                        square, dtype_of<T>());
  DenseTensor product = temporary<T>(c, common::make_ddim({rows, n}));
  launch(c, "matmul", dtype_of<T>(), {describe(work), describe(m)}, {describe(product)}, {0.0, 0.0});
  launch(c, "copy", dtype_of<T>(), {reshaped(product, shape_of(to))}, {to});
}

template <typename T, typename Context>
void CumsumKernel(const Context& c, const DenseTensor& x, const phi::Scalar& axis, bool flatten, bool exclusive,
                  bool reverse, DenseTensor* out) {
  cumulative<T>(c, x, axis, flatten, exclusive, reverse, out);
}

// the gradient of a cumsum is the cumsum the other way
template <typename T, typename Context>
void CumsumGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& out_grad, const phi::Scalar& axis,
                      bool flatten, bool exclusive, bool reverse, DenseTensor* x_grad) {
  x_grad->Resize(x.dims());
  cumulative<T>(c, out_grad, axis, flatten, exclusive, !reverse, x_grad);
}

// ---- optimizers ----

// AdamW as Paddle's CPU kernel computes it, in float32 (float32 copies of 16-bit parameters):
//   p' = p * (1 - lr * coeff); m1' = b1 m1 + (1 - b1) g; m2' = b2 m2 + (1 - b2) g g;
//   p'' = p' - lr * sqrt(1 - b2^t) / (1 - b1^t) * m1' / (sqrt(m2') + eps * sqrt(1 - b2^t)).
// lr and the beta powers are one-element tensors (read on the host); moments are float32 or T.
template <typename Context>
DenseTensor as_f32(const Context& c, const DenseTensor& t) {
  DenseTensor storage;
  AnychipTensor d = dense(c, t, &storage);
  return apply(c, "cast", t.dtype(), {d}, t.dims(), kF32);
}

template <typename Context>
void store_as(const Context& c, const DenseTensor& f32, DenseTensor* out, phi::DataType dtype) {
  if (out == nullptr) return;
  DenseTensor staged = f32;
  if (out->initialized() && out->dtype() != phi::DataType::UNDEFINED) dtype = out->dtype();
  c.Alloc(out, dtype);
  launch(c, "cast", kF32, {describe(staged)}, {describe(*out)});
}

// a beta power's next value, written where the input lives (host or device)
template <typename Context>
void store_power(const Context& c, const DenseTensor& like, float value, DenseTensor* out) {
  if (out == nullptr) return;
  out->Resize(like.dims());
  if (like.place().GetType() == phi::AllocationType::CPU) {
    *static_cast<float*>(c.HostAlloc(out, kF32)) = value;
    return;
  }
  c.Alloc(out, kF32);
  launch(c, "fill", kF32, {}, {describe(*out)}, {static_cast<double>(value)});
}

template <typename T, typename Context>
void AdamwDenseKernel(const Context& c, const DenseTensor& param, const DenseTensor& grad,
                      const DenseTensor& learning_rate, const DenseTensor& moment1, const DenseTensor& moment2,
                      const paddle::optional<DenseTensor>& moment2_max, const DenseTensor& beta1_pow,
                      const DenseTensor& beta2_pow, const paddle::optional<DenseTensor>& master_param,
                      const paddle::optional<DenseTensor>& skip_update, const phi::Scalar& beta1,
                      const phi::Scalar& beta2, const phi::Scalar& epsilon, float lr_ratio, float coeff,
                      bool with_decay, bool lazy_mode, int64_t, bool multi_precision, bool use_global_beta_pow,
                      bool amsgrad, DenseTensor* param_out, DenseTensor* moment1_out, DenseTensor* moment2_out,
                      DenseTensor* moment2_max_out, DenseTensor* beta1_pow_out, DenseTensor* beta2_pow_out,
                      DenseTensor* master_param_outs) {
  require_float<T>("adamw");
  if (amsgrad) fail("adamw: amsgrad=True has no device kernel");
  if (lazy_mode) fail("adamw: lazy_mode=True has no device kernel");
  if (skip_update.get_ptr() != nullptr && scalar_value(c, *skip_update, "skip_update") != 0) {
    fail("adamw: skip_update has no device kernel");
  }
  float b1 = beta1.to<float>(), b2 = beta2.to<float>(), eps = epsilon.to<float>();
  float b1p = static_cast<float>(scalar_value(c, beta1_pow, "beta1_pow"));
  float b2p = static_cast<float>(scalar_value(c, beta2_pow, "beta2_pow"));
  float lr = static_cast<float>(scalar_value(c, learning_rate, "learning_rate")) * lr_ratio;
  float decay = with_decay ? coeff : 0.0f;
  bool master = multi_precision && master_param.get_ptr() != nullptr;
  const phi::DDim& dims = param.dims();
  DenseTensor p = as_f32(c, master ? *master_param : param), g = as_f32(c, grad);
  DenseTensor m1 = as_f32(c, moment1), m2 = as_f32(c, moment2);
  auto affine = [&](const DenseTensor& t, double s, double b) { return apply(c, "scale", kF32, {describe(t)}, dims, kF32, {s, b, 1.0}); };
  auto ew = [&](const char* op, const DenseTensor& a, const DenseTensor& b) {
    return apply(c, op, kF32, {describe(a), describe(b)}, dims, kF32);
  };
  DenseTensor decayed = affine(p, static_cast<double>(1.0f - lr * decay), 0.0);
  DenseTensor m1n = ew("add", affine(m1, b1, 0.0), affine(g, static_cast<double>(1.0f - b1), 0.0));
  DenseTensor m2n = ew("add", affine(m2, b2, 0.0), ew("multiply", affine(g, static_cast<double>(1.0f - b2), 0.0), g));
  float bias2 = std::sqrt(1.0f - b2p);
  float step = lr * bias2 / (1.0f - b1p);
  DenseTensor denom = affine(apply(c, "sqrt", kF32, {describe(m2n)}, dims, kF32), 1.0, static_cast<double>(eps * bias2));
  DenseTensor update = affine(ew("divide", m1n, denom), static_cast<double>(step), 0.0);
  DenseTensor p_new = ew("subtract", decayed, update);
  store_as(c, p_new, param_out, dtype_of<T>());
  if (master) store_as(c, p_new, master_param_outs, kF32);
  store_as(c, m1n, moment1_out, moment1.dtype());
  store_as(c, m2n, moment2_out, moment2.dtype());
  if (moment2_max_out != nullptr && moment2_max.get_ptr() != nullptr) {
    store_as(c, as_f32(c, *moment2_max), moment2_max_out, moment2_max->dtype());
  }
  if (!use_global_beta_pow) {
    store_power(c, beta1_pow, b1 * b1p, beta1_pow_out);
    store_power(c, beta2_pow, b2 * b2p, beta2_pow_out);
  }
}

// p' = p - lr * g
template <typename T, typename Context>
void SGDDenseKernel(const Context& c, const DenseTensor& param, const DenseTensor& learning_rate,
                    const DenseTensor& grad, const paddle::optional<DenseTensor>& master_param, bool multi_precision,
                    DenseTensor* param_out, DenseTensor* master_param_out) {
  require_float<T>("sgd");
  bool master = multi_precision && master_param.get_ptr() != nullptr;
  const phi::DDim& dims = param.dims();
  double lr = static_cast<float>(scalar_value(c, learning_rate, "learning_rate"));
  DenseTensor p = as_f32(c, master ? *master_param : param), g = as_f32(c, grad);
  DenseTensor step = apply(c, "scale", kF32, {describe(g)}, dims, kF32, {lr, 0.0, 1.0});
  DenseTensor p_new = apply(c, "subtract", kF32, {describe(p), describe(step)}, dims, kF32);
  store_as(c, p_new, param_out, dtype_of<T>());
  if (master) store_as(c, p_new, master_param_out, kF32);
}


// Adam: AdamW without the decoupled decay.
template <typename T, typename Context>
void AdamDenseKernel(const Context& c, const DenseTensor& param, const DenseTensor& grad,
                     const DenseTensor& learning_rate, const DenseTensor& moment1, const DenseTensor& moment2,
                     const paddle::optional<DenseTensor>& moment2_max, const DenseTensor& beta1_pow,
                     const DenseTensor& beta2_pow, const paddle::optional<DenseTensor>& master_param,
                     const paddle::optional<DenseTensor>& skip_update, const phi::Scalar& beta1,
                     const phi::Scalar& beta2, const phi::Scalar& epsilon, bool lazy_mode,
                     int64_t min_row_size_to_use_multithread, bool multi_precision, bool use_global_beta_pow,
                     bool amsgrad, DenseTensor* param_out, DenseTensor* moment1_out, DenseTensor* moment2_out,
                     DenseTensor* moment2_max_out, DenseTensor* beta1_pow_out, DenseTensor* beta2_pow_out,
                     DenseTensor* master_param_outs) {
  AdamwDenseKernel<T>(c, param, grad, learning_rate, moment1, moment2, moment2_max, beta1_pow, beta2_pow,
                      master_param, skip_update, beta1, beta2, epsilon, 1.0f, 0.0f, false, lazy_mode,
                      min_row_size_to_use_multithread, multi_precision, use_global_beta_pow, amsgrad, param_out,
                      moment1_out, moment2_out, moment2_max_out, beta1_pow_out, beta2_pow_out, master_param_outs);
}

// ---- reductions' gradients ----

// `t` (a reduction's result, keepdim or not) seen at x's rank: stride 0 on the reduced dims.
template <typename Context>
AnychipTensor spread(const Context& c, const DenseTensor& t, const phi::DDim& x_dims, const std::vector<bool>& reduced,
                     DenseTensor* storage) {
  AnychipTensor g = dense(c, t, storage);
  int rank = x_dims.size();
  g.rank = rank;
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    g.shape[i] = x_dims[i];
    g.strides[i] = reduced[i] ? 0 : stride;
    if (!reduced[i]) stride *= x_dims[i];
  }
  return g;
}

inline std::vector<bool> reduced_dims(const phi::IntArray& dims, int rank, bool reduce_all) {
  std::vector<double> attrs = reduce_attrs(dims, rank, true);
  std::vector<bool> reduced(rank, reduce_all || attrs[1] == 0);
  for (size_t k = 2; k < attrs.size(); ++k) reduced[static_cast<int>(attrs[k])] = true;
  return reduced;
}

// dx = dout * (x == out) / (how many elements tie for the extreme): Paddle splits ties.
template <typename T, typename Context>
void extreme_grad(const Context& c, const DenseTensor& x, const DenseTensor& out, const DenseTensor& out_grad,
                  const phi::IntArray& dims, bool reduce_all, DenseTensor* x_grad) {
  c.template Alloc<T>(x_grad);
  const phi::DDim& xd = x.dims();
  std::vector<bool> reduced = reduced_dims(dims, xd.size(), reduce_all);
  DenseTensor out_storage, grad_storage;
  AnychipTensor o = spread(c, out, xd, reduced, &out_storage), g = spread(c, out_grad, xd, reduced, &grad_storage);
  DenseTensor hit = compare<T>(c, "equal", describe(x), o, xd);
  DenseTensor one = constant(c, 1.0, dtype_of<T>()), zero = constant(c, 0.0, dtype_of<T>());
  DenseTensor m = masked<T>(c, hit, broadcast(one, xd), broadcast(zero, xd), xd);
  std::vector<double> attrs{1.0, 0.0};
  std::vector<int64_t> kept;
  for (int i = 0; i < xd.size(); ++i) {
    if (reduced[i]) attrs.push_back(i);
    kept.push_back(reduced[i] ? 1 : xd[i]);
  }
  attrs[1] = static_cast<double>(attrs.size() - 2);
  DenseTensor count = temporary<T>(c, common::make_ddim(kept));
  if (attrs.size() == 2) {
    launch(c, "copy", dtype_of<T>(), {describe(m)}, {describe(count)});
  } else {
    launch(c, "sum", dtype_of<T>(), {describe(m)}, {describe(count)}, attrs);
  }
  DenseTensor share = times<T>(c, g, describe(m), xd);
  launch(c, "divide", dtype_of<T>(), {describe(share), broadcast(count, xd)}, {describe(*x_grad)});
}

template <typename T, typename Context>
void ReduceMaxGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& out, const DenseTensor& out_grad,
                         const phi::IntArray& dims, bool, bool reduce_all, DenseTensor* x_grad) {
  extreme_grad<T>(c, x, out, out_grad, dims, reduce_all, x_grad);
}

template <typename T, typename Context>
void ReduceMinGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& out, const DenseTensor& out_grad,
                         const phi::IntArray& dims, bool, bool reduce_all, DenseTensor* x_grad) {
  extreme_grad<T>(c, x, out, out_grad, dims, reduce_all, x_grad);
}

// ---- n-d gathers and scatters: index [..., k] addresses x's first k dimensions ----

struct NdRows {
  DenseTensor offsets;   // int64, index's batch shape: the row of x's [prefix, rest] view
  int64_t prefix, rest;  // rows (x's first k dims) and their length (the other dims)
  int64_t count;         // index's batch size
};

template <typename Context>
NdRows nd_rows(const Context& c, const DenseTensor& index, const phi::DDim& x_dims) {
  const phi::DDim& id = index.dims();
  if (id.size() < 1) fail("the index must have rank 1 or more, its last dimension indexing x");
  int64_t k = id[id.size() - 1];
  if (k > x_dims.size()) fail("the index's last dimension (" + std::to_string(k) + ") exceeds x's rank");
  NdRows r{DenseTensor(), 1, 1, 1};
  for (int i = 0; i < x_dims.size(); ++i) (i < k ? r.prefix : r.rest) *= x_dims[i];
  std::vector<int64_t> batch(id.Get(), id.Get() + id.size() - 1);
  for (int64_t b : batch) r.count *= b;
  phi::DDim bd = common::make_ddim(std::vector<int64_t>{r.count});
  r.offsets = temporary(c, bd, kI64);
  launch(c, "fill", kI64, {}, {describe(r.offsets)}, {0.0});
  DenseTensor storage;
  AnychipTensor ids = reshaped(int64_index(c, index, &storage), {r.count, k});
  int64_t stride = 1;
  for (int64_t j = k - 1; j >= 0; --j) {
    DenseTensor s = constant(c, static_cast<double>(stride), kI64);
    AnychipTensor column = drop_dim(narrow(ids, 1, j, 1), 1);
    DenseTensor part = apply(c, "multiply", kI64, {column, broadcast(s, bd)}, bd, kI64);
    r.offsets = apply(c, "add", kI64, {describe(r.offsets), describe(part)}, bd, kI64);
    stride *= x_dims[static_cast<int>(j)];
  }
  return r;
}

template <typename T, typename Context>
void GatherNdKernel(const Context& c, const DenseTensor& x, const DenseTensor& index, DenseTensor* out) {
  c.template Alloc<T>(out);
  if (out->numel() == 0) return;
  NdRows r = nd_rows(c, index, x.dims());
  DenseTensor storage;
  AnychipTensor table = reshaped(dense(c, x, &storage), {r.prefix, r.rest});
  launch(c, "embedding", dtype_of<T>(), {describe(r.offsets), table}, {reshaped(*out, {r.count, r.rest})}, {-1.0});
}

template <typename T, typename Context>
void GatherNdGradKernel(const Context& c, const DenseTensor& x, const DenseTensor& index, const DenseTensor& out_grad,
                        DenseTensor* x_grad) {
  c.template Alloc<T>(x_grad);
  NdRows r = nd_rows(c, index, x.dims());
  DenseTensor storage;
  launch(c, "embedding_grad", dtype_of<T>(), {describe(r.offsets), reshaped(dense(c, out_grad, &storage), {r.count, r.rest})},
         {reshaped(*x_grad, {r.prefix, r.rest})}, {-1.0});
}

// out = x + the updates summed into the rows they address
template <typename T, typename Context>
void ScatterNdAddKernel(const Context& c, const DenseTensor& x, const DenseTensor& index, const DenseTensor& updates,
                        DenseTensor* out) {
  c.template Alloc<T>(out);
  NdRows r = nd_rows(c, index, x.dims());
  DenseTensor added = temporary<T>(c, x.dims()), storage;
  launch(c, "embedding_grad", dtype_of<T>(), {describe(r.offsets), reshaped(dense(c, updates, &storage), {r.count, r.rest})},
         {reshaped(added, {r.prefix, r.rest})}, {-1.0});
  launch(c, "add", dtype_of<T>(), {describe(x), describe(added)}, {describe(*out)});
}

// out = x + add_value's slices summed at index along axis
template <typename T, typename Context>
void IndexAddKernel(const Context& c, const DenseTensor& x, const DenseTensor& index, const DenseTensor& add_value,
                    int axis, DenseTensor* output) {
  c.template Alloc<T>(output);
  DenseTensor added = temporary<T>(c, x.dims());
  scatter_add<T>(c, index, add_value, axis, &added);
  launch(c, "add", dtype_of<T>(), {describe(x), describe(added)}, {describe(*output)});
}

// x[starts:ends:strides] along axes (Python's rules for negative and out-of-range bounds)
template <typename T, typename Context>
void StridedSliceKernel(const Context& c, const DenseTensor& x, const std::vector<int>& axes,
                        const phi::IntArray& starts, const phi::IntArray& ends, const phi::IntArray& strides,
                        DenseTensor* out) {
  c.template Alloc<T>(out);
  std::vector<int64_t> a(axes.begin(), axes.end());
  AnychipTensor view = sliced(describe(x), a, starts.GetData(), ends.GetData(), strides.GetData());
  launch(c, "copy", dtype_of<T>(), {view}, {reshaped(*out, shape_of(view))});
}

template <typename T, typename Context>
void StridedSliceGradKernel(const Context& c, const DenseTensor&, const DenseTensor& out_grad,
                            const std::vector<int>& axes, const phi::IntArray& starts, const phi::IntArray& ends,
                            const phi::IntArray& strides, DenseTensor* x_grad) {
  fill<T>(c, phi::Scalar(0.0), x_grad);
  std::vector<int64_t> a(axes.begin(), axes.end());
  AnychipTensor view = sliced(describe(*x_grad), a, starts.GetData(), ends.GetData(), strides.GetData());
  DenseTensor storage;
  launch(c, "copy", dtype_of<T>(), {reshaped(dense(c, out_grad, &storage), shape_of(view))}, {view});
}

}  // namespace anychip_pk
