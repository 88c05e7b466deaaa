// Where this process sits in the job, read from the environment variables that
// launchers set. Any engine that sets one of these families runs shardtrain:
// `shardtrain launch`, torchrun / Kubeflow PyTorchJob, Slurm (srun), Open MPI.
#pragma once
#include <map>
#include <string>

#include "core/environ.h"  // environ_map(), the usual argument

namespace st {

struct DistEnv {
  int rank = 0, world = 1;
  int local_rank = 0, local_world = 1;
  int node_rank = 0, num_nodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single process";  // which family supplied the values, for the log
  // Started by a launcher (a contract's variables were found) rather than by hand.
  bool launched = false;
  // The job's identity (SHARDTRAIN_JOB_ID; `shardtrain launch` sets a random one): the
  // rendezvous refuses a rank of another job. Empty: not checked.
  std::string job_id;
  // The job's secret (SHARDTRAIN_JOB_SECRET; `shardtrain launch` makes one for a
  // one-node job): ranks prove they hold it when joining the rendezvous (comm/tcp_store.h).
  std::string job_secret;
  // How many times a launcher has started this job's ranks again after a failure:
  // SHARDTRAIN_RESTART_COUNT (`shardtrain launch --max-restarts`), else
  // TORCHELASTIC_RESTART_COUNT (torchrun). 0: the first start.
  int restart_count = 0;
};

// Reads the launch contract from `env` (the process environment when called with
// environ_map()). Precedence and conflict rules are documented in the .cpp and in
// docs/operations.md; conflicting values are an st::Error naming both variables.
DistEnv detect_dist_env(const std::map<std::string, std::string>& env);

// A Kubernetes Indexed Job pod's place (contract 4 in env.cpp): JOB_COMPLETION_INDEX,
// SHARDTRAIN_NNODES, SHARDTRAIN_NPROC_PER_NODE, and rank 0's pod behind the headless
// Service. st::Error naming the variable when one is missing or malformed.
struct KubernetesPlace {
  int node_rank = 0, nnodes = 1, nproc_per_node = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};
KubernetesPlace kubernetes_place(const std::map<std::string, std::string>& env);

// The first host of a Slurm hostlist ("node[01-04,07],gpu5" -> "node01"): where
// rank 0 runs under srun's default block distribution. st::Error when malformed.
std::string slurm_first_host(const std::string& hostlist);

}  // namespace st
