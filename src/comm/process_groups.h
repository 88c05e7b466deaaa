// The communicators a run needs: the whole world (data positions, loss and token
// counts), the shard group FSDP all-gathers and reduce-scatters over, and, for HSDP,
// the replicate group (same position in every shard group) whose gradient shards are
// all-reduced. With shard_group_size 0 or == world, replicate is null (plain FSDP).
//
// Transport only: which network NCCL should use, and the report of which one it
// did use, belong to src/fabric (applied before, probed after init_process_groups).
#pragma once
#include <memory>
#include <string>

#include "backend/backend.h"
#include "config/options.h"  // DistOptions
#include "comm/comm.h"
#include "comm/comm_stats.h"

namespace st {

class TcpStore;

// Where this rank meets the others: its place in the world and rank 0's store.
struct Rendezvous {
  int rank = 0, world = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Started by a launcher (torchrun, `shardtrain launch`, a Kubernetes Job, ...)
  // rather than by hand: on CUDA a launched world of 1 still uses NCCL.
  bool launched = false;
  // The job's identity (DistEnv::job_id): rank 0's store refuses a rank that brings
  // another one, naming both jobs. Empty: not checked.
  std::string job_id;
  // The job's secret (DistEnv::job_secret): ranks prove they hold it when joining
  // (comm/tcp_store.h). Empty: any process that knows the job id may join.
  std::string secret;
  // dist.bind: where rank 0's store listens; "" = master_addr (comm/store_listen.h).
  std::string bind;
  // Ranks per node (the launch contract's local world size): which collectives cross
  // between nodes in the byte counts (comm/comm_stats.h).
  int ranks_per_node = 1;
};

struct ProcessGroups {
  std::unique_ptr<Comm> world, shard, replicate;
  // The rendezvous store, kept for exchanges after set-up (null for a world of one
  // started by hand). Every rank holds a client; rank 0 also serves it.
  std::shared_ptr<TcpStore> store;
  bool nccl = false;  // world, shard and replicate are NCCL communicators
  // What the three groups' collectives moved, counted by each of them (comm/comm_stats.h).
  std::shared_ptr<CommStats> stats = std::make_shared<CommStats>();
};

// Rendezvous through a TCP store served by rank 0 at where.master_addr:master_port,
// then one communicator per group: Gloo for the CPU backend, NCCL for CUDA. Every
// wait is bounded by timeout_s; a rank that never arrives is named in the error.
// A world of 1 started by hand needs no network and gets single-process comms; on
// CUDA, a world of 1 started by a launcher gets NCCL comms (the same path as many).
// NCCL reads its environment at its first call, which happens here: set it before.
// `overlap` (dist.overlap): Gloo's asynchronous collectives run on a thread of their
// own beside the compute (comm_gloo.h); NCCL always overlaps through its streams.
ProcessGroups init_process_groups(const Rendezvous& where, Backend& backend, int shard_group_size,
                                  double timeout_s, bool overlap = true);

// Whether init_process_groups builds NCCL communicators for this rank: CUDA, and
// more than one rank or a launched one.
bool uses_nccl(const Rendezvous& where, const Backend& backend);

// A world of one process (defined with the single-process comm).
ProcessGroups make_single_process_groups(Backend& backend);

}  // namespace st
