// The control plane's collectives: rank 0 (the coordinator) broadcasts each
// step's command and gathers figures and outputs. A ControlChannel runs them
// over a ControlLink, one of two media:
//  - MPI's collectives (comm/mpi/mpi_control_link.h), which start-up uses;
//  - the data transport's exchanges (comm/transport_control_link.h), onto
//    which the daemon moves once its transport is up, with [comm].control =
//    "transport": serving then needs MPI no more after start-up, so a lost
//    rank is a transport error or a deadline, not an MPI collective that
//    never completes (docs/elastic.md).
// Every wait has the [comm].timeout_ms deadline; on expiry the error says
// which collective was waiting, instead of the job hanging.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace moed::comm {

// One medium's collectives over the ranks of the job. All collective: every
// rank makes the same calls in the same order; rank 0 is the root.
class ControlLink {
 public:
  enum class Op { max, sum };
  virtual ~ControlLink() = default;
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Called while waiting, so that the data transport keeps progressing.
  virtual void set_progress(std::function<void()> progress) = 0;

  virtual void broadcast(void* data, std::size_t bytes, const std::string& what) = 0;  // from rank 0
  // values[i] becomes the reduction of every rank's values[i], on rank 0.
  virtual void reduce(std::span<double> values, Op op, const std::string& what) = 0;
  virtual void reduce(std::span<std::uint64_t> values, Op op, const std::string& what) = 0;
  virtual int all_max(int value, const std::string& what) = 0;
  // Every rank's bytes in rank order on rank 0 (empty elsewhere); `equal`:
  // every rank sends as many (one collective, not two).
  virtual std::vector<std::byte> gather(const void* data, std::size_t bytes, bool equal,
                                        const std::string& what) = 0;
  // Every rank's string, in rank order, on every rank.
  virtual std::vector<std::string> all_gather_strings(const std::string& mine, const std::string& what) = 0;
};

class ControlChannel {
 public:
  // Over `link`; or, null, over none until use() gives it one (a process
  // that joins a running job has no link before its transport): no call
  // but set_progress and use may come before.
  explicit ControlChannel(std::unique_ptr<ControlLink> link);
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  int rank() const { return link_->rank(); }
  int size() const { return link_->size(); }
  const char* medium() const { return link_->name(); }
  void set_progress(std::function<void()> progress);
  // Collective: the channel's later calls run over `link` (the same ranks in
  // the same order, or the first of them: a job's spares, [comm].spares, are
  // left out). Whatever `link` uses must outlive the channel's calls.
  void use(std::unique_ptr<ControlLink> link);

  void broadcast(void* data, std::size_t bytes, const std::string& what) { link_->broadcast(data, bytes, what); }
  void reduce_max(double* values, std::size_t n, const std::string& what) {  // into rank 0
    link_->reduce(std::span(values, n), ControlLink::Op::max, what);
  }
  void reduce_sum(std::uint64_t* values, std::size_t n, const std::string& what) {
    link_->reduce(std::span(values, n), ControlLink::Op::sum, what);
  }
  void reduce_sum(double* values, std::size_t n, const std::string& what) {
    link_->reduce(std::span(values, n), ControlLink::Op::sum, what);
  }
  int all_max(int value, const std::string& what) { return link_->all_max(value, what); }
  // Every rank's bytes in rank order on rank 0 (empty elsewhere).
  std::vector<std::byte> gather(const void* data, std::size_t bytes, const std::string& what) {
    return link_->gather(data, bytes, false, what);
  }
  // The same when every rank sends the same number of bytes: one collective, not two.
  std::vector<std::byte> gather_equal(const void* data, std::size_t bytes, const std::string& what) {
    return link_->gather(data, bytes, true, what);
  }
  // Rank 0's text on every rank. One collective when it fits in a small
  // block (the usual case: nothing, or a few control actions), two otherwise.
  void broadcast_text(std::string& text, const std::string& what);
  // Every rank's string, in rank order, on every rank.
  std::vector<std::string> all_gather_strings(const std::string& mine, const std::string& what) {
    return link_->all_gather_strings(mine, what);
  }

 private:
  std::unique_ptr<ControlLink> link_;
  std::function<void()> progress_;
};

}  // namespace moed::comm
