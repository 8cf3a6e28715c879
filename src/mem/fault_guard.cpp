// The fault handler behind mem::guarded (see fault_guard.hpp).
#include "mem/fault_guard.hpp"

#include <unistd.h>

#include <csignal>
#include <mutex>

namespace ferry::mem {
namespace {

struct sigaction g_previous[2];  // SIGSEGV, SIGBUS as they were before ours
bool g_installed = false;

int slot_of(int signal) { return signal == SIGBUS ? 1 : 0; }

void on_fault(int signal, siginfo_t* info, void* context) {
  FaultGuard& guard = fault_guard();
  const auto address = reinterpret_cast<std::uintptr_t>(info->si_addr);
  if (guard.armed && address >= guard.low && address < guard.high) {
    guard.armed = false;
    // The jump does not restore the mask (sigsetjmp(…, 0)). SA_NODEFER keeps the signal
    // unblocked, but a runtime that wraps handlers (TSan's does) may install ours without it:
    // the signal would stay blocked, and the next fault would end the process. Unblock it here,
    // on the fault path only (pthread_sigmask is async-signal-safe).
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, signal);
    ::pthread_sigmask(SIG_UNBLOCK, &mask, nullptr);
    siglongjmp(guard.jump, 1);
  }
  // Not ours: what was there before decides.
  const struct sigaction& before = g_previous[slot_of(signal)];
  if ((before.sa_flags & SA_SIGINFO) != 0 && before.sa_sigaction != nullptr) {
    before.sa_sigaction(signal, info, context);
    return;
  }
  if (before.sa_handler != SIG_DFL && before.sa_handler != SIG_IGN &&
      before.sa_handler != nullptr) {
    before.sa_handler(signal);
    return;
  }
  // The default: put it back and return, so the faulting instruction runs again and the
  // process ends by its signal as it would have without us.
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  ::sigaction(signal, &fallback, nullptr);
}

}  // namespace

FaultGuard& fault_guard() {
  thread_local FaultGuard guard;
  return guard;
}

bool install_fault_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction action {};
    action.sa_sigaction = on_fault;
    // NODEFER: the jump out of the handler does not restore the signal mask (sigsetjmp(…, 0)),
    // so the signal must not be blocked while it runs.
    action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    g_installed = ::sigaction(SIGSEGV, &action, &g_previous[0]) == 0 &&
                  ::sigaction(SIGBUS, &action, &g_previous[1]) == 0;
  });
  return g_installed;
}

bool readable(const void* address, std::size_t bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  const auto* first = static_cast<const volatile unsigned char*>(address);
  return guarded(address, bytes, Touch::kRead, [&] {
    for (std::size_t at = 0; at < bytes; at += page) (void)first[at];
    (void)first[bytes - 1];
  });
}

}  // namespace ferry::mem
