/*
 * churn.c — address-space churn generator for testing dirty tracking.
 *
 * WHAT IT IS FOR
 *   The checkpointer records incremental checkpoints that carry only the
 *   pages written since the previous epoch plus layout changes
 *   (userfaultfd write-protect + PAGEMAP_SCAN).  This program makes every
 *   kind of memory change it can, continuously, at random, from several
 *   threads at once, so that a test can take one full checkpoint and many
 *   incremental ones, restore the chain elsewhere and compare the restored
 *   memory with the live (stopped) process byte for byte.  It does NOT check
 *   itself; it only has to keep running without crashing.
 *
 * COMMAND LINE
 *   churn [--threads K] [--seed S] [--rate N] [--exit-after-ms MS]
 *         [--file PATH] [--stats]
 *     --threads K      worker threads (default 3, 1..16)
 *     --seed S         PRNG seed (default 1); thread i uses seed+i
 *     --rate N         about N operations per millisecond per thread
 *                      (default 20; 0 = workers only sleep)
 *     --exit-after-ms  _exit(0) by itself after MS ms (default: run forever)
 *     --file PATH      file for the file-backed mappings
 *                      (default /tmp/churn-<pid>.dat, 1 MiB; created at
 *                      startup, never modified afterwards and never
 *                      deleted; it is opened O_RDONLY only around each
 *                      mmap, so no file descriptor stays open)
 *     --stats          print per-second operation counts to stderr
 *   Prints nothing else except warnings/errors (exit status 2 on usage or
 *   setup errors).
 *
 * OPERATIONS (each worker thread, chosen at random per operation, weights
 * per 1000 in the table `op_weights`; the rest of the time it sleeps)
 *   write    random bytes / 64-bit words / a memset span / a whole page of
 *            PRNG output into a random page of one of its regions.  Half of
 *            the writes go to the thread's "hot" region 0 (16 pages at
 *            start, skewed towards its first pages), so some pages are
 *            written every epoch and most others only rarely.
 *   read     read a few words of a random readable page (faults in the zero
 *            page / file pages without writing).
 *   mmap     new anonymous private region of 1..64 pages (1/8 of the time a
 *            MAP_PRIVATE mapping of the file instead), some pages filled; or
 *            (1/8) MAP_FIXED a new anonymous mapping over a sub-range of one
 *            of its own anonymous regions (that part becomes zero) and
 *            write some of it.
 *   munmap   unmap a whole region, or a sub-range of one (prefix, suffix, or
 *            a hole in the middle, which splits the region in two).
 *   mremap   grow in place (flags 0; if that fails, sometimes MREMAP_MAYMOVE)
 *            and write to the new part; shrink; move (MREMAP_MAYMOVE |
 *            MREMAP_FIXED onto a PROT_NONE placeholder the thread just
 *            mapped, optionally changing the size); or MREMAP_DONTUNMAP (the
 *            pages move to a new address, the old range stays mapped and
 *            empty; both are then used).
 *   madvise  MADV_DONTNEED a sub-range (anonymous pages become zero, private
 *            file pages revert to the file contents); half of the time part
 *            of it is rewritten at once.
 *   mprotect restrict a sub-range to PROT_READ (2/3) or PROT_NONE (1/3),
 *            usually after writing data into it; a later mprotect operation
 *            on the same region restores PROT_READ|PROT_WRITE and writes
 *            into the range again.  At most one restricted range per region
 *            (bounds the number of VMAs).
 *   replace  munmap a region and immediately mmap a new one at the same
 *            address with MAP_FIXED_NOREPLACE (see SAFETY), or MAP_FIXED a
 *            new mapping directly over the whole region; the new mapping is
 *            anonymous or (1/3) a private file mapping at a random offset, so
 *            the kind of mapping at an address changes; then new contents.
 *            This is also how file mappings get "remapped".
 *   malloc   malloc / free / realloc / write of 1 B .. 128 KiB blocks (8
 *            slots per thread); with the malloc settings below these are
 *            mmap'd chunks and realloc uses mremap.
 *   brk      (thread 0 only) sbrk grow by 1..16 pages and write them, sbrk
 *            shrink, write into the brk area, MADV_DONTNEED part of it.
 *
 * BRK SAFETY DESIGN
 *   The program break is process-global and glibc's sbrk() is not thread
 *   safe, and glibc malloc's main arena also uses sbrk (grow, and trim on
 *   free).  If malloc grew the break while we had grown it, our later
 *   shrink would cut into malloc's heap.  So at startup, before any thread
 *   exists, we call mallopt(M_MMAP_THRESHOLD, 0) and
 *   mallopt(M_TRIM_THRESHOLD, INT_MAX): from then on every allocation that
 *   malloc cannot serve from memory it already owns is a separate mmap'd
 *   chunk (never a brk extension) and the main arena is never trimmed, so
 *   glibc never calls sbrk again.  Thread 0 then is the only user of the
 *   break: it records base = sbrk(0) (page-aligned) when the workers start,
 *   only ever uses [base, base + 256 pages), never shrinks below base, and
 *   holds g_brk_mutex around every sbrk call.  Before each brk operation it
 *   checks that sbrk(0) is still exactly where it left it; if anything else
 *   moved the break it prints a warning and stops doing brk operations
 *   (never shrinks) instead of corrupting the heap.  All other bookkeeping
 *   is in static arrays; the program never mallocs for itself.  If mallopt
 *   fails, brk operations are skipped (warning) -- except in an
 *   AddressSanitizer build, whose allocator ignores mallopt but never uses
 *   brk at all.
 *
 * OTHER SAFETY RULES (all threads share one address space)
 *   * MAP_FIXED is only ever applied to address ranges the calling thread
 *     currently owns (its own regions, or a placeholder it just mapped),
 *     so it can never clobber another thread's or libc's memory.
 *   * "munmap then mmap at the same address" uses MAP_FIXED_NOREPLACE: in
 *     the window between the two calls another thread may have mapped
 *     something there; then the mmap fails with EEXIST and we take any
 *     address instead.
 *   * If a MAP_FIXED/mprotect call fails (ENOMEM), the range may be left
 *     partially changed: the region is unmapped and forgotten (MAP_FIXED)
 *     or kept marked as restricted (mprotect), never written blindly.
 *   * Bounded: <= 16 threads, <= 64 regions per thread, <= 64 pages per
 *     region, <= 48 MiB of regions in total (one global page budget, which
 *     also covers placeholders and MREMAP_DONTUNMAP copies), <= 1 MiB of brk
 *     area, < 8 x 128 KiB of malloc blocks per thread (so < 52 MiB at the
 *     default 3 threads, < 53 MiB at 4), plus thread stacks.  At most one
 *     restricted range per region, so at most a few thousand VMAs (about
 *     400 observed with 4 threads; vm.max_map_count is 65530).
 *   * Sleeping uses clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) and is
 *     retried on EINTR; after being stopped (SIGSTOP, checkpoint freeze) a
 *     thread catches up at most 5 ms worth of operations and then resyncs,
 *     so freezes do not cause bursts.  No other call blocks.
 *   * MADV_FREE is deliberately not used: the kernel may zero such pages
 *     lazily at any time without the process writing them, which would
 *     make a byte-for-byte comparison nondeterministic.
 *
 * Build: gcc -O2 -g -pthread -Wall -Wextra -o churn churn.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif

#define PG ((size_t)4096)
#define MAX_THREADS 16
#define MAX_REGIONS 64           /* per thread */
#define MAX_REGION_PAGES 64
#define HOT_PAGES 16
#define INIT_REGIONS 8
#define PAGE_BUDGET (48L * 1024 * 1024 / 4096) /* all threads' regions */
#define BRK_MAX_PAGES 256
#define MALLOC_SLOTS 8
#define MALLOC_MAX (128 * 1024)
#define FILE_PAGES 256
#define CATCHUP_MS 5

