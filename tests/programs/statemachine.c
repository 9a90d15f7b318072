/*
 * statemachine.c — Tardi capture/restore correctness probe.
 *
 * WHAT IT TESTS
 *   A multi-threaded process whose entire state is a deterministic function
 *   of per-thread step counters.  The harness checkpoints it at random
 *   moments, kills it, restores it into a new process and then checks that
 *   (a) it keeps running, (b) its step counters keep increasing from where
 *   the checkpoint left them, and (c) the digest of its memory is exactly
 *   what the pure functions predict from the reported step counts.
 *
 *   State lives in every kind of place a checkpointer must get right:
 *     - main-arena heap (calloc'ed by the main thread before the workers
 *       start: brk heap),
 *     - per-thread malloc arena heap (calloc'ed inside each worker: glibc
 *       mmaps 64 MiB "heaps" with PROT_NONE tails for those),
 *     - one shared 8 MiB calloc'ed block (mmap-backed) touched sparsely
 *       (K*64 slots spread evenly, ~32 KiB apart for K=4, so most pages
 *       are never written; the word after every slot and one word half-way
 *       to the next slot must read as zero),
 *     - the worker's own stack (an array in the long-lived worker frame),
 *     - TLS: a zero-initialised __thread array (.tbss) and an initialised
 *       one (.tdata),
 *     - a private anonymous mmap region per thread (16 pages),
 *     - a shared mapping that is normally PROT_READ; each thread owns two
 *       pages of it, and every 16 steps mprotects them RW, writes, and
 *       mprotects them back to RO (VMA splitting/merging; the RO protection
 *       is checked with process_vm_writev, which must fail with EFAULT),
 *     - globals in .bss and .data (the .data one has a non-zero initialiser),
 *     - a SIGUSR1 handler (SA_ONSTACK|SA_RESTART|SA_SIGINFO) that runs on a
 *       sigaltstack of worker 0 (it checks that it really runs on the
 *       altstack) and updates a signal region + a handled-signals counter.
 *       Worker 0 sends the signal to itself (pthread_kill) at deterministic
 *       steps, so the handled count is sig = steps[0] / 10.
 *   Per-thread kernel/user state also checked: the thread signal mask
 *   (odd workers block SIGUSR2), x87/SSE state (a double carried in the
 *   frame), pipe contents, timerfds, clear_child_tid (main joins the
 *   network thread, so "exit" only works if that futex wake is restored).
 *
 * THREADS AND WHERE THEY BLOCK (kind = worker index % 4)
 *   main        pthread_join(network thread)       (futex on the tid word)
 *   network     epoll_wait on {UDP socket, 1 ms periodic timerfd}; each tick
 *               hands out credits to kind-0 workers and writes tokens into
 *               kind-2 workers' pipes
 *   kind 0      futex: even steps sem_wait(), odd steps pthread_cond_wait()
 *               (worker 0 also owns the sigaltstack + SIGUSR1)
 *   kind 1      nanosleep 1..5 ms between steps (EINTR -> sleep the rest)
 *   kind 2      read() on a pipe; the network thread writes 8-byte tokens
 *               (token t of worker i = val(i, 11, t)); reads are sometimes
 *               5 bytes so half tokens sit in the worker's stack buffer and
 *               the rest stays buffered in the pipe; every token is checked
 *   kind 3      poll() + read() on its own 1 ms periodic timerfd
 *   Every blocking call retries on EINTR.
 *   Measured rates: ~1000 steps/s for kinds 0, 2, 3 and ~320/s for kind 1
 *   (~3300 steps/s in total and ~7% of one core for K=4).
 *   While paused (UDP "pause") workers block in pthread_mutex_lock.
 *
 * DETERMINISM / PURE FUNCTIONS
 *   mix64(x)       = splitmix64 finaliser:
 *                      x += 0x9E3779B97F4A7C15;
 *                      x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9;
 *                      x = (x ^ (x >> 27)) * 0x94D049BB133111EB;
 *                      x ^= x >> 31
 *   val(i, r, k)   = mix64(((i + 1) << 56) ^ (r << 48) ^ k)
 *   Region r (table REGIONS below: len L, period P, init) of thread i is
 *   updated on every step s with (s + 1) % P == 0; that update has index
 *   k = (s + 1) / P - 1 and writes slot k % L := val(i, r, k).  After n
 *   steps, U = n / P updates happened and slot j holds
 *        j < U ? val(i, r, j + L * ((U - 1 - j) / L)) : init.
 *   The signal region (r = 10, L = 8, owned by thread 0) works the same with
 *   U = sig (the handled count); sig = steps[0] / 10 by construction.
 *
 * DIGEST (computed from MEMORY by the network thread while holding every
 * worker's mutex, i.e. all workers are between steps)
 *   FNV-1a 64 (offset 0xcbf29ce484222325, prime 0x100000001b3) over the
 *   little-endian bytes of these 64-bit words, in order:
 *     for i in 0..K, for r in 0..10, for j in 0..L_r : slot(i, r, j)
 *     for j in 0..8 : signal slot j
 *     the handled-signal counter
 *   "expected" is the same hash over the closed-form values computed from
 *   the step counts alone (sig taken as steps[0] / 10).
 *
 * SELF-VERIFICATION
 *   Before every step a worker checks all of its slots (and the big-block
 *   guard words, its step counter, its double, and for worker 0 the signal
 *   region/count) against the closed form; after the step it checks the
 *   slots it wrote.  Every 64 steps it checks its signal mask and the RO
 *   protection.  On mismatch: "CORRUPT <where> thread=<i> step=<n>" on
 *   stderr and _exit(3).
 *
 * COMMAND LINE
 *   statemachine [--port N] [--threads K] [--exit-after-ms MS]
 *     --port     UDP port on 0.0.0.0 (default 7000; 0 = ephemeral)
 *     --threads  worker threads, 1..64 (default 4)
 *     --exit-after-ms  exit(0) by itself after MS ms of CLOCK_MONOTONIC
 *   Prints "READY port=<p> threads=<K> pid=<pid>" on stdout once serving.
 *
 * UDP PROTOCOL (one datagram in, one datagram out, replies end in '\n';
 * trailing whitespace in requests is ignored)
 *   ping   -> "pong"
 *   digest -> "steps=<n0>,...,<nK-1> sig=<s> digest=<hex16> expected=<hex16>"
 *   pause  -> "paused"    (workers stop between steps until resume)
 *   resume -> "resumed"
 *   fds    -> "fds n=<count> <fd>=<target> ..."
 *   exit   -> "bye", then the process exits with status 0
 *   other  -> "error unknown-command"
 *
 * Exit status: 0 on "exit"/--exit-after-ms, 3 on CORRUPT, 2 on usage or
 * setup errors.  Do not send SIGUSR1 to it from outside.
 *
 * Build: gcc -O2 -g -pthread -Wall -Wextra -o statemachine statemachine.c
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define MAXT 64
#define PAGE 4096

/* ---- regions ------------------------------------------------------------ */
enum {
    R_STACK = 0, R_TLS, R_TDATA, R_HEAPM, R_HEAPA, R_BIG, R_MMAP, R_RO, R_BSS,
    R_DATA, NREG
};
#define R_SIG 10  /* signal region, thread 0 only */
#define R_PIPE 11 /* pipe token stream (not part of the digest) */

