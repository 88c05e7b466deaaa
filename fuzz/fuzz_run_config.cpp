// libFuzzer target for the run configuration reader (st::load_run_config): the
// input is a TOML run config, optionally followed by a "\n%%\n" line and
// command-line overrides, one "section.key=value" per line. An st::Error is the
// expected rejection; a crash, a sanitizer report, any other exception, or an
// accepted configuration whose written form (st::run_config_toml, what a run saves
// as config.toml) does not load back to the same configuration is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <toml++/toml.h>

#include "core/error.h"
#include "fuzz_util.h"
#include "config/run_config.h"

namespace {

// model.config and model.init_from make the loader open a file: only names that stay
// in the working directory (see fuzz::confined_path).
bool paths_confined(std::string_view toml_text, const st::ConfigOverrides& overrides) {
  try {
    const toml::table t = toml::parse(toml_text);
    for (const char* key : {"model.config", "model.init_from"})
      if (const auto* s = t.at_path(key).as_string(); s && !fuzz::confined_path(s->get())) return false;
  } catch (const toml::parse_error&) {
    return true;  // the loader refuses it before opening anything
  }
  for (const auto& [k, v] : overrides)
    if (k.find("model.config") != std::string::npos || k.find("model.init_from") != std::string::npos)
      if (!fuzz::confined_path(v)) return false;
  return true;
}

std::string without_comments(const std::string& toml_text) {
  std::string out;
  size_t start = 0;
  while (start < toml_text.size()) {
    size_t end = toml_text.find('\n', start);
    if (end == std::string::npos) end = toml_text.size();
    if (toml_text[start] != '#') out.append(toml_text, start, end - start + 1);
    start = end + 1;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto parts = fuzz::split_parts(data, size);
  st::ConfigOverrides overrides;
  for (size_t p = 1; p < parts.size(); ++p) {
    std::string_view rest = parts[p];
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      const std::string_view line = rest.substr(0, nl);
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
      const size_t eq = line.find('=');
      if (eq == std::string_view::npos) continue;
      overrides.emplace_back(std::string(line.substr(0, eq)), std::string(line.substr(eq + 1)));
    }
  }
  if (!paths_confined(parts[0], overrides)) return 0;
  const std::string path = fuzz::scratch_dir() + "/run.toml";
  fuzz::write_file(path, parts[0]);
  st::RunConfig cfg;
  try {
    cfg = st::load_run_config(path, overrides);
  } catch (const st::Error& e) {
    fuzz::rejected(e);
    return 0;
  }
  // The saved configuration runs again as is, to the same values (the comments may
  // differ: they say where each value came from).
  const std::string saved = st::run_config_toml(cfg);
  const std::string again = fuzz::scratch_dir() + "/saved.toml";
  fuzz::write_file(again, saved);
  const st::RunConfig cfg2 = st::load_run_config(again, {});
  if (without_comments(st::run_config_toml(cfg2)) != without_comments(saved)) __builtin_trap();
  return 0;
}
