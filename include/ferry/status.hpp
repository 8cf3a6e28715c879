// ferry's one error scheme: a Status (code + message) on the communication path and in requests,
// an Error exception (the same code + message) thrown by set-up calls such as Context::init.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

namespace ferry {

enum class Code : int {
  kOk = 0,
  kInProgress,       // the operation has not completed yet
  kWouldBlock,       // no room now; retry after progress (internal to transports)
  kTruncated,        // the message was larger than the receive buffer; the bytes that fit arrived
  kCanceled,         // a posted receive was canceled before it matched
  kInvalidArgument,  // a bad argument or configuration value
  kPeerFailed,       // the peer died or stopped answering
  kProtocolError,    // a peer sent a message that failed validation
  kTimeout,          // a bounded wait ran out
  kNoResources,      // memory, /dev/shm space, descriptors
  kUnsupported,      // no transport or capability for this operation
  kIoError,          // a system call failed
  kBootstrapError,   // the launcher's store failed or disagreed
  kInternal,
  kRevoked,  // the communicator was revoked (Communicator::revoke) by this or another member
};

const char* to_string(Code code) noexcept;

class Status {
 public:
  Status() noexcept = default;
  Status(Code code, std::string message);
  explicit Status(Code code) noexcept : code_(code) {}

  static Status ok() noexcept { return Status(); }

  [[nodiscard]] bool is_ok() const noexcept { return code_ == Code::kOk; }
  explicit operator bool() const noexcept { return is_ok(); }
  [[nodiscard]] Code code() const noexcept { return code_; }
  // The message, or the code's name when there is none.
  [[nodiscard]] std::string message() const;
  // "code: message", for logs.
  [[nodiscard]] std::string to_string() const;

 private:
  Code code_ = Code::kOk;
  std::shared_ptr<const std::string> message_;  // null on the fast path
};

class Error : public std::runtime_error {
 public:
  Error(Code code, const std::string& message);
  explicit Error(const Status& status);
  [[nodiscard]] Code code() const noexcept { return code_; }

 private:
  Code code_;
};

}  // namespace ferry
