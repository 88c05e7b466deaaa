#include "train/checkpointing.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>

#include "core/error.h"
#include "io/safetensors.h"

namespace st {
namespace {

namespace fs = std::filesystem;

const std::pair<const char*, ShardState> kStates[] = {
    {"master", ShardState::Master}, {"m", ShardState::AdamM}, {"v", ShardState::AdamV}};

// Runs f on this rank; then every rank learns whether any failed. A failure here is
// thrown with its own message; elsewhere with `others`.
void all_or_none(Comm& world, const std::function<void()>& f, const std::string& others) {
  std::string mine;
  try {
    f();
  } catch (const std::exception& e) {
    mine = e.what();
  }
  const double failed = world.all_reduce_sum(mine.empty() ? 0.0 : 1.0);
  if (!mine.empty()) throw Error(mine);
  if (failed > 0) fail(others);
}

}  // namespace

nlohmann::json model_identity(const ModelConfig& m) {
  return {{"vocab_size", m.vocab_size},         {"hidden_size", m.hidden_size},
          {"intermediate_size", m.intermediate_size}, {"num_layers", m.num_layers},
          {"num_heads", m.num_heads},           {"num_kv_heads", m.num_kv_heads},
          {"tie_word_embeddings", m.tie_word_embeddings}};
}

std::string save_checkpoint(const CheckpointSave& w, const ModelConfig& model, Fsdp& fsdp, Comm& world,
                            Comm& shard, Comm* replicate) {
  const ShardPlan& plan = fsdp.plan();
  const std::string final_dir = checkpoint_step_dir(w.dir, w.step), tmp = final_dir + ".tmp";
  const bool writer = !replicate || replicate->rank() == 0;
  const std::string file = checkpoint_shard_file(shard.rank(), shard.world());
  all_or_none(
      world,
      [&] {
        if (world.rank() != 0) return;
        std::error_code ec;
        fs::remove_all(tmp, ec);
        fs::create_directories(tmp, ec);
        if (ec) fail("checkpoint: cannot create '", tmp, "': ", ec.message());
      },
      "checkpoint: rank 0 could not create " + tmp);
  all_or_none(
      world,
      [&] {
        if (!writer) return;
        std::vector<std::vector<float>> keep;  // the data the tensors point at
        std::vector<TensorToWrite> tensors;
        keep.reserve(plan.num_units() * 3);
        for (int u = 0; u < plan.num_units(); ++u)
          for (const auto& [suffix, state] : kStates) {
            keep.push_back(fsdp.download_shard(u, state));
            tensors.push_back({plan.layout().unit(u).name + "." + suffix, DType::F32,
                               {static_cast<int64_t>(keep.back().size())}, keep.back().data()});
          }
        const std::string path = (fs::path(tmp) / file).string();
        write_safetensors(path, tensors,
                          {{"format", "shardtrain-checkpoint-shard"}, {"shard_rank", std::to_string(shard.rank())},
                           {"shard_world", std::to_string(shard.world())}, {"step", std::to_string(w.step)}});
        // Rank 0 puts every file's hash into the manifest: each writer leaves its own.
        std::ofstream(path + ".xxh3") << file_xxh3(path) << " " << fs::file_size(path) << "\n";
      },
      "checkpoint: another rank failed writing its shard into " + tmp);
  all_or_none(
      world,
      [&] {
        if (world.rank() != 0) return;
        CheckpointManifest m;
        m.step = w.step;
        m.shard_world = shard.world();
        m.replicas = replicate ? replicate->world() : 1;
        for (int u = 0; u < plan.num_units(); ++u)
          m.units.push_back({plan.layout().unit(u).name, plan.numel(u), plan.padded_numel(u), plan.shard_numel(u)});
        m.model = model_identity(model);
        m.run_config = w.run_config;
        m.seed = w.seed;
        m.tokens_seen = w.tokens_seen;
        for (int r = 0; r < shard.world(); ++r) {
          const std::string name = checkpoint_shard_file(r, shard.world());
          const fs::path sum = fs::path(tmp) / (name + ".xxh3");
          std::ifstream in(sum);
          CheckpointFile f{name, 0, ""};
          if (!(in >> f.xxh3 >> f.bytes)) fail("checkpoint: ", sum.string(), " is missing or malformed");
          in.close();
          fs::remove(sum);
          m.files.push_back(f);
        }
        commit_checkpoint(tmp, m);
        if (w.keep_last > 0) prune_checkpoints(w.dir, w.keep_last);
      },
      "checkpoint: rank 0 could not complete " + final_dir);
  return final_dir;
}

CheckpointManifest load_checkpoint(const std::string& step_dir, const ModelConfig& model, Fsdp& fsdp, Comm& world,
                                   Comm& shard) {
  const ShardPlan& plan = fsdp.plan();
  CheckpointManifest m;
  // Everything checked before any state changes: rank 0 reads every file's hash.
  all_or_none(
      world,
      [&] {
        m = read_checkpoint(step_dir, /*verify_hashes=*/world.rank() == 0);
        if (m.model != model_identity(model))
          fail(step_dir, ": a checkpoint of another model: it holds ", m.model.dump(), ", this run is ",
               model_identity(model).dump());
        if (static_cast<int>(m.units.size()) != plan.num_units())
          fail(step_dir, ": ", m.units.size(), " units saved, the model has ", plan.num_units());
        for (int u = 0; u < plan.num_units(); ++u)
          if (m.units[u].name != plan.layout().unit(u).name || m.units[u].numel != plan.numel(u))
            fail(step_dir, ": unit ", u, " is '", m.units[u].name, "' of ", m.units[u].numel, " values; this model's is '",
                 plan.layout().unit(u).name, "' of ", plan.numel(u));
        if (static_cast<int>(m.files.size()) != m.shard_world)
          fail(step_dir, ": the manifest lists ", m.files.size(), " files for ", m.shard_world, " shards");
      },
      "checkpoint: rank 0 refused " + step_dir + " (its message says why)");

  const ShardPlan saved(plan.layout(), m.shard_world);
  std::map<int, std::unique_ptr<SafetensorsFile>> open;
  auto source = [&](int r) -> const SafetensorsFile& {
    auto& f = open[r];
    if (!f) f = std::make_unique<SafetensorsFile>(SafetensorsFile::open(
                (fs::path(step_dir) / checkpoint_shard_file(r, m.shard_world)).string()));
    return *f;
  };
  all_or_none(
      world,
      [&] {
        for (int u = 0; u < plan.num_units(); ++u)
          for (const auto& [suffix, state] : kStates) {
            const std::string name = plan.layout().unit(u).name + "." + suffix;
            std::vector<float> mine(plan.shard_numel(u), 0.0f);
            for (const ShardPiece& p : plan.pieces_from(saved, u, shard.rank())) {
              const SafetensorsFile& f = source(p.src_rank);
              const TensorInfo* t = f.find(name);
              if (!t || t->dtype != DType::F32 || t->numel() != saved.shard_numel(u))
                fail(f.path(), ": tensor '", name, "' missing or not f32[", saved.shard_numel(u), "]");
              const float* src = static_cast<const float*>(f.data(*t));
              std::copy(src + p.src_offset, src + p.src_offset + p.numel, mine.begin() + p.dst_offset);
            }
            fsdp.upload_shard(u, state, mine);
          }
      },
      "checkpoint: another rank could not load its shards from " + step_dir);
  return m;
}

}  // namespace st