#define TDATA_INIT 0x7464617461746461ULL /* "tdatatda" */
#define DATA_INIT 0x2e646174612e6461ULL  /* ".data.da" */

#define L_STACK 31
#define L_TLS 29
#define L_TDATA 13
#define L_HEAPM 61
#define L_HEAPA 67
#define L_BIG 64
#define L_MMAP 48
#define L_RO 32
#define L_BSS 16
#define L_DATA 16
#define L_SIG 8
#define SIG_PERIOD 10

struct region {
    const char *name;
    uint32_t len, period;
    uint64_t init;
};
static const struct region REGIONS[NREG] = {
    [R_STACK] = {"stack", L_STACK, 1, 0},
    [R_TLS] = {"tls", L_TLS, 1, 0},
    [R_TDATA] = {"tdata", L_TDATA, 3, TDATA_INIT},
    [R_HEAPM] = {"heap-main", L_HEAPM, 1, 0},
    [R_HEAPA] = {"heap-arena", L_HEAPA, 1, 0},
    [R_BIG] = {"heap-big", L_BIG, 1, 0},
    [R_MMAP] = {"mmap", L_MMAP, 1, 0},
    [R_RO] = {"mprotect-ro", L_RO, 16, 0},
    [R_BSS] = {"bss", L_BSS, 2, 0},
    [R_DATA] = {"data", L_DATA, 5, DATA_INIT},
};

