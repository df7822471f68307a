# Writes a C++ source defining `std::string_view NAMESPACE::FUNCTION()` that
# returns the text of INPUT, as a raw string literal (build-time embedding of
# a file, e.g. the dashboard page).
#   cmake -DINPUT=in.html -DOUTPUT=out.cc -DHEADER=a/b.h -DNAMESPACE=x::y -DFUNCTION=f -P embed_text.cmake
file(READ "${INPUT}" text)
set(delimiter "moed_embed")
string(FIND "${text}" ")${delimiter}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${INPUT} contains \")${delimiter}\"\", which would end the raw string literal")
endif()
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by cmake/embed_text.cmake: edit that file.\n"
  "#include \"${HEADER}\"\n\n"
  "namespace ${NAMESPACE} {\n\n"
  "std::string_view ${FUNCTION}() {\n"
  "  static constexpr char kText[] = R\"${delimiter}(${text})${delimiter}\";\n"
  "  return {kText, sizeof kText - 1};\n"
  "}\n\n"
  "}  // namespace ${NAMESPACE}\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
