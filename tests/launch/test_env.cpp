// Launch contracts: each family, PyTorchJob's PET_*, Slurm hostlists, precedence,
// conflicts and bad values.
#include "launch/env.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "support/errors.h"

namespace st {
namespace {

using Env = std::map<std::string, std::string>;

std::string error_of(const Env& env) {
  return testing::error_of([&] { detect_dist_env(env); });
}

#define EXPECT_ERROR_HAS(env, text)                                   \
  do {                                                                \
    const std::string err_ = error_of(env);                           \
    EXPECT_NE(err_.find(text), std::string::npos) << "error: " << err_; \
  } while (0)

// The place a launch contract is expected to give; only the fields set are checked.
struct Place {
  std::optional<int> rank, world, local_rank, local_world, node_rank, num_nodes;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
};

// EXPECT_TRUE(is_at(e, {.rank = 1, ...})): every field of `want` that is set equals e's;
// a failure lists each one that does not.
::testing::AssertionResult is_at(const DistEnv& e, const Place& want) {
  std::ostringstream wrong;
  auto check = [&](const char* name, const auto& expected, const auto& got) {
    if (expected && *expected != got) wrong << " " << name << " is " << got << ", not " << *expected << ";";
  };
  check("rank", want.rank, e.rank);
  check("world", want.world, e.world);
  check("local_rank", want.local_rank, e.local_rank);
  check("local_world", want.local_world, e.local_world);
  check("node_rank", want.node_rank, e.node_rank);
  check("num_nodes", want.num_nodes, e.num_nodes);
  check("master_addr", want.master_addr, e.master_addr);
  check("master_port", want.master_port, e.master_port);
  if (wrong.str().empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "from " << e.source << ":" << wrong.str();
}

TEST(DistEnv, NothingSetIsASingleProcess) {
  const DistEnv e = detect_dist_env({{"HOME", "/root"}});
  EXPECT_TRUE(is_at(e, {.rank = 0, .world = 1, .local_world = 1, .master_addr = "127.0.0.1", .master_port = 29500}));
  EXPECT_EQ(e.source, "single process");
}

TEST(DistEnv, JobIdentityComesFromShardtrainJobId) {
  EXPECT_EQ(detect_dist_env({{"HOME", "/root"}}).job_id, "");
  EXPECT_EQ(detect_dist_env({{"SHARDTRAIN_JOB_ID", "j1"}}).job_id, "j1");
  const DistEnv e = detect_dist_env(
      {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "2"}, {"SHARDTRAIN_JOB_ID", "j2"}});
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.job_id, "j2");
}

// A launcher's restart count: ours, else torchrun's; 0 without either.
TEST(DistEnv, RestartCountComesFromTheLauncher) {
  EXPECT_EQ(detect_dist_env({}).restart_count, 0);
  EXPECT_EQ(detect_dist_env({{"SHARDTRAIN_RESTART_COUNT", "2"}}).restart_count, 2);
  EXPECT_EQ(detect_dist_env({{"TORCHELASTIC_RESTART_COUNT", "1"}}).restart_count, 1);
  EXPECT_EQ(detect_dist_env({{"SHARDTRAIN_RESTART_COUNT", "0"}, {"TORCHELASTIC_RESTART_COUNT", "3"}}).restart_count, 0);
  EXPECT_THROW(detect_dist_env({{"SHARDTRAIN_RESTART_COUNT", "x"}}), Error);
}

TEST(DistEnv, KubernetesIndexedJob) {
  // One rank per pod: the completion index is the rank; pod 0 behind the headless
  // Service is the master, named from this pod's hostname "<job>-<index>".
  DistEnv e = detect_dist_env({{"JOB_COMPLETION_INDEX", "1"}, {"SHARDTRAIN_NNODES", "2"}, {"HOSTNAME", "qwen-train-1"},
                               {"SHARDTRAIN_SERVICE", "qwen-train"}});
  EXPECT_TRUE(is_at(e, {.rank = 1, .world = 2, .local_rank = 0, .node_rank = 1, .num_nodes = 2,
                        .master_addr = "qwen-train-0.qwen-train", .master_port = 29500}));
  EXPECT_EQ(e.source, "Kubernetes Indexed Job");
  // Four ranks per pod, started by `shardtrain launch` (LOCAL_RANK); a job name and
  // a master given outright win over the hostname.
  e = detect_dist_env({{"JOB_COMPLETION_INDEX", "1"}, {"SHARDTRAIN_NNODES", "2"}, {"SHARDTRAIN_NPROC_PER_NODE", "4"},
                       {"LOCAL_RANK", "2"}, {"HOSTNAME", "x"}, {"SHARDTRAIN_JOB_NAME", "job"},
                       {"SHARDTRAIN_SERVICE", "svc"}, {"MASTER_PORT", "29700"}});
  EXPECT_TRUE(is_at(e, {.rank = 6, .world = 8, .local_world = 4, .master_addr = "job-0.svc", .master_port = 29700}));
  e = detect_dist_env({{"JOB_COMPLETION_INDEX", "0"}, {"SHARDTRAIN_NNODES", "3"}, {"MASTER_ADDR", "10.0.0.5"}});
  EXPECT_EQ(e.master_addr, "10.0.0.5");
  e = detect_dist_env({{"JOB_COMPLETION_INDEX", "0"}, {"SHARDTRAIN_NNODES", "1"}});
  EXPECT_EQ(e.master_addr, "127.0.0.1");  // one pod: itself
  // The ranks `shardtrain launch` starts in a pod carry the torchrun contract, which wins.
  e = detect_dist_env({{"JOB_COMPLETION_INDEX", "1"}, {"SHARDTRAIN_NNODES", "2"}, {"RANK", "3"}, {"WORLD_SIZE", "4"},
                       {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "m"}});
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.source, "torchrun");
}

