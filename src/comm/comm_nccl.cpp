// Comm over NCCL. What each operation uses:
//   all_gather      ncclAllGather (in place when send is this rank's slot of recv)
//   reduce_scatter  ncclReduceScatter, sum
//   all_reduce      ncclAllReduce, sum, in place
//   all_reduce_max  ncclAllReduce, max, in place (f32)
//   broadcast       ncclBroadcast, in place
//   all_gather_v    one ncclBroadcast per rank with a part, in one group (in place)
//   barrier         ncclAllReduce of one double in a persistent device buffer, then a
//                   bounded wait for the communication stream
//   all_reduce_sum  the same buffer: host value in, ncclAllReduce, copied back, bounded
//                   wait
//
// Streams. Every collective of the communicator runs on its own stream (created at
// the highest priority, so its kernels get SMs as soon as compute blocks retire),
// which serialises them in issue order, the same on every rank. Before each one the
// communication stream waits for an event recorded on the backend's compute stream
// (Backend::native_stream()): the collective reads what the kernels before it wrote.
// After it, an event is recorded on the communication stream; wait() makes the compute
// stream wait for that event, so the compute work enqueued afterwards (kernels that
// read the result, cudaFreeAsync of the buffers) is ordered after the collective, with
// no host wait. Between the *_async call and wait() compute and communication
// overlap. The synchronous forms are the async ones followed at once by wait().
//
// Waits. The communicator is created non-blocking (config.blocking = 0): NCCL calls
// return at once, possibly with ncclInProgress, and ncclCommGetAsyncError reports
// when the call has finished. This lets every wait on the host be bounded: the id
// exchange (store timeout), communicator set-up, a call that returned ncclInProgress
// (NCCL connects peers lazily at the first collective), and the stream wait of
// barrier and all_reduce_sum. When the bound is passed the communicator is aborted
// (ncclCommAbort makes NCCL's kernels and threads give up) and the error names this
// rank, the group and the operation. A call that returned ncclInProgress must finish
// before the next call on the comm and before anything else is enqueued on the
// stream (the collective is not on the stream yet), so each operation waits for
// that before returning.
//
// Watchdog. Collectives enqueued without a host wait are watched by a thread of the
// comm: it polls the completion event of the oldest one, and when that has been the
// oldest for longer than the timeout (a peer died, stalled, or issued different
// collectives) it aborts the communicator, which ends NCCL's kernels so the streams
// drain, prints the reason on stderr, and every later call of this comm throws it
// ("rank 3: nccl reduce_scatter #812 did not complete within 300 s ..."). The clock
// of an operation starts when it was enqueued or when the one before it completed,
// whichever is later, so an operation queued behind slow ones is not blamed for them.
#include "comm/comm_nccl.h"

#include "core/error.h"

#ifdef SHARDTRAIN_HAVE_CUDA

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "comm/tcp_store.h"

