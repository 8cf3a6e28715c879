// libfabric, opened at run time with dlopen (libfabric.so.1) so that libferry builds against the
// headers and runs where the library is missing. Only the few functions libfabric exports are
// loaded; everything else in its API is an inline call through the objects' operation tables.
#pragma once

#include <rdma/fabric.h>

#include <string>

namespace ferry::transport::ofi {

struct Fabric {
  decltype(&::fi_getinfo) getinfo = nullptr;
  decltype(&::fi_freeinfo) freeinfo = nullptr;
  decltype(&::fi_dupinfo) dupinfo = nullptr;
  decltype(&::fi_fabric) fabric = nullptr;
  decltype(&::fi_strerror) strerror = nullptr;
  decltype(&::fi_version) version = nullptr;
};

// The library, loaded on first call; null when it is missing or lacks a function (*why says).
const Fabric* fabric(std::string* why = nullptr);

}  // namespace ferry::transport::ofi