TEST(DistEnv, KubernetesIndexedJobErrorsNameTheVariable) {
  const Env pod = {{"JOB_COMPLETION_INDEX", "1"}, {"SHARDTRAIN_NNODES", "2"}, {"HOSTNAME", "job-1"},
                   {"SHARDTRAIN_SERVICE", "svc"}};
  auto with = [&](const std::string& k, const std::string& v) {
    Env e = pod;
    e[k] = v;
    return e;
  };
  auto without = [&](const std::string& k) {
    Env e = pod;
    e.erase(k);
    return e;
  };
  EXPECT_ERROR_HAS(without("SHARDTRAIN_NNODES"), "SHARDTRAIN_NNODES");
  EXPECT_ERROR_HAS(with("JOB_COMPLETION_INDEX", "2"), "JOB_COMPLETION_INDEX=2 is outside 0..1");
  EXPECT_ERROR_HAS(with("SHARDTRAIN_NNODES", "two"), "SHARDTRAIN_NNODES=two is not a whole number");
  EXPECT_ERROR_HAS(without("SHARDTRAIN_SERVICE"), "SHARDTRAIN_SERVICE");
  EXPECT_ERROR_HAS(with("HOSTNAME", "job-7"), "HOSTNAME=job-7 is not \"<job>-1\"");
  EXPECT_ERROR_HAS(with("SHARDTRAIN_NPROC_PER_NODE", "4"), "shardtrain launch --nproc-per-node 4");
  EXPECT_ERROR_HAS(with("MASTER_PORT", "70000"), "MASTER_PORT=70000");
}

TEST(DistEnv, Torchrun) {
  const DistEnv e = detect_dist_env({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                                     {"GROUP_RANK", "1"}, {"GROUP_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"},
                                     {"MASTER_PORT", "29400"}});
  EXPECT_TRUE(is_at(e, {.rank = 5, .world = 8, .local_rank = 1, .local_world = 4, .node_rank = 1, .num_nodes = 2,
                        .master_addr = "10.0.0.1", .master_port = 29400}));
  EXPECT_NE(e.source.find("torchrun"), std::string::npos);
}

