// Comm over Gloo. What each operation uses:
//   all_gather      a ring over Gloo's unbound buffers, written here, byte-wise, any
//                   dtype: W-1 steps, each rank passing the chunk it got last to its
//                   right neighbour, so every rank sends (W-1)·count elements
//   reduce_scatter  a ring over Gloo's unbound buffers, written here: W-1 steps, each
//                   rank sending one partial chunk to its right neighbour and adding
//                   its own contribution to the chunk from its left, so every rank
//                   sends (W-1)·count elements, as NCCL does. (gloo's
//                   ReduceScatterHalvingDoubling is an old-style algorithm without a
//                   per-call timeout and with int-sized counts.) bf16: each hop adds
//                   in fp32 and rounds the partial sum back to bf16 (to nearest even,
//                   core/dtype.h's f32_to_bf16), one rounding per hop.
// Both rings post each step's receive before its send. Gloo's TCP pair sends a
// chunk only once the peer has said it is ready to receive it, and that "ready"
// message waits in the same queue as the data the peer is sending: posted after a
// send, it reaches the other rank only behind the whole chunk, and the two
// directions of the link take turns instead of running together (gloo::allgather
// posts its send first: over a 200 Mbit/s link its 10 MB chunks moved at 16 MB/s
// instead of 24; bench/scaleout.sh, docs/scaleout_bench.md).
// Each ring collective has one deadline, the communicator's timeout from its start
// (not a full timeout for every wait inside it), and a rank that stops answering is
// named by its world rank and node.
//   all_reduce      gloo::allreduce (ring) with gloo::sum<T>; bf16 with bf16_sum below
//                   (the same fp32 add and rounding per hop)
//   all_gather_v    the all_gather ring with each rank's chunk of its own size
//   broadcast       gloo::broadcast, byte-wise, any dtype
//   barrier         gloo::barrier
//   all_reduce_max  gloo::allreduce with gloo::max<float>
//   all_reduce_sum  gloo::allreduce of one double
// Every call passes the communicator's timeout and a fresh tag; all ranks issue the
// same operations in the same order, so their tags match.
//
// Overlap. With `overlap` on, the *_async forms queue the collective for the
// communicator's own thread and return at once, so FSDP's prefetched all-gathers and
// its reduce-scatters run while the caller computes (as NCCL's streams do on a GPU);
// wait() blocks until that collective is done. The thread runs the queue in order, and
// a synchronous call first waits for the queue to empty and then runs on the caller's
// thread, so every rank still issues the same operations in the same order (the tags
// match) and the results are the same bit for bit. A collective that fails on the
// thread fails every later wait() and call with its error; the queued ones are dropped.
#include "comm/comm_gloo.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <sstream>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "core/dtype.h"
#include "core/error.h"

