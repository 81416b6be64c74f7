// A diagnostic timeline of the decode step's kernels: with COROLLA_TIMELINE=S, the traced
// launches S+1 .. S+N (N = COROLLA_TIMELINE_LAUNCHES, default 400: one Qwen3-30B-A3B batch-1
// step) made outside a graph capture record, per CTA, the global timer at entry, after the grid
// dependency wait and at exit (the last warp to leave); once the window is full the next traced
// launch synchronises its stream and prints, per kernel name, the mean over its launches of
//   early   = its first CTA's entry before the previous launch's last exit (PDL overlap),
//   release = its last CTA's return from the dependency wait after that exit,
//   run     = its last exit after that wait,
//   path    = its last exit after the previous launch's last exit (the launches' paths add up
//             to the window's span, untraced kernels counting with the next traced one),
// then the first 24 launches one by one, then the 10th / 50th / 90th percentile of the entries,
// wait returns and exits of those with 32 CTAs or more, then, for kernels that mark phases
// (TimelineScope::Mark), the mean over launches of each mark's latest CTA after the last wait.
// COROLLA_TIMELINE_ONLY=NAME traces only the launches whose name holds NAME (e.g. NucleusFused:
// the sampler's kernel between an engine's graph steps, whose eager steps would fill the window).
// COROLLA_TIMELINE_GRAPH=R times a CUDA graph instead of eager launches: S counts the launches
// made inside captures, the window closes with the capture that recorded it, and the report
// prints after that graph's R-th replay (the stamps are each replay's: entry, wait and marks
// overwritten, the exit an atomic max); eager launches are not traced. Graph replays have no
// host launch gaps and overlap differently: where eager and graph steps disagree, this is the
// graph's account.
// A window the process never filled is reported at exit with the count of traced launches (a
// step with ops skipped has fewer: lower S).
// Kernels take the record
// through their parameters and a TimelineScope (timeline.cuh); null when off (one predicated
// register, no other cost).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string_view>

namespace corolla::cuda {

constexpr int kTimelineMarks = 6;
constexpr int kTimelineFields = 3 + kTimelineMarks;  // entry, waited, exit, the marks

// Whether COROLLA_TIMELINE is set (callers that build a name skip that when it is not).
bool TimelineOn();

// The record of this launch ([ctas][kTimelineFields] u64, zeroed) or null: off, outside the
// window, inside a capture (outside one with COROLLA_TIMELINE_GRAPH), or more than 4096 CTAs.
uint64_t* TimelineRecord(std::string_view name, int64_t ctas, cudaStream_t s);

// With COROLLA_TIMELINE_GRAPH=R: a capture ended and was instantiated as exec (the window's
// graph if the capture recorded launches of it: the window closes), and exec was launched on s
// (after cudaGraphLaunch: at the window's graph's R-th replay, synchronises s and prints).
void TimelineGraphCaptured(cudaGraphExec_t exec);
void TimelineGraphReplayed(cudaGraphExec_t exec, cudaStream_t s);

}  // namespace corolla::cuda