enum { K_ANON, K_FILE };

struct region {
    char *addr;
    uint32_t np;      /* pages */
    uint32_t foff;    /* file offset in pages (K_FILE only) */
    uint32_t plo, phi; /* restricted range [plo, phi), empty if equal */
    int pprot;        /* PROT_READ or PROT_NONE for the restricted range */
    int kind;
};

enum {
    OP_WRITE, OP_READ, OP_MMAP, OP_MUNMAP, OP_MREMAP, OP_MADVISE,
    OP_MPROTECT, OP_REPLACE, OP_MALLOC, OP_BRK, OP_COUNT
};
static const char *const op_names[OP_COUNT] = {
    "write", "read", "mmap", "munmap", "mremap", "madvise",
    "mprotect", "replace", "malloc", "brk"
};
/* Weights per 1000 operations (OP_BRK becomes a write on threads != 0). */
static const int op_weights[OP_COUNT] = {
    800, 40, 20, 20, 20, 20, 20, 15, 20, 25
};

struct thr {
    int id;
    uint64_t rng;
    int nr;
    struct region r[MAX_REGIONS];
    void *m[MALLOC_SLOTS];
    size_t msz[MALLOC_SLOTS];
    _Atomic uint64_t cnt[OP_COUNT];
    pthread_t tid;
} __attribute__((aligned(64)));

static struct thr g_thr[MAX_THREADS];
static int g_nthreads = 3;
static uint64_t g_seed = 1;
static long g_rate = 20;
static long g_exit_after_ms = -1;
static int g_stats;
static char g_path[512];
static int g_have_file;
/* CHURN_FILE_BIAS set: most new and replacing mappings are private file mappings (7/8 of the
 * new ones, 2/3 of the replacing ones, against 1/8 and 1/3), to stress copied-on-write file
 * pages, their zapping and their remapping. */
static int g_file_bias;
static _Atomic long g_pages;     /* pages held in regions, all threads */
static _Atomic int g_go;
static volatile uint64_t g_sink;

