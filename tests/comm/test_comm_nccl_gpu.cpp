// The NCCL comm on real GPUs; every test skips without a CUDA device.
//
//   WorldOfOne*, BadArguments*, MissingRankZero*, LaunchedWorldOfOne*: in this
//   process, one GPU, a 1-rank comm over a TcpStore on 127.0.0.1.
//   InitWithAbsentPeer* (1 GPU), TwoRanks* / StalledPeer* (2+ GPUs), FourRanks* (4+):
//   each rank is a process of its own, this binary started again with a filter on
//   NcclCommChild.DISABLED_Rank and the scenario in its environment. The ranks are
//   exec'd, not just forked: a process that has used CUDA (this one) cannot use it in
//   a forked child. A rank still running after its deadline is killed and reported.
//
// Values are small integers, so every sum is exact in bf16 (8-bit mantissa) too.
#include "comm/comm_nccl.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"
#include "comm/process_groups.h"
#include "comm/tcp_store.h"
#include "support/errors.h"
#include "support/files.h"
#include "support/fork_ranks.h"
#include "support/temp_dir.h"

#ifdef SHARDTRAIN_HAVE_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#endif

extern char** environ;

namespace st {
namespace {

using Clock = std::chrono::steady_clock;
using testing::error_of;
using testing::read_file;

int gpu_count() {
#ifdef SHARDTRAIN_HAVE_CUDA
  return cuda::device_count(nullptr);
#else
  return 0;
#endif
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// ---- device buffers from host values -------------------------------------------------

struct DevBuf {
  Backend& be;
  Tensor t;
  DevBuf(Backend& b, Tensor x) : be(b), t(x) {}
  ~DevBuf() { be.free(t); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
};

std::unique_ptr<DevBuf> put(Backend& be, DType dt, const std::vector<double>& v) {
  std::vector<unsigned char> bytes(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    unsigned char* p = bytes.data() + i * dtype_size(dt);
    switch (dt) {
      case DType::F32: { const float x = static_cast<float>(v[i]); std::memcpy(p, &x, 4); break; }
      case DType::F64: std::memcpy(p, &v[i], 8); break;
      case DType::BF16: { const uint16_t x = f32_to_bf16(static_cast<float>(v[i])); std::memcpy(p, &x, 2); break; }
      case DType::I32: { const int32_t x = static_cast<int32_t>(v[i]); std::memcpy(p, &x, 4); break; }
      default: fail("test: dtype ", dtype_name(dt), " not handled");
    }
  }
  auto b = std::make_unique<DevBuf>(be, be.alloc(dt, v.size()));
  be.upload(b->t, bytes.data());
  return b;
}

std::vector<double> get(Backend& be, Tensor t) {
  std::vector<unsigned char> bytes(t.numel * dtype_size(t.dtype));
  be.download(bytes.data(), t);
  std::vector<double> v(t.numel);
  for (size_t i = 0; i < v.size(); ++i) {
    const unsigned char* p = bytes.data() + i * dtype_size(t.dtype);
    switch (t.dtype) {
      case DType::F32: { float x; std::memcpy(&x, p, 4); v[i] = x; break; }
      case DType::F64: std::memcpy(&v[i], p, 8); break;
      case DType::BF16: { uint16_t x; std::memcpy(&x, p, 2); v[i] = bf16_to_f32(x); break; }
      case DType::I32: { int32_t x; std::memcpy(&x, p, 4); v[i] = x; break; }
      default: fail("test: dtype ", dtype_name(t.dtype), " not handled");
    }
  }
  return v;
}

void check_equal(const std::vector<double>& got, const std::vector<double>& want, const std::string& what, int rank) {
  ST_CHECK(got.size() == want.size(), "rank ", rank, ": ", what, ": ", got.size(), " values, expected ", want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ST_CHECK(got[i] == want[i], "rank ", rank, ": ", what, ": [", i, "] = ", got[i], ", expected ", want[i]);
}

// Every collective on one dtype and count, out of place and in place. Rank q's
// values depend on q, so a wrong rank order or a missing contribution shows.
void exercise(Comm& c, Backend& be, DType dt, size_t count) {
  const int r = c.rank(), W = c.world();
  const std::string what = std::string(dtype_name(dt)) + " count " + std::to_string(count);
  const auto small = [](size_t i) { return static_cast<double>(i % 8); };

  // all_gather: rank q's element i is 10q + i%8.
  std::vector<double> send(count), want(count * W), minus(count * W, -1.0);
  for (size_t i = 0; i < count; ++i) send[i] = 10.0 * r + small(i);
  for (int q = 0; q < W; ++q)
    for (size_t i = 0; i < count; ++i) want[q * count + i] = 10.0 * q + small(i);
  {
    auto s = put(be, dt, send);
    auto recv = put(be, dt, minus);
    c.all_gather(recv->t, s->t, count);
    check_equal(get(be, recv->t), want, "all_gather " + what, r);
    std::vector<double> own = minus;
    for (size_t i = 0; i < count; ++i) own[r * count + i] = send[i];
    auto inplace = put(be, dt, own);
    c.all_gather(inplace->t, inplace->t.slice(r * count, count), count);
    check_equal(get(be, inplace->t), want, "in-place all_gather " + what, r);
  }

  // all_gather_v, in place: rank q's part has (q * 7 + count) % 5 + q elements (one
  // empty where that is 0), each 10q + i%8; the sync and the async form.
  {
    std::vector<size_t> counts(W);
    size_t total = 0, mine_at = 0;
    for (int q = 0; q < W; ++q) {
      counts[q] = (q * 7 + count) % 5 + q;
      if (q < r) mine_at += counts[q];
      total += counts[q];
    }
    std::vector<double> v_want(total), own(total, -1.0);
    for (int q = 0, at = 0; q < W; ++q)
      for (size_t i = 0; i < counts[q]; ++i, ++at) v_want[at] = 10.0 * q + small(i);
    for (size_t i = 0; i < counts[r]; ++i) own[mine_at + i] = v_want[mine_at + i];
    for (bool async : {false, true}) {
      auto v = put(be, dt, own.empty() ? std::vector<double>{-1.0} : own);
      if (async)
        c.wait(c.all_gather_v_async(v->t, counts));
      else
        c.all_gather_v(v->t, counts);
      if (total) check_equal(get(be, v->t), v_want, std::string(async ? "async " : "") + "all_gather_v " + what, r);
    }
  }

  // reduce_scatter: rank q contributes (q+1)(j%8+1) at j, so rank r's chunk sums to
  // W(W+1)/2 (j%8+1) with j = r*count + i.
  {
    std::vector<double> full(count * W), part_want(count);
    for (size_t j = 0; j < full.size(); ++j) full[j] = (r + 1) * (small(j) + 1);
    for (size_t i = 0; i < count; ++i) part_want[i] = W * (W + 1) / 2 * (small(r * count + i) + 1);
    auto f = put(be, dt, full);
    auto part = put(be, dt, std::vector<double>(count, -7.0));
    c.reduce_scatter(part->t, f->t, count);
    check_equal(get(be, part->t), part_want, "reduce_scatter " + what, r);
    // In place: the result lands in this rank's own chunk of the send buffer.
    c.reduce_scatter(f->t.slice(r * count, count), f->t, count);
    check_equal(get(be, f->t.slice(r * count, count)), part_want, "in-place reduce_scatter " + what, r);
  }

  // all_reduce: rank q holds q + (i%8)W; the sum is W(W-1)/2 + (i%8)W².
  {
    std::vector<double> buf(count), buf_want(count);
    for (size_t i = 0; i < count; ++i) {
      buf[i] = r + small(i) * W;
      buf_want[i] = W * (W - 1) / 2 + small(i) * W * W;
    }
    auto b = put(be, dt, buf);
    c.all_reduce(b->t, count);
    check_equal(get(be, b->t), buf_want, "all_reduce " + what, r);
  }

  // broadcast from the last rank.
  {
    const int root = W - 1;
    std::vector<double> b_want(count);
    for (size_t i = 0; i < count; ++i) b_want[i] = 7 * small(i) + 1;
    auto b = put(be, dt, r == root ? b_want : std::vector<double>(count, -1.0));
    c.broadcast(b->t, count, root);
    check_equal(get(be, b->t), b_want, "broadcast " + what, r);
  }
}

void exercise_all(Comm& c, Backend& be) {
  for (DType dt : {DType::F32, DType::BF16, DType::F64, DType::I32})
    for (size_t count : {size_t(1), size_t(5), size_t(1000), size_t(1 << 20) + 3}) exercise(c, be, dt, count);
  c.barrier();
  const int W = c.world();
  {  // all_reduce_max (f32): rank q holds q + i at even i and -q - i at odd ones
    const size_t n = 1001;
    std::vector<double> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = i % 2 ? -double(c.rank()) - double(i) : double(c.rank()) + double(i);
    auto b = put(be, DType::F32, v);
    c.all_reduce_max(b->t, n);
    const auto got = get(be, b->t);
    for (size_t i = 0; i < n; ++i) {
      const double want = i % 2 ? -double(i) : double(W - 1) + double(i);
      ST_CHECK(got[i] == want, "rank ", c.rank(), ": all_reduce_max[", i, "] = ", got[i], ", expected ", want);
    }
  }
  const double s = c.all_reduce_sum(c.rank() + 0.5);
  ST_CHECK(s == W * (W - 1) / 2.0 + 0.5 * W, "rank ", c.rank(), ": all_reduce_sum = ", s, ", expected ",
           W * (W - 1) / 2.0 + 0.5 * W);
  c.barrier();
}

// Each rank contributes its world rank; the sum over a group tells its members.
double group_sum(Comm& c, Backend& be, int world_rank) {
  auto b = put(be, DType::F64, {static_cast<double>(world_rank)});
  c.all_reduce(b->t, 1);
  return get(be, b->t)[0];
}

bool starts_with(const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; }
bool contains(const std::string& s, const std::string& p) { return s.find(p) != std::string::npos; }

// ---- ranks as processes of their own ---------------------------------------------------

// Starts this test binary once per entry of `ranks` with the scenario in its
// environment, waits for all (killing those still running after deadline_s), and
// returns one message per rank: "" when it passed. A failed rank's output is printed.
std::vector<std::string> run_child_ranks(const std::string& scenario, int world, const std::vector<int>& ranks,
                                         double deadline_s) {
  char exe[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return std::vector<std::string>(ranks.size(), "cannot find this test binary (/proc/self/exe)");
  const int port = test::free_port();
  const std::string base = testing::temp_path("nccl_" + scenario).string();
  std::printf("[ scenario ] %s: %zu process(es) of a world of %d, rendezvous on 127.0.0.1:%d\n", scenario.c_str(),
              ranks.size(), world, port);
  std::fflush(nullptr);

  std::vector<pid_t> pids;
  std::vector<std::string> logs, results;
  for (int r : ranks) {
    logs.push_back(base + "_rank" + std::to_string(r) + ".log");
    results.push_back(base + "_rank" + std::to_string(r) + ".result");
    std::remove(results.back().c_str());
    // Everything the child needs is built here: between fork and exec only
    // async-signal-safe calls are allowed (this process has CUDA and NCCL threads).
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e)
      if (!starts_with(*e, "GTEST_") && !starts_with(*e, "ST_NCCL_CHILD_")) env.emplace_back(*e);
    env.push_back("ST_NCCL_CHILD_SCENARIO=" + scenario);
    env.push_back("ST_NCCL_CHILD_RANK=" + std::to_string(r));
    env.push_back("ST_NCCL_CHILD_WORLD=" + std::to_string(world));
    env.push_back("ST_NCCL_CHILD_PORT=" + std::to_string(port));
    env.push_back("ST_NCCL_CHILD_RESULT=" + results.back());
    std::vector<char*> envp;
    for (auto& s : env) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::string a1 = "--gtest_filter=NcclCommChild.DISABLED_Rank", a2 = "--gtest_also_run_disabled_tests";
    char* argv[] = {exe, a1.data(), a2.data(), nullptr};
    const int fd = ::open(logs.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execve(exe, argv, envp.data());
      ::_exit(127);
    }
    if (fd >= 0) ::close(fd);
    pids.push_back(pid);
  }

  const auto t0 = Clock::now();
  std::vector<int> status(ranks.size(), 0);
  std::vector<bool> done(ranks.size(), false), killed(ranks.size(), false);
  for (size_t left = ranks.size(); left > 0;) {
    for (size_t i = 0; i < ranks.size(); ++i)
      if (!done[i] && pids[i] > 0 && ::waitpid(pids[i], &status[i], WNOHANG) == pids[i]) done[i] = true, --left;
    if (left == 0) break;
    if (seconds_since(t0) > deadline_s) {
      for (size_t i = 0; i < ranks.size(); ++i)
        if (!done[i] && pids[i] > 0) {
          ::kill(pids[i], SIGKILL);
          ::waitpid(pids[i], &status[i], 0);
          done[i] = killed[i] = true;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  std::vector<std::string> out(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    const std::string res = read_file(results[i]);
    if (pids[i] <= 0)
      out[i] = "fork failed";
    else if (killed[i])
      out[i] = "still running after " + std::to_string(deadline_s) + " s: killed";
    else if (starts_with(res, "OK"))
      out[i] = "";
    else if (starts_with(res, "FAIL\n"))
      out[i] = res.substr(5);
    else if (WIFSIGNALED(status[i]))
      out[i] = "no result: killed by signal " + std::to_string(WTERMSIG(status[i]));
    else
      out[i] = "no result: exited with status " + std::to_string(WEXITSTATUS(status[i]));
    if (out[i].empty()) {
      std::printf("[ rank %d   ] ok (%.1f s)\n", r, seconds_since(t0));
    } else {
      std::printf("[ rank %d   ] FAILED: %s\n---- output of rank %d (%s) ----\n", r, out[i].c_str(), r,
                  logs[i].c_str());
      std::istringstream log(read_file(logs[i]));
      for (std::string line; std::getline(log, line);) std::printf("[rank %d] %s\n", r, line.c_str());
      std::printf("---- end of rank %d ----\n", r);
    }
  }
  std::fflush(nullptr);
  return out;
}

// ---- what the child ranks do ------------------------------------------------------------

int env_int(const char* name) {
  const char* v = std::getenv(name);
  ST_CHECK(v && *v, "test child: ", name, " is not set");
  return std::atoi(v);
}

std::unique_ptr<Backend> rank_backend(int rank) { return make_cuda_backend(rank % gpu_count()); }

void child_collectives(int r, int W, int port) {
  auto be = rank_backend(r);  // first: outlives the comm
  TcpStore store("127.0.0.1", port, r, W, 60);
  auto c = make_nccl_comm(store, "world", r, W, 60, *be);
  ST_CHECK(c->rank() == r && c->world() == W, "rank ", r, ": rank/world ", c->rank(), "/", c->world());
  exercise_all(*c, *be);
  std::printf("rank %d on %s: every collective gave the expected values (f32, bf16, f64, i32)\n", r,
              be->name().c_str());
}

// init_process_groups on CUDA: NCCL world, shard and replicate groups.
void child_groups(int r, int W, int port, int G) {
  auto be = rank_backend(r);
  const Rendezvous env{.rank = r, .world = W, .master_port = port, .launched = true};
  ProcessGroups g = init_process_groups(env, *be, G, 60);
  const int GG = G == 0 ? W : G;
  ST_CHECK(g.world->world() == W && g.world->rank() == r, "rank ", r, ": world comm");
  ST_CHECK(g.shard->world() == GG && g.shard->rank() == r % GG, "rank ", r, ": shard comm");
  ST_CHECK((GG < W) == (g.replicate != nullptr), "rank ", r, ": replicate comm present: ", g.replicate != nullptr);
  const double ws = group_sum(*g.world, *be, r), ss = group_sum(*g.shard, *be, r);
  ST_CHECK(ws == W * (W - 1) / 2, "rank ", r, ": world sum ", ws);
  const int g0 = r / GG * GG;  // first world rank of this shard group
  ST_CHECK(ss == GG * g0 + GG * (GG - 1) / 2, "rank ", r, ": shard group sum ", ss);
  if (g.replicate) {
    double want = 0;
    for (int q = r % GG; q < W; q += GG) want += q;
    const double rs = group_sum(*g.replicate, *be, r);
    ST_CHECK(rs == want, "rank ", r, ": replicate group sum ", rs, ", expected ", want);
  }
  g.world->barrier();
  ST_CHECK(g.world->all_reduce_sum(1.0) == W, "rank ", r, ": all_reduce_sum over the world");
  std::printf("rank %d: NCCL process groups of %d ranks, shard groups of %d: sums as expected\n", r, W, GG);
}

// Rank 0 of 2 alone: NCCL set-up can never complete; it must give up at the timeout.
void child_absent_peer(int r, int W, int port) {
  auto be = rank_backend(r);
  TcpStore store("127.0.0.1", port, r, W, 60);
  const double timeout = 5;
  const auto t0 = Clock::now();
  const std::string msg = error_of([&] { make_nccl_comm(store, "world", r, W, timeout, *be); });
  const double took = seconds_since(t0);
  std::printf("rank %d: error after %.1f s: %s\n", r, took, msg.c_str());
  ST_CHECK(starts_with(msg, "rank 0: nccl init failed: timed out after 5 s"), "unexpected error: ", msg);
  ST_CHECK(took >= timeout * 0.9 && took < timeout + 30, "gave up after ", took, " s, timeout ", timeout, " s");
}

// Both ranks connect and sum once; then rank 1 stays out of a barrier. Rank 0's
// barrier must time out, abort, and say so; the comm is unusable afterwards.
void child_stalled_peer(int r, int W, int port) {
  auto be = rank_backend(r);
  TcpStore store("127.0.0.1", port, r, W, 120);
  const double timeout = 10;
  auto c = make_nccl_comm(store, "world", r, W, timeout, *be);
  ST_CHECK(c->all_reduce_sum(1.0) == W, "rank ", r, ": warm-up sum");
  if (r != 0) {
    store.get("rank0-done");  // alive, but not in the barrier
    return;
  }
  const auto t0 = Clock::now();
  const std::string msg = error_of([&] { c->barrier(); });
  const double took = seconds_since(t0);
  store.set("rank0-done", {'1'});
  std::printf("rank 0: barrier error after %.1f s: %s\n", took, msg.c_str());
  ST_CHECK(starts_with(msg, "rank 0: nccl barrier failed: timed out after 10 s"), "unexpected error: ", msg);
  ST_CHECK(contains(msg, "aborted"), "the error does not say the comm was aborted: ", msg);
  ST_CHECK(took >= timeout * 0.9 && took < timeout + 30, "gave up after ", took, " s, timeout ", timeout, " s");
  const std::string again = error_of([&] { c->all_reduce_sum(1.0); });
  ST_CHECK(starts_with(again, "rank 0: nccl all_reduce_sum failed: the communicator was aborted"),
           "after the abort: ", again);
}

TEST(NcclCommChild, DISABLED_Rank) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const char* scenario = std::getenv("ST_NCCL_CHILD_SCENARIO");
  if (!scenario) GTEST_SKIP() << "runs only as a rank started by the multi-process NcclCommGpu tests";
  const std::string s = scenario;
  std::string err;
  try {
    const int r = env_int("ST_NCCL_CHILD_RANK"), W = env_int("ST_NCCL_CHILD_WORLD"),
              port = env_int("ST_NCCL_CHILD_PORT");
    if (s == "collectives")
      child_collectives(r, W, port);
    else if (s == "groups_g0")
      child_groups(r, W, port, 0);
    else if (s == "groups_g1")
      child_groups(r, W, port, 1);
    else if (s == "groups_g2")
      child_groups(r, W, port, 2);
    else if (s == "absent_peer")
      child_absent_peer(r, W, port);
    else if (s == "stalled_peer")
      child_stalled_peer(r, W, port);
    else
      fail("unknown scenario '", s, "'");
  } catch (const std::exception& e) {
    err = e.what();
    if (err.empty()) err = "exception without a message";
  }
  std::fflush(nullptr);
  if (const char* path = std::getenv("ST_NCCL_CHILD_RESULT")) {
    std::ofstream out(path);
    out << (err.empty() ? "OK\n" : "FAIL\n" + err);
  }
  EXPECT_EQ(err, "");
}

void expect_all_ok(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// ---- one GPU, this process ------------------------------------------------------------------

TEST(NcclCommGpu, WorldOfOneCollectivesF32Bf16F64I32) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  const char* nvls_before = std::getenv("NCCL_NVLS_ENABLE");
  const std::string nvls_want = nvls_before ? nvls_before : "0";
  auto be = make_cuda_backend(0);
  TcpStore store("127.0.0.1", test::free_port(), 0, 1, 30);
  auto c = make_nccl_comm(store, "world", 0, 1, 30, *be);
  ASSERT_EQ(c->rank(), 0);
  ASSERT_EQ(c->world(), 1);
  const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
  EXPECT_EQ(std::string(nvls ? nvls : "(unset)"), nvls_want)
      << "make_nccl_comm sets NCCL_NVLS_ENABLE=0 where it is not set, and leaves a value that is";
  try {
    exercise_all(*c, *be);
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  std::printf("world-1 NCCL comm on %s: all_gather, all_gather_v, reduce_scatter, all_reduce, all_reduce_max, broadcast, barrier, "
              "all_reduce_sum as expected for f32, bf16, f64, i32\n",
              be->name().c_str());
}

// The collectives run on the backend's stream: work enqueued just before (a fill of
// 64 Mi floats, long enough to still be running) is finished before they read it.
TEST(NcclCommGpu, CollectivesAreOrderedWithTheBackendStream) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto be = make_cuda_backend(0);
  TcpStore store("127.0.0.1", test::free_port(), 0, 1, 30);
  auto c = make_nccl_comm(store, "world", 0, 1, 30, *be);
  const size_t n = size_t(64) << 20;
  DevBuf src(*be, be->alloc(DType::F32, n)), dst(*be, be->alloc(DType::F32, n));
  for (double v : {3.0, 5.0}) {
    be->fill(src.t, v);  // asynchronous on the backend stream
    c->all_gather(dst.t, src.t, n);
    std::vector<float> host(n);
    be->download(host.data(), dst.t);
    size_t bad = 0;
    for (float x : host) bad += x != static_cast<float>(v);
    EXPECT_EQ(bad, 0u) << "all_gather read the source before the fill to " << v << " finished";
  }
}

#ifdef SHARDTRAIN_HAVE_CUDA
// Holds the backend's stream for `ms` milliseconds (a host function enqueued on it).
void stall_stream(Backend& be, int ms) {
  auto sleep = [](void* p) { std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int*>(p))); };
  static int hold;
  hold = ms;
  ASSERT_EQ(cudaLaunchHostFunc(static_cast<cudaStream_t>(be.native_stream()), sleep, &hold), cudaSuccess);
}
#endif

// The async forms run on the comm's own stream: the call returns while the compute
// stream is still busy, the collective still reads what the compute wrote before the
// call, and compute enqueued after wait() sees the result.
TEST(NcclCommGpu, AsyncCollectivesOverlapAndStayOrdered) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
#ifdef SHARDTRAIN_HAVE_CUDA
  auto be = make_cuda_backend(0);
  TcpStore store("127.0.0.1", test::free_port(), 0, 1, 30);
  auto c = make_nccl_comm(store, "world", 0, 1, 30, *be);
  const size_t n = size_t(16) << 20;
  DevBuf src(*be, be->alloc(DType::F32, n)), dst(*be, be->alloc(DType::F32, n)), sum(*be, be->alloc(DType::F32, n));
  be->synchronize();
  stall_stream(*be, 300);  // compute busy for 0.3 s
  be->fill(src.t, 7.0);
  const auto t0 = Clock::now();
  CommWork g = c->all_gather_async(dst.t, src.t, n);
  CommWork r = c->all_reduce_async(src.t, n);
  const double enqueue_s = seconds_since(t0);
  EXPECT_LT(enqueue_s, 0.2) << "the async calls waited for the compute stream";
  c->wait(g);
  c->wait(r);
  be->add(sum.t, dst.t, src.t, n);  // after the waits: sees both results
  std::vector<float> host(n);
  be->download(host.data(), sum.t);
  size_t bad = 0;
  for (float x : host) bad += x != 14.0f;
  EXPECT_EQ(bad, 0u) << "the collectives did not read the fill, or the add ran before them";
  c->wait(g);  // again: harmless
  c->wait(CommWork{});
  std::printf("two async collectives enqueued in %.3f ms behind a 300 ms stall of the compute stream\n",
              enqueue_s * 1e3);
#endif
}

// A collective that does not complete within the timeout (here: queued behind a
// compute stream held for 4 s, with a 1 s timeout) is caught by the watchdog, which
// aborts the communicator; the next call throws an error naming the rank, the
// operation and the timeout.
TEST(NcclCommGpu, WatchdogAbortsACollectiveStuckPastTheTimeout) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
#ifdef SHARDTRAIN_HAVE_CUDA
  auto be = make_cuda_backend(0);
  TcpStore store("127.0.0.1", test::free_port(), 0, 1, 30);
  auto c = make_nccl_comm(store, "shard0", 0, 1, 1.0, *be, /*global_rank=*/3);
  DevBuf a(*be, be->alloc(DType::F32, 1024)), b(*be, be->alloc(DType::F32, 1024));
  c->all_gather(b.t, a.t, 1024);  // connects; completes
  be->synchronize();
  stall_stream(*be, 4000);
  const auto t0 = Clock::now();
  CommWork w = c->reduce_scatter_async(b.t, a.t, 1024);
  std::string msg;
  while (msg.empty() && seconds_since(t0) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    msg = error_of([&] { c->wait(w); });
  }
  const double took = seconds_since(t0);
  std::printf("watchdog after %.2f s: %s\n", took, msg.c_str());
  EXPECT_TRUE(starts_with(msg, "rank 3 (0 of 1 in group 'shard0'): nccl reduce_scatter #")) << msg;
  EXPECT_TRUE(contains(msg, "did not complete within 1 s")) << msg;
  EXPECT_TRUE(contains(msg, "communicator aborted")) << msg;
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 3.5) << "not caught before the stall ended";
  EXPECT_EQ(error_of([&] { c->barrier(); }), msg) << "later calls report the same failure";
  be->synchronize();  // the stream drains: nothing is left waiting on the aborted comm
#endif
}

TEST(NcclCommGpu, BadArgumentsAreErrorsNamingTheRankAndOp) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto be = make_cuda_backend(0);
  TcpStore store("127.0.0.1", test::free_port(), 0, 1, 30);
  auto c = make_nccl_comm(store, "shard0", 0, 1, 30, *be, /*global_rank=*/5);
  DevBuf f(*be, be->alloc(DType::F32, 4)), d(*be, be->alloc(DType::F64, 8));
  const std::string who = "rank 5 (0 of 1 in group 'shard0'): nccl ";
  EXPECT_EQ(error_of([&] { c->all_gather(d.t, f.t, 2); }), who + "all_gather with mismatched dtypes f64 and f32");
  EXPECT_EQ(error_of([&] { c->reduce_scatter(f.t, f.t, 8); }), who + "reduce_scatter needs 8 elements in send, it has 4");
  EXPECT_EQ(error_of([&] { c->all_reduce(f.t, 5); }), who + "all_reduce needs 5 elements in buf, it has 4");
  EXPECT_EQ(error_of([&] { c->broadcast(f.t, 4, 1); }), who + "broadcast root 1 outside group 'shard0' of 1");
  EXPECT_NO_THROW(c->barrier()) << "nothing was sent, so the comm is still usable";

