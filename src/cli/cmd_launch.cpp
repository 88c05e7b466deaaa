#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "comm/tcp_store.h"
#include "core/error.h"
#include "launch/env.h"
#include "launch/launcher.h"

namespace st {

Command add_launch_command(CLI::App& root) {
  auto opt = std::make_shared<LaunchOptions>();
  CLI::App* app = root.add_subcommand(
      "launch",
      "Start this node's ranks as child processes, each running `shardtrain <args after -->` with\n"
      "RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, MASTER_ADDR and MASTER_PORT set\n"
      "(torchrun's names). Their output is printed line by line as \"[rank R] ...\". When a rank\n"
      "fails, the others get SIGTERM, then SIGKILL after --grace-period; Ctrl-C (SIGINT/SIGTERM)\n"
      "is forwarded to every rank, a second one kills them. Exits 0 only if every rank did.\n"
      "Each rank's end is printed as \"launch: rank R (pid P): exited 0\" (or \"failed with exit code N\",\n"
      "\"killed by signal S\"); a failed launch ends with every rank's state.\n"
      "Rank variables of Slurm, Open MPI, PMI and PyTorchJob (PET_*) are removed from the ranks'\n"
      "environment, so running `launch` inside an srun step is unambiguous.\n"
      "In a Kubernetes Indexed Job pod (JOB_COMPLETION_INDEX set) --nnodes, --node-rank, --master-addr\n"
      "and --master-port default to the pod's place: SHARDTRAIN_NNODES, the completion index, and pod 0\n"
      "behind the headless Service SHARDTRAIN_SERVICE (docs/operations.md).");
  app->footer(
      "Examples:\n"
      "  shardtrain launch --nproc-per-node 4 -- train --config configs/tiny.toml\n"
      "  # two machines, 8 ranks each; run on both, with --node-rank 0 on the first:\n"
      "  shardtrain launch --nproc-per-node 8 --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 -- train ...\n"
      "  # any program, e.g. to look at the contract:\n"
      "  shardtrain launch --nproc-per-node 2 --program /bin/sh -- -c 'echo $RANK/$WORLD_SIZE'");
  app->add_option("--nproc-per-node", opt->nproc_per_node, "Ranks to start on this node")->required();
  CLI::Option* nnodes = app->add_option("--nnodes", opt->nnodes, "Nodes in the job")->capture_default_str();
  CLI::Option* node_rank =
      app->add_option("--node-rank", opt->node_rank, "This node's index, 0..nnodes-1")->capture_default_str();
  CLI::Option* master_addr =
      app->add_option("--master-addr", opt->master_addr, "Address of rank 0's node, reachable from every node")
          ->capture_default_str();
  CLI::Option* master_port =
      app->add_option("--master-port", opt->master_port, "Rendezvous port on the master")->capture_default_str();
  app->add_option("--program", opt->program,
                  "Run this executable (a path, or a name looked up on PATH) instead of shardtrain itself");
  app->add_option("--grace-period", opt->grace_s, "Seconds between SIGTERM and SIGKILL when stopping ranks")
      ->capture_default_str();
  app->add_option("--max-restarts", opt->max_restarts,
                  "When a rank fails, stop them all and start them all again, up to this many times (a training "
                  "run resumes from its latest checkpoint: run.resume=auto); never after a rank exits 2 (usage or "
                  "configuration) or 3 (input data or model files), which a restart would repeat")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  app->add_option("--job-id", opt->job_id,
                  "This job's identity, given to every rank as SHARDTRAIN_JOB_ID: the rendezvous refuses a rank "
                  "of another job (two jobs on one --master-port). Default: SHARDTRAIN_JOB_ID, else a random one "
                  "for a one-node job; a job of several nodes needs the same value on each node to be checked");
  app->add_option("--secret-file", opt->job_secret,
                  "Read the job secret from this file (its first line; at least 16 bytes), given to every rank as "
                  "SHARDTRAIN_JOB_SECRET: a process joins the rendezvous only by proving it holds the secret "
                  "(docs/operations.md, \"Rendezvous security\"). Default: SHARDTRAIN_JOB_SECRET, else a random one "
                  "for a one-node job; every node of a larger job needs the same secret");
  // Everything after `--` lands here: CLI11 takes what follows it as positionals only.
  app->add_option("args", opt->args, "Arguments for every rank, after `--` (a shardtrain command by default)");
  // Without `--`, a rank's options (`train --config x`) would be taken as launch's own
  // and rejected with a bare "not expected"; keep them instead, to say where they go.
  app->allow_extras();
  return {app, [=] {
            std::string extras;
            for (const std::string& a : app->remaining())
              if (a != "--") extras += " " + a;  // CLI11 keeps the separator itself in remaining()
            if (!extras.empty())
              fail_config("launch: unknown option(s)", extras,
                   "; a rank's own arguments go after `--`, e.g.\n"
                   "  shardtrain launch --nproc-per-node 4 -- train --config configs/tiny.toml");
            // A Kubernetes Indexed Job pod: its place, where the options do not say.
            const auto env = environ_map();
            if (env.count("JOB_COMPLETION_INDEX") && !env.at("JOB_COMPLETION_INDEX").empty()) {
              const KubernetesPlace k = kubernetes_place(env);
              if (!nnodes->count()) opt->nnodes = k.nnodes;
              if (!node_rank->count()) opt->node_rank = k.node_rank;
              if (!master_addr->count()) opt->master_addr = k.master_addr;
              if (!master_port->count()) opt->master_port = k.master_port;
            }
            // A one-node job is all here, so a random identity serves; nodes of a larger
            // job must agree on theirs (--job-id or SHARDTRAIN_JOB_ID), or none is checked.
            if (opt->job_id.empty() && !(env.count("SHARDTRAIN_JOB_ID") && !env.at("SHARDTRAIN_JOB_ID").empty()) &&
                opt->nnodes == 1) {
              std::random_device rd;
              char id[32];
              std::snprintf(id, sizeof id, "launch-%08x%08x", rd(), rd());
              opt->job_id = id;
            }
            // The secret: from the file, else the environment's (kept as is), else a new
            // one for a job that is all on this node.
            if (!opt->job_secret.empty()) {
              const std::string path = opt->job_secret;
              std::ifstream in(path);
              ST_CHECK_CONFIG(in.good(), "launch --secret-file ", path, ": cannot be read");
              std::string text;
              std::getline(in, text);
              while (!text.empty() && (text.back() == '\r' || text.back() == ' ' || text.back() == '\t')) text.pop_back();
              ST_CHECK_CONFIG(text.size() >= kMinJobSecretBytes, "launch --secret-file ", path, ": the secret is ",
                              text.size(), " bytes; at least ", kMinJobSecretBytes, " are needed");
              opt->job_secret = text;
            } else if (!(env.count("SHARDTRAIN_JOB_SECRET") && !env.at("SHARDTRAIN_JOB_SECRET").empty()) &&
                       opt->nnodes == 1) {
              opt->job_secret = new_job_secret();
            }
            return launch_local_ranks(*opt);
          }};
}

}  // namespace st