static pthread_mutex_t g_brk_mutex = PTHREAD_MUTEX_INITIALIZER;
static char *g_brk_base;
static uint32_t g_brk_np;
static int g_brk_ok;
static int g_brk_allowed;         /* malloc was told to keep off the break */

/* ------------------------------------------------------------------ utils */

static void say(const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof buf - 1)
        n = sizeof buf - 1;
    const char *p = buf;
    while (n > 0) {
        ssize_t w = write(2, p, (size_t)n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        p += w;
        n -= (int)w;
    }
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static inline uint64_t rnd(struct thr *t)
{
    uint64_t x = t->rng; /* xorshift64* */
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    t->rng = x;
    return x * 0x2545f4914f6cdd1dULL;
}

/* uniform in [0, n), n >= 1 */
static inline uint32_t below(struct thr *t, uint32_t n)
{
    return (uint32_t)(((rnd(t) >> 32) * (uint64_t)n) >> 32);
}

static inline void count(struct thr *t, int op)
{
    uint64_t v = atomic_load_explicit(&t->cnt[op], memory_order_relaxed);
    atomic_store_explicit(&t->cnt[op], v + 1, memory_order_relaxed);
}

static int budget_take(long n)
{
    long cur = atomic_load(&g_pages);
    do {
        if (cur + n > PAGE_BUDGET)
            return 0;
    } while (!atomic_compare_exchange_weak(&g_pages, &cur, cur + n));
    return 1;
}

static void budget_put(long n)
{
    atomic_fetch_sub(&g_pages, n);
}

static inline int in_restricted(const struct region *g, uint32_t p)
{
    return p >= g->plo && p < g->phi;
}

static inline int page_writable(const struct region *g, uint32_t p)
{
    return !in_restricted(g, p);
}

static inline int page_readable(const struct region *g, uint32_t p)
{
    return !in_restricted(g, p) || g->pprot != PROT_NONE;
}

/* One random write into the page at pg. */
static void fill_page(struct thr *t, char *pg)
{
    uint64_t *w = (uint64_t *)(void *)pg;
    switch (below(t, 8)) {
    case 0: case 1: case 2:
        pg[below(t, PG)] = (char)rnd(t);
        break;
    case 3: case 4: case 5: {
        uint32_t n = 1 + below(t, 8);
        for (uint32_t i = 0; i < n; i++)
            w[below(t, PG / 8)] = rnd(t);
        break;
    }
    case 6: {
        uint32_t off = below(t, PG);
        uint32_t len = 1 + below(t, 1024);
        if (off + len > PG)
            len = (uint32_t)PG - off;
        memset(pg + off, (int)(rnd(t) & 0xff), len);
        break;
    }
    default: {
        uint64_t x = rnd(t) | 1;
        for (size_t i = 0; i < PG / 8; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            w[i] = x;
        }
        break;
    }
    }
}

/* Write each writable page of [lo, hi) of g with probability num/8. */
static void write_pages(struct thr *t, const struct region *g, uint32_t lo,
                        uint32_t hi, uint32_t num)
{
    for (uint32_t p = lo; p < hi && p < g->np; p++)
        if (page_writable(g, p) && below(t, 8) < num)
            fill_page(t, g->addr + (size_t)p * PG);
}

/* Random sub-range [*a, *b) of n pages, biased towards short ranges. */
static void subrange(struct thr *t, uint32_t n, uint32_t *a, uint32_t *b)
{
    uint32_t len = 1 + below(t, below(t, 2) ? (n < 4 ? n : 4) : n);
    *a = below(t, n - len + 1);
    *b = *a + len;
}

static void *map_file(void *addr, uint32_t np, uint32_t foff, int extra)
{
    int fd = open(g_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return MAP_FAILED;
    void *p = mmap(addr, (size_t)np * PG, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | extra, fd, (off_t)foff * (off_t)PG);
    int e = errno;
    close(fd);
    errno = e;
    return p;
}

static void *map_anon(void *addr, uint32_t np, int prot, int extra)
{
    return mmap(addr, (size_t)np * PG, prot,
                MAP_PRIVATE | MAP_ANONYMOUS | extra, -1, 0);
}

static void remove_region(struct thr *t, int ri)
{
    t->r[ri] = t->r[t->nr - 1];
    t->nr--;
}

/* Give up on a region whose state is unknown: unmap all of it (it is ours)
 * and forget it.  If it was region 0, the last region becomes the hot one. */
static void drop_region(struct thr *t, int ri)
{
    struct region *g = &t->r[ri];
    munmap(g->addr, (size_t)g->np * PG);
    budget_put(g->np);
    remove_region(t, ri);
}

static int add_region(struct thr *t, void *addr, uint32_t np, int kind,
                      uint32_t foff)
{
    if (t->nr >= MAX_REGIONS)
        return -1;
    struct region *g = &t->r[t->nr];
    memset(g, 0, sizeof *g);
    g->addr = addr;
    g->np = np;
    g->kind = kind;
    g->foff = foff;
    return t->nr++;
}

/* -------------------------------------------------------------- operations */

static void op_write(struct thr *t)
{
    if (t->nr == 0)
        return;
    int ri = below(t, 2) ? 0 : (int)below(t, (uint32_t)t->nr);
    struct region *g = &t->r[ri];
    uint32_t p = ri == 0 ? below(t, 1 + below(t, g->np)) : below(t, g->np);
    if (page_writable(g, p))
        fill_page(t, g->addr + (size_t)p * PG);
}

static void op_read(struct thr *t)
{
    if (t->nr == 0)
        return;
    struct region *g = &t->r[below(t, (uint32_t)t->nr)];
    uint32_t p = below(t, g->np);
    if (!page_readable(g, p))
        return;
    const volatile uint64_t *w =
        (const volatile uint64_t *)(void *)(g->addr + (size_t)p * PG);
    uint64_t s = 0;
    for (int i = 0; i < 8; i++)
        s += w[below(t, PG / 8)];
    g_sink += s;
}

static void op_mmap(struct thr *t)
{
    uint32_t c = below(t, 8);
    if (c == 0 && t->nr > 0) {
        /* MAP_FIXED anonymous over a sub-range of one of our anon regions */
        int ri = (int)below(t, (uint32_t)t->nr);
        struct region *g = &t->r[ri];
        if (g->kind != K_ANON || g->plo != g->phi)
            return;
        uint32_t a, b;
        subrange(t, g->np, &a, &b);
        void *want = g->addr + (size_t)a * PG;
        void *p = map_anon(want, b - a, PROT_READ | PROT_WRITE, MAP_FIXED);
        if (p != want) {
            say("churn: MAP_FIXED over own range failed: %s\n",
                strerror(errno));
            drop_region(t, ri);
            return;
        }
        write_pages(t, g, a, b, 4);
        return;
    }
    if (t->nr >= MAX_REGIONS)
        return;
    uint32_t np = 1 + below(t, below(t, 2) ? 8 : MAX_REGION_PAGES);
    if (!budget_take(np))
        return;
    int kind = K_ANON;
    uint32_t foff = 0;
    void *p;
    if ((c == 1 || (g_file_bias && c > 1)) && g_have_file) {
        kind = K_FILE;
        foff = below(t, FILE_PAGES - np + 1);
        p = map_file(NULL, np, foff, 0);
    } else {
        p = map_anon(NULL, np, PROT_READ | PROT_WRITE, 0);
    }
    if (p == MAP_FAILED) {
        budget_put(np);
        return;
    }
    int ri = add_region(t, p, np, kind, foff);
    write_pages(t, &t->r[ri], 0, np, 4);
}

static void op_munmap(struct thr *t)
{
    if (t->nr == 0)
        return;
    int ri = (int)below(t, (uint32_t)t->nr);
    struct region *g = &t->r[ri];
    int whole = ri != 0 && (below(t, 2) || g->np < 2);
    if (whole) {
        if (munmap(g->addr, (size_t)g->np * PG) == 0) {
            budget_put(g->np);
            remove_region(t, ri);
        }
        return;
    }
    if (g->np < 2 || g->plo != g->phi)
        return;
    uint32_t a, b;
    subrange(t, g->np, &a, &b);
    if (a == 0 && b == g->np)
        b--;
    if (a > 0 && b < g->np && t->nr >= MAX_REGIONS)
        b = g->np; /* no slot for a second piece: cut the tail instead */
    if (munmap(g->addr + (size_t)a * PG, (size_t)(b - a) * PG) != 0)
        return;
    budget_put(b - a);
    if (a == 0) {
        g->addr += (size_t)b * PG;
        g->np -= b;
        g->foff += b;
    } else if (b == g->np) {
        g->np = a;
    } else {
        char *tail = g->addr + (size_t)b * PG;
        uint32_t tnp = g->np - b, tfoff = g->foff + b;
        int kind = g->kind;
        g->np = a;
        add_region(t, tail, tnp, kind, tfoff); /* slot checked above */
    }
}

static uint32_t max_pages_for(const struct region *g)
{
    if (g->kind == K_FILE)
        return FILE_PAGES - g->foff < MAX_REGION_PAGES
                   ? FILE_PAGES - g->foff : MAX_REGION_PAGES;
    return MAX_REGION_PAGES;
}

static void op_mremap(struct thr *t)
{
    if (t->nr == 0)
        return;
    int ri = (int)below(t, (uint32_t)t->nr);
    struct region *g = &t->r[ri];
    if (g->plo != g->phi)
        return;
    uint32_t np = g->np, maxp = max_pages_for(g);
    uint32_t which = below(t, 4);
    /* CHURN_MREMAP_ONLY="N": just case N; CHURN_MREMAP_SKIP="N": never case N (for narrowing
     * down tracker problems; case 2 can move a region that spans several mappings, which
     * Linux >= 6.17 refuses half-way for userfaultfd-armed mappings). */
    const char *only = getenv("CHURN_MREMAP_ONLY");
    const char *skip = getenv("CHURN_MREMAP_SKIP");
    if ((only && which != (uint32_t)(*only - '0')) || (skip && which == (uint32_t)(*skip - '0')))
        return;
    switch (which) {
    case 0: { /* grow in place, maybe move */
        if (np >= maxp)
            return;
        uint32_t np2 = np + 1 + below(t, maxp - np < 16 ? maxp - np : 16);
        if (!budget_take(np2 - np))
            return;
        void *p = mremap(g->addr, (size_t)np * PG, (size_t)np2 * PG, 0);
        if (p == MAP_FAILED && below(t, 2))
            p = mremap(g->addr, (size_t)np * PG, (size_t)np2 * PG,
                       MREMAP_MAYMOVE);
        if (p == MAP_FAILED) {
            budget_put(np2 - np);
            return;
        }
        g->addr = p;
        g->np = np2;
        write_pages(t, g, np, np2, 6);
        break;
    }
    case 1: { /* shrink */
        if (np < 2)
            return;
        uint32_t np2 = 1 + below(t, np - 1);
        void *p = mremap(g->addr, (size_t)np * PG, (size_t)np2 * PG, 0);
        if (p == MAP_FAILED)
            return;
        g->addr = p;
        g->np = np2;
        budget_put(np - np2);
        break;
    }
    case 2: { /* move onto a placeholder we own, maybe resizing */
        uint32_t np2 = below(t, 2) ? np : 1 + below(t, maxp);
        if (!budget_take(np2))
            return;
        void *ph = map_anon(NULL, np2, PROT_NONE, MAP_NORESERVE);
        if (ph == MAP_FAILED) {
            budget_put(np2);
            return;
        }
        void *p = mremap(g->addr, (size_t)np * PG, (size_t)np2 * PG,
                         MREMAP_MAYMOVE | MREMAP_FIXED, ph);
        if (p == MAP_FAILED) {
            munmap(ph, (size_t)np2 * PG);
            budget_put(np2);
            return;
        }
        budget_put(np);
        g->addr = p;
        g->np = np2;
        if (np2 > np)
            write_pages(t, g, np, np2, 6);
        write_pages(t, g, 0, np2 < np ? np2 : np, 1);
        break;
    }
    default: { /* MREMAP_DONTUNMAP: pages move, old range stays, empty */
        if (t->nr >= MAX_REGIONS || !budget_take(np))
            return;
        void *p = mremap(g->addr, (size_t)np * PG, (size_t)np * PG,
                         MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL);
        /* (the new_address argument must be given: the kernel checks its
         * alignment for DONTUNMAP even without MREMAP_FIXED) */
        if (p == MAP_FAILED) {
            budget_put(np);
            return;
        }
        int ni = add_region(t, p, np, g->kind, g->foff);
        write_pages(t, &t->r[ni], 0, np, 2);
        write_pages(t, &t->r[ri], 0, np, 2);
        break;
    }
    }
}

static void op_madvise(struct thr *t)
{
    if (t->nr == 0)
        return;
    struct region *g = &t->r[below(t, (uint32_t)t->nr)];
    uint32_t a, b;
    subrange(t, g->np, &a, &b);
    if (madvise(g->addr + (size_t)a * PG, (size_t)(b - a) * PG,
                MADV_DONTNEED) != 0)
        return;
    if (below(t, 2))
        write_pages(t, g, a, b, 4);
}

static void op_mprotect(struct thr *t)
{
    if (t->nr == 0)
        return;
    struct region *g = &t->r[below(t, (uint32_t)t->nr)];
    if (g->plo != g->phi) {
        /* restore; on failure keep it marked restricted (never written) */
        if (mprotect(g->addr + (size_t)g->plo * PG,
                     (size_t)(g->phi - g->plo) * PG,
                     PROT_READ | PROT_WRITE) != 0)
            return;
        uint32_t lo = g->plo, hi = g->phi;
        g->plo = g->phi = 0;
        write_pages(t, g, lo, hi, 4);
        fill_page(t, g->addr + (size_t)(lo + below(t, hi - lo)) * PG);
        return;
    }
    uint32_t a, b;
    subrange(t, g->np, &a, &b);
    if (below(t, 4))
        write_pages(t, g, a, b, 6);
    int prot = below(t, 3) == 0 ? PROT_NONE : PROT_READ;
    /* mark first: a failed mprotect may have changed part of the range */
    g->plo = a;
    g->phi = b;
    g->pprot = PROT_NONE; /* conservative until it succeeded */
    if (mprotect(g->addr + (size_t)a * PG, (size_t)(b - a) * PG, prot) == 0)
        g->pprot = prot;
}

static void op_replace(struct thr *t)
{
    if (t->nr == 0)
        return;
    int ri = (int)below(t, (uint32_t)t->nr);
    struct region *g = &t->r[ri];
    uint32_t np = g->np;
    int kind = (g_have_file && np <= FILE_PAGES &&
                (g_file_bias ? below(t, 3) != 0 : below(t, 3) == 0))
                   ? K_FILE : K_ANON;
    uint32_t foff = kind == K_FILE ? below(t, FILE_PAGES - np + 1) : 0;
    void *addr = g->addr, *p;
    if (below(t, 2)) {
        /* munmap, then map again at the same address if still free */
        if (munmap(addr, (size_t)np * PG) != 0)
            return;
        p = kind == K_FILE ? map_file(addr, np, foff, MAP_FIXED_NOREPLACE)
                           : map_anon(addr, np, PROT_READ | PROT_WRITE,
                                      MAP_FIXED_NOREPLACE);
        if (p == MAP_FAILED) /* EEXIST: someone took it; go anywhere */
            p = kind == K_FILE ? map_file(NULL, np, foff, 0)
                               : map_anon(NULL, np, PROT_READ | PROT_WRITE, 0);
        if (p == MAP_FAILED) { /* the old range is already gone */
            budget_put(np);
            remove_region(t, ri);
            return;
        }
        /* Before 4.17 NOREPLACE was only a hint: p may differ; fine. */
    } else {
        p = kind == K_FILE ? map_file(addr, np, foff, MAP_FIXED)
                           : map_anon(addr, np, PROT_READ | PROT_WRITE,
                                      MAP_FIXED);
        if (p != addr) {
            say("churn: MAP_FIXED replace failed: %s\n", strerror(errno));
            if (p != MAP_FAILED)
                munmap(p, (size_t)np * PG);
            drop_region(t, ri);
            return;
        }
    }
    g->addr = p;
    g->kind = kind;
    g->foff = foff;
    g->plo = g->phi = 0;
    write_pages(t, g, 0, np, 4);
}

static void op_malloc(struct thr *t)
{
    uint32_t s = below(t, MALLOC_SLOTS);
    if (t->m[s] == NULL) {
        size_t sz = (size_t)1 << below(t, 17);
        sz += below(t, (uint32_t)sz);
        char *p = malloc(sz);
        if (p == NULL)
            return;
        memset(p, (int)(rnd(t) & 0xff), sz);
        t->m[s] = p;
        t->msz[s] = sz;
        return;
    }
    char *p = t->m[s];
    size_t sz = t->msz[s];
    switch (below(t, 4)) {
    case 0: case 1:
        free(p);
        t->m[s] = NULL;
        t->msz[s] = 0;
        break;
    case 2: {
        size_t nsz = (size_t)1 << below(t, 17);
        nsz += below(t, (uint32_t)nsz);
        char *q = realloc(p, nsz);
        if (q == NULL)
            return;
        if (nsz > sz)
            memset(q + sz, (int)(rnd(t) & 0xff), nsz - sz);
        t->m[s] = q;
        t->msz[s] = nsz;
        break;
    }
    default:
        for (int i = 0; i < 8; i++)
            p[below(t, (uint32_t)sz)] = (char)rnd(t);
        break;
    }
}

static void brk_init(void)
{
    pthread_mutex_lock(&g_brk_mutex);
    char *cur = sbrk(0);
    if (cur == (char *)-1) {
        say("churn: sbrk(0) failed; no brk operations\n");
    } else {
        size_t mis = (uintptr_t)cur % PG;
        if (mis && sbrk((intptr_t)(PG - mis)) == (void *)-1) {
            say("churn: cannot align the break; no brk operations\n");
        } else {
            g_brk_base = cur + (mis ? PG - mis : 0);
            g_brk_np = 0;
            g_brk_ok = 1;
        }
    }
    pthread_mutex_unlock(&g_brk_mutex);
}

static void op_brk(struct thr *t)
{
    pthread_mutex_lock(&g_brk_mutex);
    if (!g_brk_ok)
        goto out;
    char *cur = sbrk(0);
    if (cur != g_brk_base + (size_t)g_brk_np * PG) {
        say("churn: the program break moved behind our back (%p, expected "
            "%p); brk operations disabled\n", (void *)cur,
            (void *)(g_brk_base + (size_t)g_brk_np * PG));
        g_brk_ok = 0;
        goto out;
    }
    switch (below(t, 8)) {
    case 0: case 1: case 2: { /* grow and write */
        if (g_brk_np >= BRK_MAX_PAGES)
            break;
        uint32_t room = BRK_MAX_PAGES - g_brk_np;
        uint32_t k = 1 + below(t, room < 16 ? room : 16);
        char *old = sbrk((intptr_t)(k * PG));
        if (old == (char *)-1)
            break;
        g_brk_np += k;
        for (uint32_t i = 0; i < k; i++)
            if (below(t, 4))
                fill_page(t, old + (size_t)i * PG);
        break;
    }
    case 3: case 4: { /* shrink, never below base */
        if (g_brk_np == 0)
            break;
        uint32_t k = 1 + below(t, g_brk_np);
        if (sbrk(-(intptr_t)(k * PG)) == (void *)-1)
            break;
        g_brk_np -= k;
        break;
    }
    case 5: case 6: { /* write */
        if (g_brk_np == 0)
            break;
        uint32_t n = 1 + below(t, 4);
        for (uint32_t i = 0; i < n; i++)
            fill_page(t, g_brk_base + (size_t)below(t, g_brk_np) * PG);
        break;
    }
    default: { /* MADV_DONTNEED part of the brk area */
        if (g_brk_np == 0)
            break;
        uint32_t a, b;
        subrange(t, g_brk_np, &a, &b);
        if (madvise(g_brk_base + (size_t)a * PG, (size_t)(b - a) * PG,
                    MADV_DONTNEED) == 0 && below(t, 2))
            fill_page(t, g_brk_base + (size_t)(a + below(t, b - a)) * PG);
        break;
    }
    }
out:
    pthread_mutex_unlock(&g_brk_mutex);
}

/* ------------------------------------------------------------------ driver */

/* CHURN_SKIP="mremap,replace" (environment): those operations become writes. For narrowing
 * down which kind of layout change a tracker mishandles. */
static unsigned g_skip;

static int pick_op(struct thr *t)
{
    uint32_t r = below(t, 1000);
    for (int op = 0; op < OP_COUNT; op++) {
        if (r < (uint32_t)op_weights[op]) {
            if (g_skip & (1u << op))
                return OP_WRITE;
            return (op == OP_BRK && t->id != 0) ? OP_WRITE : op;
        }
        r -= (uint32_t)op_weights[op];
    }
    return OP_WRITE;
}

static void parse_skip(void)
{
    g_file_bias = getenv("CHURN_FILE_BIAS") != NULL;
    const char *e = getenv("CHURN_SKIP");
    if (!e)
        return;
    for (int op = 0; op < OP_COUNT; op++)
        if (strstr(e, op_names[op]))
            g_skip |= 1u << op;
}

static void do_op(struct thr *t)
{
    int op = pick_op(t);
    switch (op) {
    case OP_WRITE: op_write(t); break;
    case OP_READ: op_read(t); break;
    case OP_MMAP: op_mmap(t); break;
    case OP_MUNMAP: op_munmap(t); break;
    case OP_MREMAP: op_mremap(t); break;
    case OP_MADVISE: op_madvise(t); break;
    case OP_MPROTECT: op_mprotect(t); break;
    case OP_REPLACE: op_replace(t); break;
    case OP_MALLOC: op_malloc(t); break;
    default: op_brk(t); break;
    }
    count(t, op);
}

static void ts_add_ns(struct timespec *ts, long ns)
{
    ts->tv_nsec += ns;
    while (ts->tv_nsec >= 1000000000L) {
        ts->tv_nsec -= 1000000000L;
        ts->tv_sec++;
    }
}

static int64_t ts_ns(const struct timespec *ts)
{
    return (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec;
}

static void sleep_until(const struct timespec *when)
{
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, when, NULL) == EINTR)
        ;
}

static void setup_thread(struct thr *t)
{
    void *p = MAP_FAILED;
    if (budget_take(HOT_PAGES))
        p = map_anon(NULL, HOT_PAGES, PROT_READ | PROT_WRITE, 0);
    if (p == MAP_FAILED) {
        say("churn: cannot map the hot region: %s\n", strerror(errno));
        _exit(2);
    }
    int ri = add_region(t, p, HOT_PAGES, K_ANON, 0);
    write_pages(t, &t->r[ri], 0, HOT_PAGES, 8);
    for (int i = 0; i < INIT_REGIONS; i++) {
        uint32_t np = 1 + below(t, MAX_REGION_PAGES);
        if (!budget_take(np))
            break;
        p = map_anon(NULL, np, PROT_READ | PROT_WRITE, 0);
        if (p == MAP_FAILED) {
            budget_put(np);
            break;
        }
        ri = add_region(t, p, np, K_ANON, 0);
        write_pages(t, &t->r[ri], 0, np, 4);
    }
}

static void *worker(void *arg)
{
    struct thr *t = arg;
    setup_thread(t);
    struct timespec one_ms = {0, 1000000};
    while (!atomic_load(&g_go))
        nanosleep(&one_ms, NULL);
    if (t->id == 0 && g_brk_allowed)
        brk_init();

    struct timespec next, now;
    clock_gettime(CLOCK_MONOTONIC, &next);
    for (;;) {
        for (long i = 0; i < g_rate; i++)
            do_op(t);
        ts_add_ns(&next, 1000000L);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (ts_ns(&now) - ts_ns(&next) > CATCHUP_MS * 1000000LL)
            next = now; /* was stopped/descheduled: do not burst */
        sleep_until(&next);
    }
    return NULL;
}

static int create_file(void)
{
    int fd = open(g_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    static uint64_t page[PG / 8];
    for (uint32_t pgno = 0; pgno < FILE_PAGES; pgno++) {
        uint64_t x = splitmix64(g_seed ^ ((uint64_t)pgno << 32));
        for (size_t i = 0; i < PG / 8; i++)
            page[i] = x = splitmix64(x);
        const char *b = (const char *)page;
        size_t left = PG;
        while (left > 0) {
            ssize_t w = write(fd, b, left);
            if (w < 0) {
                if (errno == EINTR)
                    continue;
                close(fd);
                return -1;
            }
            b += w;
            left -= (size_t)w;
        }
    }
    if (close(fd) != 0)
        return -1;
    return 0;
}

static void usage(void)
{
    say("usage: churn [--threads K] [--seed S] [--rate N] "
        "[--exit-after-ms MS] [--file PATH] [--stats]\n");
    _exit(2);
}

static long parse_long(const char *s, long lo, long hi)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        usage();
    return v;
}

int main(int argc, char **argv)
{
    parse_skip();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "--threads") && more)
            g_nthreads = (int)parse_long(argv[++i], 1, MAX_THREADS);
        else if (!strcmp(a, "--seed") && more) {
            char *end;
            errno = 0;
            g_seed = strtoull(argv[++i], &end, 0);
            if (errno || *end || end == argv[i])
                usage();
        } else if (!strcmp(a, "--rate") && more)
            g_rate = parse_long(argv[++i], 0, 1000000);
        else if (!strcmp(a, "--exit-after-ms") && more)
            g_exit_after_ms = parse_long(argv[++i], 0, LONG_MAX);
        else if (!strcmp(a, "--file") && more) {
            if (strlen(argv[++i]) >= sizeof g_path)
                usage();
            strcpy(g_path, argv[i]);
        } else if (!strcmp(a, "--stats"))
            g_stats = 1;
        else
            usage();
    }
    if (sysconf(_SC_PAGESIZE) != (long)PG) {
        say("churn: page size is not 4096\n");
        return 2;
    }
    /* See BRK SAFETY DESIGN: malloc must never touch the break again. */
    int malloc_ok = mallopt(M_MMAP_THRESHOLD, 0) &&
                    mallopt(M_TRIM_THRESHOLD, INT_MAX);
