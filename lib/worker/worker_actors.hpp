// Private, the worker process only: the twins of the service's library actors
// and the requests that run on them (docs/design.md, "Isolated device",
// "Actors in the worker"). Each service actor has one twin here, made with
// its options at the first request naming it, dropped when the service drops
// its actor. A request runs as the same co_await the service would have made
// in process, so every check, lane and fault path is the in-process one.
#pragma once

#include "actor_wire.hpp"

#include <atomr/cuda.hpp>
#include <atomr/cuda/detail/buffer_state.hpp>

#include <boost/asio/awaitable.hpp>

#include <complex>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace atomr::cuda::detail::worker_side {

namespace asio = boost::asio;

/// Finds the buffer a view names (its allocation's error if it failed).
using lookup_fn = std::function<result<std::shared_ptr<buffer_state>>(std::uint64_t handle)>;

/// The view `r` of the buffer `st` as a gpu_ref<T>, checked (type, range).
template <class T>
result<gpu_ref<T>> checked_view(std::shared_ptr<buffer_state> st, const wire::ref_arg& r) {
  if (st->type != dtype_of<T>)
    return make_error(errc::invalid_argument, "worker: a buffer of " +
                                                  std::string(to_string(st->type)) + ", not " +
                                                  std::string(to_string(dtype_of<T>)));
  if (r.offset > st->count || r.count > st->count - r.offset)
    return make_error(errc::invalid_argument, "worker: view outside its buffer");
  return gpu_ref<T>(std::move(st), r.offset, r.count);
}

inline gpu_error short_request() {
  return make_error(errc::invalid_argument, "worker: malformed actor request");
}

/// The service's actors' twins, and the requests that name them.
class actor_host {
public:
  actor_host(device dev, lookup_fn lookup) : dev_(std::move(dev)), lookup_(std::move(lookup)) {}

  /// The twin of blas actor `id` (made with `s` if new); its math mode follows `s`.
  result<blas_actor> blas(std::uint64_t id, const wire::actor_settings& s) {
    std::lock_guard lk(mu_);
    auto it = blas_.find(id);
    if (it == blas_.end()) {
      blas_options o;
      if (s.has_streams) o.streams = static_cast<stream_policy>(s.streams);
      o.tf32 = (s.flags & wire::tf32) != 0;
      o.lt_matmul = (s.flags & wire::lt_matmul) != 0;
      o.max_lanes = s.max_lanes;
      o.cuda_graph_cache = s.cache;
      BOOST_OUTCOME_TRY(auto made, blas_actor::create(dev_, o));
      it = blas_.emplace(id, std::move(made)).first;
    }
    const bool t32 = (s.flags & wire::tf32) != 0;
    if (it->second.tf32() != t32) {
      BOOST_OUTCOME_TRY(it->second.set_tf32(t32));
    }
    return it->second;
  }

  /// The service dropped actor `id` (of any kind).
  void release(std::uint64_t id) {
    std::lock_guard lk(mu_);
    blas_.erase(id);
    fft_.erase(id);
    cudnn_.erase(id);
    rng_.erase(id);
  }

  /// One op_code::actor request (parsed): its answer's bytes (empty, or a scalar).
  asio::awaitable<result<std::string>> run(const wire::actor_request& q) {
    switch (static_cast<wire::actor_kind>(q.head.kind)) {
      case wire::actor_kind::blas:
        co_return co_await run_blas(q);
      case wire::actor_kind::fft:
        co_return co_await run_fft(q);
      case wire::actor_kind::cudnn:
        co_return co_await run_cudnn(q);
      case wire::actor_kind::rng:
        co_return co_await run_rng(q);
    }
    co_return make_error(errc::not_supported, "worker: unknown actor kind");
  }

private:
  /// Awaits f(T{}) for the first of Ts that is the request's type.
  template <class T, class... Rest, class F>
  static asio::awaitable<result<std::string>> typed(const wire::actor_request& q, F& f) {
    if (static_cast<dtype>(q.head.type) == dtype_of<T>) co_return co_await f(T{});
    if constexpr (sizeof...(Rest) > 0)
      co_return co_await typed<Rest...>(q, f);
    else
      co_return make_error(errc::invalid_argument,
                           "worker: element type " +
                               std::string(to_string(static_cast<dtype>(q.head.type))) +
                               " not offered by this operation");
  }

