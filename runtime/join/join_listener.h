// World rank 0's side of `moed --join` (runtime/join/join_wire.h): one thread
// that accepts joiners at [comm].join_listen and talks to one at a time,
// each step under the deadline ([comm].timeout_ms), so that a silent
// joiner holds it no longer.
//
// The thread checks the key's proof and asks the daemon (offer) which world
// rank to give; the joiner's worker address then waits in take_arrivals()
// for the daemon's next step boundary, at which every member reaches it;
// the daemon answers it with answer(). A joiner that goes away, or is not
// answered in time, costs its slot and nothing else.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "client/auth.h"
#include "runtime/join/join_wire.h"
#include "common/listen_address.h"
#include "common/socket_service.h"
#include "common/unique_fd.h"

namespace moed::runtime::join {

// A joiner that proved the key and sent its address.
struct JoinArrival {
  int world_rank = -1;
  std::string host;
  std::vector<std::byte> address;
};

class JoinListener {
 public:
  // On the listener's thread: the world rank to offer this joiner, or why
  // not (a refusal it is told, and logged here).
  using SlotFor = std::function<std::variant<int, std::string>(const Hello&)>;

  // Binds `address` (Usage error naming [comm].join_listen when it cannot).
  JoinListener(ListenAddress address, wire::Key key, int launched_ranks, int world_ranks, SlotFor offer,
               std::chrono::milliseconds timeout);
  ~JoinListener();  // the thread ends; a joiner mid-conversation is dropped
  JoinListener(const JoinListener&) = delete;
  JoinListener& operator=(const JoinListener&) = delete;

  const ListenAddress& address() const { return address_; }
  // The daemon, at a boundary: the joiners waiting to be reached, each once.
  std::vector<JoinArrival> take_arrivals();
  // The daemon, once the members reached `world_rank`: its welcome, or why not.
  void answer(int world_rank, std::variant<Welcome, std::string> welcome);

 private:
  void run();
  void converse(UniqueFd fd, const std::string& peer);

  ListenAddress address_;
  wire::Key key_;
  int launched_ranks_, world_ranks_;
  SlotFor offer_;
  std::chrono::milliseconds timeout_;
  UniqueFd listen_fd_;
  WakeUp wake_;
  std::mutex mu_;
  std::condition_variable answered_;
  bool stopping_ = false;
  std::optional<JoinArrival> arrival_;  // sent its address, not yet taken
  int waiting_for_ = -1;                // the world rank whose answer the thread waits for
  std::optional<std::variant<Welcome, std::string>> answer_;
  std::thread thread_;
};

}  // namespace moed::runtime::join
