#include "runtime/engine/step_record.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common/error.h"

namespace moed::runtime {

namespace {

// A figure's values as one span: a scalar, a fixed array or a list. The
// router's counters go by their words (RouterCounters::words).
template <class T>
auto values(T& figure) {
  if constexpr (std::is_arithmetic_v<std::remove_const_t<T>>)
    return std::span(&figure, 1);
  else
    return std::span(figure);
}

template <class T>
constexpr bool is_router_counters = std::is_same_v<std::remove_const_t<T>, RouterCounters>;

void put(std::vector<std::byte>& out, const void* bytes, std::size_t size) {
  const auto* first = static_cast<const std::byte*>(bytes);
  out.insert(out.end(), first, first + size);
}

void put_word(std::vector<std::byte>& out, std::uint64_t word) { put(out, &word, sizeof word); }

struct Encode {
  std::vector<std::byte>& out;

  template <class T>
  void operator()(Combine, const T& figure) const {
    if constexpr (is_router_counters<T>) {
      const auto words = figure.words();
      put(out, words.data(), sizeof words);
    } else {
      const auto v = values(figure);
      put(out, v.data(), v.size_bytes());
    }
  }
};

// Reads the next `size` bytes of a rank's block.
struct BlockReader {
  std::span<const std::byte>& rest;
  std::uint64_t step;
  int rank;

  void take(void* to, std::size_t size) {
    MOED_CHECK(size <= rest.size(), "figures of step {}: rank {}'s block ends {} bytes early", step, rank,
               size - rest.size());
    std::memcpy(to, rest.data(), size);
    rest = rest.subspan(size);
  }
  std::uint64_t word() {
    std::uint64_t w = 0;
    take(&w, sizeof w);
    return w;
  }
};

struct Decode {
  BlockReader& in;

  template <class T>
  void operator()(Combine, T& figure, const T& shape) const {
    if constexpr (is_router_counters<T>) {
      std::array<std::uint64_t, RouterCounters::kWords> words{};
      in.take(words.data(), sizeof words);
      figure = RouterCounters::from_words(words);
    } else {
      if constexpr (requires { figure.resize(shape.size()); }) figure.resize(shape.size());
      const auto v = values(figure);
      in.take(v.data(), v.size_bytes());
    }
  }
};

// Folds one rank's figure into the reduction's (the first rank's is taken as it is).
struct Fold {
  bool first;

  template <class T>
  void operator()(Combine how, T& into, const T& from) const {
    if (first) {
      into = from;
    } else if constexpr (is_router_counters<T>) {
      into.add(from);
    } else {
      const auto a = values(into);
      const auto b = values(from);
      MOED_CHECK(a.size() == b.size(), "step figures: {} values against {}", a.size(), b.size());
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = how == Combine::max ? std::max(a[i], b[i]) : a[i] + b[i];
    }
  }
};

}  // namespace

std::vector<std::byte> encode_step_figures(const StepRecord& r) {
  std::vector<std::byte> out;
  for_each_figure(Encode{out}, r);
  put_word(out, r.nonfinite.size());
  for (const auto& [key, terms] : r.nonfinite) {
    put_word(out, key);
    put_word(out, terms);
  }
  const std::vector<std::byte> traced = trace::encode_fragments(r.trace);  // nothing traced: 0 bytes
  put_word(out, traced.size());
  put(out, traced.data(), traced.size());
  return out;
}

StepRecord decode_step_figures(std::span<const std::byte>& blocks, const StepRecord& shape, std::uint64_t step,
                               int rank) {
  BlockReader in{blocks, step, rank};
  StepRecord r;
  for_each_figure(Decode{in}, r, shape);
  for (std::uint64_t k = 0, n = in.word(); k < n; ++k) {
    const std::uint64_t key = in.word();
    r.add_nonfinite(std::uint32_t(key), in.word());
  }
  const std::uint64_t trace_bytes = in.word();
  MOED_CHECK(trace_bytes <= blocks.size(), "figures of step {}: rank {} announces {} bytes of traces, {} are left",
             step, rank, trace_bytes, blocks.size());
  trace::decode_fragments(blocks.data(), trace_bytes, "the traces of a step", r.trace);
  blocks = blocks.subspan(trace_bytes);
  return r;
}

StepRecord reduce_step_figures(const StepRecord& mine, std::span<const std::byte> all, int ranks, std::uint64_t step) {
  StepRecord out = mine;
  out.nonfinite.clear();
  out.trace.clear();
  std::span<const std::byte> rest = all;
  for (int r = 0; r < ranks; ++r) {
    const StepRecord theirs = decode_step_figures(rest, mine, step, r);
    for_each_figure(Fold{r == 0}, out, theirs);
    // Each rank's own waits too, before the max hides them (the health view).
    out.rows_wait_by_rank.insert(out.rows_wait_by_rank.end(), theirs.rows_wait_per_layer.begin(),
                                 theirs.rows_wait_per_layer.end());
    out.answers_wait_by_rank.insert(out.answers_wait_by_rank.end(), theirs.answers_wait_per_layer.begin(),
                                    theirs.answers_wait_per_layer.end());
    for (const auto& [key, terms] : theirs.nonfinite) out.add_nonfinite(key, terms);
    out.trace.append(theirs.trace);
  }
  MOED_CHECK(rest.empty(), "figures of step {}: {} bytes gathered, {} parsed", step, all.size(),
             all.size() - rest.size());
  return out;
}

}  // namespace moed::runtime
