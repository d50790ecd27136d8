// The CPU's communicator: ranks are threads of one process, so a collective is a rendezvous over
// shared memory. Each rank publishes the address of its tensor, waits at a barrier, reads every
// rank's tensor directly, and waits at a second barrier before anyone may overwrite its input.
//
// Every rank sums the ranks' values itself, in rank order: the ranks' results are bit-identical,
// so their activations never drift apart (a reduce-scatter would read less but needs a third
// rendezvous; the tensors here are a step's [rows, hidden] activations, small next to a layer's
// weights).
//
// A rank that does not arrive within the timeout makes the others throw Error(kInternal) naming
// it; abort() (a rank that threw) wakes them at once.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "pagoda/parallel/communicator.h"

namespace pagoda::parallel {

class CpuRendezvous;

// world_size communicators sharing one rendezvous, rank r at index r.
std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(int world_size, std::chrono::milliseconds timeout);

}  // namespace pagoda::parallel
