// ferryrun's housekeeping (see housekeeping.hpp) and the job's /dev/shm sweep (job.hpp).
#include "housekeeping.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "job.hpp"

namespace ferry::tools {

int remove_provider_regions(pid_t pid) {
  DIR* dir = ::opendir("/dev/shm");
  if (dir == nullptr) return 0;
  const std::string prefix = std::to_string(pid) + ":";
  auto digits_then = [](const char* p, char end) {
    const char* start = p;
    while (*p >= '0' && *p <= '9') ++p;
    return p != start && *p == end ? p : nullptr;
  };
  int removed = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const char* name = entry->d_name;
    if (std::strncmp(name, prefix.c_str(), prefix.size()) != 0) continue;
    const char* rest = digits_then(name + prefix.size(), ':');
    if (rest == nullptr || digits_then(rest + 1, '\0') == nullptr) continue;
    if (::unlinkat(::dirfd(dir), name, 0) == 0) ++removed;
  }
  ::closedir(dir);
  return removed;
}

ScratchDir::~ScratchDir() {
  if (path_.empty()) return;
  ::unlink(socket_path().c_str());
  ::rmdir(path_.c_str());
}

bool ScratchDir::create(std::string* error) {
  std::string base = "/tmp";
  if (const char* tmp = std::getenv("TMPDIR");
      tmp != nullptr && *tmp != '\0' && std::strlen(tmp) + 40 < 108) {
    base = tmp;
  }
  sweep(base);
  std::string pattern = base + "/ferryrun-" + std::to_string(::getpid()) + "-XXXXXX";
  if (::mkdtemp(pattern.data()) == nullptr) {
    *error = "cannot create a directory for the store with mkdtemp(" + pattern +
             "): " + std::strerror(errno);
    return false;
  }
  path_ = pattern;
  return true;
}

int ScratchDir::sweep(const std::string& base) {
  DIR* dir = ::opendir(base.c_str());
  if (dir == nullptr) return 0;
  constexpr const char* kPrefix = "ferryrun-";
  const std::size_t prefix = std::strlen(kPrefix);
  int removed = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const char* name = entry->d_name;
    if (std::strncmp(name, kPrefix, prefix) != 0) continue;
    char* end = nullptr;
    errno = 0;
    const long pid = std::strtol(name + prefix, &end, 10);
    // ferryrun-<pid>-<6 characters of mkdtemp>, nothing else.
    if (errno != 0 || end == name + prefix || *end != '-' || std::strlen(end + 1) != 6 ||
        pid <= 0 || pid > std::numeric_limits<pid_t>::max()) {
      continue;
    }
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours
    struct stat st {};
    if (::fstatat(::dirfd(dir), name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != ::geteuid()) {
      continue;
    }
    const std::string path = base + "/" + name;
    ::unlink((path + "/store.sock").c_str());
    if (::rmdir(path.c_str()) == 0) ++removed;  // fails, and stays, where anything else is in it
  }
  ::closedir(dir);
  return removed;
}

int sweep_shm(const std::string& job_id) {
  // The job id holds only [0-9a-fx], so it cannot add glob patterns of its own.
  std::string pattern = "/dev/shm/ferry-" + job_id + "-*";
  glob_t found{};
  int swept = 0;
  if (::glob(pattern.c_str(), GLOB_NOSORT, nullptr, &found) == 0) {
    for (std::size_t i = 0; i < found.gl_pathc; ++i) {
      if (::unlink(found.gl_pathv[i]) == 0) ++swept;
    }
  }
  ::globfree(&found);
  return swept;
}

}  // namespace ferry::tools
