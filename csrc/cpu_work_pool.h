// A small pool of helper threads that share out the chunks of one kernel call with the calling
// thread (see cpu_work_pool.cpp for why OpenMP's team is not used for the linear layers).
#pragma once

#include <cstdint>

namespace specdec {

// Calls fn(ctx, i) once for every chunk i in [0, n): on the calling thread and on whichever
// helper threads are awake to claim chunks. Returns when every chunk is done. Which thread runs
// a chunk never changes what the chunk computes.
void pool_run(int64_t n, void (*fn)(void* ctx, int64_t chunk), void* ctx);

// Helper threads to use (threads - 1; 0 or 1: everything on the calling thread) and how long a
// helper spins for the next call before it sleeps. Takes effect for the calls that follow.
void pool_configure(int64_t threads, int64_t spin_us);

// Whether pool_configure ran in this process.
bool pool_configured();

// (threads, spin_us) in force (spin_us: 100 until configured).
int64_t pool_threads();
int64_t pool_spin_us();

}  // namespace specdec
