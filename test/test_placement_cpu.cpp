// Placement over several devices (issue 22) without a GPU: the policies'
// choices, the set's argument checks, and what a set of unavailable devices
// answers. The choices are pure functions of the loads, so every case of
// both policies is checked here; the GPU suite checks them on real devices.
#include "io_fixture.hpp"

#include <atomr/cuda.hpp>
#include <atomr/cuda/placement.hpp>

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace atomr::cuda;
using namespace atomr::cuda::test;

TEST_CASE("placement: round robin takes the accepting devices in turn, from the cursor") {
  std::vector<device_load> l(4);
  for (auto& x : l) x.accepting = true;
  l[1].accepting = false;
  const auto pick = [&](std::size_t c) {
    return detail::choose_device(placement_policy::round_robin, l, c);
  };
  CHECK(pick(0) == std::optional<std::size_t>(0));
  CHECK(pick(1) == std::optional<std::size_t>(2));  // 1 skipped
  CHECK(pick(3) == std::optional<std::size_t>(3));
  CHECK(pick(4 % 4) == std::optional<std::size_t>(0));  // wraps
  std::vector<int> seen(4, 0);
  for (std::size_t c = 0; c < 400; ++c) ++seen[*pick(c % 4)];
  CHECK(seen[0] == 100);
  CHECK(seen[1] == 0);
  CHECK(seen[2] == 200);  // device 1's turns go to device 2
  CHECK(seen[3] == 100);
  for (auto& x : l) x.accepting = false;
  CHECK_FALSE(pick(0).has_value());
  CHECK_FALSE(detail::choose_device(placement_policy::round_robin, {}, 0).has_value());
}

TEST_CASE(
    "placement: least loaded takes the fewest in flight, then the most free memory, then "
    "the lowest index; never a device that does not accept work") {
  std::vector<device_load> l = {{true, 5, 100}, {true, 2, 10}, {false, 0, 1000}, {true, 2, 50}};
  const auto pick = [&] { return detail::choose_device(placement_policy::least_loaded, l, 0); };
  CHECK(pick() == std::optional<std::size_t>(3));  // 2 in flight, more memory than 1
  l[3].free_bytes = 10;
  CHECK(pick() == std::optional<std::size_t>(1));  // a tie: the lower index
  l[0].in_flight = 0;
  CHECK(pick() == std::optional<std::size_t>(0));
  l[0].accepting = l[1].accepting = l[3].accepting = false;
  CHECK_FALSE(pick().has_value());
}

TEST_CASE_FIXTURE(io_fixture,
                  "device_set: arguments are checked; a set whose devices are all "
                  "unavailable says so for each") {
  device_set_options o;
  o.ordinals = {0, 0};
  auto twice = device_set::open(ioc.get_executor(), o);
  REQUIRE_FALSE(twice);
  CHECK(twice.error().code() == errc::invalid_argument);
  CHECK(twice.error().message().find("listed twice") != std::string::npos);
  o.ordinals = {-1};
  auto negative = device_set::open(ioc.get_executor(), o);
  REQUIRE_FALSE(negative);
  CHECK(negative.error().code() == errc::invalid_argument);
  device_set_options iso;
  iso.device.isolation.enabled = true;
  auto unlisted = device_set::open(ioc.get_executor(), iso);
  REQUIRE_FALSE(unlisted);
  CHECK(unlisted.error().code() == errc::invalid_argument);
  CHECK(unlisted.error().message().find("lists its ordinals") != std::string::npos);

  auto empty = device_set{}.pick();
  REQUIRE_FALSE(empty);
  CHECK(empty.error().code() == errc::invalid_argument);

  // Ordinal 1000 exists on no machine; ordinal 0 only where there is a GPU.
  o.ordinals = {1000, 0};
  o.policy = placement_policy::least_loaded;
  auto set = device_set::open(ioc.get_executor(), o);
  REQUIRE(set);
  CHECK(set.value().size() == 2);
  CHECK(set.value()[0].ordinal() == 1000);
  CHECK(set.value()[0].health() == health_state::unavailable);
  CHECK_FALSE(set.value()[2]);
  auto by = set.value().by_ordinal(0);
  REQUIRE(by);
  CHECK(by.value().ordinal() == 0);
  auto none = set.value().by_ordinal(7);
  REQUIRE_FALSE(none);
  CHECK(none.error().code() == errc::invalid_argument);
  CHECK_FALSE(set.value().peer(0, 1));
  CHECK_FALSE(set.value().peer(1, 1));
  auto p = set.value().pick();
  placed_actors<blas_actor, blas_options> blas(set.value(), {});
  auto actor = blas.pick();
  if (set.value()[1].accepting()) {  // a GPU: every pick goes to ordinal 0
    REQUIRE(p);
    CHECK(p.value().ordinal() == 0);
    REQUIRE(actor);
    CHECK(actor.value().get_device().ordinal() == 0);
  } else {
    REQUIRE_FALSE(p);
    CHECK(p.error().code() == errc::device_unavailable);
    CHECK(p.error().message().find("ordinal 1000") != std::string::npos);
    CHECK(p.error().message().find("ordinal 0") != std::string::npos);
    REQUIRE_FALSE(actor);
    CHECK(actor.error().code() == errc::device_unavailable);
  }
  const auto loads = set.value().loads();
  REQUIRE(loads.size() == 2);
  CHECK_FALSE(loads[0].accepting);
}

