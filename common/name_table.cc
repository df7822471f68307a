#include "common/name_table.h"

#include "common/config_table.h"
#include "common/error.h"
#include "common/quote.h"

namespace moed::config::detail {

void value_outside_table(std::size_t value, std::size_t size) {
  MOED_THROW(Internal, "enum value {} outside its name table of {} names", value, size);
}

// In the words of the config's own refusal of a choice (config_table.cc's read_value).
void unknown_name(std::string_view name, const std::string& where, const std::vector<std::string>& names) {
  MOED_THROW(Usage, "{} = {} is not allowed: {}", where, quote_input(name),
             describe_allowed(ValueType::Text, 0, 0, names));
}

}  // namespace moed::config::detail
