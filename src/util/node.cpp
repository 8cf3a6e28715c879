#include "util/node.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <fstream>

namespace ferry::util {
namespace {

std::string inode_of(const char* path) {
  struct stat st {};
  return ::stat(path, &st) == 0 ? std::to_string(st.st_ino) : "?";
}

}  // namespace

std::string node_identity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat shm {};
  const std::string shm_device = ::stat("/dev/shm", &shm) == 0 ? std::to_string(shm.st_dev) : "?";
  std::string id = (boot.empty() ? "?" : boot) + "/" + inode_of("/proc/self/ns/net") + "/" +
                   inode_of("/proc/self/ns/ipc") + "/" + inode_of("/proc/self/ns/pid") + "/" +
                   shm_device;
  return id.substr(0, 127);
}

std::string pid_namespace() {
  struct stat st {};
  return ::stat("/proc/self/ns/pid", &st) == 0 ? std::to_string(st.st_ino) : "0";
}

std::string shm_name(const std::string& job_id, int rank, const std::string& what) {
  std::string name = "/ferry-";
  for (char c : job_id) name += (std::isalnum(static_cast<unsigned char>(c)) != 0) ? c : '_';
  name += "-" + std::to_string(rank);
  if (!what.empty()) name += "-" + what;
  return name + "-p" + std::to_string(::getpid()) + "n" + pid_namespace();
}

}  // namespace ferry::util
