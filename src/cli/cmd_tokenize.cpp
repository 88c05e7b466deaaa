// shardtrain tokenize: text -> ids (or ids -> text) with a Hugging Face Qwen2 tokenizer,
// and a single-thread speed measurement (--bench).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "data/tokenizer.h"

namespace st {
namespace {

std::string read_input(const std::string& path) {
  if (path == "-") return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  std::ifstream in(path, std::ios::binary);
  ST_CHECK_DATA(in, path, ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Ids separated by whitespace and/or commas, or one JSON list.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& where) {
  std::vector<int32_t> ids;
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && text[first] == '[') {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail_data(where, ": not a JSON list of ids: ", e.what());
    }
    ST_CHECK_DATA(j.is_array(), where, ": not a JSON list of ids");
    for (size_t k = 0; k < j.size(); ++k) {
      ST_CHECK_DATA(j[k].is_number_integer(), where, ": element ", k, " is not an integer: ", j[k].dump());
      const int64_t v = j[k].get<int64_t>();
      ST_CHECK_DATA(v >= INT32_MIN && v <= INT32_MAX, where, ": id ", v, " (position ", k, ") is out of range");
      ids.push_back(static_cast<int32_t>(v));
    }
    return ids;
  }
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == ',') {
      ++i;
      continue;
    }
    size_t j = i;
    if (text[j] == '-' || text[j] == '+') ++j;
    while (j < text.size() && text[j] >= '0' && text[j] <= '9') ++j;
    const std::string tok = text.substr(i, j - i);
    ST_CHECK_DATA(j > i && (tok.size() > 1 || (tok[0] != '-' && tok[0] != '+')) &&
                 (j == text.size() || std::string(" \t\r\n,").find(text[j]) != std::string::npos),
             where, ": \"", text.substr(i, std::min<size_t>(20, text.size() - i)),
             "\" is not a token id (ids are integers separated by spaces, commas or newlines, or a JSON list)");
    const long long v = std::stoll(tok.size() > 18 ? tok.substr(0, 18) : tok);
    ST_CHECK_DATA(tok.size() <= 11 && v >= INT32_MIN && v <= INT32_MAX, where, ": id ", tok, " is out of range");
    ids.push_back(static_cast<int32_t>(v));
    i = j;
  }
  return ids;
}

void write_all(const std::string& s) {
  if (!s.empty()) std::fwrite(s.data(), 1, s.size(), stdout);
}

// Encodes the file line by line ('\n' kept with its line), the unit the reference's
// --bench in scripts/make_tokenizer_fixture.py uses; one cold pass, then a warm one.
int bench(const Tokenizer& tok, const std::string& text, const std::string& path) {
  std::vector<std::string_view> lines;
  for (size_t i = 0; i < text.size();) {
    size_t e = text.find('\n', i);
    e = e == std::string::npos ? text.size() : e + 1;
    lines.emplace_back(text.data() + i, e - i);
    i = e;
  }
  std::printf("tokenizer  %s\n", tok.describe().c_str());
  std::printf("input      %s: %zu bytes, %zu lines (encoded line by line, one thread)\n", path.c_str(), text.size(),
              lines.size());
  for (const char* pass : {"cold", "warm"}) {
    size_t n = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (auto l : lines) n += tok.encode(l).size();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-10s %zu tokens in %.3f s: %.2f MB/s, %.0f tokens/s (%.3f bytes/token)\n", pass, n, s,
                text.size() / 1e6 / s, n / s, n ? double(text.size()) / n : 0.0);
  }
  return 0;
}

}  // namespace

Command add_tokenize_command(CLI::App& root) {
  struct State {
    std::string dir, text, file;
    bool json = false, decode = false, bench = false;
  };
  auto s = std::make_shared<State>();
  CLI::App* app = root.add_subcommand(
      "tokenize",
      "Encode text to token ids with a Hugging Face Qwen2/Qwen2.5 tokenizer (ids one per line,\n"
      "or one JSON list with --json), or with --decode turn ids back into text. Added tokens\n"
      "such as <|endoftext|> are recognised in the text; no BOS/EOS is added. Input that is\n"
      "not valid UTF-8 is read as Python's errors=\"replace\" decode would read it.");
  app->add_option("--tokenizer", s->dir, "tokenizer directory: tokenizer.json, or vocab.json + merges.txt + "
                                         "tokenizer_config.json")
      ->required();
  auto* text = app->add_option("--text", s->text, "the text (or with --decode the ids)");
  auto* file = app->add_option("--file", s->file, "read the text (or ids) from this file; - for stdin");
  text->excludes(file);
  app->add_flag("--json", s->json, "print one JSON list of ids (with --decode: a JSON string)");
  app->add_flag("--decode", s->decode,
                "the input is token ids (whitespace/comma separated, or a JSON list); print their text");
  auto* b = app->add_flag("--bench", s->bench,
                          "measure single-thread encoding speed over --file (line by line) and print MB/s");
  b->needs(file);
  return {app, [s, text, file] {
            ST_CHECK_CONFIG(text->count() || file->count(), "tokenize: give --text STR or --file F");
            const Tokenizer tok = Tokenizer::load(s->dir);
            const std::string where = file->count() ? s->file : std::string("--text");
            const std::string input = file->count() ? read_input(s->file) : s->text;
            if (s->bench) return bench(tok, input, s->file);
            if (s->decode) {
              const std::string out = tok.decode(parse_ids(input, where));
              if (s->json)
                write_all(nlohmann::json(out).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
              else
                write_all(out);
              return 0;
            }
            const std::vector<int32_t> ids = tok.encode(input);
            std::string out;
            out.reserve(ids.size() * 7 + 2);
            if (s->json) out += '[';
            for (size_t k = 0; k < ids.size(); ++k) {
              if (s->json && k) out += ", ";
              out += std::to_string(ids[k]);
              if (!s->json) out += '\n';
            }
            if (s->json) out += "]\n";
            write_all(out);
            return 0;
          }};
}

}  // namespace st
