#include "util/fd_mailbox.hpp"

#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>

#include "util/abstract_socket.hpp"

namespace ferry::util {
namespace {

constexpr std::uint32_t kMagic = 0x6d446446;  // "FdDm"

struct Message {
  std::uint32_t magic;
  std::int32_t sender_rank;
  std::uint64_t tag;
};

sockaddr_un address_of(const std::string& job_id, int rank, socklen_t* length) {
  return abstract_socket_address("ferry-" + job_id + "-fds-" + std::to_string(rank), length);
}

}  // namespace

FdMailbox::FdMailbox(std::string job_id, int rank) : job_id_(std::move(job_id)), rank_(rank) {
  socket_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!socket_.valid()) throw Error(Code::kIoError, std::string("socket: ") + strerror(errno));
  const int on = 1;
  if (::setsockopt(socket_.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0) {
    throw Error(Code::kIoError, std::string("SO_PASSCRED: ") + strerror(errno));
  }
  socklen_t length = 0;
  sockaddr_un address = address_of(job_id_, rank_, &length);
  if (::bind(socket_.get(), reinterpret_cast<sockaddr*>(&address), length) != 0) {
    throw Error(Code::kIoError, "binding the descriptor mailbox @" +
                                    std::string(address.sun_path + 1) + ": " + strerror(errno));
  }
}

Status FdMailbox::send(int peer_rank, std::uint64_t tag, int fd) const {
  Message message{kMagic, rank_, tag};
  iovec io{&message, sizeof message};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  socklen_t length = 0;
  sockaddr_un address = address_of(job_id_, peer_rank, &length);
  msghdr header{};
  header.msg_name = &address;
  header.msg_namelen = length;
  header.msg_iov = &io;
  header.msg_iovlen = 1;
  header.msg_control = control;
  header.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&header);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  ssize_t sent;
  do {
    sent = ::sendmsg(socket_.get(), &header, MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (sent < 0 && errno == EINTR);
  if (sent == static_cast<ssize_t>(sizeof message)) return Status::ok();
  const int error = sent < 0 ? errno : EMSGSIZE;
  return Status(Code::kIoError, "passing a descriptor to rank " + std::to_string(peer_rank) +
                                    " (@" + std::string(address.sun_path + 1) +
                                    ") failed: " + strerror(error));
}

void FdMailbox::receive(std::vector<Letter>* letters, std::size_t* rejected) const {
  for (;;) {
    Message message{};
    iovec io{&message, sizeof message};
    // Room for more than we accept, so that extra descriptors arrive (and are closed) rather than
    // being silently discarded with MSG_CTRUNC.
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred)) + CMSG_SPACE(8 * sizeof(int))];
    msghdr header{};
    header.msg_iov = &io;
    header.msg_iovlen = 1;
    header.msg_control = control;
    header.msg_controllen = sizeof control;
    const ssize_t got = ::recvmsg(socket_.get(), &header, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (got < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN: nothing more waiting
    }
    std::vector<Fd> fds;
    const ucred* credentials = nullptr;
    for (cmsghdr* c = CMSG_FIRSTHDR(&header); c != nullptr; c = CMSG_NXTHDR(&header, c)) {
      if (c->cmsg_level != SOL_SOCKET) continue;
      if (c->cmsg_type == SCM_RIGHTS) {
        const std::size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (std::size_t i = 0; i < n; ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
          fds.emplace_back(fd);
        }
      } else if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len == CMSG_LEN(sizeof(ucred))) {
        credentials = reinterpret_cast<const ucred*>(CMSG_DATA(c));
      }
    }
    const bool ok = got == static_cast<ssize_t>(sizeof message) && message.magic == kMagic &&
                    (header.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) == 0 && fds.size() == 1 &&
                    credentials != nullptr;
    if (!ok) {
      if (rejected != nullptr) ++*rejected;
      continue;  // the descriptors close here
    }
    Letter letter;
    letter.sender_rank = message.sender_rank;
    letter.sender_pid = credentials->pid;
    letter.tag = message.tag;
    letter.fd = std::move(fds.front());
    letters->push_back(std::move(letter));
  }
}

}  // namespace ferry::util
