// The GPU transport behind Comm: NCCL, one communicator per group. Used for the CUDA
// backend (tensors in device memory). Each communicator runs its collectives on a
// stream of its own, ordered after the backend's compute stream
// (Backend::native_stream()) by events; the *_async forms let compute and
// communication overlap until wait(), and a watchdog thread aborts a collective that
// does not complete within the timeout (comm_nccl.cpp says how).
#pragma once
#include <memory>
#include <string>

#include "comm/comm.h"

namespace st {

class Backend;
class TcpStore;

// A communicator over `world` ranks that rendezvous through `store` under `prefix`
// (one prefix per group, e.g. "world", "shard1"): rank 0 of the group publishes an
// NCCL unique id under "<prefix>/nccl_id", the others fetch it. `rank` is this
// process's rank in the group, `global_rank` its world rank (messages only; -1: rank).
// The store is only needed during this call.
//
// `backend` must be the CUDA backend; its device and compute stream are the comm's.
// Waits are bounded by timeout_s: the id exchange, communicator set-up, every
// operation that waits on the host (barrier, all_reduce_sum), and, through the
// watchdog, every collective in flight. A failure is an
// st::Error naming this rank, the group and the operation ("rank 3: nccl all_gather
// failed: ..."), after which the communicator is aborted and unusable.
// Dtypes: f32, bf16, f16, f64, i32, i64 for every operation.
//
// Sets NCCL_NVLS_ENABLE=0 in the environment unless it is already set (NVLink
// multicast stays off unless asked for). In a build without CUDA this throws.
std::unique_ptr<Comm> make_nccl_comm(TcpStore& store, const std::string& prefix, int rank, int world,
                                     double timeout_s, Backend& backend, int global_rank = -1);

}  // namespace st
