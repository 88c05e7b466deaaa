// Whole-file JSON objects a user can hand us (summary.json, profile.json), read so
// that every error names the file and, where it can, the line: a parse error at its
// line, a value of the wrong type at the line where its key is spelled. Errors are
// st::Error of kind Data.
#pragma once
#include <exception>
#include <string>

#include <nlohmann/json.hpp>

namespace st {

// The file's JSON object, and its text in `text` (for line_of_key). A file that
// cannot be read, is not JSON ("<path>:<line>: not valid JSON: ...") or is not an
// object ("<path>:1: expected a JSON object, got array") is an error.
nlohmann::json read_json_object(const std::string& path, std::string& text);

// The line of a key's value in a JSON file (where it is first spelled), for messages
// about a value that parsed but has the wrong type; 0 when not found.
int line_of_key(const std::string& text, const std::string& key);
// "<path>:<line>" with that line, or "<path>" where the key is not found.
std::string where_key(const std::string& path, const std::string& text, const std::string& key);

// "<path>:<line>: \"key\" must be a number, got string" when obj has `key` and it is
// not a number; nothing when it is one or is absent.
void require_number(const nlohmann::json& obj, const std::string& key, const std::string& path,
                    const std::string& text);

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string json_message(const std::exception& e);

}  // namespace st
