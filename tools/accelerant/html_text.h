// Text put into the report's HTML and SVG: tags, config values and log lines come from files a
// user (or a failing program) wrote, so each is escaped before it reaches the page.
#pragma once
#include <string>

namespace accelerant::cli {

/// `text` safe inside an element or a quoted attribute.
inline std::string escape_html(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:  // other control characters (a log's escape sequences) are not text
        out += (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') ? ' ' : c;
    }
  }
  return out;
}

}  // namespace accelerant::cli