  auto cpu = make_cpu_backend();
  const std::string msg = error_of([&] { make_nccl_comm(store, "other", 0, 1, 30, *cpu); });
  EXPECT_TRUE(starts_with(msg, "rank 0: the NCCL comm needs the CUDA backend")) << msg;
  EXPECT_TRUE(starts_with(error_of([&] { make_nccl_comm(store, "x", 1, 1, 30, *be); }), "rank 1: nccl group 'x': rank 1 outside a group of 1"));
}

// Rank 1 of 2 waits for the id rank 0 never publishes: a bounded wait, then an
// error naming the rank, the group and the key.
TEST(NcclCommGpu, MissingRankZeroIdTimesOut) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto be = make_cuda_backend(0);
  TcpStore server("127.0.0.1", test::free_port(), 0, 2, 30);  // the store, as rank 0 would serve it
  const auto t0 = Clock::now();
  const std::string msg = error_of([&] { make_nccl_comm(server, "world", 1, 2, 1.5, *be); });
  const double took = seconds_since(t0);
  std::printf("error after %.1f s: %s\n", took, msg.c_str());
  EXPECT_TRUE(starts_with(msg, "rank 1: nccl init failed: no NCCL id from rank 0 of group 'world'")) << msg;
  EXPECT_TRUE(contains(msg, "world/nccl_id")) << msg;
  EXPECT_GE(took, 1.3);
  EXPECT_LT(took, 15);
}

