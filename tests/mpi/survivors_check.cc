// The survivors of a lost rank go on, across real processes (issue 31,
// docs/elastic.md): run under `mpirun --enable-recovery` with the UCX
// transport and [comm].detect_lost_peers. Every rank runs --steps steps of
// one exchange each, whose blocks carry (step, sender, receiver) and are
// checked byte for byte; after step 0 the --victim rank either
// kills itself (--how kill), or kills itself once it has announced its next
// step's blocks (--how kill-sending: a survivor that takes one would read
// its memory), or stops itself (--how stop: the test sends SIGCONT once
// the others have gone on). A rank whose exchange cannot
// reach a peer suspects it; the survivors agree on the next epoch, go on
// over the same transport (continue_with) from the lowest step any of them
// has not finished, and serve every step. A rank left out learns it was
// fenced and leaves. Every rank leaves with _exit, without MPI_Finalize
// (which would wait for the lost rank). Lines, one per event:
//   world rank R: pid P
//   world rank R: step S: <what the exchange could not reach>
//   world rank R: epoch E: members [..], rank X of Y
//   world rank R: went on in T ms (...)     (the pause the loss cost this rank:
//     from the start of the step it cut short, or from when this rank heard
//     of it between steps)
//   world rank R: fenced at epoch E, leaving
//   world rank R: served N steps, the last on epoch E
//   FAIL world rank R: ...
// With --linger-until FILE the survivors stay, once done, until FILE exists.
//   survivors_check --victim R --how kill|kill-sending|stop [--steps N] [--timeout-ms N]
//                   [--linger-until FILE]
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/membership.h"
#include "comm/mpi/mpi_bootstrap.h"
#include "comm/mpi/mpi_session.h"
#include "comm/survivor_agreement.h"
#include "comm/transport.h"
#include "common/error.h"

namespace {

using namespace moed;

int g_world_rank = -1;

void say(const std::string& line) {
  std::printf("world rank %d: %s\n", g_world_rank, line.c_str());
  std::fflush(stdout);
}

[[noreturn]] void leave(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(code);
}

[[noreturn]] void fail(const std::string& what) {
  std::printf("FAIL world rank %d: %s\n", g_world_rank, what.c_str());
  leave(1);
}

std::byte block_byte(std::uint64_t step, int from, int to, std::size_t i) {
  return std::byte((step * 29 + std::uint64_t(from) * 131 + std::uint64_t(to) * 17 + i * 7 + (i >> 8)) & 0xFF);
}

// The buffers of every step's exchange, kept for the job's life: a peer may
// still read the blocks of an exchange cut short until continue_with().
std::vector<std::byte> g_send, g_recv;

// One step: a block of `bytes` to every rank of the epoch. `still_member`
// runs once the blocks have landed, before they are checked: a rank fenced
// meanwhile may have read blocks its peers had reused, and must not use them.
// A step's layout (a block of `bytes` to and from every rank of the epoch),
// with this rank's blocks written into g_send.
comm::ExchangeLayout lay_out_step(comm::Transport& t, std::uint64_t step, std::size_t bytes) {
  const int n = t.size(), me = t.rank();
  comm::ExchangeLayout layout;
  layout.send_bytes.assign(std::size_t(n), bytes);
  layout.recv_bytes.assign(std::size_t(n), bytes);
  layout.send_offsets = comm::ExchangeLayout::prefix_offsets(layout.send_bytes);
  layout.recv_offsets = comm::ExchangeLayout::prefix_offsets(layout.recv_bytes);
  g_send.resize(std::max(g_send.size(), layout.send_total()));
  g_recv.resize(std::max(g_recv.size(), layout.recv_total()));
  for (int to = 0; to < n; ++to)
    for (std::size_t i = 0; i < bytes; ++i)
      g_send[layout.send_offsets[std::size_t(to)] + i] = block_byte(step, t.world_rank(me), t.world_rank(to), i);
  return layout;
}

template <class StillMember>
void step_exchange(comm::Transport& t, std::uint64_t step, std::size_t bytes, StillMember&& still_member) {
  const int n = t.size(), me = t.rank();
  const comm::ExchangeLayout layout = lay_out_step(t, step, bytes);
  const std::vector<std::byte>& recv = g_recv;
  t.exchange(g_send.data(), layout, g_recv.data(), fmt::format("step {}", step));
  still_member();
  for (int from = 0; from < n; ++from)
    for (std::size_t i = 0; i < bytes; ++i)
      if (recv[layout.recv_offsets[std::size_t(from)] + i] != block_byte(step, t.world_rank(from), t.world_rank(me), i))
        fail(fmt::format("step {}: byte {} from world rank {} differs", step, i, t.world_rank(from)));
}

}  // namespace

