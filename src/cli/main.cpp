// shardtrain: one binary, one subcommand per job.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "config/schema.h"
#include "core/error.h"

namespace {

// An error message as printed: control bytes other than newline and tab (which a
// hostile input may carry into a message: an escape sequence, a carriage return)
// become \xNN, so that what the terminal shows is what the message says.
std::string printable(const char* what) {
  std::string out;
  for (const char* p = what; *p; ++p) {
    const unsigned char c = static_cast<unsigned char>(*p);
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += *p;
    }
  }
  return out;
}

// A command that needs a subcommand and was given a word that is none (`shardtrain
// traim`, `shardtrain data prepaer`): "unknown command" naming it and the nearest one,
// where CLI11 would say only that a subcommand is required. Empty when argv is fine.
std::string unknown_command(const CLI::App& root, int argc, char** argv) {
  const CLI::App* app = &root;
  std::string path = "";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    const std::vector<const CLI::App*> subs = app->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty() || word.empty() || word[0] == '-') return "";
    bool positionals = false;
    for (const CLI::Option* o : app->get_options())
      if (o->get_positional()) positionals = true;
    if (positionals) return "";  // the word may be one of them
    std::vector<std::string> names;
    const CLI::App* next = nullptr;
    for (const CLI::App* s : subs) {
      names.push_back(s->get_name());
      if (s->check_name(word)) next = s;
    }
    if (!next) {
      const std::string near = st::nearest(word, names);
      std::string known;
      for (const std::string& n : names) known += (known.empty() ? "" : ", ") + n;
      return "unknown command '" + path + word + "' (" + (near.empty() ? "" : "did you mean " + path + near + "? ") +
             "commands: " + known + ")";
    }
    path += word + " ";
    app = next;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "shardtrain: trains Qwen2-family language models with fully sharded data parallelism,\n"
      "from one CPU to many GPUs. Run `shardtrain <command> --help` for a command's options."};
  app.name("shardtrain");
  app.set_version_flag("--version", std::string(SHARDTRAIN_VERSION));
  // Command-line errors read like every other error: one line, "shardtrain: error: ...".
  // (Set before the subcommands are added: they copy it.)
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "shardtrain: error: command line: " + printable(e.what()) + " (see --help)\n";
  });
  app.require_subcommand(1);
  std::vector<st::Command> commands = {st::add_train_command(app), st::add_score_command(app),
                                      st::add_export_command(app), st::add_presets_command(app),
                                      st::add_launch_command(app), st::add_nccl_check_command(app),
                                      st::add_deploy_command(app)};
  commands.push_back(st::add_tokenize_command(app));
  commands.push_back(st::add_data_command(app));
  commands.push_back(st::add_report_command(app));
  commands.push_back(st::add_predict_command(app));

  if (const std::string bad = unknown_command(app, argc, argv); !bad.empty()) {
    std::fprintf(stderr, "shardtrain: error: command line: %s\n", printable(bad.c_str()).c_str());
    return st::kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version exit 0; every other command-line error is a usage error.
    const int code = app.exit(e);
    return code == 0 ? st::kExitOk : st::kExitUsage;
  }
  try {
    for (auto& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const st::Interrupted& e) {
    std::fprintf(stderr, "shardtrain: %s\n", e.what());
    return 128 + e.signal();
  } catch (const st::Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "shardtrain: error: %s\n", printable(e.what()).c_str());
    return st::exit_code(e.kind());
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "shardtrain: internal error: %s\n", printable(e.what()).c_str());
    return st::kExitInternal;
  }
  return st::kExitRuntime;
}