namespace st {
namespace {

// Slot prefixes of the rings written here; gloo's own collectives use 0x01..0x08.
constexpr uint8_t kReduceScatterSlotPrefix = 0x31;
constexpr uint8_t kAllGatherSlotPrefix = 0x32;

// Gloo writes to sockets with writev(), which raises SIGPIPE when a peer has gone;
// the default action would kill this rank silently instead of letting the collective
// fail with an error that names the peer. Leave an application's own handler alone.
void ignore_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
}

// bf16 (raw uint16_t) element sums: added in fp32, rounded to nearest even.
inline uint16_t bf16_add(uint16_t a, uint16_t b) { return f32_to_bf16(bf16_to_f32(a) + bf16_to_f32(b)); }

// gloo's reduce-function signature: c[i] = a[i] + b[i] for n elements.
void bf16_sum(void* c, const void* a, const void* b, size_t n) {
  uint16_t* out = static_cast<uint16_t*>(c);
  const uint16_t *x = static_cast<const uint16_t*>(a), *y = static_cast<const uint16_t*>(b);
  for (size_t i = 0; i < n; ++i) out[i] = bf16_add(x[i], y[i]);
}

class GlooComm final : public Comm {
 public:
  GlooComm(std::shared_ptr<gloo::rendezvous::Store> store, std::string prefix, int rank, int world,
           double timeout_s, std::shared_ptr<gloo::transport::Device> device, int global_rank,
           GlooPeers peers, bool overlap)
      : store_(std::move(store)),
        prefix_(std::move(prefix)),
        peers_(std::move(peers)),
        global_rank_(global_rank < 0 ? rank : global_rank),
        rank_(rank),
        world_(world),
        timeout_s_(timeout_s),
        timeout_(std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000))),
        overlap_(overlap) {
    ST_CHECK_DIST(world >= 1 && rank >= 0 && rank < world, "Gloo group '", prefix_, "': rank ", rank,
             " outside a group of ", world);
    ST_CHECK_DIST(timeout_s > 0, "Gloo group '", prefix_, "': timeout must be positive, got ", timeout_s);
    ST_CHECK_DIST(peers_.members.empty() || static_cast<int>(peers_.members.size()) == world, "Gloo group '",
                  prefix_, "': ", peers_.members.size(), " member ranks given for a group of ", world);
    ctx_ = std::make_shared<gloo::rendezvous::Context>(rank, world);
    ctx_->setTimeout(timeout_);
    gloo::rendezvous::PrefixStore prefixed(prefix_, *store_);
    try {
      ctx_->connectFullMesh(prefixed, device);
    } catch (const std::exception& e) {
      fail_dist(who(), ": connecting group '", prefix_, "' (", world, " ranks) failed: ", e.what());
    }
  }

  int rank() const override { return rank_; }
  int world() const override { return world_; }

  ~GlooComm() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      queue_.clear();  // never started: their buffers may be going away
    }
    work_cv_.notify_all();
    if (thread_.joinable()) thread_.join();  // one running finishes or fails within the timeout
  }

  void all_gather(Tensor recv, Tensor send, size_t count) override {
    drain();
    do_all_gather(recv, send, count);
  }
  void reduce_scatter(Tensor recv, Tensor send, size_t count) override {
    drain();
    do_reduce_scatter(recv, send, count);
  }
  void all_reduce(Tensor buf, size_t count) override {
    drain();
    do_all_reduce(buf, count);
  }
  void all_reduce_max(Tensor buf, size_t count) override {
    drain();
    fits("all_reduce_max", buf, count, "buf");
    ST_CHECK_DIST(buf.dtype == DType::F32, who(), ": all_reduce_max of ", dtype_name(buf.dtype), " (f32 only)");
    if (count == 0) return;
    run("all_reduce_max", [&] { reduce_in_place(buf.as<float>(), count, static_cast<ReduceFn>(&gloo::max<float>)); });
  }

  CommWork all_gather_async(Tensor recv, Tensor send, size_t count) override {
    if (!overlap_ || world_ == 1) return Comm::all_gather_async(recv, send, count);
    return enqueue([this, recv, send, count] { do_all_gather(recv, send, count); });
  }
  void all_gather_v(Tensor recv, const std::vector<size_t>& counts) override {
    drain();
    do_all_gather_v(recv, counts);
  }
  CommWork all_gather_v_async(Tensor recv, const std::vector<size_t>& counts) override {
    if (!overlap_ || world_ == 1) return Comm::all_gather_v_async(recv, counts);
    return enqueue([this, recv, counts] { do_all_gather_v(recv, counts); });
  }
  CommWork reduce_scatter_async(Tensor recv, Tensor send, size_t count) override {
    if (!overlap_ || world_ == 1) return Comm::reduce_scatter_async(recv, send, count);
    return enqueue([this, recv, send, count] { do_reduce_scatter(recv, send, count); });
  }
  CommWork all_reduce_async(Tensor buf, size_t count) override {
    if (!overlap_ || world_ == 1) return Comm::all_reduce_async(buf, count);
    return enqueue([this, buf, count] { do_all_reduce(buf, count); });
  }
  void wait(CommWork w) override {
    if (w.id == 0) return;
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return completed_ >= w.id || (error_ && failed_id_ <= w.id); });
    if (completed_ >= w.id) return;
    std::rethrow_exception(error_);
  }

 private:
  void do_all_gather(Tensor recv, Tensor send, size_t count) {
    same_dtype("all_gather", recv, send);
    fits("all_gather", send, count, "send");
    fits("all_gather", recv, count * world_, "recv");
    if (count == 0) return;
    const size_t bytes = count * dtype_size(send.dtype);
    char* mine = recv.as<char>() + rank_ * bytes;
    if (send.as<char>() != mine) std::memmove(mine, send.as<char>(), bytes);
    run("all_gather", [&] { ring_all_gather(recv.as<char>(), std::vector<size_t>(world_, bytes)); });
  }

  void do_all_gather_v(Tensor recv, const std::vector<size_t>& counts) {
    const size_t total = check_gather_v(*this, recv, counts);
    if (total == 0) return;
    std::vector<size_t> bytes(counts);
    for (size_t& b : bytes) b *= dtype_size(recv.dtype);
    run("all_gather_v", [&] { ring_all_gather(recv.as<char>(), bytes); });
  }

  void do_reduce_scatter(Tensor recv, Tensor send, size_t count) {
    same_dtype("reduce_scatter", recv, send);
    fits("reduce_scatter", send, count * world_, "send");
    fits("reduce_scatter", recv, count, "recv");
    if (count == 0) return;
    run("reduce_scatter", [&] {
      switch (reduction_dtype("reduce_scatter", send.dtype)) {
        case DType::F32: ring_reduce_scatter(recv.as<float>(), send.as<float>(), count); break;
        case DType::F64: ring_reduce_scatter(recv.as<double>(), send.as<double>(), count); break;
        case DType::I32: ring_reduce_scatter(recv.as<int32_t>(), send.as<int32_t>(), count); break;
        case DType::BF16: ring_reduce_scatter(recv.as<uint16_t>(), send.as<uint16_t>(), count, bf16_add); break;
        default: ring_reduce_scatter(recv.as<int64_t>(), send.as<int64_t>(), count); break;
      }
    });
  }

  void do_all_reduce(Tensor buf, size_t count) {
    fits("all_reduce", buf, count, "buf");
    if (count == 0) return;
    run("all_reduce", [&] {
      switch (reduction_dtype("all_reduce", buf.dtype)) {
        case DType::F32: reduce_in_place(buf.as<float>(), count); break;
        case DType::F64: reduce_in_place(buf.as<double>(), count); break;
        case DType::I32: reduce_in_place(buf.as<int32_t>(), count); break;
        case DType::BF16: reduce_in_place(buf.as<uint16_t>(), count, &bf16_sum); break;
        default: reduce_in_place(buf.as<int64_t>(), count); break;
      }
    });
  }


 public:
  void broadcast(Tensor buf, size_t count, int root) override {
    drain();
    ST_CHECK_DIST(root >= 0 && root < world_, who(), ": broadcast root ", root, " outside group '", prefix_, "' of ",
             world_);
    fits("broadcast", buf, count, "buf");
    if (count == 0) return;
    run("broadcast", [&] {
      gloo::BroadcastOptions opts(ctx_);
      opts.setOutput(buf.as<char>(), count * dtype_size(buf.dtype));
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  void barrier() override {
    drain();
    run("barrier", [&] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

  double all_reduce_sum(double value) override {
    drain();
    run("all_reduce_sum", [&] { reduce_in_place(&value, 1); });
    return value;
  }

 private:
  // ---- the communication thread ----
  CommWork enqueue(std::function<void()> fn) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
    if (!thread_.joinable()) thread_ = std::thread([this] { serve(); });
    queue_.push_back({++submitted_, std::move(fn)});
    work_cv_.notify_one();
    return {submitted_};
  }
  // Until the queue is empty (every collective queued so far done); a failure on the
  // thread is thrown here.
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return completed_ == submitted_ || error_; });
    if (error_) std::rethrow_exception(error_);
  }
  void serve() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      Queued job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::exception_ptr failed;
      try {
        job.fn();
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      if (failed) {
        error_ = failed;
        failed_id_ = job.id;
        queue_.clear();
      } else {
        completed_ = job.id;
      }
      done_cv_.notify_all();
    }
  }

  std::string who() const {
    std::ostringstream os;
    os << "rank " << global_rank_;
    if (prefix_ != "world") os << " (" << rank_ << " of " << world_ << " in group '" << prefix_ << "')";
    return os.str();
  }

  uint32_t next_tag() { return tag_++; }

  // "rank 3 (node 1)" for group rank r: its world rank, and its node when known.
  std::string peer(int r) const {
    const int w = peers_.members.empty() ? r : peers_.members[r];
    std::ostringstream os;
    os << "rank " << w;
    if (peers_.ranks_per_node > 0) os << " (node " << w / peers_.ranks_per_node << ")";
    return os.str();
  }

  // One deadline per collective: each wait inside it gets what is left of the
  // timeout. A wait that runs out names the rank it was waiting for.
  using Clock = std::chrono::steady_clock;
  std::chrono::milliseconds left(Clock::time_point deadline) const {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return std::max(ms, std::chrono::milliseconds(1));
  }
  // A failed post or wait names the peer: a wait that ran out of time says so; any
  // other failure is the pair to that peer closing (its sockets closed or reset: the
  // peer exited), which can show when posting as well as when waiting.
  [[noreturn]] void peer_failed(int r, bool sending, const std::exception& e) const {
    const std::string what = e.what();
    if (what.find("Timed out") != std::string::npos)
      fail_dist(who(), ": ", op_, ": ", sending ? "sending to " : "no data from ", peer(r),
                sending ? " did not complete" : "", " within the timeout of ", timeout_s_,
                " s (it may have exited, stalled or become unreachable): ", what);
    fail_dist(who(), ": ", op_, ": the connection to ", peer(r), " failed (it may have exited): ", what);
  }
  void post_recv(gloo::transport::UnboundBuffer* b, int from, uint64_t slot, size_t offset, size_t bytes) {
    try {
      b->recv(from, slot, offset, bytes);
    } catch (const std::exception& e) {
      peer_failed(from, false, e);
    }
  }
  void post_send(gloo::transport::UnboundBuffer* b, int to, uint64_t slot, size_t offset, size_t bytes) {
    try {
      b->send(to, slot, offset, bytes);
    } catch (const std::exception& e) {
      peer_failed(to, true, e);
    }
  }
  void wait_recv(gloo::transport::UnboundBuffer* b, int from, Clock::time_point deadline) {
    try {
      b->waitRecv(left(deadline));
    } catch (const std::exception& e) {
      peer_failed(from, false, e);
    }
  }
  void wait_send(gloo::transport::UnboundBuffer* b, int to, Clock::time_point deadline) {
    try {
      b->waitSend(left(deadline));
    } catch (const std::exception& e) {
      peer_failed(to, true, e);
    }
  }

  // Rank r's chunk (bytes[r] of them) sits at out + the bytes before it, this rank's
  // already in place. At step s rank r sends chunk r-s to its right and receives chunk
  // r-s-1 from its left, so after W-1 steps it holds every chunk; an empty chunk is
  // neither sent nor received (both neighbours know its size).
  void ring_all_gather(char* out, const std::vector<size_t>& bytes) {
    const int W = world_, r = rank_;
    if (W == 1) return;
    std::vector<size_t> at(W + 1, 0);
    for (int c = 0; c < W; ++c) at[c + 1] = at[c] + bytes[c];
    const auto deadline = Clock::now() + timeout_;
    const auto chunk = [W](int c) { return static_cast<size_t>(((c % W) + W) % W); };
    auto buf = ctx_->createUnboundBuffer(out, at[W]);
    const uint64_t slot = gloo::Slot::build(kAllGatherSlotPrefix, next_tag());
    const int right = (r + 1) % W, left_rank = (r + W - 1) % W;
    for (int s = 0; s < W - 1; ++s) {
      const size_t in = chunk(r - s - 1), outc = chunk(r - s);
      // receive first: see the top of the file
      if (bytes[in]) post_recv(buf.get(), left_rank, slot, at[in], bytes[in]);
      if (bytes[outc]) post_send(buf.get(), right, slot, at[outc], bytes[outc]);
      if (bytes[in]) wait_recv(buf.get(), left_rank, deadline);
      if (bytes[outc]) wait_send(buf.get(), right, deadline);
    }
  }

  // Runs one collective; any failure inside Gloo becomes an st::Error with context.
  template <class F>
  void run(const char* op, F&& body) {
    op_ = op;
    try {
      body();
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail_dist(who(), ": ", op, " failed: ", e.what(), " (a peer may have exited or stalled; timeout ", timeout_s_,
           " s)");
    }
  }

  void same_dtype(const char* op, Tensor a, Tensor b) const {
    ST_CHECK_DIST(a.dtype == b.dtype, who(), ": ", op, " with mismatched dtypes ", dtype_name(a.dtype), " and ",
             dtype_name(b.dtype));
  }
  void fits(const char* op, Tensor t, size_t n, const char* name) const {
    ST_CHECK_DIST(t.numel >= n && (n == 0 || t.data), who(), ": ", op, " needs ", n, " elements in ", name, ", it has ",
             t.numel);
  }
  DType reduction_dtype(const char* op, DType t) const {
    ST_CHECK_DIST(t == DType::F32 || t == DType::F64 || t == DType::BF16 || t == DType::I32 || t == DType::I64, who(),
                  ": ", op, " of ", dtype_name(t), " is not supported by the Gloo comm (f32, f64, bf16, i32, i64 are)");
    return t;
  }

  using ReduceFn = void (*)(void*, const void*, const void*, size_t);
  template <class T>
  void reduce_in_place(T* buf, size_t count, ReduceFn sum = static_cast<ReduceFn>(&gloo::sum<T>)) {
    gloo::AllreduceOptions opts(ctx_);
    opts.setOutput(buf, count);
    opts.setReduceFunction(sum);
    opts.setTag(next_tag());
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
  }

  // Chunk c of the send buffer is the part that ends up summed on rank c. At step s
  // (0..W-2) rank r sends its partial sum of chunk r-s-1 to rank r+1 and receives
  // rank r-1's partial sum of chunk r-s-2, adding its own part of that chunk; after
  // W-1 steps the chunk it holds is r, summed over all W ranks. `add` sums two
  // elements (bf16_add for bf16, stored as uint16_t).
  template <class T, class Add = std::plus<T>>
  void ring_reduce_scatter(T* recv, const T* send, size_t count, Add add = {}) {
    const int W = world_, r = rank_;
    if (W == 1) {
      if (recv != send) std::memmove(recv, send, count * sizeof(T));
      return;
    }
    const auto chunk = [W](int c) { return static_cast<size_t>(((c % W) + W) % W); };
    const size_t bytes = count * sizeof(T);
    std::vector<T> scratch[2] = {std::vector<T>(count), std::vector<T>(count)};
    auto whole = ctx_->createUnboundBuffer(const_cast<T*>(send), bytes * W);
    std::unique_ptr<gloo::transport::UnboundBuffer> parts[2] = {
        ctx_->createUnboundBuffer(scratch[0].data(), bytes), ctx_->createUnboundBuffer(scratch[1].data(), bytes)};
    const uint64_t slot = gloo::Slot::build(kReduceScatterSlotPrefix, next_tag());
    const int right = (r + 1) % W, left_rank = (r + W - 1) % W;
    const auto deadline = Clock::now() + timeout_;
    gloo::transport::UnboundBuffer* out = whole.get();
    size_t out_offset = chunk(r - 1) * bytes;
    for (int s = 0; s < W - 1; ++s) {
      gloo::transport::UnboundBuffer* in = parts[s % 2].get();
      post_recv(in, left_rank, slot, 0, bytes);  // receive first: see the top of the file
      post_send(out, right, slot, out_offset, bytes);
      wait_recv(in, left_rank, deadline);
      wait_send(out, right, deadline);
      T* acc = scratch[s % 2].data();
      const T* own = send + chunk(r - s - 2) * count;
      T* dst = s == W - 2 ? recv : acc;  // the last step's chunk is r: sum straight into recv
      for (size_t i = 0; i < count; ++i) dst[i] = add(acc[i], own[i]);
      out = in;
      out_offset = 0;
    }
  }

  std::shared_ptr<gloo::rendezvous::Store> store_;  // declared first: outlives the context
  std::string prefix_;
  GlooPeers peers_;
  const char* op_ = "";  // the collective running, for the messages of the waits inside it
  int global_rank_, rank_, world_;
  double timeout_s_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  uint32_t tag_ = 0;

  // The communication thread (started by the first *_async call) and its queue.
  struct Queued {
    uint64_t id;
    std::function<void()> fn;
  };
  bool overlap_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Queued> queue_;
  uint64_t submitted_ = 0, completed_ = 0, failed_id_ = 0;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;  // last: joined in the destructor, before the rest goes
};

}  // namespace

