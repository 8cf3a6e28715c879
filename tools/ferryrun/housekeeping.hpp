// What ferryrun leaves behind and removes: its socket directory, the job's shared-memory
// segments, and libfabric's shm regions of ranks that died (job.cpp calls these).
#pragma once

#include <sys/types.h>

#include <string>

namespace ferry::tools {

// libfabric's shm provider names its region after its process ("/dev/shm/<pid>:<n>:<n>", 16 MiB)
// and removes it when the endpoint closes: a rank that was killed, or that ended by _exit (an
// abort), leaves it behind, and a later process given that pid cannot open an endpoint
// (fi_enable fails with EBUSY). Removes those of `pid`, a reaped rank (so they are stale);
// returns how many were removed.
int remove_provider_regions(pid_t pid);

// The socket directory: private (mkdtemp makes it 0700), removed with everything in it. Its name
// holds ferryrun's pid ("ferryrun-<pid>-XXXXXX"), so that a later ferryrun removes the directory
// of one that was killed (SIGKILL: nothing of its own ran) once that pid is gone.
class ScratchDir {
 public:
  ScratchDir() = default;
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir();
  // Under $TMPDIR, or /tmp when $TMPDIR is unset or too long for a socket path (108 bytes).
  bool create(std::string* error);
  // Removes the directories of ferryruns that are gone under `base` (ours, holding at most the
  // socket); returns how many.
  static int sweep(const std::string& base);
  [[nodiscard]] std::string socket_path() const { return path_ + "/store.sock"; }

 private:
  std::string path_;
};

}  // namespace ferry::tools
