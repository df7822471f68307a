// What the NCCL transport (nccl_transport.h) needs from the GPU and NCCL:
// grouped launches of point-to-point sends and receives on a few lanes, and
// whether each has completed. A lane is one NCCL communicator with its own
// CUDA stream; its groups run in the order they were launched, and the n-th
// send from rank a to rank b on a lane meets the n-th receive on b from a
// there, as NCCL matches them. The transport's bookkeeping (which blocks go
// in which group, sizes, self copies, deadlines, diagnostics) is host code
// over this seam, tested without a GPU against an in-process double with the
// same matching rules (tests/unit/comm/fake_nccl_groups.h); the real one is
// nccl_cuda_groups.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace moed::comm {

// One block of a group: `bytes` to or from `peer`, at `data` in host memory.
struct P2pBlock {
  int peer = 0;
  std::byte* data = nullptr;
  std::size_t bytes = 0;
};

class NcclGroups {
 public:
  virtual ~NcclGroups() = default;
  virtual int lanes() const = 0;
  // Starts one group on `lane`, after every group launched there before:
  // every send and receive of it together (one ncclGroupStart/End, so that
  // none waits for another). The sends' memory may be reused once this
  // returns; each receive's is written by the time its group is complete.
  // Returns the group's ticket on its lane (1, 2, ...). Never waits for a peer.
  virtual std::uint64_t launch(int lane, std::span<const P2pBlock> sends, std::span<const P2pBlock> receives) = 0;
  // Whether the group `ticket` of `lane` has completed, its receives in
  // their host blocks. Throws a Runtime error on an NCCL or CUDA error.
  virtual bool complete(int lane, std::uint64_t ticket) = 0;
  // After an error or an expired deadline: stops every lane for good, so
  // that no receive writes into host memory once it returns. Never throws.
  virtual void abort() noexcept = 0;
  // One line on a lane for a diagnostic: what was launched and completed.
  virtual std::string describe(int lane) const = 0;
};

}  // namespace moed::comm