TEST(DistEnv, TorchrunDerivesNodesAndDefaultsMasterOnOneNode) {
  DistEnv e = detect_dist_env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "4"}});
  EXPECT_TRUE(is_at(e, {.node_rank = 0, .num_nodes = 1, .master_addr = "127.0.0.1"}));
  // One rank per pod (a Kubernetes Indexed Job): each rank is its own node, and
  // several nodes need a master address.
  e = detect_dist_env({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "job-0.svc"}});
  EXPECT_TRUE(is_at(e, {.local_rank = 0, .local_world = 1, .node_rank = 2, .num_nodes = 4}));
  EXPECT_ERROR_HAS((Env{{"RANK", "2"}, {"WORLD_SIZE", "4"}}), "4 ranks on 4 nodes need MASTER_ADDR");
}

TEST(DistEnv, PyTorchJobPodWithOneProcessPerPod) {
  // What the training operator sets on worker pod 1 of 3 (+ master) with nproc 1.
  const DistEnv e = detect_dist_env({{"RANK", "2"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "job-master-0"},
                                     {"MASTER_PORT", "23456"}, {"PET_NNODES", "4"}, {"PET_NODE_RANK", "2"},
                                     {"PET_NPROC_PER_NODE", "1"}});
  EXPECT_TRUE(is_at(e, {.rank = 2, .world = 4, .local_world = 1, .master_addr = "job-master-0", .master_port = 23456}));
}

TEST(DistEnv, PyTorchJobPodWithSeveralProcessesNeedsALauncher) {
  // RANK is the pod index here, not a rank: refuse rather than collide.
  EXPECT_ERROR_HAS((Env{{"RANK", "1"}, {"WORLD_SIZE", "8"}, {"MASTER_ADDR", "m"}, {"PET_NNODES", "2"},
                        {"PET_NODE_RANK", "1"}, {"PET_NPROC_PER_NODE", "4"}}),
                   "PyTorchJob pod's own environment");
  // Started by torchrun (LOCAL_RANK set): RANK is the global rank; LOCAL_WORLD_SIZE
  // falls back to PET_NPROC_PER_NODE.
  const DistEnv e = detect_dist_env({{"RANK", "6"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "2"}, {"MASTER_ADDR", "m"},
                                     {"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}, {"PET_NPROC_PER_NODE", "4"}});
  EXPECT_TRUE(is_at(e, {.rank = 6, .local_world = 4, .node_rank = 1}));
}

TEST(DistEnv, PetVariablesOnly) {
  const DistEnv e = detect_dist_env({{"PET_NNODES", "2"}, {"PET_NODE_RANK", "1"}, {"PET_NPROC_PER_NODE", "4"},
                                     {"LOCAL_RANK", "3"}, {"PET_MASTER_ADDR", "head"}, {"PET_MASTER_PORT", "1234"}});
  EXPECT_TRUE(is_at(e, {.rank = 7, .world = 8, .local_rank = 3, .local_world = 4, .node_rank = 1, .num_nodes = 2,
                        .master_addr = "head", .master_port = 1234}));
  EXPECT_NE(e.source.find("PET_"), std::string::npos);
  EXPECT_ERROR_HAS((Env{{"PET_NNODES", "1:4"}, {"PET_NODE_RANK", "0"}, {"PET_NPROC_PER_NODE", "1"}}),
                   "PET_NNODES=1:4 is not a whole number");
  EXPECT_ERROR_HAS((Env{{"PET_NNODES", "2"}, {"PET_NPROC_PER_NODE", "1"}}), "PET_NODE_RANK is unset");
  EXPECT_ERROR_HAS((Env{{"PET_NNODES", "2"}, {"PET_NODE_RANK", "0"}, {"PET_NPROC_PER_NODE", "2"}, {"MASTER_ADDR", "m"}}),
                   "PET_NPROC_PER_NODE=2 but no LOCAL_RANK");
}

TEST(DistEnv, OpenMpi) {
  const DistEnv e = detect_dist_env({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "8"},
                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                                     {"MASTER_ADDR", "n0"}, {"MASTER_PORT", "4000"}});
  EXPECT_TRUE(is_at(e, {.rank = 5, .world = 8, .local_rank = 1, .local_world = 4, .node_rank = 1, .num_nodes = 2,
                        .master_addr = "n0", .master_port = 4000}));
  EXPECT_NE(e.source.find("Open MPI"), std::string::npos);
  // On one node the master defaults to loopback; across nodes it must be given.
  EXPECT_EQ(detect_dist_env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})
                .master_addr,
            "127.0.0.1");
  EXPECT_ERROR_HAS((Env{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
                   "need MASTER_ADDR");
}

TEST(DistEnv, Slurm) {
  const DistEnv e = detect_dist_env({{"SLURM_PROCID", "6"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "2"},
                                     {"SLURM_NTASKS_PER_NODE", "4(x2)"}, {"SLURM_NODEID", "1"}, {"SLURM_NNODES", "2"},
                                     {"SLURM_JOB_NODELIST", "gpu-[017-018]"}});
  EXPECT_TRUE(is_at(e, {.rank = 6, .world = 8, .local_rank = 2, .local_world = 4, .node_rank = 1, .num_nodes = 2,
                        .master_addr = "gpu-017", .master_port = 29500}));
  EXPECT_NE(e.source.find("Slurm"), std::string::npos);
}

TEST(DistEnv, SlurmTasksPerNodeListAndOverrides) {
  // No --ntasks-per-node: this node's entry of SLURM_TASKS_PER_NODE ("3(x2),2").
  DistEnv e = detect_dist_env({{"SLURM_PROCID", "7"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                               {"SLURM_TASKS_PER_NODE", "3(x2),2"}, {"SLURM_NODEID", "2"}, {"SLURM_NNODES", "3"},
                               {"SLURM_JOB_NODELIST", "a1,b[2-3]"}, {"MASTER_PORT", "31000"}});
  EXPECT_TRUE(is_at(e, {.local_world = 2, .node_rank = 2, .master_addr = "a1", .master_port = 31000}));
  // MASTER_ADDR wins over the nodelist; the step's nodelist over the job's.
  e = detect_dist_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NNODES", "2"},
                       {"SLURM_JOB_NODELIST", "x[1-2]"}, {"MASTER_ADDR", "10.1.1.1"}});
  EXPECT_EQ(e.master_addr, "10.1.1.1");
  e = detect_dist_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NNODES", "2"},
                       {"SLURM_JOB_NODELIST", "x[1-4]"}, {"SLURM_STEP_NODELIST", "x[3-4]"}});
  EXPECT_EQ(e.master_addr, "x3");
  EXPECT_ERROR_HAS((Env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_NTASKS_PER_NODE", "four"}}),
                   "SLURM_NTASKS_PER_NODE=four");
  EXPECT_ERROR_HAS((Env{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_NNODES", "2"},
                        {"SLURM_JOB_NODELIST", "node[01-"}}),
                   "SLURM_JOB_NODELIST: hostlist 'node[01-' has an unclosed '['");
}