#define BIG_SIZE (8u << 20)
#define MMAP_PAGES 16
#define RO_PAGES 2

static inline uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}
static inline uint64_t val(unsigned i, unsigned r, uint64_t k) {
    return mix64(((uint64_t)(i + 1) << 56) ^ ((uint64_t)r << 48) ^ k);
}
/* closed form: value of slot j of a region (len L, init) after U updates */
static inline uint64_t closed(unsigned i, unsigned r, uint64_t L, uint64_t init,
                              uint64_t j, uint64_t U) {
    if (j >= U) return init;
    return val(i, r, j + L * ((U - 1 - j) / L));
}
static inline uint64_t expected_slot(unsigned i, unsigned r, unsigned j, uint64_t n) {
    const struct region *R = &REGIONS[r];
    return closed(i, r, R->len, R->init, j, n / R->period);
}

/* ---- global state ------------------------------------------------------- */
static uint64_t g_bss[MAXT][L_BSS];
static uint64_t g_data[MAXT][L_DATA] = {[0 ... MAXT - 1] = {[0 ... L_DATA - 1] = DATA_INIT}};
static __thread uint64_t tls_bss[L_TLS];
static __thread uint64_t tls_tdata[L_TDATA] = {[0 ... L_TDATA - 1] = TDATA_INIT};

static uint64_t g_sig_slots[L_SIG];
static volatile uint64_t g_sig_handled;
static char *g_altstack_lo, *g_altstack_hi;

static unsigned g_nthreads = 4;
static uint8_t *g_big;     /* BIG_SIZE, shared */
static size_t g_big_stride;
static size_t g_big_mid;   /* offset of a never-written word between slots */
static uint8_t *g_ro;      /* nthreads * RO_PAGES pages, PROT_READ */

struct worker {
    unsigned idx, kind;
    pthread_t th;
    pthread_mutex_t mu;         /* held while stepping; digest takes all */
    _Atomic uint64_t steps;     /* completed steps */
    uint64_t *stack_slots, *tls_slots, *tdata_slots, *heapm, *heapa;
    uint8_t *mmap_base, *ro_base;
    /* kind 0 */
    sem_t sem;
    pthread_mutex_t cmu;
    pthread_cond_t cond;
    unsigned tickets;
    /* kind 2 */
    int pipe_rd, pipe_wr;
    uint64_t tokens_written;    /* network thread only */
    char pad[64];
};
static struct worker g_w[MAXT];
static pthread_barrier_t g_start;

