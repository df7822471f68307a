// Bytes as lowercase hex (common/hex.h): a round trip over every byte, and
// text that is not hex named.
#include "common/hex.h"

#include <gtest/gtest.h>

#include "tests/unit/test_support.h"

namespace moed {
namespace {

TEST(Hex, EveryByteSurvivesTheRoundTrip) {
  std::vector<std::byte> all;
  for (int b = 0; b < 256; ++b) all.push_back(std::byte(b));
  const std::string text = to_hex(all);
  EXPECT_EQ(text.substr(0, 6), "000102");
  EXPECT_EQ(text.substr(text.size() - 4), "feff");
  EXPECT_EQ(from_hex(text, "t"), all);
  EXPECT_TRUE(from_hex("", "t").empty());
}

TEST(Hex, TextThatIsNotHexIsNamed) {
  test::expect_error([] { from_hex("abc", "the address"); }, ErrorKind::Runtime, {"the address", "odd number"});
  test::expect_error([] { from_hex("0A", "the address"); }, ErrorKind::Runtime, {"\"0A\" is not lowercase hex"});
  test::expect_error([] { from_hex("zz", "x"); }, ErrorKind::Runtime, {"\"zz\""});
}

}  // namespace
}  // namespace moed
