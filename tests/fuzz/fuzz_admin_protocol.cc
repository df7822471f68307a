// libFuzzer target for the admin protocol (runtime/admin/protocol.cc): arbitrary
// bytes, split into lines as the server splits them, go through parse_request
// and through the answer formatting. Nothing may crash, throw past the API,
// leak, or produce an answer that is not one JSON object on one line.
//
// Built and run by tests/fuzz/run.sh (clang++ -fsanitize=fuzzer,address,undefined).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <variant>

#include "runtime/admin/protocol.h"

namespace admin = moed::runtime::admin;

namespace {

// Aborts (a crash libFuzzer reports) when `line` is not a well-formed answer.
void check_answer(const std::string& line, bool ok) {
  if (line.find('\n') != std::string::npos) std::abort();
  const auto answer = admin::json::parse(line, nullptr, false);
  if (!answer.is_object() || !answer.contains("id") || !answer.contains("ok")) std::abort();
  if (answer["ok"] != ok) std::abort();
  if (!ok && !(answer["error"].is_object() && answer["error"]["code"].is_string() &&
               answer["error"]["message"].is_string()))
    std::abort();
}

void one_line(std::string_view line, std::size_t max_line) {
  auto parsed = admin::parse_request(line, max_line);
  if (auto* answer = std::get_if<admin::Answer>(&parsed)) {
    check_answer(answer->line, false);
    if (answer->code.empty()) std::abort();
    return;
  }
  const auto& request = std::get<admin::Request>(parsed);
  const admin::CommandSpec* spec = admin::find_command(request.cmd);
  if (!spec || spec->control != admin::is_control(request.cmd)) std::abort();
  if (!(request.id.is_null() || request.id.is_string() || request.id.is_number_integer())) std::abort();
  check_answer(admin::answer_ok(request.id, request.params), true);
  // The raw line as an error message: bytes that are not UTF-8 must not throw.
  check_answer(admin::answer_error(request.id, "internal", line), false);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  // The first byte picks a line limit, so that line_too_long is reached too.
  const std::size_t max_line = size > 0 && (data[0] & 1) ? 64 : admin::kDefaultMaxLine;
  std::size_t begin = 0;
  while (begin <= input.size()) {
    const std::size_t end = input.find('\n', begin);
    const std::size_t stop = end == std::string_view::npos ? input.size() : end;
    const std::string_view line = input.substr(begin, stop - begin);
    if (!admin::is_blank(line)) one_line(line, max_line);
    if (end == std::string_view::npos) break;
    begin = end + 1;
  }
  // Answer formatting with raw bytes as code and message, and as a JSON id.
  check_answer(admin::answer_error(nullptr, input.substr(0, 16), input), false);
  check_answer(admin::answer_ok(std::string(input.substr(0, 32)), {{"text", std::string(input)}}), true);
  (void)admin::excerpt(input, size % 70);
  return 0;
}
