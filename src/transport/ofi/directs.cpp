// The ofi transport's direct transfers (see directs.hpp).
#include "transport/ofi/directs.hpp"

#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>

#include <cstring>

#include "transport/ofi/op.hpp"
#include "transport/ofi/transport.hpp"
#include "util/log.hpp"

namespace ferry::transport::ofi {

Directs::Directs(OfiTransport& transport, const util::Config& config)
    : t_(transport), test_read_fail_(config.get_bool(util::Var::kTestOfiReadFail)) {}

Directs::~Directs() = default;

int Directs::register_memory(void* data, std::size_t length, std::uint64_t access, int device,
                             fid_mr** mr, std::uint64_t key) {
  *mr = nullptr;
  int ret = 0;
  // Without FI_MR_PROV_KEY the keys are ours to choose, and must differ within the domain.
  if ((t_.info_->domain_attr->mr_mode & FI_MR_PROV_KEY) != 0) {
    key = 0;
  } else if (key == 0) {
    key = next_key_++;
  }
  if (device < 0) {
    ret = fi_mr_reg(t_.domain_, data, length, access, 0, key, 0, mr, nullptr);
  } else if (t_.hmem_fail_) {
    return -FI_EINVAL;  // what a NIC that cannot map GPU memory answers
  } else {
    iovec iov{data, length};
    fi_mr_attr attr{};
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = access;
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = device;
    attr.requested_key = key;
    ret = fi_mr_regattr(t_.domain_, &attr, 0, mr);
  }
  if (ret == 0 && (t_.info_->domain_attr->mr_mode & FI_MR_ENDPOINT) != 0) {
    ret = fi_mr_bind(*mr, &t_.ep_->fid, 0);
    if (ret == 0) ret = fi_mr_enable(*mr);
  }
  if (ret != 0 && *mr != nullptr) {
    fi_close(&(*mr)->fid);
    *mr = nullptr;
  }
  return ret;
}

bool Directs::device_direct(int device, const void* buffer, std::size_t length) {
  if (!t_.hmem_offered_ || device < 0) return false;
  if (auto found = gpus_.find(device); found != gpus_.end()) return found->second.direct;
  // The provider's word is not enough (a NIC may offer FI_HMEM and still fail to map a GPU's
  // memory): register this buffer for real, once per GPU.
  const std::string gpu = "cuda:" + std::to_string(device);
  fid_mr* mr = nullptr;
  const int ret = register_memory(const_cast<void*>(buffer), std::max<std::size_t>(length, 1),
                                  FI_SEND | FI_RECV, device, &mr);
  GpuVerdict& verdict = gpus_[device];
  if (ret == 0) {
    fi_close(&mr->fid);
    verdict = GpuVerdict{true, gpu + " memory registered with the NIC (trial registration)"};
    FERRY_LOG(kInfo, "ofi: %s", verdict.why.c_str());
  } else {
    verdict = GpuVerdict{
        false, "registering " + gpu + " memory with the NIC failed (" + t_.error_text(ret) + ")"};
    FERRY_LOG(kWarn, "ofi: %s; device data over ofi is staged through pinned host memory",
              verdict.why.c_str());
  }
  return verdict.direct;
}

std::string Directs::device_route() const {
  if (!t_.hmem_offered_) return t_.hmem_;
  std::string out = t_.hmem_ + "; ";
  if (gpus_.empty()) return out + "GPU memory not tried yet (the first device transfer tries it)";
  for (const auto& [device, verdict] : gpus_) {
    out += (device == gpus_.begin()->first ? "" : "; ") +
           (verdict.direct ? verdict.why : verdict.why + ": staged through pinned host memory");
  }
  return out;
}

Status Directs::new_op(int peer, void* data, std::size_t length, std::uint64_t cookie,
                       std::unique_ptr<Op>* op) {
  const OfiTransport::PeerState& state = t_.peers_[static_cast<std::size_t>(peer)];
  if (state.failed) return Status(Code::kPeerFailed, state.why);
  if (ops_.count(cookie) != 0) {
    return Status(Code::kInternal, "ofi: a direct transfer with that cookie is in flight");
  }
  *op = std::make_unique<Op>();
  (*op)->direct = true;
  (*op)->peer = peer;
  (*op)->data = data;
  (*op)->length = length;
  (*op)->cookie = cookie;
  return Status::ok();
}

void Directs::release_local(Op& op) {
  if (op.mr != nullptr) fi_close(&op.mr->fid);
  if (op.entry != nullptr) t_.cache_->release(op.entry, false);
  op.mr = nullptr;
  op.entry = nullptr;
}

Status Directs::launch(std::unique_ptr<Op> op) {
  Op* raw = op.get();
  const std::uint64_t cookie = raw->cookie;
  ops_.emplace(cookie, std::move(op));
  if (raw->read && test_read_fail_) {
    // Fails at the next progress, as a provider's error completion would. (A read of a key the
    // peer never registered would do it for real, but tcp;ofi_rxm then drops the connection
    // and the messages in flight on it.)
    failed_reads_.push_back(raw);
    return Status::ok();
  }
  Status status;
  if (!post(*raw, &status)) retries_.push_back(raw);
  if (!status) {
    release_local(*raw);
    ops_.erase(cookie);
  }
  return status;
}

Status Directs::start(bool send, int peer, void* data, std::size_t length, int device,
                      std::uint64_t key, std::uint64_t cookie) {
  std::unique_ptr<Op> op;
  if (Status status = new_op(peer, data, length, cookie, &op); !status) return status;
  op->send = send;
  op->key = key;
  // GPU memory is always registered (with its interface); host memory where the provider asks.
  if (length > 0 && (device >= 0 || (t_.info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0)) {
    const int ret = register_memory(data, length, send ? FI_SEND : FI_RECV, device, &op->mr);
    if (ret != 0) {
      std::string why = "ofi: registering a " + std::to_string(length) + "-byte " +
                        (device >= 0 ? "cuda:" + std::to_string(device) + " " : "host ") +
                        "buffer failed: " + t_.error_text(ret);
      if (device >= 0) {
        // Later transfers of this GPU's memory are staged.
        gpus_[device] = GpuVerdict{false, why};
        FERRY_LOG(kWarn, "%s; later device data over ofi is staged through pinned host memory",
                  why.c_str());
      }
      return Status(Code::kIoError, std::move(why));
    }
  }
  return launch(std::move(op));
}

Status Directs::register_region(void* data, std::size_t length, std::uint64_t key, bool writable,
                                Endpoint::RemoteRegion* region, void** handle) {
  if (!t_.native_) return Status(Code::kUnsupported, "ofi: " + t_.native_why_);
  fid_mr* mr = nullptr;
  const std::uint64_t access = FI_REMOTE_READ | (writable ? FI_REMOTE_WRITE : 0);
  const int ret = register_memory(data, length, access, -1, &mr, key);
  if (ret != 0) {
    return Status(Code::kIoError,
                  "ofi: registering a " + std::to_string(length) +
                      "-byte region for one-sided access failed: " + t_.error_text(ret));
  }
  // Without FI_MR_VIRT_ADDR a remote address is an offset into the registration.
  region->address = (t_.info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0
                        ? reinterpret_cast<std::uint64_t>(data)
                        : 0;
  region->key = fi_mr_key(mr);
  *handle = mr;
  return Status::ok();
}

Status Directs::expose(const void* data, std::size_t length, std::uint64_t cookie,
                       Endpoint::RemoteRegion* region) {
  if (!t_.rma_) return Status(Code::kUnsupported, "ofi: " + t_.rma_why_);
  if (exposed_.count(cookie) != 0) {
    return Status(Code::kInternal, "ofi: a buffer with that cookie is exposed already");
  }
  int error = 0;
  mem::RegistrationCache::Entry* entry = t_.cache_->acquire(data, length, FI_REMOTE_READ, &error);
  if (entry == nullptr) {
    return Status(Code::kIoError,
                  "ofi: registering a " + std::to_string(length) +
                      "-byte host buffer for remote reads failed: " + t_.error_text(error));
  }
  auto* mr = static_cast<fid_mr*>(entry->handle);
  const auto address = reinterpret_cast<std::uint64_t>(data);
  // Without FI_MR_VIRT_ADDR a remote address is an offset into the registration.
  region->address =
      (t_.info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0 ? address : address - entry->begin;
  region->key = fi_mr_key(mr);
  exposed_.emplace(cookie, entry);
  return Status::ok();
}

void Directs::unexpose(std::uint64_t cookie, bool revoke) {
  auto it = exposed_.find(cookie);
  if (it == exposed_.end()) return;
  t_.cache_->release(it->second, revoke);
  exposed_.erase(it);
}

Status Directs::start_read(int peer, void* data, std::size_t length, Endpoint::RemoteRegion region,
                           std::uint64_t cookie) {
  if (!t_.rma_) return Status(Code::kUnsupported, "ofi: " + t_.rma_why_);
  return start_rma(false, peer, data, length, region, cookie);
}

Status Directs::start_write(int peer, const void* data, std::size_t length,
                            Endpoint::RemoteRegion region, std::uint64_t cookie) {
  if (!t_.native_) return Status(Code::kUnsupported, "ofi: " + t_.native_why_);
  return start_rma(true, peer, const_cast<void*>(data), length, region, cookie);
}

Status Directs::start_rma(bool write, int peer, void* data, std::size_t length,
                          Endpoint::RemoteRegion region, std::uint64_t cookie) {
  const char* what = write ? "write" : "read";
  if (length > t_.info_->ep_attr->max_msg_size) {
    return Status(Code::kUnsupported, std::string("ofi: a ") + what + " of " +
                                          std::to_string(length) +
                                          " bytes exceeds the provider's largest message (" +
                                          std::to_string(t_.info_->ep_attr->max_msg_size) + ")");
  }
  std::unique_ptr<Op> op;
  if (Status status = new_op(peer, data, length, cookie, &op); !status) return status;
  op->read = !write;
  op->write = write;
  op->remote = region;
  if ((t_.info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0) {
    int error = 0;
    op->entry = t_.cache_->acquire(data, length, write ? FI_WRITE : FI_READ, &error);
    if (op->entry == nullptr) {
      return Status(Code::kIoError,
                    "ofi: registering a " + std::to_string(length) + "-byte host buffer to " +
                        what + (write ? " from" : " into") + " failed: " + t_.error_text(error));
    }
  }
  return launch(std::move(op));
}

bool Directs::post(Op& op, Status* status) {
  const OfiTransport::PeerState& state = t_.peers_[static_cast<std::size_t>(op.peer)];
  void* desc = op.mr != nullptr      ? fi_mr_desc(op.mr)
               : op.entry != nullptr ? fi_mr_desc(static_cast<fid_mr*>(op.entry->handle))
                                     : nullptr;
  ssize_t ret;
  if (op.read) {
    ret = fi_read(t_.ep_, op.data, op.length, desc, state.address, op.remote.address, op.remote.key,
                  &op.context);
  } else if (op.write) {
    // Complete once the data is in the peer's memory: a put's request means that.
    iovec iov{op.data, op.length};
    fi_rma_iov remote{op.remote.address, op.length, op.remote.key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = state.address;
    msg.rma_iov = &remote;
    msg.rma_iov_count = 1;
    msg.context = &op.context;
    ret = fi_writemsg(t_.ep_, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
  } else if (op.send) {
    ret = fi_tsend(t_.ep_, op.data, op.length, desc, state.address, op.key, &op.context);
  } else {
    ret = fi_trecv(t_.ep_, op.data, op.length, desc, state.address, op.key, 0, &op.context);
  }
  if (ret == -FI_EAGAIN) return false;
  if (ret != 0) {
    const char* call = op.read    ? "fi_read"
                       : op.write ? "fi_writemsg"
                       : op.send  ? "fi_tsend"
                                  : "fi_trecv";
    *status =
        Status(Code::kIoError, std::string("ofi: ") + call + " to rank " + std::to_string(op.peer) +
                                   " failed: " + t_.error_text(static_cast<int>(ret)));
  }
  return true;
}

void Directs::finish(Op* op, Status status) {
  auto it = ops_.find(op->cookie);
  if (it == ops_.end() || it->second.get() != op) return;
  const bool report = !op->orphaned;
  const std::uint64_t cookie = op->cookie;
  release_local(*op);
  ops_.erase(it);
  if (report) t_.handler_->on_direct(cookie, std::move(status));
}

void Directs::retry() {
  if (!failed_reads_.empty()) {
    std::vector<Op*> failed;
    failed.swap(failed_reads_);
    for (Op* op : failed) {
      finish(op, Status(Code::kIoError, "ofi: direct read from rank " + std::to_string(op->peer) +
                                            " failed (FERRY_TEST_OFI_READ_FAIL)"));
    }
  }
  if (retries_.empty()) return;
  std::vector<Op*> again;
  again.swap(retries_);
  for (std::size_t i = 0; i < again.size(); ++i) {
    Status status;
    if (!post(*again[i], &status)) {
      retries_.insert(retries_.end(), again.begin() + static_cast<long>(i), again.end());
      break;
    }
    if (!status) finish(again[i], std::move(status));
  }
}

void Directs::orphan(int peer, const std::string& why) {
  // A provider may never complete a send to a dead peer (tcp;ofi_rxm keeps it queued): its
  // direct transfers end now for the caller. The Op stays until the provider lets go of it.
  std::vector<std::uint64_t> cookies;
  for (auto& [cookie, op] : ops_) {
    if (op->peer == peer && !op->orphaned) cookies.push_back(cookie);
  }
  for (std::uint64_t cookie : cookies) {
    Op* op = ops_[cookie].get();
    fi_cancel(&t_.ep_->fid, &op->context);
    std::erase(retries_, op);
    op->orphaned = true;
    t_.handler_->on_direct(cookie, Status(Code::kPeerFailed, why));
  }
}

void Directs::cancel(std::uint64_t cookie) {
  auto it = ops_.find(cookie);
  if (it == ops_.end()) return;
  Op* op = it->second.get();
  auto queued = std::find(retries_.begin(), retries_.end(), op);
  if (queued != retries_.end()) {  // never reached the provider
    retries_.erase(queued);
    return finish(op, Status(Code::kCanceled, "direct transfer canceled"));
  }
  fi_cancel(&t_.ep_->fid, &op->context);  // its completion (canceled, or done) follows
}

}  // namespace ferry::transport::ofi
