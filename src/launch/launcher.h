// `shardtrain launch`: starts this node's ranks as child processes with the launch
// contract (torchrun's variable names, see dist/env.h) in their environment, relays
// their output line by line with a "[rank R] " prefix, and stops them all as soon as
// one fails. It is a convenience for one machine (or a hand-run multi-node job);
// Slurm, mpirun or Kubernetes can start ranks just as well by setting the contract.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace st {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string program;            // empty: this very binary (/proc/self/exe)
  std::vector<std::string> args;  // argv[1..] of every rank
  double grace_s = 10.0;          // SIGTERM -> SIGKILL delay when stopping ranks
  int max_restarts = 0;           // after a rank fails: stop all, start all again, this many times
  std::string job_id;             // SHARDTRAIN_JOB_ID of every rank ("" = the environment's, if any)
  std::string job_secret;         // SHARDTRAIN_JOB_SECRET of every rank ("" = the environment's, if any)
  int restart = 0;                // which start this is (0: the first): SHARDTRAIN_RESTART_COUNT of every rank
};

// Throws st::Error naming the offending option.
void validate_launch_options(const LaunchOptions& opt);

// The environment of local rank `local_rank`: `base` without the rank variables of
// other launchers (Open MPI, PMI/PMIx, Slurm task placement, PyTorchJob PET_*), so a
// rank never sees two disagreeing placements, plus RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK, NODE_RANK, GROUP_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
// SHARDTRAIN_RESTART_COUNT (opt.restart), and SHARDTRAIN_JOB_ID and SHARDTRAIN_JOB_SECRET
// when opt.job_id and opt.job_secret are set.
std::map<std::string, std::string> rank_environment(const LaunchOptions& opt, int local_rank,
                                                    std::map<std::string, std::string> base);

// Runs opt.nproc_per_node ranks to completion and returns the exit status the
// launcher should exit with. With opt.max_restarts > 0, a failed rank stops all and
// starts them all again (a training run then resumes from its latest checkpoint, or
// starts from step 0 without one), up to that many times; a launcher stopped by a
// signal is never restarted. Giving up names the first failure and the last.
// Otherwise: the exit status the
// launcher should exit with: 0 when every rank exited 0; otherwise the first failing
// rank's status (128 + signal when it was killed), or 128 + signal when the launcher
// itself was interrupted. Installs SIGINT/SIGTERM/SIGHUP/SIGCHLD handlers for its
// duration (restored on return); one launch at a time per process.
int launch_local_ranks(const LaunchOptions& opt);

}  // namespace st
