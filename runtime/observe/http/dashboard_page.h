// The dashboard page: runtime/observe/http/dashboard.html, one self-contained file
// (inline CSS and JS, no external resource), embedded as a string at build
// time by cmake/embed_text.cmake (the definition is generated in the build
// tree).
#pragma once

#include <string_view>

namespace moed::runtime::http {

std::string_view dashboard_page();

}  // namespace moed::runtime::http
