// Fuzzes ferryrun's store server end to end: a real StoreServer on a UNIX socket and four clients
// that send raw bytes or well-formed requests, close and reconnect, in the order the input says.
// The server must survive all of it, and every reply it sends must be a well-formed reply frame.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "bootstrap/store_protocol.hpp"
#include "bootstrap/store_server.hpp"
#include "fuzz_input.hpp"
#include "util/fd.hpp"
#include "util/log.hpp"

namespace store = ferry::bootstrap::store;
using ferry::util::Fd;

namespace {

std::string g_dir;  // private directory for the server's socket, removed at exit

struct Client {
  Fd fd;
  store::FrameReader reader;
};

Fd connect_to(const std::string& path) {
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  FUZZ_CHECK(fd.valid(), "socket: %s", std::strerror(errno));
  FUZZ_CHECK(::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0,
             "connect: %s", std::strerror(errno));
  return fd;
}

// Sends what the socket takes, polling the server when it is full; a client the server stopped
// reading (after an error reply) or dropped just loses the rest.
void send_bytes(ferry::bootstrap::StoreServer* server, Client* client,
                std::span<const std::byte> bytes) {
  std::size_t sent = 0;
  for (int tries = 0; sent < bytes.size() && tries < 8; ++tries) {
    ssize_t n = ::send(client->fd.get(), bytes.data() + sent, bytes.size() - sent,
                       MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (errno != EAGAIN) return;  // EPIPE, ECONNRESET: the server dropped us
    server->poll(0);
  }
}

void check_reply(const store::Frame& frame, int size) {
  switch (frame.op) {
    case store::Op::kHelloOk:
    case store::Op::kBarrierDone:
      FUZZ_CHECK(store::decode_empty(frame.payload), "%s with a payload",
                 store::op_name(frame.op).c_str());
      return;
    case store::Op::kValue: {
      store::KeyValue kv;
      FUZZ_CHECK(store::decode_value(frame.payload, &kv), "malformed VALUE");
      return;
    }
    case store::Op::kAllgatherDone: {
      std::vector<store::Bytes> blobs;
      FUZZ_CHECK(
          store::decode_allgather_done(frame.payload, static_cast<std::size_t>(size), &blobs),
          "malformed ALLGATHER_DONE");
      return;
    }
    case store::Op::kError: {
      store::ErrorReply error;
      FUZZ_CHECK(store::decode_error(frame.payload, &error), "malformed ERROR");
      return;
    }
    case store::Op::kMissingList: {  // the answer to MISSING
      std::string text;
      FUZZ_CHECK(store::decode_missing_list(frame.payload, &text), "malformed MISSING_LIST");
      FUZZ_CHECK(!text.empty(), "an empty MISSING_LIST");
      return;
    }
    default:
      FUZZ_CHECK(false, "the server sent %s, which is no reply", store::op_name(frame.op).c_str());
  }
}

// Reads and checks every reply waiting for each client.
void read_replies(std::array<Client, 4>* clients, int size) {
  for (Client& client : *clients) {
    if (!client.fd.valid()) continue;
    for (;;) {
      store::FrameReader::Read read = client.reader.read_some(client.fd.get());
      store::Frame frame;
      for (;;) {
        bool got = false;
        ferry::Status status = client.reader.next(&frame, &got);
        FUZZ_CHECK(status.is_ok(), "the server sent a malformed frame: %s",
                   status.to_string().c_str());
        if (!got) break;
        check_reply(frame, size);
      }
      if (read != store::FrameReader::Read::kData) break;
    }
  }
}

std::string text(std::span<const std::byte> bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  ferry::util::set_log_level(ferry::util::LogLevel::kError);  // every rejection logs a warning
  char dir[] = "/tmp/ferry-fuzz-store-XXXXXX";
  if (::mkdtemp(dir) == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  g_dir = dir;
  std::atexit([] { ::rmdir(g_dir.c_str()); });
  return 0;
}

// Input: u8 job size - 1 (mod 4), then commands: u8 (client in bits 0-1, action in bits 2-4) and
// the action's fields (see the switch).
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ferry::fuzz::Input in(data, size);
  const int job_size = 1 + in.u8() % 4;
  const std::string path = g_dir + "/store.sock";
  ferry::bootstrap::StoreServer server(
      path, job_size, [&](int rank, int /*pid*/, int /*code*/, const std::string& reason) {
        FUZZ_CHECK(rank >= 0 && rank < job_size, "ABORT from rank %d", rank);
        FUZZ_CHECK(reason.size() <= store::kMaxReasonBytes, "ABORT reason too long");
      });
  std::array<Client, 4> clients;
  for (Client& client : clients) client.fd = connect_to(path);
  server.poll(0);

  while (!in.empty()) {
    const std::uint8_t command = in.u8();
    const int index = command & 3;
    Client& client = clients[static_cast<std::size_t>(index)];
    store::Bytes frame;
    switch ((command >> 2) & 7) {
      case 0:
      case 1:  // raw bytes: frames of any shape, split anywhere
        if (client.fd.valid()) send_bytes(&server, &client, in.bytes(in.u8()));
        break;
      case 2: {  // HELLO, with a rank that may be out of range or taken
        int rank = static_cast<int>(in.u8() % (job_size + 2)) - 1;
        frame = store::encode_hello(rank, (in.u8() & 0x80) != 0 ? job_size + 1 : job_size,
                                    1000 + index);
        break;
      }
      case 3: {  // PUT
        std::string key = text(in.bytes(in.u8() % 8));
        frame = store::encode_put(key, in.bytes(in.u8() % 32));
        break;
      }
      case 4:  // GET
        frame = store::encode_get(text(in.bytes(in.u8() % 8)));
        break;
      case 5:  // BARRIER or ALLGATHER
        frame = (in.u8() & 1) != 0 ? store::encode_barrier()
                                   : store::encode_allgather(in.bytes(in.u8() % 32));
        break;
      case 6: {  // ABORT
        auto code = static_cast<int>(in.u8());
        frame = store::encode_abort(code, text(in.bytes(in.u8() % 16)));
        break;
      }
      case 7:  // close, or connect again (a rank that left and comes back)
        if (client.fd.valid()) {
          client.fd.reset();
        } else {
          client.fd = connect_to(path);
        }
        client.reader = store::FrameReader();
        break;
    }
    if (!frame.empty() && client.fd.valid()) send_bytes(&server, &client, frame);
    server.poll(0);
    read_replies(&clients, job_size);
  }
  server.poll(0);
  read_replies(&clients, job_size);
  FUZZ_CHECK(server.connected_ranks() >= 0 && server.connected_ranks() <= job_size,
             "%d ranks connected to a job of %d", server.connected_ranks(), job_size);
  return 0;
}