  /// View i of the request as gpu_ref<T>; an empty gpu_ref for handle 0 when
  /// `optional` (an argument left out).
  template <class T>
  result<gpu_ref<T>> view(const wire::actor_request& q, std::size_t i, bool optional = false) {
    if (i >= q.refs.size()) return short_request();
    const auto& r = q.refs[i];
    if (r.handle == 0) {
      if (optional) return gpu_ref<T>{};
      return make_error(errc::invalid_argument, "worker: a view without a buffer");
    }
    BOOST_OUTCOME_TRY(auto st, lookup_(r.handle));
    return checked_view<T>(std::move(st), r);
  }

  template <class P>
  static result<P> params(const wire::actor_request& q) {
    P p;
    if (!q.params_as(p)) return short_request();
    return p;
  }

  /// Done: an operation yielding a buffer answers with no bytes.
  template <class R>
  static result<std::string> empty(const result<R>& r) {
    if (!r) return r.error();
    return std::string();
  }
  template <class V>
  static result<std::string> value(const result<V>& r) {
    if (!r) return r.error();
    return std::string(wire::bytes_of(r.value()));
  }

  /// The twin of actor `id` in `m`, made by `make` if new.
  template <class A, class Make>
  result<A> twin(std::unordered_map<std::uint64_t, A>& m, std::uint64_t id, Make&& make) {
    std::lock_guard lk(mu_);
    auto it = m.find(id);
    if (it == m.end()) {
      BOOST_OUTCOME_TRY(auto made, make());
      it = m.emplace(id, std::move(made)).first;
    }
    return it->second;
  }

  asio::awaitable<result<std::string>> run_blas(const wire::actor_request& q) {
    BOOST_OUTCOME_CO_TRY(auto actor, blas(q.head.actor, q.head.settings));
    using op = wire::actor_op;
    switch (static_cast<op>(q.head.op)) {
      case op::gemm_fused: {
        BOOST_OUTCOME_CO_TRY(auto p, params<gemm_params>(q));
        const auto epilogue = static_cast<gemm_epilogue>(q.head.option);
        auto f = [&](auto t) -> asio::awaitable<result<std::string>> {
          using T = decltype(t);
          BOOST_OUTCOME_CO_TRY(auto A, view<T>(q, 0));
          BOOST_OUTCOME_CO_TRY(auto B, view<T>(q, 1));
          BOOST_OUTCOME_CO_TRY(auto C, view<T>(q, 2));
          BOOST_OUTCOME_CO_TRY(auto bias, view<T>(q, 3, true));
          co_return empty(co_await actor.gemm_fused(p, epilogue, A, B, bias, C));
        };
        co_return co_await typed<float, half, bfloat16>(q, f);
      }
      case op::gemm_batched: {
        BOOST_OUTCOME_CO_TRY(auto a, params<wire::blas_batched_args>(q));
        auto f = [&](auto t) -> asio::awaitable<result<std::string>> {
          using T = decltype(t);
          BOOST_OUTCOME_CO_TRY(auto A, view<T>(q, 0));
          BOOST_OUTCOME_CO_TRY(auto B, view<T>(q, 1));
          BOOST_OUTCOME_CO_TRY(auto C, view<T>(q, 2));
          co_return empty(co_await actor.gemm_strided_batched(a.p, a.batch, A, B, C));
        };
        co_return co_await typed<float, double, half, bfloat16>(q, f);
      }
      case op::gemv: {
        BOOST_OUTCOME_CO_TRY(auto p, params<gemv_params>(q));
        auto f = [&](auto t) -> asio::awaitable<result<std::string>> {
          using T = decltype(t);
          BOOST_OUTCOME_CO_TRY(auto A, view<T>(q, 0));
          BOOST_OUTCOME_CO_TRY(auto x, view<T>(q, 1));
          BOOST_OUTCOME_CO_TRY(auto y, view<T>(q, 2));
          co_return empty(co_await actor.gemv(p, A, x, y));
        };
        co_return co_await typed<float, double>(q, f);
      }
      case op::axpy:
      case op::scal:
      case op::dot:
      case op::nrm2:
      case op::asum:
      case op::iamax: {
        BOOST_OUTCOME_CO_TRY(auto a, params<wire::level1_args>(q));
        const auto which = static_cast<op>(q.head.op);
        auto f = [&](auto t) -> asio::awaitable<result<std::string>> {
          using T = decltype(t);
          BOOST_OUTCOME_CO_TRY(auto x, view<T>(q, 0));
          switch (which) {
            case op::axpy: {
              BOOST_OUTCOME_CO_TRY(auto y, view<T>(q, 1));
              co_return empty(co_await actor.axpy(a.n, a.alpha, x, y, a.incx, a.incy));
            }
            case op::scal:
              co_return empty(co_await actor.scal(a.n, a.alpha, x, a.incx));
            case op::dot: {
              BOOST_OUTCOME_CO_TRY(auto y, view<T>(q, 1));
              co_return value(co_await actor.dot(a.n, x, y, a.incx, a.incy));
            }
            case op::nrm2:
              co_return value(co_await actor.nrm2(a.n, x, a.incx));
            case op::asum:
              co_return value(co_await actor.asum(a.n, x, a.incx));
            default:
              co_return value(co_await actor.iamax(a.n, x, a.incx));
          }
        };
        co_return co_await typed<float, double>(q, f);
      }
      default:
        co_return make_error(errc::not_supported, "worker: unknown blas operation");
    }
  }

