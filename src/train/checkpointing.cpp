#include "train/checkpointing.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iterator>
#include <thread>
#include <fstream>
#include <map>
#include <memory>

#include "core/error.h"
#include "core/files.h"
#include "core/log.h"
#include "io/safetensors.h"

namespace st {
namespace {

namespace fs = std::filesystem;

const std::pair<const char*, ShardState> kStates[] = {
    {"master", ShardState::Master}, {"m", ShardState::AdamM}, {"v", ShardState::AdamV}};

// Runs f on this rank; then every rank learns whether any failed. A failure here is
// thrown with its own message (and kind, an unclassified one as `kind`); elsewhere
// with `others`, as `kind`.
void all_or_none(Comm& world, const std::function<void()>& f, const std::string& others,
                 ErrorKind kind = ErrorKind::Runtime) {
  std::string mine;
  ErrorKind mine_kind = kind;
  try {
    f();
  } catch (const Error& e) {
    mine = e.what();
    if (e.kind() != ErrorKind::Runtime) mine_kind = e.kind();
  } catch (const std::exception& e) {
    mine = e.what();
  }
  const double failed = world.all_reduce_sum(mine.empty() ? 0.0 : 1.0);
  if (!mine.empty()) throw Error(mine, mine_kind);
  if (failed > 0) fail_as(kind, others);
}

}  // namespace

nlohmann::json model_identity(const ModelConfig& m) {
  return {{"vocab_size", m.vocab_size},         {"hidden_size", m.hidden_size},
          {"intermediate_size", m.intermediate_size}, {"num_layers", m.num_layers},
          {"num_heads", m.num_heads},           {"num_kv_heads", m.num_kv_heads},
          {"tie_word_embeddings", m.tie_word_embeddings}};
}

struct CheckpointWriter::State {
  CheckpointSave what;
  nlohmann::json model;
  std::vector<CheckpointUnit> units;
  int shard_world = 1, replicas = 1;
  std::string tmp, final_dir;
  std::thread thread;
  std::atomic<bool> done{true};
  std::string error;  // set by the thread before done
};

CheckpointWriter::~CheckpointWriter() {
  join();
  free_host();
}

void CheckpointWriter::join() {
  if (state_ && state_->thread.joinable()) state_->thread.join();
}

void CheckpointWriter::free_host() {
  for (HostChunk& c : host_chunks_) {
    if (c.pinned) host_owner_->free_host(c.data);
    else std::free(c.data);
  }
  host_chunks_.clear();
  host_pieces_.clear();
  host_sizes_.clear();
}

void CheckpointWriter::ensure_host(Backend& owner, const std::vector<size_t>& pieces) {
  if (pieces == host_sizes_ && !host_pieces_.empty()) return;
  free_host();
  host_owner_ = &owner;
  size_t chunk = size_t{1} << 28;  // floats: 1 GiB
  for (size_t n : pieces) chunk = std::max(chunk, n);
  // Pieces in order, a new chunk when the next one does not fit.
  std::vector<size_t> chunk_of(pieces.size()), offset(pieces.size()), used;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (used.empty() || used.back() + pieces[i] > chunk) used.push_back(0);
    chunk_of[i] = used.size() - 1;
    offset[i] = used.back();
    used.back() += pieces[i];
  }
  for (size_t k = 0; k < used.size(); ++k) {
    const size_t bytes = std::max<size_t>(used[k], 1) * sizeof(float);
    HostChunk c;
    c.data = static_cast<float*>(owner.alloc_host(bytes));
    c.pinned = c.data != nullptr;
    if (!c.data) c.data = static_cast<float*>(std::malloc(bytes));
    if (!c.data) {
      free_host();
      fail("checkpoint: cannot allocate ", bytes, " bytes of host memory for the shards");
    }
    host_chunks_.push_back(c);
  }
  for (size_t i = 0; i < pieces.size(); ++i) host_pieces_.push_back(host_chunks_[chunk_of[i]].data + offset[i]);
  host_sizes_ = pieces;
}

