#include <atomr/cuda/fft_actor.hpp>

#include "device_impl.hpp"
#include "remote.hpp"

#include <atomr/cuda/detail/remote_ops.hpp>
#include <atomr/cuda/run_kernel.hpp>

#include <cufft.h>

#if !defined(ATOMR_CUDA_HAS_CUBLAS) || ATOMR_CUDA_HAS_CUBLAS
#define ATOMR_FFT_USE_CUBLAS 1
#include <cublas_v2.h>
#else
#define ATOMR_FFT_USE_CUBLAS 0
#endif

#include <limits>
#include <mutex>
#include <string>
#include <tuple>

namespace atomr::cuda {

std::string_view to_string(fft_direction d) noexcept {
  switch (d) {
    case fft_direction::forward:
      return "forward";
    case fft_direction::inverse:
      return "inverse";
  }
  return "unknown";
}

namespace detail {

std::string_view to_string(fft_type t) noexcept {
  switch (t) {
    case fft_type::c2c:
      return "C2C";
    case fft_type::z2z:
      return "Z2Z";
    case fft_type::r2c:
      return "R2C";
    case fft_type::d2z:
      return "D2Z";
    case fft_type::c2r:
      return "C2R";
    case fft_type::z2d:
      return "Z2D";
  }
  return "unknown";
}

fft_plan_key make_plan_key(const fft_shape& s, fft_type t) noexcept {
  fft_plan_key k;
  k.rank = s.rank;
  for (int i = 0; i < 3; ++i) k.dims[i] = i < s.rank ? s.dims[i] : 1;
  k.batch = s.batch;
  k.type = t;
  return k;
}

namespace {
bool mul_fits(long long a, long long b, long long& out) noexcept {
  return !__builtin_mul_overflow(a, b, &out);
}
}  // namespace

result<fft_layout> check_fft_shape(std::string_view op, const fft_shape& s, fft_kind kind) {
  if (s.rank < 1 || s.rank > 3)
    return bad_argument(op, "shape.rank", "(" + std::to_string(s.rank) + ") is not 1, 2 or 3");
  long long n = 1;
  for (int i = 0; i < s.rank; ++i) {
    const std::string arg = "shape.dims[" + std::to_string(i) + "]";
    if (s.dims[i] <= 0)
      return bad_argument(op, arg, "(" + std::to_string(s.dims[i]) + ") is not > 0");
    if (!mul_fits(n, s.dims[i], n))
      return bad_argument(op, arg, "makes the transform size overflow a long long");
  }
  if (s.batch <= 0)
    return bad_argument(op, "shape.batch", "(" + std::to_string(s.batch) + ") is not > 0");
  if (s.direction != fft_direction::forward && s.direction != fft_direction::inverse)
    return bad_argument(
        op, "shape.direction",
        "(" + std::to_string(static_cast<int>(s.direction)) + ") is neither forward nor inverse");
  if (kind == fft_kind::r2c && s.direction != fft_direction::forward)
    return bad_argument(op, "shape.direction", "must be forward for a real-to-complex transform");
  if (kind == fft_kind::c2r && s.direction != fft_direction::inverse)
    return bad_argument(op, "shape.direction", "must be inverse for a complex-to-real transform");

  long long full = 0;
  if (!mul_fits(n, s.batch, full))
    return bad_argument(op, "shape.batch", "makes the element count overflow a long long");
  // The complex side of a real transform: the last dimension halved.
  const long long last = s.dims[s.rank - 1];
  const long long half = (n / last) * (last / 2 + 1);  // <= n for every last >= 1
  long long half_full = 0;
  if (!mul_fits(half, s.batch, half_full))
    return bad_argument(op, "shape.batch", "makes the element count overflow a long long");
  fft_layout lay;
  lay.points = n;
  switch (kind) {
    case fft_kind::c2c:
      lay.in_elems = lay.out_elems = full;
      break;
    case fft_kind::r2c:
      lay.in_elems = full;
      lay.out_elems = half_full;
      break;
    case fft_kind::c2r:
      lay.in_elems = half_full;
      lay.out_elems = full;
      break;
  }
  return lay;
}

result<void> check_fft_size(std::string_view op, std::string_view arg, std::size_t have,
                            long long need) {
  if (need >= 0 && static_cast<unsigned long long>(need) == have) return outcome::success();
  return bad_argument(
      op, arg,
      "has " + std::to_string(have) + " elements, the shape needs exactly " + std::to_string(need));
}

result<void> check_no_overlap(std::string_view op, bool same_allocation, std::size_t a,
                              std::size_t a_bytes, std::size_t b, std::size_t b_bytes) {
  if (!same_allocation || a_bytes == 0 || b_bytes == 0) return outcome::success();
  if (a + a_bytes <= b || b + b_bytes <= a) return outcome::success();
  return bad_argument(op, "output",
                      "overlaps input (transforms are out of place; use separate buffers)");
}

result<void> check_fft_options(const fft_options& o) {
  if (o.plan_cache_size == 0) return bad_argument("fft_actor::create", "plan_cache_size", "is 0");
  return check_max_lanes("fft_actor::create", o.max_lanes);
}

/// One cuFFT plan and the workspace it owns. Destroyed when the cache and
/// every in-flight exec (through its keep-alive) have dropped it.
struct fft_plan {
  fft_plan(const fft_plan&) = delete;
  fft_plan& operator=(const fft_plan&) = delete;
  explicit fft_plan(device d) : dev(std::move(d)) {}
  ~fft_plan() {
    // Nothing is handed back to a dead context; teardown errors are ignored.
    if (created && dev.health() != health_state::poisoned) cufftDestroy(handle);
  }

