// Launch contracts: where this process sits in the job, read from the variables a
// launcher sets. The rule, in order:
//
// 1. torchrun / Kubeflow PyTorchJob / `shardtrain launch`, when RANK or WORLD_SIZE
//    is set (then both must be): RANK, WORLD_SIZE, LOCAL_RANK (default 0),
//    LOCAL_WORLD_SIZE (default PET_NPROC_PER_NODE, else 1 when LOCAL_RANK is unset
//    too: one rank per node, as in a Kubernetes Indexed Job), node rank GROUP_RANK or
//    NODE_RANK (default RANK / LOCAL_WORLD_SIZE), node count GROUP_WORLD_SIZE (default
//    WORLD_SIZE / LOCAL_WORLD_SIZE, rounded up). Master: MASTER_ADDR / MASTER_PORT,
//    else PET_MASTER_ADDR / PET_MASTER_PORT.
//    A PyTorchJob pod's own environment sets RANK to the pod index (a node rank) and
//    WORLD_SIZE to pods × PET_NPROC_PER_NODE; with PET_NPROC_PER_NODE > 1 and no
//    LOCAL_RANK nobody has started the per-node ranks yet, which is an error saying so.
//    PET_* only (no RANK, WORLD_SIZE): rank = PET_NODE_RANK × PET_NPROC_PER_NODE +
//    LOCAL_RANK, world = PET_NNODES × PET_NPROC_PER_NODE (all three must be plain
//    numbers; elastic ranges like PET_NNODES=1:4 are not supported). When RANK is set,
//    PET_* never override it: torchrun's elastic rendezvous may number nodes in a
//    different order than PET_NODE_RANK.
// 2. Open MPI: OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE; node rank =
//    rank / local size (Open MPI's default mappings fill a node before the next);
//    master from MASTER_ADDR / MASTER_PORT.
// 3. Slurm (srun): SLURM_PROCID, SLURM_NTASKS (or SLURM_NPROCS), SLURM_LOCALID, ranks
//    per node from SLURM_NTASKS_PER_NODE (first number of "4(x2)"), else this node's
//    entry in SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE; SLURM_NODEID,
//    SLURM_STEP_NUM_NODES / SLURM_NNODES. Master: MASTER_ADDR if set, else the first
//    host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST / SLURM_NODELIST; port
//    MASTER_PORT or 29500.
// 4. Kubernetes Indexed Job (one pod per node; what `shardtrain deploy` renders), when
//    JOB_COMPLETION_INDEX is set: node rank = JOB_COMPLETION_INDEX; nodes =
//    SHARDTRAIN_NNODES (the Job's completions; required); ranks per pod =
//    SHARDTRAIN_NPROC_PER_NODE (default 1), rank = node rank × ranks per pod +
//    LOCAL_RANK (with more than one rank per pod LOCAL_RANK must be set, i.e. the
//    ranks started by `shardtrain launch`, which reads this same contract). Master:
//    MASTER_ADDR if set, else the DNS name of pod 0 behind the Job's headless Service,
//    "<job>-0.<SHARDTRAIN_SERVICE>": Kubernetes names an Indexed Job's pods
//    "<job>-<index>" and gives them that hostname, so <job> is SHARDTRAIN_JOB_NAME
//    or HOSTNAME without its "-<index>"; port MASTER_PORT or 29500.
// 5. Otherwise a single process (rank 0 of 1).
//
// Conflicts: when torchrun variables and Open MPI variables are both present they
// must agree on rank and world size, or describe a nesting (mpirun started one
// torchrun per process, which started LOCAL_WORLD_SIZE ranks: WORLD_SIZE =
// OMPI_COMM_WORLD_SIZE × LOCAL_WORLD_SIZE); anything else is an st::Error naming both
// variables. Slurm variables are never cross-checked: srun and sbatch export them
// into everything run inside an allocation, so under `srun torchrun` or mpirun in a
// batch script they describe the allocation or the outer step, not this process.
//
// Multi-node jobs need a master address: when the family gives none and there is
// more than one node, that is an error; on one node it defaults to 127.0.0.1.
// Empty variables count as unset (Kubernetes templates often expand to "").
#include "launch/env.h"

#include <cctype>
#include <charconv>
#include <initializer_list>
#include <optional>
#include <vector>

#include "core/error.h"