// A world of one under a launcher (the environment came from one) uses NCCL, so
// `shardtrain launch --nproc-per-node 1` runs the multi-GPU code path; a plain single
// process keeps the copy-only comm. Told apart by their error messages: only the
// NCCL comm names itself.
TEST(NcclCommGpu, LaunchedWorldOfOneUsesNccl) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto be = make_cuda_backend(0);
  DevBuf f(*be, be->alloc(DType::F32, 4)), d(*be, be->alloc(DType::F64, 4));
  {
    Rendezvous env;
    env.master_port = test::free_port();
    env.launched = true;
    ProcessGroups g = init_process_groups(env, *be, 0, 30);
    ASSERT_TRUE(g.world && g.shard);
    EXPECT_EQ(g.replicate, nullptr);
    EXPECT_EQ(error_of([&] { g.world->all_gather(d.t, f.t, 1); }), "rank 0: nccl all_gather with mismatched dtypes f64 and f32");
    EXPECT_EQ(error_of([&] { g.shard->all_gather(d.t, f.t, 1); }),
              "rank 0 (0 of 1 in group 'shard0'): nccl all_gather with mismatched dtypes f64 and f32");
    EXPECT_EQ(group_sum(*g.shard, *be, 0), 0.0);
    EXPECT_EQ(g.world->all_reduce_sum(4.25), 4.25);
  }
  ProcessGroups single = init_process_groups(Rendezvous{}, *be, 0, 30);
  EXPECT_FALSE(contains(error_of([&] { single.world->all_gather(d.t, f.t, 1); }), "nccl"));
}