  asio::awaitable<result<std::string>> run_fft(const wire::actor_request& q) {
    const auto& s = q.head.settings;
    BOOST_OUTCOME_CO_TRY(auto actor, twin(fft_, q.head.actor, [&] {
                           fft_options o;
                           if (s.has_streams) o.streams = static_cast<stream_policy>(s.streams);
                           o.plan_cache_size = s.cache;
                           o.max_lanes = s.max_lanes;
                           return fft_actor::create(dev_, o);
                         }));
    BOOST_OUTCOME_CO_TRY(auto shape, params<fft_shape>(q));
    using c32 = std::complex<float>;
    using c64 = std::complex<double>;
    switch (static_cast<wire::actor_op>(q.head.op)) {
      case wire::actor_op::c2c: {
        auto f = [&](auto t) -> asio::awaitable<result<std::string>> {
          using T = decltype(t);
          BOOST_OUTCOME_CO_TRY(auto in, view<T>(q, 0));
          BOOST_OUTCOME_CO_TRY(auto out, view<T>(q, 1));
          co_return empty(co_await actor.c2c(shape, in, out));
        };
        co_return co_await typed<c32, c64>(q, f);
      }
      case wire::actor_op::r2c: {
        auto f = [&](auto t) -> asio::awaitable<result<std::string>> {
          using T = decltype(t);
          using C = std::complex<T>;
          BOOST_OUTCOME_CO_TRY(auto in, view<T>(q, 0));
          BOOST_OUTCOME_CO_TRY(auto out, view<C>(q, 1));
          co_return empty(co_await actor.r2c(shape, in, out));
        };
        co_return co_await typed<float, double>(q, f);
      }
      case wire::actor_op::c2r: {
        auto f = [&](auto t) -> asio::awaitable<result<std::string>> {
          using C = decltype(t);
          using T = typename C::value_type;
          BOOST_OUTCOME_CO_TRY(auto in, view<C>(q, 0));
          BOOST_OUTCOME_CO_TRY(auto out, view<T>(q, 1));
          co_return empty(co_await actor.c2r(shape, in, out));
        };
        co_return co_await typed<c32, c64>(q, f);
      }
      default:
        co_return make_error(errc::not_supported, "worker: unknown fft operation");
    }
  }