#if ATOMR_CUDA_HAS_NCCL
namespace {
/// A call of `kind` whose buffers have these element counts (no memory
/// behind them: check_collective looks only at counts and identities).
collective_call shaped(collective_kind kind, std::vector<std::size_t> send,
                       std::vector<std::size_t> recv, dtype t = dtype::f32,
                       reduce_op op = reduce_op::sum, int root = 0, int peer = 0) {
  collective_call c;
  c.kind = kind;
  c.type = t;
  c.op = op;
  c.root = root;
  c.peer = peer;
  for (auto n : send) c.send.push_back({nullptr, 0, n});
  for (auto n : recv) c.recv.push_back({nullptr, 0, n});
  return c;
}
errc check(const collective_call& c, std::size_t ranks) {
  auto r = detail::check_collective(c, ranks);
  if (r) return errc::ok;
  MESSAGE(r.error().message());
  return r.error().code();
}
}  // namespace

TEST_CASE("collectives: the shape checks of every kind, before any NCCL call") {
  using k = collective_kind;
  // all_reduce: one size everywhere, one buffer per rank.
  CHECK(check(shaped(k::all_reduce, {8, 8}, {8, 8}), 2) == errc::ok);
  CHECK(check(shaped(k::all_reduce, {8, 8}, {8, 4}), 2) == errc::invalid_argument);
  CHECK(check(shaped(k::all_reduce, {8, 4}, {8, 4}), 2) == errc::invalid_argument);
  CHECK(check(shaped(k::all_reduce, {8}, {8}), 2) == errc::invalid_argument);
  CHECK(check(shaped(k::all_reduce, {0}, {0}), 1) == errc::invalid_argument);
  CHECK(check(shaped(k::all_reduce, {8}, {8}), 0) == errc::invalid_argument);
  // Reductions against types.
  CHECK(check(shaped(k::all_reduce, {8}, {8}, dtype::i32, reduce_op::avg), 1) ==
        errc::not_supported);
  CHECK(check(shaped(k::all_reduce, {8}, {8}, dtype::bf16, reduce_op::avg), 1) == errc::ok);
  CHECK(check(shaped(k::all_reduce, {8}, {8}, dtype::c32, reduce_op::max), 1) ==
        errc::not_supported);
  CHECK(check(shaped(k::all_reduce, {8}, {8}, dtype::c64, reduce_op::sum), 1) == errc::ok);
  CHECK(check(shaped(k::all_reduce, {8}, {8}, dtype::f32, static_cast<reduce_op>(9)), 1) ==
        errc::invalid_argument);
  CHECK(check(shaped(k::all_reduce, {8}, {8}, static_cast<dtype>(40)), 1) ==
        errc::invalid_argument);
  CHECK(check(shaped(static_cast<collective_kind>(17), {8}, {8}), 1) == errc::invalid_argument);
  // broadcast: one source, one buffer per rank of its size, root a rank.
  CHECK(check(shaped(k::broadcast, {8}, {8, 8, 8}, dtype::f32, reduce_op::sum, 2), 3) == errc::ok);
  CHECK(check(shaped(k::broadcast, {8}, {8, 8, 8}, dtype::f32, reduce_op::sum, 3), 3) ==
        errc::invalid_argument);
  CHECK(check(shaped(k::broadcast, {8}, {8, 9, 8}), 3) == errc::invalid_argument);
  CHECK(check(shaped(k::broadcast, {8, 8}, {8, 8}), 2) == errc::invalid_argument);
  // reduce: one destination of the send size.
  CHECK(check(shaped(k::reduce, {8, 8}, {8}, dtype::f32, reduce_op::min, 1), 2) == errc::ok);
  CHECK(check(shaped(k::reduce, {8, 8}, {4}), 2) == errc::invalid_argument);
  CHECK(check(shaped(k::reduce, {8, 8}, {8}, dtype::f32, reduce_op::sum, -1), 2) ==
        errc::invalid_argument);
  // all_gather: recv = ranks x send.
  CHECK(check(shaped(k::all_gather, {5, 5, 5}, {15, 15, 15}), 3) == errc::ok);
  CHECK(check(shaped(k::all_gather, {5, 5, 5}, {15, 15, 10}), 3) == errc::invalid_argument);
  CHECK(check(shaped(k::all_gather, {5, 6, 5}, {15, 18, 15}), 3) == errc::invalid_argument);
  // reduce_scatter: send = ranks x recv.
  CHECK(check(shaped(k::reduce_scatter, {12, 12}, {6, 6}), 2) == errc::ok);
  CHECK(check(shaped(k::reduce_scatter, {12, 12}, {6, 5}), 2) == errc::invalid_argument);
  CHECK(check(shaped(k::reduce_scatter, {12, 10}, {6, 6}), 2) == errc::invalid_argument);
  // send_recv: both ranks in range, one buffer each of one size.
  CHECK(check(shaped(k::send_recv, {4}, {4}, dtype::f32, reduce_op::sum, 0, 1), 2) == errc::ok);
  CHECK(check(shaped(k::send_recv, {4}, {4}, dtype::f32, reduce_op::sum, 0, 0), 1) == errc::ok);
  CHECK(check(shaped(k::send_recv, {4}, {4}, dtype::f32, reduce_op::sum, 0, 2), 2) ==
        errc::invalid_argument);
  CHECK(check(shaped(k::send_recv, {4}, {3}, dtype::f32, reduce_op::sum, 0, 1), 2) ==
        errc::invalid_argument);
  CHECK(to_string(collective_kind::reduce_scatter) == "reduce_scatter");
  CHECK(to_string(reduce_op::avg) == "avg");
  CHECK(to_string(static_cast<reduce_op>(9)) == "unknown");
}