/* ---- error reporting ---------------------------------------------------- */
static size_t fmt_u64(char *p, uint64_t v) {
    char t[24];
    size_t n = 0, i;
    do { t[n++] = (char)('0' + v % 10); v /= 10; } while (v);
    for (i = 0; i < n; i++) p[i] = t[n - 1 - i];
    return n;
}
/* async-signal-safe */
static void corrupt(const char *where, unsigned thread, uint64_t step) {
    char buf[256];
    size_t n = 0, l = strlen(where);
    if (l > 150) l = 150;
    memcpy(buf, "CORRUPT ", 8); n = 8;
    memcpy(buf + n, where, l); n += l;
    memcpy(buf + n, " thread=", 8); n += 8;
    n += fmt_u64(buf + n, thread);
    memcpy(buf + n, " step=", 6); n += 6;
    n += fmt_u64(buf + n, step);
    buf[n++] = '\n';
    ssize_t rc = write(2, buf, n);
    (void)rc;
    _exit(3);
}
static void die(const char *what) {
    fprintf(stderr, "statemachine: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* ---- slot addressing ---------------------------------------------------- */
static inline uint64_t *slot_ptr(struct worker *w, unsigned r, unsigned j) {
    switch (r) {
    case R_STACK: return &w->stack_slots[j];
    case R_TLS: return &w->tls_slots[j];
    case R_TDATA: return &w->tdata_slots[j];
    case R_HEAPM: return &w->heapm[j];
    case R_HEAPA: return &w->heapa[j];
    case R_BIG:
        return (uint64_t *)(g_big + (size_t)(j * g_nthreads + w->idx) * g_big_stride);
    case R_MMAP:
        return (uint64_t *)(w->mmap_base + (j % MMAP_PAGES) * PAGE + (j / MMAP_PAGES) * 520);
    case R_RO:
        return (uint64_t *)(w->ro_base + (j % RO_PAGES) * PAGE + (j / RO_PAGES) * 64);
    case R_BSS: return &g_bss[w->idx][j];
    case R_DATA: return &g_data[w->idx][j];
    }
    abort();
}

/* ---- signal handler ----------------------------------------------------- */
static void on_usr1(int sig, siginfo_t *si, void *uc) {
    (void)sig; (void)si; (void)uc;
    volatile char probe = 0;
    char *p = (char *)&probe;
    uint64_t c = g_sig_handled;
    if (p < g_altstack_lo || p >= g_altstack_hi) corrupt("sigaltstack", 0, c);
    g_sig_slots[c % L_SIG] = val(0, R_SIG, c);
    g_sig_handled = c + 1;
}

/* ---- verification and stepping ----------------------------------------- */
static void verify_all(struct worker *w, uint64_t n) {
    unsigned i = w->idx;
    for (unsigned r = 0; r < NREG; r++) {
        const struct region *R = &REGIONS[r];
        uint64_t U = n / R->period;
        for (unsigned j = 0; j < R->len; j++) {
            uint64_t *p = slot_ptr(w, r, j);
            if (*p != closed(i, r, R->len, R->init, j, U)) corrupt(R->name, i, n);
            if (r == R_BIG && (p[1] != 0 || *(uint64_t *)((uint8_t *)p + g_big_mid) != 0))
                corrupt("heap-big-guard", i, n);
        }
    }
    if (i == 0) {
        uint64_t s = n / SIG_PERIOD;
        if (g_sig_handled != s) corrupt("signal-count", i, n);
        for (unsigned j = 0; j < L_SIG; j++)
            if (g_sig_slots[j] != closed(0, R_SIG, L_SIG, 0, j, s)) corrupt("signal-region", i, n);
    }
}

static void set_ro(struct worker *w, int prot, uint64_t n) {
    if (mprotect(w->ro_base, RO_PAGES * PAGE, prot) != 0) corrupt("mprotect-failed", w->idx, n);
}

/* perform step n (n = completed steps so far); caller holds w->mu */
static void apply_step(struct worker *w, uint64_t n) {
    unsigned i = w->idx;
    for (unsigned r = 0; r < NREG; r++) {
        const struct region *R = &REGIONS[r];
        if ((n + 1) % R->period) continue;
        uint64_t k = (n + 1) / R->period - 1;
        uint64_t *p = slot_ptr(w, r, (unsigned)(k % R->len));
        uint64_t v = val(i, r, k);
        if (r == R_RO) set_ro(w, PROT_READ | PROT_WRITE, n);
        *p = v;
        if (r == R_RO) set_ro(w, PROT_READ, n);
        __asm__ volatile("" ::: "memory");
        if (*p != v) corrupt("write-readback", i, n);
    }
    if (i == 0 && (n + 1) % SIG_PERIOD == 0) {
        int e = pthread_kill(pthread_self(), SIGUSR1);
        if (e) corrupt("pthread_kill-failed", i, n);
        /* a self-directed unblocked signal is delivered before tgkill returns */
        if (g_sig_handled != (n + 1) / SIG_PERIOD) corrupt("signal-not-delivered", i, n);
    }
}

static void periodic_checks(struct worker *w, uint64_t n) {
    sigset_t cur;
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    if (sigismember(&cur, SIGUSR2) != (int)(w->idx & 1)) corrupt("sigmask", w->idx, n);
    if (sigismember(&cur, SIGUSR1)) corrupt("sigmask-usr1", w->idx, n);
    /* the RO pages must really be read-only: process_vm_writev honours
       protections (no FOLL_FORCE) and must fail with EFAULT */
    uint64_t *p = slot_ptr(w, R_RO, 0);
    uint64_t copy = *p;
    struct iovec l = {&copy, 8}, rv = {p, 8};
    ssize_t rc = process_vm_writev(getpid(), &l, 1, &rv, 1, 0);
    if (rc == 8) corrupt("mprotect-not-readonly", w->idx, n);
}

static void step(struct worker *w, uint64_t *n, double *fp) {
    pthread_mutex_lock(&w->mu);
    uint64_t s = *n;
    if (atomic_load(&w->steps) != s) corrupt("step-counter", w->idx, s);
    if (*fp != (double)s) corrupt("fpu", w->idx, s);
    verify_all(w, s);
    apply_step(w, s);
    /* verify what was written */
    for (unsigned r = 0; r < NREG; r++) {
        const struct region *R = &REGIONS[r];
        if ((s + 1) % R->period) continue;
        unsigned j = (unsigned)(((s + 1) / R->period - 1) % R->len);
        if (*slot_ptr(w, r, j) != expected_slot(w->idx, r, j, s + 1)) corrupt(R->name, w->idx, s + 1);
    }
    *n = s + 1;
    *fp += 1.0;
    atomic_store(&w->steps, s + 1);
    pthread_mutex_unlock(&w->mu);
    if ((s & 63) == 0) periodic_checks(w, s + 1);
}

/* ---- workers ------------------------------------------------------------ */
static void *worker_main(void *arg) {
    struct worker *w = arg;
    uint64_t stk[L_STACK];
    memset(stk, 0, sizeof stk);
    w->stack_slots = stk;
    w->tls_slots = tls_bss;
    w->tdata_slots = tls_tdata;
    w->heapa = calloc(L_HEAPA, sizeof(uint64_t));
    if (!w->heapa) die("calloc");
    void *m = mmap(NULL, MMAP_PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) die("mmap");
    w->mmap_base = m;

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR2);
    pthread_sigmask((w->idx & 1) ? SIG_BLOCK : SIG_UNBLOCK, &set, NULL);
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);

    if (w->idx == 0) {
        size_t sz = 64 * 1024;
        char *alt = malloc(sz);
        if (!alt) die("malloc altstack");
        g_altstack_lo = alt;
        g_altstack_hi = alt + sz;
        stack_t ss = {.ss_sp = alt, .ss_size = sz, .ss_flags = 0};
        if (sigaltstack(&ss, NULL) != 0) die("sigaltstack");
    }
    int tfd = -1;
    if (w->kind == 3) {
        tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        if (tfd < 0) die("timerfd_create");
        struct itimerspec its = {{0, 1000000}, {0, 1000000}};
        if (timerfd_settime(tfd, 0, &its, NULL) != 0) die("timerfd_settime");
    }
    char name[16];
    static const char *kinds[] = {"futex", "sleep", "pipe", "timer"};
    snprintf(name, sizeof name, "sm-w%u-%s", w->idx, kinds[w->kind]);
    pthread_setname_np(pthread_self(), name);

    pthread_barrier_wait(&g_start);

    uint64_t n = 0;
    double fp = 0.0;
    unsigned char tok[8];
    unsigned have = 0;
    for (;;) {
        switch (w->kind) {
        case 0:
            if ((n & 1) == 0) {
                while (sem_wait(&w->sem) != 0)
                    if (errno != EINTR) corrupt("sem_wait-failed", w->idx, n);
            } else {
                pthread_mutex_lock(&w->cmu);
                while (w->tickets == 0) pthread_cond_wait(&w->cond, &w->cmu);
                w->tickets--;
                pthread_mutex_unlock(&w->cmu);
            }
            step(w, &n, &fp);
            break;
        case 1: {
            struct timespec ts = {0, (long)(1 + n % 5) * 1000000L}, rem;
            while (nanosleep(&ts, &rem) != 0) {
                if (errno != EINTR) corrupt("nanosleep-failed", w->idx, n);
                ts = rem;
            }
            step(w, &n, &fp);
            break;
        }
        case 2: {
            while (have < 8) {
                size_t want = 8 - have;
                if (have == 0 && n % 3 == 0) want = 5; /* leave half tokens around */
                ssize_t r = read(w->pipe_rd, tok + have, want);
                if (r < 0) {
                    if (errno == EINTR || errno == EAGAIN) continue;
                    corrupt("pipe-read-failed", w->idx, n);
                }
                if (r == 0) corrupt("pipe-eof", w->idx, n);
                have += (unsigned)r;
            }
            uint64_t t;
            memcpy(&t, tok, 8);
            if (t != val(w->idx, R_PIPE, n)) corrupt("pipe-token", w->idx, n);
            have = 0;
            step(w, &n, &fp);
            break;
        }
        case 3: {
            struct pollfd pfd = {tfd, POLLIN, 0};
            int pr = poll(&pfd, 1, -1);
            if (pr < 0) {
                if (errno == EINTR) continue;
                corrupt("poll-failed", w->idx, n);
            }
            uint64_t exp = 0;
            ssize_t r = read(tfd, &exp, 8);
            if (r < 0) {
                if (errno == EINTR || errno == EAGAIN) continue;
                corrupt("timerfd-read-failed", w->idx, n);
            }
            if (r != 8 || exp == 0) corrupt("timerfd-read-short", w->idx, n);
            if (exp > 4) exp = 4;
            while (exp--) step(w, &n, &fp);
            break;
        }
        }
    }
    return NULL;
}