int main(int argc, char** argv) {
  comm::MpiSession mpi(&argc, &argv);
  g_world_rank = mpi.rank();
  int victim = -1;
  std::string how;
  std::uint64_t steps = 6;
  std::string linger_file;
  comm::CommConfig config;
  config.backend = comm::Backend::ucx;
  config.detect_lost_peers = true;
  config.timeout_ms = 20000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string arg = argv[i], value = argv[i + 1];
    if (arg == "--victim") victim = std::stoi(value);
    else if (arg == "--how") how = value;
    else if (arg == "--steps") steps = std::stoull(value);
    else if (arg == "--timeout-ms") config.timeout_ms = std::stoll(value);
    else if (arg == "--linger-until") linger_file = value;
    else victim = -2;
  }
  if (victim < 0 || victim >= mpi.size() || (how != "kill" && how != "kill-sending" && how != "stop") || mpi.size() < 3) {
    if (mpi.rank() == 0)
      std::fprintf(stderr, "usage: survivors_check --victim R --how kill|kill-sending|stop [--steps N] [--timeout-ms N] "
                           "[--linger-until FILE] (3 ranks or more)\n");
    return 2;
  }
  try {
    comm::MpiBootstrap bootstrap(mpi.world(), std::chrono::milliseconds(config.timeout_ms));
    std::unique_ptr<comm::Transport> t = comm::create_transport(config, bootstrap);
    comm::View world;
    for (int r = 0; r < mpi.size(); ++r) world.members.push_back(r);
    comm::SurvivorAgreement agreement(*t->messenger(), world, std::chrono::milliseconds(config.timeout_ms));
    say(fmt::format("pid {}", getpid()));
    constexpr std::size_t kBlock = 100000;  // past the eager limits: a rendezvous per block
    // Between steps and before a step's blocks are used: a loss another rank
    // noticed, or a decision that left this rank out.
    const auto still_member = [&] {
      agreement.poll();
      if (!agreement.fenced()) return;
      say(fmt::format("fenced at epoch {}, leaving", agreement.view().epoch));
      leave(0);
    };
    // A rank blocked in a step answers the agreement meanwhile, and leaves
    // the step once one has begun (or has decided without it).
    std::uint64_t epoch_served = 0;
    t->set_wait_hook([&] {
      agreement.poll();
      if (agreement.agreeing() || agreement.fenced() || agreement.view().epoch != epoch_served)
        throw comm::PeersUnreachable({}, "an agreement on the survivors began", __FILE__, __LINE__);
    });
    // The victim goes at the start of step 1, once every rank has connected
    // and served step 0.
    const auto victim_goes = [&] {
      if (how == "kill-sending") {
        // Dies with its step's blocks announced: the survivors that take
        // them would read its memory.
        const comm::ExchangeLayout layout = lay_out_step(*t, 1, kBlock);  // the true blocks
        auto exchange =
            t->open_exchange(g_recv.data(), layout.recv_bytes, layout.recv_offsets, "step 1", comm::ReceiveSizes::exact);
        for (int to = 0; to < t->size(); ++to)
          exchange->send(to, g_send.data() + layout.send_offsets[std::size_t(to)], kBlock);
        t->progress();
      }
      std::raise(how == "stop" ? SIGSTOP : SIGKILL);
    };
    using Clock = std::chrono::steady_clock;
    std::optional<Clock::time_point> cut_short;  // when the step the loss cut short began
    std::uint64_t step = 0;
    while (step < steps) {
      if (step == 1 && g_world_rank == victim && agreement.view().epoch == 0) victim_goes();
      const Clock::time_point began = Clock::now();
      try {
        step_exchange(*t, step, kBlock, still_member);
        ++step;
        if (cut_short && agreement.view().epoch > 0) {
          say(fmt::format("went on in {:.1f} ms (from the start of the step the loss cut short to the end of the "
                          "first step served on epoch {})",
                          std::chrono::duration<double, std::milli>(Clock::now() - *cut_short).count(),
                          agreement.view().epoch));
          cut_short.reset();
        }
      } catch (const comm::PeersUnreachable& e) {
        say(fmt::format("step {}: {}", step, e.what()));
        if (!cut_short) cut_short = began;
        for (int lost : e.ranks()) agreement.suspect(lost);
      }
      if (!agreement.agreeing() && !agreement.fenced() && agreement.view().epoch == epoch_served) continue;
      if (!cut_short) cut_short = Clock::now();  // heard of the loss between steps
      const comm::View& view = agreement.agree(std::chrono::milliseconds(4 * config.timeout_ms));
      if (agreement.fenced()) {
        say(fmt::format("fenced at epoch {}, leaving", view.epoch));
        leave(0);
      }
      try {
        epoch_served = view.epoch;
        t->continue_with(view.members, view.epoch);
      } catch (const comm::PeersUnreachable& e) {  // a member never took the blocks sent it: lost too
        say(e.what());
        for (int lost : e.ranks()) agreement.suspect(lost);
        continue;
      }
      say(fmt::format("epoch {}: members [{}], rank {} of {}", view.epoch, fmt::join(view.members, " "), t->rank(),
                      t->size()));
      // From the lowest step a member has not finished: one that finished
      // the step the loss cut short serves it again with the others.
      std::vector<std::uint64_t> next(std::size_t(t->size()));
      t->all_gather(&step, sizeof step, next.data(), "the steps each survivor finished");
      step = *std::min_element(next.begin(), next.end());
    }
    step_exchange(*t, 2000, 1, still_member);  // every survivor served every step before any leaves
    say(fmt::format("served {} steps, the last on epoch {}", steps, agreement.view().epoch));
    // A stopped rank that comes back may still read the blocks this rank
    // sent it before the loss: stay until the test says it has left.
    if (!linger_file.empty())
      while (access(linger_file.c_str(), F_OK) != 0) {
        agreement.poll();
        usleep(1000);
      }
  } catch (const std::exception& e) {
    fail(e.what());
  }
  leave(0);
}
