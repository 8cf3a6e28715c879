/* The floor under a put ping-pong between two processes of this node, without any library: each
 * stores one byte into a shared page the other polls. Between two looks at the byte a poller
 * does `work` dependent increments (about a nanosecond each), standing for the call a real loop
 * makes between looks (progress()). Prints the half round trip for each amount of work given.
 *   poll_pingpong ITERATIONS WORK...      e.g. poll_pingpong 2000000 0 2 4 8 16 32
 * docs/PERFORMANCE.md, "One-sided", has what it showed: a loop that looks too often is slower. */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void wait_for(volatile const uint8_t* flag, uint8_t value, int work, volatile long* sink) {
  while (*flag != value) {
    for (int i = 0; i < work; ++i) ++*sink;
  }
}

static double pingpong(long iterations, int work) {
  /* Two pages: each byte alone in its line, and in a page of its own. */
  uint8_t* shared = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) {
    perror("mmap");
    exit(1);
  }
  volatile uint8_t* to_child = shared + 4096;
  volatile uint8_t* to_parent = shared + 2 * 4096;
  volatile long sink = 0;
  pid_t child = fork();
  if (child < 0) {
    perror("fork");
    exit(1);
  }
  if (child == 0) {
    for (long i = 0; i < iterations; ++i) {
      const uint8_t mark = (uint8_t)((i & 0x7f) + 1);
      wait_for(to_child, mark, work, &sink);
      *to_parent = mark;
    }
    _exit(0);
  }
  const double start = now_ns();
  for (long i = 0; i < iterations; ++i) {
    const uint8_t mark = (uint8_t)((i & 0x7f) + 1);
    *to_child = mark;
    wait_for(to_parent, mark, work, &sink);
  }
  const double elapsed = now_ns() - start;
  waitpid(child, NULL, 0);
  munmap(shared, 3 * 4096);
  return elapsed / (2.0 * (double)iterations);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s ITERATIONS WORK...\n", argv[0]);
    return 2;
  }
  const long iterations = atol(argv[1]);
  for (int a = 2; a < argc; ++a) {
    const int work = atoi(argv[a]);
    printf("work %3d: %.1f ns half round trip\n", work, pingpong(iterations, work));
  }
  return 0;
}
