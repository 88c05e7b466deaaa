// Rendezvous: a small key-value store over TCP. Rank 0 serves it on
// master_addr:master_port (a background thread); every rank, rank 0 included,
// connects as a client. Gloo contexts exchange their addresses through it (it is a
// gloo::rendezvous::Store), NCCL will pass its unique id through it, and barriers
// built on it name the ranks that never arrived.
//
// Every blocking call is bounded by the store's timeout (or the one passed in), and
// a timeout is an st::Error naming the server address and the ranks that are
// missing, so a job with a dead or mis-launched rank fails with a message instead
// of hanging.
//
// Joining. A connection is served nothing until its hello is accepted: the server
// first sends a fresh random nonce; the client answers with its rank, world and job id
// and, when the job has a secret (SHARDTRAIN_JOB_SECRET), HMAC-SHA256(secret, nonce,
// rank, world, job id), so the secret itself never crosses the network and a recorded
// hello cannot be replayed. A hello is refused when the job ids differ (an empty one
// included), when rank 0 has a secret and the hello proves another or none, and, on
// the client's side, when the client has a secret and rank 0 asks for none. Before its
// hello a connection may send 4 KiB at most and stay 10 s at most, and at most 64
// such connections are held; after it, frames are capped at 64 MiB.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "comm/store_listen.h"

namespace st {

class TcpStoreServer;  // tcp_store.cpp

// A new random job secret: 32 bytes from the system's CSPRNG, as 64 hex digits.
std::string new_job_secret();
// The shortest secret a job may use (bytes): anything shorter is refused.
constexpr size_t kMinJobSecretBytes = 16;

class TcpStore final : public gloo::rendezvous::Store {
 public:
  // As `rank` of `world`: when rank == 0, first serve the store on `port` at `addr`
  // (or where `bind` says: comm/store_listen.h); then connect to addr:port, retrying while the server is not up yet
  // (connection refused, name not resolvable yet) until timeout_s. Joining
  // registers this rank, so timeouts can list the ranks that never joined.
  // `job_id` (SHARDTRAIN_JOB_ID, set by `shardtrain launch`) identifies the job: a rank
  // whose job differs from rank 0's is refused, both jobs named, so two jobs started on
  // one port cannot mix ranks ("" on either side: not checked).
  // `secret` (SHARDTRAIN_JOB_SECRET): ranks prove they hold it when joining; "" on
  // rank 0 lets any hello with the right job id in (docs/operations.md, "Rendezvous
  // security").
  TcpStore(const std::string& addr, int port, int rank, int world, double timeout_s, const std::string& job_id = "",
           const std::string& secret = "", const StoreBind& bind = {});
  // Disconnects; rank 0 then keeps serving until the other ranks have disconnected
  // (or a grace period ran out) so that nobody loses the server mid-request.
  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  // gloo::rendezvous::Store. get() waits for the key like wait() does.
  void set(const std::string& key, const std::vector<char>& value) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // Adds delta to the integer stored at key (absent = 0) and returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  // The keys among `keys` that are not set now (no waiting).
  std::vector<std::string> missing(const std::vector<std::string>& keys);
  // Returns once ranks 0..world-1 have all called barrier(name, ...); each name is
  // used once. On timeout the error lists the ranks that did not arrive.
  void barrier(const std::string& name, int world, double timeout_s);
  // Ranks of this store's world that have not connected yet.
  std::vector<int> unjoined_ranks();

  int rank() const { return rank_; }
  int world() const { return world_; }
  double timeout_s() const { return timeout_s_; }
  // "addr:port" as given, for messages.
  const std::string& address() const { return address_; }
  // This host's IP address on the route to the server: the address peers on other
  // hosts can reach this process at (used for Gloo's listening sockets).
  const std::string& local_ip() const { return local_ip_; }
  // Rank 0: the addresses its store listens on ("127.0.0.1:29500"); empty elsewhere.
  std::vector<std::string> listening() const;

 private:
  struct Reply;
  Reply request(const std::string& body, double wait_s, const char* what);
  void wait_for(const std::vector<std::string>& keys, double timeout_s);
  [[noreturn]] void fail_timeout(double timeout_s, const std::string& what);

  std::string address_, local_ip_;
  int rank_, world_;
  double timeout_s_;
  std::unique_ptr<TcpStoreServer> server_;  // rank 0 only
  int fd_ = -1;
  std::mutex mu_;  // one request at a time on the connection
};

}  // namespace st