  device dev;
  cufftHandle handle = 0;
  bool created = false;
  gpu_ref<std::uint8_t> workspace;  // empty when cuFFT needs none
};

/// One lane of an fft_actor (docs/design.md, "One actor, several lanes"):
/// a stream, the plans made on it (each bound to the stream by
/// cufftSetStream, with its workspace allocated on it) and, once a
/// normalised transform ran on it, a cuBLAS handle bound to the same stream.
/// A plan is used by one lane only: two lanes running one plan at the same
/// time would share its workspace.
struct fft_lane : lane_base {
  fft_lane(device d, stream s, std::size_t cache_size)
      : lane_base(std::move(s)), dev(std::move(d)), plans(cache_size) {}
  fft_lane(const fft_lane&) = delete;
  fft_lane& operator=(const fft_lane&) = delete;
  ~fft_lane() {
    // Plans live on in the keep-alives of their execs; the state, and so
    // this lane, outlives every operation.
    plans.clear();
#if ATOMR_FFT_USE_CUBLAS
    if (blas && dev.health() != health_state::poisoned) cublasDestroy(blas);
#endif
  }

  device dev;
  lru<fft_plan_key, std::shared_ptr<fft_plan>> plans;  // guarded by mu
#if ATOMR_FFT_USE_CUBLAS
  cublasHandle_t blas = nullptr;  // created on the first normalised transform; guarded likewise
#endif

  /// The cached plan for `key`, or a new one (with its workspace). Called
  /// with mu held and the device current.
  result<std::shared_ptr<fft_plan>> plan_for(const fft_plan_key& key);
};

struct fft_state {
  fft_state(device d, completion c, std::size_t cache_size, lane_policy lp)
      : dev(std::move(d)),
        how(c),
        plan_cache_size(cache_size),
        lane_streams(lp.streams),
        lanes(lp.max_lanes) {}
  fft_state(const fft_state&) = delete;
  fft_state& operator=(const fft_state&) = delete;

  device dev;
  const completion how;
  const std::size_t plan_cache_size;  ///< per lane
  const stream_policy lane_streams;
  lane_set<fft_lane> lanes;

  /// Isolated devices: the actor's id in the worker (whose twin is made with
  /// `remote` at its first request; docs/design.md, "Isolated device"), and
  /// what get_stream() answers (there are no lanes here). 0 in process.
  std::uint64_t remote_id = 0;
  wire::actor_settings remote;
  stream remote_stream;
  ~fft_state() {
    if (remote_id && dev.impl()->remote)
      dev.impl()->remote->release(wire::release_kind::actor, remote_id);
  }

