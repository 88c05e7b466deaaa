// The rendezvous store: a one-thread poll() server on rank 0 and a blocking client
// on every rank. The protocol is length-prefixed frames of little-endian fields:
//   request  = u32 length | u8 op | fields      reply = u32 length | u8 status | fields
// Waiting (get, wait) happens on the server: a request that cannot be answered yet
// is parked with a deadline and answered when its keys appear or the deadline
// passes, so every request gets exactly one reply and a client's timeout never
// leaves a stale reply on the connection. Keys this file writes itself live under
// "st/" (joined ranks, barriers); Gloo's keys live under each group's prefix.
// Joining (tcp_store.h): challenge (the server's nonce), then hello (rank, world, job
// id, HMAC); until a hello is accepted the server answers nothing else and drops the
// connection on any other request.
#include "comm/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <sstream>
#include <string_view>
#include <thread>
#include <utility>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "comm/store_listen.h"
#include "core/error.h"
#include "core/log.h"

namespace st {
namespace {

using Clock = std::chrono::steady_clock;

enum Op : uint8_t { kHello = 1, kSet, kGet, kAdd, kWait, kCheck, kChallenge };
enum Status : uint8_t { kOk = 0, kTimeout = 1, kError = 2 };
// Larger frames are not ours (a port scanner, an HTTP probe): drop the connection.
// The store holds addresses, ids and short reports; 64 MiB is far above any of them.
constexpr uint32_t kMaxFrame = 64u << 20;
// Before its hello is accepted a connection may send this much, stay this long, and
// only this many such connections are held (more are closed at once).
constexpr uint32_t kMaxHelloFrame = 4096;
constexpr double kHelloWithinS = 10;
constexpr size_t kMaxUnjoined = 64;
constexpr size_t kNonceBytes = 32;
// How long past its own timeout a client waits for the server's answer to a wait.
constexpr double kReplySlackS = 10;

struct ProtocolError {};

struct Writer {
  std::string s;
  Writer& u8(uint8_t v) { s.push_back(static_cast<char>(v)); return *this; }
  Writer& u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) s.push_back(static_cast<char>(v >> (8 * i)));
    return *this;
  }
  Writer& i64(int64_t v) {
    for (int i = 0; i < 8; ++i) s.push_back(static_cast<char>(static_cast<uint64_t>(v) >> (8 * i)));
    return *this;
  }
  Writer& str(std::string_view v) { u32(static_cast<uint32_t>(v.size())); s.append(v); return *this; }
  Writer& strs(const std::vector<std::string>& v) {
    u32(static_cast<uint32_t>(v.size()));
    for (const auto& x : v) str(x);
    return *this;
  }
  std::string frame() const { return Writer().u32(static_cast<uint32_t>(s.size())).s + s; }
};

struct Reader {
  std::string_view in;
  void need(size_t n) const {
    if (in.size() < n) throw ProtocolError{};
  }
  uint8_t u8() { need(1); uint8_t v = static_cast<uint8_t>(in[0]); in.remove_prefix(1); return v; }
  uint32_t u32() {
    need(4);
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(in[i])) << (8 * i);
    in.remove_prefix(4);
    return v;
  }
  int64_t i64() {
    need(8);
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(in[i])) << (8 * i);
    in.remove_prefix(8);
    return static_cast<int64_t>(v);
  }
  std::string str() {
    const uint32_t n = u32();
    need(n);
    std::string v(in.substr(0, n));
    in.remove_prefix(n);
    return v;
  }
  std::vector<std::string> strs() {
    const uint32_t n = u32();
    if (n > in.size()) throw ProtocolError{};  // each string takes at least 4 bytes
    std::vector<std::string> v;
    for (uint32_t i = 0; i < n; ++i) v.push_back(str());
    return v;
  }
};

std::string errno_text(int e) {
  std::string s = std::strerror(e);
  if (!s.empty()) s[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(s[0])));
  return s;
}

std::string seconds_text(double s) {
  std::ostringstream os;
  os << s << " s";
  return os.str();
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

int ms_until(Clock::time_point deadline) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(ms, 0, 1 << 30));
}