/* ---- digest -------------------------------------------------------------- */
#define FNV_OFF 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL
static inline uint64_t fnv_word(uint64_t h, uint64_t w) {
    for (int b = 0; b < 8; b++) {
        h ^= (w >> (8 * b)) & 0xff;
        h *= FNV_PRIME;
    }
    return h;
}
/* caller holds every worker's mutex */
static uint64_t digest_memory(void) {
    uint64_t h = FNV_OFF;
    for (unsigned i = 0; i < g_nthreads; i++)
        for (unsigned r = 0; r < NREG; r++)
            for (unsigned j = 0; j < REGIONS[r].len; j++) h = fnv_word(h, *slot_ptr(&g_w[i], r, j));
    for (unsigned j = 0; j < L_SIG; j++) h = fnv_word(h, g_sig_slots[j]);
    return fnv_word(h, g_sig_handled);
}
static uint64_t digest_expected(const uint64_t *steps, unsigned k) {
    uint64_t h = FNV_OFF;
    for (unsigned i = 0; i < k; i++)
        for (unsigned r = 0; r < NREG; r++)
            for (unsigned j = 0; j < REGIONS[r].len; j++) h = fnv_word(h, expected_slot(i, r, j, steps[i]));
    uint64_t sig = steps[0] / SIG_PERIOD;
    for (unsigned j = 0; j < L_SIG; j++) h = fnv_word(h, closed(0, R_SIG, L_SIG, 0, j, sig));
    return fnv_word(h, sig);
}