// ---- processes of their own -----------------------------------------------------------------

TEST(NcclCommGpu, InitWithAbsentPeerTimesOutAndAborts) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  expect_all_ok(run_child_ranks("absent_peer", 2, {0}, 90));
}

TEST(NcclCommGpu, TwoRanksAllCollectives) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpu_count();
  expect_all_ok(run_child_ranks("collectives", 2, {0, 1}, 180));
}

TEST(NcclCommGpu, TwoRanksProcessGroups) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpu_count();
  expect_all_ok(run_child_ranks("groups_g0", 2, {0, 1}, 120));  // FSDP over both
  expect_all_ok(run_child_ranks("groups_g1", 2, {0, 1}, 120));  // no sharding, replicate group of 2
}

TEST(NcclCommGpu, StalledPeerBarrierTimesOutAndAborts) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << gpu_count();
  expect_all_ok(run_child_ranks("stalled_peer", 2, {0, 1}, 120));
}

TEST(NcclCommGpu, FourRanksHsdpGroups) {
  if (!st::cuda_available()) GTEST_SKIP() << "no CUDA device";
  if (gpu_count() < 4) GTEST_SKIP() << "needs 4 GPUs, found " << gpu_count();
  expect_all_ok(run_child_ranks("collectives", 4, {0, 1, 2, 3}, 240));
  expect_all_ok(run_child_ranks("groups_g2", 4, {0, 1, 2, 3}, 120));  // shard {0,1},{2,3}; replicate {0,2},{1,3}
}

}  // namespace
}  // namespace st
