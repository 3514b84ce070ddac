// Private: the library actors' operations as requests to an isolated device's
// worker (docs/design.md, "Isolated device", "Actors in the worker"). One
// request (op_code::actor) carries the actor (kind, id, the options its
// worker-side twin is made with), the operation, its parameter block (the
// public parameter structs, which are plain values) and its buffer views.
// Not installed; both ends are built from this tree.
#pragma once

#include "protocol.hpp"

#include <atomr/cuda/blas_actor.hpp>
#include <atomr/cuda/cudnn_actor.hpp>
#include <atomr/cuda/fft_actor.hpp>
#include <atomr/cuda/rng_actor.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

namespace atomr::cuda::detail::wire {

/// Which library actor a request names.
enum class actor_kind : std::uint16_t { blas = 1, fft = 2, cudnn = 3, rng = 4 };

/// The operations (gemm keeps its own op_code::gemm request).
enum class actor_op : std::uint16_t {
  gemm_fused = 1,    ///< gemm_params, the epilogue in `option`; a, b, c, bias (0: none)
  gemm_batched = 2,  ///< blas_batched_args; a, b, c
  gemv = 3,          ///< gemv_params; a, x, y
  axpy = 4,          ///< level1_args; x, y
  scal = 5,          ///< level1_args; x
  dot = 6,           ///< level1_args; x, y. Answer: the value (T)
  nrm2 = 7,          ///< level1_args; x. Answer: the value (T)
  asum = 8,          ///< level1_args; x. Answer: the value (T)
  iamax = 9,         ///< level1_args; x. Answer: the index (int64, from 0)
  c2c = 20,          ///< fft_shape; in, out (type: the input's element type)
  r2c = 21,          ///< fft_shape; in, out
  c2r = 22,          ///< fft_shape; in, out
  conv2d = 40,       ///< conv_args; x, filter, bias (handle 0: none), y
  activation = 41,   ///< activation_args; x, y
  softmax = 42,      ///< softmax_args; x, y
  pooling = 43,      ///< pooling_args; x, y
  batchnorm = 44,    ///< batchnorm_args; x, scale, bias, mean, var, y
  uniform = 60,      ///< rng_args; out
  normal = 61,       ///< rng_args (a: mean, b: stddev); out
  log_normal = 62,   ///< rng_args (a: mean, b: stddev); out
  poisson = 63,      ///< rng_args (a: lambda); out
  raw = 64,          ///< rng_args; out
};

/// actor_settings::flags bits.
enum settings_flag : std::uint8_t {
  tf32 = 1,         ///< blas: TF32 math now (set_tf32 is followed per call)
  lt_matmul = 2,    ///< blas: blas_options::lt_matmul
  cuda_graphs = 4,  ///< cudnn: cudnn_options::cuda_graphs
  has_seed = 8,     ///< rng: `limit` holds a seed
};

/// The options the worker makes its twin of the service's actor with, at the
/// first request naming the actor (and again after a restart). Every request
/// carries them: the worker may be new.
struct actor_settings {
  std::uint8_t has_streams = 0;
  std::uint8_t streams = 0;  ///< a stream_policy
  std::uint8_t flags = 0;    ///< settings_flag bits
  std::uint8_t variant = 0;  ///< rng: the rng_kind; cudnn: the conv_api
  std::uint32_t max_lanes = 0;
  /// blas: cuda_graph_cache; fft: plan_cache_size; cudnn: algo_cache_size
  std::uint64_t cache = 0;
  std::uint64_t limit = 0;       ///< cudnn: workspace_limit; rng: the seed
  std::uint64_t offset = 0;      ///< rng: the sequence's position at the last set_seed/set_offset
  std::uint32_t dimensions = 0;  ///< rng
  /// rng: bumped by each set_seed and set_offset; the worker applies seed and
  /// offset when a request brings a newer epoch than its actor has seen
  std::uint32_t epoch = 0;
};

struct actor_head {
  std::uint64_t actor = 0;   ///< the service's actor id (remote_device::next_id)
  std::uint16_t kind = 0;    ///< an actor_kind
  std::uint16_t op = 0;      ///< an actor_op
  std::uint32_t type = 0;    ///< the dtype the operation is instantiated for
  std::uint16_t params = 0;  ///< bytes of the parameter block after the head
  std::uint16_t refs = 0;    ///< ref_args after the parameters
  /// gemm_fused: the gemm_epilogue (here, so that the request fits a ring
  /// slot: 232 bytes)
  std::uint32_t option = 0;
  actor_settings settings;
};

struct blas_batched_args {
  gemm_params p;
  batch_params batch;
};
struct level1_args {
  std::int64_t n = 0;
  double alpha = 0.0;
  std::int64_t incx = 1, incy = 1;
};
struct conv_args {
  tensor_shape x;
  conv2d_params p;
};
struct activation_args {
  tensor_shape shape;
  activation_params p;
};
struct softmax_args {
  tensor_shape shape;
  softmax_algorithm algorithm = softmax_algorithm::accurate;
};
struct pooling_args {
  tensor_shape x;
  pooling_params p;
};
struct batchnorm_args {
  tensor_shape shape;
  double epsilon = 0.0;
};
struct rng_args {
  double a = 0.0, b = 0.0;
};

/// A request's payload: the head, `params` and the views.
template <class P>
std::string actor_payload(actor_head h, const P& params, std::initializer_list<ref_arg> refs) {
  static_assert(std::is_trivially_copyable_v<P>);
  h.params = static_cast<std::uint16_t>(sizeof(P));
  h.refs = static_cast<std::uint16_t>(refs.size());
  std::string out;
  out.reserve(sizeof h + sizeof(P) + refs.size() * sizeof(ref_arg));
  out.append(bytes_of(h));
  out.append(bytes_of(params));
  for (const auto& r : refs) out.append(bytes_of(r));
  return out;
}

/// A request's parts, checked against the payload's size.
struct actor_request {
  actor_head head;
  std::vector<char> params;
  std::vector<ref_arg> refs;

  /// The parameter block as P; false when its size is not P's, or when a
  /// bool of P (fft_shape::normalize, the only one) holds a byte other than
  /// 0 or 1: that is no bool, and reading it would be undefined.
  template <class P>
  bool params_as(P& out) const {
    static_assert(std::is_trivially_copyable_v<P>);
    if (params.size() != sizeof(P)) return false;
    if constexpr (std::is_same_v<P, fft_shape>)
      if (static_cast<unsigned char>(params[offsetof(fft_shape, normalize)]) > 1) return false;
    std::memcpy(&out, params.data(), sizeof(P));
    return true;
  }
};

inline bool parse_actor(const std::vector<char>& p, actor_request& out) {
  if (p.size() < sizeof(actor_head)) return false;
  std::memcpy(&out.head, p.data(), sizeof(actor_head));
  const std::size_t need =
      sizeof(actor_head) + out.head.params + std::size_t{out.head.refs} * sizeof(ref_arg);
  if (p.size() != need) return false;
  const char* at = p.data() + sizeof(actor_head);
  out.params.assign(at, at + out.head.params);
  at += out.head.params;
  out.refs.resize(out.head.refs);
  if (out.head.refs) std::memcpy(out.refs.data(), at, out.refs.size() * sizeof(ref_arg));
  return true;
}

}  // namespace atomr::cuda::detail::wire
