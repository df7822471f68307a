// Which queued submits a step takes: fair over clients, within each layer's
// budget, in each client's order.
#include "runtime/ingress/intake.h"

#include <gtest/gtest.h>

namespace moed::runtime::ingress {
namespace {

using Queues = std::vector<std::deque<QueuedSubmit>>;

QueuedSubmit q(std::uint32_t layer, std::uint32_t rows, std::uint64_t ticket) { return {0, layer, rows, ticket}; }

std::vector<std::uint64_t> tickets(const std::vector<QueuedSubmit>& taken) {
  std::vector<std::uint64_t> t;
  for (const auto& s : taken) t.push_back(s.ticket);
  return t;
}

TEST(TakeFair, OneSubmitPerClientPerRound) {
  Queues queues{{q(0, 1, 10), q(0, 1, 11), q(0, 1, 12)}, {q(0, 1, 20)}, {q(0, 1, 30), q(0, 1, 31)}};
  std::vector<std::size_t> budget{100};
  const auto taken = take_fair(queues, 0, budget);
  EXPECT_EQ(tickets(taken), (std::vector<std::uint64_t>{10, 20, 30, 11, 31, 12}));
  EXPECT_EQ(taken[1].client, 1u);
  EXPECT_EQ(budget[0], 94u);
  for (const auto& queue : queues) EXPECT_TRUE(queue.empty());
}

TEST(TakeFair, TheStartRotates) {
  Queues queues{{q(0, 1, 10)}, {q(0, 1, 20)}, {q(0, 1, 30)}};
  std::vector<std::size_t> budget{2};
  EXPECT_EQ(tickets(take_fair(queues, 2, budget)), (std::vector<std::uint64_t>{30, 10}));
  EXPECT_EQ(queues[1].size(), 1u);  // waits for the next step
}

TEST(TakeFair, AFloodingClientDoesNotStarveOthers) {
  // Client 0 has 100 submits of 8 rows; client 1 one of 8. The budget of 32
  // rows gives client 1 its turn in the first round.
  Queues queues(2);
  for (std::uint64_t i = 0; i < 100; ++i) queues[0].push_back(q(0, 8, i));
  queues[1].push_back(q(0, 8, 1000));
  std::vector<std::size_t> budget{32};
  const auto taken = tickets(take_fair(queues, 0, budget));
  ASSERT_EQ(taken.size(), 4u);
  EXPECT_EQ(taken[1], 1000u);
}

TEST(TakeFair, ASubmitThatDoesNotFitKeepsItsClientsOrder) {
  // Client 0's head (60 rows) does not fit what is left: its small submit
  // behind it waits too; client 1 goes on.
  Queues queues{{q(0, 60, 10), q(0, 1, 11)}, {q(0, 30, 20), q(0, 5, 21)}};
  std::vector<std::size_t> budget{50};
  EXPECT_EQ(tickets(take_fair(queues, 0, budget)), (std::vector<std::uint64_t>{20, 21}));
  EXPECT_EQ(queues[0].size(), 2u);
  EXPECT_EQ(budget[0], 15u);
}

TEST(TakeFair, LayersHaveTheirOwnBudgets) {
  Queues queues{{q(0, 10, 10), q(1, 10, 11), q(1, 10, 12)}, {q(1, 10, 20)}};
  std::vector<std::size_t> budget{10, 20};
  EXPECT_EQ(tickets(take_fair(queues, 0, budget)), (std::vector<std::uint64_t>{10, 20, 11}));
  EXPECT_EQ(budget, (std::vector<std::size_t>{0, 0}));
}

TEST(TakeFair, NothingQueuedTakesNothing) {
  Queues none;
  std::vector<std::size_t> budget{5};
  EXPECT_TRUE(take_fair(none, 0, budget).empty());
  Queues empty(3);
  EXPECT_TRUE(take_fair(empty, 1, budget).empty());
}

}  // namespace
}  // namespace moed::runtime::ingress
