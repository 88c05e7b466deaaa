// `deploy apply` and `deploy verify`: the plan's steps run with the real tools on
// PATH (aws, eksctl, helm, kubectl), each first asking whether it is done already
// (the placement group, the cluster and its node groups, a Helm release at its
// version), so that apply can be run again after a failure. The capacity probe
// refuses short quota, a zone without the instance type, or a reservation with too
// few free instances, with the numbers, before anything is created.
#pragma once
#include <string>

#include "deploy/cluster_file.h"
#include "deploy/submit.h"

namespace st {

struct ApplyOptions {
  std::string out_dir;   // where the artifacts and deploy.log go
  bool dry_run = false;  // print the commands only
  bool train = false;    // also step 8: submit the job and follow it
};

// Runs (or prints) steps 3 to 7 (8 with train). Returns 0 when every step passed;
// throws st::Error naming the step, the command, its exit code and the tail of its
// stderr at the first failure.
int deploy_apply(const ClusterSpec& spec, const ApplyOptions& options);

// `kubectl get nodes|pods|daemonsets -o json` and the checks of deploy/verify.h;
// prints the table (or JSON) and returns 0 when all pass, 1 otherwise.
int deploy_verify(const ClusterSpec& spec, bool json, const std::string& log_path);

// `deploy destroy`: deletes the cluster and its placement group.
int deploy_destroy(const ClusterSpec& spec, const std::string& out_dir);

}  // namespace st
