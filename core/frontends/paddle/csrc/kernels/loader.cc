// Registers libanychip_paddle_kernels.so's Paddle kernels for one anychip device, when Paddle
// loads the library from its CustomDevice folder.
//
// The library is built once, at install, for every Paddle kernel of the table and every dtype.
// anychip puts one copy of it per device in the CustomDevice folder's kernels/ subfolder
// ("kernels/libanychip_<name>_kernels.so", loaded by the device's bridge; copies: the dynamic
// loader would hand every link the same single instance), each next to a config "<copy>.conf"
// that anychip.frontends.paddle.kernels writes:
//   device=npu                        the anychip device (its bridge is libanychip_npu.so)
//   paddle_type=anychip_ascend        the Paddle device type the kernels are registered for
//   serve=add float32 float16         a Paddle kernel and the dtypes it is registered for
//   kernel=add float32 1 SYMBOL PATH  a base op's kernel: dtype, host code (1/0), symbol, library
//   slot=anychip_unary_slot_0 log1p log1p   a slot row, the Paddle kernel it registers as (served
//                                     by a serve= line) and the op it launches
// Registration happens while the copy is dlopen()ed, before Paddle moves the registered kernels
// into its kernel factory. A missing or malformed config registers nothing and says why on
// stderr: the device's ops then fall back to the CPU, counted as any other fallback.
#include <dlfcn.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "table.h"

namespace anychip_pk {
namespace {

const std::map<std::string, phi::DataType>& dtypes() {
  static const std::map<std::string, phi::DataType> names = {
      {"float32", phi::DataType::FLOAT32}, {"float16", phi::DataType::FLOAT16},
      {"bfloat16", phi::DataType::BFLOAT16}, {"float64", phi::DataType::FLOAT64},
      {"int8", phi::DataType::INT8}, {"uint8", phi::DataType::UINT8}, {"int16", phi::DataType::INT16},
      {"int32", phi::DataType::INT32}, {"int64", phi::DataType::INT64}, {"bool", phi::DataType::BOOL}};
  return names;
}

phi::DataType dtype_named(const std::string& name, const std::string& line) {
  auto found = dtypes().find(name);
  if (found == dtypes().end()) throw std::runtime_error("unknown dtype '" + name + "' in: " + line);
  return found->second;
}

struct Config {
  std::string paddle_type;
  std::map<std::string, std::set<phi::DataType>> serve;
  std::map<std::string, std::string> slot_kernel;  // slot row -> the Paddle kernel it registers as
};

Config read_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  Config config;
  std::string line;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    if (line.empty() || eq == std::string::npos) continue;
    std::string key = line.substr(0, eq);
    std::istringstream fields(line.substr(eq + 1));
    if (key == "device") {
      fields >> g_device_name;
    } else if (key == "paddle_type") {
      fields >> config.paddle_type;
    } else if (key == "serve") {
      std::string name, dtype;
      fields >> name;
      while (fields >> dtype) config.serve[name].insert(dtype_named(dtype, line));
    } else if (key == "slot") {
      std::string row, paddle_kernel, op;
      fields >> row >> paddle_kernel >> op;
      if (op.empty()) throw std::runtime_error("a slot line needs a row, a Paddle kernel and an op: " + line);
      config.slot_kernel[row] = paddle_kernel;
      g_slot_ops[row] = op;
    } else if (key == "kernel") {
      KernelEntry e;
      std::string dtype;
      int host_code = 1;
      fields >> e.op >> dtype >> host_code >> e.symbol;
      std::getline(fields >> std::ws, e.library);  // the rest: a path may hold spaces
      if (e.library.empty()) throw std::runtime_error("a kernel line without a library: " + line);
      e.dtype = dtype_named(dtype, line);
      e.host_code = host_code != 0;
      g_kernels.push_back(e);
    }
  }
  if (config.paddle_type.empty()) throw std::runtime_error(path + " names no paddle_type");
  return config;
}

std::string own_path() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&read_config), &info) == 0 || info.dli_fname == nullptr) {
    throw std::runtime_error("cannot find the library's own path");
  }
  return info.dli_fname;
}

void register_kernels() {
  std::string path;
  try {
    path = own_path();
    Config config = read_config(path + ".conf");
    std::set<std::string> unknown;  // named by the config, absent from this build of the table
    for (const auto& served : config.serve) unknown.insert(served.first);
    for_each_row([&](const Row& row) {
      auto slot = config.slot_kernel.find(row.name);
      const std::string name = slot == config.slot_kernel.end() ? row.name : slot->second;
      auto served = config.serve.find(name);
      if (served == config.serve.end()) return;
      unknown.erase(name);
      for (const Instance& instance : row.instances) {
        if (served->second.count(instance.dtype) == 0) continue;
        phi::KernelRegistrar(phi::RegType::OUTER, name.c_str(), config.paddle_type.c_str(),
                             phi::DataLayout::ALL_LAYOUT, instance.dtype, instance.parse, row.define,
                             instance.compute, instance.variadic);
      }
    });
    if (!unknown.empty()) {  // a library older than the Python table that planned the config
      std::string names;
      for (const auto& name : unknown) names += " " + name;
      std::fprintf(stderr, "anychip: %s lacks %zu Paddle kernel(s) its config names (reinstall anychip to rebuild "
                   "it; until then they fall back to the CPU):%s\n", path.c_str(), unknown.size(), names.c_str());
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "anychip: %s: no Paddle kernels registered: %s\n", path.c_str(), e.what());
  }
}

// A static object, not __attribute__((constructor)): C++ initializes it after g_device_name and
// g_kernels (inline variables of glue.h, defined above it), which a constructor function could
// run before.
const struct Registration {
  Registration() { register_kernels(); }
} registration;

}  // namespace
}  // namespace anychip_pk
