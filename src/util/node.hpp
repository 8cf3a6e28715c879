// Which processes share a node, in the sense ferry's node-local transports need: the same kernel
// (boot id), the same network, IPC and pid namespaces, and the same /dev/shm. Containers and
// network-namespace "nodes" on one host therefore count as different nodes; a hostname is never
// trusted for this.
#pragma once

#include <string>

namespace ferry::util {

// "<boot id>/<net ns>/<ipc ns>/<pid ns>/<device of /dev/shm>", at most 127 bytes.
std::string node_identity();

}  // namespace ferry::util
