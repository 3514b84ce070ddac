// worker_supervisor where Boost.Process v2 does not compile (meson.build):
// the isolated device mode then reports that it was not built.
#include <atomr/cuda/detail/worker_supervisor.hpp>

namespace atomr::cuda::detail {

namespace {
gpu_error not_built() {
  return make_error(errc::not_supported,
                    "the isolated device mode was not built (Boost.Process v2 did not compile)");
}
}  // namespace

struct worker_supervisor::impl {};

result<std::shared_ptr<worker_supervisor>> worker_supervisor::start(asio::any_io_executor,
                                                                    worker_options, observer) {
  return not_built();
}
worker_supervisor::~worker_supervisor() = default;
void worker_supervisor::stop() {}
void worker_supervisor::inject_fault(std::uint16_t) {}
void worker_supervisor::arena_checksum(std::uint64_t, std::uint64_t,
                                       std::function<void(result<std::uint64_t>)> done) {
  done(not_built());
}
worker_arena worker_supervisor::arena() const {
  return {};
}
worker_statistics worker_supervisor::statistics() const {
  return {};
}
std::string worker_supervisor::stderr_tail() const {
  return {};
}
void worker_supervisor::call(std::uint16_t, std::string, std::chrono::steady_clock::time_point,
                             std::uint64_t, reply_fn done) {
  done(not_built());
}
bool worker_supervisor::notify_worker(std::uint16_t, std::uint16_t, std::string) {
  return false;
}
result<std::string> find_worker_executable() {
  return not_built();
}

}  // namespace atomr::cuda::detail
