// Each subcommand registers itself on the root CLI11 app and returns the function
// that runs it once the command line has been parsed.
#pragma once
#include <functional>

namespace CLI { class App; }

namespace st {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command add_train_command(CLI::App& root);
Command add_presets_command(CLI::App& root);
Command add_score_command(CLI::App& root);
Command add_export_command(CLI::App& root);
Command add_launch_command(CLI::App& root);
Command add_nccl_check_command(CLI::App& root);
Command add_deploy_command(CLI::App& root);
Command add_tokenize_command(CLI::App& root);
Command add_data_command(CLI::App& root);
Command add_report_command(CLI::App& root);
Command add_predict_command(CLI::App& root);

}  // namespace st
