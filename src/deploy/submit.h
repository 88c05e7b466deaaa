// `deploy submit` (step 8) and the commands around a run: `status`, `logs`, `down`.
// Submit follows the object each engine makes, as its controller reports it:
//   job         the Indexed Job's pods (selected by the Job's UID) and its
//               Complete / Failed condition; rank 0's log as "[pod 0] ..."
//   kuberay     the RayJob's status.jobDeploymentStatus and status.jobStatus (and
//               its message), the RayCluster's worker pods while they wait, and the
//               submitter Job's pod, whose log is the driver's, as "[driver] ..."
//   pytorchjob  the PyTorchJob's conditions (Created, Running, Succeeded / Failed)
//               and its pods (by owner UID); the Master's log as "[master] ..."
// A finished object of the same name (an earlier run) is deleted first: an
// operator does not run a finished job again when it is applied unchanged.
// The run's job secret (SHARDTRAIN_JOB_SECRET, the rendezvous' authentication) is
// a Kubernetes Secret every worker pod reads through secretKeyRef; submit creates
// it when it is missing, with a new random value for each run of the engines
// `job` and `pytorchjob` (the Ray workers of `kuberay` read it when they start, so
// it lives as long as the RayCluster). Its value never reaches a command line, the
// log or the plan directory (kubectl reads it from a private temporary file).
#pragma once
#include <string>

#include "deploy/cluster_file.h"
#include "deploy/tools.h"

namespace st {

struct SubmitOptions {
  std::string out_dir;        // the artifacts (job.yaml) and deploy.log
  double timeout_s = 86400;   // give up (exit 1) after this long
  double poll_s = 2;          // how often the job and its pods are looked at
};

// Applies job.yaml and follows it to its end: 0 when this run succeeded; throws
// st::Error (exit 1) naming the failed pods, the RayJob's message or the
// PyTorchJob's condition, with the lines of the failing rank's log that say why.
int deploy_submit(const ClusterSpec& spec, const SubmitOptions& options);

// The job secret's Secret: created (random, 32 bytes as 64 hex digits) when it is
// missing, or replaced when `renew`. Prints what it did.
void ensure_job_secret(const ToolRunner& run, const ClusterSpec& spec, bool renew);

// `deploy status`: the job and its pods. `deploy logs`: a pod's log (the pod of
// global rank `rank`, its lines only; rank < 0: pod 0, everything).
int deploy_status(const ClusterSpec& spec);
int deploy_logs(const ClusterSpec& spec, int rank);
// `deploy down`: deletes the job, its Secret and the workload (the cluster stays).
int deploy_down(const ClusterSpec& spec, const std::string& out_dir);

}  // namespace st
