// ferryrun's job: starts the ranks around a store server, watches them, ends the whole job on the
// first failure, and cleans up the socket directory and the job's shared-memory segments.
#pragma once

#include <string>
#include <vector>

namespace ferry::tools {

struct JobOptions {
  int ranks = 0;
  double timeout_s = 0;      // 0: no limit
  std::string timeout_text;  // as the user wrote it, for the timeout message
  bool keep_going = false;   // a rank's failure does not end the others (they see it as an error)
  std::vector<std::string> command;
};

// Grace between SIGTERM and SIGKILL when ferryrun ends a job.
inline constexpr int kKillGraceMs = 2000;
// How long a rank's failing exit waits for a rank that left the store first to be reaped.
inline constexpr int kDeferMs = 2000;
// Exit statuses of ferryrun itself (the job's own status passes through otherwise).
inline constexpr int kExitSetupFailed = 1;
inline constexpr int kExitUnfinalized = 1;  // a rank joined, then exited 0 without finalizing
inline constexpr int kExitUsage = 2;
inline constexpr int kExitTimeout = 124;
inline constexpr int kExitCannotRun = 127;

// Runs the job to its end and returns ferryrun's exit status: 0 when every rank exited 0, else
// the first failure's (a rank's exit code, 128 + signal, an ABORT's code, or kExitTimeout).
int run_job(const JobOptions& options);

// Removes /dev/shm/ferry-<job_id>-* left behind by ranks that died before unlinking them;
// returns how many were removed.
int sweep_shm(const std::string& job_id);

}  // namespace ferry::tools