/* ---- network thread ------------------------------------------------------ */
static int g_sock;
static long long g_exit_after_ms = -1;
static int g_paused;

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void lock_all(void) {
    for (unsigned i = 0; i < g_nthreads; i++) pthread_mutex_lock(&g_w[i].mu);
}
static void unlock_all(void) {
    for (unsigned i = g_nthreads; i-- > 0;) pthread_mutex_unlock(&g_w[i].mu);
}

static uint64_t g_ticks;
static void tick(uint64_t expirations) {
    g_ticks++;
    if (expirations > 4) expirations = 4;
    for (unsigned i = 0; i < g_nthreads; i++) {
        struct worker *w = &g_w[i];
        if (w->kind == 0) {
            /* alternate: one tick feeds the semaphore, the next the condvar
               (~1000 steps/s); both are capped so a stall does not pile up */
            if (g_ticks & 1) {
                pthread_mutex_lock(&w->cmu);
                if (w->tickets < 8) {
                    w->tickets += (unsigned)expirations;
                    pthread_cond_signal(&w->cond);
                }
                pthread_mutex_unlock(&w->cmu);
            } else {
                int v = 0;
                sem_getvalue(&w->sem, &v);
                for (uint64_t e = 0; e < expirations && v < 8; e++, v++) sem_post(&w->sem);
            }
        } else if (w->kind == 2) {
            uint64_t done = atomic_load(&w->steps);
            uint64_t buf[4];
            unsigned cnt = 0;
            while (cnt < expirations && w->tokens_written + cnt - done < 64) {
                buf[cnt] = val(i, R_PIPE, w->tokens_written + cnt);
                cnt++;
            }
            if (cnt) {
                /* <= PIPE_BUF on an O_NONBLOCK pipe: all or nothing */
                ssize_t r = write(w->pipe_wr, buf, cnt * 8);
                if (r == (ssize_t)(cnt * 8)) w->tokens_written += cnt;
                else if (r >= 0) corrupt("pipe-short-write", i, w->tokens_written);
                else if (errno != EAGAIN && errno != EINTR) corrupt("pipe-write-failed", i, w->tokens_written);
            }
        }
    }
}

