#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "backend/factory.h"
#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"
#include "core/files.h"
#include "data/token_file.h"
#include "io/hf_checkpoint.h"
#include "io/npy.h"
#include "model/dense_params.h"
#include "model/qwen2.h"

namespace st {

namespace {

// What scoring holds at once, counted before anything is allocated: the weights in the
// compute dtype and their fp32 copy while loading, the activations of the longest
// sequence, and the fp32 logits when asked for (a lower bound, as the training check).
void check_score_memory(Backend& be, const ModelConfig& cfg, DType dt, size_t tokens, size_t longest, bool logits) {
  const size_t available = be.memory_available_bytes();
  if (available == 0) return;
  using U = unsigned __int128;
  const U params = static_cast<U>(cfg.num_params());
  const U weights = params * dtype_size(dt), host = params * 4 + (logits ? static_cast<U>(tokens) * cfg.vocab_size * 4 : 0);
  const U acts = Qwen2Model::activation_bytes_for(cfg, dt, 1, static_cast<int64_t>(longest));
  // On the CPU everything is host memory; on a GPU the weights and activations are.
  const U need = be.device() == Device::CPU ? weights + acts + host : weights + acts;
  if (need <= available) return;
  auto b = [](U v) { return human_bytes(static_cast<double>(v)); };
  fail("not enough memory to score ", cfg.source, ": at least ", b(need), " (weights ", b(weights), ", activations ",
       b(acts), " for ", longest, " tokens", be.device() == Device::CPU ? ", fp32 weights while loading and logits " + b(host) : "",
       "; a lower bound), but ", be.memory_available_source(), " has ", b(available), " available");
}

}  // namespace

Command add_score_command(CLI::App& root) {
  struct State {
    std::string init_from, tokens, logits_out, device = "cpu";
  };
  auto s = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "score",
      "Mean next-token loss of a Hugging Face Qwen2 model over given token ids, printed as\n"
      "`loss <value>` (each sequence predicts its tokens 1..T-1 from the ones before).");
  app->add_option("--init-from", s->init_from, "Hugging Face model directory (config.json + safetensors)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app->add_option("--tokens", s->tokens,
                  "token ids: .npy of int32/int64 (1-D or 2-D, one sequence per row) or a text file of "
                  "integers, one sequence per line")
      ->required()
      ->check(CLI::ExistingFile);
  app->add_option("--logits-out", s->logits_out,
                  "also write fp32 logits as .npy: (sequences, T, vocab) when all sequences have length T, "
                  "else (total tokens, vocab)");
  app->add_option("--device", s->device, "cpu or cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  return {app, [s] {
            // Every check before the work: an output that cannot be written fails now,
            // not after the scoring (and leaves nothing behind).
            if (!s->logits_out.empty()) check_output_file(s->logits_out, "score: --logits-out");
            const ModelConfig cfg = load_hf_config(s->init_from);
            const auto seqs = read_token_sequences(s->tokens, cfg.vocab_size, cfg.max_position_embeddings);
            auto backend = make_backend(s->device, 0, "--device");
            const DType dt = backend->device() == Device::CPU ? DType::F32 : DType::BF16;
            size_t total_tokens = 0, longest = 0;
            bool same_len = true;
            for (const auto& q : seqs)
              total_tokens += q.size(), longest = std::max(longest, q.size()), same_len &= q.size() == seqs[0].size();
            check_score_memory(*backend, cfg, dt, total_tokens, longest, !s->logits_out.empty());

            const ParamLayout layout(cfg);
            DenseParams params(layout, *backend, dt, false);
            const auto units = load_hf_weights(s->init_from, layout);
            for (int u = 0; u < layout.num_units(); ++u) params.set_unit(u, units[u]);

            std::vector<float> logits;
            if (!s->logits_out.empty()) logits.resize(total_tokens * static_cast<size_t>(cfg.vocab_size));

            std::map<int, std::unique_ptr<Qwen2Model>> models;  // one per sequence length
            constexpr int kIgnore = -100;
            double sum = 0;
            int64_t count = 0;
            size_t row = 0;
            for (const auto& q : seqs) {
              const int T = static_cast<int>(q.size());
              auto& m = models[T];
              if (!m) m = std::make_unique<Qwen2Model>(layout, *backend, dt, 1, T);
              std::vector<int32_t> targets(q.begin() + 1, q.end());
              targets.push_back(kIgnore);
              const LossSum l = m->forward(params, q.data(), targets.data(), kIgnore,
                                           logits.empty() ? nullptr : logits.data() + row * cfg.vocab_size);
              sum += l.sum;
              count += l.count;
              row += q.size();
            }
            const double loss = sum / count;
            // Finite weights (load_hf_weights checks them) can still overflow on the way.
            ST_CHECK_DATA(std::isfinite(loss), s->init_from, ": the loss over ", s->tokens, " is ", loss,
                          ", not a finite number: the model's activations overflow (weights too large for ",
                          dtype_name(dt), "?)");
            std::printf("loss %.8f\n", loss);
            std::printf("tokens %lld predicted over %zu sequences\n", static_cast<long long>(count), seqs.size());
            if (!logits.empty()) {
              const std::vector<int64_t> shape =
                  same_len ? std::vector<int64_t>{static_cast<int64_t>(seqs.size()), static_cast<int64_t>(seqs[0].size()), cfg.vocab_size}
                           : std::vector<int64_t>{static_cast<int64_t>(total_tokens), cfg.vocab_size};
              write_npy_f32(s->logits_out, shape, logits.data());
              std::printf("logits written to %s\n", s->logits_out.c_str());
            }
            return 0;
          }};
}

}  // namespace st
