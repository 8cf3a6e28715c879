// Passes file descriptors between the processes of one node: each process binds a UNIX datagram
// socket in the abstract namespace ("\0ferry-<job>-fds-<rank>"); a sender addresses a peer by rank
// and attaches one descriptor (SCM_RIGHTS) to a small fixed message. The kernel stamps every
// message with the sender's pid (SCM_CREDENTIALS), so the receiver can check that it came from the
// process it claims to be. Nothing blocks: a full or missing peer socket is an error at once.
// Abstract names live in a network namespace, so processes in different ones cannot reach each
// other here; the caller falls back (device data then goes by host staging).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/status.hpp"
#include "util/fd.hpp"

namespace ferry::util {

class FdMailbox {
 public:
  struct Letter {
    int sender_rank = -1;  // as the sender wrote it
    pid_t sender_pid = 0;  // as the kernel saw it
    std::uint64_t tag = 0;
    Fd fd;
  };

  // Binds this rank's socket; throws Error (kIoError) naming the address when it cannot.
  FdMailbox(std::string job_id, int rank);

  // Sends `fd` (not consumed) with `tag` to `peer_rank`'s mailbox.
  Status send(int peer_rank, std::uint64_t tag, int fd) const;

  // Appends every letter waiting; malformed ones (wrong size, no or several descriptors, no
  // credentials) are dropped, their descriptors closed, and counted in *rejected.
  void receive(std::vector<Letter>* letters, std::size_t* rejected = nullptr) const;

  [[nodiscard]] int fd() const { return socket_.get(); }

 private:
  std::string job_id_;
  int rank_;
  Fd socket_;
};

}  // namespace ferry::util