// Sends all of `data`, waiting for room while the socket is full. False on a
// closed connection or when the deadline passes.
bool send_all(int fd, std::string_view data, Clock::time_point deadline) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, ms_until(deadline)) <= 0) return false;
    } else {
      return false;
    }
  }
  return true;
}

enum class RecvResult { kOk, kTimeout, kClosed };

RecvResult recv_exact(int fd, char* out, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, ms_until(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) return RecvResult::kTimeout;
    if (ready < 0) return RecvResult::kClosed;
    const ssize_t got = ::recv(fd, out, n, 0);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) return RecvResult::kClosed;
    out += got;
    n -= static_cast<size_t>(got);
  }
  return RecvResult::kOk;
}

std::string joined_key(int rank) { return "st/joined/" + std::to_string(rank); }

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1)
    fail_dist("rendezvous: the system's random generator failed (OpenSSL RAND_bytes)");
  return out;
}

// What a hello proves: HMAC-SHA256 under the job secret of the server's nonce and the
// hello's own fields, so a hello is good for one connection, one rank and one job.
std::string hello_mac(const std::string& secret, const std::string& nonce, int64_t rank, int64_t world,
                      const std::string& job) {
  std::string msg = std::string("shardtrain-rendezvous-v1", 24) + '\0' + nonce;
  msg += Writer().i64(rank).i64(world).str(job).s;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
            reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac, &len))
    fail_dist("rendezvous: HMAC-SHA256 failed (OpenSSL)");
  return std::string(reinterpret_cast<const char*>(mac), len);
}

}  // namespace

// ---- server ------------------------------------------------------------------------

