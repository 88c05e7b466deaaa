#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "backend/factory.h"
#include "cli/commands.h"
#include "core/error.h"
#include "data/token_file.h"
#include "io/hf_checkpoint.h"
#include "io/npy.h"
#include "model/dense_params.h"
#include "model/qwen2.h"

namespace st {

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
            const ModelConfig cfg = load_hf_config(s->init_from);
            const ParamLayout layout(cfg);
            const auto seqs = read_token_sequences(s->tokens, cfg.vocab_size, cfg.max_position_embeddings);
            auto backend = make_backend(s->device);
            const DType dt = backend->device() == Device::CPU ? DType::F32 : DType::BF16;
            DenseParams params(layout, *backend, dt, false);
            const auto units = load_hf_weights(s->init_from, layout);
            for (int u = 0; u < layout.num_units(); ++u) params.set_unit(u, units[u]);

            size_t total_tokens = 0;
            bool same_len = true;
            for (const auto& q : seqs) total_tokens += q.size(), same_len &= q.size() == seqs[0].size();
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
            std::printf("loss %.8f\n", sum / count);
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