#ifdef __SANITIZE_ADDRESS__
    /* ASan's allocator ignores mallopt (returns 0) but never uses brk. */
    malloc_ok = 1;
#endif
    if (!malloc_ok)
        say("churn: mallopt failed; no brk operations\n");
    g_brk_allowed = malloc_ok;
    if (!g_path[0])
        snprintf(g_path, sizeof g_path, "/tmp/churn-%ld.dat", (long)getpid());
    if (create_file() == 0)
        g_have_file = 1;
    else
        say("churn: cannot create %s (%s); no file mappings\n", g_path,
            strerror(errno));

    for (int i = 0; i < g_nthreads; i++) {
        struct thr *t = &g_thr[i];
        t->id = i;
        t->rng = splitmix64(g_seed + (uint64_t)i) | 1;
        int e = pthread_create(&t->tid, NULL, worker, t);
        if (e) {
            say("churn: pthread_create: %s\n", strerror(e));
            return 2;
        }
    }
    atomic_store(&g_go, 1);

    if (!g_stats && g_exit_after_ms < 0) {
        pthread_join(g_thr[0].tid, NULL); /* never returns */
        return 0;
    }
    struct timespec start, next, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    next = start;
    uint64_t prev[OP_COUNT] = {0};
    for (;;) {
        long step = g_stats ? 1000 : g_exit_after_ms;
        if (g_exit_after_ms >= 0) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            int64_t left = ts_ns(&start) + g_exit_after_ms * 1000000LL -
                           ts_ns(&now);
            if (left <= 0)
                _exit(0);
            if (left / 1000000 + 1 < step)
                step = (long)(left / 1000000 + 1);
        }
        ts_add_ns(&next, step * 1000000L);
        sleep_until(&next);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (ts_ns(&now) - ts_ns(&next) > 1000000000LL)
            next = now;
        if (g_stats && step == 1000) {
            char line[1024];
            int n = snprintf(line, sizeof line, "churn:");
            uint64_t total = 0;
            for (int op = 0; op < OP_COUNT; op++) {
                uint64_t s = 0;
                for (int i = 0; i < g_nthreads; i++)
                    s += atomic_load_explicit(&g_thr[i].cnt[op],
                                              memory_order_relaxed);
                total += s - prev[op];
                n += snprintf(line + n, sizeof line - (size_t)n, " %s=%llu",
                              op_names[op],
                              (unsigned long long)(s - prev[op]));
                prev[op] = s;
            }
            int nr = 0;
            for (int i = 0; i < g_nthreads; i++)
                nr += g_thr[i].nr; /* racy read, informational only */
            snprintf(line + n, sizeof line - (size_t)n,
                     " total=%llu regions=%d pages=%ld brk_pages=%u\n",
                     (unsigned long long)total, nr, atomic_load(&g_pages),
                     g_brk_np);
            say("%s", line);
        }
    }
}
