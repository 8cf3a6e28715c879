// Which processes share a node, in the sense ferry's node-local transports need: the same kernel
// (boot id), the same network, IPC and pid namespaces, and the same /dev/shm. Containers and
// network-namespace "nodes" on one host therefore count as different nodes; a hostname is never
// trusted for this.
#pragma once

#include <string>

namespace ferry::util {

// "<boot id>/<net ns>/<ipc ns>/<pid ns>/<device of /dev/shm>", at most 127 bytes.
std::string node_identity();

// The inode of this process's pid namespace, as text ("0" if unknown).
std::string pid_namespace();

// "/ferry-<job>-<rank>[-<what>]-p<pid>n<pid namespace>": the name of a /dev/shm file of this
// process (the job id's characters other than letters and digits become '_'). ferryrun sweeps a
// job's names by its id; any rank sweeps the names whose creator is dead, by their ending.
std::string shm_name(const std::string& job_id, int rank, const std::string& what);

}  // namespace ferry::util
