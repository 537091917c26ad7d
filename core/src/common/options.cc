#include "common/options.h"

#include <cerrno>
#include <cstdlib>

namespace anychip {

bool Options::parse(const char* text, std::string* error) {
  values_.clear();
  if (text == nullptr) return true;
  std::string all(text);
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(';', start);
    if (end == std::string::npos) end = all.size();
    std::string item = all.substr(start, end - start);
    if (!item.empty()) {
      size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0) {
        *error = "options: expected key=value, got '" + item + "'";
        return false;
      }
      values_[item.substr(0, eq)] = item.substr(eq + 1);
    }
    start = end + 1;
  }
  return true;
}

std::string Options::get(const std::string& key, const std::string& fallback) const {
  auto it = values_.find(key);
  return it == values_.end() ? fallback : it->second;
}

bool Options::get_u64(const std::string& key, uint64_t fallback, uint64_t* out) const {
  auto it = values_.find(key);
  if (it == values_.end()) {
    *out = fallback;
    return true;
  }
  const char* s = it->second.c_str();
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || s[0] == '-') return false;
  *out = v;
  return true;
}

}  // namespace anychip
