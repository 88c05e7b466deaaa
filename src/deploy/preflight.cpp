#include "deploy/preflight.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "stepmodel/gpu_peaks.h"

namespace st {
namespace {

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

bool is_digest(const std::string& d) {
  if (d.rfind("sha256:", 0) != 0 || d.size() != 7 + 64) return false;
  return std::all_of(d.begin() + 7, d.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) && !std::isupper(static_cast<unsigned char>(c)); });
}

}  // namespace

Allocatable eks_allocatable(const InstanceFacts& f) {
  // kube-reserved CPU: 6% of the first core, 1% of the second, 0.5% of the next two,
  // 0.25% of every core above four.
  const double cores = f.vcpus;
  double reserved = 0.06 * std::min(cores, 1.0) + 0.01 * std::clamp(cores - 1, 0.0, 1.0) +
                    0.005 * std::clamp(cores - 2, 0.0, 2.0) + 0.0025 * std::max(cores - 4, 0.0);
  const double mem_reserved_mib = 255 + 11.0 * f.max_pods + 100;
  return {cores - reserved, f.memory_gib - mem_reserved_mib / 1024};
}

std::vector<Finding> preflight(const ClusterSpec& s, const PreflightOptions& o) {
  std::vector<Finding> out;
  auto refuse = [&](const std::string& key, const std::string& msg) { out.push_back({true, key, msg}); };
  auto note = [&](const std::string& key, const std::string& msg) { out.push_back({false, key, msg}); };
  const InstanceFacts& g = *s.gpu.facts;
  const std::string& type = s.gpu.instance_type;

  // Zones and the VPC.
  if (s.zones.size() < 2)
    refuse("cluster.zones", "EKS places its control plane in at least two availability zones; list two (the GPU "
                            "node group still uses one of them, nodes.gpu.zones)");
  const std::vector<std::string>& gz = s.gpu.zones.empty() ? s.zones : s.gpu.zones;
  if (s.gpu.efa && gz.size() != 1)
    refuse("nodes.gpu.zones", "EFA traffic does not cross availability zones: with nodes.gpu.efa = true the GPU "
                              "nodes must be in exactly one zone, got " + std::to_string(gz.size()) +
                                  (s.gpu.zones.empty() ? " (the cluster's zones; set nodes.gpu.zones)" : ""));
  for (const std::string& z : s.gpu.zones)
    if (std::find(s.zones.begin(), s.zones.end(), z) == s.zones.end())
      refuse("nodes.gpu.zones", "zone '" + z + "' is not one of cluster.zones");
  for (const std::string& z : s.zones)
    if (z.rfind(s.region, 0) != 0 || z.size() <= s.region.size())
      refuse("cluster.zones", "zone '" + z + "' is not in region " + s.region);
  if (s.create_vpc) {
    if (!s.vpc_id.empty() || !s.private_subnets.empty())
      refuse("cluster.vpc.create", "create = true makes a new VPC; cluster.vpc.id and private_subnets are for an "
                                   "existing one (set create = false)");
  } else {
    if (s.vpc_id.rfind("vpc-", 0) != 0)
      refuse("cluster.vpc.id", "an existing VPC (create = false) needs its id, vpc-...");
    for (const std::string& z : s.zones)
      if (!s.private_subnets.count(z))
        refuse("cluster.vpc.private_subnets", "no private subnet for zone '" + z + "'");
    // One subnet per zone, all in the VPC above: EFA peers must share the VPC and subnet.
    for (const auto& [z, id] : s.private_subnets)
      if (id.rfind("subnet-", 0) != 0)
        refuse("cluster.vpc.private_subnets." + z, "'" + id + "' is not a subnet id (subnet-...)");
  }

  // EFA.
  if (s.gpu.efa && g.efa_interfaces == 0)
    refuse("nodes.gpu.efa", type + " has no EFA interfaces; use an EFA-capable type (docs/instance_facts.md) or "
                                   "efa = false");
  if (s.pod_efa > g.efa_interfaces)
    refuse("workload.resources.efa", "a pod asks for " + std::to_string(s.pod_efa) + " vpc.amazonaws.com/efa but " +
                                         type + " has " + std::to_string(g.efa_interfaces));
  if (s.pod_efa > 0 && !s.gpu.efa)
    refuse("workload.resources.efa", "pods ask for EFA devices but nodes.gpu.efa is false: none would be advertised");
  if (s.gpu.efa && s.pod_efa == 0 && (s.expect_transport == "efa" || s.transport == "efa"))
    refuse("workload.resources.efa",
           "the worker pods ask for no vpc.amazonaws.com/efa but " +
               std::string(s.expect_transport == "efa" ? "train.expect_transport" : "fabric.transport") +
               " = \"efa\": without an EFA device in the pod NCCL cannot use EFA and every rank would refuse its "
               "transport once the nodes are paid for; ask for the node's " + std::to_string(g.efa_interfaces) +
               " (or leave the key out), or expect \"socket\"");
  if (s.gpu.efa && s.pod_efa > 0 && s.pod_efa < g.efa_interfaces)
    note("workload.resources.efa", "a pod asks for " + std::to_string(s.pod_efa) + " of the " +
                                       std::to_string(g.efa_interfaces) + " EFA interfaces of a " + type +
                                       ": NCCL gets that share of the node's EFA bandwidth and the rest stays idle; "
                                       "leave the key out to take all " + std::to_string(g.efa_interfaces));
  if (s.expect_transport == "efa" && !s.gpu.efa)
    refuse("train.expect_transport", "expect_transport = \"efa\" with nodes.gpu.efa = false: every rank would "
                                     "refuse to train; enable EFA or expect \"socket\"");
  if (s.transport == "efa" && !s.gpu.efa)
    refuse("fabric.transport", "transport = \"efa\" needs nodes.gpu.efa = true");

  // FP8 where the GPU has no FP8 tensor cores: every rank would refuse at start, on
  // nodes already paid for.
  if (s.run.train.matmul_dtype == "fp8") {
    const GpuPeak* peak = find_gpu_peak(g.gpu_model);
    if (peak && !peak->has_fp8())
      refuse("train.matmul_dtype", "the run config asks for matmul_dtype = \"fp8\" on a " + type + ", but " +
                                       fp8_unsupported(*peak) + "; every rank would refuse to train. Use \"bf16\", "
                                       "or an instance with L4, L40S, H100 or H200 GPUs (g6, g6e, p5, p5e)");
    else if (!peak)
      note("train.matmul_dtype", "matmul_dtype = \"fp8\" on " + g.gpu_model + ", which the step model's table "
                                 "does not know: whether it has FP8 tensor cores (compute capability 8.9 or more) "
                                 "is checked only when the ranks start");
  }

  // One pod per node, every GPU of it.
  if (s.pod_gpus != g.gpus)
    refuse("workload.resources.gpus", "one worker pod per node takes all of its GPUs: " + type + " has " +
                                          std::to_string(g.gpus) + ", the pod asks for " + std::to_string(s.pod_gpus));
  const Allocatable a = eks_allocatable(g);
  if (s.pod_cpu > a.cpu)
    refuse("workload.resources.cpu", "a pod asks for " + std::to_string(s.pod_cpu) + " CPU but a " + type +
                                         " node has " + fmt(a.cpu) + " allocatable (" + std::to_string(g.vcpus) +
                                         " vCPU less the kubelet's reservation)");
  if (s.pod_memory_gib > a.memory_gib)
    refuse("workload.resources.memory_gib", "a pod asks for " + std::to_string(s.pod_memory_gib) + " GiB but a " +
                                                type + " node has " + fmt(a.memory_gib) + " GiB allocatable (" +
                                                fmt(g.memory_gib) + " GiB less the kubelet's reservation)");
  if (s.shm_gib > s.pod_memory_gib)
    refuse("workload.resources.shm_gib", "/dev/shm (" + std::to_string(s.shm_gib) +
                                             " GiB) is memory of the pod and cannot exceed its limit (" +
                                             std::to_string(s.pod_memory_gib) + " GiB)");

  // The image: pinned, so a rerun runs the same bytes.
  if (s.image_digest.empty() && !s.allow_unpinned)
    refuse("image.digest", "the image " + s.image_repository + (s.image_tag.empty() ? "" : ":" + s.image_tag) +
                               " is not pinned: a tag can move, so two runs could use different bytes; set "
                               "image.digest = \"sha256:...\" (or image.allow_unpinned = true)");
  // sha256:000...0 names no image: the sample files' placeholder.
  auto placeholder = [](const std::string& d) { return is_digest(d) && d.find_first_not_of('0', 7) == std::string::npos; };
  const std::string base_digest =
      s.base_image.find('@') == std::string::npos ? "" : s.base_image.substr(s.base_image.find('@') + 1);
  for (const auto& [key, digest] : {std::pair<std::string, std::string>{"image.digest", s.image_digest},
                                    {"image.base", base_digest}}) {
    if (!placeholder(digest)) continue;
    const std::string what = key == "image.digest" ? "the image the pods run" : "the Dockerfile's base";
    if (s.allow_unpinned)
      note(key, "the digest of " + what + " is the all-zero placeholder (image.allow_unpinned = true): no registry "
                "has it; put the real digest here before `deploy apply`");
    else
      refuse(key, "the digest of " + what + " is the all-zero placeholder, which no registry has: " +
                      (key == "image.digest" ? "build and push the image and put the digest `docker push` printed here"
                                             : "put the base image's digest here (docker buildx imagetools inspect)") +
                      " (or image.allow_unpinned = true to plan with it)");
  }
  if (!s.image_digest.empty() && !is_digest(s.image_digest))
    refuse("image.digest", "'" + s.image_digest + "' is not a digest (sha256: and 64 lower-case hex digits)");
  if (s.base_image.empty())
    refuse("image.base", "the Dockerfile needs a base image (a CUDA runtime, pinned: repository:tag@sha256:...)");
  else if (s.base_image.find("@sha256:") == std::string::npos && !s.allow_unpinned)
    refuse("image.base", "the base image '" + s.base_image + "' is not pinned by digest (@sha256:...)");
  else if (s.base_image.find("@") != std::string::npos && !is_digest(s.base_image.substr(s.base_image.find('@') + 1)))
    refuse("image.base", "'" + s.base_image.substr(s.base_image.find('@') + 1) + "' is not a sha256 digest");

  // The EFA installer the Dockerfile downloads: checked against its SHA-256, so a
  // rebuild installs the same bytes (or fails).
  const bool sha_ok = s.efa_installer_sha256.size() == 64 &&
                      std::all_of(s.efa_installer_sha256.begin(), s.efa_installer_sha256.end(), [](char c) {
                        return std::isxdigit(static_cast<unsigned char>(c)) && !std::isupper(static_cast<unsigned char>(c));
                      });
  if (!s.efa_installer_sha256.empty() && !sha_ok)
    refuse("image.efa_installer_sha256", "'" + s.efa_installer_sha256 + "' is not a SHA-256 (64 lower-case hex digits)");
  if (s.gpu.efa && s.efa_installer_sha256.empty()) {
    const std::string what = "the Dockerfile downloads the EFA installer without a checksum to compare it with; set "
                             "image.efa_installer_sha256 (sha256sum of aws-efa-installer-<version>.tar.gz, "
                             "downloaded once and checked)";
    if (s.allow_unpinned) note("image.efa_installer_sha256", what + " (image.allow_unpinned = true: planned without)");
    else refuse("image.efa_installer_sha256", what + " (or image.allow_unpinned = true)");
  }

  // Capacity.
  if (s.gpu.capacity == "reservation" && s.gpu.capacity_reservation_id.rfind("cr-", 0) != 0)
    refuse("nodes.gpu.capacity_reservation_id", "capacity = \"reservation\" needs the reservation's id (cr-...)");
  if (s.gpu.capacity == "on-demand" && !s.gpu.capacity_reservation_id.empty())
    refuse("nodes.gpu.capacity", "a capacity_reservation_id is set but capacity is \"on-demand\"");
  const long need = static_cast<long>(s.gpu.count) * g.vcpus;
  if (o.vcpu_quota && s.gpu.capacity == "on-demand" && need > *o.vcpu_quota)
    refuse("nodes.gpu.count", std::to_string(s.gpu.count) + " x " + type + " need " + std::to_string(need) +
                                  " vCPU of \"" + g.quota_name + "\" (" + g.quota_code + ") but the quota is " +
                                  std::to_string(*o.vcpu_quota) + "; ask AWS for more or use a capacity reservation");
  if (s.gpu.own_facts)
    note("nodes.gpu.facts", type + " is described by the cluster file, not the built-in table: " +
                                std::to_string(g.vcpus) + " vCPU, " + fmt(g.memory_gib) + " GiB, " +
                                std::to_string(g.gpus) + " GPUs, " + std::to_string(g.efa_interfaces) +
                                " EFA interfaces, max " + std::to_string(g.max_pods) +
                                " pods; every check above used these figures (compare them with `aws ec2 "
                                "describe-instance-types --instance-types " + type + "`)");
  if (s.system.facts && s.system.facts->gpus > 0)
    note("nodes.system.instance_type", s.system.instance_type + " has GPUs; the system group needs none");

  // The run configuration against the world it will have.
  const int world = s.world();
  const DistOptions& d = s.run.dist;
  if (d.shard_group_size > 0 && (world % d.shard_group_size != 0))
    refuse("train.set", "dist.shard_group_size = " + std::to_string(d.shard_group_size) + " does not divide the " +
                            "world of " + std::to_string(world) + " ranks (" + std::to_string(s.gpu.count) +
                            " nodes x " + std::to_string(s.pod_gpus) + " GPUs)");
  if (s.run.model.num_kv_heads <= 0 || s.run.model.num_heads % s.run.model.num_kv_heads != 0)
    refuse("train.set", "the model's heads (" + std::to_string(s.run.model.num_heads) + ") are not a multiple of its "
                        "kv heads (" + std::to_string(s.run.model.num_kv_heads) + ")");
  note("", "world: " + std::to_string(s.gpu.count) + " nodes x " + std::to_string(s.pod_gpus) + " GPUs = " +
               std::to_string(world) + " ranks; global batch " + std::to_string(s.run.train.micro_batch) + " x " +
               std::to_string(s.run.train.grad_accum) + " x " + std::to_string(world) + " = " +
               std::to_string(s.run.train.micro_batch * s.run.train.grad_accum * world) + " sequences of " +
               std::to_string(s.run.train.seq_len) + " tokens per step (sharding is by flat buffers, so the "
               "world size needs no relation to the model's heads)");
  if (!s.checkpoint_claim.empty() && s.run.run.checkpoint_every == 0)
    note("workload.checkpoint_claim", "a checkpoint volume is mounted but run.checkpoint_every is 0: nothing is "
                                      "saved there (set \"run.checkpoint_every\" in [train.set])");
  note("nodes.gpu.instance_type", "instance availability varies by region and zone: `deploy apply` checks that " +
                                      (gz.empty() ? s.region : gz.front()) + " offers " + type +
                                      " (aws ec2 describe-instance-type-offerings) before creating anything");
  if (!o.vcpu_quota && s.gpu.capacity == "on-demand")
    note("nodes.gpu.count", std::to_string(s.gpu.count) + " x " + type + " need " + std::to_string(need) +
                                " vCPU of \"" + g.quota_name + "\" (" + g.quota_code +
                                "); pass --vcpu-quota N to check it here, `deploy apply` asks AWS");
  return out;
}

}  // namespace st