namespace st {
namespace {

using Clock = std::chrono::steady_clock;

std::string seconds_text(double s) {
  std::ostringstream os;
  os << s << " s";
  return os.str();
}

ncclDataType_t nccl_dtype(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::F8E4M3:  // moved as bytes (gathers only)
    case DType::F8E5M2: return ncclUint8;
  }
  fail_dist("nccl: unknown dtype ", static_cast<int>(t));
}

class NcclComm final : public Comm {
 public:
  NcclComm(TcpStore& store, std::string prefix, int rank, int world, double timeout_s, cudaStream_t stream,
           int device, int global_rank)
      : prefix_(std::move(prefix)),
        global_rank_(global_rank < 0 ? rank : global_rank),
        rank_(rank),
        world_(world),
        timeout_s_(timeout_s),
        timeout_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))),
        stream_(stream),
        device_(device) {
    try {
      init(store);
    } catch (...) {
      release();  // the destructor does not run for a constructor that throws
      throw;
    }
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclComm() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    (void)cudaSetDevice(device_);
    std::lock_guard<std::mutex> lk(comm_mu_);
    if (comm_) {
      // Unwinding from an error: the other ranks may never get here, so do not wait
      // for them. Otherwise finalize (flushes this rank's operations, bounded) and
      // destroy; abort if that does not finish in time.
      bool clean = std::uncaught_exceptions() == 0;
      if (clean) {
        ncclResult_t r = ncclCommFinalize(comm_);
        const auto deadline = Clock::now() + timeout_;
        for (int spins = 0; r == ncclInProgress && Clock::now() < deadline; ++spins) {
          pause(spins);
          if (ncclCommGetAsyncError(comm_, &r) != ncclSuccess) break;
        }
        clean = r == ncclSuccess;
      }
      if (clean)
        (void)ncclCommDestroy(comm_);
      else
        (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    release();
  }

  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int world() const override { return world_; }

  void all_gather(Tensor recv, Tensor send, size_t count) override { wait(all_gather_async(recv, send, count)); }
  void reduce_scatter(Tensor recv, Tensor send, size_t count) override {
    wait(reduce_scatter_async(recv, send, count));
  }
  void all_reduce(Tensor buf, size_t count) override { wait(all_reduce_async(buf, count)); }
  void all_reduce_max(Tensor buf, size_t count) override {
    const char* op = "all_reduce_max";
    fits(op, buf, count, "buf");
    ST_CHECK_DIST(buf.dtype == DType::F32, who(), ": nccl all_reduce_max of ", dtype_name(buf.dtype), " (f32 only)");
    if (count == 0) return;
    wait(launch(op, [&] { return ncclAllReduce(buf.data, buf.data, count, ncclFloat32, ncclMax, comm_, cstream_); }));
  }

  CommWork all_gather_async(Tensor recv, Tensor send, size_t count) override {
    const char* op = "all_gather";
    same_dtype(op, recv, send);
    fits(op, send, count, "send");
    fits(op, recv, count * world_, "recv");
    if (count == 0) return {};
    return launch(op, [&] {
      return ncclAllGather(send.data, recv.data, count, nccl_dtype(send.dtype), comm_, cstream_);
    });
  }

  CommWork reduce_scatter_async(Tensor recv, Tensor send, size_t count) override {
    const char* op = "reduce_scatter";
    same_dtype(op, recv, send);
    fits(op, send, count * world_, "send");
    fits(op, recv, count, "recv");
    if (count == 0) return {};
    return launch(op, [&] {
      return ncclReduceScatter(send.data, recv.data, count, nccl_dtype(send.dtype), ncclSum, comm_, cstream_);
    });
  }

  CommWork all_reduce_async(Tensor buf, size_t count) override {
    const char* op = "all_reduce";
    fits(op, buf, count, "buf");
    if (count == 0) return {};
    return launch(op, [&] {
      return ncclAllReduce(buf.data, buf.data, count, nccl_dtype(buf.dtype), ncclSum, comm_, cstream_);
    });
  }

  void all_gather_v(Tensor recv, const std::vector<size_t>& counts) override {
    wait(all_gather_v_async(recv, counts));
  }
  CommWork all_gather_v_async(Tensor recv, const std::vector<size_t>& counts) override {
    const char* op = "all_gather_v";
    if (check_gather_v(*this, recv, counts) == 0) return {};
    const size_t es = dtype_size(recv.dtype);
    return launch(op, [&] {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      size_t at = 0;
      for (int q = 0; q < world_; ++q) {
        if (counts[q]) {
          char* p = static_cast<char*>(recv.data) + at * es;
          r = ncclBroadcast(p, p, counts[q], nccl_dtype(recv.dtype), q, comm_, cstream_);
          if (r != ncclSuccess && r != ncclInProgress) break;
        }
        at += counts[q];
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess && r != ncclInProgress ? r : end;
    });
  }

  void broadcast(Tensor buf, size_t count, int root) override {
    const char* op = "broadcast";
    ST_CHECK_DIST(root >= 0 && root < world_, who(), ": nccl broadcast root ", root, " outside group '", prefix_, "' of ",
             world_);
    fits(op, buf, count, "buf");
    if (count == 0) return;
    wait(launch(op, [&] {
      return ncclBroadcast(buf.data, buf.data, count, nccl_dtype(buf.dtype), root, comm_, cstream_);
    }));
  }

  void wait(CommWork work) override {
    if (work.id == 0) return;
    std::lock_guard<std::mutex> lk(mu_);
    if (!watchdog_error_.empty()) throw Error(watchdog_error_, ErrorKind::Distributed);
    // The queue is in id order; one that left it has completed on the device.
    for (const Pending& p : pending_) {
      if (p.id < work.id) continue;
      if (p.id == work.id) {
        const cudaError_t e = cudaStreamWaitEvent(stream_, p.done, 0);
        if (e != cudaSuccess) {
          (void)cudaGetLastError();
          fail_dist(who(), ": nccl wait for ", p.op, " #", p.id, " failed: CUDA error ", cudaGetErrorName(e), " (",
               cudaGetErrorString(e), ")");
        }
      }
      break;
    }
  }

  void barrier() override {
    const char* op = "barrier";
    std::lock_guard<std::mutex> lk(comm_mu_);
    double* slot = static_cast<double*>(dev_) + 1;
    enter(op);
    after_compute(op);
    cuda_check(op, cudaMemsetAsync(slot, 0, sizeof(double), cstream_));  // the value is not used; keep it finite
    run(op, [&] { return ncclAllReduce(slot, slot, 1, ncclFloat64, ncclSum, comm_, cstream_); });
    wait_stream(op);
  }

  double all_reduce_sum(double value) override {
    const char* op = "all_reduce_sum";
    std::lock_guard<std::mutex> lk(comm_mu_);
    double* sum = static_cast<double*>(dev_);
    enter(op);
    after_compute(op);
    *host_ = value;
    cuda_check(op, cudaMemcpyAsync(sum, host_, sizeof(double), cudaMemcpyHostToDevice, cstream_));
    run(op, [&] { return ncclAllReduce(sum, sum, 1, ncclFloat64, ncclSum, comm_, cstream_); });
    cuda_check(op, cudaMemcpyAsync(host_, sum, sizeof(double), cudaMemcpyDeviceToHost, cstream_));
    wait_stream(op);
    return *host_;
  }

 private:
  struct Pending {
    uint64_t id;
    const char* op;
    cudaEvent_t done;
    Clock::time_point since;  // enqueued, or when the one before it completed
  };

  void init(TcpStore& store) {
    const char* op = "init";
    cuda_check(op, cudaSetDevice(device_));
    int least = 0, greatest = 0;
    cuda_check(op, cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cuda_check(op, cudaStreamCreateWithPriority(&cstream_, cudaStreamNonBlocking, greatest));
    cuda_check(op, cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    // Scratch for barrier and all_reduce_sum, kept for the comm's life so those two
    // allocate nothing per call: [0] the sum, [1] the barrier's dummy.
    cuda_check(op, cudaMalloc(&dev_, 2 * sizeof(double)));
    cuda_check(op, cudaMallocHost(&host_, sizeof(double)));

    // Rank 0 makes the id (its bootstrap root listens for the others) and publishes
    // it; the rest wait for it, bounded by the timeout.
    ncclUniqueId id{};
    const std::string key = prefix_ + "/nccl_id";
    if (rank_ == 0) {
      check(op, ncclGetUniqueId(&id));
      try {
        store.set(key, std::vector<char>(id.internal, id.internal + sizeof id.internal));
      } catch (const Error& e) {
        fail_dist(who(), ": nccl init failed: cannot publish the NCCL id of group '", prefix_, "': ", e.what());
      }
    } else {
      std::vector<char> v;
      try {
        store.wait({key}, std::chrono::duration_cast<std::chrono::milliseconds>(timeout_));
        v = store.get(key);
      } catch (const Error& e) {
        fail_dist(who(), ": nccl init failed: no NCCL id from rank 0 of group '", prefix_, "': ", e.what());
      }
      ST_CHECK_DIST(v.size() == sizeof id.internal, who(), ": nccl init failed: the id under '", key, "' has ", v.size(),
               " bytes, expected ", sizeof id.internal);
      std::memcpy(id.internal, v.data(), sizeof id.internal);
    }

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;               // so that a set-up that never completes can be aborted
    config.commName = prefix_.c_str();  // shows in NCCL's own logs (NCCL_DEBUG=INFO)
    const auto deadline = Clock::now() + timeout_;
    const ncclResult_t r = ncclCommInitRankConfig(&comm_, world_, id, rank_, &config);
    settle(op, r, deadline,
           "setting up the communicator of " + std::to_string(world_) +
               " rank(s) (a peer may not have reached it, or the ranks cannot reach each other)");
  }

  // Device resources; the stream and events only once nothing can still use them
  // (CUDA releases them when the work queued on them is done).
  void release() noexcept {
    if (dev_) (void)cudaFree(dev_);
    if (host_) (void)cudaFreeHost(host_);
    dev_ = nullptr;
    host_ = nullptr;
    for (const Pending& p : pending_) (void)cudaEventDestroy(p.done);
    for (cudaEvent_t e : spare_events_) (void)cudaEventDestroy(e);
    pending_.clear();
    spare_events_.clear();
    if (ready_) (void)cudaEventDestroy(ready_);
    if (cstream_) (void)cudaStreamDestroy(cstream_);
    ready_ = nullptr;
    cstream_ = nullptr;
  }

  std::string who() const {
    std::ostringstream os;
    os << "rank " << global_rank_;
    if (prefix_ != "world") os << " (" << rank_ << " of " << world_ << " in group '" << prefix_ << "')";
    return os.str();
  }

  // NCCL's name for a result, plus its last error message where it has one.
  std::string reason(ncclResult_t r) const {
    std::string s = ncclGetErrorString(r);
    const char* last = ncclGetLastError(comm_);
    if (last && *last) s += std::string(": ") + last;
    return s;
  }

  // Aborts the communicator (the other ranks' collectives then fail or time out
  // instead of waiting for this one forever) and throws. Called with comm_mu_ held.
  [[noreturn]] void fail_op(const char* op, const std::string& why) {
    if (comm_) {
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    std::ostringstream os;
    os << who() << ": nccl " << op << " failed: " << why;
    error_ = os.str();
    throw Error(error_, ErrorKind::Distributed);
  }

  void cuda_check(const char* op, cudaError_t e) {
    if (e == cudaSuccess) return;
    (void)cudaGetLastError();  // a non-sticky error must not be reported again by the next call
    fail_op(op, std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }

  void check(const char* op, ncclResult_t r) {
    if (r != ncclSuccess) fail_op(op, reason(r));
  }

  void usable(const char* op) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!watchdog_error_.empty()) throw Error(watchdog_error_, ErrorKind::Distributed);
    }
    if (!comm_ && !error_.empty())
      fail_dist(who(), ": nccl ", op, " failed: the communicator was aborted after an earlier failure (", error_, ")");
    ST_CHECK_DIST(comm_ != nullptr, who(), ": nccl ", op, " failed: no communicator");
  }

  // Before touching the device for an operation: the comm is alive and its GPU is
  // the current one (a process may drive several).
  void enter(const char* op) {
    usable(op);
    cuda_check(op, cudaSetDevice(device_));
  }

  // The communication stream waits for everything enqueued on the compute stream so
  // far. (One event serves every call: a wait takes the event's state when it is
  // enqueued, so re-recording it afterwards does not disturb it.)
  void after_compute(const char* op) {
    cuda_check(op, cudaEventRecord(ready_, stream_));
    cuda_check(op, cudaStreamWaitEvent(cstream_, ready_, 0));
  }

  // Short waits first (a collective of a few bytes finishes in microseconds), then
  // sleeps, so a long wait does not burn a core.
  static void pause(int spins) {
    if (spins < 200)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }

  // An error NCCL found in the background (a peer's connection dropped, ...) since
  // the last call.
  void check_async(const char* op) {
    ncclResult_t state = ncclSuccess;
    check(op, ncclCommGetAsyncError(comm_, &state));
    if (state != ncclSuccess && state != ncclInProgress) fail_op(op, reason(state));
  }

  // After a call on the non-blocking comm: an error is thrown; ncclInProgress is
  // waited out until `deadline` (then the comm is aborted).
  void settle(const char* op, ncclResult_t r, Clock::time_point deadline, const std::string& what) {
    if (r != ncclSuccess && r != ncclInProgress) fail_op(op, reason(r));
    if (!comm_) fail_op(op, reason(r) + " (no communicator was created)");
    for (int spins = 0; r == ncclInProgress; ++spins) {
      if (Clock::now() > deadline)
        fail_op(op, "timed out after " + seconds_text(timeout_s_) + " " + what + "; communicator aborted");
      pause(spins);
      check(op, ncclCommGetAsyncError(comm_, &r));
    }
    if (r != ncclSuccess) fail_op(op, reason(r));
  }

  // One NCCL call: enqueue on the communication stream, bounded wait for the enqueue
  // to finish. Called with comm_mu_ held, after enter().
  template <class F>
  void run(const char* op, F&& call) {
    check_async(op);
    const auto deadline = Clock::now() + timeout_;
    const ncclResult_t r = call();
    settle(op, r, deadline, "enqueueing it (a peer may have exited or stalled)");
  }

  // An asynchronous collective: ordered after the compute so far, enqueued, its
  // completion event recorded and handed to the watchdog.
  template <class F>
  CommWork launch(const char* op, F&& call) {
    std::lock_guard<std::mutex> lk(comm_mu_);
    enter(op);
    after_compute(op);
    run(op, call);
    cudaEvent_t done = nullptr;
    {
      std::lock_guard<std::mutex> q(mu_);
      if (!spare_events_.empty()) {
        done = spare_events_.back();
        spare_events_.pop_back();
      }
    }
    if (!done) cuda_check(op, cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    if (const cudaError_t e = cudaEventRecord(done, cstream_); e != cudaSuccess) {
      (void)cudaEventDestroy(done);
      cuda_check(op, e);
    }
    CommWork w;
    {
      std::lock_guard<std::mutex> q(mu_);
      w.id = ++next_id_;
      pending_.push_back({w.id, op, done, Clock::now()});
    }
    cv_.notify_all();
    return w;
  }

  // Waits until the communication stream has run everything enqueued so far (this
  // op, the collectives and the compute before it), watching for NCCL errors, for at
  // most the timeout. Called with comm_mu_ held.
  void wait_stream(const char* op) {
    const auto deadline = Clock::now() + timeout_;
    for (int spins = 0;; ++spins) {
      const cudaError_t e = cudaStreamQuery(cstream_);
      if (e == cudaSuccess) break;
      if (e != cudaErrorNotReady) cuda_check(op, e);
      check_async(op);
      if (Clock::now() > deadline)
        fail_op(op, "timed out after " + seconds_text(timeout_s_) +
                        " waiting for the collective to complete (a peer may have exited, stalled, or be "
                        "issuing different collectives); communicator aborted");
      pause(spins);
    }
    check_async(op);
  }

  // The watchdog thread: retires completed operations oldest first and aborts the
  // communicator when the oldest has been waiting for longer than the timeout.
  void watch() {
    (void)cudaSetDevice(device_);
    const auto poll = std::chrono::milliseconds(20);
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      if (pending_.empty() || !watchdog_error_.empty()) {
        cv_.wait(lk, [&] { return stop_ || (!pending_.empty() && watchdog_error_.empty()); });
        continue;
      }
      Pending& front = pending_.front();
      const cudaError_t e = cudaEventQuery(front.done);
      if (e == cudaSuccess) {
        spare_events_.push_back(front.done);
        pending_.pop_front();
        if (!pending_.empty()) pending_.front().since = std::max(pending_.front().since, Clock::now());
        continue;
      }
      std::string why;
      if (e != cudaErrorNotReady) {
        (void)cudaGetLastError();
        why = std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
      } else if (Clock::now() - front.since > timeout_) {
        why = "did not complete within " + seconds_text(timeout_s_) +
              " (a peer may have exited, stalled, or be issuing different collectives)";
      }
      if (why.empty()) {
        cv_.wait_for(lk, poll, [&] { return stop_; });
        continue;
      }
      std::ostringstream os;
      os << who() << ": nccl " << front.op << " #" << front.id << " " << why << "; communicator aborted";
      watchdog_error_ = os.str();
      std::fprintf(stderr, "%s\n", watchdog_error_.c_str());
      std::fflush(stderr);
      // Abort without holding mu_: a caller holding comm_mu_ may be waiting for mu_.
      lk.unlock();
      {
        std::lock_guard<std::mutex> c(comm_mu_);
        if (comm_) {
          (void)ncclCommAbort(comm_);  // NCCL's kernels give up, so the streams drain
          comm_ = nullptr;
        }
      }
      lk.lock();
    }
  }

  void same_dtype(const char* op, Tensor a, Tensor b) const {
    ST_CHECK_DIST(a.dtype == b.dtype, who(), ": nccl ", op, " with mismatched dtypes ", dtype_name(a.dtype), " and ",
             dtype_name(b.dtype));
  }
  void fits(const char* op, Tensor t, size_t n, const char* name) const {
    ST_CHECK_DIST(t.numel >= n && (n == 0 || t.data), who(), ": nccl ", op, " needs ", n, " elements in ", name,
             ", it has ", t.numel);
  }

  std::string prefix_;
  int global_rank_, rank_, world_;
  double timeout_s_;
  Clock::duration timeout_;
  cudaStream_t stream_;              // the backend's compute stream
  cudaStream_t cstream_ = nullptr;   // this communicator's stream
  cudaEvent_t ready_ = nullptr;      // "compute so far", recorded before each collective
  int device_;
  std::mutex comm_mu_;               // comm_ and the NCCL calls on it
  ncclComm_t comm_ = nullptr;
  void* dev_ = nullptr;     // 2 doubles on the device
  double* host_ = nullptr;  // 1 pinned double: all_reduce_sum's way in and out
  std::string error_;       // the failure that aborted the comm

  std::mutex mu_;                    // the fields below
  std::condition_variable cv_;
  std::deque<Pending> pending_;      // in flight, oldest first
  std::vector<cudaEvent_t> spare_events_;
  uint64_t next_id_ = 0;
  std::string watchdog_error_;
  bool stop_ = false;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Comm> make_nccl_comm(TcpStore& store, const std::string& prefix, int rank, int world,
                                     double timeout_s, Backend& backend, int global_rank) {
  const int who = global_rank < 0 ? rank : global_rank;
  ST_CHECK_DIST(world >= 1 && rank >= 0 && rank < world, "rank ", who, ": nccl group '", prefix, "': rank ", rank,
           " outside a group of ", world);
  ST_CHECK_DIST(timeout_s > 0, "rank ", who, ": nccl group '", prefix, "': timeout must be positive, got ", timeout_s);
  ST_CHECK_DIST(backend.device() == Device::CUDA && backend.native_stream() != nullptr, "rank ", who,
           ": the NCCL comm needs the CUDA backend, got ", backend.name());
  // A workplace rule: NVLink multicast (NVLS) stays off unless the environment says
  // otherwise. NCCL reads its variables once, at its first call, so this comes first.
  ::setenv("NCCL_NVLS_ENABLE", "0", 0);
  auto stream = static_cast<cudaStream_t>(backend.native_stream());
  int device = 0;
  if (const cudaError_t e = cudaStreamGetDevice(stream, &device); e != cudaSuccess) {
    (void)cudaGetLastError();
    fail_dist("rank ", who, ": nccl init failed: cannot tell the backend stream's device: ", cudaGetErrorName(e), " (",
         cudaGetErrorString(e), ")");
  }
  return std::make_unique<NcclComm>(store, prefix, rank, world, timeout_s, stream, device, global_rank);
}

}  // namespace st

#else  // no CUDA in this build

namespace st {

std::unique_ptr<Comm> make_nccl_comm(TcpStore&, const std::string& prefix, int rank, int, double, Backend&, int) {
  fail_dist("rank ", rank, ": nccl group '", prefix, "': this build has no CUDA (nvcc was not found at configure time)");
}

}  // namespace st

#endif