class TcpStoreServer {
 public:
  // Listens on `listen_fds` (store_listen.h), which it closes.
  TcpStoreServer(std::vector<int> listen_fds, int world, std::string job_id, std::string secret)
      : world_(world), job_id_(std::move(job_id)), secret_(std::move(secret)), listen_fds_(std::move(listen_fds)) {
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
      for (int fd : listen_fds_) ::close(fd);
      fail_dist("rank 0: cannot create the rendezvous server's wake-up pipe: ", errno_text(errno));
    }
    thread_ = std::thread([this] { run(); });
  }

  ~TcpStoreServer() {
    stop_ = true;
    const char c = 0;
    [[maybe_unused]] ssize_t n = ::write(wake_[1], &c, 1);
    thread_.join();
    for (auto& [fd, client] : clients_) ::close(fd);
    for (int fd : listen_fds_) ::close(fd);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }

  // "127.0.0.1:29500", ...: where it listens.
  std::vector<std::string> listening() const {
    std::vector<std::string> out;
    for (int fd : listen_fds_) out.push_back(bound_address(fd));
    return out;
  }

  // Blocks until no client is connected or grace_s has passed.
  void wait_for_clients_to_leave(double grace_s) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(grace_s), [this] { return connected_ == 0; });
  }

 private:
  struct Client {
    std::string in;
    int rank = -1;        // set by an accepted hello: until then nothing is served
    std::string nonce;    // the challenge given to this connection ("" once used)
    Clock::time_point hello_by;
  };
  struct Pending {  // a get or wait that cannot be answered yet
    int fd;
    bool is_get;
    std::vector<std::string> keys;
    Clock::time_point deadline;
  };

  void run() {
    std::vector<pollfd> fds;
    while (!stop_) {
      fds.assign({{wake_[0], POLLIN, 0}});
      for (int fd : listen_fds_) fds.push_back({fd, POLLIN, 0});
      for (const auto& [fd, client] : clients_) fds.push_back({fd, POLLIN, 0});
      int timeout_ms = -1;
      auto until = [&](Clock::time_point t) {
        const int ms = ms_until(t);
        timeout_ms = timeout_ms < 0 ? ms : std::min(timeout_ms, ms);
      };
      for (const Pending& p : pending_) until(p.deadline);
      for (const auto& [fd, c] : clients_)
        if (c.rank < 0) until(c.hello_by);
      if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) break;
      if (fds[0].revents) {
        char buf[64];
        while (::read(wake_[0], buf, sizeof buf) > 0) {
        }
      }
      const size_t first_client = 1 + listen_fds_.size();
      for (size_t i = 1; i < first_client; ++i)
        if (fds[i].revents & POLLIN) accept_all(fds[i].fd);
      for (size_t i = first_client; i < fds.size(); ++i)
        if (fds[i].revents) on_readable(fds[i].fd);
      expire();
    }
  }

  void accept_all(int listen_fd) {
    while (true) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        // Out of descriptors: back off instead of spinning on a readable listener.
        if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return;  // EAGAIN: no more; anything else: that client gave up already
      }
      size_t unjoined = 0;
      for (const auto& [other, c] : clients_) unjoined += c.rank < 0;
      if (unjoined >= kMaxUnjoined) {  // a flood of connections that never say hello
        ::close(fd);
        continue;
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      Client c;
      c.hello_by = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(kHelloWithinS));
      clients_[fd] = c;
      std::lock_guard<std::mutex> lock(mu_);
      ++connected_;
    }
  }

  void drop(int fd) {
    ::close(fd);
    clients_.erase(fd);
    std::erase_if(pending_, [fd](const Pending& p) { return p.fd == fd; });
    std::lock_guard<std::mutex> lock(mu_);
    --connected_;
    cv_.notify_all();
  }

  void on_readable(int fd) {
    auto it = clients_.find(fd);
    if (it == clients_.end()) return;
    std::string& in = it->second.in;
    char buf[1 << 16];
    while (true) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n > 0) {
        in.append(buf, static_cast<size_t>(n));
        if (static_cast<size_t>(n) < sizeof buf) break;
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        break;
      } else {
        drop(fd);  // closed by the client, or reset
        return;
      }
    }
    while (in.size() >= 4) {
      const uint32_t len = Reader{in}.u32();
      if (len > (it->second.rank >= 0 ? kMaxFrame : kMaxHelloFrame)) return drop(fd);
      if (in.size() < 4 + static_cast<size_t>(len)) return;
      const std::string body = in.substr(4, len);
      in.erase(0, 4 + static_cast<size_t>(len));
      bool ok;
      try {
        ok = handle(fd, Reader{body});
      } catch (const ProtocolError&) {
        ok = false;
      }
      if (!ok) return drop(fd);
      // `in` may be gone if handling dropped this client; look it up again.
      if (!clients_.count(fd)) return;
    }
  }

  bool reply(int fd, const Writer& w) {
    // A client that stops reading for this long is stuck or gone.
    return send_all(fd, w.frame(), Clock::now() + std::chrono::seconds(10));
  }

  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& k : keys)
      if (!kv_.count(k)) out.push_back(k);
    return out;
  }

  // Stores a value and answers the parked requests it completes.
  void store(const std::string& key, std::string value) {
    kv_[key] = std::move(value);
    std::vector<Pending> ready;
    std::erase_if(pending_, [&](Pending& p) {
      if (!missing(p.keys).empty()) return false;
      ready.push_back(std::move(p));
      return true;
    });
    for (const Pending& p : ready) answer(p);
  }

  void answer(const Pending& p) {
    Writer w;
    w.u8(kOk);
    if (p.is_get) w.str(kv_.at(p.keys[0]));
    if (!reply(p.fd, w)) drop(p.fd);
  }

  void expire() {
    const auto now = Clock::now();
    std::vector<Pending> late;
    std::erase_if(pending_, [&](Pending& p) {
      if (p.deadline > now) return false;
      late.push_back(std::move(p));
      return true;
    });
    for (const Pending& p : late)
      if (clients_.count(p.fd) && !reply(p.fd, Writer().u8(kTimeout).strs(missing(p.keys)))) drop(p.fd);
    std::vector<int> silent;
    for (const auto& [fd, c] : clients_)
      if (c.rank < 0 && c.hello_by <= now) silent.push_back(fd);
    for (int fd : silent) drop(fd);
  }

  // Handles one request; false drops the client (malformed request, dead socket).
  bool handle(int fd, Reader r) {
    const uint8_t op = r.u8();
    Client& client = clients_.at(fd);
    // Nothing is served before an accepted hello: anything else drops the connection.
    if (client.rank < 0 && op != kChallenge && op != kHello) return false;
    switch (op) {
      case kChallenge: {
        if (client.rank >= 0) return false;
        client.nonce = random_bytes(kNonceBytes);
        return reply(fd, Writer().u8(kOk).u8(secret_.empty() ? 0 : 1).str(client.nonce));
      }
      case kHello: {
        if (client.rank >= 0 || client.nonce.empty()) return false;  // one hello per challenge
        const int64_t rank = r.i64(), world = r.i64();
        const std::string job = r.str(), mac = r.str();
        const std::string nonce = std::exchange(client.nonce, std::string());
        std::string err;
        // Another job's rank (two jobs started on one port) first: its world and rank
        // mean nothing here, and it must not take a place in this one. This job's id is
        // not told to it.
        if (job != job_id_) {
          err = job.empty() ? "rank " + std::to_string(rank) +
                                  " brought no job id but reached the rendezvous of a job that has one: "
                                  "every rank needs the same SHARDTRAIN_JOB_ID (launch --job-id)"
                            : "rank " + std::to_string(rank) + " of job '" + job +
                                  "' reached the rendezvous of another job: two jobs use this MASTER_PORT; give "
                                  "each its own port";
        } else if (!secret_.empty() && mac.empty()) {
          err = "rank " + std::to_string(rank) +
                " brought no job secret, but this job's rendezvous requires one: start every rank with the same "
                "SHARDTRAIN_JOB_SECRET (launch --secret-file)";
        } else if (!secret_.empty() &&
                   (mac.size() != 32 ||
                    CRYPTO_memcmp(mac.data(), hello_mac(secret_, nonce, rank, world, job).data(), 32) != 0)) {
          err = "rank " + std::to_string(rank) +
                " does not hold this job's secret: every rank needs the same SHARDTRAIN_JOB_SECRET";
        } else if (world != world_) {
          err = "rank " + std::to_string(rank) + " was started for a world of " + std::to_string(world) +
                " ranks but rank 0 for " + std::to_string(world_) + ": the ranks disagree on WORLD_SIZE";
        } else if (rank < 0 || rank >= world_) {
          err = "rank " + std::to_string(rank) + " is outside the world of " + std::to_string(world_);
        } else {
          for (const auto& [other, c] : clients_)
            if (other != fd && c.rank == rank)
              err = "two processes joined as rank " + std::to_string(rank) +
                    ": each rank needs its own RANK (or launcher rank variable)";
        }
        if (!err.empty()) return reply(fd, Writer().u8(kError).str(err));
        client.rank = static_cast<int>(rank);
        if (!reply(fd, Writer().u8(kOk))) return false;
        store(joined_key(static_cast<int>(rank)), "1");
        return true;
      }
      case kSet: {
        std::string key = r.str(), value = r.str();
        if (!reply(fd, Writer().u8(kOk))) return false;
        store(key, std::move(value));
        return true;
      }
      case kGet:
      case kWait: {
        Pending p;
        p.fd = fd;
        p.is_get = op == kGet;
        p.keys = p.is_get ? std::vector<std::string>{r.str()} : r.strs();
        p.deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(r.i64(), 0));
        if (missing(p.keys).empty()) {
          Writer w;
          w.u8(kOk);
          if (p.is_get) w.str(kv_.at(p.keys[0]));
          return reply(fd, w);
        }
        pending_.push_back(std::move(p));
        return true;
      }
      case kAdd: {
        const std::string key = r.str();
        const int64_t delta = r.i64();
        int64_t value = 0;
        if (auto it = kv_.find(key); it != kv_.end()) {
          const std::string& s = it->second;
          auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
          if (ec != std::errc() || end != s.data() + s.size())
            return reply(fd, Writer().u8(kError).str("key '" + key + "' does not hold an integer"));
        }
        value += delta;
        if (!reply(fd, Writer().u8(kOk).i64(value))) return false;
        store(key, std::to_string(value));
        return true;
      }
      case kCheck:
        return reply(fd, Writer().u8(kOk).strs(missing(r.strs())));
      default:
        return false;
    }
  }

  int world_;
  std::string job_id_, secret_;
  std::vector<int> listen_fds_;
  int wake_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<bool> stop_{false};
  // Server-thread state.
  std::map<std::string, std::string> kv_;
  std::map<int, Client> clients_;
  std::vector<Pending> pending_;
  // Shared with the destructor's grace wait.
  std::mutex mu_;
  std::condition_variable cv_;
  int connected_ = 0;
};

