// Parses the "key=value;key=value" options string that anychip passes to a plugin's entry.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace anychip {

class Options {
 public:
  // Returns false (and leaves a message in `error`) on an entry without '='.
  bool parse(const char* text, std::string* error);

  std::string get(const std::string& key, const std::string& fallback) const;
  // Returns false when the key is present but not an unsigned integer.
  bool get_u64(const std::string& key, uint64_t fallback, uint64_t* out) const;

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace anychip