TEST(DistEnv, SlurmHostlists) {
  EXPECT_EQ(slurm_first_host("node[01-04,07],gpu5"), "node01");
  EXPECT_EQ(slurm_first_host("gpu5"), "gpu5");
  EXPECT_EQ(slurm_first_host("gpu5,node[1-2]"), "gpu5");
  EXPECT_EQ(slurm_first_host("node[007]"), "node007");
  EXPECT_EQ(slurm_first_host("node[3,1-2]"), "node3");
  EXPECT_EQ(slurm_first_host("rack[2-3]-n[08-09]"), "rack2-n08");
  EXPECT_EQ(slurm_first_host("ip-10-0-1-[5-6].ec2.internal"), "ip-10-0-1-5.ec2.internal");
  EXPECT_THROW(slurm_first_host("node[01-"), Error);
  EXPECT_THROW(slurm_first_host("node[]"), Error);
  EXPECT_THROW(slurm_first_host("node]1["), Error);
  EXPECT_THROW(slurm_first_host(",node1"), Error);
}

TEST(DistEnv, PrecedenceTorchrunOverOpenMpiOverSlurm) {
  // Agreeing families: the higher one is the source.
  DistEnv e = detect_dist_env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"},
                               {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                               {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}});
  EXPECT_NE(e.source.find("torchrun"), std::string::npos);
  // mpirun inside a Slurm batch script: SLURM_* describe the allocation, Open MPI
  // the process; Slurm is not cross-checked.
  e = detect_dist_env({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
                       {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}});
  EXPECT_EQ(e.rank, 3);
  EXPECT_NE(e.source.find("Open MPI"), std::string::npos);
  // srun torchrun: one torchrun per node started 4 ranks each.
  e = detect_dist_env({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                       {"MASTER_ADDR", "n0"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}});
  EXPECT_EQ(e.rank, 5);
  // mpirun -npernode 1 torchrun --nproc-per-node 4: a nesting, not a conflict.
  e = detect_dist_env({{"RANK", "6"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "4"},
                       {"MASTER_ADDR", "n0"}, {"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
  EXPECT_EQ(e.rank, 6);
}

TEST(DistEnv, DisagreeingFamiliesNameBothVariables) {
  EXPECT_ERROR_HAS((Env{{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "m"}, {"OMPI_COMM_WORLD_RANK", "2"},
                        {"OMPI_COMM_WORLD_SIZE", "4"}}),
                   "RANK=1 but OMPI_COMM_WORLD_RANK=2");
  EXPECT_ERROR_HAS((Env{{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "m"}, {"OMPI_COMM_WORLD_RANK", "1"},
                        {"OMPI_COMM_WORLD_SIZE", "8"}}),
                   "WORLD_SIZE=4 but OMPI_COMM_WORLD_SIZE=8");
}

TEST(DistEnv, BadValuesNameTheVariable) {
  EXPECT_ERROR_HAS((Env{{"RANK", "one"}, {"WORLD_SIZE", "2"}}), "RANK=one is not a whole number");
  EXPECT_ERROR_HAS((Env{{"RANK", "1"}, {"WORLD_SIZE", "2x"}}), "WORLD_SIZE=2x is not a whole number");
  EXPECT_ERROR_HAS((Env{{"RANK", " 1"}, {"WORLD_SIZE", "2"}}), "RANK= 1 is not a whole number");
  EXPECT_ERROR_HAS((Env{{"RANK", "99999999999"}, {"WORLD_SIZE", "2"}}), "RANK=99999999999 is out of range");
  EXPECT_ERROR_HAS((Env{{"RANK", "2"}, {"WORLD_SIZE", "2"}}), "RANK=2 is outside 0..1 for WORLD_SIZE=2");
  EXPECT_ERROR_HAS((Env{{"RANK", "-1"}, {"WORLD_SIZE", "2"}}), "RANK=-1 is outside 0..1");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "0"}}), "WORLD_SIZE=0 must be at least 1");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}),
                   "LOCAL_RANK=2 is outside 0..1 for LOCAL_WORLD_SIZE=2");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}}),
                   "LOCAL_RANK=0 is set but LOCAL_WORLD_SIZE is not");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "70000"}}),
                   "MASTER_PORT=70000 is outside 1..65535");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "0"}}), "MASTER_PORT=0 is outside");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"MASTER_PORT", "http"}}),
                   "MASTER_PORT=http is not a whole number");
  EXPECT_ERROR_HAS((Env{{"RANK", "0"}}), "RANK is set but WORLD_SIZE is not");
  EXPECT_ERROR_HAS((Env{{"OMPI_COMM_WORLD_RANK", "0"}}), "OMPI_COMM_WORLD_SIZE is not");
  EXPECT_ERROR_HAS((Env{{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "2"}}), "SLURM_PROCID=x is not a whole number");
  EXPECT_ERROR_HAS((Env{{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "4"}}), "SLURM_PROCID=4 is outside 0..3");
  // Empty counts as unset (templated manifests often expand to "").
  EXPECT_EQ(detect_dist_env({{"RANK", ""}, {"WORLD_SIZE", ""}}).world, 1);
}

TEST(DistEnv, EnvironMapReadsTheProcessEnvironment) {
  ::setenv("SHARDTRAIN_TEST_ENV_VAR", "a=b", 1);
  const auto env = environ_map();
  ASSERT_TRUE(env.count("SHARDTRAIN_TEST_ENV_VAR"));
  EXPECT_EQ(env.at("SHARDTRAIN_TEST_ENV_VAR"), "a=b");
  ::unsetenv("SHARDTRAIN_TEST_ENV_VAR");
}

}  // namespace
}  // namespace st