static size_t reply_fds(char *out, size_t cap) {
    size_t n = 0;
    int cnt = 0;
    char body[3000];
    size_t bn = 0;
    body[0] = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            char path[300], tgt[256];
            snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
            ssize_t l = readlink(path, tgt, sizeof tgt - 1);
            if (l < 0) continue;
            tgt[l] = 0;
            cnt++;
            if (bn + strlen(e->d_name) + (size_t)l + 3 < sizeof body)
                bn += (size_t)snprintf(body + bn, sizeof body - bn, " %s=%s", e->d_name, tgt);
        }
        closedir(d);
    }
    n = (size_t)snprintf(out, cap, "fds n=%d%s\n", cnt, body);
    return n < cap ? n : cap - 1;
}

static int handle_request(char *req, ssize_t len, char *out, size_t cap, size_t *outlen) {
    while (len > 0 && (req[len - 1] == '\n' || req[len - 1] == '\r' || req[len - 1] == ' ' ||
                       req[len - 1] == '\t' || req[len - 1] == 0))
        len--;
    req[len] = 0;
    int quit = 0;
    size_t n = 0;
    if (!strcmp(req, "ping")) {
        n = (size_t)snprintf(out, cap, "pong\n");
    } else if (!strcmp(req, "digest")) {
        uint64_t steps[MAXT];
        if (!g_paused) lock_all();
        for (unsigned i = 0; i < g_nthreads; i++) steps[i] = atomic_load(&g_w[i].steps);
        uint64_t sig = g_sig_handled;
        uint64_t dg = digest_memory();
        if (!g_paused) unlock_all();
        uint64_t ex = digest_expected(steps, g_nthreads);
        n = (size_t)snprintf(out, cap, "steps=");
        for (unsigned i = 0; i < g_nthreads; i++)
            n += (size_t)snprintf(out + n, cap - n, "%s%" PRIu64, i ? "," : "", steps[i]);
        n += (size_t)snprintf(out + n, cap - n, " sig=%" PRIu64 " digest=%016" PRIx64 " expected=%016" PRIx64 "\n",
                              sig, dg, ex);
    } else if (!strcmp(req, "pause")) {
        if (!g_paused) { lock_all(); g_paused = 1; }
        n = (size_t)snprintf(out, cap, "paused\n");
    } else if (!strcmp(req, "resume")) {
        if (g_paused) { unlock_all(); g_paused = 0; }
        n = (size_t)snprintf(out, cap, "resumed\n");
    } else if (!strcmp(req, "fds")) {
        n = reply_fds(out, cap);
    } else if (!strcmp(req, "exit")) {
        n = (size_t)snprintf(out, cap, "bye\n");
        quit = 1;
    } else {
        n = (size_t)snprintf(out, cap, "error unknown-command\n");
    }
    *outlen = n < cap ? n : cap - 1;
    return quit;
}

static void *net_main(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "sm-net");
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) die("epoll_create1");
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (tfd < 0) die("timerfd_create");
    struct itimerspec its = {{0, 1000000}, {0, 1000000}};
    if (timerfd_settime(tfd, 0, &its, NULL) != 0) die("timerfd_settime");
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = g_sock};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, g_sock, &ev) != 0) die("epoll_ctl");
    ev.data.fd = tfd;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev) != 0) die("epoll_ctl");
    uint64_t start = now_ms();
    static char req[2048], out[8192];
    for (;;) {
        struct epoll_event evs[4];
        int ne = epoll_wait(ep, evs, 4, -1);
        if (ne < 0) {
            if (errno == EINTR) continue;
            die("epoll_wait");
        }
        for (int e = 0; e < ne; e++) {
            if (evs[e].data.fd == tfd) {
                uint64_t exp;
                ssize_t r = read(tfd, &exp, 8);
                if (r == 8) tick(exp);
                if (g_exit_after_ms >= 0 && now_ms() - start >= (uint64_t)g_exit_after_ms) return NULL;
            } else {
                for (;;) {
                    struct sockaddr_storage from;
                    socklen_t fl = sizeof from;
                    ssize_t r = recvfrom(g_sock, req, sizeof req - 1, MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
                    if (r < 0) {
                        if (errno == EINTR) continue;
                        break; /* EAGAIN */
                    }
                    size_t ol = 0;
                    int quit = handle_request(req, r, out, sizeof out, &ol);
                    while (sendto(g_sock, out, ol, 0, (struct sockaddr *)&from, fl) < 0 && errno == EINTR) {}
                    if (quit) return NULL;
                }
            }
        }
    }
}

