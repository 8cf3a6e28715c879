#include "transport/ofi/fabric.hpp"

#include <dlfcn.h>

#include "util/signals.hpp"

namespace ferry::transport::ofi {
namespace {

struct Loaded {
  Fabric fabric;
  bool ok = false;
  std::string why;
};

Loaded load() {
  Loaded loaded;
  const util::FatalSignalGuard handlers;  // the PSM providers' constructors install theirs
  void* library = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    loaded.why = std::string("no libfabric: dlopen(libfabric.so.1) failed: ") +
                 (error != nullptr ? error : "unknown error");
    return loaded;
  }
  Fabric& f = loaded.fabric;
  auto get = [&](auto* slot, const char* name) {
    *slot = reinterpret_cast<std::remove_reference_t<decltype(*slot)>>(dlsym(library, name));
    if (*slot == nullptr)
      loaded.why += (loaded.why.empty() ? "libfabric lacks " : ", ") + std::string(name);
  };
  get(&f.getinfo, "fi_getinfo");
  get(&f.freeinfo, "fi_freeinfo");
  get(&f.dupinfo, "fi_dupinfo");
  get(&f.fabric, "fi_fabric");
  get(&f.strerror, "fi_strerror");
  get(&f.version, "fi_version");
  loaded.ok = loaded.why.empty();
  return loaded;
}

}  // namespace

const Fabric* fabric(std::string* why) {
  static const Loaded loaded = load();  // the library stays open for the life of the process
  if (!loaded.ok) {
    if (why != nullptr) *why = loaded.why;
    return nullptr;
  }
  return &loaded.fabric;
}

}  // namespace ferry::transport::ofi