  /// A cuDNN operation of one input x and one output y (views 0 and 1) of
  /// f32 or f16: `call(x, y)` is its awaitable.
  template <class Call>
  asio::awaitable<result<std::string>> unary(const wire::actor_request& q, Call call) {
    auto f = [&](auto t) -> asio::awaitable<result<std::string>> {
      using T = decltype(t);
      BOOST_OUTCOME_CO_TRY(auto x, view<T>(q, 0));
      BOOST_OUTCOME_CO_TRY(auto y, view<T>(q, 1));
      co_return empty(co_await call(x, y));
    };
    co_return co_await typed<float, half>(q, f);
  }

  asio::awaitable<result<std::string>> run_cudnn(const wire::actor_request& q) {
    const auto& s = q.head.settings;
    BOOST_OUTCOME_CO_TRY(auto actor, twin(cudnn_, q.head.actor, [&] {
                           cudnn_options o;
                           if (s.has_streams) o.streams = static_cast<stream_policy>(s.streams);
                           o.workspace_limit = s.limit;
                           o.algo_cache_size = s.cache;
                           o.convolution_api = static_cast<conv_api>(s.variant);
                           o.cuda_graphs = (s.flags & wire::cuda_graphs) != 0;
                           o.max_lanes = s.max_lanes;
                           return cudnn_actor::create(dev_, o);
                         }));
    using op = wire::actor_op;
    switch (static_cast<op>(q.head.op)) {
      case op::conv2d: {
        BOOST_OUTCOME_CO_TRY(auto a, params<wire::conv_args>(q));
        auto f = [&](auto t) -> asio::awaitable<result<std::string>> {
          using T = decltype(t);
          BOOST_OUTCOME_CO_TRY(auto x, view<T>(q, 0));
          BOOST_OUTCOME_CO_TRY(auto filter, view<T>(q, 1));
          BOOST_OUTCOME_CO_TRY(auto bias, view<T>(q, 2, true));
          BOOST_OUTCOME_CO_TRY(auto y, view<T>(q, 3));
          co_return empty(co_await actor.conv2d_forward(a.x, a.p, x, filter, bias, y));
        };
        co_return co_await typed<float, half>(q, f);
      }
      case op::activation: {
        BOOST_OUTCOME_CO_TRY(auto a, params<wire::activation_args>(q));
        co_return co_await unary(
            q, [&](auto x, auto y) { return actor.activation_forward(a.shape, a.p, x, y); });
      }
      case op::softmax: {
        BOOST_OUTCOME_CO_TRY(auto a, params<wire::softmax_args>(q));
        co_return co_await unary(
            q, [&](auto x, auto y) { return actor.softmax_forward(a.shape, a.algorithm, x, y); });
      }
      case op::pooling: {
        BOOST_OUTCOME_CO_TRY(auto a, params<wire::pooling_args>(q));
        co_return co_await unary(
            q, [&](auto x, auto y) { return actor.pooling_forward(a.x, a.p, x, y); });
      }
      case op::batchnorm: {
        BOOST_OUTCOME_CO_TRY(auto a, params<wire::batchnorm_args>(q));
        auto f = [&](auto t) -> asio::awaitable<result<std::string>> {
          using T = decltype(t);
          BOOST_OUTCOME_CO_TRY(auto x, view<T>(q, 0));
          BOOST_OUTCOME_CO_TRY(auto scale, view<float>(q, 1));
          BOOST_OUTCOME_CO_TRY(auto bias, view<float>(q, 2));
          BOOST_OUTCOME_CO_TRY(auto mean, view<float>(q, 3));
          BOOST_OUTCOME_CO_TRY(auto var, view<float>(q, 4));
          BOOST_OUTCOME_CO_TRY(auto y, view<T>(q, 5));
          co_return empty(
              co_await actor.batchnorm_inference(a.shape, a.epsilon, x, scale, bias, mean, var, y));
        };
        co_return co_await typed<float, half>(q, f);
      }
      default:
        co_return make_error(errc::not_supported, "worker: unknown cudnn operation");
    }
  }

