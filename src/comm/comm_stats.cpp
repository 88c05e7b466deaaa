#include "comm/comm_stats.h"

#include <chrono>

#include "backend/backend.h"
#include "core/error.h"

namespace st {

uint64_t CommCounts::total_bytes() const {
  uint64_t t = 0;
  for (uint64_t b : bytes) t += b;
  return t;
}

CommCounts CommCounts::operator-(const CommCounts& e) const {
  CommCounts d;
  for (int k = 0; k < kCollectiveKinds; ++k) d.bytes[k] = bytes[k] - e.bytes[k];
  d.inter_node_bytes = inter_node_bytes - e.inter_node_bytes;
  d.calls = calls - e.calls;
  d.blocked_s = blocked_s - e.blocked_s;
  return d;
}

void CommStats::add(CollectiveKind kind, uint64_t bytes, bool inter_node, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  counts_.bytes[static_cast<int>(kind)] += bytes;
  if (inter_node) counts_.inter_node_bytes += bytes;
  counts_.calls += 1;
  counts_.blocked_s += seconds;
}

void CommStats::add_time(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  counts_.blocked_s += seconds;
}

CommCounts CommStats::snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

class CountingComm final : public Comm {
 public:
  CountingComm(std::unique_ptr<Comm> inner, std::shared_ptr<CommStats> stats, std::vector<int> members,
               int ranks_per_node)
      : inner_(std::move(inner)), stats_(std::move(stats)), members_(std::move(members)) {
    const int n = inner_->world(), r = inner_->rank();
    ST_CHECK(static_cast<int>(members_.size()) == n, "counting comm: ", members_.size(), " members for a group of ", n);
    const int per_node = ranks_per_node > 0 ? ranks_per_node : 1;
    const int node = members_[r] / per_node;
    successor_off_node_ = n > 1 && members_[(r + 1) % n] / per_node != node;
    for (int m : members_) others_off_node_ += m / per_node != node;
  }

  int rank() const override { return inner_->rank(); }
  int world() const override { return inner_->world(); }

  void all_gather(Tensor recv, Tensor send, size_t count) override {
    timed(CollectiveKind::AllGather, ring(count, send.dtype), [&] { inner_->all_gather(recv, send, count); });
  }
  void reduce_scatter(Tensor recv, Tensor send, size_t count) override {
    timed(CollectiveKind::ReduceScatter, ring(count, send.dtype), [&] { inner_->reduce_scatter(recv, send, count); });
  }
  void all_reduce(Tensor buf, size_t count) override {
    timed(CollectiveKind::AllReduce, ring_all_reduce(count * dtype_size(buf.dtype)), [&] { inner_->all_reduce(buf, count); });
  }
  void all_reduce_max(Tensor buf, size_t count) override {
    timed(CollectiveKind::AllReduce, ring_all_reduce(count * dtype_size(buf.dtype)),
          [&] { inner_->all_reduce_max(buf, count); });
  }
  void broadcast(Tensor buf, size_t count, int root) override {
    const uint64_t bytes = rank() == root ? static_cast<uint64_t>(world() - 1) * count * dtype_size(buf.dtype) : 0;
    const auto t0 = std::chrono::steady_clock::now();
    inner_->broadcast(buf, count, root);
    // The root sends to every other member; the part that leaves the node is counted as such.
    const uint64_t off = rank() == root && world() > 1 ? bytes / (world() - 1) * others_off_node_ : 0;
    stats_->add(CollectiveKind::Broadcast, bytes - off, false, seconds_since(t0));
    if (off) stats_->add(CollectiveKind::Broadcast, off, true, 0);
  }
  // A ring of unequal chunks: each rank passes on every chunk but the one whose ring
  // ends at it (its successor's), as the all-gather ring does with equal ones.
  void all_gather_v(Tensor recv, const std::vector<size_t>& counts) override {
    timed(CollectiveKind::AllGather, ring_v(counts, recv.dtype), [&] { inner_->all_gather_v(recv, counts); });
  }
  CommWork all_gather_v_async(Tensor recv, const std::vector<size_t>& counts) override {
    CommWork w;
    timed(CollectiveKind::AllGather, ring_v(counts, recv.dtype), [&] { w = inner_->all_gather_v_async(recv, counts); });
    return w;
  }
  void barrier() override {
    const auto t0 = std::chrono::steady_clock::now();
    inner_->barrier();
    stats_->add_time(seconds_since(t0));
  }
  double all_reduce_sum(double value) override {
    double out = 0;
    timed(CollectiveKind::AllReduce, ring_all_reduce(sizeof(double)), [&] { out = inner_->all_reduce_sum(value); });
    return out;
  }

  CommWork all_gather_async(Tensor recv, Tensor send, size_t count) override {
    CommWork w;
    timed(CollectiveKind::AllGather, ring(count, send.dtype), [&] { w = inner_->all_gather_async(recv, send, count); });
    return w;
  }
  CommWork reduce_scatter_async(Tensor recv, Tensor send, size_t count) override {
    CommWork w;
    timed(CollectiveKind::ReduceScatter, ring(count, send.dtype),
          [&] { w = inner_->reduce_scatter_async(recv, send, count); });
    return w;
  }
  CommWork all_reduce_async(Tensor buf, size_t count) override {
    CommWork w;
    timed(CollectiveKind::AllReduce, ring_all_reduce(count * dtype_size(buf.dtype)),
          [&] { w = inner_->all_reduce_async(buf, count); });
    return w;
  }
  void wait(CommWork w) override {
    const auto t0 = std::chrono::steady_clock::now();
    inner_->wait(w);
    stats_->add_time(seconds_since(t0));
  }

 private:
  // (N-1) chunks of `count` elements to the successor.
  uint64_t ring(size_t count, DType dt) const {
    return static_cast<uint64_t>(world() - 1) * count * dtype_size(dt);
  }
  uint64_t ring_v(const std::vector<size_t>& counts, DType dt) const {
    const int n = world();
    if (n <= 1 || static_cast<int>(counts.size()) != n) return 0;
    uint64_t total = 0;
    for (size_t c : counts) total += c;
    return (total - counts[(rank() + 1) % n]) * dtype_size(dt);
  }
  // 2(N-1) chunks of bytes/N: the reduce-scatter half, then the all-gather half.
  uint64_t ring_all_reduce(uint64_t bytes) const {
    const uint64_t n = static_cast<uint64_t>(world());
    return n <= 1 ? 0 : 2 * (n - 1) * bytes / n;
  }
  template <class F>
  void timed(CollectiveKind kind, uint64_t bytes, F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    stats_->add(kind, bytes, successor_off_node_, seconds_since(t0));
  }

  std::unique_ptr<Comm> inner_;
  std::shared_ptr<CommStats> stats_;
  std::vector<int> members_;
  bool successor_off_node_ = false;
  int others_off_node_ = 0;
};

}  // namespace

std::unique_ptr<Comm> make_counting_comm(std::unique_ptr<Comm> inner, std::shared_ptr<CommStats> stats,
                                         std::vector<int> members, int ranks_per_node) {
  return std::make_unique<CountingComm>(std::move(inner), std::move(stats), std::move(members), ranks_per_node);
}

}  // namespace st
