// libfabric's own atomics (fi_fetch_atomic, FI_SUM on a uint64) between two processes of this
// node, the measurement behind ferry's choice to apply atomics over ofi by its own messages
// (docs/ARCHITECTURE.md, "One-sided"). A parent and a forked child each open an RDM endpoint of
// the named provider; the child registers one 8-byte word and drives progress; the parent sends
// windows of fetch-adds to it and waits for each window. Prints the time per add for each window
// size, and checks that the word and the fetched values add up.
//   bench/ofi_atomic_probe [provider (default tcp)] [adds (default 200000)]
// Built with the project where libfabric is installed (build/bench/ofi_atomic_probe).
#define _GNU_SOURCE
#include <rdma/fabric.h>
#include <rdma/fi_atomic.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(call)                                                             \
  do {                                                                          \
    int ret_ = (int)(call);                                                     \
    if (ret_ != 0) {                                                            \
      fprintf(stderr, "%s failed: %s (%d)\n", #call, fi_strerror(-ret_), ret_); \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

struct side {
  struct fi_info* info;
  struct fid_fabric* fabric;
  struct fid_domain* domain;
  struct fid_cq* cq;
  struct fid_av* av;
  struct fid_ep* ep;
  fi_addr_t peer;
};

// What the target tells the initiator: its endpoint name and where its word is.
struct announce {
  char name[256];
  size_t name_length;
  uint64_t address;
  uint64_t key;
};

static void open_side(const char* provider, struct side* s) {
  struct fi_info* hints = fi_allocinfo();
  hints->caps = FI_MSG | FI_ATOMIC;
  hints->ep_attr->type = FI_EP_RDM;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  hints->fabric_attr->prov_name = strdup(provider);
  CHECK(fi_getinfo(FI_VERSION(1, 14), NULL, NULL, 0, hints, &s->info));
  fi_freeinfo(hints);
  CHECK(fi_fabric(s->info->fabric_attr, &s->fabric, NULL));
  CHECK(fi_domain(s->fabric, s->info, &s->domain, NULL));
  struct fi_cq_attr cq_attr = {.format = FI_CQ_FORMAT_CONTEXT, .size = 1024};
  CHECK(fi_cq_open(s->domain, &cq_attr, &s->cq, NULL));
  struct fi_av_attr av_attr = {.type = FI_AV_TABLE, .count = 2};
  CHECK(fi_av_open(s->domain, &av_attr, &s->av, NULL));
  CHECK(fi_endpoint(s->domain, s->info, &s->ep, NULL));
  CHECK(fi_ep_bind(s->ep, &s->cq->fid, FI_TRANSMIT | FI_RECV));
  CHECK(fi_ep_bind(s->ep, &s->av->fid, 0));
  CHECK(fi_enable(s->ep));
}

static struct fid_mr* register_word(struct side* s, void* word, uint64_t access) {
  struct fid_mr* mr = NULL;
  CHECK(fi_mr_reg(s->domain, word, 8 * 64, access, 0, 0, 0, &mr, NULL));
  if (s->info->domain_attr->mr_mode & FI_MR_ENDPOINT) {
    CHECK(fi_mr_bind(mr, &s->ep->fid, 0));
    CHECK(fi_mr_enable(mr));
  }
  return mr;
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void wait_completions(struct side* s, int count) {
  struct fi_cq_entry entries[64];
  while (count > 0) {
    ssize_t n = fi_cq_read(s->cq, entries, 64);
    if (n > 0) {
      count -= (int)n;
    } else if (n != -FI_EAGAIN) {
      struct fi_cq_err_entry error = {0};
      fi_cq_readerr(s->cq, &error, 0);
      fprintf(stderr, "completion error: %s\n", fi_strerror(error.err));
      exit(1);
    }
  }
}

int main(int argc, char** argv) {
  const char* provider = argc > 1 ? argv[1] : "tcp";
  const long adds = argc > 2 ? atol(argv[2]) : 200000;
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) != 0) return 1;
  pid_t child = fork();
  struct side s;
  memset(&s, 0, sizeof s);
  open_side(provider, &s);
  struct announce mine = {.name_length = sizeof mine.name};
  CHECK(fi_getname(&s.ep->fid, mine.name, &mine.name_length));
  static uint64_t words[64] __attribute__((aligned(64)));
  const int fd = child == 0 ? pair[1] : pair[0];
  if (child == 0) {  // the target: one word, progress until told to stop
    struct fid_mr* mr = register_word(&s, words, FI_REMOTE_READ | FI_REMOTE_WRITE);
    mine.address =
        (s.info->domain_attr->mr_mode & FI_MR_VIRT_ADDR) ? (uint64_t)(uintptr_t)words : 0;
    mine.key = fi_mr_key(mr);
    if (write(fd, &mine, sizeof mine) != sizeof mine) return 1;
    struct announce theirs;
    if (read(fd, &theirs, sizeof theirs) != sizeof theirs) return 1;
    CHECK(fi_av_insert(s.av, theirs.name, 1, &s.peer, 0, NULL) != 1);
    for (;;) {
      struct fi_cq_entry entry;
      fi_cq_read(s.cq, &entry, 1);
      char stop;
      if (recv(fd, &stop, 1, MSG_DONTWAIT) == 1) break;
    }
    uint64_t total = words[0];
    if (write(fd, &total, sizeof total) != sizeof total) return 1;
    fi_close(&mr->fid);
    return 0;
  }
  struct announce theirs;
  if (read(fd, &theirs, sizeof theirs) != sizeof theirs) return 1;
  if (write(fd, &mine, sizeof mine) != sizeof mine) return 1;
  CHECK(fi_av_insert(s.av, theirs.name, 1, &s.peer, 0, NULL) != 1);
  static uint64_t results[64];
  static uint64_t one = 1;
  struct fid_mr* result_mr = NULL;
  struct fid_mr* operand_mr = NULL;
  void* result_desc = NULL;
  void* operand_desc = NULL;
  if (s.info->domain_attr->mr_mode & FI_MR_LOCAL) {
    result_mr = register_word(&s, results, FI_READ | FI_WRITE);
    operand_mr = register_word(&s, words, FI_READ | FI_WRITE);  // any registered 8 bytes
    result_desc = fi_mr_desc(result_mr);
    operand_desc = fi_mr_desc(operand_mr);
    words[0] = 1;
  }
  const void* operand = operand_mr != NULL ? (const void*)words : (const void*)&one;
  printf("provider %s (%s): fi_fetch_atomic FI_SUM uint64 to a peer process\n", provider,
         s.info->fabric_attr->prov_name);
  const int windows[] = {1, 64};
  uint64_t expected = 0;
  for (size_t w = 0; w < sizeof windows / sizeof windows[0]; ++w) {
    const int window = windows[w];
    const long rounds = (window == 1 ? adds / 4 : adds) / window;
    double start = 0;
    for (long r = -100; r < rounds; ++r) {
      if (r == 0) start = now_us();
      int done = 0;
      for (int i = 0; i < window; ++i) {
        ssize_t ret;
        while ((ret = fi_fetch_atomic(s.ep, operand, 1, operand_desc, &results[i], result_desc,
                                      s.peer, theirs.address, theirs.key, FI_UINT64, FI_SUM,
                                      NULL)) == -FI_EAGAIN) {
          struct fi_cq_entry entries[64];
          const ssize_t n = fi_cq_read(s.cq, entries, 64);
          if (n > 0) done += (int)n;
        }
        CHECK(ret);
      }
      wait_completions(&s, window - done);
      expected += (uint64_t)window;
    }
    const double us = now_us() - start;
    printf("window %2d: %.3f us per add (%ld adds)\n", window, us / (double)(rounds * window),
           rounds * window);
  }
  char stop = 1;
  if (write(fd, &stop, 1) != 1) return 1;
  uint64_t total = 0;
  if (read(fd, &total, sizeof total) != sizeof total) return 1;
  waitpid(child, NULL, 0);
  printf("target word %llu, %s\n", (unsigned long long)total,
         total == expected ? "as expected" : "WRONG");
  return total == expected ? 0 : 1;
}