  /// The rng twin of the request, with the seed and offset the service set
  /// last applied when the request brings a newer epoch.
  result<rng_actor> rng_for(const wire::actor_request& q) {
    const auto& s = q.head.settings;
    std::lock_guard lk(mu_);
    auto it = rng_.find(q.head.actor);
    if (it == rng_.end()) {
      rng_options o;
      o.kind = static_cast<rng_kind>(s.variant);
      if (s.flags & wire::has_seed) o.seed = s.limit;
      o.offset = s.offset;
      o.dimensions = s.dimensions;
      if (s.has_streams) o.streams = static_cast<stream_policy>(s.streams);
      o.max_lanes = s.max_lanes;
      BOOST_OUTCOME_TRY(auto made, rng_actor::create(dev_, o));
      it = rng_.emplace(q.head.actor, rng_twin{std::move(made), s.epoch}).first;
    } else if (s.epoch > it->second.epoch) {
      if (s.flags & wire::has_seed) {
        BOOST_OUTCOME_TRY(it->second.actor.set_seed(s.limit));
      }
      BOOST_OUTCOME_TRY(it->second.actor.set_offset(s.offset));
      it->second.epoch = s.epoch;
    }
    return it->second.actor;
  }

  asio::awaitable<result<std::string>> run_rng(const wire::actor_request& q) {
    BOOST_OUTCOME_CO_TRY(auto actor, rng_for(q));
    BOOST_OUTCOME_CO_TRY(auto a, params<wire::rng_args>(q));
    using op = wire::actor_op;
    switch (static_cast<op>(q.head.op)) {
      case op::uniform:
      case op::normal:
      case op::log_normal: {
        const auto which = static_cast<op>(q.head.op);
        auto f = [&](auto t) -> asio::awaitable<result<std::string>> {
          using T = decltype(t);
          BOOST_OUTCOME_CO_TRY(auto out, view<T>(q, 0));
          if (which == op::uniform) co_return empty(co_await actor.uniform(out));
          if (which == op::normal)
            co_return empty(co_await actor.normal(out, static_cast<T>(a.a), static_cast<T>(a.b)));
          co_return empty(co_await actor.log_normal(out, static_cast<T>(a.a), static_cast<T>(a.b)));
        };
        co_return co_await typed<float, double>(q, f);
      }
      case op::poisson: {
        BOOST_OUTCOME_CO_TRY(auto out, view<std::uint32_t>(q, 0));
        co_return empty(co_await actor.poisson(out, a.a));
      }
      case op::raw: {
        auto f = [&](auto t) -> asio::awaitable<result<std::string>> {
          using T = decltype(t);
          BOOST_OUTCOME_CO_TRY(auto out, view<T>(q, 0));
          co_return empty(co_await actor.raw(out));
        };
        co_return co_await typed<std::uint32_t, std::uint64_t>(q, f);
      }
      default:
        co_return make_error(errc::not_supported, "worker: unknown rng operation");
    }
  }

  struct rng_twin {
    rng_actor actor;
    std::uint32_t epoch = 0;
  };

  device dev_;
  lookup_fn lookup_;
  std::mutex mu_;
  std::unordered_map<std::uint64_t, blas_actor> blas_;    // guarded by mu_
  std::unordered_map<std::uint64_t, fft_actor> fft_;      // guarded by mu_
  std::unordered_map<std::uint64_t, cudnn_actor> cudnn_;  // guarded by mu_
  std::unordered_map<std::uint64_t, rng_twin> rng_;       // guarded by mu_
};

}  // namespace atomr::cuda::detail::worker_side
