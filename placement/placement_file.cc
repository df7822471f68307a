#include "placement/placement_file.h"

#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <fstream>
#include <sstream>

#include "common/atomic_file.h"
#include "common/error.h"

namespace moed::placement {

namespace {

constexpr const char* kFormat = "moed-placement-v1";

// toml++'s value<int64_t>() would also take true or 4.0; only integers count.
std::int64_t required_int(const toml::table& t, const char* key, const std::string& origin,
                          std::int64_t min, std::int64_t max) {
  auto v = t[key].value_exact<std::int64_t>();
  if (!v) MOED_THROW(Input, "{}: missing or non-integer key '{}'", origin, key);
  if (*v < min || *v > max)
    MOED_THROW(Input, "{}: '{}' = {} is out of range [{}, {}]", origin, key, *v, min, max);
  return *v;
}

constexpr std::int64_t kMaxRanks = 1 << 20, kMaxLayers = 4096, kMaxExperts = 65536;

}  // namespace

Placement parse_placement(const std::string& text, const std::string& origin, const LayerNumbers& numbers) {
  toml::table doc;
  try {
    doc = toml::parse(text, origin);
  } catch (const toml::parse_error& err) {
    MOED_THROW(Input, "{}:{}:{}: {}", origin, err.source().begin.line, err.source().begin.column,
               err.description());
  }

  auto format = doc["format"].value<std::string>();
  if (!format || *format != kFormat)
    MOED_THROW(Input, "{}: not a placement file: expected format = \"{}\"", origin, kFormat);
  int ranks = int(required_int(doc, "ranks", origin, 1, kMaxRanks));
  int layers = int(required_int(doc, "layers", origin, 1, kMaxLayers));
  int experts = int(required_int(doc, "experts", origin, 1, kMaxExperts));
  Placement p(ranks, layers, experts);
  p.set_epoch(std::uint64_t(required_int(doc, "epoch", origin, 0, INT64_MAX)));

  const toml::array* layer_tables = doc["layer"].as_array();
  if (!layer_tables || int(layer_tables->size()) != layers)
    MOED_THROW(Input, "{}: expected {} [[layer]] tables, found {}", origin, layers,
               layer_tables ? layer_tables->size() : 0);
  for (int l = 0; l < layers; ++l) {
    const toml::table* lt = (*layer_tables)[l].as_table();
    const toml::array* slots = lt ? (*lt)["slots"].as_array() : nullptr;
    if (!slots) MOED_THROW(Input, "{}: layer {} has no 'slots' array", origin, l);
    // Checked against a model with dense layers; read as it is otherwise (moe-place without a config).
    if (lt->contains("model_layer") && !numbers.identity()) {
      const auto model = (*lt)["model_layer"].value_exact<std::int64_t>();
      if (!model || *model < 0 || *model > kMaxLayers)
        MOED_THROW(Input, "{}: layer {}: model_layer must be a layer number", origin, l);
      const std::optional<int> moe = numbers.moe(int(*model), layers);
      if (moe != l)
        MOED_THROW(Input, "{}: [[layer]] {} is for model layer {}, which in this model is {}", origin, l, *model,
                   moe ? fmt::format("MoE layer {} (placement files list the MoE layers in order)", *moe)
                       : std::string("no MoE layer"));
    }
    if (int(slots->size()) != experts)
      MOED_THROW(Input, "{}: layer {} lists {} experts, expected {}", origin, l, slots->size(),
                 experts);
    for (int e = 0; e < experts; ++e) {
      // [0, 2]: whole copies on ranks 0 and 2; {shards = [2, 3]}: split in two, shard s on the s-th rank;
      // {shards = [[0, 1], [4, 5]]}: split in two, held twice (a copy per inner array).
      const toml::node& entry = *slots->get(std::size_t(e));
      const toml::table* split = entry.as_table();
      const toml::array* ranks_of = split ? (*split)["shards"].as_array() : entry.as_array();
      const auto line = entry.source().begin.line;
      if (split && (!ranks_of || split->size() != 1))
        MOED_THROW(Input,
                   "{}: layer {} expert {}: a split expert is written {{shards = [2, 3]}}, or {{shards = [[0, 1], "
                   "[4, 5]]}} for copies of it (line {})",
                   origin, l, e, line);
      if (!ranks_of)
        MOED_THROW(Input, "{}: layer {} expert {}: expected an array of ranks like [0, 2] (line {})", origin, l, e,
                   line);
      auto read_ranks = [&](const toml::array& list, std::vector<int>& rs) {
        for (const auto& node : list) {
          auto r = node.value_exact<std::int64_t>();
          if (!r) MOED_THROW(Input, "{}: layer {} expert {}: ranks must be integers (line {})", origin, l, e, line);
          if (*r < 0 || *r >= ranks)
            MOED_THROW(Input, "{}: layer {} expert {} is placed on rank {}, but ranks are 0..{} (line {})", origin,
                       l, e, *r, ranks - 1, line);
          rs.push_back(int(*r));
        }
      };
      std::vector<int> rs;
      if (!split) {
        read_ranks(*ranks_of, rs);
        p.set_replicas(l, e, std::move(rs));
        continue;
      }
      std::size_t shards = 0;
      if (!ranks_of->empty() && ranks_of->front().is_array()) {
        for (const auto& node : *ranks_of) {
          const toml::array* one = node.as_array();
          if (!one || (shards && one->size() != shards))
            MOED_THROW(Input,
                       "{}: layer {} expert {}: each copy of a split expert is an array of its {} shard ranks "
                       "(line {})",
                       origin, l, e, shards ? shards : ranks_of->front().as_array()->size(), line);
          shards = one->size();
          read_ranks(*one, rs);
        }
      } else {
        read_ranks(*ranks_of, rs);
        shards = rs.size();
      }
      if (shards < 2)
        MOED_THROW(Input, "{}: layer {} expert {}: {} shard rank{}; a split expert has at least 2 shards (line {})",
                   origin, l, e, shards, shards == 1 ? "" : "s", line);
      p.set_shards(l, e, std::move(rs), int(shards));
    }
  }
  p.validate(origin);
  return p;
}

Placement read_placement_file(const std::string& path, const LayerNumbers& numbers) {
  std::ifstream in(path);
  if (!in) MOED_THROW(Input, "{}: cannot open placement file", path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_placement(text.str(), path, numbers);
}

std::string format_placement(const Placement& p, const LayerNumbers& numbers) {
  std::string out = fmt::format(
      "# moed placement: for each layer, the ranks holding a slot of each expert\n"
      "format = \"{}\"\nepoch = {}\nranks = {}\nlayers = {}\nexperts = {}\n",
      kFormat, p.epoch(), p.ranks(), p.layers(), p.experts());
  for (int l = 0; l < p.layers(); ++l) {
    out += "\n[[layer]]  # layer " + std::to_string(l) + "\nslots = [";
    for (int e = 0; e < p.experts(); ++e) {
      const std::string ranks = fmt::format("{}", fmt::join(p.replicas(l, e), ", "));
      out += e ? ", " : "";
      if (!p.sharded(l, e)) {
        out += "[" + ranks + "]";
      } else if (p.copies(l, e) == 1) {
        out += "{shards = [" + ranks + "]}";
      } else {
        std::vector<std::string> copies;
        for (int c = 0; c < p.copies(l, e); ++c) copies.push_back(fmt::format("[{}]", fmt::join(p.copy(l, e, c), ", ")));
        out += fmt::format("{{shards = [{}]}}", fmt::join(copies, ", "));
      }
    }
    out += "]\n";
    if (!numbers.identity()) out += fmt::format("model_layer = {}\n", numbers.model(l));
  }
  return out;
}

void write_placement_file(const Placement& p, const std::string& path, const LayerNumbers& numbers) {
  write_file_atomically(path, format_placement(p, numbers));
}

void check_placement_shape(const Placement& p, int ranks, int layers, int experts,
                           const std::string& origin) {
  if (p.ranks() != ranks || p.layers() != layers || p.experts() != experts)
    MOED_THROW(Input,
               "{}: placement is for {} ranks, {} layers, {} experts; this run has {} ranks, {} "
               "layers, {} experts",
               origin, p.ranks(), p.layers(), p.experts(), ranks, layers, experts);
}

}  // namespace moed::placement