  /// A new lane: only its stream (plans are made on first use).
  result<std::unique_ptr<fft_lane>> make_lane() {
    BOOST_OUTCOME_TRY(auto s, dev.acquire_stream(lane_streams, "cufft"));
    return std::make_unique<fft_lane>(dev, std::move(s), plan_cache_size);
  }
  /// The lane for the next operation (lane_set::pick).
  /// The lane for an operation writing the buffer `key` (docs/design.md,
  /// "One actor, several lanes"); null: the calling thread's lane.
  fft_lane& lane(const void* key = nullptr) {
    return lanes.pick([this](std::size_t) { return make_lane(); }, key);
  }
};

namespace {
cufftType native_type(fft_type t) noexcept {
  switch (t) {
    case fft_type::c2c:
      return CUFFT_C2C;
    case fft_type::z2z:
      return CUFFT_Z2Z;
    case fft_type::r2c:
      return CUFFT_R2C;
    case fft_type::d2z:
      return CUFFT_D2Z;
    case fft_type::c2r:
      return CUFFT_C2R;
    case fft_type::z2d:
      return CUFFT_Z2D;
  }
  return CUFFT_C2C;
}

result<void> cufft_ok(cufftResult st, std::string_view call) {
  if (st == CUFFT_SUCCESS) return outcome::success();
  return classify(st, call);
}
}  // namespace

result<std::shared_ptr<fft_plan>> fft_lane::plan_for(const fft_plan_key& key) {
  if (auto* p = plans.find(key)) return *p;
  auto plan = std::make_shared<fft_plan>(dev);
  BOOST_OUTCOME_TRY(cufft_ok(cufftCreate(&plan->handle), "cufftCreate"));
  plan->created = true;
  // The workspace comes from the device pool, so that its exhaustion is an
  // out_of_memory like any other allocation and the memory is reused.
  BOOST_OUTCOME_TRY(cufft_ok(cufftSetAutoAllocation(plan->handle, 0), "cufftSetAutoAllocation"));
  long long n[3] = {key.dims[0], key.dims[1], key.dims[2]};
  std::size_t work = 0;
  // The 32-bit planner whenever the whole batch is indexable with int: the
  // plan cufftPlan1d/cufftPlanMany users get and compare against. (Tried
  // against the 2^26-point C2C gap to cufftPlan1d; it was not the cause:
  // docs/history/performance.md.)
  long long total = key.batch;
  for (int d = 0; d < key.rank; ++d) total *= n[d];
  if (total <= std::numeric_limits<int>::max()) {
    int ni[3] = {static_cast<int>(n[0]), static_cast<int>(n[1]), static_cast<int>(n[2])};
    BOOST_OUTCOME_TRY(
        cufft_ok(cufftMakePlanMany(plan->handle, key.rank, ni, nullptr, 1, 0, nullptr, 1, 0,
                                   native_type(key.type), static_cast<int>(key.batch), &work),
                 "cufftMakePlanMany"));
  } else {
    BOOST_OUTCOME_TRY(
        cufft_ok(cufftMakePlanMany64(plan->handle, key.rank, n, nullptr, 1, 0, nullptr, 1, 0,
                                     native_type(key.type), key.batch, &work),
                 "cufftMakePlanMany64"));
  }
  BOOST_OUTCOME_TRY(cufft_ok(cufftSetStream(plan->handle, strm.native_handle()), "cufftSetStream"));
  if (work > 0) {
    BOOST_OUTCOME_TRY(plan->workspace, dev.allocate<std::uint8_t>(work, strm));
    BOOST_OUTCOME_TRY(std::uint8_t * w, plan->workspace.unsafe_data());
    BOOST_OUTCOME_TRY(cufft_ok(cufftSetWorkArea(plan->handle, w), "cufftSetWorkArea"));
  }
  return plans.insert(key, std::move(plan));
}

namespace {

template <class In, class Out>
struct fft_traits;
template <>
struct fft_traits<std::complex<float>, std::complex<float>> {
  static constexpr fft_kind kind = fft_kind::c2c;
  static constexpr fft_type type = fft_type::c2c;
  static constexpr std::string_view op = "fft_actor::c2c";
  static constexpr std::string_view call = "cufftExecC2C";
  static cufftResult exec(cufftHandle h, std::complex<float>* i, std::complex<float>* o, int dir) {
    return cufftExecC2C(h, reinterpret_cast<cufftComplex*>(i), reinterpret_cast<cufftComplex*>(o),
                        dir);
  }
};
template <>
struct fft_traits<std::complex<double>, std::complex<double>> {
  static constexpr fft_kind kind = fft_kind::c2c;
  static constexpr fft_type type = fft_type::z2z;
  static constexpr std::string_view op = "fft_actor::c2c";
  static constexpr std::string_view call = "cufftExecZ2Z";
  static cufftResult exec(cufftHandle h, std::complex<double>* i, std::complex<double>* o,
                          int dir) {
    return cufftExecZ2Z(h, reinterpret_cast<cufftDoubleComplex*>(i),
                        reinterpret_cast<cufftDoubleComplex*>(o), dir);
  }
};
template <>
struct fft_traits<float, std::complex<float>> {
  static constexpr fft_kind kind = fft_kind::r2c;
  static constexpr fft_type type = fft_type::r2c;
  static constexpr std::string_view op = "fft_actor::r2c";
  static constexpr std::string_view call = "cufftExecR2C";
  static cufftResult exec(cufftHandle h, float* i, std::complex<float>* o, int) {
    return cufftExecR2C(h, i, reinterpret_cast<cufftComplex*>(o));
  }
};
template <>
struct fft_traits<double, std::complex<double>> {
  static constexpr fft_kind kind = fft_kind::r2c;
  static constexpr fft_type type = fft_type::d2z;
  static constexpr std::string_view op = "fft_actor::r2c";
  static constexpr std::string_view call = "cufftExecD2Z";
  static cufftResult exec(cufftHandle h, double* i, std::complex<double>* o, int) {
    return cufftExecD2Z(h, i, reinterpret_cast<cufftDoubleComplex*>(o));
  }
};
template <>
struct fft_traits<std::complex<float>, float> {
  static constexpr fft_kind kind = fft_kind::c2r;
  static constexpr fft_type type = fft_type::c2r;
  static constexpr std::string_view op = "fft_actor::c2r";
  static constexpr std::string_view call = "cufftExecC2R";
  static cufftResult exec(cufftHandle h, std::complex<float>* i, float* o, int) {
    return cufftExecC2R(h, reinterpret_cast<cufftComplex*>(i), o);
  }
};
template <>
struct fft_traits<std::complex<double>, double> {
  static constexpr fft_kind kind = fft_kind::c2r;
  static constexpr fft_type type = fft_type::z2d;
  static constexpr std::string_view op = "fft_actor::c2r";
  static constexpr std::string_view call = "cufftExecZ2D";
  static cufftResult exec(cufftHandle h, std::complex<double>* i, double* o, int) {
    return cufftExecZ2D(h, reinterpret_cast<cufftDoubleComplex*>(i), o);
  }
};

#if ATOMR_FFT_USE_CUBLAS
result<void> cublas_ok(cublasStatus_t st, std::string_view call) {
  if (st == CUBLAS_STATUS_SUCCESS) return outcome::success();
  return classify(st, call);
}

result<void> scale(cublasHandle_t h, float* x, long long n, double a) {
  const float f = static_cast<float>(a);
  return cublas_ok(cublasSscal_64(h, n, &f, x, 1), "cublasSscal_64");
}
result<void> scale(cublasHandle_t h, double* x, long long n, double a) {
  return cublas_ok(cublasDscal_64(h, n, &a, x, 1), "cublasDscal_64");
}
result<void> scale(cublasHandle_t h, std::complex<float>* x, long long n, double a) {
  const float f = static_cast<float>(a);
  return cublas_ok(cublasCsscal_64(h, n, &f, reinterpret_cast<cuComplex*>(x), 1),
                   "cublasCsscal_64");
}
result<void> scale(cublasHandle_t h, std::complex<double>* x, long long n, double a) {
  return cublas_ok(cublasZdscal_64(h, n, &a, reinterpret_cast<cuDoubleComplex*>(x), 1),
                   "cublasZdscal_64");
}
#endif

/// Inside a recording (graph.hpp, launch::recording()): points a plan, and
/// the lane's normalising cuBLAS handle once asked to, at the recording's
/// stream, and back at the lane's when destroyed (before the lane's lock is
/// released), so that the transform is captured and nothing else is.
class recording_bind {
public:
  recording_bind(fft_lane& lane, fft_plan& plan, launch& l) : lane_(lane), plan_(plan) {
    if (lane.stuck) {
      status_ = stuck_lane_error();
      return;
    }
    if (!l.recording()) return;
    status_ = cufft_ok(cufftSetStream(plan.handle, l.native_stream()), "cufftSetStream");
    plan_bound_ = status_.has_value();
  }
  recording_bind(const recording_bind&) = delete;
  recording_bind& operator=(const recording_bind&) = delete;
  ~recording_bind() {
    if (plan_bound_ && cufftSetStream(plan_.handle, lane_.strm.native_handle()) != CUFFT_SUCCESS)
      lane_.stuck = true;
#if ATOMR_FFT_USE_CUBLAS
    // cublasSetStream also gives the handle back cuBLAS's default workspace.
    if (blas_bound_ &&
        cublasSetStream(lane_.blas, lane_.strm.native_handle()) != CUBLAS_STATUS_SUCCESS)
      lane_.stuck = true;
#endif
  }
  const result<void>& status() const noexcept {
    return status_;
  }
#if ATOMR_FFT_USE_CUBLAS
  /// The normalising cuBLAS handle on the recording's stream, with a
  /// workspace of the recording's (cuBLAS's default one would put an
  /// allocation into the graph).
  result<void> bind_blas(launch& l) {
    if (!l.recording() || blas_bound_) return outcome::success();
    constexpr std::size_t bytes = std::size_t{4} << 20;
    BOOST_OUTCOME_TRY(void* ws, l.recording_workspace(bytes));
    BOOST_OUTCOME_TRY(cublas_ok(cublasSetStream(lane_.blas, l.native_stream()), "cublasSetStream"));
    blas_bound_ = true;
    return cublas_ok(cublasSetWorkspace(lane_.blas, ws, bytes), "cublasSetWorkspace");
  }
#endif

private:
  fft_lane& lane_;
  fft_plan& plan_;
  result<void> status_ = outcome::success();
  bool plan_bound_ = false;
  bool blas_bound_ = false;
};

/// The one coroutine behind every operation: takes the state and every
/// argument by value, so it does not depend on the handle it was called on.
template <element In, element Out>
asio::awaitable<result<gpu_ref<Out>>> execute(std::shared_ptr<fft_state> st, fft_shape shape,
                                              gpu_ref<In> in, gpu_ref<Out> out) {
  using tr = fft_traits<In, Out>;
  BOOST_OUTCOME_CO_TRY(st->dev.status());
  BOOST_OUTCOME_CO_TRY(auto lay, check_fft_call(tr::op, shape, tr::kind, in, out, st->dev));
#if !ATOMR_FFT_USE_CUBLAS
  if (shape.normalize)
    co_return make_error(errc::not_supported, std::string(tr::op) +
                                                  ": shape.normalize needs cuBLAS, which this "
                                                  "build does not link");
#endif
  if (st->remote_id) {
    constexpr auto op = tr::kind == fft_kind::c2c   ? wire::actor_op::c2c
                        : tr::kind == fft_kind::r2c ? wire::actor_op::r2c
                                                    : wire::actor_op::c2r;
    auto r = co_await remote_actor_call(
        *st->dev.impl(),
        actor_head_of(st->remote_id, wire::actor_kind::fft, op, dtype_of<In>, st->remote), shape,
        st->how, in, out);
    if (!r) co_return r.error();
    co_return out;
  }
  const auto key = make_plan_key(shape, tr::type);
  const int dir = shape.direction == fft_direction::forward ? CUFFT_FORWARD : CUFFT_INVERSE;
  using keep_t = std::tuple<gpu_ref<In>, std::shared_ptr<fft_plan>, std::shared_ptr<fft_state>>;
  fft_lane* lane = &st->lane(out.state().get());
  co_return co_await run_kernel(
      "cufft", lane->strm, st->how, out,
      [st, lane, shape, lay, key, dir, in, out](launch& l) -> result<keep_t> {
        In* pin = nullptr;
        if constexpr (tr::kind == fft_kind::c2r) {
          // cuFFT's C2R uses its input as scratch: order it as a write.
          BOOST_OUTCOME_TRY(pin, l.write(in));
        } else {
          // cuFFT does not write the input of C2C/R2C out of place; its API is not const.
          BOOST_OUTCOME_TRY(const In* p, l.read(in));
          pin = const_cast<In*>(p);
        }
        BOOST_OUTCOME_TRY(Out * pout, l.write(out));
        std::lock_guard lk(lane->mu);
        BOOST_OUTCOME_TRY(auto plan, lane->plan_for(key));
        recording_bind bound(*lane, *plan, l);
        BOOST_OUTCOME_TRY(bound.status());
        // Ordered as a write so that the pool frees the workspace only after
        // the last exec that used it; same stream, so no wait is added.
        if (!plan->workspace.empty()) {
          BOOST_OUTCOME_TRY(l.write(plan->workspace));
        }
        BOOST_OUTCOME_TRY(cufft_ok(tr::exec(plan->handle, pin, pout, dir), tr::call));
#if ATOMR_FFT_USE_CUBLAS
        if (shape.normalize) {
          if (!lane->blas) {
            cublasHandle_t h = nullptr;
            BOOST_OUTCOME_TRY(cublas_ok(cublasCreate(&h), "cublasCreate"));
            if (auto ok =
                    cublas_ok(cublasSetStream(h, lane->strm.native_handle()), "cublasSetStream");
                !ok) {
              cublasDestroy(h);
              return ok.error();
            }
            lane->blas = h;
          }
          BOOST_OUTCOME_TRY(bound.bind_blas(l));
          BOOST_OUTCOME_TRY(
              scale(lane->blas, pout, lay.out_elems, 1.0 / static_cast<double>(lay.points)));
        }
#endif
        return keep_t{in, std::move(plan), st};
      });
}

}  // namespace
}  // namespace detail

result<fft_actor> fft_actor::create(device dev, fft_options options) {
  BOOST_OUTCOME_TRY(detail::check_fft_options(options));
  BOOST_OUTCOME_TRY(dev.status());
  if (!dev.options().libraries.cufft)
    return make_error(errc::not_supported,
                      "fft_actor::create: cuFFT is disabled in this device's library_set");
  const completion how = options.how.value_or(dev.options().default_completion);
  const auto lanes = detail::resolve_lanes(options.streams, options.max_lanes, dev.options());
  auto st = std::make_shared<detail::fft_state>(dev, how, options.plan_cache_size, lanes);
  if (dev.isolated()) {
    // No lane here: the worker makes the actor's twin at its first request.
    st->remote_id = dev.impl()->remote->next_id();
    st->remote_stream = dev.main_stream();
    st->remote = detail::lane_settings(options.streams, options.max_lanes);
    st->remote.cache = options.plan_cache_size;
    return fft_actor(std::move(st));
  }
  auto first = st->make_lane();
  if (!first) return dev.impl()->blame_fault(first.error());
  st->lanes.install_first(std::move(first).value());
  return fft_actor(std::move(st));
}

asio::awaitable<result<gpu_ref<fft_actor::c32>>> fft_actor::c2c(fft_shape shape, gpu_ref<c32> in,
                                                                gpu_ref<c32> out) const {
  return detail::execute<c32, c32>(st_, shape, std::move(in), std::move(out));
}
asio::awaitable<result<gpu_ref<fft_actor::c64>>> fft_actor::c2c(fft_shape shape, gpu_ref<c64> in,
                                                                gpu_ref<c64> out) const {
  return detail::execute<c64, c64>(st_, shape, std::move(in), std::move(out));
}
asio::awaitable<result<gpu_ref<fft_actor::c32>>> fft_actor::r2c(fft_shape shape, gpu_ref<float> in,
                                                                gpu_ref<c32> out) const {
  return detail::execute<float, c32>(st_, shape, std::move(in), std::move(out));
}
asio::awaitable<result<gpu_ref<fft_actor::c64>>> fft_actor::r2c(fft_shape shape, gpu_ref<double> in,
                                                                gpu_ref<c64> out) const {
  return detail::execute<double, c64>(st_, shape, std::move(in), std::move(out));
}
asio::awaitable<result<gpu_ref<float>>> fft_actor::c2r(fft_shape shape, gpu_ref<c32> in,
                                                       gpu_ref<float> out) const {
  return detail::execute<c32, float>(st_, shape, std::move(in), std::move(out));
}
asio::awaitable<result<gpu_ref<double>>> fft_actor::c2r(fft_shape shape, gpu_ref<c64> in,
                                                        gpu_ref<double> out) const {
  return detail::execute<c64, double>(st_, shape, std::move(in), std::move(out));
}

fft_statistics fft_actor::statistics() const {
  fft_statistics s;
  st_->lanes.for_each_locked([&](const detail::fft_lane& l) {
    s.plan_hits += l.plans.hits();
    s.plan_misses += l.plans.misses();
    s.plan_evictions += l.plans.evictions();
    s.plans_cached += l.plans.size();
    ++s.lanes;
  });
  s.plan_cache_size = st_->plan_cache_size;
  return s;
}

void fft_actor::clear_plans() const {
  st_->lanes.for_each_locked([](detail::fft_lane& l) { l.plans.clear(); });
}

const device& fft_actor::get_device() const noexcept {
  return st_->dev;
}
const stream& fft_actor::get_stream() const noexcept {
  if (st_->remote_id) return st_->remote_stream;
  return st_->lanes.first().strm;
}

}  // namespace atomr::cuda
