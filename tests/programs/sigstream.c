// sigstream: a service that takes a steady stream of signals, for the test that a stream
// faster than one signal per capture round cannot starve a pause (tests/signals.rs).
//
//   sigstream wait     SIGRTMIN is blocked in every thread and taken by a thread of its own
//                      with sigwaitinfo; the values (sigqueue's sival_int) must come 1, 2, 3, ...
//   sigstream handler  SIGRTMIN is taken by an SA_SIGINFO handler on the main thread, same check.
//   sigstream timer    an interval timer (ITIMER_REAL) every 1 ms; SIGALRM's handler counts.
//
// stdin takes one command a line, each answered with one line on stdout:
//   count  ->  "N BAD": N the last value taken (the ticks for `timer`), BAD how many values came
//              out of order (a value lost, doubled or reordered by a checkpoint)
// "ready" is written first; end of input ends the program.
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

static atomic_long last, bad;

static void take(int value) {
  if (value != atomic_load(&last) + 1) atomic_fetch_add(&bad, 1);
  atomic_store(&last, value);
}

static void on_rt(int sig, siginfo_t *info, void *ctx) {
  (void)sig, (void)ctx;
  take(info->si_value.sival_int);
}

static void on_alarm(int sig) {
  (void)sig;
  atomic_fetch_add(&last, 1);
}

static void *waiter(void *arg) {
  sigset_t *set = arg;
  for (;;) {
    siginfo_t info;
    if (sigwaitinfo(set, &info) == SIGRTMIN) take(info.si_value.sival_int);
  }
  return NULL;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "wait";
  static sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGRTMIN);
  if (!strcmp(mode, "wait")) {
    // Blocked before the thread starts, so that every thread inherits the mask.
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    pthread_t t;
    if (pthread_create(&t, NULL, waiter, &set)) return 1;
  } else if (!strcmp(mode, "handler")) {
    struct sigaction sa = {.sa_sigaction = on_rt, .sa_flags = SA_SIGINFO | SA_RESTART};
    sigaction(SIGRTMIN, &sa, NULL);
  } else if (!strcmp(mode, "timer")) {
    struct sigaction sa = {.sa_handler = on_alarm, .sa_flags = SA_RESTART};
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval every = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_REAL, &every, NULL);
  } else {
    fprintf(stderr, "sigstream: unknown mode %s\n", mode);
    return 2;
  }
  printf("ready\n");
  fflush(stdout);
  char line[64];
  while (fgets(line, sizeof line, stdin)) {
    printf("%ld %ld\n", atomic_load(&last), atomic_load(&bad));
    fflush(stdout);
  }
  return 0;
}