// ---- client -------------------------------------------------------------------------

struct TcpStore::Reply {
  uint8_t status;
  std::string body;
  Reader reader() const { return Reader{body}; }
};

namespace {

// One connection attempt to every address `addr` resolves to. Returns the socket,
// or -1 with `why` saying what went wrong (for the final error message).
int try_connect(const std::string& addr, int port, Clock::time_point deadline, std::string& why) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  // Not resolving yet is retried too: a Kubernetes service name appears in DNS
  // only once its pod is up.
  if (const int rc = ::getaddrinfo(addr.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    why = "cannot resolve '" + addr + "': " + ::gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      why = errno_text(errno);
      continue;
    }
    int err = 0;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        const int ready = ::poll(&p, 1, ms_until(deadline));
        socklen_t len = sizeof err;
        if (ready <= 0)
          err = ETIMEDOUT;
        else
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    if (err != 0) {
      why = errno_text(err);
      ::close(fd);
      fd = -1;
    }
  }
  ::freeaddrinfo(res);
  if (fd >= 0) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

std::string local_ip_of(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "127.0.0.1";
  char buf[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof buf);
  } else {
    const in6_addr& a = reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a))
      ::inet_ntop(AF_INET, &a.s6_addr[12], buf, sizeof buf);
    else
      ::inet_ntop(AF_INET6, &a, buf, sizeof buf);
  }
  return buf;
}

}  // namespace

