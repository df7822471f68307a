// Integer sets as text, the way Linux cpulists read: "0-3,7,9-10".
#pragma once

#include <string>
#include <vector>

namespace moed {

// Ascending, duplicates dropped, runs of consecutive values collapsed.
std::string format_ranges(std::vector<int> values);

}  // namespace moed
