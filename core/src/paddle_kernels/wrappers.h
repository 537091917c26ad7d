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

}  // namespace anychip_pk