namespace st {
namespace {

using Env = std::map<std::string, std::string>;

const std::string* lookup(const Env& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}
bool has(const Env& env, const std::string& name) { return lookup(env, name) != nullptr; }

// "NAME=value" of a variable that is set, for the messages that say where a value came from.
std::string assignment(const Env& env, const std::string& name) { return name + "=" + *lookup(env, name); }

std::optional<long> parse_long(const std::string& s) {
  long v = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

std::optional<int> opt_int(const Env& env, const std::string& name) {
  const std::string* v = lookup(env, name);
  if (!v) return std::nullopt;
  auto n = parse_long(*v);
  if (!n) fail_dist("launch environment: ", name, "=", *v, " is not a whole number");
  if (*n < -(1L << 30) || *n > (1L << 30)) fail_dist("launch environment: ", name, "=", *v, " is out of range");
  return static_cast<int>(*n);
}

int req_int(const Env& env, const std::string& name, const std::string& why) {
  auto v = opt_int(env, name);
  if (!v) fail_dist("launch environment: ", why);
  return *v;
}

// "NAME=value" for messages, or a description of where a default came from.
std::string shown(const Env& env, const std::string& name, int value, const char* fallback = "derived") {
  if (const std::string* v = lookup(env, name)) return name + "=" + *v;
  return name + " unset, " + fallback + " " + std::to_string(value);
}

// One family's reading, with the variable texts its validation messages name.
struct Reading {
  DistEnv e;
  std::string rank_var, world_var, local_rank_var, local_world_var, node_var, port_var;
  bool master_given = false;
};

void set_master(Reading& r, const Env& env, std::initializer_list<const char*> addr_vars,
                std::initializer_list<const char*> port_vars) {
  for (const char* n : addr_vars)
    if (const std::string* v = lookup(env, n)) {
      r.e.master_addr = *v;
      r.master_given = true;
      break;
    }
  for (const char* n : port_vars)
    if (auto p = opt_int(env, n)) {
      r.e.master_port = *p;
      r.port_var = assignment(env, n);
      return;
    }
  r.port_var = "default port 29500";
}

int ceil_div(int a, int b) { return b > 0 ? (a + b - 1) / b : a; }

std::optional<Reading> read_torchrun(const Env& env) {
  Reading r;
  if (has(env, "RANK") || has(env, "WORLD_SIZE")) {
    if (!has(env, "RANK") || !has(env, "WORLD_SIZE"))
      fail_dist("launch environment: ", has(env, "RANK") ? "RANK" : "WORLD_SIZE", " is set but ",
           has(env, "RANK") ? "WORLD_SIZE" : "RANK", " is not; a torchrun-style launch sets both");
    r.e.source = "torchrun";
    r.e.rank = *opt_int(env, "RANK");
    r.e.world = *opt_int(env, "WORLD_SIZE");
    r.rank_var = assignment(env, "RANK");
    r.world_var = assignment(env, "WORLD_SIZE");
    const auto pet_nproc = lookup(env, "PET_NPROC_PER_NODE") ? parse_long(*lookup(env, "PET_NPROC_PER_NODE")) : std::nullopt;
    if (!has(env, "LOCAL_RANK") && pet_nproc && *pet_nproc > 1)
      fail_dist("launch environment: RANK=", *lookup(env, "RANK"), " with PET_NPROC_PER_NODE=", *pet_nproc,
           " and no LOCAL_RANK: this is a PyTorchJob pod's own environment (RANK is the pod index); start ",
           *pet_nproc, " ranks per pod with `shardtrain launch --nproc-per-node ", *pet_nproc, "` or torchrun");
    r.e.local_rank = opt_int(env, "LOCAL_RANK").value_or(0);
    if (auto lw = opt_int(env, "LOCAL_WORLD_SIZE")) {
      r.e.local_world = *lw;
    } else if (pet_nproc) {
      r.e.local_world = static_cast<int>(*pet_nproc);
    } else if (has(env, "LOCAL_RANK")) {
      fail_dist("launch environment: LOCAL_RANK=", *lookup(env, "LOCAL_RANK"),
           " is set but LOCAL_WORLD_SIZE is not: set it to the number of ranks on this node");
    }
    r.local_rank_var = shown(env, "LOCAL_RANK", r.e.local_rank, "default");
    r.local_world_var = shown(env, "LOCAL_WORLD_SIZE", r.e.local_world);
    if (auto g = opt_int(env, "GROUP_RANK")) {
      r.e.node_rank = *g;
      r.node_var = assignment(env, "GROUP_RANK");
    } else if (auto n = opt_int(env, "NODE_RANK")) {
      r.e.node_rank = *n;
      r.node_var = assignment(env, "NODE_RANK");
    } else {
      r.e.node_rank = r.e.local_world > 0 ? r.e.rank / r.e.local_world : 0;
      r.node_var = "node rank " + std::to_string(r.e.node_rank) + " (RANK / LOCAL_WORLD_SIZE)";
    }
    r.e.num_nodes = opt_int(env, "GROUP_WORLD_SIZE").value_or(ceil_div(r.e.world, r.e.local_world));
  } else if (has(env, "PET_NNODES") || has(env, "PET_NPROC_PER_NODE") || has(env, "PET_NODE_RANK")) {
    const char* why = "PyTorchJob variables without RANK/WORLD_SIZE need PET_NNODES, PET_NPROC_PER_NODE and "
                      "PET_NODE_RANK, all plain numbers";
    for (const char* n : {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK"})
      if (!has(env, n)) fail_dist("launch environment: ", why, " (", n, " is unset)");
    for (const char* n : {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK"})
      if (!parse_long(*lookup(env, n)))
        fail_dist("launch environment: ", n, "=", *lookup(env, n), " is not a whole number (", why,
             "; elastic ranges and 'auto' need torchrun)");
    const int nnodes = req_int(env, "PET_NNODES", why), nproc = req_int(env, "PET_NPROC_PER_NODE", why),
              node = req_int(env, "PET_NODE_RANK", why);
    if (nproc > 1 && !has(env, "LOCAL_RANK"))
      fail_dist("launch environment: PET_NPROC_PER_NODE=", nproc,
           " but no LOCAL_RANK: start the ranks of this node with `shardtrain launch` or torchrun");
    r.e.source = "Kubeflow PyTorchJob PET_*";
    r.e.local_rank = opt_int(env, "LOCAL_RANK").value_or(0);
    r.e.local_world = nproc;
    r.e.node_rank = node;
    r.e.num_nodes = nnodes;
    r.e.rank = node * nproc + r.e.local_rank;
    r.e.world = nnodes * nproc;
    r.rank_var = "rank " + std::to_string(r.e.rank) + " (PET_NODE_RANK=" + std::to_string(node) +
                 " × PET_NPROC_PER_NODE=" + std::to_string(nproc) + " + LOCAL_RANK=" +
                 std::to_string(r.e.local_rank) + ")";
    r.world_var = "world " + std::to_string(r.e.world) + " (PET_NNODES=" + std::to_string(nnodes) +
                  " × PET_NPROC_PER_NODE=" + std::to_string(nproc) + ")";
    r.local_rank_var = shown(env, "LOCAL_RANK", r.e.local_rank, "default");
    r.local_world_var = "PET_NPROC_PER_NODE=" + std::to_string(nproc);
    r.node_var = "PET_NODE_RANK=" + std::to_string(node);
  } else {
    return std::nullopt;
  }
  set_master(r, env, {"MASTER_ADDR", "PET_MASTER_ADDR"}, {"MASTER_PORT", "PET_MASTER_PORT"});
  return r;
}

std::optional<Reading> read_openmpi(const Env& env) {
  if (!has(env, "OMPI_COMM_WORLD_RANK") && !has(env, "OMPI_COMM_WORLD_SIZE")) return std::nullopt;
  Reading r;
  r.e.source = "Open MPI";
  r.e.rank = req_int(env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not");
  r.e.world = req_int(env, "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not");
  r.e.local_rank = opt_int(env, "OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
  r.e.local_world = opt_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(1);
  r.e.node_rank = r.e.local_world > 0 ? r.e.rank / r.e.local_world : 0;
  r.e.num_nodes = ceil_div(r.e.world, r.e.local_world);
  r.rank_var = assignment(env, "OMPI_COMM_WORLD_RANK");
  r.world_var = assignment(env, "OMPI_COMM_WORLD_SIZE");
  r.local_rank_var = shown(env, "OMPI_COMM_WORLD_LOCAL_RANK", r.e.local_rank, "default");
  r.local_world_var = shown(env, "OMPI_COMM_WORLD_LOCAL_SIZE", r.e.local_world, "default");
  r.node_var = "node rank " + std::to_string(r.e.node_rank) + " (rank / local size)";
  set_master(r, env, {"MASTER_ADDR"}, {"MASTER_PORT"});
  return r;
}

// "2(x3),1" -> {2, 2, 2, 1}; empty when malformed.
std::vector<int> expand_slurm_counts(const std::string& s) {
  std::vector<int> out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
    auto n = parse_long(s.substr(i, j - i));
    if (!n) return {};
    long times = 1;
    if (s.compare(j, 2, "(x") == 0) {
      const size_t close = s.find(')', j);
      auto t = close == std::string::npos ? std::nullopt : parse_long(s.substr(j + 2, close - j - 2));
      if (!t || *t < 1 || *t > 100000) return {};
      times = *t;
      j = close + 1;
    }
    out.insert(out.end(), static_cast<size_t>(times), static_cast<int>(*n));
    if (j < s.size() && s[j] != ',') return {};
    i = j + 1;
  }
  return out;
}

std::optional<Reading> read_slurm(const Env& env) {
  if (!has(env, "SLURM_PROCID")) return std::nullopt;
  Reading r;
  r.e.source = "Slurm";
  r.e.rank = *opt_int(env, "SLURM_PROCID");
  const char* world_name = has(env, "SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS";
  r.e.world = req_int(env, world_name, "SLURM_PROCID is set but SLURM_NTASKS (or SLURM_NPROCS) is not");
  r.rank_var = assignment(env, "SLURM_PROCID");
  r.world_var = assignment(env, world_name);
  r.e.local_rank = opt_int(env, "SLURM_LOCALID").value_or(0);
  r.local_rank_var = shown(env, "SLURM_LOCALID", r.e.local_rank, "default");
  const std::optional<int> node = opt_int(env, "SLURM_NODEID");
  std::optional<int> nnodes;
  for (const char* n : {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"})
    if ((nnodes = opt_int(env, n))) break;
  if (const std::string* v = lookup(env, "SLURM_NTASKS_PER_NODE")) {
    const std::vector<int> counts = expand_slurm_counts(*v);
    if (counts.empty()) fail_dist("launch environment: SLURM_NTASKS_PER_NODE=", *v, " is not a task count like 4 or 4(x2)");
    r.e.local_world = counts[0];
    r.local_world_var = "SLURM_NTASKS_PER_NODE=" + *v;
  } else if (const char* name = has(env, "SLURM_STEP_TASKS_PER_NODE") ? "SLURM_STEP_TASKS_PER_NODE"
                                : has(env, "SLURM_TASKS_PER_NODE")    ? "SLURM_TASKS_PER_NODE"
                                                                      : nullptr) {
    const std::string& v = *lookup(env, name);
    const std::vector<int> counts = expand_slurm_counts(v);
    const size_t at = static_cast<size_t>(node.value_or(0));
    if (counts.empty() || at >= counts.size())
      fail_dist("launch environment: ", name, "=", v, " has no task count for node ", at);
    r.e.local_world = counts[at];
    r.local_world_var = std::string(name) + "=" + v;
  } else {
    r.e.local_world = ceil_div(r.e.world, nnodes.value_or(1));
    r.local_world_var = "ranks per node " + std::to_string(r.e.local_world) + " (SLURM_NTASKS / SLURM_NNODES)";
  }
  r.e.node_rank = node.value_or(r.e.local_world > 0 ? r.e.rank / r.e.local_world : 0);
  r.node_var = shown(env, "SLURM_NODEID", r.e.node_rank);
  r.e.num_nodes = nnodes.value_or(ceil_div(r.e.world, r.e.local_world));
  set_master(r, env, {"MASTER_ADDR"}, {"MASTER_PORT"});
  if (!r.master_given) {
    for (const char* n : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
      if (const std::string* v = lookup(env, n)) {
        try {
          r.e.master_addr = slurm_first_host(*v);
        } catch (const Error& e) {
          fail_dist("launch environment: ", n, ": ", e.what());
        }
        r.master_given = true;
        break;
      }
  }
  return r;
}

std::optional<Reading> read_indexed_job(const Env& env) {
  if (!has(env, "JOB_COMPLETION_INDEX")) return std::nullopt;
  const KubernetesPlace k = kubernetes_place(env);
  Reading r;
  r.e.source = "Kubernetes Indexed Job";
  r.e.node_rank = k.node_rank;
  r.e.num_nodes = k.nnodes;
  r.e.local_world = k.nproc_per_node;
  if (k.nproc_per_node > 1 && !has(env, "LOCAL_RANK"))
    fail_dist("launch environment: SHARDTRAIN_NPROC_PER_NODE=", k.nproc_per_node,
         " but no LOCAL_RANK: start the ranks of this pod with `shardtrain launch --nproc-per-node ",
         k.nproc_per_node, " -- ...`");
  r.e.local_rank = opt_int(env, "LOCAL_RANK").value_or(0);
  r.e.rank = k.node_rank * k.nproc_per_node + r.e.local_rank;
  r.e.world = k.nnodes * k.nproc_per_node;
  r.e.master_addr = k.master_addr;
  r.e.master_port = k.master_port;
  r.master_given = true;
  r.rank_var = "rank " + std::to_string(r.e.rank) + " (JOB_COMPLETION_INDEX=" + std::to_string(k.node_rank) +
               " × SHARDTRAIN_NPROC_PER_NODE=" + std::to_string(k.nproc_per_node) + " + LOCAL_RANK=" +
               std::to_string(r.e.local_rank) + ")";
  r.world_var = "world " + std::to_string(r.e.world) + " (SHARDTRAIN_NNODES=" + std::to_string(k.nnodes) +
                " × SHARDTRAIN_NPROC_PER_NODE=" + std::to_string(k.nproc_per_node) + ")";
  r.local_rank_var = shown(env, "LOCAL_RANK", r.e.local_rank, "default");
  r.local_world_var = "SHARDTRAIN_NPROC_PER_NODE=" + std::to_string(k.nproc_per_node);
  r.node_var = "JOB_COMPLETION_INDEX=" + std::to_string(k.node_rank);
  r.port_var = has(env, "MASTER_PORT") ? assignment(env, "MASTER_PORT") : "default port 29500";
  return r;
}

void validate(const Reading& r) {
  const DistEnv& e = r.e;
  const std::string from = " (read as " + e.source + " variables)";
  ST_CHECK_DIST(e.world >= 1, "launch environment: ", r.world_var, " must be at least 1", from);
  ST_CHECK_DIST(e.rank >= 0 && e.rank < e.world, "launch environment: ", r.rank_var, " is outside 0..", e.world - 1,
           " for ", r.world_var, from);
  ST_CHECK_DIST(e.local_world >= 1 && e.local_world <= e.world, "launch environment: ", r.local_world_var,
           " must be between 1 and the world size ", e.world, from);
  ST_CHECK_DIST(e.local_rank >= 0 && e.local_rank < e.local_world, "launch environment: ", r.local_rank_var,
           " is outside 0..", e.local_world - 1, " for ", r.local_world_var, from);
  ST_CHECK_DIST(e.num_nodes >= 1 && e.node_rank >= 0 && e.node_rank < e.num_nodes, "launch environment: ", r.node_var,
           " is outside 0..", e.num_nodes - 1, " (", e.num_nodes, " nodes)", from);
  ST_CHECK_DIST(e.master_port >= 1 && e.master_port <= 65535, "launch environment: ", r.port_var,
           " is outside 1..65535", from);
  ST_CHECK_DIST(r.master_given || e.num_nodes == 1 || e.world == 1, "launch environment: ", e.world, " ranks on ",
           e.num_nodes, " nodes need MASTER_ADDR (the host of rank 0)", from);
}

// Torchrun-style and Open MPI readings must describe the same process, or a
// nesting: mpirun started one torchrun per process, which started its local ranks.
void check_agree(const Reading& hi, const Reading& lo) {
  const bool same = hi.e.rank == lo.e.rank && hi.e.world == lo.e.world;
  const bool nested = hi.e.local_world > 1 && hi.e.world == lo.e.world * hi.e.local_world;
  if (same || nested) return;
  const bool rank_differs = hi.e.rank != lo.e.rank;
  fail_dist("launch environment: ", rank_differs ? hi.rank_var : hi.world_var, " but ",
       rank_differs ? lo.rank_var : lo.world_var, ": ", hi.e.source, " says rank ", hi.e.rank, " of ", hi.e.world,
       ", ", lo.e.source, " says rank ", lo.e.rank, " of ", lo.e.world,
       "; unset the stale variables or start the ranks with one launcher");
}

}  // namespace

DistEnv detect_dist_env(const Env& env) {
  std::optional<Reading> torchrun = read_torchrun(env), mpi = read_openmpi(env);
  if (torchrun && mpi) check_agree(*torchrun, *mpi);
  std::optional<Reading> chosen = torchrun ? torchrun : mpi ? mpi : read_slurm(env);
  if (!chosen) chosen = read_indexed_job(env);
  DistEnv e;
  if (chosen) {
    validate(*chosen);
    e = chosen->e;
    e.launched = true;
  }
  if (const std::string* id = lookup(env, "SHARDTRAIN_JOB_ID")) e.job_id = *id;
  if (const std::string* s = lookup(env, "SHARDTRAIN_JOB_SECRET")) e.job_secret = *s;
  for (const char* name : {"SHARDTRAIN_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"})
    if (const std::optional<int> n = opt_int(env, name)) {
      ST_CHECK_DIST(*n >= 0, "launch environment: ", name, "=", *n, " must not be negative");
      e.restart_count = *n;
      break;
    }
  return e;
}

KubernetesPlace kubernetes_place(const Env& env) {
  KubernetesPlace k;
  const char* why = "a Kubernetes Indexed Job pod (JOB_COMPLETION_INDEX is set) needs SHARDTRAIN_NNODES, the "
                    "Job's completions";
  k.node_rank = req_int(env, "JOB_COMPLETION_INDEX", "JOB_COMPLETION_INDEX is empty");
  k.nnodes = req_int(env, "SHARDTRAIN_NNODES", why);
  k.nproc_per_node = opt_int(env, "SHARDTRAIN_NPROC_PER_NODE").value_or(1);
  ST_CHECK_DIST(k.nnodes >= 1, "launch environment: SHARDTRAIN_NNODES=", k.nnodes, " must be at least 1");
  ST_CHECK_DIST(k.node_rank >= 0 && k.node_rank < k.nnodes, "launch environment: JOB_COMPLETION_INDEX=", k.node_rank,
           " is outside 0..", k.nnodes - 1, " for SHARDTRAIN_NNODES=", k.nnodes);
  ST_CHECK_DIST(k.nproc_per_node >= 1, "launch environment: SHARDTRAIN_NPROC_PER_NODE=", k.nproc_per_node,
           " must be at least 1");
  if (auto p = opt_int(env, "MASTER_PORT")) k.master_port = *p;
  ST_CHECK_DIST(k.master_port >= 1 && k.master_port <= 65535, "launch environment: MASTER_PORT=", k.master_port,
           " is outside 1..65535");
  if (const std::string* m = lookup(env, "MASTER_ADDR")) {
    k.master_addr = *m;
    return k;
  }
  if (k.nnodes == 1) return k;  // pod 0 is this pod: loopback
  const std::string* service = lookup(env, "SHARDTRAIN_SERVICE");
  if (!service)
    fail_dist("launch environment: Kubernetes Indexed Job pod ", k.node_rank, " of ", k.nnodes,
         " needs MASTER_ADDR or SHARDTRAIN_SERVICE (the Job's headless Service, whose DNS names the pods)");
  std::string job;
  if (const std::string* j = lookup(env, "SHARDTRAIN_JOB_NAME")) {
    job = *j;
  } else {
    const std::string* host = lookup(env, "HOSTNAME");
    const std::string suffix = "-" + std::to_string(k.node_rank);
    if (!host || host->size() <= suffix.size() || host->compare(host->size() - suffix.size(), suffix.size(), suffix) != 0)
      fail_dist("launch environment: HOSTNAME=", host ? *host : std::string("(unset)"), " is not \"<job>", suffix,
           "\" as Kubernetes names Indexed Job pods; set SHARDTRAIN_JOB_NAME or MASTER_ADDR");
    job = host->substr(0, host->size() - suffix.size());
  }
  k.master_addr = job + "-0." + *service;
  return k;
}

std::string slurm_first_host(const std::string& hostlist) {
  // The first comma-separated entry outside brackets, with each bracket group
  // replaced by its first number: "rack[2-3]-n[08,11]" -> "rack2-n08" (zero padding
  // is part of the name and kept).
  std::string host;
  size_t i = 0;
  while (i < hostlist.size() && hostlist[i] != ',') {
    if (hostlist[i] == '[') {
      const size_t close = hostlist.find(']', i);
      if (close == std::string::npos) fail_dist("hostlist '", hostlist, "' has an unclosed '['");
      const std::string inside = hostlist.substr(i + 1, close - i - 1);
      const std::string first = inside.substr(0, inside.find_first_of(",-"));
      if (first.empty() || first.find_first_not_of("0123456789") != std::string::npos)
        fail_dist("hostlist '", hostlist, "' has a malformed range [", inside, "]");
      host += first;
      i = close + 1;
    } else if (hostlist[i] == ']') {
      fail_dist("hostlist '", hostlist, "' has a ']' without '['");
    } else {
      host += hostlist[i++];
    }
  }
  if (host.empty()) fail_dist("hostlist '", hostlist, "' names no host");
  return host;
}

}  // namespace st
