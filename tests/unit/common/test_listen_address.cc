#include "common/listen_address.h"

#include <gtest/gtest.h>

#include <string>

#include "common/error.h"

namespace moed {
namespace {

struct GoodCase {
  std::string text;
  ListenAddress want;
};

class ListenAddressGood : public ::testing::TestWithParam<GoodCase> {};

TEST_P(ListenAddressGood, Parses) {
  EXPECT_EQ(parse_listen_address(GetParam().text, "[metrics].listen"), GetParam().want);
}

INSTANTIATE_TEST_SUITE_P(
    Forms, ListenAddressGood,
    ::testing::Values(GoodCase{"127.0.0.1:9464", {"127.0.0.1", 9464}},
                      GoodCase{"9464", {"127.0.0.1", 9464}},  // a bare port stays on loopback
                      GoodCase{"0", {"127.0.0.1", 0}},
                      GoodCase{"localhost:80", {"127.0.0.1", 80}},
                      GoodCase{"0.0.0.0:9464", {"0.0.0.0", 9464}},  // every interface, only when named
                      GoodCase{"[::1]:9464", {"::1", 9464}},
                      GoodCase{"10.1.2.3:65535", {"10.1.2.3", 65535}}));

class ListenAddressBad : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(ListenAddressBad, RefusedNamingTheKeyAndWhy) {
  const auto& [text, why] = GetParam();
  try {
    parse_listen_address(text, "[metrics].listen");
    FAIL() << text << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    const std::string message = e.what();
    EXPECT_NE(message.find("[metrics].listen"), std::string::npos) << message;
    EXPECT_NE(message.find(why), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Forms, ListenAddressBad,
    ::testing::Values(std::pair<std::string, std::string>{"127.0.0.1:65536", "from 0 to 65535"},
                      std::pair<std::string, std::string>{"127.0.0.1:", "from 0 to 65535"},
                      std::pair<std::string, std::string>{"127.0.0.1:94a", "from 0 to 65535"},
                      std::pair<std::string, std::string>{"99999", "from 0 to 65535"},
                      std::pair<std::string, std::string>{":9464", "name the host"},
                      std::pair<std::string, std::string>{"example.org:9464", "not a numeric IPv4"},
                      std::pair<std::string, std::string>{"300.1.1.1:9464", "not a numeric IPv4"},
                      std::pair<std::string, std::string>{"[::1]9464", "expected"},
                      std::pair<std::string, std::string>{"[zz]:9464", "not an IPv6"},
                      std::pair<std::string, std::string>{"localhost", "expected"}));

TEST(ListenAddress, DescribeBracketsIpv6) {
  EXPECT_EQ((ListenAddress{"127.0.0.1", 9464}).describe(), "127.0.0.1:9464");
  EXPECT_EQ((ListenAddress{"::1", 9464}).describe(), "[::1]:9464");
}

}  // namespace
}  // namespace moed
