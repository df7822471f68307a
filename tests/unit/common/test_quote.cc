#include "common/quote.h"

#include <gtest/gtest.h>

#include <string>

namespace moed {

TEST(QuoteInput, PlainTextIsQuotedAsIs) {
  EXPECT_EQ(quote_input("metis"), "\"metis\"");
  EXPECT_EQ(quote_input(""), "\"\"");
  EXPECT_EQ(quote_input("größe ✓"), "\"größe ✓\"");  // valid UTF-8 stays
}

TEST(QuoteInput, ControlAndInvalidBytesAreEscaped) {
  EXPECT_EQ(quote_input(std::string("a\0b", 3)), "\"a\\x00b\"");  // a NUL no longer cuts the message
  EXPECT_EQ(quote_input("say \"hi\"\\"), "\"say \\\"hi\\\"\\\\\"");
  EXPECT_EQ(quote_input("l1\nl2\tx\x1b[31m"), "\"l1\\nl2\\tx\\x1B[31m\"");
  EXPECT_EQ(quote_input("\xff\xfe\x80"), "\"\\xFF\\xFE\\x80\"");
  EXPECT_EQ(quote_input("\xe2\x9c"), "\"\\xE2\\x9C\"");  // a cut-off UTF-8 sequence
  EXPECT_EQ(sanitize_input(std::string("k\0ey", 4)), "k\\x00ey");
}

TEST(QuoteInput, LongInputIsCutAndItsSizeShown) {
  const std::string big(50'000'000, 'x');
  const std::string q = quote_input(big);
  EXPECT_EQ(q, "\"" + std::string(kQuoteMaxBytes, 'x') + "...\" (50000000 bytes)");
  EXPECT_EQ(sanitize_input(std::string(100, 'y'), 10), "yyyyyyyyyy... (100 bytes)");
  EXPECT_EQ(quote_input(std::string(kQuoteMaxBytes, 'z')), "\"" + std::string(kQuoteMaxBytes, 'z') + "\"");
}

}  // namespace moed