std::string new_job_secret() {
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned char b : random_bytes(32)) {
    out.push_back(hex[b >> 4]);
    out.push_back(hex[b & 15]);
  }
  return out;
}

TcpStore::TcpStore(const std::string& addr, int port, int rank, int world, double timeout_s, const std::string& job_id,
                   const std::string& secret, const StoreBind& bind)
    : address_((addr.find(':') != std::string::npos ? "[" + addr + "]" : addr) + ":" + std::to_string(port)),
      rank_(rank),
      world_(world),
      timeout_s_(timeout_s) {
  ST_CHECK_DIST(port >= 1 && port <= 65535, "rendezvous port ", port, " is outside 1..65535");
  ST_CHECK_DIST(world >= 1 && rank >= 0 && rank < world, "rendezvous: rank ", rank, " outside a world of ", world);
  ST_CHECK_DIST(timeout_s > 0 && std::isfinite(timeout_s), "rendezvous timeout must be a positive number, got ",
                timeout_s);
  ST_CHECK_CONFIG(secret.empty() || secret.size() >= kMinJobSecretBytes, "SHARDTRAIN_JOB_SECRET is ",
                  secret.size(), " bytes; a job secret needs at least ", kMinJobSecretBytes,
                  " (e.g. 64 hex digits: head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')");
  if (rank == 0) {
    std::string warning;
    std::vector<int> fds = open_store_listeners(bind, addr, port, timeout_s, warning);
    if (!warning.empty()) log_warn(warning);
    server_ = std::make_unique<TcpStoreServer>(std::move(fds), world, job_id, secret);
  }

  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  std::string why = "no attempt";
  auto backoff = std::chrono::milliseconds(10);
  while ((fd_ = try_connect(addr, port, deadline, why)) < 0) {
    if (Clock::now() >= deadline) {
      if (rank == 0)
        fail_dist("rank 0: serving the rendezvous store on port ", port, " but cannot connect to it at ", address_,
             " after ", seconds_text(timeout_s), " (", why, "): MASTER_ADDR must name the host of rank 0");
      fail_dist("rank ", rank, ": cannot reach the rendezvous server at ", address_, " after ", seconds_text(timeout_s),
           " (", why, "): is rank 0 running and MASTER_ADDR/MASTER_PORT right?");
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - Clock::now()));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
  }
  local_ip_ = local_ip_of(fd_);
  try {
    const Reply c = request(Writer().u8(kChallenge).s, timeout_s_, "joining");
    if (c.status != kOk) fail_dist("rendezvous at ", address_, ": rank 0 refused rank ", rank, "'s connection");
    bool wants_secret = false;
    std::string nonce;
    try {
      Reader challenge = c.reader();
      wants_secret = challenge.u8() != 0;
      nonce = challenge.str();
    } catch (const ProtocolError&) {
      fail_dist("rendezvous at ", address_, ": rank 0's challenge is malformed (is another program on this port?)");
    }
    // A server that asks for no secret while this rank has one is not this job's rank 0
    // (or its ranks were started apart): the secret's promise would not hold.
    if (!secret.empty() && !wants_secret)
      fail_dist("rendezvous at ", address_, ": rank 0 serves its job without a job secret, but rank ", rank,
                " has one (SHARDTRAIN_JOB_SECRET): start every rank with the same secret");
    const std::string mac = secret.empty() ? std::string() : hello_mac(secret, nonce, rank, world, job_id);
    Reply r = request(Writer().u8(kHello).i64(rank).i64(world).str(job_id).str(mac).s, timeout_s_, "joining");
    if (r.status != kOk) fail_dist("rendezvous at ", address_, ": ", r.reader().str());
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

std::vector<std::string> TcpStore::listening() const {
  return server_ ? server_->listening() : std::vector<std::string>{};
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) ::close(fd_);
  // The other ranks may still be using the server (their last barrier reply, Gloo
  // connections of a group rank 0 is done with): wait for them, but not forever. While
  // an error unwinds this rank, wait 1 s at most: the job is ending and its error should
  // be printed now, not 10 s later when a lost peer never leaves; 1 s lets ranks that
  // failed at the same moment (a join barrier's timeout) read their own answer first.
  if (server_) server_->wait_for_clients_to_leave(std::min(timeout_s_, std::uncaught_exceptions() ? 1.0 : 10.0));
}