/* ---- main ---------------------------------------------------------------- */
static void usage(void) {
    fprintf(stderr, "usage: statemachine [--port N] [--threads K] [--exit-after-ms MS]\n");
    exit(2);
}

int main(int argc, char **argv) {
    int port = 7000;
    for (int a = 1; a < argc; a++) {
        if (a + 1 >= argc) usage();
        char *end;
        long long v = strtoll(argv[a + 1], &end, 10);
        if (*end || v < 0) usage();
        if (!strcmp(argv[a], "--port") && v <= 65535) port = (int)v;
        else if (!strcmp(argv[a], "--threads") && v >= 1 && v <= MAXT) g_nthreads = (unsigned)v;
        else if (!strcmp(argv[a], "--exit-after-ms")) g_exit_after_ms = v;
        else usage();
        a++;
    }

    /* signals: SIGUSR1 handler on the altstack; nobody else should get it */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_usr1;
    sa.sa_flags = SA_ONSTACK | SA_RESTART | SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) != 0) die("sigaction");
    signal(SIGPIPE, SIG_IGN);
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* inherited by net thread; workers unblock */

    g_sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (g_sock < 0) die("socket");
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(g_sock, (struct sockaddr *)&sin, sizeof sin) != 0) die("bind");
    socklen_t sl = sizeof sin;
    getsockname(g_sock, (struct sockaddr *)&sin, &sl);

    g_big = calloc(1, BIG_SIZE); /* mmap-backed, stays sparse */
    if (!g_big) die("calloc big");
    g_big_stride = ((BIG_SIZE - PAGE) / (g_nthreads * L_BIG)) & ~(size_t)7;
    g_big_mid = (g_big_stride / 2) & ~(size_t)7; /* >= 16: never a slot or slot+8 */
    void *ro = mmap(NULL, (size_t)g_nthreads * RO_PAGES * PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ro == MAP_FAILED) die("mmap ro");
    g_ro = ro;

    pthread_barrier_init(&g_start, NULL, g_nthreads + 1);
    for (unsigned i = 0; i < g_nthreads; i++) {
        struct worker *w = &g_w[i];
        w->idx = i;
        w->kind = i % 4;
        pthread_mutex_init(&w->mu, NULL);
        w->heapm = calloc(L_HEAPM, sizeof(uint64_t));
        if (!w->heapm) die("calloc");
        w->ro_base = g_ro + (size_t)i * RO_PAGES * PAGE;
        sem_init(&w->sem, 0, 0);
        pthread_mutex_init(&w->cmu, NULL);
        pthread_cond_init(&w->cond, NULL);
        w->pipe_rd = w->pipe_wr = -1;
        if (w->kind == 2) {
            int p[2];
            if (pipe2(p, O_CLOEXEC) != 0) die("pipe2");
            w->pipe_rd = p[0];
            w->pipe_wr = p[1];
            fcntl(p[1], F_SETFL, O_NONBLOCK);
        }
    }
    for (unsigned i = 0; i < g_nthreads; i++) {
        /* workers must be able to take SIGUSR1 */
        int e = pthread_create(&g_w[i].th, NULL, worker_main, &g_w[i]);
        if (e) { errno = e; die("pthread_create"); }
    }
    pthread_barrier_wait(&g_start);

    pthread_t net;
    int e = pthread_create(&net, NULL, net_main, NULL);
    if (e) { errno = e; die("pthread_create"); }
    printf("READY port=%u threads=%u pid=%d\n", ntohs(sin.sin_port), g_nthreads, (int)getpid());
    fflush(stdout);
    pthread_join(net, NULL);
    exit(0);
}
