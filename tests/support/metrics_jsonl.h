// What a run's metrics.jsonl says, read back by tests: its step records (one JSON
// object a line, with "step"), past the other records the file also holds (the
// transport report, say). A line that is not JSON throws, failing the test.
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace st::testing {

// Calls fn(record) for each step record, in the order of the file.
template <class F>
void for_each_step_record(const std::filesystem::path& path, F&& fn) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("step")) fn(j);
  }
}

// The step records by step (the last record of a step wins).
inline std::map<int64_t, nlohmann::json> step_records(const std::filesystem::path& path) {
  std::map<int64_t, nlohmann::json> out;
  for_each_step_record(path, [&](const nlohmann::json& j) { out[j["step"].get<int64_t>()] = j; });
  return out;
}

// The loss of every step record, in the order of the file (a resumed run appends
// the steps after its checkpoint again).
inline std::vector<double> step_losses(const std::filesystem::path& path) {
  std::vector<double> out;
  for_each_step_record(path, [&](const nlohmann::json& j) {
    if (j.contains("loss")) out.push_back(j.at("loss").get<double>());
  });
  return out;
}

}  // namespace st::testing