TEST_CASE("collectives: one allocation used twice by a call must be exactly in place") {
  // The check compares the views' states by identity only (never reads
  // them): a pointer that shares an int's ownership stands for "one
  // allocation" without a device.
  auto owner = std::make_shared<int>(0);
  std::shared_ptr<detail::buffer_state> one(owner,
                                            reinterpret_cast<detail::buffer_state*>(owner.get()));
  auto with = [&](collective_kind kind, detail::collective_view s, detail::collective_view r,
                  std::size_t ranks) {
    collective_call c;
    c.kind = kind;
    for (std::size_t q = 0; q < ranks; ++q) {
      c.send.push_back(q == 0 ? s : detail::collective_view{nullptr, 0, s.count});
      c.recv.push_back(q == 0 ? r : detail::collective_view{nullptr, 0, r.count});
    }
    return check(c, ranks);
  };
  using k = collective_kind;
  CHECK(with(k::all_reduce, {one, 0, 8}, {one, 0, 8}, 1) == errc::ok);                // in place
  CHECK(with(k::all_reduce, {one, 0, 8}, {one, 4, 8}, 1) == errc::invalid_argument);  // overlap
  CHECK(with(k::all_reduce, {one, 0, 8}, {one, 8, 8}, 1) == errc::ok);                // disjoint
  // all_gather in place: rank 0's send is block 0 of its recv.
  CHECK(with(k::all_gather, {one, 0, 4}, {one, 0, 8}, 2) == errc::ok);
  CHECK(with(k::all_gather, {one, 2, 4}, {one, 0, 8}, 2) == errc::invalid_argument);
  // reduce_scatter in place: rank 0's recv is block 0 of its send.
  CHECK(with(k::reduce_scatter, {one, 0, 8}, {one, 0, 4}, 2) == errc::ok);
  CHECK(with(k::reduce_scatter, {one, 0, 8}, {one, 1, 4}, 2) == errc::invalid_argument);
}
#endif
