/* The memory of the process-tree test programs (forktree.c, unpriv.c): a 256 KiB heap buffer
 * (the program allocates `heap`) and a 16 KiB static array whose bytes are a pure function of
 * (role, generation), so a test can tell a restored process's memory from any other state.
 * testkit/src/programs.rs rebuilds a program when a header here is newer than its binary. */
#ifndef TARDI_TEST_GENERATION_H
#define TARDI_TEST_GENERATION_H

#include <stddef.h>
#include <stdint.h>

#define HEAP_LEN (256 * 1024)
#define STATIC_LEN (16 * 1024)

static int role;
static long generation;
static unsigned char *heap;
static unsigned char statics[STATIC_LEN];

static unsigned char byte_at(long gen, int r, size_t i) {
    uint64_t x = (uint64_t)gen * 0x9E3779B97F4A7C15ull ^ (uint64_t)(r + 1) * 0xC2B2AE3D27D4EB4Full ^ i;
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return (unsigned char)x;
}

static void write_generation(long gen) {
    for (size_t i = 0; i < HEAP_LEN; i++) heap[i] = byte_at(gen, role, i);
    for (size_t i = 0; i < STATIC_LEN; i++) statics[i] = byte_at(gen, role, HEAP_LEN + i);
    generation = gen;
}

static int consistent(void) {
    for (size_t i = 0; i < HEAP_LEN; i++)
        if (heap[i] != byte_at(generation, role, i)) return 0;
    for (size_t i = 0; i < STATIC_LEN; i++)
        if (statics[i] != byte_at(generation, role, HEAP_LEN + i)) return 0;
    return 1;
}

static uint64_t digest(void) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < HEAP_LEN; i++) h = (h ^ heap[i]) * 0x100000001b3ull;
    for (size_t i = 0; i < STATIC_LEN; i++) h = (h ^ statics[i]) * 0x100000001b3ull;
    return h;
}

#endif