std::shared_ptr<gloo::transport::Device> make_gloo_device(const std::string& hostname) {
  ignore_sigpipe();
  gloo::transport::tcp::attr attr;
  std::string what;
  const char* ifname = std::getenv("SHARDTRAIN_GLOO_IFNAME");
  const char* ifvar = "SHARDTRAIN_GLOO_IFNAME";
  if (!ifname || !*ifname) {
    ifname = std::getenv("GLOO_SOCKET_IFNAME");
    ifvar = "GLOO_SOCKET_IFNAME";
  }
  if (ifname && *ifname) {
    const std::string list = ifname;
    attr.iface = list.substr(0, list.find(','));
    what = "interface " + attr.iface + " (" + ifvar + "=" + list + ")";
  } else {
    attr.hostname = hostname.empty() ? "127.0.0.1" : hostname;
    what = "address " + attr.hostname;
  }
  try {
    return gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    fail_dist("Gloo: cannot listen on ", what, ": ", e.what(),
         " (set SHARDTRAIN_GLOO_IFNAME to the network interface the ranks reach each other on)");
  }
}

std::unique_ptr<Comm> make_gloo_comm(std::shared_ptr<gloo::rendezvous::Store> store, const std::string& prefix,
                                     int rank, int world, double timeout_s,
                                     std::shared_ptr<gloo::transport::Device> device, int global_rank,
                                     GlooPeers peers, bool overlap) {
  ST_CHECK_DIST(store != nullptr, "Gloo group '", prefix, "' needs a rendezvous store");
  if (!device) device = make_gloo_device("");
  ignore_sigpipe();
  return std::make_unique<GlooComm>(std::move(store), prefix, rank, world, timeout_s, std::move(device),
                                    global_rank, std::move(peers), overlap);
}

}  // namespace st