TcpStore::Reply TcpStore::request(const std::string& body, double wait_s, const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0)
    fail_dist("rank ", rank_, ": no connection to the rendezvous server at ", address_, " (an earlier request failed)");
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait_s));
  const auto lost = [&](const char* how) {
    // The connection is out of step with the protocol now; nothing more can use it.
    ::close(fd_);
    fd_ = -1;
    fail_dist("rank ", rank_, ": ", how, " the rendezvous server at ", address_, " while ", what,
         " (rank 0 may have exited)");
  };
  if (!send_all(fd_, Writer{body}.frame(), deadline)) lost("lost the connection to");
  char header[4];
  RecvResult rr = recv_exact(fd_, header, 4, deadline);
  Reply reply{};
  if (rr == RecvResult::kOk) {
    const uint32_t len = Reader{std::string_view(header, 4)}.u32();
    if (len == 0 || len > kMaxFrame) lost("got a malformed reply from");
    std::string frame(len, '\0');
    rr = recv_exact(fd_, frame.data(), len, deadline);
    reply.status = static_cast<uint8_t>(frame[0]);
    reply.body = frame.substr(1);
  }
  if (rr == RecvResult::kTimeout) lost("got no answer in time from");
  if (rr == RecvResult::kClosed) lost("lost the connection to");
  return reply;
}

void TcpStore::set(const std::string& key, const std::vector<char>& value) {
  request(Writer().u8(kSet).str(key).str(std::string_view(value.data(), value.size())).s, timeout_s_,
          "setting a key");
}

std::vector<char> TcpStore::get(const std::string& key) {
  const Reply r = request(Writer().u8(kGet).str(key).i64(static_cast<int64_t>(timeout_s_ * 1000)).s,
                          timeout_s_ + kReplySlackS, "waiting for a key");
  if (r.status != kOk) fail_timeout(timeout_s_, "key '" + key + "'");
  const std::string v = r.reader().str();
  return std::vector<char>(v.begin(), v.end());
}

