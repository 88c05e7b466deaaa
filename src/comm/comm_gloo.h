// The CPU transport behind Comm: Gloo over TCP, one Gloo context per group. Used for
// the CPU backend (tensors in host memory), so multi-rank runs and their tests
// need no GPU.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"

namespace gloo {
namespace rendezvous {
class Store;
}
namespace transport {
class Device;
}
}  // namespace gloo

namespace st {

// A TCP device for this process's Gloo contexts (several groups may share one). It
// listens on `hostname`, an address of this host that the other ranks can reach
// (TcpStore::local_ip() is the one on the route to rank 0), unless
// SHARDTRAIN_GLOO_IFNAME or GLOO_SOCKET_IFNAME names an interface (first of a
// comma-separated list). Empty hostname: 127.0.0.1.
std::shared_ptr<gloo::transport::Device> make_gloo_device(const std::string& hostname);

// Who the other ranks of a group are, for messages: members[r] is the world rank of
// group rank r (empty: the group ranks are world ranks), and world rank w lives on
// node w / ranks_per_node (0: the node is not named).
struct GlooPeers {
  std::vector<int> members;
  int ranks_per_node = 0;
};

// A communicator over `world` ranks that rendezvous through `store` under `prefix`
// (one prefix per group, e.g. "world", "shard1"); `rank` is this process's rank in
// the group. Every operation is bounded by timeout_s; a failure (a peer exited, a
// timeout) is an st::Error naming this rank, the group and the operation, after
// which the communicator is unusable. The comm keeps `store` alive (rank 0 serves
// it for as long as any group exists). `device` null: make_gloo_device(""), i.e.
// loopback. `global_rank` (this process's world rank) and `peers` are for messages
// only: a collective that times out names the rank (and node) it was waiting for.
// Reductions support f32, f64, bf16 (each hop adds in fp32 and rounds to bf16), i32,
// i64; all_gather and broadcast any dtype.
// `overlap`: the *_async forms run on the communicator's own thread and return at once
// (wait() blocks until done), so communication overlaps the caller's compute; false:
// they complete inside the call, as the synchronous forms do (comm_gloo.cpp).
std::unique_ptr<Comm> make_gloo_comm(std::shared_ptr<gloo::rendezvous::Store> store, const std::string& prefix,
                                     int rank, int world, double timeout_s,
                                     std::shared_ptr<gloo::transport::Device> device = nullptr,
                                     int global_rank = -1, GlooPeers peers = {}, bool overlap = true);

}  // namespace st
