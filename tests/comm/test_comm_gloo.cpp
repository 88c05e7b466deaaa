// Gloo comm and process groups with 2 and 4 ranks, each a forked process on
// 127.0.0.1. Values are small integers, so every sum is exact in f32 and f64.
#include "comm/comm_gloo.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "comm/process_groups.h"
#include "comm/tcp_store.h"
#include "support/errors.h"
#include "support/fork_ranks.h"

namespace st {
namespace {

using Clock = std::chrono::steady_clock;

template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::F32;
  if constexpr (std::is_same_v<T, double>) return DType::F64;
  if constexpr (std::is_same_v<T, int32_t>) return DType::I32;
}

template <class T>
Tensor view(std::vector<T>& v) {
  return Tensor{v.data(), dtype_of<T>(), v.size()};
}

template <class T>
void check_equal(const std::vector<T>& got, const std::vector<T>& want, const std::string& what, int rank) {
  ST_CHECK(got.size() == want.size(), "rank ", rank, ": ", what, " size");
  for (size_t i = 0; i < got.size(); ++i)
    ST_CHECK(got[i] == want[i], "rank ", rank, ": ", what, "[", i, "] = ", got[i], ", expected ", want[i]);
}

// Every collective on one dtype, with counts that do not split evenly.
template <class T>
void exercise(Comm& c, size_t count) {
  const int r = c.rank(), W = c.world();
  const std::string type(dtype_name(dtype_of<T>()));

  std::vector<T> send(count), recv(count * W), want(count * W);
  for (size_t i = 0; i < count; ++i) send[i] = static_cast<T>(r * 100 + static_cast<int>(i));
  for (int q = 0; q < W; ++q)
    for (size_t i = 0; i < count; ++i) want[q * count + i] = static_cast<T>(q * 100 + static_cast<int>(i));
  c.all_gather(view(recv), view(send), count);
  check_equal(recv, want, "all_gather " + type, r);

  // In place: this rank's part already in its slot.
  std::vector<T> inplace(count * W, T(-1));
  for (size_t i = 0; i < count; ++i) inplace[r * count + i] = send[i];
  c.all_gather(view(inplace), Tensor{inplace.data() + r * count, dtype_of<T>(), count}, count);
  check_equal(inplace, want, "in-place all_gather " + type, r);

  // all_gather_v, in place: rank q's part has (q * 7 + count) % 5 elements (some
  // empty), each its rank's values; the sync and the async form.
  std::vector<size_t> counts(W);
  size_t total = 0, mine_at = 0;
  for (int q = 0; q < W; ++q) {
    counts[q] = (q * 7 + count) % 5;
    if (q < r) mine_at += counts[q];
    total += counts[q];
  }
  for (bool async : {false, true}) {
    std::vector<T> v(total, T(-1)), v_want(total);
    size_t at = 0;
    for (int q = 0; q < W; ++q)
      for (size_t i = 0; i < counts[q]; ++i, ++at) v_want[at] = static_cast<T>(q * 100 + static_cast<int>(i));
    for (size_t i = 0; i < counts[r]; ++i) v[mine_at + i] = v_want[mine_at + i];
    if (async)
      c.wait(c.all_gather_v_async(view(v), counts));
    else
      c.all_gather_v(view(v), counts);
    check_equal(v, v_want, std::string(async ? "async " : "") + "all_gather_v " + type, r);
  }

  // reduce_scatter: rank q contributes (q+1)·(j+1) at j, so rank r's chunk sums to
  // W(W+1)/2 · (r·count + i + 1).
  std::vector<T> full(count * W), part(count, T(-7)), part_want(count);
  for (size_t j = 0; j < full.size(); ++j) full[j] = static_cast<T>((r + 1) * static_cast<int>(j + 1));
  for (size_t i = 0; i < count; ++i) part_want[i] = static_cast<T>(W * (W + 1) / 2 * static_cast<int>(r * count + i + 1));
  c.reduce_scatter(view(part), view(full), count);
  check_equal(part, part_want, "reduce_scatter " + type, r);

  std::vector<T> buf(count), buf_want(count);
  for (size_t i = 0; i < count; ++i) {
    buf[i] = static_cast<T>(r + static_cast<int>(i) * W);
    buf_want[i] = static_cast<T>(W * (W - 1) / 2 + static_cast<int>(i) * W * W);
  }
  c.all_reduce(view(buf), count);
  check_equal(buf, buf_want, "all_reduce " + type, r);

  const int root = W - 1;
  std::vector<T> b(count, T(-1)), b_want(count);
  for (size_t i = 0; i < count; ++i) b_want[i] = static_cast<T>(7 * static_cast<int>(i) + 1);
  if (r == root) b = b_want;
  c.broadcast(view(b), count, root);
  check_equal(b, b_want, "broadcast " + type, r);
}

void all_collectives(int world) {
  const int port = test::free_port();
  const auto errors = test::run_ranks(world, [&](int r) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, r, world, 30);
    std::unique_ptr<Comm> c = make_gloo_comm(store, "world", r, world, 30);
    ST_CHECK(c->rank() == r && c->world() == world, "rank/world");
    for (size_t count : {size_t(1), size_t(5), size_t(1000)}) {
      exercise<float>(*c, count);
      exercise<double>(*c, count);
    }
    // Integers: gather and broadcast move bytes, sums work too.
    std::vector<int32_t> ids(1, r * 10), all(world);
    c->all_gather(view(all), view(ids), 1);
    for (int q = 0; q < world; ++q) ST_CHECK(all[q] == q * 10, "rank ", r, ": i32 all_gather");
    // all_reduce_max (f32): rank q holds q + i at even i and -q - i at odd ones, so the
    // maximum is W-1+i at even i and -i at odd; infinities win, NaN travels.
    for (size_t count : {size_t(1), size_t(7), size_t(1000)}) {
      std::vector<float> m(count);
      for (size_t i = 0; i < count; ++i) m[i] = i % 2 ? -float(r) - float(i) : float(r) + float(i);
      c->all_reduce_max(view(m), count);
      for (size_t i = 0; i < count; ++i) {
        const float want = i % 2 ? -float(i) : float(world - 1) + float(i);
        ST_CHECK(m[i] == want, "rank ", r, ": all_reduce_max[", i, "] of ", count, " = ", m[i], ", expected ", want);
      }
    }
    std::vector<float> big = {r == 1 ? INFINITY : 1.0f, r == 0 ? -INFINITY : -2.0f};
    c->all_reduce_max(view(big), 2);
    ST_CHECK(big[0] == INFINITY && big[1] == -2.0f, "rank ", r, ": all_reduce_max with infinities");
    std::vector<double> f64(1, r);
    bool refused = false;
    try {
      c->all_reduce_max(view(f64), 1);
    } catch (const Error& e) {
      refused = std::string(e.what()).find("f32 only") != std::string::npos;
    }
    ST_CHECK(refused, "rank ", r, ": all_reduce_max of f64 was not refused naming f32");
    c->barrier();
    const double s = c->all_reduce_sum(r + 0.5);
    ST_CHECK(s == world * (world - 1) / 2.0 + 0.5 * world, "rank ", r, ": all_reduce_sum = ", s);
    c->barrier();
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(GlooComm, AllCollectivesTwoRanks) { all_collectives(2); }
TEST(GlooComm, AllCollectivesThreeRanks) { all_collectives(3); }  // not a power of two
TEST(GlooComm, AllCollectivesFourRanks) { all_collectives(4); }

// Rank q's bf16 values: normal, of magnitudes spread over a few octaves, the same
// on every rank for a given q (each rank computes the others' for the reference).
std::vector<uint16_t> bf16_values(int q, size_t n) {
  std::mt19937 gen(1000 + q);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> octave(-4, 4);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_bf16(std::ldexp(normal(gen), octave(gen)));
  return v;
}

// bf16 reductions: the reduce-scatter against a CPU reference of the ring's own
// order (chunk c starts at rank c+1 and goes round to rank c, each hop adding in
// fp32 and rounding to bf16: bit for bit), and both it and the all-reduce (gloo's
// ring, in its own order: identical on every rank) within bf16's rounding of the
// exact sum.
void bf16_reductions(int world) {
  const int port = test::free_port();
  const auto errors = test::run_ranks(world, [&](int r) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, r, world, 30);
    std::unique_ptr<Comm> c = make_gloo_comm(store, "world", r, world, 30);
    const double tol = world * std::ldexp(1.0, -8);  // relative to the sum of magnitudes
    for (size_t count : {size_t(1), size_t(7), size_t(3000)}) {
      std::vector<std::vector<uint16_t>> all(world);
      for (int q = 0; q < world; ++q) all[q] = bf16_values(q, count * world);
      std::vector<uint16_t> send = all[r], part(count, 0xffff);
      c->reduce_scatter(Tensor{part.data(), DType::BF16, count}, Tensor{send.data(), DType::BF16, send.size()}, count);
      for (size_t i = 0; i < count; ++i) {
        const size_t j = r * count + i;
        uint16_t ring = all[(r + 1) % world][j];
        double exact = bf16_to_f32(ring), mag = std::abs(exact);
        for (int k = 2; k <= world; ++k) {
          const uint16_t x = all[(r + k) % world][j];
          ring = f32_to_bf16(bf16_to_f32(ring) + bf16_to_f32(x));
          exact += bf16_to_f32(x);
          mag += std::abs(bf16_to_f32(x));
        }
        ST_CHECK(part[i] == ring, "rank ", r, ": bf16 reduce_scatter[", i, "] = ", bf16_to_f32(part[i]),
                 ", the ring's order gives ", bf16_to_f32(ring));
        ST_CHECK(std::abs(bf16_to_f32(part[i]) - exact) <= tol * mag, "rank ", r, ": bf16 reduce_scatter[", i,
                 "] = ", bf16_to_f32(part[i]), ", exact ", exact);
      }
      std::vector<uint16_t> buf(all[r].begin(), all[r].begin() + count);
      c->all_reduce(Tensor{buf.data(), DType::BF16, count}, count);
      for (size_t i = 0; i < count; ++i) {
        double exact = 0, mag = 0;
        for (int q = 0; q < world; ++q) exact += bf16_to_f32(all[q][i]), mag += std::abs(bf16_to_f32(all[q][i]));
        ST_CHECK(std::abs(bf16_to_f32(buf[i]) - exact) <= tol * mag, "rank ", r, ": bf16 all_reduce[", i, "] = ",
                 bf16_to_f32(buf[i]), ", exact ", exact);
      }
      // Every rank holds the same bits: gather them all and compare.
      std::vector<uint16_t> everyone(count * world);
      c->all_gather(Tensor{everyone.data(), DType::BF16, everyone.size()}, Tensor{buf.data(), DType::BF16, count},
                    count);
      for (int q = 0; q < world; ++q)
        for (size_t i = 0; i < count; ++i)
          ST_CHECK(everyone[q * count + i] == buf[i], "rank ", r, ": bf16 all_reduce[", i, "] differs on rank ", q);
    }
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(GlooComm, Bf16ReductionsTwoRanks) { bf16_reductions(2); }
TEST(GlooComm, Bf16ReductionsThreeRanks) { bf16_reductions(3); }
TEST(GlooComm, Bf16ReductionsFourRanks) { bf16_reductions(4); }

TEST(GlooComm, BadArgumentsAreErrorsNotCrashes) {
  const int port = test::free_port();
  const auto errors = test::run_ranks(2, [&](int r) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, r, 2, 30);
    auto c = make_gloo_comm(store, "world", r, 2, 30);
    std::vector<float> f(4);
    std::vector<double> d(8);
    std::vector<uint16_t> h(4);
    const auto expect_error = [&](const std::function<void()>& fn, const std::string& text) {
      try {
        fn();
      } catch (const Error& e) {
        ST_CHECK(std::string(e.what()).find(text) != std::string::npos, "wrong error: ", e.what());
        return;
      }
      fail("no error for ", text);
    };
    expect_error([&] { c->all_gather(view(d), view(f), 2); }, "mismatched dtypes f64 and f32");
    expect_error([&] { c->all_gather(view(f), view(f), 4); }, "all_gather needs 8 elements in recv");
    expect_error([&] { c->broadcast(view(f), 4, 2); }, "broadcast root 2 outside group 'world' of 2");
    expect_error([&] { c->all_reduce(Tensor{h.data(), DType::F16, 4}, 4); }, "all_reduce of f16 is not supported");
    c->barrier();  // still usable: nothing was sent
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// Each rank contributes its world rank; the sum over a group tells its members.
double group_sum(Comm& c, int world_rank) {
  std::vector<double> v{static_cast<double>(world_rank)};
  c.all_reduce(view(v), 1);
  return v[0];
}

TEST(ProcessGroups, WorldOfFourWithShardGroupsOfTwo) {
  const int port = test::free_port();
  const auto errors = test::run_ranks(4, [&](int r) {
    auto be = make_cpu_backend();
    ProcessGroups g = init_process_groups(Rendezvous{.rank = r, .world = 4, .master_port = port}, *be, 2, 30);
    ST_CHECK(g.world->world() == 4 && g.world->rank() == r, "rank ", r, ": world comm");
    ST_CHECK(g.shard->world() == 2 && g.shard->rank() == r % 2, "rank ", r, ": shard comm");
    ST_CHECK(g.replicate && g.replicate->world() == 2 && g.replicate->rank() == r / 2, "rank ", r, ": replicate comm");
    const double world_sum = group_sum(*g.world, r), shard_sum = group_sum(*g.shard, r),
                 replica_sum = group_sum(*g.replicate, r);
    ST_CHECK(world_sum == 6, "rank ", r, ": world sum ", world_sum);
    // Shard groups {0,1} and {2,3}; replicate groups {0,2} and {1,3}.
    ST_CHECK(shard_sum == (r < 2 ? 1 : 5), "rank ", r, ": shard group sum ", shard_sum);
    ST_CHECK(replica_sum == (r % 2 == 0 ? 2 : 4), "rank ", r, ": replicate group sum ", replica_sum);
    g.world->barrier();
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(ProcessGroups, ShardOverAllRanksHasNoReplicateGroup) {
  const int port = test::free_port();
  const auto errors = test::run_ranks(2, [&](int r) {
    auto be = make_cpu_backend();
    ProcessGroups g = init_process_groups(Rendezvous{.rank = r, .world = 2, .master_port = port}, *be, 0, 30);
    ST_CHECK(g.shard->world() == 2 && !g.replicate, "rank ", r, ": G = 0 is one shard group over all ranks");
    ST_CHECK(group_sum(*g.shard, r) == 1, "rank ", r, ": shard sum");
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(ProcessGroups, SingleProcessAndBadGroupSizes) {
  auto be = make_cpu_backend();
  ProcessGroups g = init_process_groups(Rendezvous{}, *be, 0, 5);
  EXPECT_EQ(g.world->world(), 1);
  EXPECT_EQ(g.shard->world(), 1);
  EXPECT_EQ(g.replicate, nullptr);
  const Rendezvous four{.world = 4};
  const std::string e = testing::error_of([&] { init_process_groups(four, *be, 3, 5); });
  EXPECT_NE(e.find("dist.shard_group_size 3 does not divide the world of 4"), std::string::npos) << e;
  EXPECT_THROW(init_process_groups(four, *be, -1, 5), Error);
}

TEST(ProcessGroups, MissingRankIsNamedAtJoin) {
  const int port = test::free_port();
  // Ranks 0 and 1 of 3 start; rank 2 never does.
  const auto errors = test::run_ranks(2, [&](int r) {
    auto be = make_cpu_backend();
    init_process_groups(Rendezvous{.rank = r, .world = 3, .master_port = port}, *be, 0, 1.5);
  });
  for (int r = 0; r < 2; ++r)
    EXPECT_NE(errors[r].find("waiting for rank 2 of 3 (barrier 'join')"), std::string::npos) << errors[r];
}

TEST(GlooComm, PeerThatExitsMakesOthersFailInsteadOfHanging) {
  const int port = test::free_port(), world = 3;
  const double timeout_s = 20;
  const auto errors = test::run_ranks(world, [&](int r) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, r, world, 30);
    auto c = make_gloo_comm(store, "world", r, world, timeout_s);
    c->barrier();  // everyone connected
    if (r == 2) return;  // exits: its sockets close
    std::vector<float> buf(1000, 1.0f);
    const auto start = Clock::now();
    try {
      c->all_reduce(view(buf), buf.size());
    } catch (const Error& e) {
      const std::string msg = e.what();
      ST_CHECK(msg.find("rank " + std::to_string(r) + ": all_reduce failed: ") == 0, "message: ", msg);
      ST_CHECK(msg.find("a peer may have exited") != std::string::npos, "message: ", msg);
      // The closed connection is noticed at once, well before the timeout.
      const double took = std::chrono::duration<double>(Clock::now() - start).count();
      ST_CHECK(took < timeout_s / 2, "rank ", r, ": took ", took, " s to notice");
      return;
    }
    fail("rank ", r, ": all_reduce succeeded without rank 2");
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(GlooComm, StalledPeerTimesOut) {
  const int port = test::free_port();
  const double timeout_s = 2;
  const auto errors = test::run_ranks(2, [&](int r) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, r, 2, 30);
    auto c = make_gloo_comm(store, "world", r, 2, timeout_s);
    c->barrier();
    if (r == 1) {
      // Alive but not joining the collective: wait (on the store) until rank 0 has
      // seen its timeout, then leave.
      store->get("rank0-done");
      return;
    }
    const auto start = Clock::now();
    std::string msg;
    try {
      std::vector<double> v(10, 1.0);
      c->all_reduce(view(v), v.size());
    } catch (const Error& e) {
      msg = e.what();
    }
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    store->set("rank0-done", {'1'});
    ST_CHECK(msg.find("rank 0: all_reduce failed: ") == 0, "message: '", msg, "'");
    ST_CHECK(took >= timeout_s * 0.9 && took < timeout_s + 8, "timed out after ", took, " s");
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// A ring collective that waits on a silent peer names it by its world rank and
// node, and gives up after one timeout for the whole collective.
TEST(GlooComm, ARingNamesTheSilentPeerByWorldRankAndNode) {
  const int port = test::free_port();
  const double timeout_s = 2;
  const auto errors = test::run_ranks(2, [&](int r) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, r, 2, 30);
    // A timeout closes the group's pairs, so each collective gets its own group, whose
    // two members are world ranks 4 and 5, two ranks per node.
    for (const std::string op : {"all_gather", "reduce_scatter"}) {
      auto c = make_gloo_comm(store, op, r, 2, timeout_s, nullptr, 4 + r, GlooPeers{{4, 5}, 2});
      c->barrier();
      if (r == 1) {
        store->get(op + "-done");
        continue;
      }
      const auto start = Clock::now();
      std::string msg;
      try {
        std::vector<float> v(8, 1.0f), out(16);
        if (op == "all_gather") c->all_gather(view(out), view(v), v.size());
        else c->reduce_scatter(view(v), view(out), v.size());
      } catch (const Error& e) {
        msg = e.what();
      }
      const double took = std::chrono::duration<double>(Clock::now() - start).count();
      store->set(op + "-done", {'1'});
      ST_CHECK(msg.find("rank 4 (0 of 2 in group '" + op + "'): " + op + ": ") == 0, "message: '", msg, "'");
      ST_CHECK(msg.find("rank 5 (node 2)") != std::string::npos, op, ": the peer is not named: '", msg, "'");
      ST_CHECK(took >= timeout_s * 0.9 && took < timeout_s + 3, op, " timed out after ", took, " s");
    }
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// A peer that exits (its sockets close) fails the collective at once, naming it.
TEST(GlooComm, APeerThatExitsIsNamedAtOnce) {
  const int port = test::free_port();
  const auto errors = test::run_ranks(2, [&](int r) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, r, 2, 30);
    auto c = make_gloo_comm(store, "pair", r, 2, 20, nullptr, 4 + r, GlooPeers{{4, 5}, 2});
    c->barrier();
    if (r == 1) {
      c.reset();  // closes its connections, as an exiting process does
      store->set("rank1-gone", {'1'});
      store->get("rank0-done");
      return;
    }
    store->get("rank1-gone");
    const auto start = Clock::now();
    std::string msg;
    try {
      std::vector<float> v(8, 1.0f), out(16);
      c->all_gather(view(out), view(v), v.size());
    } catch (const Error& e) {
      msg = e.what();
    }
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    store->set("rank0-done", {'1'});
    ST_CHECK(msg.find("rank 4 (0 of 2 in group 'pair'): all_gather: the connection to rank 5 (node 2) failed") == 0,
             "message: '", msg, "'");
    ST_CHECK(took < 5, "took ", took, " s");
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// dist.overlap: the asynchronous forms return at once and run on the comm's thread
// while the caller goes on; wait() blocks until the collective is done. Rank 1 joins
// each collective 0.6 s late: rank 0's async call must not wait for it (its wait
// does), and without the thread the async call itself waits. Several collectives in
// flight, then a synchronous one, give the same values as one after another.
TEST(GlooComm, AsyncCollectivesRunBesideTheCaller) {
  const int port = test::free_port();
  const auto errors = test::run_ranks(2, [&](int r) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, r, 2, 30);
    for (bool overlap : {true, false}) {
      const std::string name = overlap ? "thread" : "inline";
      auto c = make_gloo_comm(store, name, r, 2, 30, nullptr, -1, {}, overlap);
      c->barrier();
      std::vector<float> send(1000, static_cast<float>(r + 1)), gathered(2000), full(2000), part(1000), sum(1000);
      for (size_t i = 0; i < full.size(); ++i) full[i] = static_cast<float>((r + 1) * (i % 7));
      for (size_t i = 0; i < sum.size(); ++i) sum[i] = static_cast<float>(r * 1000 + i);
      if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(600));
      const auto t0 = Clock::now();
      const CommWork g = c->all_gather_async(view(gathered), view(send), 1000);
      const CommWork s = c->reduce_scatter_async(view(part), view(full), 1000);
      const CommWork a = c->all_reduce_async(view(sum), 1000);
      const double queued = std::chrono::duration<double>(Clock::now() - t0).count();
      // Waited out of order: each wait returns once its own collective is done.
      c->wait(a);
      c->wait(g);
      c->wait(s);
      const double done = std::chrono::duration<double>(Clock::now() - t0).count();
      const double total = c->all_reduce_sum(r + 1.0);  // synchronous, after the queue
      if (r == 0) {
        if (overlap) {
          ST_CHECK(queued < 0.2, name, ": the async calls took ", queued, " s (they should return at once)");
          ST_CHECK(done > 0.4, name, ": the waits took only ", done, " s (rank 1 joined 0.6 s late)");
        } else {
          ST_CHECK(queued > 0.4, name, ": the async calls took only ", queued, " s (they run inside the call)");
        }
      }
      for (size_t i = 0; i < 1000; ++i) {
        ST_CHECK(gathered[i] == 1.0f && gathered[1000 + i] == 2.0f, name, ": all_gather[", i, "]");
        ST_CHECK(part[i] == 3.0f * static_cast<float>((r * 1000 + i) % 7), name, ": reduce_scatter[", i, "]");
        ST_CHECK(sum[i] == static_cast<float>(1000 + 2 * i), name, ": all_reduce[", i, "]");
      }
      ST_CHECK(total == 3.0, name, ": all_reduce_sum = ", total);
      c->barrier();
    }
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// A collective that fails on the comm thread fails its wait, the waits of those queued
// behind it and every later call, each with the error that names the peer.
TEST(GlooComm, AFailureOnTheCommThreadReachesEveryLaterWaitAndCall) {
  const int port = test::free_port();
  const auto errors = test::run_ranks(2, [&](int r) {
    auto store = std::make_shared<TcpStore>("127.0.0.1", port, r, 2, 30);
    auto c = make_gloo_comm(store, "pair", r, 2, 20, nullptr, 4 + r, GlooPeers{{4, 5}, 2}, /*overlap=*/true);
    c->barrier();
    if (r == 1) {
      c.reset();  // closes its connections, as an exiting process does
      store->set("rank1-gone", {'1'});
      store->get("rank0-done");
      return;
    }
    store->get("rank1-gone");
    std::vector<float> v(8, 1.0f), out(16), part(8), buf(8, 1.0f);
    const CommWork g = c->all_gather_async(view(out), view(v), v.size());
    const CommWork s = c->reduce_scatter_async(view(part), view(out), v.size());
    std::vector<std::string> msgs;
    for (const std::function<void()>& call : std::vector<std::function<void()>>{
             [&] { c->wait(g); }, [&] { c->wait(s); }, [&] { c->all_reduce(view(buf), buf.size()); },
             [&] { c->all_reduce_async(view(buf), buf.size()); }}) {
      try {
        call();
        msgs.push_back("");
      } catch (const Error& e) {
        msgs.push_back(e.what());
      }
    }
    store->set("rank0-done", {'1'});
    for (size_t i = 0; i < msgs.size(); ++i)
      ST_CHECK(msgs[i].find("rank 4 (0 of 2 in group 'pair'): all_gather: the connection to rank 5 (node 2) failed") ==
                   0,
               "call ", i, ": '", msgs[i], "'");
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace
}  // namespace st