// The sizes of the pieces a save copies, in save order (unit by unit: master, m, v).
static std::vector<size_t> save_piece_sizes(const ShardPlan& plan) {
  std::vector<size_t> sizes;
  for (int u = 0; u < plan.num_units(); ++u)
    for (size_t k = 0; k < std::size(kStates); ++k) sizes.push_back(plan.shard_numel(u));
  return sizes;
}

void CheckpointWriter::begin(const CheckpointSave& w, const ModelConfig& model, Fsdp& fsdp, Comm& world, Comm& shard,
                             Comm* replicate) {
  if (pending_) poll(world, /*wait=*/true);
  join();
  const ShardPlan& plan = fsdp.plan();
  auto st = std::make_shared<State>();
  st->what = w;
  st->model = model_identity(model);
  st->shard_world = shard.world();
  st->replicas = replicate ? replicate->world() : 1;
  for (int u = 0; u < plan.num_units(); ++u)
    st->units.push_back({plan.layout().unit(u).name, plan.numel(u), plan.padded_numel(u), plan.shard_numel(u)});
  st->final_dir = checkpoint_step_dir(w.dir, w.step);
  st->tmp = st->final_dir + ".tmp";
  all_or_none(
      world,
      [&] {
        if (world.rank() != 0) return;
        std::error_code ec;
        fs::remove_all(st->tmp, ec);
        fs::create_directories(st->tmp, ec);
        if (ec) fail("checkpoint: cannot create '", st->tmp, "': ", ec.message());
      },
      "checkpoint: rank 0 could not create " + st->tmp);
  state_ = st;
  pending_ = true;
  if (replicate && replicate->rank() != 0) return;  // another replica writes this shard
  // The copy to host memory is all that holds training up.
  ensure_host(fsdp.backend(), save_piece_sizes(plan));
  std::vector<std::pair<std::string, std::pair<float*, size_t>>> pieces;  // name -> (data, floats)
  size_t k = 0;
  for (int u = 0; u < plan.num_units(); ++u)
    for (const auto& [suffix, state] : kStates) {
      float* at = host_pieces_[k++];
      fsdp.download_shard_into(u, state, at);
      pieces.push_back({plan.layout().unit(u).name + "." + suffix, {at, plan.shard_numel(u)}});
    }
  const std::string file = checkpoint_shard_file(shard.rank(), shard.world());
  const int rank = shard.rank(), step = w.step;
  st->done = false;
  // The host copy stays untouched until this thread is done: the next save joins it first.
  st->thread = std::thread([st, pieces, file, rank, step] {
    try {
      // Test-only: a slow disk (SHARDTRAIN_TEST_SAVE_DELAY_S), for the grace-period test.
      if (const char* d = std::getenv("SHARDTRAIN_TEST_SAVE_DELAY_S"))
        std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(d)));
      std::vector<TensorToWrite> tensors;
      for (const auto& [name, piece] : pieces)
        tensors.push_back({name, DType::F32, {static_cast<int64_t>(piece.second)}, piece.first});
      const std::string path = (fs::path(st->tmp) / file).string();
      write_safetensors(path, tensors,
                        {{"format", "shardtrain-checkpoint-shard"}, {"shard_rank", std::to_string(rank)},
                         {"shard_world", std::to_string(st->shard_world)}, {"step", std::to_string(step)}});
      // Rank 0 puts every file's hash into the manifest: each writer leaves its own.
      write_text_atomic(path + ".xxh3", file_xxh3(path) + " " + std::to_string(fs::file_size(path)) + "\n");
    } catch (const std::exception& e) {
      st->error = e.what();
    }
    st->done = true;
  });
}

