// Paddle kernel signatures over anychip's base ops (anychip/kernel.h conventions, base-op ABI).
//
// Each template has the signature of the Paddle kernel it stands for (paddle/phi/kernels/*.h)
// and is instantiated only where the generated source registers it with
// PD_REGISTER_PLUGIN_KERNEL, for the dtypes the plugin's base kernels declare.
// Outputs are allocated with dev_ctx.Alloc on the device; inputs are passed as Paddle holds
// them (their strides), broadcast inputs as stride-0 descriptors of the output's shape.
#pragma once

#include <algorithm>
#include <set>

#include "glue.h"

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

// A dense descriptor of `t`'s memory with shape `shape` (same element count; e.g. with the
// reduced dimensions kept as 1).
inline AnychipTensor reshaped(const DenseTensor& t, const std::vector<int64_t>& shape) {
  AnychipTensor d = describe(t);
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
#undef ANYCHIP_PK_UNARY

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

}  // namespace anychip_pk
