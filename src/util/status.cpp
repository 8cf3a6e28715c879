// Status and Error: the one error scheme (include/ferry/status.hpp).
#include "ferry/status.hpp"

namespace ferry {

const char* to_string(Code code) noexcept {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kInProgress:
      return "in progress";
    case Code::kWouldBlock:
      return "would block";
    case Code::kTruncated:
      return "message truncated";
    case Code::kCanceled:
      return "canceled";
    case Code::kInvalidArgument:
      return "invalid argument";
    case Code::kPeerFailed:
      return "peer failed";
    case Code::kProtocolError:
      return "protocol error";
    case Code::kTimeout:
      return "timed out";
    case Code::kNoResources:
      return "no resources";
    case Code::kUnsupported:
      return "unsupported";
    case Code::kIoError:
      return "I/O error";
    case Code::kBootstrapError:
      return "bootstrap error";
    case Code::kInternal:
      return "internal error";
    case Code::kRevoked:
      return "communicator revoked";
  }
  return "unknown code";
}

Status::Status(Code code, std::string message)
    : code_(code), message_(std::make_shared<const std::string>(std::move(message))) {}

std::string Status::message() const { return message_ ? *message_ : ferry::to_string(code_); }

std::string Status::to_string() const {
  std::string s = ferry::to_string(code_);
  if (message_) s += ": " + *message_;
  return s;
}

Error::Error(Code code, const std::string& message)
    : std::runtime_error(std::string(to_string(code)) + ": " + message), code_(code) {}

Error::Error(const Status& status) : std::runtime_error(status.to_string()), code_(status.code()) {}

}  // namespace ferry