std::string CheckpointWriter::poll(Comm& world, bool wait) {
  if (!pending_) return "";
  auto st = state_;
  if (wait) join();
  // Every rank learns whether all writers have finished, and whether one failed.
  const bool mine_done = st->done.load();
  const double busy = world.all_reduce_sum(mine_done ? 0.0 : 1.0);
  if (busy > 0) return "";
  join();
  pending_ = false;
  const double failed = world.all_reduce_sum(st->error.empty() ? 0.0 : 1.0);
  if (failed > 0) {
    // Nothing of it is usable: free the space (a full disk is the usual cause).
    std::error_code ec;
    if (world.rank() == 0) fs::remove_all(st->tmp, ec);
    if (!st->error.empty()) throw Error(st->error);
    fail("checkpoint: another rank failed writing its shard into ", st->tmp);
  }
  all_or_none(
      world,
      [&] {
        if (world.rank() != 0) return;
        CheckpointManifest m;
        m.step = st->what.step;
        m.shard_world = st->shard_world;
        m.replicas = st->replicas;
        m.units = st->units;
        m.model = st->model;
        m.run_config = st->what.run_config;
        m.seed = st->what.seed;
        m.tokens_seen = st->what.tokens_seen;
        m.fp8_scaling = st->what.fp8_scaling;
        for (int r = 0; r < st->shard_world; ++r) {
          const std::string name = checkpoint_shard_file(r, st->shard_world);
          const fs::path sum = fs::path(st->tmp) / (name + ".xxh3");
          std::ifstream in(sum);
          CheckpointFile f{name, 0, ""};
          if (!(in >> f.xxh3 >> f.bytes)) fail("checkpoint: ", sum.string(), " is missing or malformed");
          in.close();
          fs::remove(sum);
          m.files.push_back(f);
        }
        commit_checkpoint(st->tmp, m);
        if (st->what.keep_last > 0) prune_checkpoints(st->what.dir, st->what.keep_last);
      },
      "checkpoint: rank 0 could not complete " + st->final_dir);
  return st->final_dir;
}

void CheckpointWriter::maybe_save(const CheckpointSchedule& when, int step, uint64_t tokens_seen, bool stop,
                                  const ModelConfig& model, Fsdp& fsdp, Comm& world, Comm& shard, Comm* replicate) {
  const int every = when.every;
  const bool due = every > 0 && (step % every == 0 || step == when.last_step);
  // A checkpoint still being written: committed once every writer is done.
  auto committed = [&](const std::string& dir) {
    if (dir.empty()) return;
    char buf[96];
    std::snprintf(buf, sizeof buf, " (%.2f s after its copy, written while training went on)", now_seconds() - began_);
    when.say("checkpoint: " + dir + buf);
  };
  if (pending()) committed(poll(world, /*wait=*/false));
  if (when.save.dir.empty() || !(due || (stop && every > 0))) return;
  CheckpointSave w = when.save;
  w.step = step;
  w.tokens_seen = tokens_seen;
  if (when.fp8_scaling && world.rank() == 0) w.fp8_scaling = when.fp8_scaling();
  if (pending()) committed(poll(world, /*wait=*/true));  // one save at a time
  const double t0 = now_seconds();
  begin(w, model, fsdp, world, shard, replicate);
  began_ = now_seconds();
  char buf[96];
  std::snprintf(buf, sizeof buf, " started: shards copied to host memory in %.2f s", began_ - t0);
  when.say("checkpoint of step " + std::to_string(step) + buf);
  // The last one (or one asked for by a signal) is waited for.
  if (stop || step == when.last_step) committed(poll(world, /*wait=*/true));
}

void CheckpointWriter::finish(const CheckpointSchedule& when, Comm& world) {
  if (!pending()) return;  // e.g. a run whose last step was not a checkpoint step
  const std::string dir = poll(world, /*wait=*/true);
  if (!dir.empty()) when.say("checkpoint: " + dir);
}

std::string save_checkpoint(const CheckpointSave& w, const ModelConfig& model, Fsdp& fsdp, Comm& world, Comm& shard,
                            Comm* replicate) {
  CheckpointWriter writer;
  writer.begin(w, model, fsdp, world, shard, replicate);
  return writer.poll(world, /*wait=*/true);
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
      "checkpoint: rank 0 refused " + step_dir + " (its message says why)", ErrorKind::Data);

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
      "checkpoint: another rank could not load its shards from " + step_dir, ErrorKind::Data);
  return m;
}

}  // namespace st