void TcpStore::wait(const std::vector<std::string>& keys) { wait_for(keys, timeout_s_); }

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  wait_for(keys, std::chrono::duration<double>(timeout).count());
}

void TcpStore::wait_for(const std::vector<std::string>& keys, double timeout_s) {
  const Reply r = request(Writer().u8(kWait).strs(keys).i64(static_cast<int64_t>(timeout_s * 1000)).s,
                          timeout_s + kReplySlackS, "waiting for keys");
  if (r.status == kOk) return;
  const std::vector<std::string> absent = r.reader().strs();
  std::string list = absent.size() == 1 ? "key " : "keys ";
  for (size_t i = 0; i < absent.size(); ++i) list += (i ? ", '" : "'") + absent[i] + "'";
  fail_timeout(timeout_s, list);
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  const Reply r = request(Writer().u8(kAdd).str(key).i64(delta).s, timeout_s_, "adding to a counter");
  Reader rd = r.reader();
  if (r.status != kOk) fail_dist("rendezvous at ", address_, ": ", rd.str());
  return rd.i64();
}

std::vector<std::string> TcpStore::missing(const std::vector<std::string>& keys) {
  return request(Writer().u8(kCheck).strs(keys).s, timeout_s_, "checking keys").reader().strs();
}

std::vector<int> TcpStore::unjoined_ranks() {
  std::vector<std::string> keys;
  for (int r = 0; r < world_; ++r) keys.push_back(joined_key(r));
  std::vector<int> out;
  for (const auto& k : missing(keys)) out.push_back(std::stoi(k.substr(k.rfind('/') + 1)));
  return out;
}

void TcpStore::fail_timeout(double timeout_s, const std::string& what) {
  std::string joined;
  try {
    const std::vector<int> absent = unjoined_ranks();
    joined = absent.empty() ? "; all " + std::to_string(world_) +
                                  " ranks joined, so one of them stopped before this point (see its log)"
                            : (absent.size() == 1 ? "; rank " : "; ranks ") + rank_list(absent) + " of " +
                                  std::to_string(world_) + " never joined";
  } catch (const Error&) {
  }
  fail_dist("rendezvous at ", address_, ": rank ", rank_, " timed out after ", seconds_text(timeout_s),
       " waiting for ", what, joined);
}

void TcpStore::barrier(const std::string& name, int world, double timeout_s) {
  ST_CHECK_DIST(world >= 1 && rank_ < world, "barrier '", name, "': rank ", rank_, " outside a world of ", world);
  // Each rank leaves an arrival key (so a timeout can name who is missing) and
  // counts itself in; the last to arrive opens the barrier for everyone.
  const std::string prefix = "st/barrier/" + name + "/";
  set(prefix + std::to_string(rank_), {'1'});
  if (add(prefix + "count", 1) == world) set(prefix + "open", {'1'});
  const Reply r = request(Writer().u8(kWait).strs({prefix + "open"}).i64(static_cast<int64_t>(timeout_s * 1000)).s,
                          timeout_s + kReplySlackS, "in a barrier");
  if (r.status == kOk) return;
  std::vector<std::string> arrivals;
  for (int i = 0; i < world; ++i) arrivals.push_back(prefix + std::to_string(i));
  std::vector<int> absent;
  for (const auto& k : missing(arrivals)) absent.push_back(std::stoi(k.substr(prefix.size())));
  std::vector<int> unjoined = unjoined_ranks();
  const bool none_joined = std::all_of(absent.begin(), absent.end(), [&](int a) {
    return std::find(unjoined.begin(), unjoined.end(), a) != unjoined.end();
  });
  fail_dist("rendezvous at ", address_, ": timed out after ", seconds_text(timeout_s), " waiting for rank",
       absent.size() == 1 ? " " : "s ", rank_list(absent), " of ", world, " (barrier '", name, "')",
       none_joined ? "; they never connected: were they started, with the same MASTER_ADDR/MASTER_PORT?" : "");
}

}  // namespace st
